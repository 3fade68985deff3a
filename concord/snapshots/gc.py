"""Garbage collection: delete the manifests and chunks no ref can reach any more.

What stays: every root in the history of every ref (so ``REF~N`` and rollbacks keep working) and
every chunk those manifests name. Every ref counts, whatever its name: the one exception is the
store format's own ``<tenant>/_ledger`` (a federation ledger's head names round hashes, which
have no manifest), and that name is refused wherever a user could create a ref. Everything else
is garbage once it is older than the grace period; a snapshot synced by root alone, with no ref,
is garbage too.

Deleting is the one thing a store cannot take back, so a collection follows a protocol (written
out in docs/architecture.md, "Garbage collection"), not a timing:

* **Writers hold a shared lease** (:func:`write_lease`) from before they first look at what the
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

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from concord.errors import GcRefusedError, ManifestError, ManifestNotFoundError, StoreError, StoreLockedError
from concord.progress import Progress, ensure
from concord.snapshots.manifest import Manifest
from concord.stores.base import LEDGER_HEAD, Store, split_ref

log = logging.getLogger("concord.gc")

LEASE_PREFIX = "gc/leases"
#: where a collection's exclusive lock lives while it deletes
LOCK_PREFIX = "gc/collecting"
#: how long a lease (or lock) holds once its heartbeat stops (a killed process on another host)
DEFAULT_LEASE_TTL = 600.0
#: how long a writer waits for a collection to end before it gives up
DEFAULT_WRITER_WAIT = 3600.0
#: how long a temporary file must lie untouched before it counts as a killed writer's leftover
LEFTOVER_AGE = 3600.0
#: deletes between two checks that the collection still holds its lock
SWEEP_BATCH = 256
#: where the signature documents of a root live (``signatures/<root>/<key id>.sig``; the trust
#: wing writes and reads them, here they are what goes with a root)
SIGNATURE_PREFIX = "signatures"


# --------------------------------------------------------------------------- who holds a lease


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), or None if unknown or gone."""
    stat = _read_text(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _me() -> dict:
    """What identifies this process to another on the same machine."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "boot": _read_text("/proc/sys/kernel/random/boot_id"),
        "pid_ns": _pid_namespace(),
        "pid_start": _process_start(os.getpid()),
    }


def _process_state(doc: dict) -> str | None:
    """``"gone"`` or ``"alive"`` when ``doc`` was written by a process of this very machine (same
    host name, boot and process namespace): whether that process still runs (the same process id
    running another program counts as gone). None when it cannot be told from here: another
    machine or container; the heartbeat's expiry decides then."""
    me = _me()
    if not (me["boot"] and me["pid_ns"]):
        return None
    if (doc.get("host"), doc.get("boot"), doc.get("pid_ns")) != (me["host"], me["boot"], me["pid_ns"]):
        return None
    pid = doc.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    started = doc.get("pid_start")
    now_started = _process_start(pid)
    if now_started is None:
        return None if os.path.exists(f"/proc/{pid}") else "gone"
    if not isinstance(started, str):
        return None
    return "alive" if started == now_started else "gone"


# --------------------------------------------------------------------------- leases and locks


@dataclass(frozen=True)
class Lease:
    """One writer's lease (or a collection's lock), as read back from the store."""

    key: str
    what: str
    expires: float  # POSIX seconds; +inf for a lease that cannot be read
    #: its process seen from this machine: "alive", "gone", or None (another machine: unknown)
    process: str | None = None
    #: the document does not read (garbage bytes, another shape); ``what`` says how to remove it
    unreadable: bool = False

    def stale(self, now: float) -> bool:
        """Whether the lease no longer holds: its process is gone, or (for a process this machine
        cannot see) its heartbeat stopped. A process seen alive holds its lease."""
        if self.process is not None:
            return self.process == "gone"
        return self.expires <= now


class _Heartbeat:
    """Keeps one lease document alive: rewrites its expiry every ``ttl / 5`` (at most a minute)
    until stopped. A renewal that fails is logged and tried again at the next beat. Every lease
    and lock of the process is renewed by one thread (:class:`_Beats`), however many stores it
    writes to at once."""

    def __init__(self, store: Store, key: str, doc: dict, ttl: float) -> None:
        self.store, self.key, self.doc, self.ttl = store, key, doc, ttl
        self.period = min(60.0, ttl / 5)
        self.renewed = time.monotonic()
        self.due = self.renewed + self.period
        _BEATS.add(self)

    def renew(self) -> None:
        now = datetime.now(timezone.utc)
        self.doc["renewed"] = now.isoformat(timespec="seconds")
        self.doc["expires"] = (now + timedelta(seconds=self.ttl)).isoformat(timespec="seconds")
        try:
            self.store.put_document(self.key, json.dumps(self.doc, indent=1).encode(), overwrite=True)
            self.renewed = time.monotonic()
        except Exception as exc:  # the next beat tries again; the expiry leaves room for several
            log.warning("could not renew %s in %s (%s)", self.key, self.store.uri, exc)

    def fresh(self) -> bool:
        """Whether the document still holds for certain (renewed well within its lifetime)."""
        return time.monotonic() - self.renewed < 0.8 * self.ttl

    def stop(self) -> None:
        """No renewal after this returns (one under way is waited for, up to 5 s), so the
        document can be removed."""
        _BEATS.remove(self, wait=5.0)


class _Beats:
    """The one thread that renews every lease and lock this process holds, each when it is due
    (one after another: a renewal is one small write). It runs while there is one to renew."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._beats: list[_Heartbeat] = []
        self._renewing: _Heartbeat | None = None
        self._thread: threading.Thread | None = None

    def add(self, beat: _Heartbeat) -> None:
        with self._cond:
            self._beats.append(beat)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="concord-lease", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def remove(self, beat: _Heartbeat, wait: float) -> None:
        deadline = time.monotonic() + wait
        with self._cond:
            if beat in self._beats:
                self._beats.remove(beat)
            while self._renewing is beat and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._beats:
                        self._thread = None
                        return
                    beat = min(self._beats, key=lambda b: b.due)
                    left = beat.due - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                self._renewing = beat
            try:
                beat.renew()
            finally:
                with self._cond:
                    self._renewing = None
                    beat.due = time.monotonic() + beat.period
                    self._cond.notify_all()


_BEATS = _Beats()


def _write_doc(store: Store, prefix: str, what: str, ttl: float) -> tuple[str, dict]:
    key = f"{prefix}/{uuid.uuid4().hex}"
    started = datetime.now(timezone.utc)
    doc = {
        "what": str(what),
        **_me(),
        "started": started.isoformat(timespec="seconds"),
        "expires": (started + timedelta(seconds=ttl)).isoformat(timespec="seconds"),
    }
    # a fresh random key: no need to ask whether it exists first
    store.put_document(key, json.dumps(doc, indent=1).encode(), overwrite=True)
    return key, doc


class _Held:
    def __init__(self, key: str, beat: _Heartbeat) -> None:
        self.key, self.beat, self.count = key, beat, 1


#: leases this process holds, by store: a writer nested in another on the same store (a tier add
#: around its snapshot) shares the outer lease instead of waiting behind a collection that waits
#: for the outer one
_HELD: dict[str, _Held] = {}
_HELD_LOCK = threading.Lock()


@contextmanager
def write_lease(
    store: Store,
    what: str,
    ttl_seconds: float = DEFAULT_LEASE_TTL,
    *,
    wait_seconds: float = DEFAULT_WRITER_WAIT,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """Hold a (shared) lease on ``store`` for the body: no collection deletes anything meanwhile.

    ``what`` says who writes (it is shown when a collection is postponed). The lease is written
    first; then, if a collection holds the store, the lease is taken back and the writer waits
    for the collection to end (up to ``wait_seconds``, then :class:`StoreLockedError`). While the
    body runs, a heartbeat renews the lease; it is removed on exit (also when the body raises).
    The body runs in the store's :meth:`~concord.stores.base.Store.inventory`: what it holds is
    learned once (an S3 store lists its chunks instead of asking about each), which holds for as
    long as the lease does.
    A writer killed before it can remove it holds the store until its heartbeat is
    ``ttl_seconds`` old, or until a collection on the same machine sees its process gone.
    Yields the lease's key.
    """
    if not ttl_seconds > 0:
        raise ValueError(f"ttl_seconds must be positive (how long a lease holds at most), got {ttl_seconds!r}")
    ident = f"{type(store).__name__}:{store.uri}"
    with _HELD_LOCK:
        outer = _HELD.get(ident)
        if outer is not None:
            outer.count += 1
    if outer is not None:
        try:
            with store.inventory():
                yield outer.key
        finally:
            _leave(ident, outer, store)
        return
    key, beat = _acquire(store, what, ttl_seconds, wait_seconds, sleep)
    held = _Held(key, beat)
    with _HELD_LOCK:
        registered = _HELD.setdefault(ident, held) is held
    try:
        # what the store holds, learned once under the lease: no collection deletes it meanwhile
        with store.inventory():
            yield key
    finally:
        if registered:
            _leave(ident, held, store)
        else:
            beat.stop()
            _release(store, key)


def _leave(ident: str, held: _Held, store: Store) -> None:
    with _HELD_LOCK:
        held.count -= 1
        last = held.count == 0
        if last:
            _HELD.pop(ident, None)
    if last:
        held.beat.stop()
        _release(store, held.key)


def _acquire(store: Store, what: str, ttl: float, wait_seconds: float, sleep) -> tuple[str, _Heartbeat]:
    deadline = time.monotonic() + max(0.0, wait_seconds)
    delay = 0.2
    announced = False
    while True:
        key, doc = _write_doc(store, LEASE_PREFIX, what, ttl)
        collecting = [c for c in read_locks(store) if not c.stale(time.time())]
        if not collecting:
            return key, _Heartbeat(store, key, doc, ttl)
        _release(store, key)  # let the collection finish; it would wait for us otherwise
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreLockedError(store.uri, collecting[0].what, wait_seconds)
        if not announced:
            lock = collecting[0]
            until = min(left, max(0.0, lock.expires - time.time()))
            if lock.unreadable:
                log.warning("%s: %s; waiting up to %.0f s before %s", store.uri, lock.what, until, what)
            else:
                log.warning("%s: waiting up to %.0f s for %s to finish before %s", store.uri, left, lock.what, what)
            announced = True
        sleep(min(delay, left))
        delay = min(delay * 2, 5.0)


@contextmanager
def _collecting(store: Store, what: str, ttl: float = DEFAULT_LEASE_TTL) -> Iterator[_Heartbeat]:
    """Hold the store's exclusive collection lock for the body."""
    key, doc = _write_doc(store, LOCK_PREFIX, what, ttl)
    beat = _Heartbeat(store, key, doc, ttl)
    try:
        yield beat
    finally:
        beat.stop()
        _release(store, key)


def _release(store: Store, key: str) -> None:
    """Remove a lease. Failing to is not worth failing the write it guarded (or hiding the
    error that write raised): the lease expires by itself, and collections wait until then."""
    try:
        store.delete_document(key)
    except (StoreError, OSError) as exc:
        log.warning("could not remove lease %s from %s (%s); it expires by itself", key, store.uri, exc)


def _read_docs(store: Store, prefix: str, kind: str, stale_after: float | None = None) -> list[Lease]:
    """The documents under ``prefix``, read back. One that does not read never expires, or with
    ``stale_after`` expires that many seconds after it was last written (its modification time):
    a live holder's heartbeat rewrites its document, whole and readable, far more often."""
    out = []
    for key, _, mtime in store.list_document_stats(prefix):
        expires = float("inf") if stale_after is None else mtime + stale_after
        try:
            data = store.get_document(key)
        except (StoreError, OSError, ValueError) as exc:
            out.append(Lease(key, _unreadable(store, kind, key, str(exc), stale_after), expires, unreadable=True))
            continue
        if data is None:
            continue  # its writer finished while we looked
        try:
            if len(data) > 64 * 1024:
                raise ValueError("too large")
            doc = json.loads(data)
            expires = datetime.fromisoformat(doc["expires"])
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=timezone.utc)
            out.append(Lease(key, str(doc["what"])[:500], expires.timestamp(), _process_state(doc)))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as exc:
            problem = f"not a {kind} document ({type(exc).__name__}: {str(exc)[:120]})"
            out.append(Lease(key, _unreadable(store, kind, key, problem, stale_after), expires, unreadable=True))
    return out


