"""Scale in files: every command on a folder of many small files, each beside its baseline, with
the most files each command held open.

Setup (untimed): ``--files`` files of ``--size`` bytes each (default 20,000 of 50 KB: 1 GB;
``--quick``: 500), random bytes, 1,000 to a folder, named ``shard-NNNNNN.dat`` (an extension no
checkpoint format claims, so every file is one opaque part); generated once and reused while
their sidecar matches; read once so they sit in the page cache.

Timed, each command as its own process (``python -m concord.cli``, as a user runs it), in
interleaved rounds with its baseline:

- a fresh snapshot into an empty folder store, against ``rsync -a`` into an empty folder (and,
  when ``restic`` is installed, ``restic backup`` into a new local repository);
- a re-hash: the same snapshot again into the same store (every chunk there already), against
  ``b3sum`` of every file (when ``b3sum`` is not installed, a Python loop hashing each file with
  the same ``blake3`` library Concord uses, said in the table) and ``restic backup --force`` into
  a repository holding the folder already;
- ``concord verify`` of the store, against the same baseline over the store's chunk files;
- ``concord restore`` into a new folder, and ``concord checkout`` of a new link (each file
  flushed to disk as it is finished, the default; and with ``--no-fsync``), against ``cp -a``;
- ``concord sync`` into an empty folder store, against ``rsync -a`` of the store's folder.

The Concord commands start as an installed package does, from compiled bytecode (kept under the
scratch folder, whatever ``PYTHONDONTWRITEBYTECODE`` says). Run it under a low open-file limit, as the goal asks: ``bash -c 'ulimit -n 256; python -m bench
scale --files 20000 --size 50k'``. Every process is polled every 2 ms for its open file
descriptors (``/proc/PID/fd``); the most any Concord command held is a row of its own. The
manifest's load (parse and check every hash, in this process) is timed too.

Every run of a command that writes a folder writes a new one, and they are all removed after the
last round, when the disk has room for them (about ``--size`` × ``--files`` × 8 per round; else
each run's folder is removed before the next, and the notes say so). On ext4 without a journal,
creating a file where thousands were freed in the last minutes walks past each of them (ext4 keeps
a freed inode unused for a minute, six while its inode-table block is dirty): removing one run's
20,000 files before the next made whichever command came next pay most of its time in that walk
(``find_inode_bit``/``recently_deleted``: 60-75% of the CPU of ``cp -a`` and ``checkout`` alike
under ``perf``), more for some commands than others, as the freed inodes happened to lie.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import (
    MB,
    Case,
    Options,
    Row,
    Table,
    Target,
    fresh_dir,
    log,
    race,
    read_json,
    remove,
    settle,
    times_note,
    warm,
    write_json_atomic,
)

FILES = 20_000
#: commands that write a folder of the files' size, per round (snapshot, rsync, restore, cp,
#: checkout twice, sync, rsync of the store)
WRITERS = 8
QUICK_FILES = 500
FILE_BYTES = 50_000
PER_FOLDER = 1000
REF = "bench/scale"
#: what ``--only`` may name: each operation is timed with its baselines (cp -a is restore's and checkout's)
OPERATIONS = ("snapshot", "rehash", "verify", "restore", "checkout", "sync")

#: the baseline re-hash when b3sum is not installed: each file hashed whole with blake3
HASH_ALL = """
import os, sys
from blake3 import blake3
n = 0
for root, _, names in os.walk(sys.argv[1]):
    for name in names:
        with open(os.path.join(root, name), "rb") as f:
            blake3(f.read(), max_threads=1).hexdigest()
        n += 1
