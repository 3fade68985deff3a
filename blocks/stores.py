"""Prefect blocks for Concord stores: where a cluster's snapshots live.

A block is configuration plus one method, :meth:`StoreBlockMixin.get_store`, that builds the
core's :class:`~concord.stores.base.Store` from it. The store is built lazily, once, and cached
on the block (never serialized with it). The store interface is also available on the block
itself, so ``LocalStore.load("cluster-a").put_chunk(...)`` works as ``get_store().put_chunk(...)``.

``load_store_block`` is what ``open_store("block:NAME")`` calls (through the
``concord.store_schemes`` entry point), so the CLI and the core reach saved blocks without
importing Prefect themselves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, Literal
from urllib.parse import urlparse

from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator

from concord.errors import InvalidStoreURIError
from concord.redact import redact
from concord.stores.base import Ref, Store
from concord.stores.local import LocalDirStore
from concord.stores.s3 import S3ObjectStore, validate_bucket_name
from concord_pipelines.blocks.api import load_block, where_blocks_live

__all__ = ["LocalStore", "S3Store", "S3StorageClass", "StoreBlockMixin", "load_store_block"]

#: Storage classes S3 accepts on PutObject (objects in GLACIER and DEEP_ARCHIVE must be restored
#: before they can be read, so those suit only a cold tier that is restored before use).
S3StorageClass = Literal[
    "STANDARD",
    "REDUCED_REDUNDANCY",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER",
    "DEEP_ARCHIVE",
    "OUTPOSTS",
    "GLACIER_IR",
    "SNOW",
    "EXPRESS_ONEZONE",
]

_DOCUMENTATION_URL = "https://docs.prefect.io/v3/concepts/blocks"
_STORE_KEY_HELP = (
    "A Secret block holding the key of an encrypted store (64 hex characters, as "
    "`concord init STORE --encrypt --key-file FILE` writes it); if unset, CONCORD_KEY_FILE of the "
    "process that uses the block. Plain stores need none."
)


class StoreBlockMixin:
    """The store interface on a block: every method builds (once) and calls :meth:`get_store`.

    A subclass provides ``_build_store()``; the mixin caches its result in ``_store`` together
    with the field values it was built from, so changing a field on the block builds a new store.
    """

    _store: Store | None
    _store_key: tuple | None

    def _build_store(self) -> Store:  # pragma: no cover - every block overrides it
        raise NotImplementedError

    def _fields_key(self) -> tuple:
        return tuple(getattr(self, name) for name in type(self).model_fields)  # type: ignore[attr-defined]

    def get_store(self) -> Store:
        """The core store this block describes, built on first use and reused afterwards."""
        key = self._fields_key()
        store = self._store
        if store is None or self._store_key != key:
            store = self._build_store()
            secret = getattr(self, "store_key", None)
            if secret is not None:  # an encrypted store's key, from its Secret block (never logged)
                from concord.stores.cipher import parse_key

                store.unlock(parse_key(str(secret.get()).encode(), "of the store_key Secret block"))
            self._store, self._store_key = store, key
        return store

    def close(self) -> None:
        """Close the cached store (its clients and connections); the next call builds a new one."""
        store, self._store, self._store_key = self._store, None, None
        if store is not None:
            store.close()

    @property
    def uri(self) -> str:
        """The store's address, e.g. ``/data/c1`` or ``s3://bucket/prefix``."""
        return self.get_store().uri

    # ------------------------------------------------------------------ chunks

    def has_chunks(self, ids: Iterable[str]) -> set[str]:
        return self.get_store().has_chunks(ids)

    def put_chunk(
        self, cid: str, data: bytes | memoryview, *, overwrite: bool = False, verify: bool = True
    ) -> bool:
        return self.get_store().put_chunk(cid, data, overwrite=overwrite, verify=verify)

    def get_chunk(self, cid: str, *, verify: bool = True) -> bytes:
        return self.get_store().get_chunk(cid, verify=verify)

    def iter_chunks(self) -> Iterator[str]:
        return self.get_store().iter_chunks()

    # ------------------------------------------------------------------ manifests

    def put_manifest(self, root: str, data: bytes, *, overwrite: bool = False) -> bool:
        return self.get_store().put_manifest(root, data, overwrite=overwrite)

    def get_manifest_bytes(self, root: str) -> bytes:
        return self.get_store().get_manifest_bytes(root)

    def has_manifest(self, root: str) -> bool:
        return self.get_store().has_manifest(root)

    def iter_manifests(self) -> Iterator[str]:
        return self.get_store().iter_manifests()

    # ------------------------------------------------------------------ refs

    def read_ref(self, name: str) -> Ref | None:
        return self.get_store().read_ref(name)

    def cas_ref(self, name: str, expected: str | None, new: str, message: str = "") -> Ref:
        return self.get_store().cas_ref(name, expected, new, message)

    def list_refs(self) -> list[str]:
        return self.get_store().list_refs()

    def delete_ref(self, name: str, expected: str) -> bool:
        return self.get_store().delete_ref(name, expected)

    # ------------------------------------------------------------------ tiering and garbage collection

    @property
    def archive(self) -> bool:
        """Whether the store's chunks sit in an archive storage class (readable after a restore)."""
        return self.get_store().archive

    def chunk_states(self, ids: list[str]) -> dict[str, str]:
        return self.get_store().chunk_states(ids)

    def request_restore(self, ids: list[str], *, days: int = 1, tier: str = "Standard") -> int:
        return self.get_store().request_restore(ids, days=days, tier=tier)

    def iter_chunk_stats(self) -> Iterator[tuple[str, int, float]]:
        return self.get_store().iter_chunk_stats()

    def iter_manifest_stats(self) -> Iterator[tuple[str, int, float]]:
        return self.get_store().iter_manifest_stats()


