"""Garbage collection: delete the manifests and chunks no ref can reach any more.

What stays: every root in the history of every ref (so ``REF~N`` and rollbacks keep working) and
every chunk those manifests name. Refs whose name starts with ``_`` are skipped: they are not
snapshots (a ledger head ``<tenant>/_ledger`` points at round hashes). Everything else is garbage
once it is older than the grace period; a snapshot synced by root alone, with no ref, is garbage
too.

Deleting is the one thing a store cannot take back, so a collection is careful:

* It refuses, and deletes nothing, when a ref names a manifest that is missing or damaged: what
  that snapshot keeps alive cannot be known until the manifest is repaired.
* Writers hold a lease while they write (:func:`write_lease`: a small document under
  ``gc/leases/``). A snapshot skips chunks the store already holds, and such a chunk may be old
  and unreferenced until the writer's ref moves; so a collection that finds an unexpired lease
  deletes nothing, and says who holds it. It looks again between batches of deletes and stops
  as soon as a lease appears.
* The grace period keeps everything written recently, by writers that hold no lease and by a
  writer that started in the moment after the collection last looked.
* Manifests go before chunks, so a collection stopped halfway never leaves a manifest naming
  chunks that are gone.

Temporary files that a killed writer left in a folder store (``.tmp-*``: never a chunk, manifest
or ref, which appear only whole) go too, once nobody has touched them for an hour (or the grace
period, if longer): a write in flight keeps touching its file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterator

from concord.errors import GcRefusedError, ManifestError, ManifestNotFoundError, StoreError
from concord.manifest import Manifest
from concord.progress import Progress, ensure
from concord.stores.base import Store, split_ref

log = logging.getLogger("concord.gc")

LEASE_PREFIX = "gc/leases"
#: how long a lease holds if its writer never removes it (a killed process)
DEFAULT_LEASE_TTL = 6 * 3600.0
#: how long a temporary file must lie untouched before it counts as a killed writer's leftover
LEFTOVER_AGE = 3600.0
#: deletes between two looks for new leases
SWEEP_BATCH = 256


# --------------------------------------------------------------------------- leases


@dataclass(frozen=True)
class Lease:
    """One writer's lease, as read back from the store."""

    key: str
    what: str
    expires: float  # POSIX seconds; +inf for a lease that cannot be read


@contextmanager
def write_lease(store: Store, what: str, ttl_seconds: float = DEFAULT_LEASE_TTL) -> Iterator[str]:
    """Hold a lease on ``store`` for the body: garbage collection deletes nothing meanwhile.

    ``what`` says who writes (it is shown when a collection is postponed). The lease is one small
    document, written on entry and removed on exit (also when the body raises); a writer killed
    before it can remove it holds the store for at most ``ttl_seconds``. Yields the lease's key.
    """
    if not ttl_seconds > 0:
        raise ValueError(f"ttl_seconds must be positive (how long a lease holds at most), got {ttl_seconds!r}")
    key = f"{LEASE_PREFIX}/{uuid.uuid4().hex}"
    started = datetime.now(timezone.utc)
    doc = {
        "what": str(what),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": started.isoformat(timespec="seconds"),
        "expires": (started + timedelta(seconds=ttl_seconds)).isoformat(timespec="seconds"),
    }
    # a fresh random key: no need to ask whether it exists first
    store.put_document(key, json.dumps(doc, indent=1).encode(), overwrite=True)
    try:
        yield key
    finally:
        _release(store, key)


def _release(store: Store, key: str) -> None:
    """Remove a lease. Failing to is not worth failing the write it guarded (or hiding the
    error that write raised): the lease expires by itself, and collections wait until then."""
    try:
        store.delete_document(key)
    except (StoreError, OSError) as exc:
        log.warning("could not remove lease %s from %s (%s); it expires by itself", key, store.uri, exc)


def read_leases(store: Store) -> list[Lease]:
    """Every lease in ``store``. One that cannot be read never expires: it may be a writer's,
    so it holds collections until someone removes it."""
    leases = []
    for key in store.list_documents(LEASE_PREFIX):
        data = store.get_document(key)
        if data is None:
            continue  # its writer finished while we looked
        try:
            doc = json.loads(data)
            expires = datetime.fromisoformat(doc["expires"])
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=timezone.utc)
            leases.append(Lease(key, str(doc["what"]), expires.timestamp()))
        except (ValueError, KeyError, TypeError):
            what = f"unreadable lease {key} (remove it once no snapshot or sync writes to {store.uri})"
            leases.append(Lease(key, what, float("inf")))
    return leases


