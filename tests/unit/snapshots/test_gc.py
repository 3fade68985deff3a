"""Garbage collection on real local stores: what stays, what goes, and when nothing may go."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, fine_tune

from concord.errors import GcRefusedError
from concord.federation.ledger import append_round, head_ref, verify_ledger
from concord.hashing import chunk_id
from concord.snapshots.gc import GcResult, collect_garbage
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore
from concord.stores.base import manifest_key
from concord.stores.leases import DEFAULT_LEASE_TTL, LEASE_PREFIX, read_leases, write_lease

HOUR = 3600.0


def _later(hours: float = 48) -> float:
    """A moment far enough ahead that everything written so far is older than any grace used here."""
    return time.time() + hours * HOUR


def _held(store: LocalDirStore) -> tuple[set[str], set[str]]:
    return set(store.iter_chunks()), set(store.iter_manifests())


@pytest.fixture
def store(tmp_path: Path) -> LocalDirStore:
    return LocalDirStore(tmp_path / "store")


@pytest.fixture
def two_snapshots(ckpt, tmp_path, store):
    """``keep`` under a ref; ``drop`` (a fine-tune sharing most chunks) under none."""
    keep = snapshot(ckpt, store, ref="models/keep", chunk_size=SMALL_CHUNK)
    tuned = fine_tune(ckpt, tmp_path / "tuned", ["embed.weight", "layers.0.attn.q.weight"])
    drop = snapshot(tuned, store, chunk_size=SMALL_CHUNK)
    kept = set(keep.manifest.chunk_lengths())
    only_drop = set(drop.manifest.chunk_lengths()) - kept
    assert only_drop and kept & set(drop.manifest.chunk_lengths())  # some chunks shared, some not
    return keep, drop, only_drop


def _every_ref_verifies(store: LocalDirStore) -> None:
    for name in store.list_refs():
        if not name.endswith("/_ledger"):
            for entry in store.read_ref(name).history:
                assert verify(store, root=entry.root).ok, (name, entry.root)


def test_unreferenced_snapshots_go_and_shared_chunks_stay(store, two_snapshots):
    keep, drop, only_drop = two_snapshots
    sizes = drop.manifest.chunk_lengths()
    result = collect_garbage(store, grace_seconds=HOUR, now=_later())
    assert result == GcResult(
        store=store.uri,
        live_roots=1,
        live_chunks=len(keep.manifest.chunk_lengths()),
        unreferenced_chunks=len(only_drop),
        unreferenced_bytes=sum(sizes[c] for c in only_drop),
        deleted_chunks=len(only_drop),
        deleted_bytes=sum(sizes[c] for c in only_drop),
        deleted_manifests=1,
        young_chunks=0,
        dry_run=False,
        postponed_by=[],
    )
    chunks, manifests = _held(store)
    assert manifests == {keep.root}
    assert chunks == set(keep.manifest.chunk_lengths())
    _every_ref_verifies(store)
    # nothing left to collect
    again = collect_garbage(store, grace_seconds=HOUR, now=_later())
    assert (again.deleted_chunks, again.deleted_manifests, again.unreferenced_chunks) == (0, 0, 0)


def test_a_dry_run_deletes_nothing_but_says_what_would_go(store, two_snapshots):
    keep, drop, only_drop = two_snapshots
    before = _held(store)
    result = collect_garbage(store, grace_seconds=HOUR, dry_run=True, now=_later())
    assert result.dry_run is True
    assert (result.deleted_chunks, result.deleted_manifests) == (len(only_drop), 1)
    assert result.deleted_bytes == sum(drop.manifest.chunk_lengths()[c] for c in only_drop)
    assert _held(store) == before
    assert result.to_dict()["deleted_chunks"] == len(only_drop)


def test_the_grace_period_keeps_young_objects(store, two_snapshots):
    keep, drop, only_drop = two_snapshots
    orphans = {}  # chunks of a snapshot killed before its manifest was written
    for i in range(3):
        data = os.urandom(1000 + i)
        orphans[chunk_id(data)] = data
        store.put_chunk(chunk_id(data), data)
    before = _held(store)
    young = collect_garbage(store, grace_seconds=HOUR)  # everything was written just now
    # the young manifest of ``drop`` stays, and keeps its chunks; the orphans are young
    assert (young.young_chunks, young.unreferenced_chunks) == (len(orphans), len(orphans))
    assert young.live_chunks == len(keep.manifest.chunk_lengths()) + len(only_drop)
    assert (young.deleted_chunks, young.deleted_manifests) == (0, 0)
    assert _held(store) == before
    # an hour and a bit later, the same collection deletes them all
    later = collect_garbage(store, grace_seconds=HOUR, now=time.time() + HOUR + 60)
    assert (later.young_chunks, later.deleted_chunks, later.deleted_manifests) == (0, len(orphans) + len(only_drop), 1)
    assert _held(store) == ({*keep.manifest.chunk_lengths()}, {keep.root})


def test_ref_history_keeps_every_root_it_ever_named(ckpt, tmp_path, store):
    first = snapshot(ckpt, store, ref="m", chunk_size=SMALL_CHUNK)
    second = snapshot(fine_tune(ckpt, tmp_path / "ft", ["embed.weight"]), store, ref="m", chunk_size=SMALL_CHUNK)
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert result.live_roots == 2 and result.deleted_chunks == 0 and result.deleted_manifests == 0
    assert verify(store, ref="m~1").ok and verify(store, root=first.root).ok and verify(store, root=second.root).ok


def test_a_deleted_ref_frees_what_only_it_kept(ckpt, tmp_path, store):
    keep = snapshot(ckpt, store, ref="keep", chunk_size=SMALL_CHUNK)
    gone = snapshot(fine_tune(ckpt, tmp_path / "ft", ["embed.weight"]), store, ref="gone", chunk_size=SMALL_CHUNK)
    assert store.delete_ref("gone", gone.root)
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert result.deleted_manifests == 1
    assert set(store.iter_chunks()) == set(keep.manifest.chunk_lengths())
    _every_ref_verifies(store)


def test_a_young_manifest_keeps_its_old_chunks(ckpt, store):
    """A manifest just written, whose ref has not moved yet, must find its chunks still there."""
    r = snapshot(ckpt, store, chunk_size=SMALL_CHUNK)
    old = time.time() - 10 * HOUR
    for dirpath, _, files in os.walk(store.root):
        for f in files:
            os.utime(os.path.join(dirpath, f), (old, old))
    os.utime(store._path(manifest_key(r.root)))  # the manifest alone is written again, now
    result = collect_garbage(store, grace_seconds=HOUR)
    assert (result.deleted_chunks, result.deleted_manifests, result.unreferenced_chunks) == (0, 0, 0)
    assert verify(store, root=r.root).ok


def test_a_live_lease_postpones_everything(store, two_snapshots):
    before = _held(store)
    with write_lease(store, "snapshot of ckpt to ref models/next"):
        result = collect_garbage(store, grace_seconds=0)
    assert result.postponed_by == ["snapshot of ckpt to ref models/next"]
    assert (result.deleted_chunks, result.deleted_manifests) == (0, 0)
    assert result.unreferenced_chunks > 0  # what was found is still reported
    assert _held(store) == before
    assert store.list_documents(LEASE_PREFIX) == []  # the lease went with its writer
    assert collect_garbage(store, grace_seconds=0).deleted_manifests == 1


def _lease_of_a_killed_writer(store: LocalDirStore) -> str:
    """A real writer process that takes a lease and is SIGKILLed while holding it."""
    code = (
        "import sys, time\n"
        "from concord.stores import LocalDirStore\n"
        "from concord.stores.leases import write_lease\n"
        "with write_lease(LocalDirStore(sys.argv[1]), 'killed sync') as key:\n"
        "    print(key, flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(store.root)], stdout=subprocess.PIPE, text=True)
    try:
        key = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert key.startswith(f"{LEASE_PREFIX}/")
    return key


def test_a_lease_left_by_a_killed_writer_on_this_machine_is_stale_at_once(store, two_snapshots):
    key = _lease_of_a_killed_writer(store)
    assert [(lease.what, lease.process) for lease in read_leases(store)] == [("killed sync", "gone")]
    dry = collect_garbage(store, grace_seconds=0, dry_run=True, now=_later())
    assert dry.postponed_by == [] and store.get_document(key) is not None  # a dry run removes nothing
    done = collect_garbage(store, grace_seconds=0, now=_later())
    assert done.postponed_by == [] and done.deleted_manifests == 1
    assert store.get_document(key) is None


def test_a_lease_whose_process_id_now_runs_another_program_is_stale(store, two_snapshots):
    with write_lease(store, "a writer") as key:
        doc = json.loads(store.get_document(key))
        doc["pid_start"] = "1"  # this pid, but started at another time: the id was reused
        store.put_document(key, json.dumps(doc).encode(), overwrite=True)
        assert [lease.process for lease in read_leases(store)] == ["gone"]
        assert collect_garbage(store, grace_seconds=0).deleted_manifests == 1


def test_a_lease_from_another_machine_holds_until_its_heartbeat_stops(store, two_snapshots):
    with write_lease(store, "sync on another host", ttl_seconds=HOUR) as key:
        doc = json.loads(store.get_document(key))
        doc["host"] = "another-host"
        store.put_document(key, json.dumps(doc).encode(), overwrite=True)
        assert [lease.process for lease in read_leases(store)] == [None]  # cannot be seen from here
        held = collect_garbage(store, grace_seconds=0, now=time.time() + HOUR / 2)
        assert held.postponed_by == ["sync on another host"] and held.deleted_manifests == 0
        done = collect_garbage(store, grace_seconds=0, now=time.time() + 2 * HOUR)
        assert done.postponed_by == [] and done.deleted_manifests == 1
        assert store.get_document(key) is None


def test_a_live_writer_on_this_machine_holds_however_old_its_heartbeat(store, two_snapshots):
    with write_lease(store, "a slow sync", ttl_seconds=60):
        held = collect_garbage(store, grace_seconds=0, now=_later())
    assert held.postponed_by == ["a slow sync"] and held.deleted_manifests == 0


def test_the_heartbeat_renews_the_lease(store):
    with write_lease(store, "a writer", ttl_seconds=0.5) as key:
        first = json.loads(store.get_document(key))["expires"]
        deadline = time.time() + 20
        while json.loads(store.get_document(key)).get("renewed") is None and time.time() < deadline:
            time.sleep(0.05)
        doc = json.loads(store.get_document(key))
    assert doc.get("renewed") and doc["expires"] >= first
    assert store.get_document(key) is None


def test_an_unreadable_lease_holds_until_removed(store, two_snapshots):
    store.put_document(f"{LEASE_PREFIX}/scribbled", b"not json")
    result = collect_garbage(store, grace_seconds=0, now=_later(24 * 365))
    assert len(result.postponed_by) == 1 and "unreadable lease" in result.postponed_by[0]
    assert result.deleted_chunks == 0


def test_a_lease_records_who_holds_it(store):
    with write_lease(store, "a writer", ttl_seconds=60) as key:
        doc = json.loads(store.get_document(key))
        assert key.startswith(f"{LEASE_PREFIX}/")
        assert doc["what"] == "a writer" and doc["pid"] == os.getpid() and doc["host"]
        started, expires = (datetime.fromisoformat(doc[k]) for k in ("started", "expires"))
        assert expires - started == timedelta(seconds=60) and expires.utcoffset() == timedelta(0)
    assert store.get_document(key) is None


def test_a_lease_is_removed_when_the_writer_fails(store):
    with pytest.raises(RuntimeError):
        with write_lease(store, "a writer"):
            raise RuntimeError("the write failed")
    assert store.list_documents(LEASE_PREFIX) == []
    with pytest.raises(ValueError, match="positive"):
        with write_lease(store, "a writer", ttl_seconds=0):
            pass
    # a writer killed on another host holds collections for minutes (its heartbeat stops), not hours
    assert DEFAULT_LEASE_TTL <= 15 * 60


class _LeaseWatchingStore(LocalDirStore):
    """A real local store that notes the leases held on it when a ref moves."""

    seen: list

    def cas_ref(self, *a, **kw):
        self.seen = [lease.what for lease in read_leases(self)]
        return super().cas_ref(*a, **kw)


def test_snapshot_and_sync_write_under_a_lease(ckpt, tmp_path):
    src = _LeaseWatchingStore(tmp_path / "src")
    snapshot(ckpt, src, ref="models/tiny", chunk_size=SMALL_CHUNK)
    assert src.seen == ["snapshot of ckpt to ref models/tiny"]
    assert src.list_documents(LEASE_PREFIX) == []
    dst = _LeaseWatchingStore(tmp_path / "dst")
    (r,) = replicate(src, [dst], ref="models/tiny")
    assert len(dst.seen) == 1 and dst.seen[0].startswith(f"sync of {r.root[:12]} from {src.uri}")
    assert dst.list_documents(LEASE_PREFIX) == [] and src.list_documents(LEASE_PREFIX) == []


class _ManifestFailsStore(LocalDirStore):
    """A real local store that goes away when the manifest is written."""

    def put_manifest(self, *a, **kw):
        raise ConnectionError("target went away")


def test_a_failed_write_leaves_no_lease(ckpt, tmp_path, store):
    snapshot(ckpt, store, ref="m", chunk_size=SMALL_CHUNK)
    target = _ManifestFailsStore(tmp_path / "t")
    with pytest.raises(ConnectionError):
        replicate(store, [target], ref="m")
    assert target.list_documents(LEASE_PREFIX) == []
    with pytest.raises(ConnectionError):
        snapshot(ckpt, target, ref="m", chunk_size=SMALL_CHUNK)
    assert target.list_documents(LEASE_PREFIX) == []


def test_ledger_heads_are_not_snapshots(ckpt, store):
    r = snapshot(ckpt, store, ref="acme/adapter", chunk_size=SMALL_CHUNK)
    append_round(store, "acme", {"method": "fedavg", "inputs": [r.root]})
    append_round(store, "acme", {"method": "fedavg", "inputs": [r.root]})
    assert store.read_ref(head_ref("acme")) is not None  # names round hashes, no manifest
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert result.live_roots == 1 and result.deleted_chunks == 0
    assert verify_ledger(store, "acme").ok
    _every_ref_verifies(store)


def test_a_missing_manifest_refuses_and_deletes_nothing(store, two_snapshots):
    keep, drop, _ = two_snapshots
    store.delete_manifest(keep.root)
    before = _held(store)
    with pytest.raises(GcRefusedError) as info:
        collect_garbage(store, grace_seconds=0, now=_later())
    err = info.value
    assert (err.ref, err.root) == ("models/keep", keep.root)
    assert "missing" in str(err) and "--repair-from" in str(err)
    assert _held(store) == before


def test_a_damaged_manifest_refuses(store, two_snapshots):
    keep, _, _ = two_snapshots
    good = store.get_manifest_bytes(keep.root)
    store.put_manifest(keep.root, good[: len(good) // 2], overwrite=True)  # cut short
    before = _held(store)
    with pytest.raises(GcRefusedError, match="damaged"):
        collect_garbage(store, grace_seconds=0, dry_run=True, now=_later())
    assert _held(store) == before
    # repaired from another copy, the collection goes ahead
    store.put_manifest(keep.root, good, overwrite=True)
    assert collect_garbage(store, grace_seconds=0, now=_later()).deleted_manifests == 1
    assert load_manifest(store, keep.root).root == keep.root


@pytest.mark.parametrize("grace", [-1, -0.001, math.nan, "3600"])
def test_the_grace_period_must_be_zero_or_more(store, grace):
    with pytest.raises(ValueError, match="grace_seconds must be 0 or more"):
        collect_garbage(store, grace_seconds=grace)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list = []

    def start(self, total: int, desc: str) -> None:
        self.calls.append(("start", total, desc))

    def advance(self, n: int) -> None:
        self.calls.append(("advance", n))

    def close(self) -> None:
        self.calls.append(("close",))


def test_progress_counts_the_bytes_deleted(store, two_snapshots):
    progress = _Recorder()
    result = collect_garbage(store, grace_seconds=0, now=_later(), progress=progress)
    assert progress.calls[0] == ("start", result.deleted_bytes, "gc")
    assert sum(c[1] for c in progress.calls if c[0] == "advance") == result.deleted_bytes
    assert progress.calls[-1] == ("close",)


def test_an_empty_store_has_nothing_to_collect(tmp_path):
    result = collect_garbage(LocalDirStore(tmp_path / "empty"), grace_seconds=0)
    assert result.to_dict() == {
        "store": str(tmp_path / "empty"),
        "live_roots": 0,
        "live_chunks": 0,
        "unreferenced_chunks": 0,
        "unreferenced_bytes": 0,
        "deleted_chunks": 0,
        "deleted_bytes": 0,
        "deleted_manifests": 0,
        "young_chunks": 0,
        "dry_run": False,
        "postponed_by": [],
        "deleted_leftovers": 0,
        "deleted_signatures": 0,
        "kept_bases": 0,
    }


def _leftover(store: LocalDirStore, key: str, age_hours: float) -> Path:
    path = Path(store.root, *key.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"half a chunk")
    then = time.time() - age_hours * HOUR
    os.utime(path, (then, then))
    return path


def test_temporary_files_a_killed_writer_left_go_once_untouched_for_an_hour(store, two_snapshots):
    keep, _, _ = two_snapshots
    stranded = [_leftover(store, "chunks/ab/.tmp-1", 2), _leftover(store, "manifests/.tmp-2", 1.5)]
    in_flight = _leftover(store, "chunks/cd/.tmp-3", 0.1)  # a write that may still be going on
    held = _held(store)

    dry = collect_garbage(store, grace_seconds=0, dry_run=True)
    assert dry.deleted_leftovers == 2 and all(p.exists() for p in stranded)
    with write_lease(store, "a writer"):
        assert collect_garbage(store, grace_seconds=0).deleted_leftovers == 0
    assert all(p.exists() for p in stranded)

    result = collect_garbage(store, grace_seconds=0)
    assert result.deleted_leftovers == 2
    assert not any(p.exists() for p in stranded) and in_flight.exists()
    assert _held(store)[0] <= held[0] and keep.root in _held(store)[1]
    # a grace period longer than an hour keeps them longer
    again = _leftover(store, "chunks/ab/.tmp-4", 2)
    assert collect_garbage(store, grace_seconds=3 * HOUR).deleted_leftovers == 0 and again.exists()


def test_only_temporary_files_are_leftovers(store):
    for key in ("chunks/ab/not-a-temp", "../.tmp-outside", "chunks/../../.tmp-x"):
        with pytest.raises(ValueError, match="not a leftover"):
            store.delete_leftover(key)


# --------------------------------------------------------------------------- every ref is live


def test_a_ref_whose_name_starts_with_an_underscore_is_live(ckpt, tmp_path, store):
    r = snapshot(ckpt, store, ref="models/_weights", chunk_size=SMALL_CHUNK)
    bare = snapshot(fine_tune(ckpt, tmp_path / "t", ["embed.weight"]), store, ref="_private", chunk_size=SMALL_CHUNK)
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert (result.live_roots, result.deleted_manifests, result.deleted_chunks) == (2, 0, 0)
    assert verify(store, ref="models/_weights").ok and verify(store, root=bare.root).ok
    assert r.ref == "models/_weights"


def test_the_ledger_head_name_is_refused_where_a_ref_is_created(ckpt, tmp_path, store):
    from concord.errors import ReservedNameError

    with pytest.raises(ReservedNameError, match="reserved.*ledger.*choose another name"):
        snapshot(ckpt, store, ref="models/_ledger", chunk_size=SMALL_CHUNK)
    assert store.list_refs() == [] and list(store.iter_chunks()) == []  # refused before any byte
    snapshot(ckpt, store, ref="models/keep", chunk_size=SMALL_CHUNK)
    with pytest.raises(ReservedNameError):
        replicate(store, [LocalDirStore(tmp_path / "t")], ref="models/keep".replace("keep", "_ledger"))


def test_a_snapshot_under_a_ledger_head_name_from_before_is_still_kept(ckpt, store):
    """Written before the name was refused: a ``_ledger`` ref whose root has a manifest is a snapshot."""
    r = snapshot(ckpt, store, chunk_size=SMALL_CHUNK)
    store.cas_ref("models/_ledger", None, r.root, "written by an older version")
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert (result.live_roots, result.deleted_manifests, result.deleted_chunks) == (1, 0, 0)
    assert verify(store, root=r.root).ok


# --------------------------------------------------------------------------- writers racing a collection


class _WriterDuringMarkStore(LocalDirStore):
    """A real local store on which, while a collection lists the chunks (after it has read the
    refs), a writer starts and finishes: it syncs a root this store still holds unreferenced."""

    writer = None

    def iter_chunk_stats(self):
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer()
        return super().iter_chunk_stats()


def test_a_writer_that_only_reuses_old_objects_during_the_mark_keeps_its_snapshot(ckpt, tmp_path):
    source = LocalDirStore(tmp_path / "source")
    old = snapshot(fine_tune(ckpt, tmp_path / "old", ["embed.weight"]), source, ref="models/old", chunk_size=SMALL_CHUNK)
    store = _WriterDuringMarkStore(tmp_path / "store")
    snapshot(ckpt, store, ref="models/live", chunk_size=SMALL_CHUNK)
    replicate(source, [store], ref="models/old")
    assert store.delete_ref("models/old", old.root)  # demoted: the old root lies unreferenced
    sent = []
    store.writer = lambda: sent.extend(replicate(source, [store], ref="models/old"))
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert sent and sent[0].chunks_sent == 0  # the writer reused every object
    assert result.deleted_manifests == 0 and result.deleted_chunks == 0
    assert verify(store, ref="models/old").ok
    _every_ref_verifies(store)


def test_a_manifest_written_during_the_mark_keeps_its_chunks(ckpt, tmp_path):
    store = _WriterDuringMarkStore(tmp_path / "store")
    gone = snapshot(ckpt, store, ref="models/gone", chunk_size=SMALL_CHUNK)
    assert store.delete_ref("models/gone", gone.root)
    store.delete_manifest(gone.root)  # chunks alone, unreferenced
    store.writer = lambda: store.put_manifest(gone.root, gone.manifest.to_json())
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert result.deleted_chunks == 0 and result.deleted_manifests == 0
    assert verify(store, root=gone.root).ok


def test_a_writer_waits_while_a_collection_holds_the_store(store):
    from concord.errors import StoreLockedError
    from concord.stores.leases import LOCK_PREFIX, collection_lock

    slept = []
    with collection_lock(store, "garbage collection by test"):
        assert len(store.list_documents(LOCK_PREFIX)) == 1
        with pytest.raises(StoreLockedError, match="garbage-collected.*run again"):
            with write_lease(store, "a snapshot", wait_seconds=1.0, sleep=slept.append):
                pass
        assert store.list_documents(LEASE_PREFIX) == []  # the waiting writer took its lease back
    assert slept and store.list_documents(LOCK_PREFIX) == []
    with write_lease(store, "a snapshot", wait_seconds=0) as key:  # the collection is over: at once
        assert store.get_document(key) is not None


def test_a_collection_killed_midway_does_not_hold_writers(store):
    code = (
        "import sys, time\n"
        "from concord.stores import LocalDirStore\n"
        "from concord.stores.leases import collection_lock\n"
        "with collection_lock(LocalDirStore(sys.argv[1]), 'garbage collection'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(store.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with write_lease(store, "a snapshot", wait_seconds=0) as key:
        assert store.get_document(key) is not None
    collect_garbage(store, grace_seconds=0)  # removes the dead collection's lock
    from concord.stores.leases import LOCK_PREFIX

    assert store.list_documents(LOCK_PREFIX) == []


def test_a_collection_can_wait_for_the_writers_at_work(store, two_snapshots):
    released = []

    def sleep(seconds):  # the writer at work finishes while the collection waits
        if lease.gen_lease is not None:
            lease.gen_lease.__exit__(None, None, None)
            lease.gen_lease = None
        released.append(seconds)

    class lease:
        gen_lease = write_lease(store, "a sync at work")

    lease.gen_lease.__enter__()
    result = collect_garbage(store, grace_seconds=0, wait_seconds=30, sleep=sleep)
    assert released and result.postponed_by == [] and result.deleted_manifests == 1


def test_nested_writers_on_one_store_share_a_lease(store):
    with write_lease(store, "tier add") as outer:
        with write_lease(store, "snapshot") as inner:
            assert inner == outer and len(store.list_documents(LEASE_PREFIX)) == 1
        assert store.get_document(outer) is not None  # the outer writer still holds it
    assert store.list_documents(LEASE_PREFIX) == []


def test_an_empty_ref_is_refused_by_the_core_not_taken_for_none(ckpt, tmp_path, store):
    from concord.errors import InvalidNameError

    with pytest.raises(InvalidNameError):
        snapshot(ckpt, store, ref="", chunk_size=SMALL_CHUNK)
    r = snapshot(ckpt, store, ref="m", chunk_size=SMALL_CHUNK)
    with pytest.raises(InvalidNameError):
        replicate(store, [LocalDirStore(tmp_path / "t")], ref="", root=None)
    assert r.ref == "default/m"
