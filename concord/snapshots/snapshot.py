"""Take a snapshot: a checkpoint folder (or file) → chunks in a store + a manifest (+ a ref).

Files are memory-mapped, never read whole. A ``.safetensors`` file is cut along its own layout:
the header is one part, each tensor another, and each part is chunked from its first byte; DCP
``.distcp`` files, ``torch.save`` archives and GGUF files likewise, from their own indexes
(:mod:`concord.snapshots.formats`, which never unpickles anything). Other files are one part
each. Each chunk goes through one small pipeline on a thread pool (BLAKE3 releases the GIL):
hash, claim (a chunk seen twice in one snapshot is handled once), write unless the store already
holds it. The chunks of all files share one queue, so many small files keep every worker busy
as one large file does; at most ``WINDOW`` chunks are in flight and ``OPEN_SOURCES`` files open
(each from before its first chunk is queued until its last is stored), so memory and open files
stay flat whatever the checkpoint holds. The manifest is written after every chunk it names, and the ref last.

All the writing happens under a garbage-collection lease: a chunk the store already holds is not
written again, and the lease keeps a collection from deleting it before the new ref names it.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from concord.errors import ControlCharacterNameError, SourceChangedError, SourceNotFoundError
from concord.files import open_files_limit
from concord.hashing import chunk_id
from concord.progress import Progress, ensure
from concord.snapshots.formats import claims, file_layout
from concord.snapshots.manifest import (
    DEFAULT_CHUNK_SIZE,
    FileEntry,
    Manifest,
    check_chunk_size,
    make_file,
    make_part,
)
from concord.snapshots.refs import resolve_root
from concord.snapshots.walk import walk_sized
from concord.stores.base import Store, check_writable_ref
from concord.stores.leases import write_lease
from concord.text import control_char

#: chunks in flight at once, across files: bounds memory (futures, ids) whatever the checkpoint size
WINDOW = 64
#: files open at once at the most (each with its mapping), fewer under a low ``ulimit -n``
OPEN_SOURCES = 32
#: files of at most this many bytes are read in one call instead of mapped: unmapping costs more
#: (every core's TLB is flushed) than copying them, and they are most files of a sharded dataset
SMALL_FILE = 256 * 1024
#: small files one worker takes at a time: at most this many, of at most this many bytes
BATCH_FILES = 32
BATCH_BYTES = 4 * 1024 * 1024
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class SnapshotResult:
    """What :func:`snapshot` did: the snapshot's ``root``, its files, tensors, chunks and bytes,
    what was new in the store, and the ref moved."""

    root: str
    files: int
    tensors: int
    chunks: int
    bytes: int
    new_chunks: int
    new_bytes: int
    ref: str | None = None
    ref_version: int | None = None
    previous: str | None = None
    #: the bytes the new chunks take as the store keeps them (compressed, encrypted), as written
    new_stored_bytes: int = 0
    manifest: Manifest | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "manifest"}
        return d

    @classmethod
    def of(cls, manifest: Manifest, *, new_chunks: int, new_bytes: int, new_stored_bytes: int,
           ref: str | None, version: int | None, previous: str | None) -> SnapshotResult:
        """The result of writing ``manifest`` (and moving ``ref`` from ``previous`` to it)."""
        return cls(
            root=manifest.root,
            files=manifest.n_files,
            tensors=manifest.n_tensors,
            chunks=manifest.n_chunks,
            bytes=manifest.total_bytes,
            new_chunks=new_chunks,
            new_bytes=new_bytes,
            new_stored_bytes=new_stored_bytes,
            ref=ref,
            ref_version=version,
            previous=previous,
            manifest=manifest,
        )


def collect_files(source: str | os.PathLike) -> list[tuple[str, str]]:
    """``(relative posix path, absolute path)`` of every regular file under ``source``, sorted.

    Symlinks are followed (a Hugging Face cache folder is made of them), but no folder is
    walked twice, so a link loop ends (see :mod:`concord.snapshots.walk`). A file name holding a control
    character is refused (:class:`ControlCharacterNameError`): it could not be shown on a
    terminal as it is, nor restored safely everywhere.
    """
    return [(rel, full) for rel, full, _ in collect_sized_files(source)]


def collect_sized_files(source: str | os.PathLike) -> list[tuple[str, str, int]]:
    """:func:`collect_files` with each file's size as the walk found it."""
    src = os.path.abspath(os.fspath(source))
    if not os.path.exists(src):
        raise SourceNotFoundError(src)
    if os.path.isfile(src):
        return [(os.path.basename(src), src, os.path.getsize(src))]
    out = []
    for rel, full, size in walk_sized(src):
        if control_char(rel) is not None:
            raise ControlCharacterNameError(os.path.join(src, rel))
        out.append((rel, full, size))
    if not out:
        raise ValueError(f"{src}: the folder holds no files; point at a checkpoint folder or file.")
    return sorted(out)


