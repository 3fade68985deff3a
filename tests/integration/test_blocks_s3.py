"""Saved store blocks, loaded through ``open_store("block:NAME")`` from a real Prefect API, on a real moto_server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from prefect import flow
from prefect.blocks.system import Secret
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_RESULTS_LOCAL_STORAGE_PATH,
    PREFECT_SERVER_ANALYTICS_ENABLED,
    temporary_settings,
)
from prefect.testing.utilities import prefect_test_harness

from concord.errors import InvalidStoreURIError, RefConflictError
from concord.hashing import chunk_id
from concord.stores import open_store
from concord.stores.base import chunk_key
from concord.stores.local import LocalDirStore
from concord.stores.s3 import S3ObjectStore
from concord_pipelines.blocks import LocalStore, S3Store, load_store_block

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def _blocks_harness(tmp_path_factory):
    """A temporary Prefect API (a real server process on SQLite) for this module's blocks."""
    results = tmp_path_factory.mktemp("prefect-results")
    with temporary_settings(
        updates={
            PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(results),
            PREFECT_SERVER_ANALYTICS_ENABLED: False,
        }
    ):
        with prefect_test_harness(server_startup_timeout=60):
            yield


def _name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:10]}"


def _chunk(label: str) -> tuple[str, bytes]:
    data = label.encode() + os.urandom(2048)
    return chunk_id(data), data


def _roundtrip(store, label: str) -> None:
    """Write and read back a chunk, a manifest and a ref; a second CAS from a stale root must lose."""
    cid, data = _chunk(label)
    assert store.put_chunk(cid, data) is True
    assert store.put_chunk(cid, data) is False
    assert store.get_chunk(cid) == data
    assert store.has_chunks([cid, chunk_id(b"absent")]) == {cid}

    root_a, root_b = chunk_id(f"{label}-a".encode()), chunk_id(f"{label}-b".encode())
    assert store.put_manifest(root_a, b'{"snapshot": "a"}') is True
    assert store.get_manifest_bytes(root_a) == b'{"snapshot": "a"}'

    ref = store.cas_ref("models/llama", None, root_a, "first")
    assert (ref.root, ref.version) == (root_a, 1)
    ref = store.cas_ref("models/llama", root_a, root_b, "second")
    assert (ref.root, ref.version) == (root_b, 2)
    with pytest.raises(RefConflictError):
        store.cas_ref("models/llama", root_a, chunk_id(b"late"), "stale writer")
    assert store.read_ref("models/llama").root == root_b
    assert store.list_refs() == ["models/llama"]


def test_local_store_block_opens_by_name(_blocks_harness, tmp_path) -> None:
    name = _name("local")
    LocalStore(path=str(tmp_path / "cluster-a")).save(name)

    store = open_store(f"block:{name}")
    assert isinstance(store, LocalDirStore)
    assert store.uri == str(tmp_path / "cluster-a")
    _roundtrip(store, "local")

    # the same folder, reached by the fully qualified block name and without the block
    qualified = open_store(f"block:concord-local-store/{name}")
    assert qualified.uri == store.uri
    assert LocalDirStore(tmp_path / "cluster-a").read_ref("models/llama") == store.read_ref("models/llama")


def test_s3_store_block_opens_by_name(_blocks_harness, moto_server) -> None:
    name = _name("s3")
    bucket = f"concord-blocks-{uuid.uuid4().hex[:12]}"
    S3Store(
        bucket=bucket,
        prefix="clusters/b",
        endpoint_url=moto_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        storage_class="STANDARD_IA",
        create_bucket=True,
    ).save(name)

    # what the API hands back: secrets decrypted for the process that loads it, masked otherwise
    loaded = S3Store.load(name)
    assert loaded.aws_secret_access_key.get_secret_value() == "testing"
    assert "testing" not in repr(loaded)

    store = open_store(f"block:{name}")
    assert isinstance(store, S3ObjectStore)
    assert store.uri == f"s3://{bucket}/clusters/b"
    assert store.endpoint_url == moto_server
    _roundtrip(store, "s3")

    # the bytes landed in the bucket, under the prefix, with the block's storage class
    cid, data = _chunk("placed")
    loaded.put_chunk(cid, data)
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    head = s3.head_object(Bucket=bucket, Key=f"clusters/b/{chunk_key(cid)}")
    assert head["ContentLength"] == len(data)
    assert head["StorageClass"] == "STANDARD_IA"
    assert loaded.get_chunk(cid) == data
    assert store.get_chunk(cid) == data  # another store over the same bucket sees it
    loaded.close()
    store.close()


