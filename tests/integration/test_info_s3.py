"""``concord info`` on a bucket store (a real moto_server): an encrypted, compressed store's stored
bytes are the sizes the bucket lists, its raw bytes the manifests', an orphan is counted apart,
and each chunk's frame is read with a ranged GET of its first bytes."""

from __future__ import annotations

import json
import os

import pytest
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.cli import main
from concord.hashing import chunk_id
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.stores.cipher import write_key_file
from concord.stores.config import configure

pytestmark = pytest.mark.timeout(120)
KEY = bytes(range(7, 39))


def test_info_of_an_encrypted_compressed_bucket_store(s3_store, moto_server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("CONCORD_NO_PROGRESS", "1")
    monkeypatch.delenv("CONCORD_KEY_FILE", raising=False)
    key_file = tmp_path / "s3.key"
    write_key_file(str(key_file), KEY)
    s3_store.unlock(KEY)
    configure(s3_store, compress="auto", encrypt=True)
    plain = LocalDirStore(tmp_path / "plain")
    root = snapshot(make_checkpoint(tmp_path / "ckpt", layers=2), plain, chunk_size=SMALL_CHUNK, ref="m").root
    replicate(plain, [s3_store], ref="m")
    orphan = os.urandom(5000)
    assert s3_store.put_chunk(chunk_id(orphan), orphan)

    client = s3_store._client()
    listed = client.list_objects_v2(Bucket=s3_store.bucket, Prefix=f"{s3_store.prefix}/chunks/")["Contents"]
    sizes = {o["Key"].rsplit("/", 1)[-1]: o["Size"] for o in listed}
    orphan_name = s3_store.chunk_object_name(chunk_id(orphan))
    raw = sum(load_manifest(plain, root).chunk_lengths().values())

    assert main(["info", s3_store.uri, "--json", "--key-file", str(key_file)]) == 0
    u = json.loads(capsys.readouterr().out)
    assert u["store"] == s3_store.uri and u["encryption"]["key_id"] == s3_store.encoding().cipher.key_id
    assert (u["refs"], u["manifests"], u["missing_chunks"]) == (1, 1, 0)
    assert u["chunks"]["count"] == len(sizes) and u["chunks"]["stored_bytes"] == sum(sizes.values())
    assert u["named"] == {"count": len(sizes) - 1, "stored_bytes": sum(sizes.values()) - sizes[orphan_name], "raw_bytes": raw}
    assert u["orphans"] == {"count": 1, "stored_bytes": sizes[orphan_name], "raw_bytes": None}
    assert u["collectable"]["count"] == 1
    assert u["frames"]["byte_planes"]["count"] > 0 and "unreadable" not in u["frames"]
    assert sum(f["count"] for f in u["frames"].values()) == len(sizes)
