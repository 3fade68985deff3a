"""Take a snapshot: a checkpoint folder (or file) → chunks in a store + a manifest (+ a ref).

Files are memory-mapped, never read whole. A ``.safetensors`` file is cut along its own layout:
the header is one part, each tensor another, and each part is chunked from its first byte. Other
files are one part each. Chunks are hashed on a thread pool (BLAKE3 releases the GIL), the store
is asked in one batch which of them it already holds, and only the rest are written. The
manifest is written after every chunk it names, and the ref last.
"""

from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from concord.errors import SourceNotFoundError
from concord.hashing import chunk_id
from concord.manifest import (
    DEFAULT_CHUNK_SIZE,
    FileEntry,
    Manifest,
    check_chunk_size,
    make_file,
    make_part,
)
from concord.progress import Progress, ensure
from concord.safetensors_header import looks_like_safetensors, read_header
from concord.stores.base import Store, canonical_ref

#: chunks hashed per batch: bounds memory (futures, ids) whatever the checkpoint size
BATCH = 64


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
    manifest: Manifest | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "manifest"}
        return d


def collect_files(source: str | os.PathLike) -> list[tuple[str, str]]:
    """``(relative posix path, absolute path)`` of every regular file under ``source``, sorted.

    Symlinks to files are followed (a Hugging Face cache folder is made of them).
    """
    src = os.path.abspath(os.fspath(source))
    if not os.path.exists(src):
        raise SourceNotFoundError(src)
    if os.path.isfile(src):
        return [(os.path.basename(src), src)]
    out = []
    for dirpath, dirnames, filenames in os.walk(src, followlinks=True):
        dirnames.sort()
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            if os.path.isfile(full):
                rel = os.path.relpath(full, src).replace(os.sep, "/")
                out.append((rel, full))
    if not out:
        raise ValueError(f"{src}: the folder holds no files; point at a checkpoint folder or file.")
    return sorted(out)


class _Snapshotter:
    def __init__(self, store: Store, chunk_size: int, progress: Progress, workers: int | None) -> None:
        self.store = store
        self.chunk_size = chunk_size
        self.progress = progress
        self.hash_workers = workers or max(2, min(8, os.cpu_count() or 2))
        self.written: set[str] = set()  # ids this snapshot has written or found present
        self.new_chunks = 0
        self.new_bytes = 0

    def file_entry(self, rel: str, path: str, hash_pool, write_pool) -> FileEntry:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if looks_like_safetensors(path):
                header = read_header(f, size, rel)
                layout = [("header", "", 0, header.data_start, None, None)] + [
                    ("tensor", t.name, t.begin, t.length, t.dtype, t.shape) for t in header.tensors
                ]
                kind = "safetensors"
            else:
                layout = [("data", "", 0, size, None, None)]
                kind = "blob"
            if size == 0:
                return make_file(rel, 0, kind, [make_part(*_part_args(lay, [])) for lay in layout])
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                if hasattr(mm, "madvise"):
                    mm.madvise(mmap.MADV_SEQUENTIAL)
                parts = self._parts(mm, layout, hash_pool, write_pool)
            finally:
                mm.close()
        return make_file(rel, size, kind, parts)

    def _parts(self, mm: mmap.mmap, layout, hash_pool, write_pool) -> list:
        cs = self.chunk_size
        spans: list[tuple[int, int, int]] = []  # (part index, start, length)
        for i, (_, _, off, length, _, _) in enumerate(layout):
            for start in range(off, off + length, cs):
                spans.append((i, start, min(cs, off + length - start)))
        ids_per_part: list[list[str]] = [[] for _ in layout]
        for b in range(0, len(spans), BATCH):
            batch = spans[b : b + BATCH]
            ids = list(hash_pool.map(lambda s: self._hash(mm, s[1], s[2]), batch))
            self._store_missing(mm, batch, ids, write_pool)
            for (i, _, _), cid in zip(batch, ids):
                ids_per_part[i].append(cid)
        return [make_part(*_part_args(lay, ids_per_part[i])) for i, lay in enumerate(layout)]

    def _hash(self, mm: mmap.mmap, start: int, length: int) -> str:
        with memoryview(mm) as mv:
            cid = chunk_id(mv[start : start + length])
        self.progress.advance(length)
        return cid

    def _store_missing(self, mm: mmap.mmap, batch, ids: list[str], write_pool) -> None:
        todo: dict[str, tuple[int, int]] = {}
        for (_, start, length), cid in zip(batch, ids):
            if cid not in self.written and cid not in todo:
                todo[cid] = (start, length)
        if not todo:
            return
        present = self.store.has_chunks(list(todo))
        self.written.update(present)
        missing = [(cid, s, n) for cid, (s, n) in todo.items() if cid not in present]

        def write(item):
            cid, start, length = item
            with memoryview(mm) as mv:
                return length if self.store.put_chunk(cid, mv[start : start + length], verify=False) else 0

        for (cid, _, _), n in zip(missing, write_pool.map(write, missing)):
            self.written.add(cid)
            if n:
                self.new_chunks += 1
                self.new_bytes += n


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
) -> SnapshotResult:
    """Snapshot ``source`` into ``store``; with ``ref``, point that ref at the new root (compare-and-swap)."""
    check_chunk_size(chunk_size)
    ref = canonical_ref(ref) if ref else None
    files = collect_files(source)
    expected = None
    if ref:
        current = store.read_ref(ref)
        expected = current.root if current else None
    prog = ensure(progress)
    total = sum(os.path.getsize(p) for _, p in files)
    prog.start(total, "snapshot")
    snap = _Snapshotter(store, chunk_size, prog, workers)
    try:
        with ThreadPoolExecutor(snap.hash_workers, thread_name_prefix="concord-hash") as hp, ThreadPoolExecutor(
            store.parallelism, thread_name_prefix="concord-put"
        ) as wp:
            entries = [snap.file_entry(rel, path, hp, wp) for rel, path in files]
    finally:
        prog.close()
    manifest = Manifest.build(chunk_size, entries)
    store.put_manifest(manifest.root, manifest.to_json())
    version = None
    if ref:
        updated = store.cas_ref(ref, expected, manifest.root, message or f"snapshot of {os.path.basename(os.fspath(source))}")
        version = updated.version
    return SnapshotResult(
        root=manifest.root,
        files=manifest.n_files,
        tensors=manifest.n_tensors,
        chunks=manifest.n_chunks,
        bytes=manifest.total_bytes,
        new_chunks=snap.new_chunks,
        new_bytes=snap.new_bytes,
        ref=ref,
        ref_version=version,
        previous=expected,
        manifest=manifest,
    )
