from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, files_equal, fine_tune, make_checkpoint

from concord.errors import (
    HistoryError,
    IntegrityError,
    RefConflictError,
    ReplicationError,
    RestoreTargetError,
    UnsafePathError,
)
from concord.snapshots.manifest import Manifest, make_file, make_part
from concord.snapshots.refs import load_manifest, resolve_root, rollback
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore


def test_replicate_to_many_then_only_deltas(ckpt, tmp_path, stores):
    src, t1, t2 = stores
    base = snapshot(ckpt, src, chunk_size=SMALL_CHUNK, ref="models/toy")
    first = replicate(src, [t1, t2], ref="models/toy")
    unique = len(base.manifest.chunk_lengths())
    assert [(r.chunks_sent, r.chunks_present, r.root) for r in first] == [(unique, 0, base.root)] * 2
    assert all(s.read_ref("models/toy").root == base.root for s in (t1, t2))
    again = replicate(src, [t1, t2], ref="models/toy")
    assert [(r.chunks_sent, r.bytes_sent) for r in again] == [(0, 0), (0, 0)]

    names = ["layers.0.attn.q.weight"]
    new = snapshot(fine_tune(ckpt, tmp_path / "ft", names), src, chunk_size=SMALL_CHUNK, ref="models/toy")
    delta = replicate(src, [t1], ref="models/toy")[0]
    changed = next(p for p in new.manifest.files[1].parts if p.name == names[0])
    assert delta.bytes_sent == changed.length
    assert delta.previous == base.root and delta.ref_version == 2


def _tree(path):
    return {p.relative_to(path): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(path.rglob("*")) if p.is_file()}


def test_restore_is_byte_identical_and_a_rerun_into_the_same_root_is_unchanged(ckpt, tmp_path, stores):
    r = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK, ref="toy")
    replicate(stores[0], [stores[1]], ref="toy")
    out = tmp_path / "restored"
    res = restore(stores[1], load_manifest(stores[1], r.root), out)
    assert files_equal(ckpt, out) and res.bytes == r.bytes and res.files == r.files and not res.unchanged
    before = _tree(out)
    again = restore(stores[1], load_manifest(stores[1], r.root), out)
    assert again.unchanged and again.root == r.root and again.files == r.files
    assert _tree(out) == before  # nothing rewritten
    assert not [p for p in tmp_path.iterdir() if "concord-tmp" in p.name]


def test_restore_refuses_a_folder_holding_another_root_and_touches_nothing(ckpt, tmp_path, stores):
    r = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK, ref="toy")
    out = tmp_path / "restored"
    restore(stores[0], r.manifest, out)
    (out / "extra.txt").write_bytes(b"a user's file")
    before = _tree(out)
    with pytest.raises(RestoreTargetError, match="new or empty folder"):
        restore(stores[0], r.manifest, out)
    assert _tree(out) == before


def test_restore_refuses_a_folder_with_one_corrupted_file(ckpt, tmp_path, stores):
    r = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK, ref="toy")
    out = tmp_path / "restored"
    restore(stores[0], r.manifest, out)
    victim = next(p for p in sorted(out.rglob("*")) if p.is_file() and p.stat().st_size > 0)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    victim.write_bytes(bytes(data))
    before = _tree(out)
    with pytest.raises(RestoreTargetError):
        restore(stores[0], r.manifest, out)
    assert _tree(out) == before


def test_restore_refuses_escaping_paths_before_writing(tmp_path, stores):
    store = stores[0]
    data = b"x" * 10
    from concord.hashing import chunk_id

    store.put_chunk(chunk_id(data), data)
    evil = Manifest.build(1 << 20, [make_file("../../outside.txt", 10, "blob", [make_part("data", "", 0, 10, [chunk_id(data)])])])
    with pytest.raises(UnsafePathError):
        restore(store, evil, tmp_path / "out")
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path.parent / "outside.txt").exists()
    assert not (tmp_path / "out").exists()


def test_restore_stops_on_corrupt_chunk_and_leaves_nothing(ckpt, tmp_path, stores):
    r = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    cid = next(iter(r.manifest.chunk_lengths()))
    stores[0]._put_object(f"chunks/{cid[:2]}/{cid}", b"rotten", overwrite=True)
    with pytest.raises(IntegrityError):
        restore(stores[0], r.manifest, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if "concord-tmp" in p.name]


