"""A sync to many targets reads each missing chunk from the source once and writes it to every
target that lacks it, on one bounded pool with one lease per target (renewed by one heartbeat
thread), so threads stay flat as targets grow; a target that fails does not stop the others."""

from __future__ import annotations

import threading

import pytest
from counting import CountingStore, ThreadPeak
from toy_checkpoints import SMALL_CHUNK, fine_tune

from concord.errors import ReplicationError
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore
from concord.stores.leases import LEASE_PREFIX

TARGETS = 16


class BrokenStore(LocalDirStore):
    """A folder store whose disk refuses every chunk written to it."""

    def _put_object(self, key: str, data, *, overwrite: bool) -> bool:
        if key.startswith("chunks/"):
            raise OSError(28, "No space left on device", key)
        return super()._put_object(key, data, overwrite=overwrite)

    def put_chunk_from_file(self, cid, fd, offset, length, data, *, dtype=None):
        return self.put_chunk_sized(cid, data, verify=False, dtype=dtype)


@pytest.fixture
def source(ckpt, tmp_path):
    src = CountingStore(tmp_path / "src")
    result = snapshot(ckpt, src, chunk_size=SMALL_CHUNK, ref="models/toy")
    src.reads.clear()
    return src, result


def test_a_sync_to_many_targets_reads_each_chunk_once_on_few_threads(source, tmp_path):
    src, snap = source
    targets = [LocalDirStore(tmp_path / f"t{i}") for i in range(TARGETS)]
    before = threading.active_count()
    with ThreadPeak() as threads:
        results = replicate(src, targets, ref="models/toy")
    chunks = len(snap.manifest.chunk_lengths())
    assert [r.chunks_sent for r in results] == [chunks] * TARGETS
    assert len(src.reads) == chunks and set(src.reads.values()) == {1}  # each chunk read once
    assert threads.peak - before <= 40, threads.peak  # not a pool and a heartbeat per target
    for t in targets:
        assert t.read_ref("models/toy").root == snap.root
        assert verify(t, ref="models/toy").ok
        assert t.list_documents(LEASE_PREFIX) == []  # every lease given back


def test_chunks_some_targets_hold_are_read_once_for_those_that_lack_them(source, ckpt, tmp_path):
    src, first = source
    targets = [LocalDirStore(tmp_path / f"t{i}") for i in range(4)]
    replicate(src, targets[:2], ref="models/toy")
    new = snapshot(fine_tune(ckpt, tmp_path / "ft", ["layers.0.attn.q.weight"]), src, chunk_size=SMALL_CHUNK, ref="models/toy")
    src.reads.clear()
    results = replicate(src, targets, ref="models/toy")
    changed = set(new.manifest.chunk_lengths()) - set(first.manifest.chunk_lengths())
    assert [r.chunks_sent for r in results] == [len(changed)] * 2 + [len(new.manifest.chunk_lengths())] * 2
    assert len(src.reads) == len(new.manifest.chunk_lengths()) and set(src.reads.values()) == {1}
    assert all(verify(t, ref="models/toy").ok for t in targets)


def test_a_failing_target_does_not_stop_the_others(source, tmp_path):
    src, _ = source
    good = [LocalDirStore(tmp_path / f"t{i}") for i in range(3)]
    broken = BrokenStore(tmp_path / "full-disk")
    with pytest.raises(ReplicationError) as caught:
        replicate(src, [good[0], broken, good[1], good[2]], ref="models/toy")
    assert list(caught.value.failures) == [broken.uri]
    assert "No space left on device" in str(caught.value.failures[broken.uri])
    assert [r.store for r in caught.value.results] == [g.uri for g in good]
    assert set(src.reads.values()) == {1}
    for t in good:
        assert verify(t, ref="models/toy").ok
    assert broken.read_ref("models/toy") is None  # its ref never moved
    assert broken.list_documents(LEASE_PREFIX) == []
