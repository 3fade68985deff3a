"""What a store holds and what its encoding saves (``concord info``).

One pass over a store, reading only what a listing and the manifests tell:

* the chunks as stored: one listing (name, stored size), no chunk is read;
* the raw bytes they stand for: from the manifests, each distinct chunk once (a manifest knows
  every chunk's length). A chunk no manifest names has no known raw size: it is counted apart,
  with its stored size, and its raw size is ``None`` (unknown) unless the store keeps bare bytes;
* what garbage collection would take once past its grace period: the chunks no manifest names,
  and those named only by manifests no ref's history names (:mod:`concord.snapshots.gc` keeps the
  chunks of every root in every ref's history);
* in a compressed or encrypted store, how each chunk is kept (raw, zstd, byte planes), from the
  first two bytes of each stored object (:meth:`~concord.stores.base.Store.chunk_frame`): nothing
  is decoded or decrypted, but it is one small read per chunk (a ranged GET on S3), so a caller
  may leave it out (``frames=False``). An archive store (chunks in an archive storage class)
  cannot be read without a restore: its frames are never read.

Pure over a :class:`~concord.stores.base.Store`: nothing is written.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from concord.errors import ChunkArchivedError, ManifestError, ManifestNotFoundError, UnknownEncodingError
from concord.progress import Progress, ensure
from concord.snapshots.manifest import Manifest
from concord.stores.base import Store
from concord.stores.codec import FRAMES

#: how :attr:`StoreUsage.frames` names a chunk whose first bytes are no frame this Concord knows
UNREADABLE = "unreadable"
#: chunks whose first bytes are asked for at once (the rest wait, so memory stays flat)
BATCH = 1024


def frame_label(kind: int) -> str:
    """The name of encoding byte ``kind`` in :attr:`StoreUsage.frames` (``byte_planes``...)."""
    return FRAMES[kind].replace(" ", "_") if kind in FRAMES else f"unknown_0x{kind:02x}"


@dataclass
class ChunkTally:
    """A number of chunks, the bytes they take as stored, and the raw bytes they stand for
    (None: unknown, for chunks no manifest names in a store that encodes them)."""

    count: int = 0
    stored_bytes: int = 0
    raw_bytes: int | None = 0

    def add(self, stored: int, raw: int | None) -> None:
        self.count += 1
        self.stored_bytes += stored
        self.raw_bytes = None if raw is None or self.raw_bytes is None else self.raw_bytes + raw

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "stored_bytes": self.stored_bytes, "raw_bytes": self.raw_bytes}


@dataclass
class StoreUsage:
    """What a store holds and what its encoding saves (``concord info``; ``to_dict()`` is its ``--json``)."""

    store: str
    #: the store's configuration as a person is shown it (:meth:`StoreConfig.describe`; no key)
    compress: str
    encryption: dict[str, str] | None
    refs: int = 0
    #: snapshots held (one manifest each), and those no ref's history names (GC takes them)
    manifests: int = 0
    unreferenced_manifests: int = 0
    #: roots whose manifest does not parse or verify: the chunks they name cannot be told apart
    damaged_manifests: list[str] = field(default_factory=list)
    #: refs that cannot be read (what they keep alive is unknown)
    damaged_refs: list[str] = field(default_factory=list)
    #: every chunk held
    chunks: ChunkTally = field(default_factory=ChunkTally)
    #: held, and named by at least one manifest: raw size known
    named: ChunkTally = field(default_factory=ChunkTally)
    #: held, and named by no manifest
    orphans: ChunkTally = field(default_factory=ChunkTally)
    #: what garbage collection would delete once past its grace period: orphans, and chunks only
    #: manifests no ref names hold
    collectable: ChunkTally = field(default_factory=ChunkTally)
    #: named by a manifest but not held (``concord verify`` says which)
    missing_chunks: int = 0
    #: per encoding (:func:`frame_label`), in a compressed or encrypted store whose frames were read
    frames: dict[str, ChunkTally] | None = None

    @property
    def ratio(self) -> float | None:
        """Stored bytes ÷ raw bytes of the chunks the manifests name (0.67: a third saved), the way
        every ratio of stored to raw bytes in Concord is given."""
        named = self.named
        return round(named.stored_bytes / named.raw_bytes, 4) if named.stored_bytes and named.raw_bytes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "compress": self.compress,
            "encryption": self.encryption,
            "refs": self.refs,
            "manifests": self.manifests,
            "unreferenced_manifests": self.unreferenced_manifests,
            "damaged_manifests": list(self.damaged_manifests),
            "damaged_refs": list(self.damaged_refs),
            "chunks": self.chunks.to_dict(),
            "named": self.named.to_dict(),
            "orphans": self.orphans.to_dict(),
            "collectable": self.collectable.to_dict(),
            "missing_chunks": self.missing_chunks,
            "ratio": self.ratio,
            "frames": None if self.frames is None else {k: v.to_dict() for k, v in sorted(self.frames.items())},
        }


def _ref_roots(store: Store, usage: StoreUsage) -> set[str]:
    """Every root in the history of every ref (what garbage collection keeps)."""
    roots: set[str] = set()
    names = store.list_refs()
    usage.refs = len(names)
    for name in names:
        try:
            ref = store.read_ref(name)
        except (ManifestError, UnknownEncodingError):
            usage.damaged_refs.append(name)
            continue
        roots.update(e.root for e in (ref.history if ref is not None else ()))
    return roots


def store_usage(store: Store, *, frames: bool = True, progress: Progress | None = None) -> StoreUsage:
    """What ``store`` holds (see the module). ``frames``: also read each stored chunk's encoding
    byte, in a compressed or encrypted store. An encrypted store needs its key (as every reader)."""
    prog = ensure(progress)
    enc = store.encoding()
    described = enc.config.describe()
    usage = StoreUsage(store.uri, described["compress"], described["encryption"])
    live_roots = _ref_roots(store, usage)

    manifest_stats = list(store.iter_manifest_stats())
    usage.manifests = len(manifest_stats)
    raw_of: dict[str, int] = {}  # chunk object name -> raw length, over every readable manifest
    live: set[str] = set()  # object names the manifests of ref-named roots hold
    name_of = enc.chunk_name if enc.encrypted else None

    def load(item: tuple[str, int, float]) -> tuple[str, int, Manifest | None]:
        root, size, _ = item
        try:
            return root, size, Manifest.from_json(store.get_manifest_bytes(root), expected_root=root, verify=True)
        except (ManifestError, ManifestNotFoundError, UnknownEncodingError):
            return root, size, None

    prog.start(sum(size for _, size, _ in manifest_stats), "manifests")
    try:
        with ThreadPoolExecutor(max(1, min(store.parallelism, len(manifest_stats) or 1)), thread_name_prefix="concord-info") as pool:
            for root, size, manifest in pool.map(load, manifest_stats):
                prog.advance(size)
                if root not in live_roots:
                    usage.unreferenced_manifests += 1
                if manifest is None:
                    usage.damaged_manifests.append(root)
                    continue
                lengths = manifest.chunk_lengths()
                names = {name_of(c): n for c, n in lengths.items()} if name_of else lengths
                raw_of.update(names)
                if root in live_roots:
                    live.update(names)
    finally:
        prog.close()
    usage.damaged_manifests.sort()

    held: list[tuple[str, int]] = []
    bare = not enc.framed  # a raw store keeps the raw bytes: an orphan's raw size is its stored size
    for name, stored, _ in store.iter_chunk_stats():
        held.append((name, stored))
        raw = raw_of.get(name)
        if raw is not None:
            usage.named.add(stored, raw)
        else:
            usage.orphans.add(stored, stored if bare else None)
        usage.chunks.add(stored, raw if raw is not None else (stored if bare else None))
        if name not in live:
            usage.collectable.add(stored, raw if raw is not None else (stored if bare else None))
    usage.missing_chunks = len(raw_of) - usage.named.count

    if frames and enc.framed and not store.archive:
        usage.frames = _frames(store, held, raw_of, prog)
    return usage


def _frames(store: Store, held: list[tuple[str, int]], raw_of: dict[str, int], prog: Progress) -> dict[str, ChunkTally]:
    """Each held chunk's encoding, read from its first bytes on the store's threads."""

    def kind(item: tuple[str, int]) -> tuple[str, int, str | None]:
        name, stored = item
        try:
            k = store.chunk_frame(name)
        except (UnknownEncodingError, ChunkArchivedError):
            return name, stored, UNREADABLE
        return name, stored, None if k is None else frame_label(k)

    out: dict[str, ChunkTally] = {}
    prog.start(sum(s for _, s in held), "frames")
    try:
        with ThreadPoolExecutor(max(1, min(store.parallelism, len(held) or 1)), thread_name_prefix="concord-info") as pool:
            for start in range(0, len(held), BATCH):  # a bounded number of reads in flight
                for name, stored, label in pool.map(kind, held[start : start + BATCH]):
                    prog.advance(stored)
                    if label is not None:  # None: removed since it was listed
                        out.setdefault(label, ChunkTally()).add(stored, raw_of.get(name))
    finally:
        prog.close()
    return out


__all__ = ["ChunkTally", "StoreUsage", "frame_label", "store_usage"]
