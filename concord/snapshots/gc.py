"""Garbage collection: delete the manifests and chunks no ref can reach any more.

What stays: every root in the history of every ref (so ``REF~N`` and rollbacks keep working) and
every chunk those manifests name. Every ref counts, whatever its name: the one exception is the
store format's own ``<tenant>/_ledger`` (a federation ledger's head names round hashes, which
have no manifest), and that name is refused wherever a user could create a ref. Everything else
is garbage once it is older than the grace period; a snapshot synced by root alone, with no ref,
is garbage too.

Deleting is the one thing a store cannot take back, so a collection follows a protocol (written
out in docs/architecture.md, "Garbage collection"), not a timing:

* **Writers hold a shared lease** (:func:`~concord.stores.leases.write_lease`) from before they first look at what the
  store holds until after their ref has moved. A lease is a small document under ``gc/leases/``
  that its writer renews (a heartbeat) while it lives.
* **A collection holds an exclusive lock** (a document under ``gc/collecting/``) while it
  deletes. Each side writes its own document first and only then looks for the other's, so with
  the read-after-write consistency of a folder and of S3 at least one of them sees the other: a
  writer that finds a collection takes its lease back and waits for the collection to end; a
  collection that finds a live lease deletes nothing (``postponed_by``), unless asked to wait
  for the writers to finish (``wait_seconds``) while new ones wait for it.
* **Mark, then mark again under the lock.** The expensive marking (reading every live manifest)
  runs without the lock; once the lock is held and no writer is left, the refs and manifests are
  read again and whatever a writer that finished meanwhile made live is taken off the list. So a
  writer that only *reuses* objects (a sync of a root the store still holds unreferenced, a
  snapshot whose chunks all exist) can never have its snapshot deleted under it.
* **Stale leases** (and locks) are recognised: one whose heartbeat stopped (expired), or whose
  process is gone from this machine (same host, boot and process namespace; the process id no
  longer runs, or runs another program). A stale document is removed by the next collection.
* It refuses, and deletes nothing, when a ref names a manifest that is missing or damaged: what
  that snapshot keeps alive cannot be known until the manifest is repaired.
* A chunk stored as a delta keeps its base chunk: a base any chunk that stays is a delta of is
  never deleted, even when no ref names it any more (docs/deltas.md). Bases are stored whole, so
  there is no chain to follow. Which base each delta needs comes from the store's delta index
  (one listing; a writer puts a delta's entry there before the delta), or, in a store whose
  index is not known whole, from the first bytes of every chunk that stays; such a collection
  then writes the missing entries and marks the index whole.
* The grace period keeps everything written recently. Manifests go before chunks, so a
  collection stopped halfway never leaves a manifest naming chunks that are gone.
* A root's signature documents (``signatures/<root>/<key id>.sig``) go with its manifest, under
  the same lock and rules, and never while the root is live. Signatures whose root has no
  manifest at all (left by a collection from before signatures were collected, or stopped
  between the two) go once they are older than the grace period; a manifest written meanwhile
  keeps them.

Temporary files that a killed writer left in a folder store (``.tmp-*``: never a chunk, manifest
or ref, which appear only whole) go too, once nobody has touched them for an hour (or the grace
period, if longer): a write in flight keeps touching its file.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from concord.errors import GcRefusedError, ManifestError, ManifestNotFoundError
from concord.progress import Progress, ensure
from concord.snapshots.manifest import Manifest
from concord.stores.base import LEDGER_HEAD, Store, split_ref
from concord.stores.leases import (
    DEFAULT_LEASE_TTL,
    DEFAULT_WRITER_WAIT,
    LEASE_PREFIX,
    LOCK_PREFIX,
    Heartbeat,
    Lease,
    collection_lock,
    live_leases,
    read_leases,
    read_locks,
    remove_stale,
    write_lease,
)

log = logging.getLogger("concord.gc")

#: how long a temporary file must lie untouched before it counts as a killed writer's leftover
LEFTOVER_AGE = 3600.0
#: deletes between two checks that the collection still holds its lock
SWEEP_BATCH = 256
#: where the signature documents of a root live (``signatures/<root>/<key id>.sig``; the trust
#: wing writes and reads them, here they are what goes with a root)
SIGNATURE_PREFIX = "signatures"


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
    #: signature documents deleted with their root (or, without a manifest, once past the grace)
    deleted_signatures: int = 0
    #: unreferenced chunks kept because a delta that stays needs them as its base
    kept_bases: int = 0

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
    wait_seconds: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> GcResult:
    """Delete the manifests and chunks of ``store`` that no ref reaches and that are older than
    ``grace_seconds`` (see the module's documentation for what is kept and why).

    With ``dry_run`` nothing is deleted (stale leases neither), no lock is taken, and the result
    says what would be. ``now`` (POSIX seconds) is the time ages and leases are measured against.
    A writer holding a lease postpones the collection (``postponed_by`` names it), unless
    ``wait_seconds`` gives the writers at work that long to finish while new ones wait. Raises
    :class:`~concord.errors.GcRefusedError`, having deleted nothing, when a ref's manifest is
    missing or damaged.
    """
    if isinstance(grace_seconds, bool) or not (isinstance(grace_seconds, (int, float)) and grace_seconds >= 0):
        raise ValueError(
            f"grace_seconds must be 0 or more (how old an unreferenced object must be to be "
            f"deleted; give at least the longest snapshot or sync time), got {grace_seconds!r}"
        )
    if isinstance(wait_seconds, bool) or not (isinstance(wait_seconds, (int, float)) and 0 <= wait_seconds < float("inf")):
        raise ValueError(f"wait_seconds must be 0 or more seconds (how long to wait for writers at work), got {wait_seconds!r}")
    began = time.time()
    now = began if now is None else float(now)

    def clock() -> float:  # ``now`` moved on by the time spent since
        return now + (time.time() - began)

    plan = _Plan(store, now, grace_seconds)
    if dry_run:
        holders = [lease.what for lease in live_leases(store, now)]
        if holders:
            return plan.result(dry_run=True, postponed_by=holders)
        return plan.result(
            dry_run=True, deleted=plan.doomed_counts(), deleted_leftovers=len(plan.leftovers), deleted_signatures=len(plan.doomed_signatures)
        )
    with collection_lock(store, f"garbage collection by {socket.gethostname()} pid {os.getpid()}") as lock:
        holders = _await_writers(store, clock, wait_seconds, sleep)
        if holders:
            return plan.result(dry_run=False, postponed_by=holders)
        plan.remark()  # what writers that finished since the first mark made live
        swept = _Sweep(store, lock, ensure(progress))
        swept.run(plan.doomed_manifests, plan.doomed, plan.doomed_signatures, plan.doomed_entries(plan.written))
        if not swept.postponed_by:
            for key in plan.leftovers:
                store.delete_leftover(key)
            plan.complete_index({c for c, _ in plan.doomed})
    return plan.result(
        dry_run=False,
        deleted=(swept.chunks, swept.bytes, swept.manifests),
        postponed_by=swept.postponed_by,
        deleted_leftovers=0 if swept.postponed_by else len(plan.leftovers),
        deleted_signatures=swept.signatures,
    )


def _await_writers(store: Store, clock: Callable[[], float], wait_seconds: float, sleep) -> list[str]:
    """With the lock held: remove stale leases and locks, and wait (up to ``wait_seconds``) for
    the live leases to go. Returns the holders still there ([] when the store is ours)."""
    deadline = time.monotonic() + wait_seconds
    delay = 0.2
    while True:
        live = remove_stale(store, clock())
        if not live:
            return []
        left = deadline - time.monotonic()
        if left <= 0:
            return [lease.what for lease in live]
        sleep(min(delay, left))
        delay = min(delay * 2, 5.0)


class _Plan:
    """What a collection found: the first mark (no lock), then a second under the lock."""

    def __init__(self, store: Store, now: float, grace_seconds: float) -> None:
        self.store = store
        cutoff = now - grace_seconds
        self.live_roots = _live_roots(store)
        self.live = _chunks_of(store, self.live_roots)
        manifests = {r: m for r, _, m in store.iter_manifest_stats()}
        self.listed = set(manifests)
        unreferenced = [r for r in manifests if r not in self.live_roots]
        self.doomed_manifests = [r for r in unreferenced if manifests[r] < cutoff]
        # a young manifest stays, and so must every chunk it names (its ref may be about to move)
        self.live |= _chunks_of_unreferenced(store, [r for r in unreferenced if manifests[r] >= cutoff])
        stats = list(store.iter_chunk_stats())
        self.chunk_names = {c for c, _, _ in stats}
        # listed after the chunks: a delta written between the two listings has its entry (written
        # before it) in this one. None: the index is not known whole, the heads are read instead
        self.index = store.delta_index()
        self.heads: dict[str, str | None] = {}  # object name -> its base, from its first bytes
        self.written: set[str] = set()  # chunks the second mark found written since the first
        self.unreferenced = [(c, size, m) for c, size, m in stats if c not in self.live]
        self.doomed = [(c, size) for c, size, m in self.unreferenced if m < cutoff]
        # a chunk that stays and is stored as a delta keeps its base (docs/deltas.md)
        self.kept_bases = 0
        doomed_names = {c for c, _ in self.doomed}
        self._spare_bases([c for c in self.chunk_names if c not in doomed_names])
        self.young = len(self.unreferenced) - len(self.doomed)
        # temporary files of writes a killed process never finished; a write in flight keeps
        # touching its file, so one untouched for LEFTOVER_AGE (or the grace period) is stranded
        self.leftovers = [k for k, _, m in store.iter_leftovers() if m < now - max(grace_seconds, LEFTOVER_AGE)]
        # signature documents: those of a doomed manifest go with it; those whose root has no
        # manifest at all (orphans) once they are past the grace period themselves
        self.signatures = _signature_stats(store)
        self.cutoff = cutoff
        self._doom_signatures()

    def _spare_bases(self, names) -> None:
        """Take off the list of what goes every base chunk that a chunk of ``names`` (object names
        of chunks that stay) is a delta of: no delta is ever left without its base. A base is
        stored whole, so one level is all there is. The bases come from the delta index where the
        store has it whole, else from the first bytes of each chunk; only when something is to go."""
        if not self.doomed:
            return
        names = list(names)
        if not names:
            return
        store = self.store
        if self.index is not None:
            needed: dict[str, set[str]] = {}
            for name, base, _ in self.index.values():
                needed.setdefault(name, set()).add(base)
            bases = {b for n in names for b in needed.get(n, ())}
        else:
            self._read_heads(names)
            bases = {b for n in names if (b := self.heads.get(n)) is not None}
        spared = {c for c, _ in self.doomed if c in bases}
        if spared:
            self.doomed = [(c, size) for c, size in self.doomed if c not in spared]
            self.unreferenced = [u for u in self.unreferenced if u[0] not in spared]
            self.live |= spared
            self.kept_bases += len(spared)
            log.info("%s: %d unreferenced chunk(s) stay as the bases of deltas that stay", store.uri, len(spared))

    def _read_heads(self, names) -> None:
        """The base of each chunk of ``names`` whose head was not read yet, from its first bytes."""
        todo = [n for n in dict.fromkeys(names) if n not in self.heads]
        if not todo:
            return
        store = self.store
        with ThreadPoolExecutor(max(1, min(store.parallelism, len(todo))), thread_name_prefix="concord-gc") as pool:
            self.heads.update(zip(todo, pool.map(store.chunk_base, todo)))

    def doomed_entries(self, written: set[str]) -> list[str]:
        """The delta index's entries that go with this collection (after its chunks): those of
        the deltas it deletes, and those whose delta is in the store no more (a delta a killed
        collection deleted before its entry, a killed writer's entry) once past the grace period."""
        if not self.index:
            return []
        doomed = {c for c, _ in self.doomed}
        here = self.chunk_names | written
        return sorted(
            key for key, (name, _, mtime) in self.index.items() if name in doomed or (name not in here and mtime < self.cutoff)
        )

    def complete_index(self, deleted: set[str]) -> None:
        """With the lock held, after a sweep that went to its end, in a store whose delta index is
        not known whole: read the first bytes of every chunk left whose head no mark read, write
        the entry of each delta, then mark the index whole; the next collections list it instead
        of reading a head per chunk. Only after a mark that read the heads (it had something to
        delete), so a collection with nothing to delete reads nothing."""
        if self.index is not None or not self.heads:
            return
        left = [c for c, _, _ in self.store.iter_chunk_stats() if c not in deleted]
        self._read_heads(left)
        self.store.index_deltas((n, self.heads[n]) for n in left if self.heads[n] is not None)
        self.store.mark_delta_index()
        log.info("%s: the delta index now names the base of every delta chunk", self.store.uri)

    def _doom_signatures(self) -> None:
        doomed = set(self.doomed_manifests)
        self.doomed_signatures = [
            key
            for key, root, mtime in self.signatures
            if root not in self.live_roots
            and (root in doomed or (root not in self.listed and mtime < self.cutoff))
        ]

    def remark(self) -> None:
        """Read the refs and the manifest listing again (the lock is held and no writer is at
        work): a root a ref gained since the first mark, and a manifest written since, keep
        their chunks; what they keep is taken off the lists of what goes."""
        roots = _live_roots(self.store)
        new = {r: name for r, name in roots.items() if r not in self.live_roots}
        if new:
            self.live |= _chunks_of(self.store, new)
            self.live_roots.update(new)
        fresh = [r for r, _, _ in self.store.iter_manifest_stats() if r not in self.listed and r not in self.live_roots]
        self.live |= _chunks_of_unreferenced(self.store, fresh)
        # entries whose delta the first listing did not see: a delta written since, or none
        unseen = bool(self.index) and any(name not in self.chunk_names for name, _, _ in self.index.values())
        if self.doomed or unseen:
            # chunks written since the first listing, and doomed ones a writer made live again,
            # may be deltas of a chunk on the list: their bases stay
            self.written = {c for c, _, _ in self.store.iter_chunk_stats() if c not in self.chunk_names}
            if self.index is not None:
                self.index = self.store.delta_index()  # after the chunks again: the new deltas' entries
        if self.doomed:
            doomed_names = {c for c, _ in self.doomed}
            self._spare_bases(self.written | {c for c in doomed_names if c in self.live})
        # a signature whose manifest arrived since is no orphan: it stays with its (young) manifest
        self.listed.update(fresh)
        if new or fresh:
            self.doomed_manifests = [r for r in self.doomed_manifests if r not in self.live_roots]
            self.unreferenced = [u for u in self.unreferenced if u[0] not in self.live]
            before = len(self.doomed)
            self.doomed = [(c, size) for c, size in self.doomed if c not in self.live]
            self._doom_signatures()
            log.info("%s: %d roots and %d manifests written during the mark keep %d chunks", self.store.uri, len(new), len(fresh), before - len(self.doomed))

    def doomed_counts(self) -> tuple[int, int, int]:
        return len(self.doomed), sum(size for _, size in self.doomed), len(self.doomed_manifests)

    def result(
        self, *, dry_run: bool, deleted=(0, 0, 0), postponed_by=(), deleted_leftovers: int = 0, deleted_signatures: int = 0
    ) -> GcResult:
        chunks, nbytes, manifests = deleted
        unreferenced_chunks = len(self.unreferenced)
        return GcResult(
            store=self.store.uri,
            live_roots=len(self.live_roots),
            live_chunks=len(self.live),
            unreferenced_chunks=unreferenced_chunks,
            unreferenced_bytes=sum(size for _, size, _ in self.unreferenced),
            deleted_chunks=chunks,
            deleted_bytes=nbytes,
            deleted_manifests=manifests,
            young_chunks=unreferenced_chunks - len(self.doomed),
            dry_run=dry_run,
            postponed_by=list(postponed_by),
            deleted_leftovers=deleted_leftovers,
            deleted_signatures=deleted_signatures,
            kept_bases=self.kept_bases,
        )


def _signature_stats(store: Store) -> list[tuple[str, str, float]]:
    """``(document key, root, modification time)`` of every signature document of ``store``
    (``signatures/<root>/…``; anything else under ``signatures/`` is left alone)."""
    out = []
    for key, _, mtime in store.list_document_stats(SIGNATURE_PREFIX):
        parts = key.split("/")
        if len(parts) == 3 and len(parts[1]) == 64 and all(c in "0123456789abcdef" for c in parts[1]) and not parts[2].startswith(".tmp-"):
            out.append((key, parts[1], mtime))
    return out


def _live_roots(store: Store) -> dict[str, str]:
    """Every root in the history of every ref, with one ref that names it.

    Every ref counts: a ledger head (``<tenant>/_ledger``) names round hashes, which have no
    manifest, so its roots that have none are passed over; one that has a manifest is kept."""
    roots: dict[str, str] = {}
    ledger_roots: dict[str, str] = {}
    for name in store.list_refs():
        try:
            ref = store.read_ref(name)
        except ManifestError as exc:
            raise GcRefusedError(
                store.uri, name, None, f"the ref itself is unreadable ({exc.problem}); copy it back from another store"
            ) from exc
        into = ledger_roots if split_ref(name)[1] == LEDGER_HEAD else roots
        for entry in ref.history if ref is not None else ():
            into.setdefault(entry.root, name)
    if ledger_roots:
        held = store.has_manifests(r for r in ledger_roots if r not in roots)
        for r in held:
            roots.setdefault(r, ledger_roots[r])
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
    """The union of the chunk object names (the ids, or in an encrypted store their keyed names,
    as :meth:`Store.iter_chunk_stats` lists them) of the manifests ``load`` returns, loaded in parallel."""
    chunks: set[str] = set()
    if not roots:
        return chunks
    encoding = store.encoding()
    with ThreadPoolExecutor(max(1, min(store.parallelism, len(roots))), thread_name_prefix="concord-gc") as pool:
        for manifest in pool.map(load, roots):
            if manifest is not None:
                ids = manifest.chunk_lengths()
                chunks.update(map(encoding.chunk_name, ids) if encoding.encrypted else ids)
    return chunks


class _Sweep:
    """Deletes in batches, checking before each that the collection still holds its lock for
    certain (a collection paused past its heartbeat's lifetime stops: writers may be at work)."""

    def __init__(self, store: Store, lock: Heartbeat, progress: Progress) -> None:
        self.store = store
        self.lock = lock
        self.progress = progress
        self.manifests = self.chunks = self.bytes = self.signatures = 0
        self.postponed_by: list[str] = []

    def run(self, manifests: list[str], chunks: list[tuple[str, int]], signatures: list[str] = (), entries: list[str] = ()) -> None:
        self.progress.start(sum(size for _, size in chunks), "gc")
        try:
            for i in range(0, len(manifests), SWEEP_BATCH):
                if self._lost():
                    return
                self.manifests += self._delete(self.store.delete_manifest, manifests[i : i + SWEEP_BATCH])
            # after the manifests: a collection stopped between the two leaves orphan signatures,
            # which the next one collects, never a snapshot that lost its signatures but stayed
            for i in range(0, len(signatures), SWEEP_BATCH):
                if self._lost():
                    return
                self.signatures += self._delete(self.store.delete_document, list(signatures[i : i + SWEEP_BATCH]))
            for i in range(0, len(chunks), SWEEP_BATCH):
                if self._lost():
                    return
                batch = chunks[i : i + SWEEP_BATCH]
                self.chunks += self._delete(self.store.delete_chunk_object, [c for c, _ in batch])
                self.bytes += sum(size for _, size in batch)
                self.progress.advance(sum(size for _, size in batch))
            # after the chunks: a delta is never in the store without its entry
            for i in range(0, len(entries), SWEEP_BATCH):
                if self._lost():
                    return
                self._delete(self.store.delete_delta_entry, list(entries[i : i + SWEEP_BATCH]))
        finally:
            self.progress.close()

    def _lost(self) -> bool:
        if not self.lock.fresh():
            self.postponed_by = ["this collection, whose lock was not renewed in time (stopped to let writers on)"]
        return bool(self.postponed_by)

    def _delete(self, delete, names: list[str]) -> int:
        with ThreadPoolExecutor(max(1, min(self.store.parallelism, len(names))), thread_name_prefix="concord-gc") as pool:
            for _ in pool.map(delete, names):
                pass
        return len(names)


__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_WRITER_WAIT",
    "LOCK_PREFIX",
    "GcResult",
    "LEASE_PREFIX",
    "Lease",
    "collect_garbage",
    "read_leases",
    "read_locks",
    "write_lease",
]
