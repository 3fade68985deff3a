"""Fan-out: one snapshot synced from a local store to N empty stores at once, N folders and N S3
stores.

Setup (untimed): a folder of 64 files of 128 KB (random bytes, one chunk each; 16 of 64 KB with
--quick) is snapshotted into a source store.

Folder targets, for each N (1, 16, 128; 1, 8, 32 with --quick):

- ``replicate(source, N folder stores)`` runs in a child process polled from here
  (``probe_memory``: its peak anonymous memory), which also samples its own thread count every
  millisecond and counts how often each chunk object is read from the source (a thin subclass of
  the real store); every chunk, manifest and ref it writes is on disk before it ends (durable);
- the baselines: a loop of ``cp -a`` of the folder into N folders, which flushes nothing, and
  the same loop followed by one ``sync -f`` of their filesystem (durable, as Concord is). Dirty
  pages of the steps before are flushed before each timed run.

S3 targets, for each N (1, 8, 32; 1, 4 with --quick): N buckets on one ``moto_server`` on
127.0.0.1, every request counted by the tests' proxy in front of it; the same child, the same
polls, and its requests; the baseline is a loop of ``rclone copy`` of the folder into N buckets
(16 transfers each), when rclone is installed.

Targets: source chunks read once, threads <= 64 and anonymous memory <= 200 MB whatever N, time <=
each baseline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

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
    settle,
)

FILES, FILE_BYTES = 64, 128 * 1024
QUICK_FILES, QUICK_FILE_BYTES = 16, 64 * 1024
COUNTS = (1, 16, 128)
QUICK_COUNTS = (1, 8, 32)
S3_COUNTS = (1, 8, 32)
QUICK_S3_COUNTS = (1, 4)

#: the child: says READY, waits, syncs to N targets, prints one JSON line
CHILD = """
import sys
from bench.fanout_bench import child
child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


def _targets(where: str, n: int) -> list:
    """N empty stores: folders under ``where``, or buckets of the S3 endpoint ``s3:URL``."""
    from concord.stores.local import LocalDirStore
    from concord.stores.s3 import S3ObjectStore

    if where.startswith("s3:"):
        tag = uuid.uuid4().hex[:8]
        return [S3ObjectStore(f"fanout-{tag}-{i}", "store", endpoint_url=where[3:], create_bucket=True) for i in range(n)]
    return [LocalDirStore(os.path.join(where, f"t{i}")) for i in range(n)]


def child(source: str, targets: str, n: int) -> None:
    import json
    import threading

    from bench.common import self_anon_kb
    from concord.snapshots.sync import replicate

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from counting import CountingStore  # a real folder store that counts its chunk reads

    src = CountingStore(source, must_exist=True)
    reads = src.reads
    stores = _targets(targets, n)
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
    try:
        return [_folders(opts, work, folder, files, size), _s3(opts, work, folder, files, size)]
    finally:
        remove(work)


def _sync_to(work: Path, where: str, n: int) -> tuple[float, dict]:
    """(peak anonymous MB, the child's figures) of a sync of the source to N targets at ``where``."""
    settle()
    peak, _, got, _ = probe_memory(CHILD, [str(work / "source"), where, str(n)])
    return peak["RssAnon"] * 1024 / MB, got


def _common_rows(table: Table, n: int, anon_mb: float, got: dict) -> None:
    table.add(Row(f"N={n}: source reads per chunk", got["reads_max"], 1, "", Target("value", "<=", 1), "once"))
    table.add(Row(f"N={n}: threads (peak)", got["threads"], None, "", Target("value", "<=", 64)))
    table.add(Row(f"N={n}: anonymous memory (peak)", anon_mb, None, "MB", Target("value", "<=", 200)))