def test_unknown_block_name_says_how_to_create_it(_blocks_harness) -> None:
    name = _name("missing")
    with pytest.raises(InvalidStoreURIError) as info:
        open_store(f"block:{name}")
    message = str(info.value)
    assert f"block:{name}" in message
    assert f"concord-local-store/{name}" in message and f"concord-s3-store/{name}" in message
    assert f"LocalStore(path=...).save('{name}')" in message
    assert "prefect block register -m concord_pipelines.blocks.stores" in message
    assert isinstance(info.value, ValueError)

    with pytest.raises(InvalidStoreURIError, match=f"no concord-s3-store block named '{name}'"):
        open_store(f"block:concord-s3-store/{name}")
    with pytest.raises(InvalidStoreURIError, match="no no-such-type block named"):
        load_store_block(f"no-such-type/{name}")


def test_a_name_used_by_both_types_must_be_qualified(_blocks_harness, tmp_path, moto_server) -> None:
    name = _name("both")
    LocalStore(path=str(tmp_path / "both")).save(name)
    bucket = f"concord-blocks-{uuid.uuid4().hex[:12]}"
    S3Store(bucket=bucket, endpoint_url=moto_server, create_bucket=True).save(name)

    with pytest.raises(InvalidStoreURIError, match="several types") as info:
        open_store(f"block:{name}")
    assert f"block:concord-local-store/{name}" in str(info.value)
    assert f"block:concord-s3-store/{name}" in str(info.value)

    assert isinstance(open_store(f"block:concord-local-store/{name}"), LocalDirStore)
    s3_store = open_store(f"block:concord-s3-store/{name}")
    assert isinstance(s3_store, S3ObjectStore)
    _roundtrip(s3_store, "both")


def test_a_block_that_is_not_a_store_is_refused(_blocks_harness) -> None:
    name = _name("secret")
    Secret(value="not a store").save(name)
    with pytest.raises(InvalidStoreURIError, match="not a Concord store"):
        open_store(f"block:secret/{name}")


def test_an_edited_block_is_seen_on_the_next_open(_blocks_harness, tmp_path) -> None:
    name = _name("moved")
    LocalStore(path=str(tmp_path / "old")).save(name)
    assert open_store(f"block:{name}").uri == str(tmp_path / "old")
    LocalStore(path=str(tmp_path / "new")).save(name, overwrite=True)
    assert open_store(f"block:{name}").uri == str(tmp_path / "new")


def test_blocks_open_inside_sync_and_async_flows(_blocks_harness, tmp_path) -> None:
    name = _name("in-flow")
    LocalStore(path=str(tmp_path / "flow-store")).save(name)
    cid, data = _chunk("flow")

    @flow
    def sync_writer(block_name: str) -> str:
        store = open_store(f"block:{block_name}")
        store.put_chunk(cid, data)
        return store.uri

    @flow
    async def async_reader(block_name: str) -> bytes:
        # inside an event loop Prefect would hand back a coroutine unless told to load synchronously
        return open_store(f"block:{block_name}").get_chunk(cid)

    assert sync_writer(name) == str(tmp_path / "flow-store")
    assert asyncio.run(async_reader(name)) == data


def test_block_types_register_from_the_command_line(_blocks_harness) -> None:
    """The command the error messages suggest works and registers both types for the UI."""
    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    done = subprocess.run(
        [str(Path(sys.executable).parent / "prefect"), "block", "register", "-m", "concord_pipelines.blocks.stores"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Concord Local Store" in done.stdout and "Concord S3 Store" in done.stdout