def test_verify_detects_and_repairs(ckpt, stores):
    src, tgt, _ = stores
    r = snapshot(ckpt, src, chunk_size=SMALL_CHUNK, ref="toy")
    replicate(src, [tgt], ref="toy")
    ids = sorted(r.manifest.chunk_lengths())
    tgt._put_object(f"chunks/{ids[0][:2]}/{ids[0]}", b"bit rot", overwrite=True)
    tgt.delete_chunk(ids[1])
    bad = verify(tgt, ref="toy")
    assert (bad.corrupt, bad.missing, bad.ok) == ((ids[0],), (ids[1],), False)
    assert bad.chunks_checked == len(ids)
    fixed = verify(tgt, ref="toy", repair_from=src)
    assert set(fixed.repaired) == {ids[0], ids[1]} and fixed.ok
    assert verify(tgt).ok  # the whole store, every manifest and chunk
    with pytest.raises(IntegrityError):
        src.put_chunk(ids[0], b"not these bytes")


def test_verify_whole_store_flags_damaged_manifest(ckpt, stores):
    src, tgt, _ = stores
    r = snapshot(ckpt, src, chunk_size=SMALL_CHUNK)
    replicate(src, [tgt], root=r.root)
    tgt.put_manifest(r.root, b"{not json", overwrite=True)
    res = verify(tgt)
    assert res.bad_manifests == (r.root,) and not res.ok
    assert verify(tgt, repair_from=src).ok
    assert load_manifest(tgt, r.root).root == r.root


def test_rollback_and_history(ckpt, tmp_path, stores):
    store = stores[0]
    a = snapshot(ckpt, store, chunk_size=SMALL_CHUNK, ref="toy")
    b = snapshot(fine_tune(ckpt, tmp_path / "ft", ["layers.0.norm.weight"]), store, chunk_size=SMALL_CHUNK, ref="toy")
    assert resolve_root(store, "toy") == b.root and resolve_root(store, "toy~1") == a.root
    back = rollback(store, "toy")
    assert (back.root, back.previous, back.version) == (a.root, b.root, 3)
    fwd = rollback(store, "toy", to=b.root[:10])
    assert fwd.root == b.root
    with pytest.raises(HistoryError):
        rollback(store, "toy", to="deadbeefdeadbeef")
    with pytest.raises(HistoryError):
        resolve_root(store, "toy~9")
    assert [e.root for e in store.read_ref("toy").history] == [a.root, b.root, a.root, b.root]


class _BarrierStore(LocalDirStore):
    """A real local store whose ref updates wait until both racers have planned."""

    barrier: threading.Barrier

    def cas_ref(self, *a, **kw):
        self.barrier.wait(timeout=30)
        return super().cas_ref(*a, **kw)


