"""Fan-out: one snapshot synced from a local store to N empty local stores at once.

Setup (untimed): a folder of 64 files of 128 KB (random bytes, one chunk each; 16 of 64 KB with
--quick) is snapshotted into a source store. For each N (1, 16, 128; 1, 8, 32 with --quick):

- ``replicate(source, N targets)`` runs in a child process polled from here (``probe_memory``:
  its peak anonymous memory), which also samples its own thread count every millisecond and
  counts how often each chunk object is read from the source (a thin subclass of the real store);
- the baseline is a loop of ``cp -a`` of the folder into N folders.

Targets: source chunks read once, threads ≤ 64 and anonymous memory ≤ 200 MB whatever N, time ≤
the ``cp -a`` loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.common import (
    MB,
    Options,
    Row,
    Table,
    Target,
    fresh_dir,
    log,
    probe_memory,
    remove,
)

FILES, FILE_BYTES = 64, 128 * 1024
QUICK_FILES, QUICK_FILE_BYTES = 16, 64 * 1024
COUNTS = (1, 16, 128)
QUICK_COUNTS = (1, 8, 32)

#: the child: says READY, waits, syncs to N targets, prints one JSON line
CHILD = """
import sys
from bench.fanout_bench import child
child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


def child(source: str, targets: str, n: int) -> None:
    import json
    import threading
    from collections import Counter

    from bench.common import self_anon_kb
    from concord.snapshots.sync import replicate
    from concord.stores.local import LocalDirStore

    reads: Counter = Counter()

    class Counting(LocalDirStore):
        def _read_object_transient(self, key):
            if key.startswith("chunks/"):
                reads[key] += 1
            return super()._read_object_transient(key)

        def _get_object(self, key):
            if key.startswith("chunks/"):
                reads[key] += 1
            return super()._get_object(key)

    src = Counting(source, must_exist=True)
    stores = [LocalDirStore(os.path.join(targets, f"t{i}")) for i in range(n)]
    peak = threading.active_count()
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.001):
            peak = max(peak, threading.active_count())

    sampler = threading.Thread(target=sample, daemon=True)
    print(f"READY {self_anon_kb()}", flush=True)
    sys.stdin.readline()
    sampler.start()
    t0 = time.perf_counter()
    results = replicate(src, stores, ref="bench/fanout")
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join(timeout=5)
    print(json.dumps({
        "seconds": seconds,
        "threads": peak - 1,  # the sampler itself not counted
        "chunks": len(reads),
        "reads_max": max(reads.values(), default=0),
        "sent": sum(r.chunks_sent for r in results),
    }), flush=True)


def run(opts: Options) -> list[Table]:
    from concord.snapshots.snapshot import snapshot
    from concord.stores.local import LocalDirStore

    files, size = (QUICK_FILES, QUICK_FILE_BYTES) if opts.quick else (FILES, FILE_BYTES)
    work = fresh_dir(opts.work_dir / "fanout")
    folder = work / "files"
    folder.mkdir()
    for i in range(files):
        (folder / f"f{i:03d}.bin").write_bytes(os.urandom(size))
    snapshot(folder, LocalDirStore(work / "source"), ref="bench/fanout")
    table = Table(f"fanout: a snapshot of {files} files of {size // 1024} KB synced to N local stores at once")
    for n in QUICK_COUNTS if opts.quick else COUNTS:
        targets = fresh_dir(work / "targets")
        peak, _, got, _ = probe_memory(CHILD, [str(work / "source"), str(targets), str(n)])
        remove(targets)
        copies = fresh_dir(work / "copies")
        t0 = time.perf_counter()
        for i in range(n):
            subprocess.run(["cp", "-a", str(folder), str(copies / f"c{i}")], check=True)
        cp_s = time.perf_counter() - t0
        remove(copies)
        log(f"N={n}: {got['seconds']:.2f} s (cp -a loop {cp_s:.2f} s), {got['threads']} threads, "
            f"{peak['RssAnon'] / 1024:.0f} MB anonymous, each chunk read at most {got['reads_max']}×")
        table.add(Row(f"N={n}: source reads per chunk", got["reads_max"], 1, "", Target("value", "<=", 1), "once"))
        table.add(Row(f"N={n}: threads (peak)", got["threads"], None, "", Target("value", "<=", 64)))
        table.add(Row(f"N={n}: anonymous memory (peak)", peak["RssAnon"] * 1024 / MB, None, "MB", Target("value", "<=", 200)))
        table.add(Row(f"N={n}: time", got["seconds"], cp_s, "s", Target("ratio", "<=", 1.0), "loop of cp -a"))
    table.notes.append(f"python {sys.version.split()[0]}; one run each; the child's memory includes the interpreter and imports")
    remove(work)
    return [table]
