"""Store configurations on S3 (a real moto_server): compressed and encrypted stores in a bucket,
sync to and from folders, GC by keyed names, and server-side encryption on every object."""

from __future__ import annotations

import time
import uuid

import pytest
from toy_checkpoints import SMALL_CHUNK, files_equal, make_checkpoint

from concord.errors import StoreKeyError
from concord.snapshots.gc import collect_garbage
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore
from concord.stores.config import CONFIG_KEY, configure
from concord.stores.s3 import S3ObjectStore

pytestmark = pytest.mark.timeout(180)
KEY = bytes(range(1, 33))


def _beside(store: S3ObjectStore, **kw) -> S3ObjectStore:
    """Another store in the same bucket, under a fresh prefix."""
    return S3ObjectStore(store.bucket, f"other-{uuid.uuid4().hex[:8]}", endpoint_url=store.endpoint_url, **kw)


def test_an_encrypted_compressed_bucket_store_round_trips_with_folders(s3_store, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", layers=2)
    s3_store.unlock(KEY)
    configure(s3_store, compress="auto", encrypt=True)
    plain = LocalDirStore(tmp_path / "plain")
    root = snapshot(ckpt, plain, chunk_size=SMALL_CHUNK, ref="m").root
    (r,) = replicate(plain, [s3_store], ref="m")
    assert r.root == root and r.bytes_sent < r.raw_bytes_sent
    # a second encrypted store with the same key and settings takes the sealed bytes as they are
    twin = _beside(s3_store)
    twin.unlock(KEY)
    configure(twin, compress="auto", encrypt=True)
    (t,) = replicate(s3_store, [twin], ref="m")
    assert t.bytes_sent == r.bytes_sent
    # and back to a fresh plain folder, identical
    back = LocalDirStore(tmp_path / "back")
    replicate(twin, [back], ref="m")
    restore(back, load_manifest(back, root), tmp_path / "out")
    assert files_equal(ckpt, tmp_path / "out")
    assert verify(s3_store).ok and verify(twin).ok
    # nothing in the bucket names a chunk id or holds a tensor name
    ids = set(load_manifest(plain, root).chunk_lengths())
    client = s3_store._client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_store.bucket, Prefix=s3_store.prefix)["Contents"]]
    assert not any(k.rsplit("/", 1)[-1] in ids for k in keys)
    bodies = [client.get_object(Bucket=s3_store.bucket, Key=k)["Body"].read() for k in keys if "/manifests/" in k]
    assert bodies and not any(b"layers.0.attn.q.weight" in b for b in bodies)
    # without the key: refused before anything is read
    with pytest.raises(StoreKeyError):
        S3ObjectStore(s3_store.bucket, s3_store.prefix, endpoint_url=s3_store.endpoint_url).read_ref("m")


def test_gc_on_an_encrypted_bucket_store_deletes_only_unreachable_chunks(s3_store, tmp_path):
    s3_store.unlock(KEY)
    configure(s3_store, compress="zstd", encrypt=True)
    one = make_checkpoint(tmp_path / "one", layers=1, seed=1)
    two = make_checkpoint(tmp_path / "two", layers=1, seed=2)
    snapshot(one, s3_store, chunk_size=SMALL_CHUNK, ref="a")
    keep = snapshot(two, s3_store, chunk_size=SMALL_CHUNK, ref="b").root
    s3_store.delete_ref("default/a", s3_store.read_ref("a").root)
    r = collect_garbage(s3_store, grace_seconds=0, now=time.time() + 120)
    assert r.deleted_chunks > 0 and r.deleted_manifests == 1
    restore(s3_store, load_manifest(s3_store, keep), tmp_path / "out")
    assert files_equal(two, tmp_path / "out")


@pytest.mark.parametrize("sse,kms", [("AES256", None), ("aws:kms", "alias/concord-test")])
def test_server_side_encryption_is_applied_to_every_object(s3_store, tmp_path, sse, kms):
    store = _beside(s3_store, sse=sse, sse_kms_key_id=kms)
    configure(store, compress="auto")
    snapshot(make_checkpoint(tmp_path / "ckpt", layers=1), store, chunk_size=SMALL_CHUNK, ref="m")
    client = store._client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)["Contents"]]
    kinds = {k[len(store.prefix) + 1 :].split("/", 1)[0] for k in keys}
    assert {"chunks", "manifests", "refs", CONFIG_KEY} <= kinds
    for k in keys:
        head = client.head_object(Bucket=store.bucket, Key=k)
        assert head.get("ServerSideEncryption") == sse, k
        if kms:
            assert kms in head.get("SSEKMSKeyId", ""), k


def test_the_s3_store_block_takes_sse_kms_and_the_store_key_from_a_secret_block(s3_store, tmp_path):
    from prefect.blocks.system import Secret

    from concord_pipelines.blocks.stores import S3Store

    block = S3Store(
        bucket=s3_store.bucket,
        prefix=f"block-{uuid.uuid4().hex[:8]}",
        endpoint_url=s3_store.endpoint_url,
        server_side_encryption="aws:kms",
        sse_kms_key_id="alias/concord-block",
        store_key=Secret(value=KEY.hex()),
    )
    store = block.get_store()
    configure(store, compress="auto", encrypt=True)
    ckpt = make_checkpoint(tmp_path / "ckpt", layers=1)
    root = snapshot(ckpt, store, chunk_size=SMALL_CHUNK, ref="m").root
    client = store._client()
    key = client.list_objects_v2(Bucket=store.bucket, Prefix=f"{store.prefix}/chunks/")["Contents"][0]["Key"]
    head = client.head_object(Bucket=store.bucket, Key=key)
    assert head["ServerSideEncryption"] == "aws:kms" and "alias/concord-block" in head["SSEKMSKeyId"]
    assert KEY.hex() not in repr(block) and KEY.hex() not in str(block.model_dump())
    restore(store, load_manifest(store, root), tmp_path / "out")
    assert files_equal(ckpt, tmp_path / "out")
    with pytest.raises(ValueError, match="sse_kms_key_id goes with server_side_encryption='aws:kms'"):
        S3Store(bucket=s3_store.bucket, sse_kms_key_id="alias/x")
