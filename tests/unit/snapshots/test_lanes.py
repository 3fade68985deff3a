"""Restore and checkout hand their threads one lane of files each: the files are cut into as many
contiguous lanes as there are threads, and the runs of chunks are taken from the lanes in turn,
so two threads create files in different folders instead of queueing on one folder's lock."""

from __future__ import annotations

import importlib
import random
from concurrent.futures import Future
from pathlib import Path

import pytest

from concord.files import round_robin, spans
from concord.serving.checkout import checkout
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

restore_module = importlib.import_module("concord.snapshots.restore")
checkout_module = importlib.import_module("concord.serving.checkout")


class _InOrder:
    """An executor running each task as it is submitted: the order tasks are handed out is the
    order they run in."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def submit(self, fn, *args, **kwargs) -> Future:
        f: Future = Future()
        f.set_result(fn(*args, **kwargs))
        return f


@pytest.mark.parametrize(("n", "k"), [(0, 2), (1, 2), (2, 2), (5, 3), (10, 2), (7, 1), (3, 8)])
def test_spans_cut_a_range_into_even_contiguous_pieces(n, k):
    got = spans(n, k)
    assert len(got) == min(n, k)
    assert [i for lo, hi in got for i in range(lo, hi)] == list(range(n))
    sizes = [hi - lo for lo, hi in got]
    assert all(s > 0 for s in sizes) and (not sizes or max(sizes) - min(sizes) <= 1)


def test_round_robin_takes_one_of_each_in_turn_and_keeps_each_order():
    assert list(round_robin([[1, 2, 3], "ab", [], iter([9])])) == [1, "a", 9, 2, "b", 3]
    assert list(round_robin([])) == []


def test_round_robin_reads_each_lazily():
    taken = []

    def counted(name, n):
        for i in range(n):
            taken.append((name, i))
            yield name, i

    it = round_robin([counted("a", 3), counted("b", 3)])
    assert next(it) == ("a", 0) and taken == [("a", 0)]
    assert next(it) == ("b", 0) and taken == [("a", 0), ("b", 0)]


@pytest.fixture
def two_folders(tmp_path: Path):
    """A snapshot of two folders of 13 files of one chunk each, and its store (two threads)."""
    src = tmp_path / "src"
    rng = random.Random(7)
    for folder in ("a", "b"):
        (src / folder).mkdir(parents=True)
        for i in range(13):
            (src / folder / f"f{i:02d}.dat").write_bytes(rng.randbytes(3000))
    store = LocalDirStore(tmp_path / "store")
    manifest = snapshot(src, store).manifest
    store.parallelism = 2
    return store, manifest


def _fetch_order(store, monkeypatch) -> list[str]:
    """The folder of each chunk's file, in the order the chunks are read from ``store``."""
    read = store.read_chunk
    order: list[str] = []

    def recording(cid, **kwargs):
        order.append(cid)
        return read(cid, **kwargs)

    monkeypatch.setattr(store, "read_chunk", recording)
    return order


def _folders(manifest, order: list[str]) -> str:
    folder_of = {p.chunks: f.path.split("/")[0] for f in manifest.files for p in f.parts}
    return "".join(folder_of[c] for c in order)


def test_restore_hands_each_thread_a_lane_of_files(two_folders, tmp_path, monkeypatch):
    store, manifest = two_folders
    monkeypatch.setattr(restore_module, "ThreadPoolExecutor", _InOrder)
    order = _fetch_order(store, monkeypatch)
    restore(store, manifest, tmp_path / "out")
    # runs of 3 chunks (26 chunks, 4 runs a thread at least), the lanes' runs in turn, each chunk once
    assert _folders(manifest, order) == "aaabbb" * 4 + "ab"
    assert sorted(order) == sorted(p.chunks for f in manifest.files for p in f.parts)
    assert sorted((tmp_path / "out" / "b").iterdir())[-1].read_bytes() == (
        tmp_path / "src" / "b" / "f12.dat"
    ).read_bytes()


def test_checkout_hands_each_thread_a_lane_of_files(two_folders, tmp_path, monkeypatch):
    store, manifest = two_folders
    monkeypatch.setattr(checkout_module, "ThreadPoolExecutor", _InOrder)
    order = _fetch_order(store, monkeypatch)
    checkout(store, manifest, tmp_path / "serve" / "current", fsync=False)
    assert _folders(manifest, order) == "aaabbb" * 4 + "ab"
    assert sorted(order) == sorted(p.chunks for f in manifest.files for p in f.parts)
    assert (tmp_path / "serve" / "current" / "a" / "f00.dat").read_bytes() == (
        tmp_path / "src" / "a" / "f00.dat"
    ).read_bytes()
