"""Stores, and opening the one a person named.

``open_store`` accepts a folder path, ``file:///path``, ``s3://bucket/prefix`` or ``block:NAME``,
parsed once into a :class:`~concord.stores.address.StoreAddress`. ``block:`` is resolved through
the ``concord.store_schemes`` entry point, which the ``blocks`` package registers, so the core
never imports Prefect.
"""

from __future__ import annotations

import os

from concord.stores.address import StoreAddress, register_scheme
from concord.stores.base import Ref, RefEntry, Store, canonical_ref, split_ref
from concord.stores.local import LocalDirStore

__all__ = [
    "LocalDirStore",
    "Ref",
    "RefEntry",
    "Store",
    "StoreAddress",
    "canonical_ref",
    "check_store_address",
    "open_store",
    "open_store_to_read",
    "register_scheme",
    "split_ref",
]


def check_store_address(spec: str) -> str:
    """``spec`` stripped, if it can name a store (nothing is opened or created); else
    :class:`~concord.errors.InvalidStoreURIError` saying what is wrong with it."""
    return StoreAddress.parse(spec).text


def open_store(spec: str | os.PathLike | StoreAddress | Store, *, create: bool = True, must_exist: bool = False) -> Store:
    """The store that ``spec`` names (a :class:`Store` is returned as it is); see
    :meth:`StoreAddress.open` for ``create`` and ``must_exist``."""
    if isinstance(spec, Store):
        return spec
    return StoreAddress.parse(spec).open(create=create, must_exist=must_exist)


def open_store_to_read(spec: str | os.PathLike | StoreAddress | Store) -> Store:
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
    return any(next(iter(store._list_keys(prefix)), None) is not None for prefix in ("refs/", "manifests/", "chunks/")) or (
        store._exists_many(["config"])[0]
    )
