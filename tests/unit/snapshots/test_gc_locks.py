"""A collection lock that cannot be read: writers say what they wait for, and never wait past
the point where the lock counts as stale."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from concord.errors import StoreLockedError
from concord.snapshots.gc import collect_garbage
from concord.stores import LocalDirStore
from concord.stores.leases import DEFAULT_LEASE_TTL, LOCK_PREFIX, collection_lock, read_locks, write_lease

GARBAGE = {
    "garbage bytes": b"\x00\xff not json at all",
    "a list, not an object": b"[1, 2, 3]",
    "an object without expires": b'{"what": "a collection"}',
}


@pytest.fixture
def store(tmp_path: Path) -> LocalDirStore:
    return LocalDirStore(tmp_path / "store")


def _scribble(store: LocalDirStore, data: bytes, age: float = 0.0) -> Path:
    key = f"{LOCK_PREFIX}/scribbled"
    store.put_document(key, data)
    path = Path(store.root, *key.split("/"))
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("data", list(GARBAGE.values()), ids=list(GARBAGE))
def test_a_writer_names_an_unreadable_lock_and_how_to_remove_it(store, data, caplog):
    path = _scribble(store, data)
    caplog.set_level(logging.WARNING, logger="concord.leases")
    with pytest.raises(StoreLockedError) as err, write_lease(store, "a snapshot", wait_seconds=0.3):
        pass
    assert f"rm {path}" in str(err.value)
    waiting = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert len(waiting) == 1 and f"rm {path}" in waiting[0] and "a snapshot" in waiting[0]


def test_an_unreadable_lock_counts_as_stale_once_old(store):
    path = _scribble(store, GARBAGE["garbage bytes"], age=DEFAULT_LEASE_TTL + 60)
    (lock,) = read_locks(store)
    assert lock.unreadable and lock.stale(time.time())
    with write_lease(store, "a snapshot", wait_seconds=0) as key:  # held the writer for ever before
        assert key.startswith("gc/leases/")
    collect_garbage(store, grace_seconds=0)
    assert not path.exists()  # the next collection removes it


def test_a_fresh_unreadable_lock_holds_writers_only_until_it_is_stale(store):
    _scribble(store, GARBAGE["a list, not an object"], age=DEFAULT_LEASE_TTL - 120)
    (lock,) = read_locks(store)
    assert not lock.stale(time.time()) and lock.stale(time.time() + 121)
    assert lock.expires < float("inf")


def test_a_collection_in_progress_is_still_waited_for(store, caplog):
    caplog.set_level(logging.WARNING, logger="concord.leases")
    with (
        collection_lock(store, "garbage collection by test"),
        pytest.raises(StoreLockedError, match="garbage collection by test"),
        write_lease(store, "a sync", wait_seconds=0.3),
    ):
        pass
    assert any("garbage collection by test to finish before a sync" in r.getMessage() for r in caplog.records)