def _live_leases(store: Store, now: float) -> list[Lease]:
    return [lease for lease in read_leases(store) if lease.expires > now]


# --------------------------------------------------------------------------- collection


@dataclass(frozen=True)
class GcResult:
    """What a collection found and did.

    ``deleted_*`` count what was deleted, or in a dry run what would have been; when the
    collection was postponed (``postponed_by`` names the leases' holders) nothing was deleted
    after the first lease was seen. ``young_chunks`` are unreferenced chunks kept because they are
    younger than the grace period.
    """

    store: str
    live_roots: int
    live_chunks: int
    unreferenced_chunks: int
    unreferenced_bytes: int
    deleted_chunks: int
    deleted_bytes: int
    deleted_manifests: int
    young_chunks: int
    dry_run: bool
    postponed_by: list[str] = field(default_factory=list)
    deleted_leftovers: int = 0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["postponed_by"] = list(self.postponed_by)
        return d


def collect_garbage(
    store: Store,
    *,
    grace_seconds: float,
    dry_run: bool = False,
    now: float | None = None,
    progress: Progress | None = None,
) -> GcResult:
    """Delete the manifests and chunks of ``store`` that no ref reaches and that are older than
    ``grace_seconds`` (see the module's documentation for what is kept and why).

    With ``dry_run`` nothing is deleted (expired leases neither), and the result says what would
    be. ``now`` (POSIX seconds) is the time ages and leases are measured against. Raises
    :class:`~concord.errors.GcRefusedError`, having deleted nothing, when a ref's manifest is
    missing or damaged.
    """
    if not (isinstance(grace_seconds, (int, float)) and grace_seconds >= 0):
        raise ValueError(
            f"grace_seconds must be 0 or more (how old an unreferenced object must be to be "
            f"deleted; give at least the longest snapshot or sync time), got {grace_seconds!r}"
        )
    now = time.time() if now is None else float(now)
    cutoff = now - grace_seconds

    live_roots = _live_roots(store)
    live = _chunks_of(store, live_roots)
    manifests = [(r, m) for r, _, m in store.iter_manifest_stats() if r not in live_roots]
    doomed_manifests = [r for r, m in manifests if m < cutoff]
    # a young manifest stays, and so must every chunk it names (its ref may be about to move)
    live |= _chunks_of_unreferenced(store, [r for r, m in manifests if m >= cutoff])
    unreferenced = [(c, size, m) for c, size, m in store.iter_chunk_stats() if c not in live]
    doomed = [(c, size) for c, size, m in unreferenced if m < cutoff]
    # temporary files of writes a killed process never finished; a write in flight keeps touching
    # its file, so one untouched for LEFTOVER_AGE (or the grace period, if longer) is stranded
    leftovers = [k for k, _, m in store.iter_leftovers() if m < now - max(grace_seconds, LEFTOVER_AGE)]

    result = dict(
        store=store.uri,
        live_roots=len(live_roots),
        live_chunks=len(live),
        unreferenced_chunks=len(unreferenced),
        unreferenced_bytes=sum(size for _, size, _ in unreferenced),
        young_chunks=len(unreferenced) - len(doomed),
        dry_run=dry_run,
    )
    leases = read_leases(store)
    if not dry_run:
        for lease in leases:
            if lease.expires <= now:
                _release(store, lease.key)
    holders = [lease.what for lease in leases if lease.expires > now]
    if holders:
        return GcResult(**result, deleted_chunks=0, deleted_bytes=0, deleted_manifests=0, postponed_by=holders)
    if dry_run:
        return GcResult(
            **result,
            deleted_chunks=len(doomed),
            deleted_bytes=sum(size for _, size in doomed),
            deleted_manifests=len(doomed_manifests),
            deleted_leftovers=len(leftovers),
        )
    swept = _Sweep(store, now, ensure(progress))
    swept.run(doomed_manifests, doomed)
    if not swept.postponed_by:
        for key in leftovers:
            store.delete_leftover(key)
    return GcResult(
        **result,
        deleted_chunks=swept.chunks,
        deleted_bytes=swept.bytes,
        deleted_manifests=swept.manifests,
        postponed_by=swept.postponed_by,
        deleted_leftovers=0 if swept.postponed_by else len(leftovers),
    )


