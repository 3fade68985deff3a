"""Shared pieces of the benchmarks: result tables, timing, scratch folders, synthetic checkpoints.

Checkpoints are LLaMA-shaped safetensors files of random bf16 weights, written one tensor at a
time (the header first, computed from the shapes alone), so generating a multi-GB file never
holds more than its largest tensor in memory. Each generated file sits beside a small JSON
sidecar recording the parameters it was made with; a later run reuses the file when the sidecar
and the file size still match, and regenerates it otherwise.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

GB = 10**9
MB = 10**6
MiB = 1024 * 1024

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_OUT = BENCH_DIR / "out"

#: bumped whenever the generator changes, so stale files are not reused
DATA_FORMAT = 1


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    """What every benchmark gets from the command line."""

    out: Path
    size_gb: float
    runs: int
    quick: bool
    #: seconds to wait, before each timed round, for other processes to leave the CPUs idle
    wait_idle: float = 0.0
    #: files in the folder and bytes of each, for the benchmarks of many files (None: their default)
    files: int | None = None
    file_size: int | None = None
    #: the scale benchmark's operations to time (empty: all)
    only: tuple[str, ...] = ()

    @property
    def data_dir(self) -> Path:
        return self.out / "data"

    @property
    def work_dir(self) -> Path:
        return self.out / "work"


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Target:
    """A goal for one row: ``on`` is ``"ratio"`` (concord / baseline) or ``"value"`` (concord)."""

    on: str
    op: str  # "<=", "<", ">=", ">"
    limit: float

    def text(self, unit: str) -> str:
        what = "ratio" if self.on == "ratio" else ""
        limit = f"{_num(self.limit)}×" if self.on == "ratio" else f"{_num(self.limit)} {unit}".strip()
        return f"{what} {self.op} {limit}".strip()

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        x = ratio if self.on == "ratio" else value
        if x is None:
            return None
        return {"<=": x <= self.limit, "<": x < self.limit, ">=": x >= self.limit, ">": x > self.limit}[self.op]


@dataclass(frozen=True)
class Row:
    metric: str
    concord: float | None
    baseline: float | None = None
    unit: str = ""
    target: Target | None = None
    baseline_name: str = ""

    @property
    def ratio(self) -> float | None:
        if self.concord is None or not self.baseline:
            return None
        return self.concord / self.baseline

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.concord, self.ratio)


@dataclass
class Table:
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def render(self) -> str:
        head = ["metric", "concord", "baseline", "ratio", "target", "met?"]
        body = []
        for r in self.rows:
            base = "n/a" if r.baseline is None else _with_unit(r.baseline, r.unit)
            if r.baseline_name and r.baseline is not None:
                base = f"{base} ({r.baseline_name})"
            met = {None: "", True: "yes", False: "NO"}[r.met]
            body.append(
                [
                    r.metric,
                    "n/a" if r.concord is None else _with_unit(r.concord, r.unit),
                    base,
                    "" if r.ratio is None else f"{_num(r.ratio)}×",
                    "" if r.target is None else r.target.text(r.unit),
                    met,
                ]
            )
        widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head))]

        def fmt(cells: list[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

        lines = [f"## {self.title}", "", fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        lines += [fmt(b) for b in body]
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines)


def _num(x: float) -> str:
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _with_unit(x: float, unit: str) -> str:
    return f"{_num(x)} {unit}".strip()


def parse_size(text: str) -> int:
    """``50k`` → 50,000; ``64ki`` → 65,536; ``1m`` → 1,000,000; a plain number is bytes."""
    t = text.strip().lower().removesuffix("b")
    for suffix, factor in (("ki", 1024), ("mi", 1024**2), ("k", 1000), ("m", 1000**2)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * factor)
    return int(t)


def log(msg: str) -> None:
    """A progress line on stderr, so the tables on stdout stay clean."""
    print(f"  · {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- timing


@dataclass
class Case:
    """One thing to time: ``fn`` is timed, ``before`` and ``after`` run untimed around it."""

    label: str
    fn: Callable[[], object]
    before: Callable[[], None] | None = None
    after: Callable[[], None] | None = None
    times: list[float] = field(default_factory=list)
    #: share of the CPUs other processes (kernel threads included) used during each timed run
    others: list[float] = field(default_factory=list)
    result: object = None

    @property
    def best(self) -> float:
        return min(self.times)

    def once(self) -> tuple[float, float]:
        """Run once; (wall seconds, share of the CPUs used meanwhile by other processes)."""
        if self.before:
            self.before()
        busy0, own0 = _cpu_counters()
        t0 = time.perf_counter()
        self.result = self.fn()
        dt = time.perf_counter() - t0
        busy1, own1 = _cpu_counters()
        if self.after:
            self.after()
        others = (busy1 - busy0) - (own1 - own0)
        return dt, min(1.0, max(0.0, others / (dt * (os.cpu_count() or 1))))


def race(runs: int, *cases: Case, warmup: bool = True, wait_idle: float = 0.0) -> tuple[Case, ...]:
    """Time ``cases`` in interleaved rounds (A, B, A, B, ...) and keep every run's wall time.

    Interleaving makes a change in the machine's state (another process, the page cache) fall on
    every case alike; an untimed warm-up round first lets the kernel settle (on a VM, the first
    write of fresh memory for the page cache can cost several times a later one). Each run also
    records how much of the CPUs other processes used meanwhile; with ``wait_idle``, each round
    first waits up to that many seconds for them to go quiet.
    """
    if warmup:
        for c in cases:
            log(f"{c.label}: warm-up {c.once()[0]:.3f} s")
    for i in range(runs):
        wait_for_idle(wait_idle)
        for c in cases:
            dt, others = c.once()
            c.times.append(dt)
            c.others.append(others)
            log(f"{c.label}: run {i + 1}/{runs} {dt:.3f} s (other processes: {others:.0%} of the CPUs)")
    return cases


def times_note(cases: tuple[Case, ...] | list[Case]) -> str:
    """Every run's time, with the share of the CPUs other processes used during it."""
    runs = "; ".join(f"{c.label} " + ", ".join(f"{t:.3f} ({o:.0%})" for t, o in zip(c.times, c.others)) for c in cases)
    return (
        "runs interleaved after an untimed warm-up round; every run's time in s, with (in brackets) the "
        f"share of the CPUs other processes and kernel threads used meanwhile: {runs}"
    )


