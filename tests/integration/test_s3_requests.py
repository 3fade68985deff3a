"""How many S3 requests a snapshot and a sync send, counted by an HTTP proxy of the tests' own in
front of a real moto_server: a new chunk is one PUT (its ``If-None-Match: *`` answer says whether
it was there), what a store holds is learned from listings (one page per 1,000 keys), and an
unchanged re-snapshot sends at most one chunk request per 100 chunks."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from faultproxy import FaultProxy

from concord.hashing import chunk_id
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.snapshots.verify import verify
from concord.stores.local import LocalDirStore
from concord.stores.s3 import S3ObjectStore

FILES = 600


@pytest.fixture
def proxy(moto_server):
    with FaultProxy(moto_server) as p:
        yield p


def _store(proxy: FaultProxy, bucket: str | None = None, prefix: str = "store") -> S3ObjectStore:
    store = S3ObjectStore(bucket or f"concord-req-{uuid.uuid4().hex[:12]}", prefix, endpoint_url=proxy.url, create_bucket=True)
    store.list_refs()  # the bucket exists from here on
    return store


def _tally(log: list[tuple[str, str]]) -> Counter:
    """``(operation, area)`` → count: operation HEAD, GET, PUT, DELETE or LIST; area ``chunks``
    for a chunk object or a listing under ``chunks/``, else ``other``."""
    out: Counter = Counter()
    for method, path in log:
        parts = urlsplit(path)
        query = parse_qs(parts.query)
        if method == "GET" and query.get("list-type") == ["2"]:
            op, where = "LIST", query.get("prefix", [""])[0]
        else:
            op, where = method, unquote(parts.path)
        out[op, "chunks" if "chunks/" in where else "other"] += 1
    return out


def _chunk_requests(t: Counter) -> int:
    return sum(n for (_, area), n in t.items() if area == "chunks")


def _other_requests(t: Counter) -> int:
    return sum(n for (_, area), n in t.items() if area == "other")


def _folder(tmp_path: Path, n: int = FILES) -> Path:
    src = tmp_path / "many"
    src.mkdir()
    for i in range(n):
        (src / f"f{i:04d}.bin").write_bytes(os.urandom(200) + i.to_bytes(4, "big"))
    return src


def test_a_fresh_snapshot_is_one_put_per_chunk_and_an_unchanged_one_lists(proxy, tmp_path):
    store = _store(proxy)
    src = _folder(tmp_path)
    start = len(proxy.log)
    first = snapshot(src, store, ref="many/files")
    fresh = _tally(proxy.log[start:])
    chunks = len(first.manifest.chunk_lengths())
    assert chunks == FILES
    assert fresh["PUT", "chunks"] == chunks  # one request per new chunk ...
    assert fresh["HEAD", "chunks"] == 0  # ... no HEAD before or after it
    assert _chunk_requests(fresh) <= chunks + 2  # and a listing page or two
    assert _other_requests(fresh) <= 15  # config, lease, lock listing, manifest, ref: not per chunk

    start = len(proxy.log)
    again = snapshot(src, store, ref="many/files")
    unchanged = _tally(proxy.log[start:])
    assert again.root == first.root
    assert _chunk_requests(unchanged) <= chunks // 100 + 1, unchanged
    assert unchanged["PUT", "chunks"] == 0
    assert _other_requests(unchanged) <= 15, unchanged
    assert verify(store, ref="many/files").ok


def test_a_sync_to_s3_puts_each_missing_chunk_once_and_asks_nothing_per_chunk(proxy, tmp_path):
    local = LocalDirStore(tmp_path / "local")
    src = _folder(tmp_path, 300)
    first = snapshot(src, local, ref="many/files")
    target = _store(proxy)
    start = len(proxy.log)
    result = replicate(local, [target], ref="many/files")[0]
    sent = _tally(proxy.log[start:])
    assert result.chunks_sent == 300
    assert sent["PUT", "chunks"] == 300 and sent["HEAD", "chunks"] == 0 and sent["GET", "chunks"] == 0
    assert _chunk_requests(sent) <= 300 + 2
    start = len(proxy.log)
    assert replicate(local, [target], ref="many/files")[0].chunks_sent == 0
    assert _chunk_requests(_tally(proxy.log[start:])) <= 1
    assert verify(target, root=first.root).ok


def test_a_chunk_written_by_another_writer_after_the_listing_is_not_written_again(proxy):
    store = _store(proxy)
    other = S3ObjectStore(store.bucket, store.prefix, endpoint_url=proxy.url)
    data = os.urandom(1000)
    cid = chunk_id(data)
    with store.inventory():
        assert store.has_chunks([cid]) == set()  # listed: not there
        assert other.put_chunk(cid, data) is True  # someone else writes it meanwhile
        start = len(proxy.log)
        assert store.put_chunk(cid, data) is False  # the conditional PUT's 412 says it is there
        assert _tally(proxy.log[start:]) == Counter({("PUT", "chunks"): 1})
        assert store.has_chunks([cid]) == {cid}
    assert store.get_chunk(cid) == data


def test_a_chunk_deleted_inside_an_inventory_is_not_reported_present(proxy):
    store = _store(proxy)
    data = os.urandom(500)
    cid = chunk_id(data)
    store.put_chunk(cid, data)
    with store.inventory():
        assert store.has_chunks([cid]) == {cid}
        store.delete_chunk(cid)
        assert store.has_chunks([cid]) == set()
        assert store.put_chunk(cid, data) is True
    assert store.has_chunks([cid]) == {cid}


def test_a_big_question_outside_an_operation_is_answered_by_listing(proxy):
    store = _store(proxy)
    ids = []
    for i in range(150):
        data = i.to_bytes(4, "big") * 10
        store.put_chunk(chunk_id(data), data)
        ids.append(chunk_id(data))
    absent = [chunk_id(b"absent %d" % i) for i in range(50)]
    start = len(proxy.log)
    assert store.has_chunks(ids + absent) == set(ids)
    asked = _tally(proxy.log[start:])
    assert asked["HEAD", "chunks"] == 0 and asked["LIST", "chunks"] == 1


def test_a_store_that_looks_huge_is_asked_a_head_per_chunk_until_a_region_is_worth_listing(proxy):
    """1,001 objects whose names all start with zeros look, from the first page, like a store of
    hundreds of millions of chunks: a question elsewhere is a HEAD, until as many questions fell in
    one region as it is expected to take pages; then that region is listed once."""
    from concurrent.futures import ThreadPoolExecutor

    from concord.stores.base import chunk_key

    store = _store(proxy)
    names = [f"{i:07x}" + "0" * 57 for i in range(1001)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store._put_object(chunk_key(n), b"x", overwrite=True), names))
    with store.inventory():
        start = len(proxy.log)
        assert store._exists_many([chunk_key(names[0]), chunk_key(names[999])]) == [True, True]
        assert _tally(proxy.log[start:]) == Counter({("LIST", "chunks"): 1})  # the first page alone
        start = len(proxy.log)
        assert store._exists_many([chunk_key(names[1000])]) == [True]  # past the first page: asked
        assert _tally(proxy.log[start:]) == Counter({("HEAD", "chunks"): 1})
        region = [chunk_key("abcd" + f"{i:02x}" + "0" * 58) for i in range(12)]
        start = len(proxy.log)
        for key in region:
            assert store._exists_many([key]) == [False]
        asked = _tally(proxy.log[start:])
        assert asked[("LIST", "chunks")] == 1 and 1 <= asked[("HEAD", "chunks")] < len(region) - 1, asked
        start = len(proxy.log)
        assert store._exists_many(region) == [False] * len(region)  # the region is known now
        assert len(proxy.log) == start
