"""Re-hash what a store holds; report missing and corrupt chunks; repair from another store.

:func:`verify` does it all in one call. Its three steps are public too, so that an orchestrator
can fan the hashing out: :func:`plan` (which snapshots, which chunks, at what lengths; damaged
manifests are repaired here), :meth:`VerifyPlan.batches` and :func:`check` (re-hash one batch of
chunks, anywhere the store can be read), and :func:`conclude` (repair what the checks found and
combine them, in order, into one :class:`VerifyResult`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from concord.errors import (
    ChunkNotFoundError,
    ConcordError,
    IntegrityError,
    ManifestError,
    ManifestNotFoundError,
    NotRegularFileError,
    UnknownEncodingError,
)
from concord.files import bounded_map
from concord.hashing import chunk_id
from concord.progress import Progress, ensure
from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE, Manifest
from concord.snapshots.refs import resolve_root
from concord.stores.base import Store

#: chunks in one batch at the most, whatever their size (bounds what a batch task carries)
MAX_BATCH_CHUNKS = 4096
#: chunks one thread re-hashes per task at the most
RUN_CHUNKS = 32


def _plain(obj: object) -> dict[str, Any]:
    """A frozen result's fields as a dict of JSON types (tuples become lists)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in obj.__dict__.items()}


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify` found in ``store``: the chunks checked, missing, corrupt and repaired,
    damaged manifests and broken refs; ``ok`` when nothing is wrong."""

    store: str
    roots: tuple[str, ...]
    chunks_checked: int
    missing: tuple[str, ...]
    corrupt: tuple[str, ...]
    repaired: tuple[str, ...]
    bad_manifests: tuple[str, ...] = field(default=())
    #: one line per ref that names no sound snapshot here (its manifest missing or damaged and not
    #: repaired, or the ref itself unreadable): such a ref cannot be restored
    broken_refs: tuple[str, ...] = field(default=())
    #: one line per ref whose history names earlier roots this store has no manifest of (not a
    #: failure: a rollback to them needs the snapshot synced back first)
    history_gaps: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when nothing is missing or corrupt any more (after repair), and every ref names a
        snapshot the store holds."""
        broken = set(self.missing) | set(self.corrupt) | set(self.bad_manifests)
        return broken <= set(self.repaired) and not self.broken_refs

    def to_dict(self) -> dict[str, Any]:
        return _plain(self) | {"ok": self.ok}


@dataclass(frozen=True)
class VerifyPlan:
    """What a verify checks: the snapshots, every chunk with the length its manifest gives (-1
    for a chunk no manifest names), and the manifests found damaged (and those repaired)."""

    store: str
    roots: tuple[str, ...]
    lengths: Mapping[str, int]
    bad_manifests: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()
    broken_refs: tuple[str, ...] = ()
    history_gaps: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes the manifests say the chunks hold (chunks no manifest names not counted)."""
        return sum(n for n in self.lengths.values() if n > 0)

    def batches(self, max_bytes: int, *, max_chunks: int = MAX_BATCH_CHUNKS) -> list[dict[str, int]]:
        """The chunks in id order, cut into batches of at most ``max_bytes`` (a chunk larger
        than that is a batch of its own) and ``max_chunks``. A chunk of unknown length counts
        as the default chunk size. Concatenated, the batches are the plan's chunks in id order."""
        if max_bytes <= 0 or max_chunks <= 0:
            raise ValueError(f"a batch needs room: max_bytes={max_bytes!r} and max_chunks={max_chunks!r} must be positive")
        out: list[dict[str, int]] = []
        batch: dict[str, int] = {}
        size = 0
        for cid in sorted(self.lengths):
            n = self.lengths[cid]
            weight = n if n >= 0 else DEFAULT_CHUNK_SIZE
            if batch and (size + weight > max_bytes or len(batch) >= max_chunks):
                out.append(batch)
                batch, size = {}, 0
            batch[cid] = n
            size += weight
        if batch:
            out.append(batch)
        return out


@dataclass(frozen=True)
class Checked:
    """What re-hashing a batch of chunks found, in chunk id order."""

    missing: tuple[str, ...]
    corrupt: tuple[str, ...]
    chunks: int
    bytes_read: int

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


def _load(store: Store, root: str, repair_from: Store | None, repaired: list[str], bad: list[str]) -> Manifest | None:
    try:
        return Manifest.from_json(store.get_manifest_bytes(root), expected_root=root, verify=True)
    except (ManifestError, ManifestNotFoundError, NotRegularFileError, UnknownEncodingError):
        bad.append(root)
        if repair_from is None:
            return None
        try:
            data = repair_from.get_manifest_bytes(root)
            manifest = Manifest.from_json(data, expected_root=root, verify=True)
        except (ManifestError, ManifestNotFoundError, NotRegularFileError, UnknownEncodingError):
            return None  # the donor has no good copy either: reported as still broken
        store.put_manifest(root, data, overwrite=True)  # replaces the damaged copy
        repaired.append(root)
        return manifest


def plan(store: Store, *, ref: str | None = None, root: str | None = None, repair_from: Store | None = None) -> VerifyPlan:
    """The chunks the snapshot named by ``ref``/``root`` needs, or with neither, every manifest's
    chunks and every chunk in the store. Reading the manifests checks them; with ``repair_from``,
    a damaged or missing one is replaced by a good copy first."""
    repaired: list[str] = []
    bad_manifests: list[str] = []
    ref_roots: dict[str, str] = {}
    broken: list[str] = []
    gaps: list[str] = []
    named = ref or root
    if named:
        roots = [resolve_root(store, named)]
    else:
        held = set(store.iter_manifests())
        ref_roots, broken, gaps = _refs_of(store, held)
        # every ref's current root is checked, whether or not its manifest is there
        roots = sorted(held | set(ref_roots.values()))
    lengths: dict[str, int] = {}
    for r in roots:
        m = _load(store, r, repair_from, repaired, bad_manifests)
        if m is not None:
            lengths.update(m.chunk_lengths())
    if not (ref or root):
        for cid in store.iter_chunks():
            lengths.setdefault(cid, -1)
        unsound = set(bad_manifests) - set(repaired)
        for name, r in sorted(ref_roots.items()):
            if r in unsound:
                what = "is missing" if r not in held else "is damaged"
                broken.append(
                    f"ref {name} names snapshot {r}, whose manifest {what} in {store.uri}; sync the snapshot "
                    f"there from a store that holds it (`concord sync OTHER_STORE {store.uri} --ref {name}`), "
                    f"re-run with --repair-from OTHER_STORE, or roll the ref back (`concord rollback {store.uri} --ref {name}`)"
                )
    return VerifyPlan(
        store.uri, tuple(roots), lengths, tuple(bad_manifests), tuple(repaired), tuple(sorted(broken)), tuple(gaps)
    )


def _refs_of(store: Store, held: set[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """``({ref: current root}, [unreadable refs], [history gaps])`` of every snapshot ref of the
    store. A federation ledger's head (``TENANT/_ledger``) points at ledger rounds, not snapshots:
    it is left to ``concord federate verify``."""
    from concord.stores.base import LEDGER_HEAD, split_ref

    roots: dict[str, str] = {}
    broken: list[str] = []
    gaps: list[str] = []
    for name in store.list_refs():
        if split_ref(name)[1] == LEDGER_HEAD:
            continue
        try:
            r = store.read_ref(name)
        except (ConcordError, OSError, ValueError) as exc:
            broken.append(f"ref {name} is unreadable: {' '.join(str(exc).split())}")
            continue
        if r is None:
            continue  # removed while we looked
        roots[name] = r.root
        earlier = sorted({e.root for e in r.history[:-1]} - held - {r.root})
        if earlier:
            gaps.append(
                f"ref {name}: {len(earlier)} earlier root(s) of its history are not in {store.uri} "
                f"(e.g. {earlier[0][:12]}); a rollback to them needs the snapshot synced back first"
            )
    return roots, broken, gaps


def check(store: Store, lengths: Mapping[str, int], *, progress: Progress | None = None) -> Checked:
    """Re-hash the chunks ``lengths`` names (on the store's threads): which are missing, and
    which are corrupt (wrong hash, or a length other than the expected one when it is known)."""
    prog = ensure(progress)
    prog.start(sum(n for n in lengths.values() if n > 0), "verify")
    read = 0

    def one(cid: str) -> tuple[str | None, int]:
        try:
            data = store.read_chunk_raw(cid, transient=True)
        except NotRegularFileError:
            return "corrupt", 0  # a FIFO or folder where the chunk should be: a repair replaces it
        except UnknownEncodingError:
            return "corrupt", 0  # stored bytes that do not decode (compressed or encrypted): same
        except ChunkNotFoundError:
            return "corrupt", 0  # a delta whose base chunk is gone: a repair stores it whole
        if data is None:
            return "missing", 0
        prog.advance(len(data))
        expected_len = lengths[cid]
        if chunk_id(data) != cid or (expected_len >= 0 and len(data) != expected_len):
            return "corrupt", len(data)
        return None, len(data)

    def run(ids: list[str]) -> list[tuple[str | None, int]]:
        return [one(cid) for cid in ids]

    missing, corrupt = [], []
    ids = sorted(lengths)
    # runs of chunks, one task each (a small chunk costs the queue little), a few per thread at least
    per = max(1, min(RUN_CHUNKS, len(ids) // (4 * store.parallelism)))
    runs = (ids[i : i + per] for i in range(0, len(ids), per))
    try:
        with ThreadPoolExecutor(store.parallelism, thread_name_prefix="concord-verify") as pool:
            states = (state for result in bounded_map(pool, run, runs, 4 * store.parallelism) for state in result)
            for cid, (state, n) in zip(ids, states):
                read += n
                if state == "missing":
                    missing.append(cid)
                elif state == "corrupt":
                    corrupt.append(cid)
    finally:
        prog.close()
    corrupt.extend(_damaged_bases(store, corrupt, set(ids)))
    return Checked(tuple(missing), tuple(corrupt), len(ids), read)


def _damaged_bases(store: Store, corrupt: list[str], checked: set[str]) -> list[str]:
    """The base chunks, outside ``checked``, of the ``corrupt`` chunks stored as deltas, that are
    damaged themselves: a delta decodes wrong when its base does, and a repair heals both."""
    out = []
    for base in sorted({b for b in map(store.delta_of, corrupt) if b is not None and b not in checked}):
        try:
            data = store.read_chunk_raw(base, transient=True)
        except (NotRegularFileError, UnknownEncodingError, ChunkNotFoundError):
            out.append(base)
            continue
        if data is not None and chunk_id(data) != base:
            out.append(base)
    return out


def conclude(
    store: Store,
    *,
    roots: Sequence[str],
    checks: Sequence[Checked],
    bad_manifests: Sequence[str] = (),
    repaired: Sequence[str] = (),
    repair_from: Store | None = None,
    broken_refs: Sequence[str] = (),
    history_gaps: Sequence[str] = (),
) -> VerifyResult:
    """Combine the checks of a plan's batches (in batch order) into one result; with
    ``repair_from``, first fetch good copies of every missing and corrupt chunk. ``repaired``
    are the manifests the plan already repaired."""
    missing = [c for part in checks for c in part.missing]
    corrupt = [c for part in checks for c in part.corrupt]
    fixed = list(repaired)
    if repair_from is not None:
        for cid in missing + corrupt:
            try:
                data = repair_from.get_chunk(cid, verify=True)
            except (ChunkNotFoundError, IntegrityError):
                continue  # reported as still broken: ok is False
            store.put_chunk(cid, data, verify=False, overwrite=True)
            fixed.append(cid)
    return VerifyResult(
        store=store.uri,
        roots=tuple(roots),
        chunks_checked=sum(part.chunks for part in checks),
        missing=tuple(missing),
        corrupt=tuple(corrupt),
        repaired=tuple(fixed),
        bad_manifests=tuple(bad_manifests),
        broken_refs=tuple(broken_refs),
        history_gaps=tuple(history_gaps),
    )


def verify(
    store: Store,
    *,
    ref: str | None = None,
    root: str | None = None,
    repair_from: Store | None = None,
    progress: Progress | None = None,
) -> VerifyResult:
    """Check every chunk the snapshot named by ``ref``/``root`` needs, or with neither, every
    manifest and chunk in the store. With ``repair_from``, fetch good copies of what is bad."""
    p = plan(store, ref=ref, root=root, repair_from=repair_from)
    checked = check(store, p.lengths, progress=progress)
    return conclude(store, roots=p.roots, checks=[checked], bad_manifests=p.bad_manifests, repaired=p.repaired,
                    repair_from=repair_from, broken_refs=p.broken_refs, history_gaps=p.history_gaps)