def _cpu_counters() -> tuple[float, float]:
    """CPU seconds: all CPUs busy since boot, and this process (with its waited-for children)."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return own, own
    busy = sum(v) - v[3] - v[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK"), own


def cpu_busy(interval: float = 0.5) -> float:
    """Share of all CPUs busy over ``interval`` while this process sleeps: other processes' load."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(interval)
        total1, idle1 = sample()
    except (OSError, ValueError):
        return float("nan")
    dt = total1 - total0
    return 0.0 if dt <= 0 else max(0.0, 1 - (idle1 - idle0) / dt)


def wait_for_idle(max_wait: float, threshold: float = 0.15) -> float:
    """Sample other processes' CPU use; with ``max_wait``, wait up to that long for it to drop
    under ``threshold``. Returns the last sample."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > threshold and time.monotonic() < deadline:
        log(f"other processes keep {busy:.0%} of the CPUs busy; waiting for a quieter moment")
        busy = cpu_busy(1.0)
    return busy


def settle() -> None:
    """Flush dirty pages left by earlier writes so they do not slow the next timed run."""
    os.sync()


# --------------------------------------------------------------------------- files and folders


def fresh_dir(path: Path) -> Path:
    remove(path)
    path.mkdir(parents=True)
    return path


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def hardlink_copy(src: Path, dst: Path) -> None:
    """A copy of a store folder made of hard links: instant, and safe because every store
    write is a new file renamed into place (immutable chunks are never written in place)."""
    remove(dst)
    subprocess.run(["cp", "-al", str(src), str(dst)], check=True)


def warm(path: Path, block: int = 16 * MiB) -> float:
    """Read ``path`` once so it sits in the page cache; returns the seconds it took."""
    buf = bytearray(block)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def write_json_atomic(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def machine_summary() -> str:
    import platform

    import blake3

    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{os.cpu_count()} CPUs{mem}, Python {platform.python_version()}, "
        f"blake3 {blake3.__version__}, {platform.system()} {platform.release()}"
    )


# --------------------------------------------------------------------------- LLaMA-shaped checkpoints


@dataclass(frozen=True)
class LlamaShape:
    """Dimensions of a LLaMA-style decoder (full multi-head attention: q/k/v/o are [d, d])."""

    vocab: int
    d: int
    f: int
    layers: int

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, shape)`` in file order, named as Hugging Face names LLaMA weights."""
        d, f = self.d, self.f
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, d))]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            out += [
                (f"{p}.input_layernorm.weight", (d,)),
                (f"{p}.self_attn.q_proj.weight", (d, d)),
                (f"{p}.self_attn.k_proj.weight", (d, d)),
                (f"{p}.self_attn.v_proj.weight", (d, d)),
                (f"{p}.self_attn.o_proj.weight", (d, d)),
                (f"{p}.post_attention_layernorm.weight", (d,)),
                (f"{p}.mlp.gate_proj.weight", (f, d)),
                (f"{p}.mlp.up_proj.weight", (f, d)),
                (f"{p}.mlp.down_proj.weight", (d, f)),
            ]
        out += [("model.norm.weight", (d,)), ("lm_head.weight", (self.vocab, d))]
        return out

    def data_bytes(self) -> int:
        return sum(2 * math.prod(s) for _, s in self.tensors())