class _Source:
    """One file being snapshotted: open (and memory-mapped) from before its first chunk is
    queued until its last is stored."""

    __slots__ = ("before", "bytes", "f", "ids", "kind", "layout", "left", "mm", "path", "rel", "size", "written")

    def __init__(self, rel: str, path: str, f, before: os.stat_result, kind: str, layout: list) -> None:
        self.rel, self.path, self.f, self.before = rel, path, f, before
        self.size = before.st_size
        self.kind, self.layout = kind, layout
        self.mm: mmap.mmap | None = None
        self.bytes: bytes | mmap.mmap = b""  # the file's bytes: read (a small file) or mapped
        self.ids: list[list[str | None]] = []
        self.left = 0  # chunks queued and not yet stored
        self.written: list[str] = []  # chunks this file wrote to the store (taken back if it changed)

    def close(self) -> None:
        try:
            if self.mm is not None:
                self.mm.close()
        finally:
            self.f.close()


class _Snapshotter:
    """Hashes and stores the chunks of one snapshot, one pipeline per chunk:
    hash → claim (so a chunk seen twice is written once) → write unless the store has it.

    The chunks of every file go through one queue, in file order, at most ``WINDOW`` in flight:
    many small files keep every worker busy as one large file does. A file is opened (its layout
    read, see :func:`~concord.snapshots.formats.file_layout`) when its chunks are queued and
    closed after its last is stored, so at most ``OPEN_SOURCES`` files are open at once."""

    def __init__(
        self, store: Store, chunk_size: int, progress: Progress, workers: int | None, bases: BaseChunks | None = None
    ) -> None:
        self.store = store
        self.bases = bases
        self.chunk_size = chunk_size
        self.progress = progress
        # hashing is CPU-bound: one thread per core, more only for stores whose writes wait on a network
        self.workers = workers or max(os.cpu_count() or 2, store.parallelism)
        self._lock = threading.Lock()
        self._claimed: set[str] = set()  # ids this snapshot has stored or found present
        self.new_chunks = 0
        self.new_bytes = 0
        self.new_stored_bytes = 0

    def file_entry(self, rel: str, path: str, pool: ThreadPoolExecutor) -> FileEntry:
        """The entry of one file, its chunks stored."""
        return self.entries([(rel, path)], pool)[0]

    def entries(
        self, files: Iterable[tuple[str, str]], pool: ThreadPoolExecutor, sizes: Iterable[int] | None = None
    ) -> list[FileEntry]:
        """The entries of ``files`` (``(relative path, path)``), every chunk stored: one queue of
        work across all of them (see the class's doc). ``sizes`` (as the walk found them) sends
        each small file to a worker whole: opened, read, hashed, stored and closed there."""
        out: list[FileEntry] = []
        pending: deque = deque()  # (future, source or None for a whole file, part index, chunk index)
        sources: deque[_Source] = deque()  # open files with chunks queued, in file order
        limit = min(OPEN_SOURCES, open_files_limit(8))

        batch: list[tuple[str, str]] = []  # small files not yet queued
        batch_bytes = 0
        # runs of small files, short enough that every worker gets several
        per_batch = max(1, min(BATCH_FILES, len(files) // (4 * self.workers))) if isinstance(files, Sized) else 1

        def settle() -> None:
            fut, src, i, k = pending.popleft()
            if src is None:
                out.extend(fut.result())
                return
            src.ids[i][k] = fut.result()
            src.left -= 1
            if src.left == 0:  # its last chunk: the queue is in file order, so it is the first open
                sources.popleft()
                out.append(self._finish(src))

        try:
            for (rel, path), size in zip(files, itertools.repeat(None) if sizes is None else sizes):
                if size is not None and size <= SMALL_FILE:
                    batch.append((rel, path))
                    batch_bytes += size
                    if len(batch) < per_batch and batch_bytes < BATCH_BYTES:
                        continue
                while len(pending) >= WINDOW:
                    settle()
                if batch:  # a run of small files, done whole by one worker
                    pending.append((pool.submit(self._whole_files, batch), None, 0, 0))
                    batch, batch_bytes = [], 0
                if size is not None and size <= SMALL_FILE:
                    continue
                while len(sources) >= limit and pending:
                    settle()
                src = self._open(rel, path)
                if isinstance(src, FileEntry):
                    out.append(src)
                    continue
                sources.append(src)
                for item in self._spans(src):
                    while len(pending) >= WINDOW:
                        settle()
                    pending.append((pool.submit(self._chunk, src, *item[2:]), src, item[0], item[1]))
            if batch:
                pending.append((pool.submit(self._whole_files, batch), None, 0, 0))
            while pending:
                settle()
        finally:
            for fut, *_ in pending:
                fut.cancel()
            wait([fut for fut, *_ in pending])  # no thread still reads a mapping closed below
            for src in sources:
                src.close()
        return out

    def _whole_files(self, files: list[tuple[str, str]]) -> list[FileEntry]:
        """The entries of a run of small files, each done on this thread from its opening to
        its closing (one task for many files: a file of one chunk costs the queue little)."""
        out = []
        for rel, path in files:
            if not claims(path):
                entry = self._small_blob(rel, path)
                if entry is not None:
                    out.append(entry)
                    continue
            src = self._open(rel, path)
            if not isinstance(src, FileEntry):
                try:
                    for i, k, start, length, dtype, base in self._spans(src):
                        src.ids[i][k] = self._chunk(src, start, length, dtype, base)
                except BaseException:
                    src.close()
                    raise
                src = self._finish(src)
            out.append(src)
        return out

    def _small_blob(self, rel: str, path: str) -> FileEntry | None:
        """The entry of the small file ``path``, which no format cuts (one ``data`` part), its
        chunks stored: read whole, hashed and stored from the bytes read, with no more than it
        takes (the most files of a sharded dataset go this way). None if it is no longer small."""
        fd = os.open(path, _READ_FLAGS)
        written: list[str] = []
        try:
            before = os.fstat(fd)
            size = before.st_size
            if size > SMALL_FILE:
                return None
            data = _read_all(fd, size)
            cs = self.chunk_size
            bases = self.bases

            def base(k: int, n: int) -> str | None:
                return bases.find(rel, "data", "", k, n) if bases is not None else None

            if size <= cs:
                ids = [self._store(fd, 0, size, data, None, written, base(0, size))] if size else []
            else:
                with memoryview(data) as mv:
                    ids = [
                        self._store(fd, at, min(cs, size - at), mv[at : at + cs], None, written, base(at // cs, min(cs, size - at)))
                        for at in range(0, size, cs)
                    ]
        finally:
            os.close(fd)
        self._check_unchanged(path, before, written)
        return make_file(rel, size, "blob", [make_part("data", "", 0, size, ids)])

    def _open(self, rel: str, path: str) -> _Source | FileEntry:
        """``path`` opened, its layout read and its bytes mapped; a file of no bytes is done at once."""
        f = open(path, "rb", buffering=0)  # unbuffered: a layout reads a few headers at most
        try:
            before = os.fstat(f.fileno())
            kind, layout = file_layout(f, before.st_size, path, rel)
            if before.st_size == 0:
                f.close()
                return make_file(rel, 0, kind, [make_part(*_part_args(lay, [])) for lay in layout])
            src = _Source(rel, path, f, before, kind, layout)
            if before.st_size <= SMALL_FILE:
                src.bytes = _read_all(f.fileno(), before.st_size)
            else:
                src.mm = src.bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                if hasattr(src.mm, "madvise"):
                    src.mm.madvise(mmap.MADV_SEQUENTIAL)
        except BaseException:
            f.close()
            raise
        return src

    def _spans(self, src: _Source) -> Iterator[tuple[int, int, int, int, str | None, str | None]]:
        """``(part index, chunk index, start, length, dtype, base)`` of each chunk of ``src``, in
        file order; ``base``: the chunk of the same region in the base version, if any."""
        cs = self.chunk_size
        bases = self.bases
        for i, (kind, name, off, length, dtype, _) in enumerate(src.layout):
            starts = range(off, off + length, cs)
            src.ids.append([None] * len(starts))
            src.left += len(starts)
            for k, start in enumerate(starts):
                n = min(cs, off + length - start)
                yield i, k, start, n, dtype, bases.find(src.rel, kind, name, k, n) if bases is not None else None

    def _finish(self, src: _Source) -> FileEntry:
        """The entry of a file whose chunks are all stored; the file is closed. A file that
        changed meanwhile is refused (:class:`SourceChangedError`) and its new chunks taken back."""
        src.close()
        self._check_unchanged(src.path, src.before, src.written)
        parts = [make_part(*_part_args(lay, src.ids[i])) for i, lay in enumerate(src.layout)]
        return make_file(src.rel, src.size, src.kind, parts)

    def _check_unchanged(self, path: str, before: os.stat_result, written: list[str]) -> None:
        """Refuse (:class:`SourceChangedError`) the file at ``path`` if its size or time changed
        since ``before`` was taken, taking back the chunks it ``written``: their bytes may not
        match their names."""
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            for cid in written:
                self.store.delete_chunk(cid)
            raise SourceChangedError(path)

    def _chunk(self, src: _Source, start: int, length: int, dtype: str | None = None, base: str | None = None) -> str:
        with memoryview(src.bytes) as mv:
            view = mv[start : start + length]
            try:
                return self._store(src.f.fileno(), start, length, view, dtype, src.written, base)
            finally:
                view.release()

    def _store(
        self, fd: int, start: int, length: int, view, dtype: str | None, written: list[str], base: str | None = None
    ) -> str:
        """The id of the chunk ``view`` (``length`` bytes of file ``fd`` at ``start``), stored
        unless this snapshot or the store has it already (as a delta against ``base`` where that
        is smaller); ``written`` gets it if this stored it."""
        cid = chunk_id(view)
        with self._lock:
            mine = cid not in self._claimed
            self._claimed.add(cid)
        # put_chunk writes nothing (and sends nothing) when the store already has the chunk
        # dtype lets a compressed store choose its codec (byte planes for floating tensors)
        if mine and base is not None and base != cid:
            stored = self.store.put_chunk_from_file(cid, fd, start, length, view, dtype=dtype, base=base)
        else:
            stored = self.store.put_chunk_from_file(cid, fd, start, length, view, dtype=dtype) if mine else None
        if stored:  # the bytes written, as stored (True from a store that only says whether)
            with self._lock:
                self.new_chunks += 1
                self.new_bytes += length
                self.new_stored_bytes += length if stored is True else stored
                written.append(cid)
        self.progress.advance(length)
        return cid


class BaseChunks:
    """Where a snapshot looks for the base of each chunk it stores (deltas, docs/deltas.md): the
    chunk of the same region in the base version. A region is a file's part (a tensor, a header,
    a file's data) and a chunk's index in it; a tensor found under no file of the same path (a
    checkpoint re-sharded, a file renamed) is looked for by its name alone, if it names one tensor."""

    def __init__(self, manifest: Manifest) -> None:
        self.root = manifest.root
        self.chunk_size = manifest.chunk_size
        self._places: dict[tuple[str, str, str, int], tuple[str, int]] = {}
        self._tensors: dict[tuple[str, int], tuple[str, int] | None] = {}
        cs = manifest.chunk_size
        for f in manifest.files:
            for p in f.parts:
                for k, cid in enumerate(p.chunk_ids()):
                    found = (cid, min(cs, p.length - k * cs))
                    self._places[f.path, p.kind, p.name, k] = found
                    if p.kind == "tensor":
                        key = (p.name, k)
                        self._tensors[key] = found if key not in self._tensors else None  # ambiguous: none

    def find(self, path: str, kind: str, name: str, k: int, length: int) -> str | None:
        """The id of the base chunk for chunk ``k`` of part ``(kind, name)`` of file ``path``,
        ``length`` bytes long, or None."""
        found = self._places.get((path, kind, name, k))
        if found is None and kind == "tensor":
            found = self._tensors.get((name, k))
        return found[0] if found is not None and found[1] == length else None

    def __len__(self) -> int:
        return len(self._places)


def base_chunks(store: Store, root: str | None, chunk_size: int) -> BaseChunks | None:
    """The :class:`BaseChunks` of snapshot ``root`` in ``store``, or None where no delta can be
    made: no root, a store that keeps bare bytes (neither compressed nor encrypted), or a base cut
    in chunks of another size."""
    if root is None or not store.encoding().framed:
        return None
    manifest = Manifest.from_json(store.get_manifest_bytes(root), expected_root=root, verify=True)
    return BaseChunks(manifest) if manifest.chunk_size == chunk_size else None


def _read_all(fd: int, size: int) -> bytes:
    """The ``size`` bytes of the file ``fd`` (one call, more if the kernel gives less). A file that
    shrank meanwhile gives fewer: its chunks fail, and its changed size is refused after."""
    data = os.pread(fd, size, 0)
    while len(data) < size:
        more = os.pread(fd, size - len(data), len(data))
        if not more:
            break
        data += more
    return data


def _part_args(layout_entry, ids: list[str]):
    kind, name, off, length, dtype, shape = layout_entry
    return (kind, name, off, length, ids, dtype, shape)


def snapshot(
    source: str | os.PathLike,
    store: Store,
    *,
    ref: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    message: str = "",
    progress: Progress | None = None,
    workers: int | None = None,
    before_ref: Callable[[Store, str], object] | None = None,
    base: str | None = None,
    delta: bool = True,
) -> SnapshotResult:
    """Snapshot ``source`` into ``store``; with ``ref``, point that ref at the new root (compare-and-swap).
    ``before_ref(store, root)`` runs once the manifest is written and before the ref moves (e.g. to
    keep a signature after checking it against the stored bytes); if it raises, no ref moves.

    In a compressed or encrypted store, each new chunk is stored as a delta against the chunk of
    the same region in a base version where that is smaller (docs/deltas.md): ``base`` (a ref,
    ``REF~N`` or a root), else the ref's current root when it has one. ``delta=False`` stores
    every chunk whole. The root is the same either way."""
    check_chunk_size(chunk_size)
    ref = check_writable_ref(ref) if ref is not None else None  # "" is a mistake, not "no ref"
    sized = collect_sized_files(source)
    files = [(rel, path) for rel, path, _ in sized]
    sizes = [size for _, _, size in sized]
    expected = None
    if ref:
        current = store.read_ref(ref)
        expected = current.root if current else None
    bases = None
    if delta:
        bases = base_chunks(store, resolve_root(store, base) if base is not None else expected, chunk_size)
    prog = ensure(progress)
    prog.start(sum(sizes), "snapshot")
    snap = _Snapshotter(store, chunk_size, prog, workers, bases)
    name = os.path.basename(os.fspath(source))
    with write_lease(store, f"snapshot of {name}" + (f" to ref {ref}" if ref else "")):
        try:
            with ThreadPoolExecutor(snap.workers, thread_name_prefix="concord-snapshot") as pool:
                entries = snap.entries(files, pool, sizes)
        finally:
            prog.close()
        manifest = Manifest.build(chunk_size, entries)
        # an unchanged folder's manifest is there already: not worth encoding 20,000 files again
        if snap.new_chunks or not store.has_manifest(manifest.root):
            store.put_manifest(manifest.root, manifest.to_json())
        if before_ref is not None:
            before_ref(store, manifest.root)
        version = None
        if ref:
            version = store.cas_ref(ref, expected, manifest.root, message or f"snapshot of {name}").version
    return SnapshotResult.of(
        manifest, new_chunks=snap.new_chunks, new_bytes=snap.new_bytes, new_stored_bytes=snap.new_stored_bytes,
        ref=ref, version=version, previous=expected,
    )
