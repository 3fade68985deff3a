"""Stores, and the one function that turns what a person typed into one.

``open_store`` accepts a folder path, ``file:///path``, ``s3://bucket/prefix`` or ``block:NAME``.
``block:`` is resolved through the ``concord.store_schemes`` entry point, which the ``blocks``
package registers, so the core never imports Prefect.
"""

from __future__ import annotations

import os
from typing import Callable
from urllib.parse import unquote, urlparse

from concord.errors import InvalidStoreURIError
from concord.stores.base import Ref, RefEntry, Store, canonical_ref, split_ref
from concord.stores.local import LocalDirStore

__all__ = [
    "LocalDirStore",
    "Ref",
    "RefEntry",
    "Store",
    "canonical_ref",
    "check_store_address",
    "open_store",
    "open_store_to_read",
    "register_scheme",
    "split_ref",
]

_SCHEMES: dict[str, Callable[[str], Store]] = {}


def register_scheme(scheme: str, factory: Callable[[str], Store]) -> None:
    """Teach :func:`open_store` a new ``scheme:`` prefix; ``factory`` gets the text after it."""
    _SCHEMES[scheme] = factory


def _load_entry_point(scheme: str) -> Callable[[str], Store] | None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="concord.store_schemes"):
        if ep.name == scheme:
            factory = ep.load()
            register_scheme(scheme, factory)
            return factory
    return None


def parse_s3_uri(spec: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``('bucket', 'some/prefix')``."""
    parsed = urlparse(spec)
    bucket = parsed.netloc
    prefix = parsed.path.strip("/")
    if not bucket:
        raise InvalidStoreURIError(spec, "no bucket name after s3://")
    if parsed.query or parsed.fragment:
        raise InvalidStoreURIError(spec, "query strings and fragments are not allowed")
    if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
        raise InvalidStoreURIError(spec, "the prefix has an empty, '.' or '..' segment")
    return bucket, prefix


def check_store_address(spec: str) -> str:
    """``spec`` stripped, if it can name a store (nothing is opened or created); else
    :class:`~concord.errors.InvalidStoreURIError` saying what is wrong with it."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidStoreURIError(str(spec), "empty store address: give a folder, file:///path, s3://bucket/prefix or block:NAME")
    spec = spec.strip()
    if spec.startswith("s3://"):
        from concord.stores.s3 import validate_bucket_name, validate_prefix

        bucket, prefix = parse_s3_uri(spec)
        validate_prefix(validate_bucket_name(bucket), prefix)  # the rules S3ObjectStore applies on open
    elif spec.startswith("file://"):
        if urlparse(spec).netloc not in ("", "localhost"):
            raise InvalidStoreURIError(spec, "file:// URIs must name a local path (file:///path)")
    else:
        scheme, sep, rest = spec.partition(":")
        if sep and len(scheme) > 1 and scheme.isidentifier():
            if scheme not in _SCHEMES and _load_entry_point(scheme) is None:
                raise InvalidStoreURIError(spec, f"unknown scheme {scheme!r} (folder, file://, s3:// or block:)")
            if not rest:
                raise InvalidStoreURIError(spec, f"nothing after '{scheme}:'")
    return spec


def open_store(spec: "str | os.PathLike | Store", *, create: bool = True, must_exist: bool = False) -> Store:
    """The store that ``spec`` names (a :class:`Store` is returned as it is).

    A folder is created unless ``create`` is False. With ``must_exist`` (every command that only
    reads) nothing is ever created, and a folder that holds no store, or is not there, raises
    :class:`~concord.errors.StoreNotFoundError` at once instead of reading as an empty store; an
    S3 bucket that does not exist says so on first use.
    """
    if isinstance(spec, Store):
        return spec
    if isinstance(spec, os.PathLike):
        return LocalDirStore(spec, create=create and not must_exist, must_exist=must_exist)
    spec = check_store_address(spec)
    if spec.startswith("s3://"):
        from concord.stores.s3 import S3ObjectStore

        bucket, prefix = parse_s3_uri(spec)
        return S3ObjectStore(bucket, prefix)
    if spec.startswith("file://"):
        return LocalDirStore(unquote(urlparse(spec).path), create=create and not must_exist, must_exist=must_exist)
    scheme, sep, rest = spec.partition(":")
    if sep and len(scheme) > 1 and scheme.isidentifier():
        return (_SCHEMES.get(scheme) or _load_entry_point(scheme))(rest)
    return LocalDirStore(spec, create=create and not must_exist, must_exist=must_exist)


def open_store_to_read(spec: "str | os.PathLike | Store") -> Store:
    """The store ``spec`` names, for a command that only reads: never created, and a path that
    holds no store is an error (:class:`~concord.errors.StoreNotFoundError`), not an empty store.

    A folder is looked at on the spot; a bucket and prefix (or a block's store) are asked for one
    key under ``refs/``, ``manifests/`` or ``chunks/`` (a missing bucket raises its own clear error)."""
    if isinstance(spec, Store):
        return spec
    from concord.errors import StoreAccessError, StoreNotFoundError

    store = open_store(spec, create=False, must_exist=True)
    if isinstance(store, LocalDirStore):
        return store
    try:
        held = holds_a_store(store)
    except StoreAccessError as exc:
        store.close()
        cause = getattr(exc.__cause__, "response", None) or {}
        if cause.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
            where = getattr(store, "endpoint_url", None) or "AWS"
            raise StoreNotFoundError(store.uri, f"bucket {getattr(store, 'bucket', '?')!r} does not exist at {where}") from None
        raise
    if not held:
        store.close()
        raise StoreNotFoundError(store.uri, "no refs/, manifests/ or chunks/ under it")
    return store


def holds_a_store(store: Store) -> bool:
    """Whether anything sits under ``refs/``, ``manifests/`` or ``chunks/`` of ``store``."""
    return any(next(iter(store._list_keys(prefix)), None) is not None for prefix in ("refs/", "manifests/", "chunks/"))
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidStoreURIError(str(spec), "empty store address")
    spec = spec.strip()
    if spec.startswith("s3://"):
        from concord.stores.s3 import S3ObjectStore

        bucket, prefix = parse_s3_uri(spec)
        return S3ObjectStore(bucket, prefix)
    if spec.startswith("file://"):
        parsed = urlparse(spec)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidStoreURIError(spec, "file:// URIs must name a local path (file:///path)")
        return LocalDirStore(unquote(parsed.path), create=create)
    scheme, sep, rest = spec.partition(":")
    if sep and len(scheme) > 1 and scheme.isidentifier():
        factory = _SCHEMES.get(scheme) or _load_entry_point(scheme)
        if factory is None:
            raise InvalidStoreURIError(spec, f"unknown scheme {scheme!r}")
        if not rest:
            raise InvalidStoreURIError(spec, f"nothing after '{scheme}:'")
        return factory(rest)
    return LocalDirStore(spec, create=create)
