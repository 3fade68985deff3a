"""Snapshot benchmark: hashing speed, fresh-snapshot speed and memory on a LLaMA-shaped checkpoint.

a) Hashing throughput: a second snapshot into a store that already holds every chunk (so all it
   does is hash, ask the store, and build the manifest) against one multithreaded BLAKE3 pass
   over the same file, and against SHA-256 over the file in 8 MiB reads.
b) Fresh snapshot into an empty store on the same filesystem (every chunk written) against
   ``cp`` of the file to that filesystem.
c) Restore of the snapshot into a new folder (every chunk read from the store and its hash
   checked) against ``cp -a`` of the store's folder: the same bytes copied, unchecked.
d) Peak anonymous memory (RssAnon: heap, not the file's mapped pages) of a fresh snapshot run
   in a child process, polled from this process every ~5 ms, minus the child's RssAnon after its
   imports; on the checkpoint and on one half its size, to show it does not grow with size.

The source file is read once first so every timed run reads it from the page cache.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from bench.common import (
    GB,
    MB,
    POLL_SECONDS,
    Case,
    Checkpoint,
    MiB,
    Options,
    Row,
    Table,
    Target,
    ensure_checkpoint,
    fresh_dir,
    log,
    probe_memory,
    race,
    remove,
    self_anon_kb,
    settle,
    times_note,
    warm,
)

MEMORY_LIMIT_MB = 300
#: how much more peak memory a checkpoint twice as large may take and still count as flat
FLAT_SLACK_MB = 32


def run(opts: Options) -> list[Table]:
    from concord.snapshots.restore import restore
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    ckpt = ensure_checkpoint(opts.data_dir, opts.size_gb)
    half = ensure_checkpoint(opts.data_dir, opts.size_gb / 2)
    work = fresh_dir(opts.work_dir / "snapshot")
    secs = warm(ckpt.file)
    log(f"page cache warmed: {ckpt.size / GB:.2f} GB read in {secs:.2f} s")
    s = ckpt.shape
    table = Table(
        f"snapshot: {ckpt.file.name}, {ckpt.size / GB:.2f} GB, {ckpt.n_tensors} bf16 tensors "
        f"(vocab {s.vocab}, d {s.d}, ffn {s.f}, {s.layers} layers), best of {opts.runs}"
    )

    # a) hashing with every chunk already stored --------------------------------------------
    store_dir = work / "store"
    first = snapshot(ckpt.file, LocalDirStore(store_dir))
    settle()
    again, b3, sha = race(
        opts.runs,
        Case("snapshot, all chunks stored", lambda: snapshot(ckpt.file, LocalDirStore(store_dir))),
        Case("blake3 AUTO update_mmap", lambda: _blake3_file(ckpt.file)),
        Case("sha256 in 8 MiB reads", lambda: _sha256_file(ckpt.file)),
        wait_idle=opts.wait_idle,
    )
    if again.result.new_chunks or again.result.root != first.root:
        raise RuntimeError("the second snapshot wrote chunks or found another root; the store was not the first one's")
    remove(store_dir)

    # b) fresh snapshot (every chunk written) vs cp ------------------------------------------
    copy = work / "cp" / ckpt.file.name
    copy.parent.mkdir()

    def drop(path: Path) -> None:
        remove(path)
        settle()

    def cp_durable() -> None:  # as durable as a snapshot: the copy's bytes on disk before it returns
        subprocess.run(["cp", str(ckpt.file), str(copy)], check=True)
        subprocess.run(["sync", str(copy)], check=True)

    fresh, cp, cp_sync = race(
        opts.runs,
        Case("fresh snapshot", lambda: snapshot(ckpt.file, LocalDirStore(store_dir)), after=lambda: drop(store_dir)),
        Case("cp", lambda: subprocess.run(["cp", str(ckpt.file), str(copy)], check=True), after=lambda: drop(copy)),
        Case("cp, then sync FILE", cp_durable, after=lambda: drop(copy)),
        wait_idle=opts.wait_idle,
    )
    written = fresh.result
    if written.new_bytes < written.bytes:
        raise RuntimeError(
            f"a fresh snapshot wrote {written.new_bytes} of {written.bytes} bytes; the store was not empty"
        )
    t_again, t_b3, t_sha, t_fresh, t_cp = again.best, b3.best, sha.best, fresh.best, cp.best

    # c) restore of the snapshot vs a copy of the store ---------------------------------------
    snapshot(ckpt.file, LocalDirStore(store_dir))  # untimed: the store the restores read
    settle()
    out = work / "restored"
    store_copy = work / "store-copy"
    restored, copied = race(
        opts.runs,
        Case("restore", lambda: restore(LocalDirStore(store_dir), written.manifest, out), after=lambda: drop(out)),
        Case(
            "cp -a of the store",
            lambda: subprocess.run(["cp", "-a", str(store_dir), str(store_copy)], check=True),
            after=lambda: drop(store_copy),
        ),
        wait_idle=opts.wait_idle,
    )
    remove(store_dir)

    gbps = ckpt.size / GB
    table.add(
        Row(
            "hash throughput, all chunks stored (2nd snapshot)",
            gbps / t_again,
            gbps / t_b3,
            "GB/s",
            Target("ratio", ">=", 0.9),
            "blake3 AUTO, 1 pass",
        )
    )
    table.add(
        Row(
            "hash throughput, all chunks stored (2nd snapshot)",
            gbps / t_again,
            gbps / t_sha,
            "GB/s",
            Target("ratio", ">=", 3.0),
            "hashlib sha256",
        )
    )
    table.add(Row("fresh snapshot, every chunk written", t_fresh, t_cp, "s", Target("ratio", "<=", 1.5), "cp"))
    table.add(
        Row(
            "fresh snapshot, every chunk written",
            t_fresh,
            cp_sync.best,
            "s",
            Target("ratio", "<=", 1.5),
            "cp, then sync FILE",
        )
    )
    table.add(
        Row(
            "restore into a new folder, every chunk verified",
            restored.best,
            copied.best,
            "s",
            None,
            "cp -a of the store",
        )
    )

    # d) peak anonymous memory ------------------------------------------------------------
    peaks = {}
    for c in (ckpt, half):
        warm(c.file)
        settle()
        peaks[c.size] = peak = _peak_anon_mb(c, work / "mem-store")
        log(f"peak RssAnon above baseline, {c.size / GB:.2f} GB: {peak['peak_mb']:.1f} MB")
    full, small = peaks[ckpt.size], peaks[half.size]
    for c, p in ((ckpt, full), (half, small)):
        table.add(
            Row(
                f"peak anon memory, fresh snapshot of {c.size / GB:.2f} GB",
                p["peak_mb"],
                None,
                "MB",
                Target("value", "<", MEMORY_LIMIT_MB),
            )
        )
    table.add(
        Row(
            f"peak growth, {half.size / GB:.2f} → {ckpt.size / GB:.2f} GB",
            full["peak_mb"] - small["peak_mb"],
            None,
            "MB",
            Target("value", "<", FLAT_SLACK_MB),
        )
    )
    table.notes += [
        f"throughput = file bytes / wall time; concord hashes {written.chunks} chunks of "
        f"{written.manifest.chunk_size // MiB} MiB on its default thread pool; the file is in the page cache",
        f"fresh snapshot wrote {written.new_chunks} chunks ({written.new_bytes / GB:.2f} GB) "
        f"at {gbps / t_fresh:.2f} GB/s; cp {gbps / t_cp:.2f} GB/s. A snapshot's chunks, manifest and their "
        "folders are flushed to disk (fsync) before its ref moves, plain cp flushes nothing, `sync FILE` "
        "flushes the copy; the copy is deleted and dirty pages flushed after each run, outside the timing",
        f"hashing: {times_note((again, b3, sha))}",
        f"writing: {times_note((fresh, cp, cp_sync))}",
        "restore: the snapshot's file written into a new folder from the store (every chunk read and "
        "its hash checked), against `cp -a` of the store's folder (the same bytes copied, unchecked); "
        f"{times_note((restored, copied))}",
        f"memory: RssAnon polled every {POLL_SECONDS * 1000:.0f} ms ({full['samples']} samples on the full run); "
        f"the child's baseline after imports was {full['baseline_mb']:.1f} MB, "
        f"its peak RssFile (mapped checkpoint pages, not counted) {full['peak_file_mb']:.0f} MB",
    ]
    return [table]


# --------------------------------------------------------------------------- baselines


def _blake3_file(path: Path) -> str:
    import blake3

    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(str(path))
    return h.hexdigest()


def _sha256_file(path: Path, block: int = 8 * MiB) -> str:
    h = hashlib.sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


# --------------------------------------------------------------------------- memory probe


def _peak_anon_mb(ckpt: Checkpoint, store_dir: Path) -> dict:
    """Run a fresh snapshot of ``ckpt`` in a child process and poll its RssAnon from here."""
    remove(store_dir)
    code = "import sys; from bench.snapshot_bench import memory_child; memory_child(sys.argv[1], sys.argv[2])"
    try:
        peak, baseline_kb, result, samples = probe_memory(
            code, [str(ckpt.file), str(store_dir)], ("RssAnon", "RssFile")
        )
    finally:
        remove(store_dir)
    if result["new_bytes"] < result["bytes"]:
        raise RuntimeError("the memory probe's snapshot did not write every chunk")
    return {
        "peak_mb": (peak["RssAnon"] - baseline_kb) * 1024 / MB,
        "baseline_mb": baseline_kb * 1024 / MB,
        "peak_file_mb": peak["RssFile"] * 1024 / MB,
        "samples": samples,
    }


def memory_child(file: str, store_dir: str) -> None:
    """Entry point of the child process of the memory probe."""
    import gc

    from concord.hashing import chunk_id
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    chunk_id(b"")  # load BLAKE3 before the baseline is taken
    gc.collect()
    baseline = self_anon_kb()
    print(f"READY {baseline}", flush=True)
    sys.stdin.readline()
    r = snapshot(file, LocalDirStore(store_dir))
    print(json.dumps({"bytes": r.bytes, "new_bytes": r.new_bytes}), flush=True)