class LocalStore(StoreBlockMixin, Block):
    """A Concord store in a local or network-mounted folder.

    Attributes:
        path: The folder holding the store (created on first use).
        fsync: Whether every write is flushed to disk before it is renamed into place.
    """

    _block_type_name = "Concord Local Store"
    _description = (
        "A Concord content-addressed store (chunks, manifests, refs) in a local or "
        "network-mounted folder."
    )
    # no logo: a remote image does not load where the UI has no internet, and Prefect accepts only
    # http(s) addresses (no data: URI); the UI shows its own block icon instead
    _logo_url = None
    _documentation_url = _DOCUMENTATION_URL
    _code_example = """
    Save a store once (or create it in the UI after `prefect block register -m concord_pipelines.blocks.stores`):
    ```python
    from concord_pipelines.blocks.stores import LocalStore

    LocalStore(path="/data/concord/cluster-a").save("cluster-a")
    ```

    Load it by name in a flow or task, or name it `block:cluster-a` anywhere Concord takes a store:
    ```python
    from concord_pipelines.blocks.stores import LocalStore

    local_store = LocalStore.load("BLOCK_NAME")
    store = local_store.get_store()
    print(store.list_refs())
    ```
    """

    path: str = Field(
        description=(
            "The folder holding the store, created on first use. A relative path is resolved "
            "against the working directory of the process that loads the block; '~' is expanded."
        ),
        examples=["/data/concord/cluster-a"],
    )
    fsync: bool = Field(
        default=False,
        description=(
            "Flush every write to disk before renaming it into place: slower, but survives "
            "power loss, not only process crashes."
        ),
    )
    store_key: Secret | None = Field(default=None, description=_STORE_KEY_HELP)

    _store: Store | None = PrivateAttr(default=None)
    _store_key: tuple | None = PrivateAttr(default=None)

    @field_validator("path", mode="before")
    @classmethod
    def _check_path(cls, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            return value  # let pydantic report the type error
        if not value.strip():
            raise ValueError("path is empty: give the folder that holds (or will hold) the store")
        if "\x00" in value:
            raise ValueError("path contains a NUL character")
        if value != value.strip():
            raise ValueError(f"path {value!r} has leading or trailing spaces; remove them")
        return value

    def _build_store(self) -> Store:
        return LocalDirStore(os.path.expanduser(self.path), create=True, fsync=self.fsync)


class S3Store(StoreBlockMixin, Block):
    """A Concord store in an S3 bucket, on AWS or any S3-compatible endpoint (MinIO, Ceph, ...).

    Attributes:
        bucket: The bucket name.
        prefix: The folder inside the bucket that holds the store.
        endpoint_url: The S3 endpoint; AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, then AWS, if unset.
        region_name: The bucket's region.
        aws_access_key_id: The access key id; boto3's usual credential chain if unset.
        aws_secret_access_key: The secret access key; boto3's usual credential chain if unset.
        storage_class: The S3 storage class new objects are written with.
        create_bucket: Whether a missing bucket is created on first use.
    """

    _block_type_name = "Concord S3 Store"
    _description = (
        "A Concord content-addressed store (chunks, manifests, refs) under a prefix of an S3 "
        "bucket, on AWS or any S3-compatible endpoint."
    )
    # no logo: a remote image does not load where the UI has no internet, and Prefect accepts only
    # http(s) addresses (no data: URI); the UI shows its own block icon instead
    _logo_url = None
    _documentation_url = _DOCUMENTATION_URL
    _code_example = """
    Save a store once (or create it in the UI after `prefect block register -m concord_pipelines.blocks.stores`):
    ```python
    from concord_pipelines.blocks.stores import S3Store

    S3Store(
        bucket="models",
        prefix="concord/cluster-b",
        endpoint_url="http://minio.internal:9000",
        aws_access_key_id="ACCESS_KEY_ID",
        aws_secret_access_key="SECRET_ACCESS_KEY",
    ).save("cluster-b")
    ```

    Load it by name in a flow or task, or name it `block:cluster-b` anywhere Concord takes a store:
    ```python
    from concord_pipelines.blocks.stores import S3Store

    s3_store = S3Store.load("BLOCK_NAME")
    store = s3_store.get_store()
    print(store.list_refs())
    ```
    """

    # a rejected field value (an endpoint URL with credentials in it) is not echoed in the error
    model_config = ConfigDict(hide_input_in_errors=True)

    bucket: str = Field(
        description="The name of the S3 bucket that holds the store.",
        examples=["models"],
    )
    prefix: str = Field(
        default="",
        description=(
            "The folder inside the bucket that holds the store, without leading or trailing "
            "'/'; empty for the bucket's root."
        ),
        examples=["concord/cluster-a"],
    )
    endpoint_url: str | None = Field(
        default=None,
        title="Endpoint URL",
        description=(
            "The S3 endpoint, e.g. http://minio.internal:9000 for an S3-compatible server. "
            "If unset, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL of the process that uses the "
            "block applies, else AWS itself."
        ),
    )
    region_name: str | None = Field(
        default=None,
        description="The bucket's region, e.g. us-east-1; if unset, boto3's configured default.",
    )
    aws_access_key_id: SecretStr | None = Field(
        default=None,
        title="AWS Access Key ID",
        description=(
            "The access key id. If unset (with the secret key), credentials come from boto3's "
            "usual chain: environment, config files, instance or pod role."
        ),
    )
    aws_secret_access_key: SecretStr | None = Field(
        default=None,
        title="AWS Secret Access Key",
        description="The secret access key that goes with the access key id.",
    )
    storage_class: S3StorageClass | None = Field(
        default=None,
        description=(
            "The S3 storage class new objects are written with; if unset, the bucket's default "
            "(usually STANDARD). GLACIER and DEEP_ARCHIVE objects must be restored before reading."
        ),
    )
    create_bucket: bool = Field(
        default=False,
        description="Create the bucket on first use if it does not exist.",
    )
    server_side_encryption: Literal["AES256", "aws:kms"] | None = Field(
        default=None,
        title="Server-side encryption",
        description=(
            "S3 server-side encryption applied to every object written: AES256 (SSE-S3) or "
            "aws:kms (SSE-KMS); if unset, the bucket's default."
        ),
    )
    sse_kms_key_id: str | None = Field(
        default=None,
        title="SSE-KMS key id",
        description="The KMS key (id, ARN or alias) for aws:kms; if unset, the account's default KMS key.",
    )
    connections: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=(
            "How many transfers (uploads, downloads, existence checks) the store runs at once, as "
            "?connections=N on an s3:// address; if unset, 16. More suits a fast link to a distant "
            "endpoint, fewer a throttled one."
        ),
    )
    store_key: Secret | None = Field(default=None, description=_STORE_KEY_HELP)

    _store: Store | None = PrivateAttr(default=None)
    _store_key: tuple | None = PrivateAttr(default=None)

    @field_validator("bucket")
    @classmethod
    def _check_bucket(cls, value: str) -> str:
        return validate_bucket_name(value)  # its InvalidStoreURIError is a ValueError: it says why

    @field_validator("prefix", mode="before")
    @classmethod
    def _check_prefix(cls, value: Any) -> Any:
        if value is None:
            return ""
        if not isinstance(value, str):
            return value  # let pydantic report the type error
        cleaned = value.strip("/")
        segments = cleaned.split("/") if cleaned else []
        if ".." in segments:
            raise ValueError(
                f"prefix {value!r} has a '..' segment; give the folder inside the bucket "
                "directly, e.g. 'concord/cluster-a'"
            )
        if any(seg in ("", ".") for seg in segments):
            raise ValueError(f"prefix {value!r} has an empty or '.' segment; write e.g. 'concord/cluster-a'")
        if any(ord(ch) < 32 or ch == "\\" for ch in cleaned):
            raise ValueError(
                f"prefix {value!r} has a control character or a backslash; separate folders with '/'"
            )
        return cleaned

    @field_validator("endpoint_url", mode="before")
    @classmethod
    def _check_endpoint_url(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = value.strip()
        if not value:
            return None
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(
                f"endpoint_url {redact(value)!r} is not an http(s) URL; give e.g. "
                "'http://127.0.0.1:9000' or 'https://s3.eu-west-1.amazonaws.com'"
            )
        if parsed.query or parsed.fragment:
            raise ValueError(f"endpoint_url {redact(value)!r} must not have a query string or fragment")
        return value.rstrip("/")

    @field_validator("region_name", mode="before")
    @classmethod
    def _check_region(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return None
            if any(ch.isspace() or ch == "/" for ch in value):
                raise ValueError(f"region_name {value!r} is not a region name, e.g. 'us-east-1'")
        return value

    @model_validator(mode="after")
    def _check_sse(self) -> S3Store:
        if self.sse_kms_key_id and self.server_side_encryption != "aws:kms":
            raise ValueError("sse_kms_key_id goes with server_side_encryption='aws:kms' (SSE-KMS); set both, or neither")
        return self

    @model_validator(mode="after")
    def _check_credentials_pair(self) -> S3Store:
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise ValueError(
                "give both aws_access_key_id and aws_secret_access_key, or neither to use "
                "boto3's credential chain (environment, config files, instance or pod role)"
            )
        return self

    def __repr_args__(self):
        for name, value in super().__repr_args__():
            yield name, redact(value) if name == "endpoint_url" and isinstance(value, str) else value

    def _build_store(self) -> Store:
        return S3ObjectStore(
            self.bucket,
            self.prefix,
            endpoint_url=self.endpoint_url,
            region_name=self.region_name,
            aws_access_key_id=_reveal(self.aws_access_key_id),
            aws_secret_access_key=_reveal(self.aws_secret_access_key),
            storage_class=self.storage_class,
            create_bucket=self.create_bucket,
            sse=self.server_side_encryption,
            sse_kms_key_id=self.sse_kms_key_id,
            connections=self.connections,
        )


def _reveal(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


# --------------------------------------------------------------------------- block:NAME

STORE_BLOCK_TYPES: tuple[type[Block], ...] = (LocalStore, S3Store)


def load_store_block(name: str) -> Store:
    """The store of the saved block ``name`` (``"NAME"`` or ``"TYPE-SLUG/NAME"``).

    A bare ``NAME`` is looked up as every Concord store block type (``concord-local-store``,
    ``concord-s3-store``); it must name exactly one of them.
    """
    spec = f"block:{name}"
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        raise InvalidStoreURIError(spec, "no block name after 'block:'")

    if "/" in name:
        slug, _, document = name.partition("/")
        if not slug or not document:
            raise InvalidStoreURIError(spec, "use block:NAME or block:TYPE-SLUG/NAME")
        block = _load(spec, Block, name, slug)
        if block is None:
            raise InvalidStoreURIError(
                spec, f"there is no {slug} block named {document!r} in {where_blocks_live()}. {_how_to_create(document)}"
            )
        if not isinstance(block, StoreBlockMixin):
            raise InvalidStoreURIError(
                spec,
                f"block {name!r} is a {type(block).__name__}, not a Concord store; use a block of "
                f"type {' or '.join(_slugs())}",
            )
        return block.get_store()

    found = {}
    for block_type in STORE_BLOCK_TYPES:
        block = _load(spec, block_type, name, block_type.get_block_type_slug())
        if block is not None:
            found[block_type.get_block_type_slug()] = block
    if not found:
        raise InvalidStoreURIError(
            spec,
            f"no Concord store block is named {name!r} (looked for "
            f"{' and '.join(f'{s}/{name}' for s in _slugs())} in {where_blocks_live()}). {_how_to_create(name)}",
        )
    if len(found) > 1:
        raise InvalidStoreURIError(
            spec,
            f"{name!r} names blocks of several types; say which one: "
            + " or ".join(f"block:{slug}/{name}" for slug in found),
        )
    (block,) = found.values()
    return block.get_store()


def _load(spec: str, block_type: type[Block], name: str, slug: str) -> Block | None:
    """``block_type.load(name)``, or None if no such block document exists."""
    try:
        return load_block(block_type, name, spec, slug=slug)
    except ValueError as exc:
        raise InvalidStoreURIError(spec, f"the saved {slug} block cannot be loaded ({exc})") from exc
    except KeyError as exc:
        # Block.load("type/name") of a type no imported class implements
        raise InvalidStoreURIError(
            spec, f"unknown block type {slug!r}; Concord store blocks are {' and '.join(_slugs())}"
        ) from exc


def _slugs() -> list[str]:
    return [t.get_block_type_slug() for t in STORE_BLOCK_TYPES]


def _how_to_create(name: str) -> str:
    return (
        f"Create it with `from blocks import LocalStore; LocalStore(path=...).save({name!r})` "
        "(or S3Store(bucket=..., prefix=...)), or in the Prefect UI after "
        "`prefect block register -m concord_pipelines.blocks.stores`"
    )
