"""Staging a checkpoint from an S3 prefix into a temporary local folder, against a real moto_server:
what is staged, what is refused, and that the staging folder never outlives the ``with`` block."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from servers import free_port
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.errors import SourceChangedError, SourceNotFoundError, StoreUnreachableError, UnsafePathError
from concord.snapshots.snapshot import snapshot
from concord.snapshots.staging import s3_checkpoint_problem, staged_checkpoint
from concord.stores import LocalDirStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def bucket(s3_store):
    """A boto3 client and a fresh, empty bucket on the moto server (the s3_store's)."""
    return s3_store._client(), s3_store.bucket


def upload(client, bucket: str, prefix: str, folder: Path) -> list[str]:
    keys = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = f"{prefix}/{path.relative_to(folder).as_posix()}"
        client.upload_file(str(path), bucket, key)
        keys.append(key)
    return keys


def keys_of(client, bucket: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))


class OnStart:
    """A progress reporter that does something to the bucket once the listing is taken, just
    before the first byte is downloaded (a writer racing the staging)."""

    def __init__(self, action) -> None:
        self.action = action
        self.done = 0

    def start(self, total: int, desc: str) -> None:
        self.action()

    def advance(self, n: int) -> None:
        self.done += n

    def close(self) -> None:
        pass


def test_an_s3_checkpoint_is_staged_whole_and_snapshots_like_the_local_folder(bucket, moto_server, tmp_path):
    client, name = bucket
    local = make_checkpoint(tmp_path / "step-0100", layers=2, dim=64)
    (local / "tokenizer").mkdir()
    (local / "tokenizer" / "vocab.json").write_text('{"a": 1}')
    (local / "COMPLETE").write_bytes(b"")
    upload(client, name, "runs/llama/step-0100", local)
    client.put_object(Bucket=name, Key="runs/llama/step-0100/empty-dir/", Body=b"")  # a folder placeholder
    client.put_object(Bucket=name, Key="runs/llama/step-01000/other.json", Body=b"{}")  # a sibling, not ours
    staging = tmp_path / "staging"

    with staged_checkpoint(f"s3://{name}/runs/llama/step-0100", endpoint_url=moto_server, staging_dir=str(staging)) as s:
        path = Path(s.path)
        assert s.staged and path.name == "step-0100" and path.parent.parent == staging
        staged = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
        assert staged == sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
        assert all((path / rel).read_bytes() == (local / rel).read_bytes() for rel in staged)
        assert s.files == len(staged) and s.bytes == sum((local / rel).stat().st_size for rel in staged)
        head = client.head_object(Bucket=name, Key="runs/llama/step-0100/config.json")
        assert os.path.getmtime(path / "config.json") == head["LastModified"].timestamp()
        from_s3 = snapshot(path, LocalDirStore(tmp_path / "a"), chunk_size=SMALL_CHUNK)
    from_local = snapshot(local, LocalDirStore(tmp_path / "b"), chunk_size=SMALL_CHUNK)
    assert from_s3.root == from_local.root
    assert list(staging.iterdir()) == []  # the staging folder is gone


def test_a_local_folder_is_given_back_as_it_is(tmp_path):
    with staged_checkpoint(str(tmp_path)) as s:
        assert (s.path, s.staged) == (str(tmp_path), False)


