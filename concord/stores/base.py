"""The one store interface every cluster, tier and replica speaks.

Layout (identical on disk and on S3)::

    chunks/<2 hex>/<64 hex>        immutable bytes, named by their leaf hash
    manifests/<64 hex>.json        immutable snapshot manifest, named by its Merkle root
    refs/<namespace>/<name>        small mutable pointer to a root, with its history
    ledger/<tenant>/<round>.json   federation rounds
    config                         the store's format, compression and encryption (absent: plain, raw)

How the store keeps bytes at rest (compressed, encrypted) is its configuration's business
(:mod:`concord.stores.config`): the methods here encode on the way in and decode on the way out,
so everything above the store sees raw bytes, and chunk ids and roots never change with it.

Subclasses provide a handful of raw primitives (``_put_object``, ``_get_object``...). Everything
about names, hashing, verification and compare-and-swap lives here, once.
"""

from __future__ import annotations

import json
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from concord.errors import (
    ChunkNotFoundError,
    FrameError,
    IntegrityError,
    InvalidNameError,
    ManifestNotFoundError,
    RefConflictError,
    SealError,
    UnknownEncodingError,
)
from concord.hashing import chunk_id, is_digest

if TYPE_CHECKING:  # pragma: no cover
    from concord.stores.config import Encoding

#: one part of a name (a ref's namespace or name, a tenant, a data set, an audit, a checkpoint):
#: 1 to 128 letters, digits, '.', '_' or '-', not starting with '.', with no '..'. The text of a
#: regular expression (unanchored, so it composes: ``rf"^{NAME_SEGMENT}/{NAME_SEGMENT}$"``); the
#: flows' run forms use it too, so a form accepts exactly the names the core takes (the '-' in
#: each class is escaped, as a browser's ``v``-mode expressions require).
NAME_SEGMENT = r"(?![A-Za-z0-9._\-]*\.\.)[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}"
_SEGMENT = re.compile(NAME_SEGMENT)
DEFAULT_NAMESPACE = "default"
#: the one ref name the store format reserves: ``<tenant>/_ledger`` is a federation ledger's head,
#: which names round hashes (no manifest). Refused wherever a user creates a ref.
LEDGER_HEAD = "_ledger"
REF_FORMAT = "concord/ref@1"

#: what :meth:`Store.chunk_states` says about a chunk
AVAILABLE, ARCHIVED, RESTORING, MISSING = "available", "archived", "restoring", "missing"
CHUNK_STATES = (AVAILABLE, ARCHIVED, RESTORING, MISSING)
#: retrieval tiers an archive restore may ask for (fastest and dearest first)
RESTORE_TIERS = ("Expedited", "Standard", "Bulk")


def validate_segment(segment: str, what: str = "name") -> str:
    if not isinstance(segment, str) or not _SEGMENT.fullmatch(segment):
        raise InvalidNameError(str(segment), what)
    return segment


def split_ref(name: str) -> tuple[str, str]:
    """``'ns/name'`` → ``('ns', 'name')``; a bare ``'name'`` lives in the default namespace."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError(str(name))
    parts = name.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_NAMESPACE, parts[0]]
    if len(parts) != 2:
        raise InvalidNameError(name)
    validate_segment(parts[0], "ref name")
    validate_segment(parts[1], "ref name")
    return parts[0], parts[1]


def check_writable_ref(name: str, what: str = "ref name") -> str:
    """``name`` in canonical form, if a snapshot, sync or tier may create it; a name the store
    format reserves (:data:`LEDGER_HEAD`) is refused with :class:`ReservedNameError`."""
    ns, n = split_ref(name)
    if n == LEDGER_HEAD:
        from concord.errors import ReservedNameError

        raise ReservedNameError(name, what, LEDGER_HEAD)
    return f"{ns}/{n}"


def canonical_ref(name: str) -> str:
    ns, n = split_ref(name)
    return f"{ns}/{n}"


def chunk_key(cid: str) -> str:
    return f"chunks/{cid[:2]}/{cid}"


#: where a store lists which chunk each of its delta chunks needs: one empty object per delta,
#: ``gc/deltas/<2 hex>/<delta's object name>-<base's object name>``, written before the delta
#: itself, so garbage collection learns every base a delta needs from one listing (docs/deltas.md)
DELTA_INDEX = "gc/deltas"
#: present once every delta chunk of the store has its entry in :data:`DELTA_INDEX`: written by
#: ``concord init`` (an empty store), else by the first collection that read every chunk's head
DELTA_INDEX_MARK = "gc/delta-index.json"


def delta_entry_key(name: str, base: str) -> str:
    """The key of the index entry saying that the chunk stored under ``name`` is a delta of the
    chunk stored under ``base`` (object names: ids, or an encrypted store's keyed names)."""
    return f"{DELTA_INDEX}/{name[:2]}/{name}-{base}"


def delta_entry(key: str) -> tuple[str, str] | None:
    """``(delta's object name, base's object name)`` of the index entry at ``key``, or None for
    anything else found under :data:`DELTA_INDEX` (temporary names, stray files)."""
    name, _, base = key.rsplit("/", 1)[-1].partition("-")
    return (name, base) if is_digest(name) and is_digest(base) and key == delta_entry_key(name, base) else None


def manifest_key(root: str) -> str:
    return f"manifests/{root}.json"


def ref_key(name: str) -> str:
    ns, n = split_ref(name)
    return f"refs/{ns}/{n}"


def _check_digest(value: str, what: str) -> str:
    if not is_digest(value):
        raise ValueError(f"{what} must be 64 lowercase hex characters (a BLAKE3 digest), got {value!r}")
    return value


def chunk_name(key: str) -> str | None:
    """The chunk id stored at ``key``, or None for anything else found under ``chunks/``
    (temporary names, stray files, a chunk in the wrong folder)."""
    name = key.rsplit("/", 1)[-1]
    return name if is_digest(name) and key == chunk_key(name) else None


def manifest_name(key: str) -> str | None:
    """The root whose manifest is stored at ``key``, or None for anything else."""
    name = key.rsplit("/", 1)[-1]
    root = name[:-5] if name.endswith(".json") else ""
    return root if is_digest(root) and key == manifest_key(root) else None


def check_restore_request(days: int, tier: str) -> None:
    """Refuse restore settings an archive would reject, before any request is sent."""
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"days must be a whole number of days, at least 1 (how long a restored copy stays readable), got {days!r}")
    if tier not in RESTORE_TIERS:
        raise ValueError(f"tier must be one of {', '.join(RESTORE_TIERS)} (S3 retrieval tiers, case as written), got {tier!r}")