def _live_roots(store: Store) -> dict[str, str]:
    """Every root in the history of every snapshot ref, with one ref that names it."""
    roots: dict[str, str] = {}
    for name in store.list_refs():
        if split_ref(name)[1].startswith("_"):
            continue  # not a snapshot ref (a ledger head names round hashes)
        try:
            ref = store.read_ref(name)
        except ManifestError as exc:
            raise GcRefusedError(
                store.uri, name, None, f"the ref itself is unreadable ({exc.problem}); copy it back from another store"
            ) from exc
        for entry in ref.history if ref is not None else ():
            roots.setdefault(entry.root, name)
    return roots


def _chunks_of(store: Store, roots: dict[str, str]) -> set[str]:
    """Every chunk the manifests of ``roots`` name, each manifest fully verified first."""

    def load(root: str) -> Manifest:
        try:
            return Manifest.from_json(store.get_manifest_bytes(root), expected_root=root, verify=True)
        except ManifestNotFoundError as exc:
            raise GcRefusedError(store.uri, roots[root], root, "its manifest is missing") from exc
        except ManifestError as exc:
            raise GcRefusedError(store.uri, roots[root], root, f"its manifest is damaged ({exc.problem})") from exc

    return _union(store, load, sorted(roots))


def _chunks_of_unreferenced(store: Store, roots: list[str]) -> set[str]:
    """The chunks named by manifests no ref names yet; one that cannot be read keeps none."""

    def load(root: str) -> Manifest | None:
        try:
            return Manifest.from_json(store.get_manifest_bytes(root), expected_root=root, verify=True)
        except (ManifestError, ManifestNotFoundError):
            return None

    return _union(store, load, roots)


def _union(store: Store, load, roots: list[str]) -> set[str]:
    """The union of the chunk ids of the manifests ``load`` returns, loaded in parallel."""
    chunks: set[str] = set()
    if not roots:
        return chunks
    with ThreadPoolExecutor(max(1, min(store.parallelism, len(roots))), thread_name_prefix="concord-gc") as pool:
        for manifest in pool.map(load, roots):
            if manifest is not None:
                chunks.update(manifest.chunk_lengths())
    return chunks


class _Sweep:
    """Deletes in batches, looking for new leases before each, so a writer that starts during
    a long sweep stops it."""

    def __init__(self, store: Store, now: float, progress: Progress) -> None:
        self.store = store
        self.now = now
        self.progress = progress
        self.manifests = self.chunks = self.bytes = 0
        self.postponed_by: list[str] = []

    def run(self, manifests: list[str], chunks: list[tuple[str, int]]) -> None:
        self.progress.start(sum(size for _, size in chunks), "gc")
        try:
            for i in range(0, len(manifests), SWEEP_BATCH):
                if self._postponed():
                    return
                self.manifests += self._delete(self.store.delete_manifest, manifests[i : i + SWEEP_BATCH])
            for i in range(0, len(chunks), SWEEP_BATCH):
                if self._postponed():
                    return
                batch = chunks[i : i + SWEEP_BATCH]
                self.chunks += self._delete(self.store.delete_chunk, [c for c, _ in batch])
                self.bytes += sum(size for _, size in batch)
                self.progress.advance(sum(size for _, size in batch))
        finally:
            self.progress.close()

    def _postponed(self) -> bool:
        self.postponed_by = [lease.what for lease in _live_leases(self.store, self.now)]
        return bool(self.postponed_by)

    def _delete(self, delete, names: list[str]) -> int:
        with ThreadPoolExecutor(max(1, min(self.store.parallelism, len(names))), thread_name_prefix="concord-gc") as pool:
            for _ in pool.map(delete, names):
                pass
        return len(names)


__all__ = [
    "DEFAULT_LEASE_TTL",
    "GcResult",
    "LEASE_PREFIX",
    "Lease",
    "collect_garbage",
    "read_leases",
    "write_lease",
]
