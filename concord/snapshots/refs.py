"""Naming snapshots: resolve ``REF``, ``REF~N`` or a root; load manifests; roll refs back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from concord.errors import HistoryError, RefNotFoundError
from concord.hashing import is_digest
from concord.snapshots.manifest import Manifest
from concord.stores.base import Store, canonical_ref


def resolve_root(store: Store, spec: str) -> str:
    """A 64-hex root as it is; ``NAME`` → the ref's root; ``NAME~N`` → N versions before it."""
    if is_digest(spec):
        return spec
    name, tilde, back = spec.partition("~")
    steps = 0
    if tilde:
        if not back.isdigit():
            raise HistoryError(f"{spec!r}: after '~' put a number of versions back, e.g. {name}~1")
        steps = int(back)
    ref = store.read_ref(name)
    if ref is None:
        raise RefNotFoundError(store.uri, canonical_ref(name))
    roots = [e.root for e in ref.history]
    if steps >= len(roots):
        raise HistoryError(
            f"{spec!r}: ref {ref.name} has only {len(roots)} version(s) in {store.uri}; "
            f"use ~0 to ~{len(roots) - 1}"
        )
    return roots[-1 - steps]


def load_manifest(store: Store, root: str, *, verify: bool = True) -> Manifest:
    return Manifest.from_json(store.get_manifest_bytes(root), expected_root=root, verify=verify)


@dataclass(frozen=True)
class RollbackResult:
    """What :func:`rollback` did: ``ref`` moved from ``previous`` to ``root``, as its version
    ``version``."""

    ref: str
    root: str
    previous: str
    version: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def rollback(store: Store, ref: str, to: str | None = None) -> RollbackResult:
    """Move ``ref`` back to ``to`` (a root from its history, or a unique prefix of one of at
    least 8 hex digits), or by default to the root it held before the current one."""
    name = canonical_ref(ref)
    current = store.read_ref(name)
    if current is None:
        raise RefNotFoundError(store.uri, name)
    earlier = [e.root for e in current.history[:-1]]
    if to is None:
        candidates = [r for r in earlier if r != current.root]
        if not candidates:
            raise HistoryError(
                f"ref {name} in {store.uri} has no earlier root to roll back to "
                f"(its history has {len(current.history)} version(s))"
            )
        target = candidates[-1]
    else:
        if len(to) < 8 or not all(c in "0123456789abcdef" for c in to):
            raise HistoryError(f"--to {to!r}: give a root of 64 hex digits, or at least its first 8")
        matches = sorted({r for r in earlier + [current.root] if r.startswith(to)})
        if len(matches) != 1:
            what = "matches no root" if not matches else f"matches {len(matches)} roots"
            raise HistoryError(
                f"--to {to}: {what} in the history of ref {name}; see `concord log {store.uri} {name}`"
            )
        target = matches[0]
    if not store.has_manifest(target):
        from concord.errors import ManifestNotFoundError

        raise ManifestNotFoundError(store.uri, target)
    updated = store.cas_ref(name, current.root, target, f"rollback from {current.root[:12]}")
    return RollbackResult(ref=name, root=target, previous=current.root, version=updated.version)