def plan_shape(size_bytes: int) -> LlamaShape:
    """The LLaMA shape whose bf16 weights first reach ``size_bytes``.

    Picks the widest model (d from 4096 down to 128) that still needs at least 8 layers, with
    the MLP width about 2.75·d rounded to 256 as in LLaMA-style models, and a 32,000-token
    vocabulary (4,096 for the tiny widths of smoke-test sizes).
    """
    shape = LlamaShape(0, 0, 0, 0)
    for d in (4096, 2048, 1024, 512, 256, 128):
        f = 256 * math.ceil(2.75 * d / 256)
        vocab = 32000 if d >= 512 else 4096
        fixed = LlamaShape(vocab, d, f, 0).data_bytes()
        per_layer = LlamaShape(vocab, d, f, 1).data_bytes() - fixed
        shape = LlamaShape(vocab, d, f, max(1, math.ceil((size_bytes - fixed) / per_layer)))
        if shape.layers >= 8:
            break
    return shape


@dataclass(frozen=True)
class Checkpoint:
    folder: Path
    file: Path
    shape: LlamaShape
    size: int
    #: names of the tensors changed from the base (fine-tuned copies only)
    changed: tuple[str, ...] = ()
    changed_bytes: int = 0

    @property
    def n_tensors(self) -> int:
        return len(self.shape.tensors())


def _header_bytes(specs: list[tuple[str, tuple[int, ...]]]) -> tuple[bytes, list[tuple[int, int]]]:
    header: dict = {"__metadata__": {"format": "pt"}}
    spans = []
    off = 0
    for name, shape in specs:
        n = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        spans.append((off, off + n))
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data region starts 8-byte aligned, as the library writes it
    return struct.pack("<Q", len(raw)) + raw, spans


def _random_tensor(shape: tuple[int, ...], seed: int, is_norm: bool):
    import torch

    g = torch.Generator().manual_seed(seed)
    if is_norm:
        return torch.ones(shape, dtype=torch.bfloat16).add_(
            torch.randn(shape, generator=g).mul_(0.05).to(torch.bfloat16)
        )
    return torch.empty(shape, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=g)


def _raw(t) -> memoryview:
    """The bytes of a bf16 tensor, without copying (numpy has no bf16, so view it as int16)."""
    import torch

    return memoryview(t.contiguous().view(torch.int16).numpy()).cast("B")


def ensure_checkpoint(data_dir: Path, size_gb: float, *, seed: int = 1234) -> Checkpoint:
    """A LLaMA-shaped bf16 checkpoint of at least ``size_gb`` GB (10^9 bytes) in ``data_dir``,
    generated once and reused while its sidecar and size match."""
    shape = plan_shape(int(size_gb * GB))
    name = f"llama-{size_gb:g}gb"
    folder = data_dir / name
    file = folder / "model.safetensors"
    sidecar = data_dir / f"{name}.json"
    specs = shape.tensors()
    header, spans = _header_bytes(specs)
    size = len(header) + spans[-1][1]
    params = {"format": DATA_FORMAT, "shape": asdict(shape), "seed": seed, "size": size}
    if read_json(sidecar) == params and file.is_file() and file.stat().st_size == size:
        log(f"reusing {file} ({size / GB:.2f} GB)")
        return Checkpoint(folder, file, shape, size)
    log(
        f"generating {file}: {len(specs)} bf16 tensors, "
        f"d={shape.d} f={shape.f} layers={shape.layers}, {size / GB:.2f} GB"
    )
    remove(sidecar)
    fresh_dir(folder)
    tmp = folder / f".model.{uuid.uuid4().hex}.tmp"
    t0 = time.perf_counter()
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            for i, (_, tshape) in enumerate(specs):
                t = _random_tensor(tshape, seed * 100_003 + i, len(tshape) == 1)
                f.write(_raw(t))
                del t
        os.replace(tmp, file)
    finally:
        if tmp.exists():
            tmp.unlink()
    _check_readable(file, len(specs))
    write_json_atomic(sidecar, params)
    log(f"generated in {time.perf_counter() - t0:.1f} s")
    return Checkpoint(folder, file, shape, size)


def changed_tensor_names(shape: LlamaShape, fraction: float) -> list[str]:
    """``fraction`` of all tensors (at least one), spread evenly over the layers' weight matrices,
    as a partial fine-tune would touch them."""
    specs = shape.tensors()
    n = max(1, round(fraction * len(specs)))
    candidates = [name for name, s in specs if name.startswith("model.layers.") and len(s) == 2]
    step = len(candidates) / n
    return [candidates[int(step * k + step / 2)] for k in range(n)]