def _folders(opts: Options, work: Path, folder: Path, files: int, size: int) -> Table:
    table = Table(f"fanout: a snapshot of {files} files of {size // 1024} KB synced to N local stores at once")
    for n in QUICK_COUNTS if opts.quick else COUNTS:
        targets = fresh_dir(work / "targets")
        anon_mb, got = _sync_to(work, str(targets), n)
        remove(targets)
        copies = fresh_dir(work / "copies")
        settle()
        t0 = time.perf_counter()
        for i in range(n):
            subprocess.run(["cp", "-a", str(folder), str(copies / f"c{i}")], check=True)
        cp_s = time.perf_counter() - t0
        subprocess.run(["sync", "-f", str(copies)], check=True)
        cp_sync_s = time.perf_counter() - t0
        remove(copies)
        log(f"N={n}: {got['seconds']:.2f} s (cp -a loop {cp_s:.2f} s, then sync {cp_sync_s:.2f} s), {got['threads']} threads, "
            f"{anon_mb:.0f} MB anonymous, each chunk read at most {got['reads_max']}×")
        _common_rows(table, n, anon_mb, got)
        table.add(Row(f"N={n}: time, durable", got["seconds"], cp_sync_s, "s", Target("ratio", "<=", 1.0), "cp -a loop, then one sync"))
        table.add(Row(f"N={n}: time, beside a copy not flushed", got["seconds"], cp_s, "s", Target("ratio", "<=", 1.0), "cp -a loop"))
    table.notes.append(
        f"python {sys.version.split()[0]}; one run each; the child's memory includes the interpreter and imports; "
        "Concord's time includes flushing every file it wrote (it ends durable); `cp -a` flushes nothing, "
        "and `sync -f` after the loop makes its copies as durable"
    )
    return table


def _s3(opts: Options, work: Path, folder: Path, files: int, size: int) -> Table:
    from bench.s3_scale_bench import _proxy_class, _rclone
    from concord.localservers import MotoServer, aws_environment

    rclone = shutil.which("rclone")
    table = Table(f"fanout to S3: a snapshot of {files} files of {size // 1024} KB synced to N S3 stores (buckets of one moto_server) at once")
    with MotoServer(work / "moto_server.log") as s3:
        endpoint = s3.wait()
        with aws_environment(endpoint), _proxy_class()(endpoint) as proxy:
            for n in QUICK_S3_COUNTS if opts.quick else S3_COUNTS:
                start = len(proxy.log)
                anon_mb, got = _sync_to(work, f"s3:{proxy.url}", n)
                requests = len(proxy.log) - start
                _common_rows(table, n, anon_mb, got)
                least = n * (files + 2)  # one PUT per chunk, the manifest and the ref, per target
                table.add(Row(f"N={n}: requests", requests, least, "", None, "one PUT per object"))
                line = f"N={n}: {got['seconds']:.2f} s, {requests} requests, {got['threads']} threads, {anon_mb:.0f} MB anonymous"
                if rclone:
                    import boto3

                    client = boto3.client("s3", endpoint_url=proxy.url)
                    rc_requests, rc_s = 0, 0.0
                    for _ in range(n):
                        bucket = f"fanout-rclone-{uuid.uuid4().hex[:8]}"
                        client.create_bucket(Bucket=bucket)
                        r, secs = _rclone(rclone, folder, bucket, proxy)
                        rc_requests, rc_s = rc_requests + r, rc_s + secs
                    table.add(Row(f"N={n}: requests beside rclone", requests, rc_requests, "", Target("ratio", "<=", 1.0), "rclone copy loop"))
                    table.add(Row(f"N={n}: time", got["seconds"], rc_s, "s", Target("ratio", "<=", 1.0), "rclone copy loop"))
                    line += f" (rclone copy loop {rc_s:.2f} s, {rc_requests} requests)"
                else:
                    table.add(Row(f"N={n}: time", got["seconds"], None, "s"))
                log(line)
    table.notes.append(
        "requests counted by a proxy in front of moto_server; Concord's include each target's lease, ref read, "
        "listing, manifest and ref; " + ("rclone (16 transfers) copies the folder once per bucket" if rclone else "rclone is not installed: no baseline")
    )
    return table
