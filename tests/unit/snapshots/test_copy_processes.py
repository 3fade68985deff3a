"""A copy between folder stores of many chunks also runs in worker processes
(``python -m concord.snapshots.copyworker``): the same result as threads alone, every target
flushed and verified, an error reported as this process sees it, and a worker that goes away
costs nothing but its speed."""

from __future__ import annotations

import os
import sys

import pytest

import concord.snapshots.sync as sync
from concord.errors import IntegrityError, ReplicationError
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import copy_processes, replicate
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore
from concord.stores.base import chunk_key

FILES = 120


@pytest.fixture
def many(tmp_path, monkeypatch):
    """A store holding a snapshot of many small files, copies going to worker processes in slices of 7."""
    monkeypatch.setattr(sync, "PROCESS_MIN_CHUNKS", 10)
    monkeypatch.setattr(sync, "PROCESS_SLICE", 7)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # two worker processes beside this one
    src = tmp_path / "ckpt"
    src.mkdir()
    for i in range(FILES):
        (src / f"shard-{i:04d}.dat").write_bytes(os.urandom(300 + i))
    store = LocalDirStore(tmp_path / "src")
    r = snapshot(src, store, ref="m")
    return store, r.root


class _Progress:
    def __init__(self) -> None:
        self.total = self.done = 0

    def start(self, total: int, desc: str) -> None:
        self.total = total

    def advance(self, n: int) -> None:
        self.done += n

    def close(self) -> None:
        pass


def test_workers_copy_what_threads_would_and_every_target_verifies(many, tmp_path):
    store, root = many
    targets = [LocalDirStore(tmp_path / "a"), LocalDirStore(tmp_path / "b")]
    assert copy_processes(store, [(t, ["x"] * 10) for t in targets]) == 2
    progress = _Progress()
    results = replicate(store, targets, ref="m", progress=progress)
    ids = set(load_manifest(store, root).chunk_lengths())
    for t, r in zip(targets, results):
        assert r.root == root and r.chunks_sent == len(ids) and t.read_ref("m").root == root
        assert set(t.iter_chunks()) == ids
        report = verify(t)
        assert report.ok and report.chunks_checked == len(ids)
        leftovers = [n for _, _, names in os.walk(t.root) for n in names if n.startswith(".tmp-")]
        assert leftovers == []
    assert progress.done == progress.total > 0
    again = replicate(store, targets, ref="m")  # nothing left to move
    assert [r.chunks_sent for r in again] == [0, 0]


@pytest.mark.parametrize("workers", ["2", "0"], ids=["processes", "threads"])
def test_a_corrupt_source_chunk_fails_the_sync_as_threads_do_and_moves_no_ref(many, tmp_path, monkeypatch, workers):
    monkeypatch.setenv(sync.PROCESSES_ENV, workers)
    store, root = many
    bad = sorted(load_manifest(store, root).chunk_lengths())[17]
    path = os.path.join(store.root, *chunk_key(bad).split("/"))
    with open(path, "r+b") as f:
        f.write(b"\xff")
    targets = [LocalDirStore(tmp_path / "a"), LocalDirStore(tmp_path / "b")]
    with pytest.raises(ReplicationError) as err:
        replicate(store, targets, ref="m")
    assert len(err.value.failures) == 2
    for exc in err.value.failures.values():
        assert isinstance(exc, IntegrityError) and bad in str(exc)  # as a copy on threads reports it
    for target in targets:
        assert target.read_ref("m") is None
        assert bad not in set(target.iter_chunks())
        assert verify(target).ok  # whatever arrived is whole


def test_a_worker_that_goes_away_costs_only_speed(many, tmp_path, monkeypatch):
    store, root = many

    class Gone(sync._Worker):
        def __init__(self, source, targets, overwrite) -> None:
            self.proc = sync.subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], stdin=sync.subprocess.PIPE, stdout=sync.subprocess.PIPE)

    monkeypatch.setattr(sync, "_Worker", Gone)
    target = LocalDirStore(tmp_path / "a")
    (r,) = replicate(store, [target], ref="m")
    assert r.root == root and target.read_ref("m").root == root
    assert verify(target).ok and set(target.iter_chunks()) == set(load_manifest(store, root).chunk_lengths())


def test_the_number_of_workers_is_bounded_and_may_be_turned_off(many, tmp_path, monkeypatch):
    store, _ = many
    wants = [(LocalDirStore(tmp_path / "a"), ["x"] * 10)]
    monkeypatch.setenv(sync.PROCESSES_ENV, "0")
    assert copy_processes(store, wants) == 0
    monkeypatch.setenv(sync.PROCESSES_ENV, "1")
    assert copy_processes(store, wants) == 1
    monkeypatch.setenv(sync.PROCESSES_ENV, "many")
    with pytest.raises(ValueError, match="CONCORD_COPY_PROCESSES must be a whole number"):
        copy_processes(store, wants)
    monkeypatch.delenv(sync.PROCESSES_ENV)
    assert copy_processes(store, [(wants[0][0], ["x"] * 9)]) == 0  # too few chunks to pay for a process
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert copy_processes(store, wants) == 0  # one core: threads only

    class Mine(LocalDirStore):  # a store of its own kind may not travel as its settings
        pass

    assert copy_processes(Mine(tmp_path / "s"), wants) == 0


def test_a_worker_process_copies_its_slice_flushes_it_and_answers(many, tmp_path):
    store, root = many
    ids = sorted(load_manifest(store, root).chunk_lengths())[:20]
    target = LocalDirStore(tmp_path / "a")
    worker = sync._Worker(store, [target], False)
    try:
        counts, failed, done = worker.run([(cid, [0]) for cid in ids], {})
        assert failed == [] and counts[0][0] == 20 and done == counts[0][2] > 0
        assert set(target.iter_chunks()) == set(ids)
        counts, failed, _ = worker.run([(cid, [0]) for cid in ids], {})  # there now: nothing written
        assert counts[0][0] == 0 and failed == []
    finally:
        worker.close()
    assert worker.proc.returncode == 0
