"""The store contract, run against every implementation (a local folder and S3 on a real moto_server)."""

from __future__ import annotations

import os
import pickle
import threading
import time
import uuid
from functools import partial

import boto3
import pytest

from concord.errors import (
    ChunkNotFoundError,
    IntegrityError,
    InvalidNameError,
    InvalidStoreURIError,
    ManifestNotFoundError,
    RefConflictError,
    StoreAccessError,
    StoreError,
    StoreUnreachableError,
)
from concord.hashing import chunk_id
from concord.stores import open_store
from concord.stores.base import chunk_key
from concord.stores.s3 import S3ObjectStore

pytestmark = pytest.mark.integration


def _chunk(n: int = 0, size: int = 1000) -> tuple[str, bytes]:
    data = os.urandom(size) + n.to_bytes(4, "big")
    return chunk_id(data), data


def _root(label: str) -> str:
    return chunk_id(label.encode())  # any 64-hex digest will do as a snapshot root


def _raw_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


# --------------------------------------------------------------------------- chunks


def test_put_get_has_chunks(any_store):
    chunks = dict(_chunk(i) for i in range(5))
    for cid, data in chunks.items():
        assert any_store.put_chunk(cid, data) is True
    for cid, data in chunks.items():
        assert any_store.get_chunk(cid) == data

    missing = _root("never stored")
    asked = list(chunks)[:3] + [missing]
    assert any_store.has_chunks(asked) == set(list(chunks)[:3])
    assert any_store.has_chunks([]) == set()
    assert any_store.has_chunks([missing]) == set()
    assert set(any_store.iter_chunks()) == set(chunks)


def test_put_chunk_twice_writes_once_and_keeps_the_first(any_store):
    cid, data = _chunk()
    assert any_store.put_chunk(cid, data) is True
    assert any_store.put_chunk(cid, data) is False
    assert any_store.put_chunk(cid, memoryview(data), overwrite=True) is True
    assert any_store.get_chunk(cid) == data


