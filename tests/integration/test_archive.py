"""Archive storage classes on a real moto_server of this module's own: archived chunks refuse to be
read until restored, their states are reported, and restores can be held in progress."""

from __future__ import annotations

import json
import os

import pytest
from archive_helpers import archive_store, hold_restores_in_progress, manual_restores, read_each

from concord.errors import ChunkArchivedError, ChunkNotFoundError, StoreError
from concord.hashing import chunk_id
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.stores.base import chunk_key

pytestmark = pytest.mark.integration


def _chunks(store, n: int = 3) -> dict[str, bytes]:
    chunks = {}
    for _ in range(n):
        data = os.urandom(500)
        chunks[chunk_id(data)] = data
        store.put_chunk(chunk_id(data), data)
    return chunks


@pytest.fixture
def glacier(archive_moto_server):
    store = archive_store(archive_moto_server, "GLACIER")
    yield store
    store.close()


@pytest.mark.parametrize(("storage_class", "archive"), [("GLACIER", True), ("DEEP_ARCHIVE", True), ("GLACIER_IR", False), ("STANDARD_IA", False)])
def test_archive_follows_the_storage_class(archive_moto_server, storage_class, archive):
    assert archive_store(archive_moto_server, storage_class).archive is archive


def test_an_archived_chunk_must_be_restored_before_it_is_read(glacier):
    chunks = _chunks(glacier)
    cid = next(iter(chunks))
    assert glacier.archive is True
    with pytest.raises(ChunkArchivedError) as info:
        glacier.get_chunk(cid)
    err = info.value
    assert isinstance(err, StoreError)
    assert (err.store, err.key, err.storage_class) == (glacier.uri, chunk_key(cid), "GLACIER")
    assert "archive storage class GLACIER" in str(err) and "concord tier restore" in str(err)
    with pytest.raises(ChunkArchivedError):
        glacier.read_chunk_raw(cid)  # verification cannot read it either
    assert glacier.has_chunks(chunks) == set(chunks)  # held all the same

    assert glacier.chunk_states(list(chunks)) == {c: "archived" for c in chunks}
    assert glacier.request_restore(list(chunks), days=2, tier="Bulk") == len(chunks)
    assert glacier.chunk_states(list(chunks)) == {c: "available" for c in chunks}  # moto restores at once
    for c, data in chunks.items():
        assert glacier.get_chunk(c) == data


def test_manifests_and_refs_stay_readable_in_an_archive(glacier, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(os.urandom(200_000))
    (folder / "config.json").write_text(json.dumps({"layers": 2}))
    r = snapshot(folder, glacier, ref="models/tiny", chunk_size=64 * 1024)
    assert glacier.read_ref("models/tiny").root == r.root
    manifest = load_manifest(glacier, r.root)  # no restore needed
    ids = list(manifest.chunk_lengths())
    assert set(glacier.chunk_states(ids).values()) == {"archived"}


def test_missing_chunks_are_reported_and_cannot_be_restored(glacier):
    chunks = _chunks(glacier, 1)
    absent = chunk_id(b"never stored")
    assert glacier.chunk_states([*chunks, absent]) == {**{c: "archived" for c in chunks}, absent: "missing"}
    with pytest.raises(ChunkNotFoundError) as info:
        glacier.request_restore([absent])
    assert info.value.chunk == absent
    assert glacier.request_restore([]) == 0


def test_a_chunk_not_in_an_archive_class_needs_no_restore(archive_moto_server):
    store = archive_store(archive_moto_server, "STANDARD_IA")
    chunks = _chunks(store, 2)
    assert store.chunk_states(list(chunks)) == {c: "available" for c in chunks}
    assert store.request_restore(list(chunks)) == 0


def test_a_restore_held_in_progress(archive_moto_server, glacier):
    chunks = _chunks(glacier, 2)
    ids = list(chunks)
    with hold_restores_in_progress(archive_moto_server, glacier, ids):
        for _ in range(3):
            assert glacier.chunk_states(ids) == {c: "restoring" for c in ids}
        with pytest.raises(ChunkArchivedError, match="GLACIER"):
            glacier.get_chunk(ids[0])
        assert glacier.request_restore(ids) == len(ids)  # asking again is fine
        assert glacier.chunk_states(ids) == {c: "restoring" for c in ids}
    assert glacier.chunk_states(ids) == {c: "available" for c in ids}
    assert all(glacier.get_chunk(c) == data for c, data in chunks.items())


@pytest.mark.parametrize("reads", [0, 1, 3])
def test_a_restore_completes_after_a_number_of_reads(archive_moto_server, glacier, reads):
    chunks = _chunks(glacier, 2)
    ids = list(chunks)
    with hold_restores_in_progress(archive_moto_server, glacier, ids, reads=reads):
        seen = [glacier.chunk_states(ids) for _ in range(reads + 2)]
    assert seen == [{c: "restoring" for c in ids}] * reads + [{c: "available" for c in ids}] * 2


def test_the_restore_transition_is_always_reset(archive_moto_server, glacier):
    chunks = _chunks(glacier, 1)
    ids = list(chunks)
    with pytest.raises(RuntimeError):
        with hold_restores_in_progress(archive_moto_server, glacier, ids):
            raise RuntimeError("the test failed inside")
    # back to moto's default: restores requested from now on complete at once
    more = _chunks(glacier, 1)
    glacier.request_restore(list(more))
    assert glacier.chunk_states([*ids, *more]) == {c: "available" for c in [*ids, *more]}


def test_manual_restores_step_on_every_read(archive_moto_server, glacier):
    chunks = _chunks(glacier, 1)
    ids = list(chunks)
    with manual_restores(archive_moto_server, times=1):
        glacier.request_restore(ids)
        read_each(glacier, ids)  # the first read after the request: in progress
        assert glacier.chunk_states(ids) == {ids[0]: "available"}  # the next: done
