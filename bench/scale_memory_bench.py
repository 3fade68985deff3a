"""Memory at scale in files: every command on 100,000 small files against the same on 20,000,
and the load of the larger manifest.

Setup (untimed): two folders of small files (``--files`` files of ``--size`` bytes, default
100,000 of 4 KB, and a fifth as many; ``--quick``: 5,000 and 1,000), made as the ``scale``
benchmark makes its folder (one opaque chunk a file).

Measured, for each folder, each command as its own process (``python -m concord.cli``), with its
peak resident memory (the kernel's high-water mark, ``ru_maxrss`` from ``wait4``): a fresh snapshot, a
re-hash (the same snapshot again), ``verify``, ``restore``, ``checkout`` and ``sync`` to an empty
folder store. What each command adds per 1,000 files between the two folders is set beside what
reading and parsing the manifest alone adds (a child process that only loads it): a command whose
memory grows with files only through the manifest has a ratio near 1.

The larger manifest's load (read the bytes, parse, check every node hash) is timed in this
process, best of 5, as CPU seconds and wall seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import MB, Options, Row, Table, Target, fresh_dir, log, remove
from bench.scale_bench import _folder

FILES, QUICK_FILES, FILE_BYTES = 100_000, 5_000, 4096
REF = "bench/scale-memory"
COMMANDS = ("snapshot (fresh)", "snapshot (re-hash)", "verify", "restore", "checkout", "sync")

#: a process that only reads and parses the manifest (what every command holds at least)
LOAD_ONLY = """
import sys
from concord.snapshots.manifest import Manifest
from concord.snapshots.refs import resolve_root
from concord.stores import LocalDirStore
s = LocalDirStore(sys.argv[1], must_exist=True)
root = resolve_root(s, sys.argv[2])
Manifest.from_json(s.get_manifest_bytes(root), expected_root=root)
"""


def _peak_rss_mb(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(peak resident memory in MB, seconds) of a command run to its end: the kernel's own
    high-water mark of the process (``wait4``'s ``ru_maxrss``), so no peak falls between polls."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()  # until it exits (its error, if any, is short)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:6])} ... exited with {proc.returncode}: {err.decode(errors='replace').strip()[-2000:]}")
    return usage.ru_maxrss * 1024 / MB, time.perf_counter() - t0


def _commands(src: Path, work: Path) -> dict[str, list[str]]:
    store, again, out, link, replica = (str(work / p) for p in ("store", "store-b", "out", "serve/current", "replica"))
    return {
        "snapshot (fresh)": ["snapshot", str(src), "--store", again, "--ref", REF],
        "snapshot (re-hash)": ["snapshot", str(src), "--store", store, "--ref", REF],
        "verify": ["verify", store],
        "restore": ["restore", store, "--ref", REF, out],
        "checkout": ["checkout", store, "--ref", REF, link],
        "sync": ["sync", store, replica, "--ref", REF],
    }


def _one_size(opts: Options, n: int, size: int) -> tuple[dict[str, tuple[float, float]], float, Path, Path]:
    """Per command (peak resident MB, seconds), the load-only process's, the store and its work folder."""
    src = _folder(opts.data_dir, n, size)
    work = fresh_dir(opts.work_dir / f"scale-memory-{n}")
    env = dict(os.environ, CONCORD_NO_PROGRESS="1", CONCORD_HOME=str(work / "home"))
    concord = [sys.executable, "-m", "concord.cli"]
    log(f"{n} files: the snapshot the other commands start from")
    subprocess.run([*concord, "snapshot", str(src), "--store", str(work / "store"), "--ref", REF], env=env, check=True, capture_output=True)
    got = {}
    for label, argv in _commands(src, work).items():
        got[label] = _peak_rss_mb([*concord, *argv], env)
        log(f"{n} files: {label}: {got[label][0]:.0f} MB resident at the most, {got[label][1]:.1f} s")
    load_only, _ = _peak_rss_mb([sys.executable, "-c", LOAD_ONLY, str(work / "store"), REF], env)
    return got, load_only, work / "store", work


def _load_times(store: Path) -> tuple[float, float, float]:
    """(best CPU seconds, best wall seconds, MB of JSON) of reading and checking the manifest, best of 5."""
    from concord.snapshots.manifest import Manifest
    from concord.snapshots.refs import resolve_root
    from concord.stores import LocalDirStore

    s = LocalDirStore(store, must_exist=True)
    root = resolve_root(s, REF)
    cpu = wall = float("inf")
    size = 0
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time()
        data = s.get_manifest_bytes(root)
        Manifest.from_json(data, expected_root=root)
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - t0)
        size = len(data)
    return cpu, wall, size / MB


def run(opts: Options) -> list[Table]:
    big = opts.files or (QUICK_FILES if opts.quick else FILES)
    small = max(1, big // 5)
    size = opts.file_size or FILE_BYTES
    small_got, small_load, _, small_work = _one_size(opts, small, size)
    remove(small_work)
    big_got, big_load, big_store, big_work = _one_size(opts, big, size)
    try:
        cpu, wall, json_mb = _load_times(big_store)
    finally:
        remove(big_work)
    per_k = 1000 / (big - small)
    load_slope = (big_load - small_load) * per_k
    table = Table(
        f"scale-memory: {small} and {big} files of {size / 1000:g} KB, each command as its own process, "
        f"peak resident memory"
    )
    for label in COMMANDS:
        (a, _), (b, _) = small_got[label], big_got[label]
        table.add(Row(f"{label}: MB per 1,000 files", (b - a) * per_k, load_slope, "MB", Target("ratio", "<=", 1.5), "the manifest's load"))
        table.add(Row(f"{label}: peak at {big} files", b, None, "MB"))
    table.add(Row(f"manifest load ({big} files, {json_mb:.1f} MB), CPU", cpu, None, "s", Target("value", "<", 1.0)))
    table.add(Row(f"manifest load ({big} files), wall", wall, None, "s", Target("value", "<", 1.0)))
    table.notes += [
        f"the manifest's load alone (a process that reads and parses it): {small_load:.0f} MB at {small} files, "
        f"{big_load:.0f} MB at {big}, {load_slope:.2f} MB per 1,000 files",
        "times at the larger size: " + ", ".join(f"{k} {big_got[k][1]:.1f} s" for k in COMMANDS),
        "each file is one chunk, so files and chunks grow together; worker threads are the store's defaults",
        "the manifest load is timed in this process, best of 5 (read from the store, parsed, every node hash checked)",
    ]
    return [table]