def test_writers_racing_for_one_new_document_one_wins_and_its_bytes_are_kept(any_store):
    # the ledger relies on this: of two rounds written under one number, exactly one is kept whole
    for attempt in range(20):
        key = f"ledger/race/{attempt:06d}.json"
        barrier = threading.Barrier(4, timeout=10)
        won: dict[int, bool] = {}

        def write(i: int, key: str, barrier: threading.Barrier, won: dict[int, bool]) -> None:
            barrier.wait()
            won[i] = any_store.put_document(key, f"writer {i} ".encode() * (1000 + i))

        threads = [threading.Thread(target=write, args=(i, key, barrier, won)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [i for i, ok in won.items() if ok]
        assert len(won) == 4 and len(winners) == 1, (attempt, won)
        assert any_store.get_document(key) == f"writer {winners[0]} ".encode() * (1000 + winners[0])


def test_put_object_never_replaces_without_overwrite(any_store):
    assert any_store._put_object("ledger/t/1.json", b"first", overwrite=False) is True
    assert any_store._put_object("ledger/t/1.json", b"second!", overwrite=False) is False
    assert any_store._get_object("ledger/t/1.json") == b"first"
    assert any_store._put_object("ledger/t/1.json", b"second!", overwrite=True) is True
    assert any_store._get_object("ledger/t/1.json") == b"second!"


def test_put_chunk_refuses_bytes_that_do_not_match_the_id(any_store):
    cid, data = _chunk()
    with pytest.raises(IntegrityError) as info:
        any_store.put_chunk(cid, data + b"tampered")
    assert info.value.expected == cid
    assert any_store.has_chunks([cid]) == set()
    assert any_store._get_object(chunk_key(cid)) is None
    assert list(any_store.iter_chunks()) == []


def test_get_chunk_detects_a_corrupted_object(any_store):
    cid, data = _chunk()
    any_store.put_chunk(cid, data)
    corrupt = bytes([data[0] ^ 0xFF]) + data[1:]
    assert any_store._put_object(chunk_key(cid), corrupt, overwrite=True) is True
    with pytest.raises(IntegrityError) as info:
        any_store.get_chunk(cid)
    assert info.value.actual == chunk_id(corrupt)
    assert any_store.get_chunk(cid, verify=False) == corrupt


def test_missing_chunk_raises_chunk_not_found(any_store):
    with pytest.raises(ChunkNotFoundError) as info:
        any_store.get_chunk(_root("absent"))
    assert isinstance(info.value, KeyError)
    assert any_store.uri in str(info.value)


def test_delete_chunk(any_store):
    cid, data = _chunk()
    any_store.put_chunk(cid, data)
    any_store.delete_chunk(cid)
    assert any_store.has_chunks([cid]) == set()
    any_store.delete_chunk(cid)  # deleting what is not there is fine


def test_chunk_stats_give_size_and_age(any_store):
    before = time.time()
    chunks = dict(_chunk(i, size=100 * (i + 1)) for i in range(3))
    for cid, data in chunks.items():
        any_store.put_chunk(cid, data)
    any_store._put_object(f"chunks/{next(iter(chunks))[:2]}/.tmp-{uuid.uuid4().hex}", b"half written", overwrite=False)
    stats = {cid: (size, mtime) for cid, size, mtime in any_store.iter_chunk_stats()}
    assert {cid: size for cid, (size, _) in stats.items()} == {cid: len(data) for cid, data in chunks.items()}
    # S3 keeps whole seconds; a little slack for the clocks of two processes
    assert all(before - 5 <= mtime <= time.time() + 5 for _, mtime in stats.values())


def test_list_stats_is_relative_to_the_store_root(any_store):
    any_store.put_document("ledger/acme/000001.json", b"12345")
    assert [(k, n) for k, n, _ in any_store._list_stats("ledger/")] == [("ledger/acme/000001.json", 5)]
    assert list(any_store._list_stats("nothing-here/")) == []


def test_list_document_stats_gives_each_documents_size_and_age(any_store):
    before = time.time()
    a, b = f"signatures/{_root('a')}/{'1' * 64}.sig", f"signatures/{_root('b')}/{'2' * 64}.sig"
    any_store.put_document(b, b"second")
    any_store.put_document(a, b"first!!")
    any_store.put_document("signaturesX/other", b"not under the prefix")
    any_store.put_document("ledger/acme/000001.json", b"12345")
    stats = any_store.list_document_stats("signatures")
    assert [(k, n) for k, n, _ in stats] == [(a, 7), (b, 6)]  # sorted, as list_documents
    assert [k for k, _, _ in stats] == any_store.list_documents("signatures")
    # S3 keeps whole seconds; a little slack for the clocks of two processes
    assert all(before - 5 <= mtime <= time.time() + 5 for _, _, mtime in stats)
    assert any_store.list_document_stats("signatures/") == stats
    assert [k for k, _, _ in any_store.list_document_stats(f"signatures/{_root('a')}")] == [a]
    assert any_store.list_document_stats("nothing-here") == []
    with pytest.raises(InvalidNameError):
        any_store.list_document_stats("chunks")  # documents only


def test_s3_list_document_stats_reads_the_time_from_the_listing(s3_store, moto_server):
    s3_store.put_document("leases/w1", b"lease")
    head = _raw_client(moto_server).head_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/leases/w1")
    assert s3_store.list_document_stats("leases") == [("leases/w1", 5, head["LastModified"].timestamp())]


def test_iter_chunks_ignores_temp_and_misplaced_files(any_store):
    cid, data = _chunk()
    any_store.put_chunk(cid, data)
    other, _ = _chunk(1)
    any_store._put_object(f"chunks/{cid[:2]}/.tmp-{uuid.uuid4().hex}", b"half written", overwrite=False)
    any_store._put_object(f"chunks/{cid[:2]}/{cid}.partial", b"half written", overwrite=False)
    any_store._put_object(f"chunks/zz/{other}", b"wrong folder", overwrite=False)
    assert list(any_store.iter_chunks()) == [cid]


# --------------------------------------------------------------------------- manifests and documents


def test_manifests_put_get_has_iter(any_store):
    roots = {_root(f"snapshot {i}"): f'{{"n": {i}}}'.encode() for i in range(3)}
    for root, doc in roots.items():
        assert any_store.put_manifest(root, doc) is True
        assert any_store.put_manifest(root, b"something else") is False
    for root, doc in roots.items():
        assert any_store.has_manifest(root)
        assert any_store.get_manifest_bytes(root) == doc
    assert set(any_store.iter_manifests()) == set(roots)
    absent = _root("no such snapshot")
    assert not any_store.has_manifest(absent)
    with pytest.raises(ManifestNotFoundError):
        any_store.get_manifest_bytes(absent)


def test_manifest_stats_and_delete(any_store):
    keep, drop = _root("keep"), _root("drop")
    any_store.put_manifest(keep, b'{"keep": 1}')
    any_store.put_manifest(drop, b"{}")
    assert sorted((r, n) for r, n, _ in any_store.iter_manifest_stats()) == sorted([(keep, 11), (drop, 2)])
    any_store.delete_manifest(drop)
    assert not any_store.has_manifest(drop) and any_store.has_manifest(keep)
    any_store.delete_manifest(drop)  # deleting what is not there is fine
    assert [r for r, _, _ in any_store.iter_manifest_stats()] == [keep]
    with pytest.raises(ValueError, match="64 lowercase hex"):
        any_store.delete_manifest("../refs/default/model")


def test_delete_document(any_store):
    any_store.put_document("gc/leases/abc", b"{}")
    any_store.delete_document("gc/leases/abc")
    assert any_store.get_document("gc/leases/abc") is None
    any_store.delete_document("gc/leases/abc")
    with pytest.raises(InvalidNameError):
        any_store.delete_document("refs/default/model")


def test_documents_round_trip(any_store):
    assert any_store.put_document("ledger/acme/0001.json", b"{}") is True
    assert any_store.put_document("ledger/acme/0002.json", b"[]") is True
    assert any_store.put_document("ledger/acme/0001.json", b"x") is False
    assert any_store.get_document("ledger/acme/0001.json") == b"{}"
    assert any_store.get_document("ledger/acme/9999.json") is None
    assert any_store.list_documents("ledger/acme") == ["ledger/acme/0001.json", "ledger/acme/0002.json"]


# --------------------------------------------------------------------------- refs


def test_ref_create_advance_and_history(any_store):
    a, b, c = _root("a"), _root("b"), _root("c")
    assert any_store.read_ref("model") is None

    created = any_store.cas_ref("model", None, a, "first")
    assert (created.root, created.version) == (a, 1)
    advanced = any_store.cas_ref("default/model", a, b, "second")
    assert (advanced.root, advanced.version) == (b, 2)
    any_store.cas_ref("model", b, c, "third")

    ref = any_store.read_ref("model")
    assert ref.name == "default/model"
    assert [e.root for e in ref.history] == [a, b, c]
    assert [e.version for e in ref.history] == [1, 2, 3]
    assert [e.message for e in ref.history] == ["first", "second", "third"]


def test_ref_conflict_leaves_the_ref_unchanged(any_store):
    a, b, c = _root("a"), _root("b"), _root("c")
    any_store.cas_ref("team/model", None, a)
    any_store.cas_ref("team/model", a, b)
    before = any_store.read_ref("team/model")

    with pytest.raises(RefConflictError) as info:
        any_store.cas_ref("team/model", a, c)  # stale expectation
    assert (info.value.expected, info.value.actual) == (a, b)
    with pytest.raises(RefConflictError):
        any_store.cas_ref("team/model", None, c)  # "must not exist", but it does
    assert any_store.read_ref("team/model") == before


def test_ref_update_is_idempotent(any_store):
    a, b = _root("a"), _root("b")
    any_store.cas_ref("model", None, a)
    first = any_store.cas_ref("model", a, b)
    again = any_store.cas_ref("model", a, b)  # a retry after the first one went through
    assert again == first
    assert any_store.read_ref("model").version == 2


def test_list_refs(any_store):
    assert any_store.list_refs() == []
    for name in ("zeta", "team/alpha", "team/beta", "other/x"):
        any_store.cas_ref(name, None, _root(name))
    assert any_store.list_refs() == ["default/zeta", "other/x", "team/alpha", "team/beta"]


def test_delete_ref_only_from_the_expected_root(any_store):
    a, b = _root("a"), _root("b")
    assert any_store.delete_ref("team/model", a) is False  # absent: nothing to do
    any_store.cas_ref("team/model", None, a)
    any_store.cas_ref("team/model", a, b)
    with pytest.raises(RefConflictError) as info:
        any_store.delete_ref("team/model", a)
    assert (info.value.expected, info.value.actual) == (a, b)
    assert b in str(info.value)
    assert any_store.read_ref("team/model").root == b

    assert any_store.delete_ref("team/model", b) is True
    assert any_store.read_ref("team/model") is None
    assert any_store.list_refs() == []
    assert any_store.delete_ref("team/model", b) is False  # a retried delete is harmless
    again = any_store.cas_ref("team/model", None, a)  # the name can be used again, history anew
    assert (again.version, [e.root for e in again.history]) == (1, [a])


def test_delete_ref_refuses_bad_input(any_store):
    with pytest.raises(ValueError, match="64 lowercase hex"):
        any_store.delete_ref("model", "not-a-root")
    with pytest.raises(InvalidNameError):
        any_store.delete_ref("a/b/c", _root("a"))


@pytest.mark.timeout(120)
def test_delete_ref_racing_a_move_has_exactly_one_winner(any_store):
    a, b = _root("a"), _root("b")
    for attempt in range(5):
        name = f"race/model-{attempt}"
        any_store.cas_ref(name, None, a)
        barrier = threading.Barrier(2)
        outcomes: dict[str, object] = {}

        def attempt_it(what: str, call, barrier: threading.Barrier, outcomes: dict[str, object]) -> None:
            barrier.wait()
            try:
                outcomes[what] = call()
            except Exception as exc:  # recorded, so the assertion below shows it
                outcomes[what] = exc

        threads = [
            threading.Thread(target=attempt_it, args=("delete", partial(any_store.delete_ref, name, a), barrier, outcomes)),
            threading.Thread(target=attempt_it, args=("move", partial(any_store.cas_ref, name, a, b), barrier, outcomes)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = any_store.read_ref(name)
        if outcomes["delete"] is True:  # the delete went first: the move found no ref
            assert isinstance(outcomes["move"], RefConflictError) and after is None, outcomes
        else:  # the move went first: the delete found b and left it
            assert isinstance(outcomes["delete"], RefConflictError), outcomes
            assert outcomes["delete"].actual == b and after.root == b


def test_stores_without_archive_storage_hold_every_chunk_readable(any_store):
    cid, data = _chunk()
    any_store.put_chunk(cid, data)
    absent = _root("absent")
    assert any_store.archive is False
    assert any_store.chunk_states([cid, absent, cid]) == {cid: "available", absent: "missing"}
    assert any_store.chunk_states([]) == {}
    assert any_store.request_restore([cid]) == 0  # nothing to restore
    with pytest.raises(ValueError, match="at least 1"):
        any_store.request_restore([cid], days=0)
    with pytest.raises(ValueError, match="Standard"):
        any_store.request_restore([cid], tier="fast")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        any_store.chunk_states(["nope"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("from_existing", [False, True], ids=["create", "advance"])
def test_racing_cas_ref_has_exactly_one_winner(any_store, from_existing):
    start = _root("start") if from_existing else None
    if start is not None:
        any_store.cas_ref("race/model", None, start)
    contenders = [_root(f"contender {i}") for i in range(8)]
    barrier = threading.Barrier(len(contenders))
    outcomes: dict[str, object] = {}

    def contend(new: str) -> None:
        barrier.wait()
        try:
            outcomes[new] = any_store.cas_ref("race/model", start, new, f"by {new[:8]}")
        except RefConflictError as exc:
            outcomes[new] = exc
        except Exception as exc:  # recorded, so the assertion below shows it
            outcomes[new] = exc

    threads = [threading.Thread(target=contend, args=(new,)) for new in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    winners = [new for new, out in outcomes.items() if not isinstance(out, Exception)]
    losers = [out for out in outcomes.values() if isinstance(out, Exception)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(out, RefConflictError) for out in losers), losers
    ref = any_store.read_ref("race/model")
    assert ref.root == winners[0]
    assert [e.root for e in ref.history] == ([start] if start else []) + winners


# --------------------------------------------------------------------------- S3 specifics


def test_s3_store_settings():
    store = S3ObjectStore("my-bucket", endpoint_url="http://127.0.0.1:9")
    assert store.uri == "s3://my-bucket"
    assert str(store) == "s3://my-bucket"
    assert store.parallelism == 16
    assert S3ObjectStore("my-bucket", "a/b/", endpoint_url="http://127.0.0.1:9").uri == "s3://my-bucket/a/b"


@pytest.mark.parametrize(
    "bucket",
    ["", "ab", "a" * 64, "Upper", "under_score", "-dash", "dot.", "a..b", "a.-b", "192.168.1.1", "xn--abc", "b-s3alias"],
)
def test_s3_refuses_invalid_bucket_names(bucket):
    with pytest.raises(InvalidStoreURIError):
        S3ObjectStore(bucket)


@pytest.mark.parametrize("prefix", ["a//b", "a/./b", "../a", "a/..", "."])
def test_s3_refuses_invalid_prefixes(prefix):
    with pytest.raises(InvalidStoreURIError):
        S3ObjectStore("good-bucket", prefix)


def test_s3_unreachable_endpoint_fails_fast(aws_credentials):
    store = S3ObjectStore(f"concord-test-{uuid.uuid4().hex[:12]}", "p", endpoint_url="http://127.0.0.1:1")
    cid, data = _chunk()
    for call in (lambda: store.put_chunk(cid, data), lambda: store.has_chunks([cid, _root("x")])):
        started = time.monotonic()
        with pytest.raises(StoreUnreachableError) as info:
            call()
        assert time.monotonic() - started < 15
        assert isinstance(info.value, ConnectionError)
        assert "s3://" in str(info.value)
        assert not type(info.value.__cause__).__module__.startswith("concord")  # cause kept


def test_s3_missing_bucket_without_create(moto_server):
    bucket = f"concord-missing-{uuid.uuid4().hex[:12]}"
    store = S3ObjectStore(bucket, endpoint_url=moto_server)
    cid, data = _chunk()
    with pytest.raises(StoreAccessError, match="create_bucket=True"):
        store.put_chunk(cid, data)
    with pytest.raises(StoreAccessError):
        store.has_chunks([cid])
    names = [b["Name"] for b in _raw_client(moto_server).list_buckets().get("Buckets", [])]
    assert bucket not in names


def test_s3_create_bucket_is_idempotent(moto_server):
    bucket = f"concord-test-{uuid.uuid4().hex[:12]}"
    first = S3ObjectStore(bucket, "one", endpoint_url=moto_server, create_bucket=True)
    second = S3ObjectStore(bucket, "two", endpoint_url=moto_server, create_bucket=True)
    cid, data = _chunk()
    assert first.put_chunk(cid, data)
    assert second.has_chunks([cid]) == set()  # same bucket, separate prefixes
    assert second.put_chunk(cid, data)
    keys = sorted(o["Key"] for o in _raw_client(moto_server).list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [f"one/{chunk_key(cid)}", f"two/{chunk_key(cid)}"]


def test_s3_storage_class_is_applied_to_chunks_only(moto_server):
    store = S3ObjectStore(
        f"concord-test-{uuid.uuid4().hex[:12]}",
        endpoint_url=moto_server,
        create_bucket=True,
        storage_class="STANDARD_IA",
    )
    assert store.archive is False
    cid, data = _chunk()
    store.put_chunk(cid, data)
    root = _root("snapshot")
    store.put_manifest(root, b"{}")
    store.cas_ref("model", None, root)
    store.put_document("ledger/acme/000001.json", b"{}")
    client = _raw_client(moto_server)
    head = client.head_object(Bucket=store.bucket, Key=chunk_key(cid))
    assert head["StorageClass"] == "STANDARD_IA"
    assert store.get_chunk(cid) == data
    for key in (f"manifests/{root}.json", "refs/default/model", "ledger/acme/000001.json"):
        assert client.head_object(Bucket=store.bucket, Key=key).get("StorageClass", "STANDARD") == "STANDARD", key


def test_s3_list_stats_reads_size_and_time_from_the_listing(s3_store, moto_server):
    cid, data = _chunk(size=321)
    s3_store.put_chunk(cid, data)
    head = _raw_client(moto_server).head_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/{chunk_key(cid)}")
    assert list(s3_store.iter_chunk_stats()) == [(cid, len(data), head["LastModified"].timestamp())]


def test_s3_other_service_errors_become_store_errors(moto_server):
    store = S3ObjectStore(
        f"concord-test-{uuid.uuid4().hex[:12]}",
        endpoint_url=moto_server,
        create_bucket=True,
        storage_class="NOT_A_CLASS",
    )
    cid, data = _chunk()
    with pytest.raises(StoreError) as info:
        store.put_chunk(cid, data)
    assert not isinstance(info.value, (StoreAccessError, StoreUnreachableError))
    assert "InvalidStorageClass" in str(info.value)


def test_open_store_s3_uses_aws_endpoint_url(moto_server, s3_store, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    store = open_store(f"{s3_store.uri}/")
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.endpoint_url) == (s3_store.bucket, s3_store.prefix, moto_server)
    cid, data = _chunk()
    assert store.put_chunk(cid, data)
    assert s3_store.get_chunk(cid) == data


def test_endpoint_argument_beats_the_environment(moto_server, s3_store, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    store = S3ObjectStore(s3_store.bucket, s3_store.prefix, endpoint_url=moto_server)
    cid, data = _chunk()
    assert store.put_chunk(cid, data)
    assert s3_store.has_chunks([cid]) == {cid}


def test_s3_store_pickles_as_its_settings(s3_store):
    cid, data = _chunk()
    s3_store.put_chunk(cid, data)
    copy = pickle.loads(pickle.dumps(s3_store))
    assert copy.uri == s3_store.uri
    assert copy.get_chunk(cid) == data
    copy.close()


def test_s3_has_chunks_for_many_ids(s3_store):
    chunks = dict(_chunk(i, size=64) for i in range(40))
    present = list(chunks)[::2]
    for cid in present:
        s3_store.put_chunk(cid, chunks[cid])
    assert s3_store.has_chunks(chunks) == set(present)
