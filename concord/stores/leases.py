"""Leases and locks on a store: who may write to it while whom deletes from it.

A writer (snapshot, sync, tier add, OCI import) holds a shared lease (:func:`write_lease`) from
before it first looks at what the store holds until after its ref has moved; a garbage collection
(:mod:`concord.snapshots.gc`) holds the exclusive lock (:func:`collection_lock`) while it deletes.
Each is a small JSON document in the store (``gc/leases/<id>``, ``gc/collecting/<id>``) that one
heartbeat thread per process renews while it is held, and that names its host, boot, process
namespace and process, so that a stale one (its heartbeat stopped, or its process gone from this
machine) is recognised. The protocol they follow is written out in docs/architecture.md,
"Garbage collection".
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
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from concord.errors import StoreError, StoreLockedError
from concord.stores.base import Store

log = logging.getLogger("concord.leases")

#: where writers' leases live
LEASE_PREFIX = "gc/leases"
#: where a collection's exclusive lock lives while it deletes
LOCK_PREFIX = "gc/collecting"
#: how long a lease (or lock) holds once its heartbeat stops (a killed process on another host)
DEFAULT_LEASE_TTL = 600.0
#: how long a writer waits for a collection to end before it gives up
DEFAULT_WRITER_WAIT = 3600.0


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


class Heartbeat:
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
        self._beats: list[Heartbeat] = []
        self._renewing: Heartbeat | None = None
        self._thread: threading.Thread | None = None

    def add(self, beat: Heartbeat) -> None:
        with self._cond:
            self._beats.append(beat)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="concord-lease", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def remove(self, beat: Heartbeat, wait: float) -> None:
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
    def __init__(self, key: str, beat: Heartbeat) -> None:
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
            release(store, key)


def _leave(ident: str, held: _Held, store: Store) -> None:
    with _HELD_LOCK:
        held.count -= 1
        last = held.count == 0
        if last:
            _HELD.pop(ident, None)
    if last:
        held.beat.stop()
        release(store, held.key)


def _acquire(store: Store, what: str, ttl: float, wait_seconds: float, sleep) -> tuple[str, Heartbeat]:
    deadline = time.monotonic() + max(0.0, wait_seconds)
    delay = 0.2
    announced = False
    while True:
        key, doc = _write_doc(store, LEASE_PREFIX, what, ttl)
        collecting = [c for c in read_locks(store) if not c.stale(time.time())]
        if not collecting:
            return key, Heartbeat(store, key, doc, ttl)
        release(store, key)  # let the collection finish; it would wait for us otherwise
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
def collection_lock(store: Store, what: str, ttl: float = DEFAULT_LEASE_TTL) -> Iterator[Heartbeat]:
    """Hold the store's exclusive collection lock for the body."""
    key, doc = _write_doc(store, LOCK_PREFIX, what, ttl)
    beat = Heartbeat(store, key, doc, ttl)
    try:
        yield beat
    finally:
        beat.stop()
        release(store, key)


def release(store: Store, key: str) -> None:
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


def live_leases(store: Store, now: float) -> list[Lease]:
    return [lease for lease in read_leases(store) if not lease.stale(now)]


def remove_stale(store: Store, now: float) -> list[Lease]:
    """Remove stale leases and locks; return the live leases."""
    live = []
    for doc in read_leases(store) + [lock for lock in read_locks(store) if lock.stale(now)]:
        if doc.stale(now):
            release(store, doc.key)
        elif doc.key.startswith(LEASE_PREFIX + "/"):
            live.append(doc)
    return live


__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_WRITER_WAIT",
    "LEASE_PREFIX",
    "LOCK_PREFIX",
    "Lease",
    "collection_lock",
    "live_leases",
    "read_leases",
    "read_locks",
    "release",
    "remove_stale",
    "write_lease",
]
