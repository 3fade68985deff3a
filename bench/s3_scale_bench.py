"""S3 at scale: how many requests a snapshot and a sync of many small files send, and whether
packing small chunks into larger objects would pay.

Setup: a folder of ``files`` files of 50 KB (random bytes: one chunk each), a ``moto_server`` on
127.0.0.1 (S3 in memory) and, in front of it, a counting HTTP proxy of the tests' own
(``tests/faultproxy.py``, no faults set): every request any client sends is counted there.

Measured:
- a fresh snapshot into an empty S3 store: requests per chunk, against the least any tool can
  send (one PUT per object: each chunk, the manifest, the ref) and ``rclone copy`` of the folder
  into an empty bucket of the same server when rclone is installed (configured by environment
  variables only, 16 transfers; its requests through the same proxy and its time, its process's
  start included, in rounds interleaved with the snapshot's, best of ``--runs``);
- the same snapshot again, nothing changed: requests per 100 chunks (target: at most one);
- a sync of the snapshot from a local store into an empty S3 store: requests per chunk;
- packing: N PUTs of 50 KB objects against N/64 PUTs of 3.2 MB objects (the same bytes) straight
  through boto3, to see what a request costs beside its bytes on this endpoint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.common import Options, Row, Table, Target, fresh_dir, log, remove

FILE_BYTES = 50 * 1000
FILES = 2000
QUICK_FILES = 200
PACK = 64  # chunks per packed object in the packing measurement
REPO = Path(__file__).resolve().parent.parent


def _proxy_class():
    sys.path.insert(0, str(REPO / "tests"))
    from faultproxy import FaultProxy

    return FaultProxy


def _folder(root: Path, n: int) -> Path:
    src = root / f"files-{n}"
    if not src.is_dir() or len(list(src.iterdir())) != n:
        remove(src)
        src.mkdir(parents=True)
        for i in range(n):
            (src / f"f{i:05d}.bin").write_bytes(os.urandom(FILE_BYTES))
    return src


def run(opts: Options) -> list[Table]:
    from concord.localservers import MotoServer, aws_environment

    n = QUICK_FILES if opts.quick else FILES
    work = fresh_dir(opts.work_dir / "s3-scale")
    src = _folder(opts.data_dir, n)
    with MotoServer(work / "moto_server.log") as s3:
        endpoint = s3.wait()
        with aws_environment(endpoint), _proxy_class()(endpoint) as proxy:
            tables = _run(opts, n, src, work, proxy)
    remove(work)
    return tables


def _measure(proxy, fn):
    """(result, requests sent, seconds)."""
    start, t0 = len(proxy.log), time.perf_counter()
    result = fn()
    return result, len(proxy.log) - start, time.perf_counter() - t0


def _run(opts: Options, n: int, src: Path, work: Path, proxy) -> list[Table]:
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate
    from concord.stores.local import LocalDirStore
    from concord.stores.s3 import S3ObjectStore

    def store() -> S3ObjectStore:
        s = S3ObjectStore(f"concord-bench-{uuid.uuid4().hex[:10]}", "store", endpoint_url=proxy.url, create_bucket=True)
        s.list_refs()
        return s

    rclone = shutil.which("rclone")
    fresh_s = rclone_s = float("inf")
    for i in range(opts.runs):  # interleaved with its baseline, best of the runs
        log(f"fresh snapshot of {n} files of 50 KB into S3 (round {i + 1} of {opts.runs})")
        target = store()
        first, fresh_requests, secs = _measure(proxy, lambda target=target: snapshot(src, target, ref="bench/files"))
        fresh_s = min(fresh_s, secs)
        if rclone:
            log("rclone copy of the same folder into an empty bucket")
            rclone_requests, secs = _rclone(rclone, src, store().bucket, proxy)
            rclone_s = min(rclone_s, secs)
    chunks = first.chunks
    least = chunks + 2  # one PUT per chunk, the manifest, the ref
    log("the same snapshot again, nothing changed")
    _, again_requests, again_s = _measure(proxy, lambda: snapshot(src, target, ref="bench/files"))
    log("sync from a local store into an empty S3 store")
    local = LocalDirStore(work / "local")
    snapshot(src, local, ref="bench/files")
    _, sync_requests, sync_s = _measure(proxy, lambda: replicate(local, [store()], ref="bench/files"))

    table = Table(f"s3-scale: {n} files of 50 KB into moto_server, requests counted by a proxy")
    if rclone:
        table.add(Row("fresh snapshot: requests", fresh_requests, rclone_requests, "", Target("ratio", "<=", 1.0), "rclone copy"))
        table.add(Row("fresh snapshot: time", fresh_s, rclone_s, "s", Target("ratio", "<=", 1.0), "rclone copy"))
    else:
        table.add(Row("fresh snapshot: requests", fresh_requests, least, "", Target("ratio", "<=", 1.05), "one PUT per object"))
        table.add(Row("fresh snapshot: time", fresh_s, None, "s"))
        table.notes.append("rclone is not installed: the baseline is the least any tool sends, one PUT per object (chunks, manifest, ref)")
    table.add(Row("fresh snapshot: requests per chunk", fresh_requests / chunks, 1.0, "", Target("value", "<=", 1.05), "one PUT"))
    table.add(Row("unchanged re-snapshot: requests per 100 chunks", 100 * again_requests / chunks, None, "", Target("value", "<=", 1.0)))
    table.add(Row("unchanged re-snapshot: time", again_s, None, "s"))
    table.add(Row("sync local → S3: requests per chunk", sync_requests / chunks, 1.0, "", Target("value", "<=", 1.05), "one PUT"))
    table.add(Row("sync local → S3: time", sync_s, None, "s"))
    table.notes.append(f"{chunks} chunks; fresh snapshot {fresh_requests} requests, unchanged {again_requests}, sync {sync_requests}")
    return [table, _packing(opts, n, proxy)]


def _rclone(rclone: str, src: Path, bucket: str, proxy) -> tuple[int, float]:
    """(requests, seconds) of ``rclone copy`` of ``src`` into ``bucket`` through the counting proxy,
    configured by environment variables only (remote ``moto``), 16 transfers as Concord's 16
    connections."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}  # plain HTTP; rclone refuses a CA bundle there
    env.update(
        RCLONE_CONFIG_MOTO_TYPE="s3", RCLONE_CONFIG_MOTO_PROVIDER="Other", RCLONE_CONFIG_MOTO_ENDPOINT=proxy.url,
        RCLONE_CONFIG_MOTO_ACCESS_KEY_ID=os.environ.get("AWS_ACCESS_KEY_ID", "x"),
        RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY=os.environ.get("AWS_SECRET_ACCESS_KEY", "x"), RCLONE_CONFIG="/dev/null",
    )
    cmd = [rclone, "copy", str(src), f"moto:{bucket}/files", "--transfers", "16"]
    done, requests, seconds = _measure(proxy, lambda: subprocess.run(cmd, env=env, capture_output=True, text=True))
    if done.returncode != 0:
        raise RuntimeError(f"rclone copy exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
    return requests, seconds


def _packing(opts: Options, n: int, proxy) -> Table:
    """What a request costs beside its bytes: the same bytes as N small objects or N/PACK large ones."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    client = boto3.client("s3", endpoint_url=proxy.url)
    bucket = f"concord-pack-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    small = os.urandom(FILE_BYTES)
    big = small * PACK

    def put_all(body: bytes, count: int, tag: str) -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"{tag}/{i}", Body=body), range(count)))
        return time.perf_counter() - t0

    count = max(PACK, n - n % PACK)
    log(f"packing: {count} PUTs of 50 KB against {count // PACK} of {len(big) / 1e6:.1f} MB")
    small_s = put_all(small, count, "small")
    big_s = put_all(big, count // PACK, "big")
    table = Table(f"s3-scale packing: {count} objects of 50 KB against {count // PACK} packs of {PACK} (same bytes, 16 threads)")
    table.add(Row("PUT time, small objects vs packs", small_s, big_s, "s", None, "packs"))
    table.add(Row("per request, small objects", 1000 * small_s / count, None, "ms"))
    table.add(Row("throughput, packs", len(big) * (count // PACK) / big_s / 1e6, None, "MB/s"))
    # the object size at which a request's own cost equals the time its bytes take
    table.add(Row("break-even object size", (small_s / count) * len(big) * (count // PACK) / big_s / 1e6, None, "MB"))
    table.notes.append(
        "a pack would also need an index (what lies where) read before any chunk, ranged GETs and a repack when "
        "garbage is collected; see docs/architecture.md for the decision"
    )
    return table
