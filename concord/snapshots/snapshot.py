"""Take a snapshot: a checkpoint folder (or file) → chunks in a store + a manifest (+ a ref).

Files are memory-mapped, never read whole. A ``.safetensors`` file is cut along its own layout:
the header is one part, each tensor another, and each part is chunked from its first byte; DCP
``.distcp`` files, ``torch.save`` archives and GGUF files likewise, from their own indexes
(:mod:`concord.snapshots.formats`, which never unpickles anything). Other files are one part
each. Each chunk goes through one small pipeline on a thread pool (BLAKE3 releases the GIL):
hash, claim (a chunk seen twice in one snapshot is handled once), write unless the store already
holds it. At most ``WINDOW`` chunks are in flight, so memory stays flat whatever
the checkpoint size. The manifest is written after every chunk it names, and the ref last.

All the writing happens under a garbage-collection lease: a chunk the store already holds is not
written again, and the lease keeps a collection from deleting it before the new ref names it.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from concord.errors import ControlCharacterNameError, SourceChangedError, SourceNotFoundError
from concord.snapshots.gc import write_lease
from concord.hashing import chunk_id
from concord.snapshots.manifest import (
    DEFAULT_CHUNK_SIZE,
    FileEntry,
    Manifest,
    check_chunk_size,
    make_file,
    make_part,
)
from concord.progress import Progress, ensure
from concord.snapshots.formats import file_layout
from concord.stores.base import Store, check_writable_ref
from concord.text import control_char
from concord.snapshots.walk import walk_files

#: chunks in flight at once: bounds memory (futures, ids) whatever the checkpoint size
WINDOW = 64


@dataclass(frozen=True)
class SnapshotResult:
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


def collect_files(source: str | os.PathLike) -> list[tuple[str, str]]:
    """``(relative posix path, absolute path)`` of every regular file under ``source``, sorted.

    Symlinks are followed (a Hugging Face cache folder is made of them), but no folder is
    walked twice, so a link loop ends (see :mod:`concord.snapshots.walk`). A file name holding a control
    character is refused (:class:`ControlCharacterNameError`): it could not be shown on a
    terminal as it is, nor restored safely everywhere.
    """
    src = os.path.abspath(os.fspath(source))
    if not os.path.exists(src):
        raise SourceNotFoundError(src)
    if os.path.isfile(src):
        return [(os.path.basename(src), src)]
    out = []
    for rel, full in walk_files(src):
        if control_char(rel) is not None:
            raise ControlCharacterNameError(os.path.join(src, rel))
        out.append((rel, full))
    if not out:
        raise ValueError(f"{src}: the folder holds no files; point at a checkpoint folder or file.")
    return sorted(out)


class _Snapshotter:
    """Hashes and stores the chunks of one snapshot, one pipeline per chunk:
    hash → claim (so a chunk seen twice is written once) → write unless the store has it."""

    def __init__(self, store: Store, chunk_size: int, progress: Progress, workers: int | None) -> None:
        self.store = store
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
        with open(path, "rb") as f:
            before = os.fstat(f.fileno())
            size = before.st_size
            kind, layout = file_layout(f, size, path, rel)
            if size == 0:
                return make_file(rel, 0, kind, [make_part(*_part_args(lay, [])) for lay in layout])
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            written: list[str] = []
            try:
                if hasattr(mm, "madvise"):
                    mm.madvise(mmap.MADV_SEQUENTIAL)
                parts = self._parts(mm, f.fileno(), layout, pool, written)
            finally:
                mm.close()
            after = os.stat(path)
            if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                for cid in written:  # their bytes may not match their names: take them back
                    self.store.delete_chunk(cid)
                raise SourceChangedError(path)
        return make_file(rel, size, kind, parts)

    def _parts(self, mm: mmap.mmap, fd: int, layout, pool: ThreadPoolExecutor, written: list[str]) -> list:
        cs = self.chunk_size
        spans = (
            (i, start, min(cs, off + length - start), dtype)
            for i, (_, _, off, length, dtype, _) in enumerate(layout)
            for start in range(off, off + length, cs)
        )
        ids_per_part: list[list[str]] = [[] for _ in layout]
        for i, cid in _bounded_map(pool, lambda s: (s[0], self._chunk(mm, fd, s[1], s[2], written, s[3])), spans, WINDOW):
            ids_per_part[i].append(cid)
        return [make_part(*_part_args(lay, ids_per_part[i])) for i, lay in enumerate(layout)]

    def _chunk(self, mm: mmap.mmap, fd: int, start: int, length: int, written: list[str], dtype: str | None = None) -> str:
        with memoryview(mm) as mv:
            view = mv[start : start + length]
            try:
                cid = chunk_id(view)
                with self._lock:
                    mine = cid not in self._claimed
                    self._claimed.add(cid)
                # put_chunk writes nothing (and sends nothing) when the store already has the chunk
                # dtype lets a compressed store choose its codec (byte planes for floating tensors)
                stored = self.store.put_chunk_from_file(cid, fd, start, length, view, dtype=dtype) if mine else None
                if stored:  # the bytes written, as stored (True from a store that only says whether)
                    with self._lock:
                        self.new_chunks += 1
                        self.new_bytes += length
                        self.new_stored_bytes += length if stored is True else stored
                        written.append(cid)
            finally:
                view.release()
        self.progress.advance(length)
        return cid


def _bounded_map(pool: ThreadPoolExecutor, fn, items: Iterable, window: int) -> Iterator:
    """``pool.map`` in order with at most ``window`` tasks in flight, so memory stays bounded."""
    pending: deque = deque()
    it = iter(items)
    try:
        for item in itertools.islice(it, window):
            pending.append(pool.submit(fn, item))
        while pending:
            result = pending.popleft().result()
            for item in itertools.islice(it, 1):
                pending.append(pool.submit(fn, item))
            yield result
    finally:
        for fut in pending:
            fut.cancel()


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
) -> SnapshotResult:
    """Snapshot ``source`` into ``store``; with ``ref``, point that ref at the new root (compare-and-swap).
    ``before_ref(store, root)`` runs once the manifest is written and before the ref moves (e.g. to
    keep a signature after checking it against the stored bytes); if it raises, no ref moves."""
    check_chunk_size(chunk_size)
    ref = check_writable_ref(ref) if ref is not None else None  # "" is a mistake, not "no ref"
    files = collect_files(source)
    expected = None
    if ref:
        current = store.read_ref(ref)
        expected = current.root if current else None
    prog = ensure(progress)
    total = sum(os.path.getsize(p) for _, p in files)
    prog.start(total, "snapshot")
    snap = _Snapshotter(store, chunk_size, prog, workers)
    name = os.path.basename(os.fspath(source))
    with write_lease(store, f"snapshot of {name}" + (f" to ref {ref}" if ref else "")):
        try:
            with ThreadPoolExecutor(snap.workers, thread_name_prefix="concord-snapshot") as pool:
                entries = [snap.file_entry(rel, path, pool) for rel, path in files]
        finally:
            prog.close()
        manifest = Manifest.build(chunk_size, entries)
        store.put_manifest(manifest.root, manifest.to_json())
        if before_ref is not None:
            before_ref(store, manifest.root)
        version = None
        if ref:
            version = store.cas_ref(ref, expected, manifest.root, message or f"snapshot of {name}").version
    return SnapshotResult(
        root=manifest.root,
        files=manifest.n_files,
        tensors=manifest.n_tensors,
        chunks=manifest.n_chunks,
        bytes=manifest.total_bytes,
        new_chunks=snap.new_chunks,
        new_bytes=snap.new_bytes,
        new_stored_bytes=snap.new_stored_bytes,
        ref=ref,
        ref_version=version,
        previous=expected,
        manifest=manifest,
    )