def ensure_finetuned(base: Checkpoint, data_dir: Path, *, fraction: float = 0.05, seed: int = 99) -> Checkpoint:
    """A copy of ``base`` with ``fraction`` of its tensors changed in full (old weights plus a
    small random update, as a fine-tune step would leave them); reused like the base."""
    import numpy as np
    import torch

    from concord.snapshots.safetensors_header import read_header

    names = changed_tensor_names(base.shape, fraction)
    folder = data_dir / f"{base.folder.name}-ft"
    file = folder / "model.safetensors"
    sidecar = data_dir / f"{folder.name}.json"
    with open(base.file, "rb") as f:
        layout = {t.name: t for t in read_header(f, base.size, str(base.file)).tensors}
    changed_bytes = sum(layout[n].length for n in names)
    params = {
        "format": DATA_FORMAT,
        "base": read_json(data_dir / f"{base.folder.name}.json"),
        "base_mtime_ns": base.file.stat().st_mtime_ns,
        "changed": names,
        "changed_bytes": changed_bytes,
        "seed": seed,
        "size": base.size,
    }
    done = Checkpoint(folder, file, base.shape, base.size, tuple(names), changed_bytes)
    if read_json(sidecar) == params and file.is_file() and file.stat().st_size == base.size:
        log(f"reusing {file} ({len(names)} tensors changed)")
        return done
    log(f"writing {file}: {len(names)} of {base.n_tensors} tensors changed ({changed_bytes / MB:.0f} MB)")
    remove(sidecar)
    fresh_dir(folder)
    tmp = folder / f".model.{uuid.uuid4().hex}.tmp"
    try:
        shutil.copyfile(base.file, tmp)
        old = np.memmap(base.file, dtype=np.uint8, mode="r")
        with open(tmp, "r+b") as f:
            for k, name in enumerate(names):
                info = layout[name]
                w = torch.frombuffer(bytearray(old[info.begin : info.end]), dtype=torch.bfloat16)
                g = torch.Generator().manual_seed(seed * 1009 + k)
                w.add_(torch.randn(w.shape, generator=g).mul_(1e-3).to(torch.bfloat16))
                f.seek(info.begin)
                f.write(_raw(w))
        del old
        os.replace(tmp, file)
    finally:
        if tmp.exists():
            tmp.unlink()
    _check_readable(file, base.n_tensors)
    write_json_atomic(sidecar, params)
    return done


def _check_readable(file: Path, n_tensors: int) -> None:
    """The file opens in the safetensors library itself, with every tensor listed."""
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        n = len(list(f.keys()))
    if n != n_tensors:
        raise RuntimeError(f"{file}: the safetensors library lists {n} tensors, expected {n_tensors}")


# --------------------------------------------------------------------------- memory probe

POLL_SECONDS = 0.005


def status_kb(pid: int, fields: tuple[str, ...]) -> dict[str, int] | None:
    """The ``fields`` (e.g. RssAnon) of ``/proc/PID/status`` in kB, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in fields:
            out[key] = int(rest.split()[0])
    return out


def self_anon_kb() -> int:
    st = status_kb(os.getpid(), ("RssAnon",))
    if not st:
        raise RuntimeError("/proc/self/status has no RssAnon: the memory probe needs Linux")
    return st["RssAnon"]


def probe_memory(code: str, args: list[str], fields: tuple[str, ...] = ("RssAnon",)) -> tuple[dict[str, int], int, dict, int]:
    """Run ``python -c code args…`` and poll its ``fields`` every POLL_SECONDS from here.

    The child prints ``READY <baseline RssAnon kB>``, waits for a line on stdin, does the work and
    prints one JSON line. Returns (peak kB per field, baseline kB, the child's JSON, samples)."""
    import threading

    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=REPO_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    peak = {k: 0 for k in fields}
    samples = 0
    recording = threading.Event()
    done = threading.Event()

    def poll() -> None:
        nonlocal samples
        while not done.is_set():
            st = status_kb(proc.pid, fields)
            if st is None:
                return
            if recording.is_set():
                samples += 1
                for k in peak:
                    peak[k] = max(peak[k], st.get(k, 0))
            time.sleep(POLL_SECONDS)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        ready = proc.stdout.readline().split()
        if not ready or ready[0] != "READY":
            raise RuntimeError(f"the memory probe did not start (it printed {ready!r})")
        baseline_kb = int(ready[1])
        recording.set()
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        if proc.wait() != 0:
            raise RuntimeError(f"the memory probe exited with {proc.returncode}")
    finally:
        done.set()
        poller.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return peak, baseline_kb, result, samples