def test_two_syncs_racing_on_one_ref(ckpt, tmp_path):
    src_a, src_b = LocalDirStore(tmp_path / "a"), LocalDirStore(tmp_path / "b")
    a = snapshot(ckpt, src_a, chunk_size=SMALL_CHUNK, ref="shared")
    b = snapshot(fine_tune(ckpt, tmp_path / "ft", ["embed.weight"]), src_b, chunk_size=SMALL_CHUNK, ref="shared")
    target = _BarrierStore(tmp_path / "t")
    target.barrier = threading.Barrier(2)  # both have read the ref before either swaps it
    outcomes = {}

    def run(src):
        try:
            outcomes[src.uri] = replicate(src, [target], ref="shared")[0].root
        except RefConflictError as exc:
            outcomes[src.uri] = exc

    threads = [threading.Thread(target=run, args=(s,)) for s in (src_a, src_b)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    errors = [v for v in outcomes.values() if isinstance(v, RefConflictError)]
    winners = [v for v in outcomes.values() if isinstance(v, str)]
    assert len(errors) == 1 and len(winners) == 1, outcomes
    ref = target.read_ref("shared")
    assert ref.version == 1 and ref.root == winners[0] and ref.root in (a.root, b.root)
    assert verify(target, root=a.root).ok and verify(target, root=b.root).ok


def test_conflicting_writer_is_detected_not_overwritten(ckpt, tmp_path, stores):
    src, tgt, _ = stores
    a = snapshot(ckpt, src, chunk_size=SMALL_CHUNK, ref="toy")
    replicate(src, [tgt], ref="toy")
    b = snapshot(fine_tune(ckpt, tmp_path / "ft", ["embed.weight"]), src, chunk_size=SMALL_CHUNK, ref="toy")
    # someone else moves the target's ref between our plan and our swap
    tgt.cas_ref("toy", a.root, b.root, "other writer")
    with pytest.raises(RefConflictError, match="moved concurrently"):
        tgt.cas_ref("toy", a.root, "c" * 64)
    assert tgt.read_ref("toy").root == b.root


class _FlakyStore(LocalDirStore):
    """A real local store that dies after ``budget`` chunk writes, like a killed process."""

    budget = 3

    def put_chunk(self, *a, **kw):
        if self.budget <= 0:
            raise ConnectionError("target went away")
        self.budget -= 1
        return super().put_chunk(*a, **kw)


def test_interrupted_sync_converges_and_sends_only_the_rest(ckpt, tmp_path, stores):
    src = stores[0]
    r = snapshot(ckpt, src, chunk_size=SMALL_CHUNK, ref="toy")
    flaky = _FlakyStore(tmp_path / "t")
    with pytest.raises(ConnectionError):
        replicate(src, [flaky], ref="toy")
    assert flaky.read_ref("toy") is None and not flaky.has_manifest(r.root)
    held = len(list(flaky.iter_chunks()))
    assert 0 < held < len(r.manifest.chunk_lengths())
    healthy = LocalDirStore(tmp_path / "t")
    res = replicate(src, [healthy, stores[1]], ref="toy")
    assert res[0].chunks_sent == len(r.manifest.chunk_lengths()) - held and res[0].chunks_present == held
    assert verify(healthy, ref="toy").ok


def test_one_failing_target_does_not_stop_the_others(ckpt, tmp_path, stores):
    src = stores[0]
    snapshot(ckpt, src, chunk_size=SMALL_CHUNK, ref="toy")
    flaky = _FlakyStore(tmp_path / "bad")
    flaky.budget = 0
    with pytest.raises(ReplicationError) as info:
        replicate(src, [stores[1], flaky], ref="toy")
    assert [r.store for r in info.value.results] == [stores[1].uri]
    assert flaky.uri in info.value.failures
    assert stores[1].read_ref("toy") is not None


def test_killed_cli_sync_leaves_target_consistent_and_rerun_converges(tmp_path):
    """A real SIGKILL in the middle of `concord sync`: no half snapshot is ever visible."""
    ck = make_checkpoint(tmp_path / "big", layers=6, dim=768)
    src, dst = tmp_path / "src", tmp_path / "dst"
    env = {**os.environ, "CONCORD_NO_PROGRESS": "1"}
    cli = [sys.executable, "-m", "concord.cli"]
    subprocess.run(cli + ["snapshot", str(ck), "--store", str(src), "--ref", "big", "--chunk-size", "64K"], check=True, env=env)
    total = len(list(LocalDirStore(src).iter_chunks()))
    proc = subprocess.Popen(cli + ["sync", str(src), str(dst), "--ref", "big"], env=env)
    deadline = time.time() + 30
    while time.time() < deadline:
        d = Path(dst) / "chunks"
        if d.exists() and sum(1 for _ in d.rglob("*")) > 5:
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    target = LocalDirStore(dst)
    ref = target.read_ref("big")
    if ref is not None:  # it finished before the kill: then it must be whole
        assert verify(target, ref="big").ok
    held = len(list(target.iter_chunks()))
    out = subprocess.run(cli + ["sync", str(src), str(dst), "--ref", "big", "--json"], check=True, env=env, capture_output=True, text=True)
    import json

    res = json.loads(out.stdout)["targets"][0]
    assert res["chunks_sent"] == total - held and res["chunks_present"] == held
    assert verify(target, ref="big").ok
    assert all(len(p.name) == 64 for p in (Path(dst) / "chunks").rglob("*") if p.is_file() and not p.name.startswith("."))