print(n)
"""


def _folder(data_dir: Path, n: int, size: int) -> Path:
    src = data_dir / f"scale-{n}x{size}"
    sidecar = data_dir / f"scale-{n}x{size}.json"
    params = {"files": n, "size": size, "per_folder": PER_FOLDER, "format": 1}
    if read_json(sidecar) == params and src.is_dir():
        log(f"reusing {src}")
        return src
    log(f"writing {n} files of {size} bytes into {src}")
    remove(sidecar)
    fresh_dir(src)
    rng = random.Random(20_000)
    for i in range(n):
        folder = src / f"part-{i // PER_FOLDER:04d}"
        if i % PER_FOLDER == 0:
            folder.mkdir()
        (folder / f"shard-{i:06d}.dat").write_bytes(rng.randbytes(size))
    write_json_atomic(sidecar, params)
    return src


class _Fresh:
    """The folder a writing command writes in its run: a new one each run (``name-1``,
    ``name-2``...) when ``keep``, all removed after the race; else the same one, removed before."""

    def __init__(self, base: Path, keep: bool) -> None:
        self.base, self.keep, self.runs = base, keep, 0

    @property
    def path(self) -> Path:
        return self.base.with_name(f"{self.base.name}-{self.runs}") if self.keep else self.base

    def next(self) -> None:
        if self.keep:
            self.runs += 1
        remove(self.path)


class _Counted:
    """Runs a command, polling its open file descriptors; keeps the most seen, and the least CPU
    time (user and system) a run of it took."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}
        self.cpu: dict[str, float] = {}

    def run(self, label: str, argv: list[str], env: dict[str, str]) -> None:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        most = 0
        done = threading.Event()

        def poll() -> None:
            nonlocal most
            fd_dir = f"/proc/{proc.pid}/fd"
            while not done.is_set():
                try:
                    most = max(most, len(os.listdir(fd_dir)))
                except OSError:
                    return
                time.sleep(0.002)

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            _, err = proc.communicate(timeout=3600)
        finally:
            done.set()
            poller.join()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"{label}: {' '.join(argv[:6])} ... exited with {proc.returncode}: {err.strip()[-2000:]}")
        self.peak[label] = max(self.peak.get(label, 0), most)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        self.cpu[label] = min(self.cpu.get(label, cpu), cpu)


