"""Sync benchmark: a partial fine-tune (5% of the tensors changed) moved between two stores.

Setup (untimed): the base checkpoint is snapshotted into a source store under a ref and
replicated to a target store; the fine-tuned copy is then snapshotted into the source too.

Measured:
- bytes the delta sync sends, against the bytes of the tensors that changed;
- the delta sync's wall time (``replicate`` of the new ref, source → target), against
  ``rsync -a --no-whole-file`` bringing a folder holding the old checkpoint up to the new one;
- snapshot of the new checkpoint (the old one's chunks already stored) plus the delta sync,
  against the same rsync: rsync scans and transfers in one go, so this is the like-for-like row.

Every run starts from the same state: the stores are restored from hard-linked copies (store
writes never modify a file in place), and rsync's folder is a fresh ``cp -a`` of the old one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from bench.common import (
    GB,
    MB,
    Case,
    Options,
    Row,
    Table,
    Target,
    ensure_checkpoint,
    ensure_finetuned,
    fresh_dir,
    hardlink_copy,
    log,
    race,
    remove,
    settle,
    times_note,
    warm,
)

REF = "bench/model"
FRACTION = 0.05


def run(opts: Options) -> list[Table]:
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate
    from concord.stores import LocalDirStore

    base = ensure_checkpoint(opts.data_dir, opts.size_gb)
    ft = ensure_finetuned(base, opts.data_dir, fraction=FRACTION)
    work = fresh_dir(opts.work_dir / "sync")
    for c in (base, ft):
        warm(c.file)

    log("setup: snapshot the base, replicate it, snapshot the fine-tune")
    src0, tgt0, src1 = work / "src-base", work / "tgt-base", work / "src-ft"
    snapshot(base.folder, LocalDirStore(src0), ref=REF)
    replicate(LocalDirStore(src0), [LocalDirStore(tgt0)], ref=REF)
    hardlink_copy(src0, src1)
    new = snapshot(ft.folder, LocalDirStore(src1), ref=REF)
    if new.new_bytes != ft.changed_bytes:
        raise RuntimeError(
            f"the fine-tune's snapshot stored {new.new_bytes} new bytes, expected {ft.changed_bytes}: "
            "the generated fine-tune does not change exactly the tensors it lists"
        )
    manifest_bytes = len(LocalDirStore(src1).get_manifest_bytes(new.root))

    tgt, src = work / "tgt", work / "src"

    def reset_target() -> None:
        hardlink_copy(tgt0, tgt)
        settle()

    def reset_both() -> None:
        hardlink_copy(src0, src)
        reset_target()

    snap_times: list[float] = []

    def snap_and_sync():
        t0 = time.perf_counter()
        snapshot(ft.folder, LocalDirStore(src), ref=REF)
        snap_times.append(time.perf_counter() - t0)
        return replicate(LocalDirStore(src), [LocalDirStore(tgt)], ref=REF)[0]

    cases = [
        Case(
            "delta sync", lambda: replicate(LocalDirStore(src1), [LocalDirStore(tgt)], ref=REF)[0], before=reset_target
        ),
        Case("snapshot + delta sync", snap_and_sync, before=reset_both),
    ]
    rsync_dir = work / "rsync"
    rsync = _rsync_case(base.folder, ft.folder, rsync_dir)
    if rsync:
        cases.append(rsync)
    race(opts.runs, *cases, wait_idle=opts.wait_idle)
    res, res_both = cases[0].result, cases[1].result
    t_sync, t_both = cases[0].best, cases[1].best
    if res.root != new.root or res_both.root != new.root:
        raise RuntimeError("the delta sync moved the wrong snapshot")
    if res_both.bytes_sent != res.bytes_sent:
        raise RuntimeError("snapshot + sync sent a different number of bytes than the delta sync alone")
    rs = None
    if rsync:
        _check_same(ft.file, rsync_dir / base.folder.name / ft.file.name)
        m = re.search(r"Literal data:\s*([\d,.]+)", rsync.result)
        rs = {"seconds": rsync.best, "literal": int(re.sub(r"[,.]", "", m.group(1))) if m else 0}
    for p in (src, tgt, src0, src1, tgt0, rsync_dir):
        remove(p)

    table = Table(
        f"sync: {ft.size / GB:.2f} GB checkpoint, {len(ft.changed)} of {ft.n_tensors} tensors changed "
        f"({ft.changed_bytes / MB:.0f} MB), best of {opts.runs}"
    )
    table.add(
        Row(
            "bytes sent by delta sync",
            res.bytes_sent / MB,
            ft.changed_bytes / MB,
            "MB",
            Target("ratio", "<=", 1.02),
            "changed tensors",
        )
    )
    table.add(
        Row(
            "bytes sent by delta sync", res.bytes_sent / MB, rs and rs["literal"] / MB, "MB", None, "rsync literal data"
        )
    )
    table.add(
        Row("delta sync (replicate new ref)", t_sync, rs and rs["seconds"], "s", Target("ratio", "<=", 1.0), "rsync")
    )
    table.add(Row("snapshot new + delta sync", t_both, rs and rs["seconds"], "s", Target("ratio", "<=", 1.0), "rsync"))
    table.notes += [
        f"changed tensors: {_names(ft.changed)}",
        f"delta sync sent {res.chunks_sent} chunks ({res.chunks_present} already present) plus a "
        f"{manifest_bytes / 1024:.0f} KiB manifest, which bytes_sent does not count "
        f"({(res.bytes_sent + manifest_bytes) / ft.changed_bytes:.4f}× with it)",
        f"of the combined row, the snapshot of the fine-tune (old chunks stored) took {min(snap_times):.2f} s at best",
    ]
    table.notes.append(times_note(cases))
    if rs is None:
        table.notes.append("rsync is not installed, so its baseline is n/a: install it with `apt-get install -y rsync`")
    else:
        table.notes.append(
            "rsync: `rsync -a --no-whole-file --stats NEW/ OLD/` into a fresh `cp -a` of the old folder "
            f"(copy untimed); rsync rewrote the {ft.size / GB:.2f} GB file, "
            f"sending {rs['literal'] / MB:.0f} MB of literal data"
        )
    return [table]


def _rsync_case(old: Path, new: Path, work: Path) -> Case | None:
    """rsync bringing a fresh copy of ``old`` (made untimed before each run) up to ``new``;
    None when rsync is not installed."""
    exe = shutil.which("rsync")
    if exe is None:
        log("rsync not found; install it with `apt-get install -y rsync` to get the baseline")
        return None
    work.mkdir(parents=True, exist_ok=True)
    dst = work / old.name

    def fresh_copy() -> None:
        remove(dst)
        subprocess.run(["cp", "-a", str(old), str(dst)], check=True)
        settle()

    def sync() -> str:
        argv = [exe, "-a", "--no-whole-file", "--stats", f"{new}/", f"{dst}/"]
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout

    return Case("rsync --no-whole-file", sync, before=fresh_copy)


def _names(names: tuple[str, ...], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _check_same(a: Path, b: Path) -> None:
    import blake3

    def digest(p: Path) -> str:
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        h.update_mmap(str(p))
        return h.hexdigest()

    if digest(a) != digest(b):
        raise RuntimeError(f"rsync left {b} different from {a}")