@pytest.mark.parametrize(
    "bad_key",
    ["runs/ckpt/../escape.txt", "runs/ckpt/sub/../../escape.txt", "runs/ckpt//abs.txt", "runs/ckpt/./dot.txt", "runs/ckpt/a\\b.txt"],
)
def test_a_key_that_would_leave_the_staging_folder_is_refused_before_any_download(bucket, moto_server, tmp_path, bad_key):
    client, name = bucket
    client.put_object(Bucket=name, Key="runs/ckpt/model.safetensors", Body=b"x" * 100)
    client.put_object(Bucket=name, Key=bad_key, Body=b"evil")
    assert bad_key in keys_of(client, name)  # the server kept the key as it was written
    staging = tmp_path / "staging"
    with pytest.raises(UnsafePathError, match="refusing path"):
        with staged_checkpoint(f"s3://{name}/runs/ckpt", endpoint_url=moto_server, staging_dir=str(staging)):
            pytest.fail("the block must not run")
    assert list(staging.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists()


def test_an_object_that_is_also_a_folder_is_refused(bucket, moto_server, tmp_path):
    client, name = bucket
    client.put_object(Bucket=name, Key="runs/ckpt/weights", Body=b"x")
    client.put_object(Bucket=name, Key="runs/ckpt/weights/part-0", Body=b"y")
    with pytest.raises(UnsafePathError, match="both an object and the folder"):
        with staged_checkpoint(f"s3://{name}/runs/ckpt", endpoint_url=moto_server, staging_dir=str(tmp_path)):
            pass
    assert list(tmp_path.iterdir()) == []


def test_an_empty_prefix_is_no_checkpoint(bucket, moto_server, tmp_path):
    _, name = bucket
    with pytest.raises(SourceNotFoundError, match="no such file or folder"):
        with staged_checkpoint(f"s3://{name}/runs/nothing-here", endpoint_url=moto_server, staging_dir=str(tmp_path)):
            pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("race", ["deleted", "replaced"])
def test_an_object_deleted_or_replaced_mid_staging_fails_it_and_nothing_is_left(bucket, moto_server, tmp_path, race):
    client, name = bucket
    local = make_checkpoint(tmp_path / "step-0001", layers=2, dim=64)
    upload(client, name, "runs/m/step-0001", local)
    key = "runs/m/step-0001/config.json"

    def writer() -> None:
        if race == "deleted":
            client.delete_object(Bucket=name, Key=key)
        else:
            client.put_object(Bucket=name, Key=key, Body=b'{"changed": true, "longer": "than before"}')

    staging = tmp_path / "staging"
    with pytest.raises(SourceChangedError, match="changed while it was being snapshotted") as err:
        with staged_checkpoint(f"s3://{name}/runs/m/step-0001", endpoint_url=moto_server, staging_dir=str(staging), progress=OnStart(writer)):
            pytest.fail("the block must not run")
    assert err.value.path == f"s3://{name}/{key}"
    assert list(staging.iterdir()) == []


def test_the_staging_folder_is_removed_when_the_block_fails(bucket, moto_server, tmp_path):
    client, name = bucket
    client.put_object(Bucket=name, Key="runs/ckpt/model.bin", Body=b"x" * 1000)
    with pytest.raises(RuntimeError, match="snapshot failed"):
        with staged_checkpoint(f"s3://{name}/runs/ckpt", endpoint_url=moto_server, staging_dir=str(tmp_path)) as s:
            assert Path(s.path, "model.bin").stat().st_size == 1000
            raise RuntimeError("snapshot failed")
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_endpoint_is_a_clear_error_and_nothing_is_left(aws_credentials, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StoreUnreachableError, match="is unreachable") as err:
        with staged_checkpoint("s3://some-bucket/runs/ckpt", endpoint_url=dead, staging_dir=str(tmp_path)):
            pass
    assert dead in str(err.value) and "AWS_ENDPOINT_URL" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_the_endpoint_comes_from_the_environment_like_s3_stores(bucket, moto_server, tmp_path, monkeypatch):
    client, name = bucket
    client.put_object(Bucket=name, Key="runs/ckpt/model.bin", Body=b"abc")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    with staged_checkpoint(f"s3://{name}/runs/ckpt", staging_dir=str(tmp_path)) as s:
        assert Path(s.path, "model.bin").read_bytes() == b"abc"


@pytest.mark.parametrize(
    "uri, said",
    [
        ("s3://bucket-name", "whole bucket"),
        ("s3://Bad_Bucket/runs/x", "naming rules"),
        ("s3:///runs/x", "not an s3://bucket/prefix"),
        ("s3://bucket-name/runs/../x", "not an s3://bucket/prefix"),
    ],
)
def test_a_bad_uri_is_named_without_any_request(uri, said):
    assert said in s3_checkpoint_problem(uri)
    assert s3_checkpoint_problem("s3://bucket-name/runs/llama/step-1") is None
