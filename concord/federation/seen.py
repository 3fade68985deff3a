"""What this machine has seen of each federation ledger, so a rollback is caught without being told.

A signed ledger can still be rolled back: someone who can write the store puts back an older copy
of it (rounds 1 to 10 and the head signed at round 10), and every signature checks. Only a reader
that remembers how far the ledger went can tell. This module is that memory: for each ledger, named
by its store's identity (:func:`store_identity`) and tenant, the newest round a successful
verification (``concord federate verify``, the flow's ``verify-ledger`` task) or an append
(``concord federate run``, the ``federate`` task) saw, with its hash and when::

    <$CONCORD_HOME>/ledgers-seen.json
        {"format": "concord/ledgers-seen@1",
         "ledgers": {"<store identity>": {"<tenant>": {"round": 12, "hash": "<64 hex>", "time": "…"}}}}

:func:`verify_remembered` verifies a ledger with the remembered round as its least ``min_round``
and the remembered hash as the hash that round must still have: a ledger that now ends before it
was rolled back, one whose round has another hash was rewritten; both fail, naming the fix. An
explicit ``min_round`` lower than the remembered one never lowers that bar (a rollback is accepted
only by forgetting: ``forget=True``, ``--forget``); a higher one raises it.

*Trust on first use*: a ledger this machine never saw is accepted as it is (if it verifies) and
remembered from then on. The memory is per machine (per home folder): a flow's worker keeps its own.

Writes are safe under concurrency: each change takes an exclusive lock on ``ledgers-seen.json.lock``,
re-reads the file, merges (a ledger's entry only ever moves to a higher round) and writes it
atomically (:func:`concord.files.atomic_write`), so two processes remembering at once keep both
entries, and a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from concord.errors import LedgerError, LedgerRollbackError
from concord.federation.ledger import LedgerReport, list_rounds, round_hash, validate_tenant, verify_ledger
from concord.files import atomic_write
from concord.home import concord_home
from concord.stores.base import Store

if TYPE_CHECKING:
    from concord.trust import TrustPolicy

MEMORY_FORMAT = "concord/ledgers-seen@1"
#: the memory's file name in the home folder
MEMORY_FILE = "ledgers-seen.json"
_MAX_BYTES = 64 * 1024 * 1024


def memory_path() -> str:
    """``<$CONCORD_HOME>/ledgers-seen.json`` (absolute; not created here)."""
    return os.path.abspath(os.path.join(concord_home(), MEMORY_FILE))


def store_identity(store: Store) -> str:
    """What names ``store`` in the memory: the store itself, however its address was typed.

    A folder store is its real path (symlinks resolved; a trailing slash, ``./`` or a relative
    spelling name the same folder). An S3 store is ``s3://BUCKET/PREFIX`` (no surrounding
    slashes) and, with an endpoint of its own, ``at SCHEME://HOST[:PORT]``: scheme and host in
    lower case, a trailing dot dropped, the scheme's default port left out, every loopback name
    (``localhost``, ``127.0.0.1``, ``::1``) written ``127.0.0.1``, never a path or credential.
    An encrypted store is named as any other: its key is not part of it. Other stores are their URI."""
    root = getattr(store, "root", None)
    if isinstance(root, str) and os.path.isabs(root) and store.uri == root:
        return os.path.realpath(root)
    bucket = getattr(store, "bucket", None)
    if isinstance(bucket, str) and bucket:
        prefix = str(getattr(store, "prefix", "") or "").strip("/")
        uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        endpoint = getattr(store, "endpoint_url", None)
        return f"{uri} at {_endpoint_identity(endpoint)}" if endpoint else uri
    return store.uri


_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0:0:0:0:0:0:0:1", "ip6-localhost"}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _endpoint_identity(endpoint: str) -> str:
    """An endpoint URL as :func:`store_identity` writes it (see there)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint.strip())
        port = parts.port
    except ValueError:
        return endpoint.split("@")[-1].rstrip("/")
    if not parts.scheme or not parts.hostname:
        return endpoint.split("@")[-1].rstrip("/")
    scheme = parts.scheme.lower()
    host = parts.hostname.lower().rstrip(".")
    if host in _LOOPBACK or host.startswith(("127.", "localhost.")):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    if port is not None and port == _DEFAULT_PORTS.get(scheme):
        port = None
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


def canonical_identity(identity: str) -> str:
    """An identity as an older Concord wrote it (the folder path as typed, the endpoint as
    given), written as :func:`store_identity` writes it now: how old memories are still found."""
    if os.path.isabs(identity):
        return os.path.realpath(identity)
    if identity.startswith("s3://"):
        uri, sep, endpoint = identity.partition(" at ")
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        prefix = prefix.strip("/")
        uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        return f"{uri} at {_endpoint_identity(endpoint)}" if sep else uri
    return identity