def _unreadable(store: Store, kind: str, key: str, problem: str, stale_after: float | None) -> str:
    """One line naming an unreadable lease or lock document and how to remove it."""
    where = f"{store.uri.rstrip('/')}/{key}"
    remove = f"aws s3 rm {where}" if where.startswith("s3://") else f"rm {where}"
    who = "no collection runs on" if kind == "collection lock" else "no snapshot or sync writes to"
    when = f"; it counts as stale {stale_after:g} s after it was last written" if stale_after is not None else ""
    return f"unreadable {kind} {key} ({problem[:200]}): remove it (`{remove}`) once {who} {store.uri}{when}"


def read_leases(store: Store) -> list[Lease]:
    """Every writer's lease in ``store``. One that cannot be read never expires: it may be a
    writer's, so it holds collections until someone removes it."""
    return _read_docs(store, LEASE_PREFIX, "lease")


def read_locks(store: Store) -> list[Lease]:
    """Every collection lock in ``store`` (normally none, or one). One that cannot be read is
    stale once :data:`DEFAULT_LEASE_TTL` has passed since it was last written: a collection at
    work rewrites its lock, whole, at every heartbeat."""
    return _read_docs(store, LOCK_PREFIX, "collection lock", stale_after=DEFAULT_LEASE_TTL)