@dataclass(frozen=True)
class RefEntry:
    root: str
    version: int
    time: str
    message: str = ""


@dataclass(frozen=True)
class Ref:
    """A named pointer to a snapshot root, with every root it ever pointed at (oldest first)."""

    name: str
    history: tuple[RefEntry, ...] = field(default_factory=tuple)

    @property
    def root(self) -> str:
        return self.history[-1].root

    @property
    def version(self) -> int:
        return self.history[-1].version

    def advanced(self, root: str, message: str) -> Ref:
        entry = RefEntry(
            root=root,
            version=(self.version + 1) if self.history else 1,
            time=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            message=message,
        )
        return Ref(self.name, self.history + (entry,))

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": REF_FORMAT,
                "name": self.name,
                "root": self.root,
                "version": self.version,
                "history": [e.__dict__ for e in self.history],
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, name: str, data: bytes, store: str = "") -> Ref:
        """Parse a ref file; anything else (too large, too deep, a field of the wrong type) raises
        :class:`~concord.errors.RefFormatError` naming the ref (and ``store``)."""
        from concord.documents import MAX_REF_BYTES, load_json_document, need_dict, need_int, need_list, need_str
        from concord.errors import RefFormatError

        def fail(problem: str) -> RefFormatError:
            return RefFormatError(name, problem, store)

        doc = load_json_document(data, f"ref {name}", max_bytes=MAX_REF_BYTES, error=fail)
        if doc.get("format") != REF_FORMAT:
            raise fail(f"unknown format {str(doc.get('format'))[:40]!r} (expected {REF_FORMAT})")
        entries = need_list(doc.get("history"), "history", fail)
        if not entries:
            raise fail("its history is empty")
        history = []
        for i, e in enumerate(entries):
            need_dict(e, f"history entry {i}", fail)
            root = e.get("root")
            if not is_digest(root):
                raise fail(f"history entry {i}: root is not a 64-hex digest")
            history.append(
                RefEntry(
                    root=root,
                    version=need_int(e.get("version"), f"history entry {i}: version", fail, low=1),
                    time=need_str(e.get("time"), f"history entry {i}: time", fail, max_len=64),
                    message=need_str(e.get("message", ""), f"history entry {i}: message", fail),
                )
            )
        return cls(name, tuple(history))


#: what a caller gives :meth:`Store.read_chunk` as ``own_base``: a chunk id -> its own bytes of that chunk, or None
OwnBase = Callable[[str], "bytes | memoryview | None"]

#: a delete_ref that keeps losing to rewrites of the same root gives up after this many reads
_DELETE_ATTEMPTS = 3


#: guards every store's inventory scope (entered and left once an operation: never contended)
_INVENTORY_LOCK = threading.Lock()