@dataclass(frozen=True)
class Seen:
    """A ledger as remembered: its newest ``round`` seen, that round's ``hash``, and ``time`` (UTC)."""

    round: int
    hash: str
    time: str

    def to_dict(self) -> dict:
        return {"round": self.round, "hash": self.hash, "time": self.time}


class LedgerMemory:
    """The memory of verified ledgers kept at ``path`` (default :func:`memory_path`)."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path)) if path is not None else memory_path()

    def __repr__(self) -> str:
        return f"LedgerMemory({self.path!r})"

    # -------------------------------------------------------------- reading

    def _fail(self, problem: str) -> LedgerError:
        return LedgerError(
            self.path,
            f"not a memory of verified ledgers ({problem})",
            "Restore it from a backup, or remove it: every ledger is then trusted again on first use.",
        )

    def _read(self) -> dict:
        """Every entry, ``{identity: {tenant: Seen}}``; empty when the file is not there."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            return {}
        except IsADirectoryError:
            raise self._fail("a folder") from None
        except OSError as exc:
            raise LedgerError(
                self.path,
                f"the memory of verified ledgers cannot be read ({exc.strerror or exc})",
                "Point CONCORD_HOME at a folder this user can read and write, or pass --no-remember to verify without it.",
            ) from exc
        if len(data) > _MAX_BYTES:
            raise self._fail(f"over {_MAX_BYTES} bytes")
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._fail(f"not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != MEMORY_FORMAT or not isinstance(doc.get("ledgers"), dict):
            raise self._fail(f"expected format {MEMORY_FORMAT!r}")
        out: dict[str, dict[str, Seen]] = {}
        for identity, tenants in doc["ledgers"].items():
            if not isinstance(tenants, dict):
                raise self._fail(f"the entry of {identity!r} is not an object")
            for tenant, e in tenants.items():
                ok = (
                    isinstance(e, dict)
                    and isinstance(e.get("round"), int)
                    and not isinstance(e.get("round"), bool)
                    and e["round"] >= 1
                    and isinstance(e.get("hash"), str)
                    and isinstance(e.get("time", ""), str)
                )
                if not ok:
                    raise self._fail(f"the entry of tenant {tenant!r} in {identity!r} is not a round, hash and time")
                seen = Seen(e["round"], e["hash"], e.get("time", ""))
                # entries written under another spelling of the same store merge: the higher round wins
                kept = out.setdefault(canonical_identity(identity), {})
                if tenant not in kept or kept[tenant].round < seen.round:
                    kept[tenant] = seen
        return out

    def recall(self, store: Store, tenant: str) -> Seen | None:
        """What was seen of ``tenant``'s ledger in ``store``, or None (never seen here)."""
        return self._read().get(store_identity(store), {}).get(validate_tenant(tenant))

    def entries(self) -> dict[str, dict[str, Seen]]:
        """Every ledger remembered: ``{store identity: {tenant: Seen}}``."""
        return self._read()

    # -------------------------------------------------------------- writing

    @contextmanager
    def _locked(self) -> Iterator[dict]:
        """The entries, read under the memory's lock, written back (atomically) on a clean exit."""
        import fcntl

        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise LedgerError(
                self.path,
                f"the memory of verified ledgers cannot be written ({exc.strerror or exc})",
                "Point CONCORD_HOME at a folder this user can write, or pass --no-remember to verify without it.",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._read()
            yield entries
            doc = {
                "format": MEMORY_FORMAT,
                "ledgers": {
                    identity: {t: s.to_dict() for t, s in sorted(tenants.items())}
                    for identity, tenants in sorted(entries.items())
                    if tenants
                },
            }
            atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", mode=0o644)
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def remember(self, store: Store, tenant: str, number: int, digest: str, *, replace: bool = False) -> Seen:
        """Remember that ``tenant``'s ledger in ``store`` went to round ``number`` with hash
        ``digest``; the entry kept, which only ever moves to a higher round (another process may
        have remembered a later one meanwhile; an entry for the same round keeps its first hash)
        unless ``replace`` (after a rollback was accepted)."""
        validate_tenant(tenant)
        identity = store_identity(store)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._locked() as entries:
            tenants = entries.setdefault(identity, {})
            old = tenants.get(tenant)
            if replace or old is None or old.round < number:
                tenants[tenant] = Seen(number, digest, now)
            return tenants[tenant]

    def forget(self, store: Store, tenant: str) -> Seen | None:
        """Forget ``tenant``'s ledger in ``store``; what was remembered, or None."""
        validate_tenant(tenant)
        with self._locked() as entries:
            return entries.get(store_identity(store), {}).pop(tenant, None)

    # -------------------------------------------------------------- checking

    def behind(self, store: Store, tenant: str, seen: Seen, found: int, found_hash: str | None, fix: str = "") -> LedgerRollbackError:
        """The one-line error for ``tenant``'s ledger in ``store`` now ending at round ``found``
        (or with round ``seen.round`` hashing to ``found_hash``), while ``seen`` was remembered."""
        fix = fix or (
            f"Restore the ledger from a good copy of the store; if the rollback was intended, accept it with "
            f"`concord federate verify {tenant} --store {store.uri} --forget` (with the same --trust)"
        )
        was = f"this machine saw it at round {seen.round} (hash {seen.hash[:12]}, {seen.time}; remembered in {self.path})"
        if found < seen.round:
            what = f"the ledger of {tenant} in {store.uri} ends at round {found}, but {was}: rolled back"
        else:
            now = found_hash[:12] if found_hash else "(unreadable)"
            what = (
                f"the ledger of {tenant} in {store.uri} goes to round {found}, but its round {seen.round} now hashes to "
                f"{now} where {was}: history rewritten"
            )
        return LedgerRollbackError(tenant, store.uri, seen.round, found, f"{what}. {fix}.")

    def check(self, store: Store, tenant: str) -> Seen | None:
        """Before appending to ``tenant``'s ledger in ``store``: raise
        :class:`~concord.errors.LedgerRollbackError` when it is behind or unlike what was
        remembered (reads the round documents only; :func:`verify_ledger` checks the rest).
        Returns what was remembered."""
        seen = self.recall(store, tenant)
        if seen is None:
            return None
        rounds = list_rounds(store, tenant)
        found = rounds[-1].get("round") if rounds else 0
        found = found if isinstance(found, int) else len(rounds)
        digest = _hash_in(rounds, seen.round)
        if found < seen.round or digest != seen.hash:
            raise self.behind(store, tenant, seen, found, digest)
        return seen


@dataclass(frozen=True)
class RememberedReport:
    """What :func:`verify_remembered` found: the ledger's ``report``, what was remembered of it
    before (``seen``; None on first use, or without a memory), what is remembered now (``kept``),
    and the error naming a rollback or rewrite against the memory (``error``) when that is the one
    reason it failed."""

    report: LedgerReport
    seen: Seen | None
    kept: Seen | None
    memory: str | None
    error: LedgerRollbackError | None

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_dict(self) -> dict:
        return {
            **self.report.to_dict(),
            "memory": self.memory,
            "seen": self.seen.to_dict() if self.seen else None,
            "remembered": self.kept.to_dict() if self.kept else None,
        }


def verify_remembered(
    store: Store,
    tenant: str,
    *,
    trust: TrustPolicy | None = None,
    min_round: int | None = None,
    memory: LedgerMemory | None = None,
    forget: bool = False,
    fix: str = "",
) -> RememberedReport:
    """:func:`~concord.federation.ledger.verify_ledger` with what ``memory`` saw of this ledger:
    its round is the least ``min_round`` (an explicit higher one wins, a lower one does not lower
    it) and its hash the hash that round must still have. A ledger that verifies is remembered at
    its newest round. With ``forget`` the memory is not consulted and, if the ledger verifies, what
    it holds now replaces what was remembered (a rollback accepted); nothing is changed when it does
    not verify. Without ``memory`` this is ``verify_ledger`` alone. ``fix`` replaces the fix the
    rollback error names."""
    if memory is None:
        return RememberedReport(verify_ledger(store, tenant, trust=trust, min_round=min_round), None, None, None, None)
    seen = None if forget else memory.recall(store, tenant)
    use_memory = seen is not None and (min_round is None or min_round <= seen.round)
    if use_memory:
        report = verify_ledger(store, tenant, trust=trust, min_round=seen.round, min_hash=seen.hash)
    else:
        report = verify_ledger(store, tenant, trust=trust, min_round=min_round)
    kept = seen
    error = None
    if report.ok and report.last_round and report.head:
        kept = memory.remember(store, tenant, report.last_round, report.head, replace=forget)
    elif use_memory and report.problems == (report.rollback,) and report.rollback is not None:
        # the ledger is whole and signed as asked, only behind or unlike what was seen: a rollback
        # (with other problems, it is tampered with, and the usual report says what to restore)
        found = report.last_round or 0
        error = memory.behind(store, tenant, seen, found, _hash_of(store, tenant, seen.round) if found >= seen.round else None, fix)
    return RememberedReport(report, seen, kept, memory.path, error)


def _hash_of(store: Store, tenant: str, number: int) -> str | None:
    """The hash round ``number`` of ``tenant``'s ledger now has, or None when it cannot be read."""
    try:
        rounds = list_rounds(store, tenant)
    except LedgerError:
        return None
    return _hash_in(rounds, number)


def _hash_in(rounds: list[dict], number: int) -> str | None:
    """The hash of round ``number`` among ``rounds`` (round documents), or None if it is not there."""
    at = next((r for r in rounds if r.get("round") == number), None)
    return round_hash(at) if at is not None else None


__all__ = [
    "MEMORY_FILE",
    "MEMORY_FORMAT",
    "LedgerMemory",
    "RememberedReport",
    "Seen",
    "canonical_identity",
    "memory_path",
    "store_identity",
    "verify_remembered",
]