def run(opts: Options) -> list[Table]:
    n = opts.files or (QUICK_FILES if opts.quick else FILES)
    size = opts.file_size or FILE_BYTES
    src = _folder(opts.data_dir, n, size)
    work = fresh_dir(opts.work_dir / "scale")
    store = work / "store"
    need = WRITERS * n * size * (opts.runs + (1 if opts.runs > 1 else 0))
    keep = shutil.disk_usage(work).free > need + 10 * 10**9  # and 10 GB left for others
    again, out, link, replica, copy, copy2 = (
        _Fresh(work / p, keep) for p in ("store-b", "out", "serve", "replica", "copy", "copy-fresh")
    )
    env = dict(os.environ, CONCORD_NO_PROGRESS="1", CONCORD_HOME=str(work / "home"), PYTHONPYCACHEPREFIX=str(work / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package starts from bytecode
    concord = [sys.executable, "-m", "concord.cli"]
    rsync = shutil.which("rsync")
    b3sum = shutil.which("b3sum")
    restic = shutil.which("restic")
    restic_env = dict(env, RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=str(work / "restic-cache"))
    repo, fresh_repo = work / "restic", work / "restic-fresh"
    counted = _Counted()
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    secs = sum(warm(p) for p in src.rglob("*.dat"))
    log(f"{n} files read into the page cache in {secs:.1f} s; open-file limit {nofile}")

    def cmd(label: str, *argv):
        """``argv``'s items are strings, or callables giving one when the command starts."""
        return lambda: counted.run(label, [a() if callable(a) else a for a in argv], env)

    def clear(*folders: _Fresh):
        def before() -> None:
            for f in folders:
                f.next()
            settle()

        return before

    def at(folder: _Fresh, tail: str = ""):
        return lambda: f"{folder.path}{tail}"

    def restic_run(*argv: str) -> None:
        subprocess.run([restic or "restic", "--quiet", *argv], env=restic_env, check=True, stdout=subprocess.DEVNULL)

    def restic_case(label: str, *argv: str):
        return lambda: counted.run(label, [restic or "restic", "--quiet", *argv], restic_env)

    def new_repo() -> None:
        remove(fresh_repo)
        restic_run("init", "--repo", str(fresh_repo))
        settle()

    def hash_all(folder: Path) -> list[str]:
        if b3sum:
            return ["bash", "-c", f"find {folder} -type f -print0 | xargs -0 {b3sum} > /dev/null"]
        return [sys.executable, "-c", HASH_ALL, str(folder)]

    # the snapshot the other commands start from (untimed)
    counted.run("setup", [*concord, "snapshot", str(src), "--store", str(store), "--ref", REF], env)
    ops = set(opts.only or OPERATIONS)
    if restic and "rehash" in ops:
        restic_run("init", "--repo", str(repo))
        restic_run("backup", "--repo", str(repo), str(src))
    # each case with the operations it is timed for
    tagged = [
        Case(
            "concord snapshot (fresh)",
            cmd("snapshot", *concord, "snapshot", str(src), "--store", at(again), "--ref", REF),
            clear(again),
        ),
        Case("rsync -a (fresh)", cmd("rsync", rsync or "true", "-a", f"{src}/", at(copy2, "/")), clear(copy2)),
        Case(
            "concord snapshot (re-hash)",
            cmd("re-hash", *concord, "snapshot", str(src), "--store", str(store), "--ref", REF),
        ),
        Case("hash every file", cmd("hash", *hash_all(src))),
        *(
            [
                Case(
                    "restic backup (fresh)",
                    restic_case("restic", "backup", "--repo", str(fresh_repo), str(src)),
                    new_repo,
                ),
                Case(
                    "restic backup --force",
                    restic_case("restic-force", "backup", "--force", "--repo", str(repo), str(src)),
                ),
            ]
            if restic
            else []
        ),
        Case("concord verify", cmd("verify", *concord, "verify", str(store))),
        Case("hash every chunk file", cmd("hash-store", *hash_all(store / "chunks"))),
        Case("concord restore", cmd("restore", *concord, "restore", str(store), "--ref", REF, at(out)), clear(out)),
        Case("cp -a", cmd("cp", "cp", "-a", str(src), at(copy)), clear(copy)),
        Case(
            "concord checkout",
            cmd("checkout", *concord, "checkout", str(store), "--ref", REF, at(link, "/current")),
            clear(link),
        ),
        Case(
            "concord checkout --no-fsync",
            cmd("checkout-nofsync", *concord, "checkout", str(store), "--ref", REF, at(link, "/current"), "--no-fsync"),
            clear(link),
        ),
        Case("concord sync", cmd("sync", *concord, "sync", str(store), at(replica), "--ref", REF), clear(replica)),
        Case(
            "rsync -a of the store",
            cmd("rsync-store", rsync or "true", "-a", f"{store}/", at(replica, "/")),
            clear(replica),
        ),
    ]
    cases = [case for case in tagged if _OPS_OF[case.label] & ops]
    try:
        race(opts.runs, *cases, warmup=opts.runs > 1, wait_idle=opts.wait_idle)
        load = _manifest_load(store)
    finally:
        _remove_all(work)
    c = {case.label: case.best for case in cases}
    gb = n * size / 1e9
    table = Table(
        f"scale: {n} files of {size / 1000:g} KB ({gb:.2f} GB), each command as its own process, "
        f"open-file limit {nofile}, best of {opts.runs}"
    )
    rs = "rsync -a" if rsync else None

    def vs(metric: str, ours: str, base: str, name: str | None, limit: float | None) -> None:
        if ours not in c:  # an operation --only left out
            return
        table.add(Row(metric, c[ours], c[base] if name else None, "s", Target("ratio", "<=", limit) if limit and name else None, name or ""))

    hashing = "b3sum" if b3sum else "blake3 per file (Python; b3sum is not installed)"
    vs("fresh snapshot into an empty store", "concord snapshot (fresh)", "rsync -a (fresh)", rs, 1.5)
    if restic and "snapshot" in ops:
        vs("fresh snapshot, beside restic", "concord snapshot (fresh)", "restic backup (fresh)", "restic backup, new repo", None)
    vs("re-hash: snapshot of the unchanged folder", "concord snapshot (re-hash)", "hash every file", hashing, 2.0)
    if restic and "rehash" in ops:
        vs("re-hash, beside restic", "concord snapshot (re-hash)", "restic backup --force", "restic backup --force", None)
    vs("verify of the store", "concord verify", "hash every chunk file", hashing, None)
    vs("restore into a new folder", "concord restore", "cp -a", "cp -a", 2.0)
    vs("checkout (each file flushed)", "concord checkout", "cp -a", "cp -a", 2.0)
    vs("checkout --no-fsync", "concord checkout --no-fsync", "cp -a", "cp -a", 2.0)
    vs("sync to an empty local store", "concord sync", "rsync -a of the store", "rsync -a" if rsync else None, 1.0)
    baselines = ("rsync", "hash", "hash-store", "cp", "rsync-store", "restic", "restic-force")
    ours = {k: v for k, v in counted.peak.items() if k not in baselines}
    table.add(Row("most files open in any concord command", max(ours.values()), None, "fds", Target("value", "<", 256)))
    table.add(Row(f"manifest load ({n} files, every hash checked)", load, None, "s", Target("value", "<", 1.0)))
    table.notes += [
        "open file descriptors at the most, per command (polled every 2 ms): "
        + ", ".join(f"{k} {v}" for k, v in counted.peak.items()),
        "CPU seconds (user and system, the least of its runs) of each command, on a shared machine "
        "steadier than its wall time: " + ", ".join(f"{k} {v:.2f}" for k, v in counted.cpu.items() if k != "setup"),
        "throughput: " + ", ".join(
            f"{what} {gb / c[label]:.2f} GB/s ({n / c[label]:.0f} files/s)"
            for what, label in (("fresh snapshot", "concord snapshot (fresh)"), ("re-hash", "concord snapshot (re-hash)"),
                                ("restore", "concord restore"), ("checkout", "concord checkout"))
            if label in c
        ),
        "a fresh snapshot and a sync flush every chunk file to disk before the ref moves, and a "
        "checkout every file before its flip (rsync and cp flush nothing); each Concord row includes "
        "the process's start (from bytecode) and the manifest's load",
        *([] if b3sum else ["b3sum is not installed here: the hashing baseline is a Python loop over the files with the blake3 library (one thread per file)"]),
        *(["restic (" + _version(restic) + ") with its defaults: a repository of compressed packs, "
           "its cache under the scratch folder"] if restic else ["restic is not installed here: its rows are left out"]),
        *([] if rsync else ["rsync is not installed here: its rows have no baseline"]),
        *(["one run each, without the warm-up round the next note names"] if opts.runs == 1 else []),
        *([f"only {', '.join(o for o in OPERATIONS if o in ops)} timed (--only)"] if opts.only else []),
        ("every run of a command that writes a folder wrote a new one, all removed after the last round "
         "(no file was removed while any was timed)" if keep else
         f"the disk has no room for a new folder each run ({need / 1e9:.0f} GB): each run's folder was "
         "removed before the next, and on ext4 without a journal the next command's file creation "
         "walks past the inodes freed"),
        times_note(cases),
    ]
    return [table]


#: the operations each case is timed for
_OPS_OF = {
    "concord snapshot (fresh)": {"snapshot"},
    "rsync -a (fresh)": {"snapshot"},
    "restic backup (fresh)": {"snapshot"},
    "concord snapshot (re-hash)": {"rehash"},
    "hash every file": {"rehash"},
    "restic backup --force": {"rehash"},
    "concord verify": {"verify"},
    "hash every chunk file": {"verify"},
    "concord restore": {"restore"},
    "cp -a": {"restore", "checkout"},
    "concord checkout": {"checkout"},
    "concord checkout --no-fsync": {"checkout"},
    "concord sync": {"sync"},
    "rsync -a of the store": {"sync"},
}


def _remove_all(work: Path) -> None:
    """Remove ``work``, its folders side by side: where the filesystem discards each file's blocks
    as it is removed (``-o discard``), one thread would wait for each discard in turn."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(remove, list(work.iterdir()) if work.is_dir() else []))
    remove(work)


def _version(tool: str) -> str:
    out = subprocess.run([tool, "version"], capture_output=True, text=True, timeout=30).stdout.split()
    return " ".join(out[:2]) if out else tool


def _manifest_load(store: Path) -> float:
    """Seconds to read and check the snapshot's manifest (best of 3), in this process."""
    from concord.snapshots.manifest import Manifest
    from concord.snapshots.refs import resolve_root
    from concord.stores import LocalDirStore

    s = LocalDirStore(store, must_exist=True)
    root = resolve_root(s, REF)
    data = s.get_manifest_bytes(root)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        Manifest.from_json(data, expected_root=root)
        best = min(best, time.perf_counter() - t0)
    log(f"manifest of {len(data) / MB:.1f} MB loads in {best:.3f} s")
    return best
