"""A folder store's inventory: during one operation (under its lease), whether chunks are there
is answered from one listing of each chunk folder asked about often, instead of a ``stat`` per
chunk, and what the operation writes or deletes meanwhile keeps it right."""

from __future__ import annotations

import os
import pickle
import threading

from concord.hashing import chunk_id
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore
from concord.stores.base import chunk_key
from concord.stores.local import LIST_AFTER


def _chunks_in_one_folder(store: LocalDirStore, n: int) -> list[str]:
    """``n`` chunks stored whose ids share their first two hex digits (one chunk folder)."""
    ids: list[str] = []
    i = 0
    while len(ids) < n:
        data = f"chunk {i}".encode()
        cid = chunk_id(data)
        if cid.startswith("ab"):
            store.put_chunk(cid, data)
            ids.append(cid)
        i += 1
    return ids


def _path(store: LocalDirStore, cid: str) -> str:
    return os.path.join(store.root, *chunk_key(cid).split("/"))


def test_a_folder_asked_about_often_is_listed_once_for_the_operation(tmp_path):
    store = LocalDirStore(tmp_path / "s")
    ids = _chunks_in_one_folder(store, LIST_AFTER + 4)
    with store.inventory():
        assert store.has_chunks(ids[:LIST_AFTER]) == set(ids[:LIST_AFTER])  # the last of these lists the folder
        os.unlink(_path(store, ids[-1]))  # behind the operation's back: the listing answers
        assert store.has_chunks([ids[-1]]) == {ids[-1]}
    assert store.has_chunks([ids[-1]]) == set()  # the next operation asks again
    with store.inventory():
        assert store.has_chunks(ids) == set(ids[:-1])


def test_what_the_operation_writes_and_deletes_keeps_the_inventory_right(tmp_path):
    store = LocalDirStore(tmp_path / "s")
    ids = _chunks_in_one_folder(store, LIST_AFTER + 1)
    gone, kept = ids[0], ids[1:]
    with store.inventory():
        assert store.has_chunks(ids) == set(ids)  # listed
        store.delete_chunk(gone)
        assert store.has_chunks(ids) == set(kept)
        assert not os.path.exists(_path(store, gone))
        i = 0
        while True:  # a new chunk of the same folder, written during the operation
            data = f"new {i}".encode()
            if chunk_id(data).startswith("ab"):
                break
            i += 1
        new = chunk_id(data)
        assert store.has_chunks([new]) == set()
        assert store.put_chunk(new, data) is True
        assert store.has_chunks([new]) == {new}
        assert store.put_chunk(new, data) is False  # there: not written again
        assert store.get_chunk(new) == data


def test_a_chunk_another_writer_adds_after_the_listing_is_written_once(tmp_path):
    store, other = LocalDirStore(tmp_path / "s"), LocalDirStore(tmp_path / "s")
    ids = _chunks_in_one_folder(store, LIST_AFTER)
    i = 0
    while True:
        data = f"late {i}".encode()
        if chunk_id(data).startswith("ab"):
            break
        i += 1
    late = chunk_id(data)
    with store.inventory():
        assert store.has_chunks(ids) == set(ids)  # the folder is listed
        assert other.put_chunk(late, data) is True  # another writer, after the listing
        assert store.put_chunk(late, data) is False  # the rename finds it there: nothing replaced
        assert store.has_chunks([late]) == {late}
    assert [n for n in os.listdir(os.path.dirname(_path(store, late))) if n.startswith(".")] == []


def test_threads_asking_about_one_folder_agree(tmp_path):
    store = LocalDirStore(tmp_path / "s")
    ids = _chunks_in_one_folder(store, 3 * LIST_AFTER)
    absent = [chunk_id(f"absent {i}".encode()) for i in range(50)]
    answers: list[set[str]] = []
    start = threading.Barrier(4)

    def ask() -> None:
        start.wait()
        answers.append(store.has_chunks(ids + absent))

    with store.inventory():
        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert answers == [set(ids)] * 4


def test_a_re_snapshot_of_many_files_in_one_operation_stores_nothing_and_keeps_the_root(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    for i in range(3000):  # about 12 chunks a chunk folder: most folders are listed
        (src / f"shard-{i:04d}.dat").write_bytes(os.urandom(64 + i % 100))
    store = LocalDirStore(tmp_path / "s")
    first = snapshot(src, store, ref="m")
    ids = list(load_manifest(store, first.root).chunk_lengths())
    os.unlink(_path(store, ids[7]))  # lost: the next snapshot, asking each folder, writes it again
    again = snapshot(src, store, ref="m")
    assert again.root == first.root and again.new_chunks == 1
    assert store.has_chunks(ids) == set(ids)


def test_a_store_sent_to_another_process_takes_no_inventory_with_it(tmp_path):
    store = LocalDirStore(tmp_path / "s")
    ids = _chunks_in_one_folder(store, LIST_AFTER)
    with store.inventory():
        assert store.has_chunks(ids) == set(ids)  # listed
        os.unlink(_path(store, ids[0]))
        copy = pickle.loads(pickle.dumps(store))  # a task runner's worker: asks its files itself
        assert copy.has_chunks([ids[0]]) == set()
        assert store.has_chunks([ids[0]]) == {ids[0]}  # this operation's listing