class Store(ABC):
    """A content-addressed store. Implementations: :class:`LocalDirStore`, :class:`S3ObjectStore`."""

    #: human-readable address, e.g. ``/data/c1`` or ``s3://bucket/prefix``
    uri: str
    #: how many transfers this store likes in flight at once
    parallelism: int = 4
    #: the key of an encrypted store (:meth:`unlock`); None: ``CONCORD_KEY_FILE`` when one is needed
    key: bytes | None = None
    _store_encoding = None

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    # ------------------------------------------------------------------ raw primitives

    @abstractmethod
    def _put_object(self, key: str, data: bytes | memoryview, *, overwrite: bool) -> bool:
        """Atomically write ``data`` at ``key``; return False (write nothing) if it exists and not overwrite."""

    @abstractmethod
    def _get_object(self, key: str) -> bytes | None:
        """The bytes at ``key``, or None if absent."""

    @abstractmethod
    def _exists_many(self, keys: list[str]) -> list[bool]:
        """For each key, whether it exists (a batch question)."""

    @abstractmethod
    def _delete_object(self, key: str) -> None:
        """Remove ``key`` if present."""

    @abstractmethod
    def _list_keys(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix`` (relative to the store root), in no particular order."""

    @abstractmethod
    def _read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
        """The bytes at ``key`` and an opaque version token (None, None if absent)."""

    @abstractmethod
    def _write_if(self, key: str, data: bytes, token: str | None) -> bool:
        """Write ``data`` only if ``key`` still has version ``token`` (None: only if absent)."""

    @abstractmethod
    def _delete_if(self, key: str, token: str) -> bool:
        """Remove ``key`` only if it still has version ``token``; False (nothing removed) otherwise."""

    @abstractmethod
    def _list_stats(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        """``(key, size in bytes, modification time in POSIX seconds)`` of every key under
        ``prefix`` (keys relative to the store root, in no particular order). Garbage collection
        needs the age of what it lists, and listing it this way costs no request per object."""

    def close(self) -> None:  # noqa: B027 (a no-op unless the store holds clients)
        """Release clients and connections (no-op by default)."""

    #: what the operation in progress learned of the chunks here (:meth:`inventory`), or None
    _inventory: Any = None
    _inventory_depth = 0

    def _new_inventory(self) -> Any:
        """The inventory one operation fills (None: the store asks each time, the default)."""
        return None

    @contextmanager
    def inventory(self) -> Iterator[None]:
        """For the body (one operation: a snapshot, a sync, an import, each under its
        garbage-collection lease), let the store learn which chunks it holds in as few requests as
        it can and remember it: an object store from listings (:class:`~concord.stores.s3.S3ObjectStore`)
        instead of a request per chunk, a folder from one listing of each chunk folder asked about
        often (:class:`~concord.stores.local.LocalDirStore`). Nested scopes share the outer one's;
        it is forgotten when the outermost ends."""
        with _INVENTORY_LOCK:
            self._inventory_depth += 1
            if self._inventory is None:
                self._inventory = self._new_inventory()
        try:
            yield
        finally:
            with _INVENTORY_LOCK:
                self._inventory_depth -= 1
                if self._inventory_depth == 0:
                    self._inventory = None

    def flush(self) -> None:  # noqa: B027 (a no-op where each write is durable once it returns)
        """Make everything written so far durable before something names it: a folder store
        flushes its files and their folders (:mod:`concord.stores.local`); an object store has
        nothing to do, each object being durable once its write returns."""

    # A store travels between processes as its settings: the derived keys are derived again.
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_store_encoding", None)
        state.pop("_inventory", None)  # an operation's, in this process
        state.pop("_inventory_depth", None)
        return state

    # ------------------------------------------------------------------ configuration

    def encoding(self) -> Encoding:
        """How this store keeps its objects (:class:`~concord.stores.config.Encoding`), read from
        its ``config`` object once. An encrypted store needs its key here: none, or the wrong
        one, raises :class:`~concord.errors.StoreKeyError` before anything is read or written."""
        enc = self._store_encoding
        if enc is None:
            from concord.stores.config import load_encoding

            enc = self._store_encoding = load_encoding(self)
        return enc

    def unlock(self, key: bytes) -> None:
        """Give this store its key (32 bytes); checked against the store's key check on first use."""
        self.key = bytes(key)
        self.forget_encoding()

    def forget_encoding(self) -> None:
        """Read the configuration again on next use (after ``init`` wrote it)."""
        self._store_encoding = None

    def chunk_object_name(self, cid: str) -> str:
        """The name chunk ``cid`` is stored under: its id, or in an encrypted store a keyed hash of it."""
        return self.encoding().chunk_name(_check_digest(cid, "chunk id"))

    def _chunk_key(self, cid: str) -> str:
        return chunk_key(self.chunk_object_name(cid))

    # ------------------------------------------------------------------ chunks

    def has_chunks(self, ids: Iterable[str]) -> set[str]:
        """The subset of ``ids`` this store holds."""
        ids = list(dict.fromkeys(ids))
        present = self._exists_many([self._chunk_key(c) for c in ids])
        return {c for c, p in zip(ids, present) if p}

    def put_chunk(
        self,
        cid: str,
        data: bytes | memoryview,
        *,
        overwrite: bool = False,
        verify: bool = True,
        dtype: str | None = None,
        base: str | None = None,
    ) -> bool:
        """Store ``data`` under its id. True if bytes were written, False if the chunk was there.

        With ``verify`` (the default) the bytes are hashed first and must match ``cid``; callers
        that have just hashed these very bytes pass ``verify=False`` to avoid hashing twice.
        ``dtype`` (the safetensors dtype of the tensor the chunk is part of) lets a compressed
        store choose its codec. ``base`` (the id of the same region's chunk in the version this
        one follows) stores it as a delta against that chunk, where that is smaller
        (:meth:`delta_base` says which chunk it is a delta of).
        """
        return self.put_chunk_sized(cid, data, overwrite=overwrite, verify=verify, dtype=dtype, base=base) is not None

    def put_chunk_sized(
        self,
        cid: str,
        data: bytes | memoryview,
        *,
        overwrite: bool = False,
        verify: bool = True,
        dtype: str | None = None,
        base: str | None = None,
    ) -> int | None:
        """:meth:`put_chunk`, returning the bytes stored (after encoding), or None if the chunk was there."""
        _check_digest(cid, "chunk id")
        if verify:
            actual = chunk_id(data)
            if actual != cid:
                raise IntegrityError(f"chunk sent to {self.uri}", cid, actual)
        enc = self.encoding()
        key = chunk_key(enc.chunk_name(cid))
        if enc.framed and not overwrite and self._exists_many([key])[0]:
            return None  # present: not worth encoding
        # a chunk written over (a repair) is stored whole: it may be another delta's base
        pair = self.delta_base(base, len(data)) if base is not None and base != cid and not overwrite else None
        if pair is not None and pair[0] == cid:
            pair = None
        stored = enc.encode_chunk(cid, data, dtype, transient=True, base=pair)  # written at once, then reused
        if pair is not None:
            self._index_delta(enc.chunk_name(cid), stored)
        if not self._put_object(key, stored, overwrite=overwrite):
            return None
        if overwrite:
            self._drop_delta_entries(enc.chunk_name(cid), None)  # stored whole now
        return len(stored)

    def put_chunk_from_file(
        self, cid: str, fd: int, offset: int, length: int, data: memoryview, *, dtype: str | None = None, base: str | None = None
    ) -> int | None:
        """Store the chunk ``cid`` whose bytes are ``length`` bytes of open file ``fd`` at ``offset``
        (already hashed by the caller, and also given as ``data``); the bytes stored (after
        encoding), or None if the chunk was there. Stores that can copy between files in the
        kernel override this; the default writes ``data``. ``base``: as for :meth:`put_chunk`."""
        return self.put_chunk_sized(cid, data, verify=False, dtype=dtype, base=base)

    # ------------------------------------------------------------------ deltas

    def delta_base(self, base: str, length: int) -> tuple[str, memoryview] | None:
        """``(id, raw bytes)`` of the chunk a chunk of ``length`` bytes is stored as a delta
        against when ``base`` is the same region's chunk in the version it follows, or None where
        no delta can be made. The store must be framed (compressed or encrypted); a delta's base
        is always a chunk stored whole, so a read decodes at most one level: ``base`` itself if
        it is stored whole, else the chunk ``base`` is a delta of (the next training step is a
        delta of the last step stored whole, and a chunk whose delta grows past the plain chunk
        is stored whole again, becoming the base of the steps after it). The chunk must be
        ``length`` bytes long, and hash to its id (a delta on damaged bytes would break once
        they are repaired). The bytes are transient (see :mod:`.scratch`)."""
        enc = self.encoding()
        if not enc.framed or self.archive:  # an archive's chunks are not read back to build on
            return None
        for _ in range(2):
            blob = self._read_object_transient(chunk_key(enc.chunk_name(_check_digest(base, "base chunk id"))))
            if blob is None:
                return None
            if enc.base_of(base, memoryview(blob)[: enc.HEAD_BYTES]) is None:
                try:
                    data = enc.decode_chunk(base, blob, transient=True)
                except UnknownEncodingError:
                    return None
                if len(data) != length or chunk_id(data) != base:
                    return None
                return base, memoryview(data)
            further = self.delta_of(base)  # stored as a delta: its own base is stored whole
            if further is None:
                return None
            base = further
        return None

    def _index_delta(self, name: str, stored) -> None:
        """Before the chunk ``stored`` (encoded) is written under object name ``name``: if it is a
        delta, its entry in the delta index (:data:`DELTA_INDEX`), so that no delta is ever in the
        store without the entry that tells garbage collection its base stays."""
        enc = self.encoding()
        if not enc.framed:
            return
        base = enc.base_of(name, memoryview(stored)[: enc.HEAD_BYTES])
        if base is not None:
            self.index_deltas([(name, base)])

    def _drop_delta_entries(self, name: str, keep: str | None) -> None:
        """After the chunk object ``name`` was written over (a repair): remove the delta index's
        entries saying it is a delta of anything but ``keep`` (its base now; None: stored whole),
        so that no stale entry counts it as a delta. Only after the write: a stale entry left by a
        crash in between keeps a base alive that is no longer needed, never the reverse."""
        if not self.encoding().framed or self.archive:
            return
        for key in list(self._list_keys(f"{DELTA_INDEX}/{name[:2]}/")):
            pair = delta_entry(key)
            if pair is not None and pair[0] == name and pair[1] != keep:
                self._delete_object(key)

    def delta_index(self) -> dict[str, tuple[str, str, float]] | None:
        """The delta index (:data:`DELTA_INDEX`): ``{entry key: (delta's object name, base's object
        name, modification time)}`` from one listing, or None where the store does not say that
        every delta has its entry (:data:`DELTA_INDEX_MARK` absent): its chunks' heads must be read."""
        if not self.encoding().framed or self.archive:
            return {}  # bare bytes, or an archive: no delta at all
        if not self._exists_many([DELTA_INDEX_MARK])[0]:
            return None
        entries = {}
        for key, _, mtime in self._list_stats(DELTA_INDEX + "/"):
            pair = delta_entry(key)
            if pair is not None:
                entries[key] = (*pair, mtime)
        return entries

    def mark_delta_index(self) -> None:
        """Say that every delta chunk of this store has its entry in the delta index (for an empty
        store, or once every chunk's head was read and the missing entries written)."""
        doc = json.dumps({"format": "concord/delta-index", "version": 1}).encode()
        self._put_object(DELTA_INDEX_MARK, doc, overwrite=False)

    def index_deltas(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Write the delta index's entry of each ``(delta's object name, base's object name)``."""
        for name, base in pairs:  # an entry there already is as good
            self._put_object(delta_entry_key(_check_digest(name, "chunk object name"), _check_digest(base, "chunk object name")), b"", overwrite=False)

    def delete_delta_entry(self, key: str) -> None:
        """Remove one entry of the delta index, as :meth:`delta_index` lists it (garbage collection
        only: after its delta chunk is gone)."""
        if delta_entry(key) is None:
            raise ValueError(f"not a delta index entry: {key!r}")
        self._delete_object(key)

    def read_base(self, base: str) -> tuple[int, memoryview]:
        """The frame of chunk ``base`` (``(encoding byte, what follows it)``, opened in an
        encrypted store), which a delta chunk needs to be decoded: stored whole (a delta of a
        delta is refused as damaged). Not hash-checked here: the delta's own check covers it.
        Transient (see :mod:`.scratch`); :class:`ChunkNotFoundError` if it is gone."""
        enc = self.encoding()
        blob = self._read_object_transient(chunk_key(enc.chunk_name(_check_digest(base, "base chunk id"))))
        if blob is None:
            raise ChunkNotFoundError(self.uri, base)
        try:
            return enc.open_frame(base, blob)
        except (FrameError, SealError) as exc:
            raise UnknownEncodingError(self.uri, f"chunk {base}", f"the base of a delta: {exc}") from None

    def decode_stored(self, cid: str, blob: bytes | memoryview, *, transient: bool = False) -> bytes | memoryview:
        """The raw bytes of ``blob``, chunk ``cid`` as this store keeps it (a delta decoded
        against its base, read from this store); not hash-checked."""
        return self.encoding().decode_chunk(cid, blob, transient=transient, base=self.read_base)

    def delta_of(self, cid: str) -> str | None:
        """The id of the chunk that chunk ``cid`` is stored as a delta of, or None if it is
        stored whole, absent or damaged (its object is read, and opened in an encrypted store)."""
        enc = self.encoding()
        if not enc.framed:
            return None
        blob = self._read_head(self._chunk_key(cid), enc.HEAD_BYTES)
        if blob is None or enc.base_of(cid, blob) is None:
            return None
        if enc.cipher is None:
            return enc.base_of(cid, blob)
        whole = self._get_object(self._chunk_key(cid))
        try:
            _, payload = enc.cipher.open(whole, b"chunk:" + cid.encode(), framed=True, clear=enc.HEAD_BYTES - 2)
        except SealError:
            return None
        n = enc.HEAD_BYTES - 2  # a base id's bytes
        return bytes(payload[:n]).hex() if len(payload) > n else None

    def holds_whole(self, name: str) -> bool:
        """Whether the chunk stored under ``name`` (its id, or in an encrypted store
        :meth:`chunk_object_name` of it) is here and stored whole, not as a delta: what a
        delta against it needs (its first bytes are read)."""
        if self.archive:  # an archive holds no deltas: chunks sent there go whole
            return False
        enc = self.encoding()
        head = self._read_head(chunk_key(_check_digest(name, "chunk object name")), enc.HEAD_BYTES)
        return head is not None and enc.base_of(name, head) is None

    def chunk_base(self, name: str) -> str | None:
        """The object name of the chunk that the chunk stored under ``name`` (as
        :meth:`iter_chunk_stats` lists it) is a delta of, or None if it is stored whole or absent.
        Only the object's first bytes are read; nothing is decrypted. An archive (whose objects
        need a restore to be read) holds no deltas: None."""
        enc = self.encoding()
        if not enc.framed or self.archive:
            return None
        head = self._read_head(chunk_key(_check_digest(name, "chunk object name")), enc.HEAD_BYTES)
        return None if head is None else enc.base_of(name, head)

    def chunk_stored_sizes(self, names: Iterable[str]) -> dict[str, int]:
        """Object name (as :meth:`chunk_object_name` gives it) → size as stored, for each of
        ``names`` held here, from listings: one of each chunk folder (two hex digits) that a name
        falls in, never one request per chunk."""
        wanted: dict[str, set[str]] = {}
        for name in names:
            wanted.setdefault(_check_digest(name, "chunk object name")[:2], set()).add(name)
        out: dict[str, int] = {}
        for folder, group in sorted(wanted.items()):
            for key, size, _ in self._list_stats(f"chunks/{folder}/"):
                name = chunk_name(key)
                if name in group:
                    out[name] = size
        return out

    def get_chunk(self, cid: str, *, verify: bool = True) -> bytes:
        """The chunk's raw bytes (decoded); with ``verify`` they are re-hashed and must match ``cid``."""
        return self._load_chunk(cid, verify, transient=False)

    def read_chunk(self, cid: str, *, verify: bool = True, own_base: OwnBase | None = None) -> memoryview:
        """:meth:`get_chunk` without copies: a view that is *transient*, valid until this thread
        reads another chunk (see :mod:`concord.stores.scratch`). For a caller that writes or
        hashes the bytes at once (restore, checkout, sync); anything kept must be copied.

        ``own_base`` (a checkout on a node that holds the base version's files): a function of a
        chunk id that returns the caller's own bytes of that chunk (transient too), or None where
        it has none. A chunk stored as a delta is then decoded against those bytes instead of the
        base chunk read and decoded from the store, and always hash-checked: when the result is
        not ``cid`` (the caller's copy is damaged, or not that chunk), the chunk is read again
        and decoded against the store's base, so a caller's bad bytes never fail the read nor
        give wrong bytes."""
        if own_base is not None:
            data = self._load_chunk(cid, True, transient=True, own_base=own_base)
            if data is not None:
                return memoryview(data)
        return memoryview(self._load_chunk(cid, verify, transient=True))

    def _load_chunk(self, cid: str, verify: bool, *, transient: bool, own_base: OwnBase | None = None):
        """The chunk's raw bytes (checked with ``verify``). With ``own_base``, a delta is decoded
        against the caller's bytes of its base where it gives them, and None is returned when that
        fails or gives other bytes than ``cid`` (the caller reads again without it)."""
        _check_digest(cid, "chunk id")
        enc = self.encoding()
        key = chunk_key(enc.chunk_name(cid))
        blob = self._read_object_transient(key) if transient else self._get_object(key)
        if blob is None:
            raise ChunkNotFoundError(self.uri, cid)
        if own_base is not None:
            from concord.stores.codec import RAW

            used: list[str] = []

            def base(bid: str) -> tuple[int, memoryview]:
                own = own_base(bid)
                if own is None:
                    return self.read_base(bid)
                used.append(bid)
                return RAW, memoryview(own)  # bare bytes, as a frame

            try:
                data = enc.decode_chunk(cid, blob, transient=transient, base=base)
            except UnknownEncodingError:
                if used:
                    return None  # the caller's bytes were not the base's: the store's decide
                raise
            if used and chunk_id(data) != cid:
                return None
            verify = verify and not used  # hashed already
        else:
            data = enc.decode_chunk(cid, blob, transient=transient, base=self.read_base)
        if verify:
            actual = chunk_id(data)
            if actual != cid:
                raise IntegrityError(f"chunk {cid} in {self.uri}", cid, actual)
        return data

    def read_chunk_raw(self, cid: str, *, transient: bool = False) -> bytes | memoryview | None:
        """The chunk's raw bytes, decoded but not hash-checked, or None if absent: for
        verification. Stored bytes that do not decode raise :class:`~concord.errors.UnknownEncodingError`.
        With ``transient``, a view valid until this thread reads another chunk (as :meth:`read_chunk`)."""
        enc = self.encoding()
        key = chunk_key(enc.chunk_name(_check_digest(cid, "chunk id")))
        blob = self._read_object_transient(key) if transient else self._get_object(key)
        return None if blob is None else enc.decode_chunk(cid, blob, transient=transient, base=self.read_base)

    def _read_object_transient(self, key: str) -> bytes | memoryview | None:
        """The bytes at ``key`` (None if absent), possibly in one of this thread's buffers (see
        :mod:`concord.stores.scratch`): stores that can read into a buffer override it."""
        return self._get_object(key)

    def read_chunk_stored(self, cid: str) -> bytes | None:
        """The chunk as this store keeps it (encoded), or None if absent: for a copy between stores
        of one encoding (:attr:`~concord.stores.config.Encoding.identity`)."""
        return self._get_object(self._chunk_key(cid))

    def put_chunk_stored(
        self, cid: str, blob: bytes, *, overwrite: bool = False, checked_length: int | None = None
    ) -> int | None:
        """Store ``blob``, a chunk encoded as this store encodes (read from a store of the same
        encoding), after decoding it and checking it hashes to ``cid``. The raw bytes it stands
        for, or None if the chunk was there. A caller that has just decoded and checked these very
        bytes (a sync writing one chunk to many targets) passes their raw length as ``checked_length``."""
        enc = self.encoding()
        raw = checked_length
        if raw is None:
            data = enc.decode_chunk(cid, blob, base=self.read_base)
            actual = chunk_id(data)
            if actual != cid:
                raise IntegrityError(f"chunk sent to {self.uri}", cid, actual)
            raw = len(data)
        name = enc.chunk_name(cid)
        self._index_delta(name, blob)
        if not self._put_object(chunk_key(name), blob, overwrite=overwrite):
            return None
        if overwrite:
            self._drop_delta_entries(name, enc.base_of(name, memoryview(blob)[: enc.HEAD_BYTES]) if enc.framed else None)
        return raw

    def delete_chunk(self, cid: str) -> None:
        self._delete_object(self._chunk_key(cid))

    def delete_chunk_object(self, name: str) -> None:
        """Remove the chunk stored under ``name`` (as :meth:`iter_chunk_stats` lists it)."""
        self._delete_object(chunk_key(_check_digest(name, "chunk object name")))

    def chunk_frame(self, name: str) -> int | None:
        """The encoding byte (:data:`concord.stores.codec.FRAMES`) of the chunk stored under
        ``name`` (as :meth:`iter_chunk_stats` lists it), or None if it is absent or the store keeps
        bare bytes (not compressed, not encrypted). Only the object's first two bytes are read: an
        encrypted store keeps the byte in clear beside the nonce, so nothing is decrypted.
        :class:`~concord.errors.UnknownEncodingError` if they are not a frame's."""
        enc = self.encoding()
        if not enc.framed:
            return None
        head = self._read_head(chunk_key(_check_digest(name, "chunk object name")), 2)
        return None if head is None else enc.frame_of(name, head)

    def _read_head(self, key: str, n: int) -> bytes | None:
        """The first ``n`` bytes at ``key`` (fewer if the object is shorter), or None if absent.
        Stores that can read part of an object override it; the default reads it whole."""
        data = self._get_object(key)
        return None if data is None else bytes(data[:n])

    def iter_chunks(self) -> Iterator[str]:
        """The id of every chunk held. An encrypted store's names do not reveal ids: it lists
        none (its chunks are reached through the manifests that name them)."""
        if self.encoding().encrypted:
            return
        for key in self._list_keys("chunks/"):
            name = chunk_name(key)
            if name is not None:
                yield name

    def iter_chunk_stats(self) -> Iterator[tuple[str, int, float]]:
        """``(object name, size in bytes as stored, modification time in POSIX seconds)`` of every
        chunk; the name is the chunk id, or in an encrypted store :meth:`chunk_object_name` of it."""
        for key, size, mtime in self._list_stats("chunks/"):
            name = chunk_name(key)
            if name is not None:
                yield name, size, mtime

    def iter_leftovers(self) -> Iterator[tuple[str, int, float]]:
        """``(key, size, modification time)`` of what interrupted writes left behind (temporary
        files of a killed process). None here: object stores write each object whole."""
        return iter(())

    def delete_leftover(self, key: str) -> None:
        """Remove one leftover that :meth:`iter_leftovers` listed (only garbage collection should)."""
        raise NotImplementedError(f"{type(self).__name__} has no leftovers to delete ({key})")

    # ------------------------------------------------------------------ archive storage

    @property
    def archive(self) -> bool:
        """Whether chunks written here land in an archive storage class, where reading one
        needs a restore first. Plain folders and most buckets: False."""
        return False

    def chunk_states(self, ids: list[str]) -> dict[str, str]:
        """For each id, one of ``available``, ``archived`` (held, but needs a restore before it
        can be read), ``restoring`` (a restore is under way) or ``missing``.

        A store without archive storage holds every chunk readable, so the default only asks
        which are there.
        """
        ids = [_check_digest(c, "chunk id") for c in dict.fromkeys(ids)]
        present = self.has_chunks(ids)
        return {c: AVAILABLE if c in present else MISSING for c in ids}

    def request_restore(self, ids: list[str], *, days: int = 1, tier: str = "Standard") -> int:
        """Ask the archive to make ``ids`` readable for ``days`` days, at retrieval ``tier``;
        return how many restore requests were made. Returns at once: the restore itself takes
        minutes to hours (follow it with :meth:`chunk_states`). Without archive storage there
        is nothing to restore, so the default makes no request."""
        check_restore_request(days, tier)
        for cid in ids:
            _check_digest(cid, "chunk id")
        return 0

    # ------------------------------------------------------------------ manifests

    def put_manifest(self, root: str, data: bytes, *, overwrite: bool = False) -> bool:
        """Write a manifest (immutable: ``overwrite`` is only for replacing a damaged copy)."""
        key = manifest_key(_check_digest(root, "root"))
        return self._put_object(key, self.encoding().seal(key, data), overwrite=overwrite)

    def get_manifest_bytes(self, root: str) -> bytes:
        key = manifest_key(_check_digest(root, "root"))
        data = self._get_object(key)
        if data is None:
            raise ManifestNotFoundError(self.uri, root)
        return self.encoding().open(key, data)

    def has_manifest(self, root: str) -> bool:
        return self._exists_many([manifest_key(_check_digest(root, "root"))])[0]

    def has_manifests(self, roots: Iterable[str]) -> set[str]:
        """The subset of ``roots`` whose manifests this store holds (a batch question)."""
        roots = [_check_digest(r, "root") for r in dict.fromkeys(roots)]
        present = self._exists_many([manifest_key(r) for r in roots]) if roots else []
        return {r for r, p in zip(roots, present) if p}

    def iter_manifests(self) -> Iterator[str]:
        for key in self._list_keys("manifests/"):
            root = manifest_name(key)
            if root is not None:
                yield root

    def iter_manifest_stats(self) -> Iterator[tuple[str, int, float]]:
        """``(root, size in bytes, modification time in POSIX seconds)`` of every manifest."""
        for key, size, mtime in self._list_stats("manifests/"):
            root = manifest_name(key)
            if root is not None:
                yield root, size, mtime

    def delete_manifest(self, root: str) -> None:
        """Remove a manifest (absent is fine). Only garbage collection should: a ref whose
        manifest is gone names a snapshot nobody can restore."""
        self._delete_object(manifest_key(_check_digest(root, "root")))

    # ------------------------------------------------------------------ refs

    def read_ref(self, name: str) -> Ref | None:
        name = canonical_ref(name)
        key = ref_key(name)
        enc = self.encoding()  # a store this Concord cannot read says so, even for a ref it lacks
        data, _ = self._read_with_token(key)
        return None if data is None else Ref.from_json(name, enc.open(key, data), self.uri)

    def cas_ref(self, name: str, expected: str | None, new: str, message: str = "") -> Ref:
        """Move ``name`` from ``expected`` (None: must not exist) to ``new``, atomically.

        A ref already at ``new`` is left as it is (the operation is idempotent). Any other
        state raises :class:`RefConflictError` and writes nothing.
        """
        name = canonical_ref(name)
        _check_digest(new, "new root")
        key = ref_key(name)
        enc = self.encoding()
        data, token = self._read_with_token(key)
        current = Ref.from_json(name, enc.open(key, data), self.uri) if data is not None else Ref(name)
        current_root = current.root if current.history else None
        if current_root == new:
            return current
        if current_root != expected:
            raise RefConflictError(self.uri, name, expected, current_root)
        updated = current.advanced(new, message)
        self.flush()  # durable before visible: what the ref names is on disk before it moves
        if not self._write_if(key, enc.seal(key, updated.to_json()), token):
            after = self.read_ref(name)
            after_root = after.root if after else None
            if after_root == new and after is not None:
                return after
            raise RefConflictError(self.uri, name, expected, after_root)
        return updated

    def delete_ref(self, name: str, expected: str) -> bool:
        """Remove ref ``name`` (and its history) if it still points at ``expected``.

        True when removed, False when there was no such ref (so a retried delete is harmless).
        A ref pointing elsewhere raises :class:`RefConflictError` naming its current root, and
        stays as it is: like :meth:`cas_ref`, a delete never undoes someone else's move.
        """
        name = canonical_ref(name)
        _check_digest(expected, "expected root")
        key = ref_key(name)
        for _ in range(_DELETE_ATTEMPTS):
            data, token = self._read_with_token(key)
            if data is None or token is None:
                return False
            current = Ref.from_json(name, self.encoding().open(key, data), self.uri).root
            if current != expected:
                raise RefConflictError(self.uri, name, expected, current)
            if self._delete_if(key, token):
                return True
            # the ref was rewritten between the read and the delete: look again
        after = self.read_ref(name)
        raise RefConflictError(self.uri, name, expected, after.root if after else None)

    def list_refs(self) -> list[str]:
        self.encoding()  # a store this Concord cannot read (or without its key) says so first
        out = []
        for key in self._list_keys("refs/"):
            parts = key.split("/")
            if len(parts) == 3:
                try:
                    out.append(canonical_ref(f"{parts[1]}/{parts[2]}"))
                except InvalidNameError:
                    continue
        return sorted(out)

    # ------------------------------------------------------------------ small documents (ledger, ...)

    def put_document(self, key: str, data: bytes, *, overwrite: bool = False) -> bool:
        """Write a small document; in an encrypted store it is sealed, except signatures and
        garbage collection's leases and locks, which stay readable."""
        key = _check_document_key(key)
        return self._put_object(key, self.encoding().seal(key, data), overwrite=overwrite)

    def get_document(self, key: str) -> bytes | None:
        key = _check_document_key(key)
        return self.encoding().open(key, self._get_object(key))

    def list_documents(self, prefix: str) -> list[str]:
        return sorted(self._list_keys(_check_document_key(prefix.rstrip("/")) + "/"))

    def list_document_stats(self, prefix: str) -> list[tuple[str, int, float]]:
        """``(key, size in bytes as stored, modification time in POSIX seconds)`` of every document
        under ``prefix``, sorted by key, as :meth:`list_documents` lists them. One listing, no
        request per document: what garbage collection reads to know how old a document is."""
        return sorted(self._list_stats(_check_document_key(prefix.rstrip("/")) + "/"))

    def delete_document(self, key: str) -> None:
        """Remove a document (absent is fine): for short-lived ones, such as write leases."""
        self._delete_object(_check_document_key(key))


def _check_document_key(key: str) -> str:
    parts = key.split("/")
    if parts[0] in ("chunks", "manifests", "refs", "config") or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise InvalidNameError(key, "document key")
    return key
