"""The store blocks without a server: Prefect's block standards, validation, secrets, the built store."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import cloudpickle
import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import SecretStr, ValidationError

from concord.errors import InvalidStoreURIError
from concord.hashing import chunk_id
from concord.stores import open_store
from concord.stores.local import LocalDirStore
from concord.stores.s3 import S3ObjectStore
from concord_pipelines import blocks
from concord_pipelines.blocks.stores import LocalStore, S3Store, StoreBlockMixin, load_store_block

SECRET_ID = "AKIAEXAMPLEKEYID0001"
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


class _OfflineLogoCheck:
    """Prefect's suite requires a ``_logo_url`` and opens it over the internet. Concord's blocks
    have none on purpose: a remote image does not load where the UI has no internet, and Prefect
    accepts only an http(s) address (a data: URI is refused), so the UI shows its own block icon,
    which it always has."""

    def test_has_a_valid_image(self, block: type[Block]) -> None:
        assert block._logo_url is None, f"{block.__name__} names a logo the UI may not load offline: {block._logo_url}"


class TestLocalStoreStandards(_OfflineLogoCheck, BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return LocalStore


class TestS3StoreStandards(_OfflineLogoCheck, BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return S3Store


def test_package_exports() -> None:
    assert blocks.LocalStore is LocalStore
    assert blocks.S3Store is S3Store
    assert blocks.load_store_block is load_store_block


def test_block_type_names_and_slugs() -> None:
    assert LocalStore.get_block_type_name() == "Concord Local Store"
    assert LocalStore.get_block_type_slug() == "concord-local-store"
    assert S3Store.get_block_type_name() == "Concord S3 Store"
    assert S3Store.get_block_type_slug() == "concord-s3-store"


# --------------------------------------------------------------------------- LocalStore


def test_local_store_builds_a_working_local_dir_store(tmp_path: Path) -> None:
    block = LocalStore(path=str(tmp_path / "c1"), fsync=True)
    store = block.get_store()
    assert isinstance(store, LocalDirStore)
    assert store.root == str(tmp_path / "c1")
    assert store.fsync is True
    assert (tmp_path / "c1").is_dir()

    data = b"a tensor's bytes" * 100
    cid = chunk_id(data)
    assert store.put_chunk(cid, data) is True
    assert store.get_chunk(cid) == data
    # another store on the same folder sees what the block's store wrote
    assert LocalDirStore(tmp_path / "c1").get_chunk(cid) == data


def test_get_store_is_built_once_and_rebuilt_when_a_field_changes(tmp_path: Path) -> None:
    block = LocalStore(path=str(tmp_path / "a"))
    first = block.get_store()
    assert block.get_store() is first
    block.path = str(tmp_path / "b")
    second = block.get_store()
    assert second is not first
    assert second.uri == str(tmp_path / "b")
    block.close()
    assert block.get_store() is not second


def test_local_store_accepts_path_objects_and_expands_home(tmp_path: Path, monkeypatch) -> None:
    assert LocalStore(path=tmp_path / "p").path == str(tmp_path / "p")
    monkeypatch.setenv("HOME", str(tmp_path))
    block = LocalStore(path="~/stores/c1")
    assert block.path == "~/stores/c1"  # saved as written, expanded where it is used
    assert block.get_store().uri == str(tmp_path / "stores" / "c1")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "path is empty"),
        ("   ", "path is empty"),
        ("/data/c\x001", "NUL"),
        (" /data/c1", "leading or trailing spaces"),
    ],
)
def test_local_store_rejects_bad_paths(path: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LocalStore(path=path)


def test_local_store_requires_a_path() -> None:
    with pytest.raises(ValidationError, match="path"):
        LocalStore()


def test_the_store_interface_is_on_the_block(tmp_path: Path) -> None:
    block = LocalStore(path=str(tmp_path / "s"))
    other = LocalDirStore(tmp_path / "s")  # sees the same folder independently
    chunks = {chunk_id(d): d for d in (b"one", b"two", b"three")}
    for cid, data in chunks.items():
        assert block.put_chunk(cid, data) is True
    assert block.put_chunk(next(iter(chunks)), b"one") is False
    assert block.has_chunks([*chunks, chunk_id(b"absent")]) == set(chunks)
    assert sorted(block.iter_chunks()) == sorted(chunks)
    assert all(block.get_chunk(cid) == data for cid, data in chunks.items())
    assert sorted(other.iter_chunks()) == sorted(chunks)

    root = chunk_id(b"manifest")
    assert block.has_manifest(root) is False
    assert block.put_manifest(root, b'{"m": 1}') is True
    assert block.has_manifest(root) is True
    assert block.get_manifest_bytes(root) == b'{"m": 1}'
    assert list(block.iter_manifests()) == [root]
    assert other.get_manifest_bytes(root) == b'{"m": 1}'

    assert block.read_ref("models/llama") is None
    ref = block.cas_ref("models/llama", None, root, "first")
    assert (ref.root, ref.version) == (root, 1)
    assert block.read_ref("models/llama").root == root
    assert block.list_refs() == ["models/llama"]
    assert other.read_ref("models/llama").root == root

    assert block.uri == str(tmp_path / "s")
    assert isinstance(block, StoreBlockMixin)


def test_the_cached_store_is_not_serialized(tmp_path: Path) -> None:
    block = LocalStore(path=str(tmp_path / "s"))
    block.get_store()
    assert block.model_dump() == {
        "path": str(tmp_path / "s"),
        "fsync": False,
        "store_key": None,
        "block_type_slug": "concord-local-store",
    }
    assert set(json.loads(block.model_dump_json())) == {"path", "fsync", "store_key", "block_type_slug"}


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_blocks_with_a_built_store_pickle(tmp_path: Path, dumps) -> None:
    local = LocalStore(path=str(tmp_path / "s"))
    local.get_store()
    assert pickle.loads(dumps(local)).get_store().uri == local.uri
    s3 = S3Store(bucket="models", prefix="c1", endpoint_url="http://127.0.0.1:9")
    s3.get_store()
    assert pickle.loads(dumps(s3)).get_store().uri == "s3://models/c1"


# --------------------------------------------------------------------------- S3Store


def test_s3_store_builds_an_s3_object_store_without_touching_the_network() -> None:
    block = S3Store(
        bucket="models",
        prefix="/concord/cluster-a/",
        endpoint_url="http://127.0.0.1:9/",
        region_name="eu-west-1",
        storage_class="STANDARD_IA",
        create_bucket=True,
        aws_access_key_id=SECRET_ID,
        aws_secret_access_key=SECRET_KEY,
    )
    assert block.prefix == "concord/cluster-a"
    assert block.endpoint_url == "http://127.0.0.1:9"
    store = block.get_store()  # port 9 has nothing listening: building must not connect
    assert isinstance(store, S3ObjectStore)
    assert store.uri == "s3://models/concord/cluster-a"
    assert block.uri == "s3://models/concord/cluster-a"
    assert (store.bucket, store.prefix) == ("models", "concord/cluster-a")
    assert store.endpoint_url == "http://127.0.0.1:9"
    assert store.region_name == "eu-west-1"
    assert store.storage_class == "STANDARD_IA"
    assert store.create_bucket is True
    assert SECRET_KEY not in repr(store) and SECRET_KEY not in str(store)


def test_s3_store_endpoint_falls_back_to_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    block = S3Store(bucket="models")
    assert block.endpoint_url is None  # the saved block stays portable
    assert block.get_store().endpoint_url == "http://127.0.0.1:9000"
    assert S3Store(bucket="models", endpoint_url="http://10.0.0.1:9000").get_store().endpoint_url == (
        "http://10.0.0.1:9000"
    )


def test_s3_store_defaults() -> None:
    block = S3Store(bucket="models")
    assert (block.prefix, block.endpoint_url, block.region_name, block.storage_class) == ("", None, None, None)
    assert (block.aws_access_key_id, block.aws_secret_access_key, block.create_bucket) == (None, None, False)
    assert block.get_store().uri == "s3://models"


@pytest.mark.parametrize(
    ("bucket", "message"),
    [
        ("", "empty"),
        ("ab", "3 to 63 characters"),
        ("Models", "lowercase"),
        ("models_v1", "lowercase"),
        ("-models", "starting and ending"),
        ("a" * 64, "3 to 63 characters"),
        ("my..models", r"'\.\.'"),
        ("192.168.1.10", "IP address"),
        ("xn--models", "reserves"),
    ],
)
def test_s3_store_rejects_invalid_bucket_names(bucket: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        S3Store(bucket=bucket)
    assert info.value.errors()[0]["loc"] == ("bucket",)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("../other-tenant", r"'\.\.' segment"),
        ("concord/../../etc", r"'\.\.' segment"),
        ("concord//c1", "empty or '.' segment"),
        ("concord/./c1", "empty or '.' segment"),
        ("concord\\c1", "backslash"),
        ("concord/c1\n", "control character"),
    ],
)
def test_s3_store_rejects_bad_prefixes(prefix: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        S3Store(bucket="models", prefix=prefix)
    assert info.value.errors()[0]["loc"] == ("prefix",)


def test_s3_store_allows_dots_inside_prefix_names() -> None:
    assert S3Store(bucket="models", prefix="v1..2/c.1").prefix == "v1..2/c.1"


@pytest.mark.parametrize(
    "url", ["localhost:9000", "ftp://host/", "http://", "http://h:9000/?x=1", "s3://models"]
)
def test_s3_store_rejects_bad_endpoint_urls(url: str) -> None:
    with pytest.raises(ValidationError, match="endpoint_url"):
        S3Store(bucket="models", endpoint_url=url)


def test_s3_store_empty_endpoint_and_region_mean_unset() -> None:
    block = S3Store(bucket="models", endpoint_url="  ", region_name="")
    assert (block.endpoint_url, block.region_name) == (None, None)
    with pytest.raises(ValidationError, match="region_name"):
        S3Store(bucket="models", region_name="us east 1")


def test_s3_store_storage_class_must_be_an_s3_storage_class() -> None:
    assert S3Store(bucket="models", storage_class="GLACIER_IR").storage_class == "GLACIER_IR"
    with pytest.raises(ValidationError, match="STANDARD_IA"):
        S3Store(bucket="models", storage_class="standard-ia")


@pytest.mark.parametrize("given", ["aws_access_key_id", "aws_secret_access_key"])
def test_s3_store_credentials_come_in_pairs(given: str) -> None:
    with pytest.raises(ValidationError, match="give both aws_access_key_id and aws_secret_access_key"):
        S3Store(bucket="models", **{given: "x"})


def test_s3_store_secrets_never_show() -> None:
    block = S3Store(bucket="models", aws_access_key_id=SECRET_ID, aws_secret_access_key=SECRET_KEY)
    assert isinstance(block.aws_secret_access_key, SecretStr)
    block.get_store()
    shown = [
        repr(block),
        str(block),
        block.model_dump_json(),
        str(block.model_dump()),
        str(block.model_dump(mode="json")),
        repr(block.get_store()),
        str(block.get_store()),
        block.uri,
    ]
    for text in shown:
        assert SECRET_KEY not in text
        assert SECRET_ID not in text
    assert block.aws_secret_access_key.get_secret_value() == SECRET_KEY
    # Prefect stores these fields encrypted and masks them in the UI and API
    secret_fields = S3Store.model_json_schema()["secret_fields"]
    assert {"aws_access_key_id", "aws_secret_access_key"} <= set(secret_fields)


# --------------------------------------------------------------------------- load_store_block


@pytest.mark.parametrize("name", ["", "   ", "/cluster-a", "concord-local-store/"])
def test_load_store_block_rejects_malformed_names(name: str) -> None:
    with pytest.raises(InvalidStoreURIError, match="block"):
        load_store_block(name)


def test_open_store_routes_block_uris_to_the_entry_point() -> None:
    with pytest.raises(InvalidStoreURIError, match="nothing after 'block:'"):
        open_store("block:")
    # the entry point resolves to this very function (installed with the project)
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="concord.store_schemes") if ep.name == "block"]
    assert ep.load() is load_store_block