def _live_leases(store: Store, now: float) -> list[Lease]:
    return [lease for lease in read_leases(store) if not lease.stale(now)]


def _remove_stale(store: Store, now: float) -> list[Lease]:
    """Remove stale leases and locks; return the live leases."""
    live = []
    for doc in read_leases(store) + [lock for lock in read_locks(store) if lock.stale(now)]:
        if doc.stale(now):
            _release(store, doc.key)
        elif doc.key.startswith(LEASE_PREFIX + "/"):
            live.append(doc)
    return live


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
        holders = [lease.what for lease in _live_leases(store, now)]
        if holders:
            return plan.result(dry_run=True, postponed_by=holders)
        return plan.result(
            dry_run=True, deleted=plan.doomed_counts(), deleted_leftovers=len(plan.leftovers), deleted_signatures=len(plan.doomed_signatures)
        )
    with _collecting(store, f"garbage collection by {socket.gethostname()} pid {os.getpid()}") as lock:
        holders = _await_writers(store, clock, wait_seconds, sleep)
        if holders:
            return plan.result(dry_run=False, postponed_by=holders)
        plan.remark()  # what writers that finished since the first mark made live
        swept = _Sweep(store, lock, ensure(progress))
        swept.run(plan.doomed_manifests, plan.doomed, plan.doomed_signatures)
        if not swept.postponed_by:
            for key in plan.leftovers:
                store.delete_leftover(key)
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
        live = _remove_stale(store, clock())
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
        self.unreferenced = [(c, size, m) for c, size, m in store.iter_chunk_stats() if c not in self.live]
        self.doomed = [(c, size) for c, size, m in self.unreferenced if m < cutoff]
        self.young = len(self.unreferenced) - len(self.doomed)
        # temporary files of writes a killed process never finished; a write in flight keeps
        # touching its file, so one untouched for LEFTOVER_AGE (or the grace period) is stranded
        self.leftovers = [k for k, _, m in store.iter_leftovers() if m < now - max(grace_seconds, LEFTOVER_AGE)]
        # signature documents: those of a doomed manifest go with it; those whose root has no
        # manifest at all (orphans) once they are past the grace period themselves
        self.signatures = _signature_stats(store)
        self.cutoff = cutoff
        self._doom_signatures()

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

    def __init__(self, store: Store, lock: _Heartbeat, progress: Progress) -> None:
        self.store = store
        self.lock = lock
        self.progress = progress
        self.manifests = self.chunks = self.bytes = self.signatures = 0
        self.postponed_by: list[str] = []

    def run(self, manifests: list[str], chunks: list[tuple[str, int]], signatures: list[str] = ()) -> None:
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
