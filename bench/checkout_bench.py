"""Checkout benchmark: a node serving a checkpoint moves to a version with 5% of its tensors changed.

Setup (untimed): the base checkpoint and its fine-tune are snapshotted into one store; the base is
checked out beside a link (``node/current``), as a serving node would hold it.

Measured:
- the second checkout (the fine-tune: unchanged ranges copied from the served version with
  ``copy_file_range``, changed chunks fetched, every byte verified, files flushed, the link
  flipped), against ``concord restore`` of the fine-tune into a new folder (goal: 3× faster), and
  against ``rsync -a --no-whole-file`` updating a copy of the old folder (goal: faster);
- the same checkout without flushing the files (``--no-fsync``), since neither baseline flushes;
- bytes the checkout fetched, against the bytes of the tensors that changed (goal ≤ 1.02×);
- a rollback (the link flipped back to the version before), against 0.1 s.

Every run starts from the same state: the fine-tune's version folder is removed and the link
flipped back to the base (untimed); the restore's folder is removed; rsync's folder is a fresh
``cp -a`` of the old one.
"""

from __future__ import annotations

import os
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
    log,
    race,
    remove,
    settle,
    times_note,
    warm,
)
from bench.sync_bench import FRACTION, _check_same, _rsync_case

REF = "bench/model"


def run(opts: Options) -> list[Table]:
    from concord.serving.checkout import checkout
    from concord.serving.versions import Layout, remove_tree, rollback
    from concord.snapshots.restore import restore
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    base = ensure_checkpoint(opts.data_dir, opts.size_gb)
    ft = ensure_finetuned(base, opts.data_dir, fraction=FRACTION)
    work = fresh_dir(opts.work_dir / "checkout")
    for c in (base, ft):
        warm(c.file)

    log("setup: snapshot the base and the fine-tune, check the base out beside node/current")
    store = LocalDirStore(work / "store")
    old = snapshot(base.folder, store, ref=REF).manifest
    new = snapshot(ft.folder, store, ref=REF).manifest
    dest = work / "node" / "current"
    layout = Layout.of(dest)
    checkout(store, old, dest)
    restored = work / "restored"

    def back_to_base() -> None:
        layout.flip(old.root)
        remove_tree(layout.version_dir(new.root))
        remove(Path(layout.partial_dir(new.root)))
        settle()

    def fresh_restore_dir() -> None:
        remove(restored)
        settle()

    cases = [
        Case("checkout", lambda: checkout(store, new, dest), before=back_to_base),
        Case("checkout --no-fsync", lambda: checkout(store, new, dest, fsync=False), before=back_to_base),
        Case("restore into a new folder", lambda: restore(store, new, restored), before=fresh_restore_dir),
    ]
    rsync_dir = work / "rsync"
    rsync = _rsync_case(base.folder, ft.folder, rsync_dir)
    if rsync:
        cases.append(rsync)
    race(opts.runs, *cases, wait_idle=opts.wait_idle)
    res = cases[0].result
    if res.root != new.root or not res.switched or os.readlink(dest) != layout.target(new.root):
        raise RuntimeError("the checkout did not leave the link on the fine-tune")
    _check_same(ft.file, dest / ft.file.name)
    _check_same(ft.file, restored / ft.file.name)
    if rsync:
        _check_same(ft.file, rsync_dir / base.folder.name / ft.file.name)

    # rollback: the link flipped back and forth, each flip timed
    flips = []
    for _ in range(max(5, opts.runs)):
        t0 = time.perf_counter()
        rollback(dest)
        flips.append(time.perf_counter() - t0)
    if len(flips) % 2:
        rollback(dest)
    for p in (work, rsync_dir):
        remove(p)

    t_co, t_nosync, t_restore = cases[0].best, cases[1].best, cases[2].best
    t_rsync = rsync.best if rsync else None
    table = Table(
        f"checkout: {ft.size / GB:.2f} GB checkpoint, then {len(ft.changed)} of {ft.n_tensors} tensors changed "
        f"({ft.changed_bytes / MB:.0f} MB), best of {opts.runs}"
    )
    table.add(Row("second checkout", t_co, t_restore, "s", Target("ratio", "<=", 1 / 3), "restore into a new folder"))
    table.add(Row("second checkout", t_co, t_rsync, "s", Target("ratio", "<", 1.0), "rsync --no-whole-file"))
    table.add(Row("second checkout --no-fsync", t_nosync, t_restore, "s", Target("ratio", "<=", 1 / 3), "restore into a new folder"))
    table.add(Row("second checkout --no-fsync", t_nosync, t_rsync, "s", Target("ratio", "<", 1.0), "rsync --no-whole-file"))
    table.add(Row("bytes fetched", res.bytes_fetched / MB, ft.changed_bytes / MB, "MB", Target("ratio", "<=", 1.02), "changed tensors"))
    table.add(Row("rollback (flip back)", min(flips), None, "s", Target("value", "<", 0.1)))
    table.notes += [
        f"the checkout fetched {res.bytes_fetched / MB:.1f} MB and copied {res.bytes_reused / MB:.0f} MB from the "
        "served version with copy_file_range (a reflink where the filesystem shares blocks, a copy in the "
        f"kernel elsewhere: {_fs(dest.parent)}); the served version's files were unchanged since they were "
        "verified, so the copies were not read back (`--rehash` would)",
        f"rollback: {len(flips)} flips, slowest {max(flips) * 1000:.1f} ms",
        times_note(cases),
    ]
    if rsync is None:
        table.notes.append("rsync is not installed, so its baseline is n/a: install it with `apt-get install -y rsync`")
    else:
        table.notes.append("rsync: `rsync -a --no-whole-file --stats NEW/ OLD/` into a fresh `cp -a` of the old folder (copy untimed)")
    return [table]


def _fs(path) -> str:
    """The filesystem type holding ``path`` (from /proc/mounts), for the notes."""
    try:
        best, kind = "", "unknown"
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and real.startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
        return kind
    except OSError:
        return "unknown"

