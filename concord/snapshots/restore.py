"""Restore a snapshot into a folder whose files are byte-identical to the originals.

Everything is written into a temporary sibling folder, every chunk verified as it is read, and
the folder is renamed into place only when complete: the destination either does not exist or
holds the whole snapshot. A ``check_root`` (a trust policy's) runs before anything is written
and may answer with digests the files must have (a :class:`DigestCheck`): each file's bytes are
fed to its digest as they are written, in file order, and the digests are compared before the
rename, so the restored bytes are read once. Manifest paths that would leave the folder, or that
hold a control character (which ``concord snapshot`` never records), are refused before any byte
is written.

Chunks are fetched and written by several threads, in runs taken in turn from one lane of files
per thread (the files cut into contiguous lanes), so the threads create files in different folders
rather than queueing on one folder's lock. With a :class:`DigestCheck`, the thread that
wrote a chunk feeds it to its file's digest as soon as the chunk before it in that file has been
fed: chunks are taken in file order, so a thread waits only for work already under way, and the
bytes are hashed while still in hand (no copy, no buffer of chunks that arrived early).
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from concord.errors import ConcordError, IntegrityError, LocalFileError, RestoreTargetError
from concord.files import OpenFiles, bounded_map, pwrite_all, round_robin, spans
from concord.progress import Progress, ensure
from concord.snapshots.manifest import Manifest
from concord.snapshots.paths import target_paths
from concord.stores.base import Store


@dataclass(frozen=True)
class RestoreResult:
    """What :func:`restore` wrote: the snapshot ``root``, its files and bytes, into ``path``."""

    root: str
    files: int
    bytes: int
    path: str
    #: the folder already held exactly this root (checked by size and chunk digest): nothing written
    unchanged: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Hasher(Protocol):
    def update(self, data) -> None: ...


class DigestCheck(Protocol):
    """Digests a restore computes from the bytes it writes and has checked before its rename
    (a trust policy's answer for a root vouched for by file digests only)."""

    def hasher(self, path: str, size: int) -> Hasher | None:
        """A new digest of file ``path`` (``size`` bytes), fed its bytes in order; None: not checked."""

    def check(self, hashers: Mapping[str, Any]) -> None:
        """Raise unless the digests (path → the hasher :meth:`hasher` gave, fed all its bytes) are the
        expected ones."""


class _InOrder:
    """Feeds each checked file's bytes, in file order, to its hasher. The thread that wrote chunk
    ``k`` of a file waits until chunks ``0..k-1`` have been fed, then feeds its own. A chunk that
    failed marks its file broken: the threads behind it stop waiting (the restore fails anyway)."""

    def __init__(self, hashers: Mapping[int, Hasher]) -> None:
        self.hashers = hashers
        self.fed = dict.fromkeys(hashers, 0)  # file index → chunks fed; -1: broken
        self.cond = threading.Condition()

    def feed(self, file: int, k: int, data) -> None:
        hasher = self.hashers.get(file)
        if hasher is None:
            return
        with self.cond:
            while self.fed[file] != k:
                if self.fed[file] < 0:
                    return
                self.cond.wait()
        done = False
        try:
            hasher.update(data)  # alone: no other thread may feed this file now
            done = True
        finally:
            self._set(file, k + 1 if done else -1)

    def broken(self, file: int) -> None:
        if file in self.fed:
            self._set(file, -1)

    def _set(self, file: int, value: int) -> None:
        with self.cond:
            if self.fed[file] >= 0:
                self.fed[file] = value
            self.cond.notify_all()


#: a check of a root before it is restored (a trust policy's ``restore_check``): raises to refuse
#: it; may return digests the files must have, computed as they are written and checked before
#: the final rename
RootCheck = Callable[[Store, str], "DigestCheck | None"]


#: tasks in flight at once across all files: bounds memory whatever the snapshot holds
WINDOW = 64
#: chunks one thread restores per task at the most
RUN_CHUNKS = 16


def restore(
    store: Store,
    manifest: Manifest,
    out_dir: str | os.PathLike,
    *,
    progress: Progress | None = None,
    check_root: RootCheck | None = None,
) -> RestoreResult:
    out = os.path.abspath(os.fspath(out_dir))
    digests = check_root(store, manifest.root) if check_root is not None else None  # trust first
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        if os.path.isdir(out) and holds_root(manifest, out):
            return RestoreResult(manifest.root, manifest.n_files, manifest.total_bytes, out, unchanged=True)
        raise RestoreTargetError(out)
    parent = os.path.dirname(out)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.concord-tmp-{uuid.uuid4().hex[:12]}")
    _local(tmp, out, os.makedirs, parent, exist_ok=True)
    _local(tmp, out, os.mkdir, tmp)
    prog = ensure(progress)
    # one queue of chunks across every file; each file is opened at its first chunk and closed
    # after its last, so a few files are open at once however many the snapshot holds
    files = OpenFiles(os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0))
    try:
        paths = target_paths((f.path for f in manifest.files), tmp)  # a folder just made: no link in it
        hashers: dict[int, Hasher] = {}
        if digests is not None:
            for i, f in enumerate(manifest.files):
                h = digests.hasher(f.path, f.size)
                if h is not None:
                    hashers[i] = h
        feed = _InOrder(hashers) if hashers else None
        prog.start(manifest.total_bytes, "restore")
        _local(tmp, out, _make_folders, paths)

        def jobs(lo: int, hi: int):
            """The chunks of files ``lo`` to ``hi`` (excluded), in file order."""
            cs = manifest.chunk_size
            for i in range(lo, hi):
                f, path = manifest.files[i], paths[i]
                only = f.only_chunk()
                if only is not None:  # one chunk (most small files): opened, written and closed by the thread that fetched it
                    yield i, 0, path, *only, True
                    continue
                parts = f.parts
                n = sum(p.n_chunks for p in parts)
                if n == 0:
                    _local(tmp, out, _create_empty, path)
                    continue
                if n == 1:
                    cid, offset, length = next(span for p in parts for span in p.chunk_spans(cs))
                    yield i, 0, path, cid, offset, length, True
                    continue
                files.expect(path, n)
                k = 0  # the manifest's parts and chunks are in file order, contiguous (checked when it is read)
                for p in f.parts:
                    for cid, offset, length in p.chunk_spans(cs):
                        yield i, k, path, cid, offset, length, False
                        k += 1

        def write(job) -> None:
            i, k, path, cid, offset, length, whole = job
            try:
                data = store.read_chunk(cid, verify=True)  # transient: written (and hashed) at once
                if len(data) != length:
                    raise IntegrityError(f"chunk {cid} in {store.uri}", f"{length} bytes", f"{len(data)} bytes")
                try:
                    if whole:
                        _write_whole(path, data, offset)
                    else:
                        files.write(path, data, offset)
                        files.done(path)
                except OSError as exc:
                    if isinstance(exc, ConcordError):
                        raise
                    raise _local_error(tmp, out, exc, path) from exc
            except BaseException:
                if feed is not None:
                    feed.broken(i)
                raise
            if feed is not None:
                feed.feed(i, k, data)

        def write_run(run: list) -> None:
            for job in run:
                write(job)
            prog.advance(sum(job[5] for job in run))  # once a run, not once a chunk

        # runs of chunks, one task each (a small file's chunk costs the queue little), a few per thread at least
        per = max(1, min(RUN_CHUNKS, manifest.n_chunks // (4 * store.parallelism)))
        # one lane of files per thread, their runs taken in turn: the threads create files in
        # different folders, not queued on one folder's lock (on ext4 without a journal, a file
        # made where many were removed minutes ago walks past each of them under that lock)
        lanes = round_robin(_runs(jobs(lo, hi), per) for lo, hi in spans(len(manifest.files), store.parallelism))
        with ThreadPoolExecutor(store.parallelism, thread_name_prefix="concord-restore") as pool:
            for _ in bounded_map(pool, write_run, lanes, WINDOW):
                pass
        _local(tmp, out, files.close)
        if digests is not None:
            digests.check({manifest.files[i].path: h for i, h in hashers.items()})
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        _local(tmp, out, os.rename, tmp, out)
    finally:
        files.abandon()  # closed above unless something failed
        prog.close()
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return RestoreResult(manifest.root, manifest.n_files, manifest.total_bytes, out)


def holds_root(manifest: Manifest, out: str) -> bool:
    """Whether folder ``out`` holds exactly ``manifest``'s files (no other file, each of its size,
    every chunk of it hashing to the manifest's id). Reads only; a link is never followed."""
    from concord.hashing import chunk_id
    from concord.snapshots.manifest import safe_relpath

    expected = {safe_relpath(f.path): f for f in manifest.files}
    found: set[str] = set()
    for folder, dirs, names in os.walk(out):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            found.add(os.path.relpath(os.path.join(folder, name), out).replace(os.sep, "/"))
    if found != set(expected):
        return False
    for rel, f in expected.items():
        path = os.path.join(out, *rel.split("/"))
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) != f.size:
            return False
        with open(path, "rb") as fh:
            for p in f.parts:
                for cid, offset, length in p.chunk_spans(manifest.chunk_size):
                    fh.seek(offset)
                    data = fh.read(length)
                    if len(data) != length or chunk_id(data) != cid:
                        return False
    return True


def _runs(items, n: int):
    """``items`` in lists of ``n`` (the last may be shorter)."""
    it = iter(items)
    while run := list(itertools.islice(it, n)):
        yield run


def _make_folders(paths: list[str]) -> None:
    for folder in dict.fromkeys(os.path.dirname(p) for p in paths):
        os.makedirs(folder, exist_ok=True)


def _write_whole(path: str, data, offset: int) -> None:
    """A new file of one chunk, written at once (no other thread touches it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        pwrite_all(fd, data, offset)
    finally:
        os.close(fd)


def _create_empty(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666))


def _local(tmp: str, out: str, fn, *args, **kwargs):
    """``fn(*args)``, with an OS error of this machine (a folder not writable, a full disk, the
    open-file limit) said as :class:`LocalFileError` naming the path as it will be after the
    restore, never as the store's problem."""
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        if isinstance(exc, ConcordError):
            raise
        raise _local_error(tmp, out, exc, args[0] if args and isinstance(args[0], str) else None) from exc


def _local_error(tmp: str, out: str, exc: OSError, path: str | None) -> LocalFileError:
    """``exc``, an OS error of this machine while writing ``path`` (None: not one file), as a
    :class:`LocalFileError` naming the path as it will be after the restore."""
    where = exc.filename if isinstance(exc.filename, str) else (path or tmp)
    if where == tmp or where.startswith(tmp + os.sep):
        where = out + where[len(tmp):]
    return LocalFileError(where, exc.strerror or str(exc))
