"""A sync to many S3 stores of one endpoint against a real moto_server: the stores share one
client (one service model, one connection pool) whatever their number, threads stay flat, each
source chunk is read once and each target gets one PUT per chunk."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from counting import CountingStore, ThreadPeak
from faultproxy import FaultProxy

from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores.s3 import S3ObjectStore

TARGETS = 12
FILES = 24


@pytest.fixture
def proxy(moto_server):
    with FaultProxy(moto_server) as p:
        yield p


def _bucket() -> str:
    return f"concord-fan-{uuid.uuid4().hex[:12]}"


def test_stores_of_one_endpoint_share_one_client(moto_server):
    a = S3ObjectStore(_bucket(), "a", endpoint_url=moto_server, create_bucket=True)
    b = S3ObjectStore(_bucket(), "b", endpoint_url=moto_server, create_bucket=True)
    other = S3ObjectStore(_bucket(), endpoint_url=moto_server, create_bucket=True, aws_access_key_id="other", aws_secret_access_key="other")
    fewer = S3ObjectStore(_bucket(), endpoint_url=moto_server, create_bucket=True, connections=64)
    assert a._client() is b._client()
    assert other._client() is not a._client()  # other credentials: a client of their own
    assert fewer._client() is not a._client()  # another pool size
    a.put_document("notes/x", b"1")
    a.close()  # lets go of the client; b still uses it, and a builds on its next request
    assert b.list_refs() == []
    assert a.get_document("notes/x") == b"1"


def test_sync_to_many_buckets_keeps_clients_and_threads_flat(proxy, tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(FILES):
        (folder / f"f{i:02d}.bin").write_bytes(bytes([i]) * (70_000 + i))
    source = CountingStore(tmp_path / "source")
    snapshot(folder, source, ref="models/fan")
    targets = [S3ObjectStore(_bucket(), "store", endpoint_url=proxy.url, create_bucket=True) for _ in range(TARGETS)]
    start = len(proxy.log)
    with ThreadPeak() as threads:
        results = replicate(source, targets, ref="models/fan")
    log = proxy.log[start:]
    assert [r.chunks_sent for r in results] == [FILES] * TARGETS
    assert len({id(t._client()) for t in targets}) == 1
    assert threads.peak <= 64, f"{threads.peak} threads for {TARGETS} targets"
    assert len(source.reads) == FILES and set(source.reads.values()) == {1}  # each source chunk read once
    chunk_puts = Counter(path.split("/")[1] for method, path in log if method == "PUT" and "/chunks/" in path)
    assert sorted(chunk_puts.values()) == [FILES] * TARGETS  # one PUT per chunk per target
    for t in targets:
        assert t.read_ref("models/fan").root == results[0].root
