"""Check a snapshot out beside a serving link: write it whole, verified, then flip the link.

The new version is written into ``.partial-<root>/`` of the versions folder (see
:mod:`concord.serving.versions`). Its manifest says which byte ranges of each file are which
chunk, and the manifests of the versions already on the node say where each of their chunks
lies, so every chunk the node already holds is copied from there with ``copy_file_range`` (a
reflink where the filesystem can share blocks, a copy in the kernel elsewhere) and only the others
are fetched: from the cache store if one is given and holds them, else from the store (and then
kept in the cache for the next node of the host). A fetched chunk that the store keeps as a delta
(docs/deltas.md) is decoded against the node's own bytes of its base chunk where a version here
holds them (the node served the base), read from the file that holds them, instead of against
the base read and decoded from the store; should the result not hash right (that file rotted or
was edited), the store's base is used. Every byte is verified: a fetched chunk is
hashed as it arrives; a copied range comes from a file whose bytes were verified when it was
written and whose size, times and inode are unchanged since (``.manifests/<root>.files.json``),
and any other copied range is read back and hashed (``rehash`` reads back every one). Only a
whole, verified version is renamed to ``<root>/``, and only then is the link flipped.

A version the node keeps from before is never modified: checking it out again re-checks it in
place, reading only, and flips to it when every file is right; a damaged one is repaired in a
new ``.partial-<root>/`` whose unchanged files are hard links to the kept ones (only the damaged
files are written), exchanged with it in one atomic rename once whole and verified.

Crash safety: a checkout killed at any point leaves the link on the version it named, every
kept version whole, and no half version under any name the link can point to; a re-run finds
``.partial-<root>/`` and keeps every range already right (hashed, not trusted). A full disk
removes the partial version and says so. A checkout killed during its health gate leaves
``gate.json`` naming the version the gate never passed: the next checkout of that root runs its
gate again (without a gate, it flips back), and a rollback flips back. Checkouts, rollbacks and
prunes of one link take its lock in turn.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from concord.errors import (
    CheckoutDiskFullError,
    ConcordError,
    HealthCheckFailedError,
    IntegrityError,
    LocalFileError,
)
from concord.files import OpenFiles, atomic_write, bounded_map, pwrite_all, round_robin, spans
from concord.hashing import chunk_id
from concord.progress import Progress, ensure
from concord.serving.health import HealthCheck
from concord.serving.versions import DEFAULT_WAIT, Layout, end_leftover_gate, fsync_dir, prune, remove_tree, swap_dirs
from concord.snapshots.manifest import Manifest, safe_relpath
from concord.snapshots.paths import target_paths
from concord.stores import local as local_store
from concord.stores import scratch
from concord.stores.base import Store

if TYPE_CHECKING:
    from concord.trust import TrustPolicy

#: errors that mean the disk (or a quota, or a file size limit) is full
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: tasks in flight at once across all files: bounds memory whatever the version holds
WINDOW = 64
#: chunks one thread places per task at the most
RUN_CHUNKS = 16


@dataclass(frozen=True)
class CheckoutResult:
    """What :func:`checkout` did: the root now served at ``path``, the one before, and the bytes
    fetched, reused and read from the cache."""

    root: str
    path: str
    bytes: int
    bytes_fetched: int
    bytes_reused: int
    bytes_from_cache: int
    previous: str | None
    seconds: float
    switched: bool
    files: int
    pruned: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["pruned"] = list(self.pruned)
        return d


@dataclass
class _Tally:
    fetched: int = 0
    reused: int = 0
    cached: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    def add(self, what: str, n: int) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + n)


def _stat_key(st: os.stat_result) -> list[int]:
    """What changes when a file's bytes are written through the filesystem (ctime cannot be set back)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _record_files(
    layout: Layout, root: str, base: str, manifest: Manifest, fsync: bool, known: dict[str, list[int]] | None = None
) -> None:
    """Note each verified file's size, times and inode beside the manifest: while they are the
    same, the file holds the bytes that were verified, and a later checkout copies from it
    without reading it back (``rehash`` reads everything again). ``known``: the keys of files
    taken from their descriptors after their last write (manifest path -> key), not looked up again."""
    known = known or {}
    files = {
        f.path: known[f.path] if f.path in known else _stat_key(os.stat(os.path.join(base, *f.path.split("/"))))
        for f in manifest.files
    }
    atomic_write(_files_path(layout, root), json.dumps({"root": root, "files": files}).encode(), fsync=fsync)


def _files_path(layout: Layout, root: str) -> str:
    return layout.manifest_path(root)[: -len(".json")] + ".files.json"


def _verified_files(layout: Layout, root: str, base: str) -> set[str]:
    """The paths of ``root``'s files under ``base`` still as they were when verified."""
    try:
        with open(_files_path(layout, root), "rb") as f:
            doc = json.loads(f.read())
        recorded = doc["files"] if doc.get("root") == root else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    out = set()
    for rel, key in recorded.items():
        try:
            if _stat_key(os.stat(os.path.join(base, *str(rel).split("/")))) == key:
                out.add(rel)
        except (OSError, ValueError):
            pass
    return out


def _local_sources(layout: Layout, order: list[str], rehash: bool) -> dict[str, tuple[str, int, bool]]:
    """Where each chunk lies in the versions already on this node: ``cid -> (file, offset,
    verified)``, ``verified`` when the file is unchanged since it was verified. Versions earlier in
    ``order`` win (the current one first: its pages are warm), and a verified copy over another."""
    out: dict[str, tuple[str, int, bool]] = {}
    for root in reversed(order):
        vdir = layout.version_dir(root)
        try:
            with open(layout.manifest_path(root), "rb") as f:
                m = Manifest.from_json(f.read(), expected_root=root)
        except (OSError, ValueError):
            continue  # a version without its manifest is served, but not copied from
        good = set() if rehash else _verified_files(layout, root, vdir)
        for fe in m.files:
            path = os.path.join(vdir, *fe.path.split("/"))
            ok = fe.path in good
            for p in fe.parts:
                for cid, offset, _ in p.chunk_spans(m.chunk_size):
                    if ok or not out.get(cid, (None, None, False))[2]:
                        out[cid] = (path, offset, ok)
    return out


def _damaged_files(layout: Layout, manifest: Manifest, rehash: bool) -> list[str]:
    """The paths of ``manifest``'s files whose bytes in the kept ``<root>/`` are not the
    manifest's, read without writing: a file unchanged since it was verified is taken as it is
    (``rehash``: hashed too), any other is hashed chunk by chunk. A file that is missing, not a
    plain file, reached through a link, or of another size is damaged."""
    root = manifest.root
    vdir = layout.version_dir(root)
    real = os.path.realpath(vdir)
    good = set() if rehash else _verified_files(layout, root, vdir)
    bad = []
    for f in manifest.files:
        if f.path in good:
            continue
        rel = safe_relpath(f.path)
        path = os.path.join(vdir, *rel.split("/"))
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size != f.size or os.path.realpath(path) != os.path.join(real, *rel.split("/")):
                bad.append(f.path)
                continue
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            bad.append(f.path)
            continue
        try:
            if any(chunk_id(os.pread(fd, length, offset)) != cid
                   for p in f.parts for cid, offset, length in p.chunk_spans(manifest.chunk_size)):
                bad.append(f.path)
        finally:
            os.close(fd)
    return bad


def _link_or_copy(src: str, dst: str) -> None:
    """Put the verified file ``src`` at ``dst`` as a hard link (the same bytes, nothing written);
    a filesystem without hard links gets a copy in the kernel."""
    try:
        if os.path.lexists(dst):
            if os.path.samefile(src, dst):
                return
            os.unlink(dst)
        os.link(src, dst)
        return
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
    sfd = os.open(src, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            size = os.fstat(sfd).st_size
            if size:
                _copy(sfd, 0, dfd, 0, size)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _own_file(path: str) -> None:
    """Make sure writing ``path`` changes no other file: a hard link (to a kept version, left by
    a killed repair) or anything but a plain file is removed first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_nlink > 1 or not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)


#: the block size copies are aligned to, so a filesystem that shares blocks (XFS, Btrfs) can
#: reflink the middle of each range (a reflink needs both offsets on a block boundary)
BLOCK = 4096


def _copy(src_fd: int, src_off: int, dst_fd: int, dst_off: int, length: int) -> None:
    """Copy a range between files in the kernel. When both offsets sit at the same place within a
    block, the range is cut at block boundaries: the whole blocks in the middle go in one call
    that a reflinking filesystem shares instead of copying, the ragged ends in calls of their own."""
    pieces = [(src_off, dst_off, length)]
    if (src_off - dst_off) % BLOCK == 0 and length >= 2 * BLOCK:
        head = -dst_off % BLOCK
        mid = (length - head) // BLOCK * BLOCK
        pieces = [(src_off, dst_off, head), (src_off + head, dst_off + head, mid),
                  (src_off + head + mid, dst_off + head + mid, length - head - mid)]
    for s_off, d_off, n in pieces:
        done = 0
        while done < n:
            got = os.copy_file_range(src_fd, dst_fd, n - done, s_off + done, d_off + done)
            if got <= 0:
                raise OSError(errno.EIO, "copy_file_range copied nothing (the source is shorter than its manifest says)")
            done += got


class _EarlySync:
    """``syncfs`` of the filesystem ``fd`` is open on, run in the background after every
    ``SYNCFS_EVERY`` bytes :meth:`wrote` was told of, one at a time (``fd`` None: nothing)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.bytes = 0
        self.pool: ThreadPoolExecutor | None = None
        self.running: Future | None = None

    def wrote(self, n: int) -> None:
        if self.fd is None:
            return
        with self.lock:
            self.bytes += n
            if self.bytes < local_store.SYNCFS_EVERY or (self.running is not None and not self.running.done()):
                return
            if self.running is not None:
                self.running.result()  # ended: a write-back error it was told of fails the checkout now
            self.bytes = 0
            if self.pool is None:
                self.pool = ThreadPoolExecutor(1, thread_name_prefix="concord-syncfs")
            self.running = self.pool.submit(local_store.syncfs, self.fd)

    def wait(self) -> None:
        """Raise the error of the last one, if it had one (its predecessors' were raised as they ended)."""
        with self.lock:
            running = self.running
        if running is not None:
            running.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def materialise(
    store: Store,
    manifest: Manifest,
    layout: Layout,
    *,
    sources: list[str],
    cache: Store | None = None,
    fsync: bool = True,
    rehash: bool = False,
    progress: Progress | None = None,
    damaged: list[str] | None = None,
    manifest_json: bytes | None = None,
) -> _Tally:
    """Write ``manifest`` into ``<versions>/<root>/``, whole and verified (see the module's doc).
    ``sources`` are the roots of versions on this node to copy from, most preferred first. With
    ``rehash``, bytes copied from files unchanged since they were verified are hashed again too.
    ``damaged``: ``<root>/`` is kept already and these of its files are damaged; the others are
    hard-linked into the new copy, which then takes the kept one's place. ``manifest_json``: the
    bytes ``manifest`` was read (and checked) from, kept beside the version as they are instead of
    being encoded again."""
    root = manifest.root
    part_dir = layout.partial_dir(root)
    kept_dir = layout.version_dir(root) if damaged is not None else None
    resuming = os.path.isdir(part_dir)
    # files of a partial version unchanged since they were verified are kept as they are;
    # everything else in it is hashed
    intact = _verified_files(layout, root, part_dir) if resuming and not rehash else set()
    os.makedirs(part_dir, exist_ok=True)
    tally = _Tally()
    prog = ensure(progress)
    # one queue of chunks across every file: each file is closed (and flushed) after its last
    # chunk, so a few files are open at once however many the version holds
    dst = OpenFiles(os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), fsync=fsync, mode=0o644)
    src = OpenFiles(os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    # new files of one chunk are opened, written and closed at once by the thread that places it
    # (no bookkeeping); with ``fsync`` they are flushed together by one ``syncfs`` of the version's
    # filesystem before the rename, through a descriptor opened before any of them is written, so
    # that a failed write-back of any is reported there (no ``syncfs``: each is flushed as it closes)
    single: dict[str, str] = {}  # such a file's path -> its manifest path
    fs_fd = os.open(part_dir, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)) if fsync and local_store._SYNCFS is not None else None
    flush_each = fsync and fs_fd is None
    # while they are written, a syncfs starts in the background after every SYNCFS_EVERY bytes of
    # them (one at a time), so the disk writes them back meanwhile and the last one has little left
    early = _EarlySync(fs_fd)
    # each one's size, times and inode, taken from its descriptor after its last write (the note
    # of verified files is made of these, with no lookup of each file again)
    stats: dict[str, list[int]] = {}
    try:
        # a resumed partial version may hold links: each path is then resolved before it is trusted
        paths = target_paths((f.path for f in manifest.files), part_dir, resolve=resuming)
        # every place each chunk goes: a chunk named twice is fetched or copied once
        places: dict[str, list[tuple[str, int, int]]] = {}
        folders: set[str] = set()
        for f, path in zip(manifest.files, paths):
            folder = os.path.dirname(path)
            if folder not in folders:
                os.makedirs(folder, exist_ok=True)
                folders.add(folder)
            if kept_dir is not None and f.path not in damaged:
                _link_or_copy(os.path.join(kept_dir, *f.path.split("/")), path)
                tally.add("reused", f.size)
                continue
            only = None if resuming else f.only_chunk()
            if only is not None:  # a new file of one chunk (most small files)
                cid, offset, length = only
                single[path] = f.path
                places.setdefault(cid, []).append((path, offset, length))
                continue
            if resuming or f.size == 0:  # a new file of bytes is made by its first chunk, on a worker
                if f.path not in intact:
                    _own_file(path)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    if os.fstat(fd).st_size != f.size:
                        os.ftruncate(fd, f.size)
                finally:
                    os.close(fd)
            whole = f.path in intact
            if not resuming and f.size and sum(p.n_chunks for p in f.parts) == 1:
                single[path] = f.path
            pieces = 0
            for p in f.parts:
                for cid, offset, length in p.chunk_spans(manifest.chunk_size):
                    if whole:
                        tally.add("reused", length)
                        continue
                    places.setdefault(cid, []).append((path, offset, length))
                    pieces += 1
            if pieces and path not in single:
                dst.expect(path, pieces)
        local = _local_sources(layout, sources, rehash)
        in_cache = cache.has_chunks([c for c in places if c not in local]) if cache is not None else set()
        prog.start(manifest.total_bytes, "checkout")
        prog.advance(tally.reused)  # files kept whole or hard-linked

        def read(path: str, offset: int, length: int) -> bytes:
            return dst.read(path, length, offset)

        @contextmanager
        def target(path: str) -> Iterator[int]:
            """The fd of ``path`` to write: a new file of one chunk is opened here and closed after."""
            if path not in single:
                with dst.use(path) as fd:
                    yield fd
                return
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                yield fd
                written(fd, single[path])
            finally:
                os.close(fd)

        def written(fd: int, rel: str) -> None:
            """After the last write of a new file of one chunk (manifest path ``rel``): flushed when
            no syncfs will, its key noted, its bytes counted towards the next early syncfs."""
            if flush_each:
                os.fsync(fd)
            st = os.fstat(fd)
            stats[rel] = _stat_key(st)  # one key per file: no lock needed
            early.wrote(st.st_size)

        def write(path: str, data: bytes, offset: int) -> None:
            rel = single.get(path)
            if rel is None:
                dst.write(path, data, offset)
                return
            # a new file of one chunk (most small files): what target() does, without a context
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                pwrite_all(fd, data, offset)
                written(fd, rel)
            finally:
                os.close(fd)

        def place_all(cids: list[str]) -> None:
            counts = _Tally()  # this run's, added to the whole once (one lock round-trip a run)
            for cid in cids:
                place(cid, counts)
                for t in places[cid]:
                    if t[0] not in single:
                        dst.done(t[0])  # a file is closed after its last chunk
            with tally.lock:
                tally.fetched += counts.fetched
                tally.reused += counts.reused
                tally.cached += counts.cached
            prog.advance(sum(t[2] for cid in cids for t in places[cid]))

        def place(cid: str, counts: _Tally) -> None:
            todo = places[cid]
            if resuming:  # what a killed run already wrote is kept when it hashes right
                left = [t for t in todo if chunk_id(read(*t)) != cid]
                counts.reused += sum(t[2] for t in todo) - sum(t[2] for t in left)
                todo = left
            if not todo:
                return
            data = None
            path, offset, length = todo[0]
            if cid in local:
                spath, soff, verified = local[cid]
                try:
                    if verified:  # unchanged since it was verified: copied in the kernel, not read
                        for t in todo:
                            with src.use(spath) as sfd, target(t[0]) as dfd:
                                _copy(sfd, soff, dfd, t[1], t[2])
                            counts.reused += t[2]
                        return
                    with src.use(spath) as sfd, target(path) as dfd:
                        _copy(sfd, soff, dfd, offset, length)
                        data = os.pread(dfd, length, offset)
                    if chunk_id(data) == cid:
                        counts.reused += length
                    else:
                        data = None  # the old version's copy is damaged: fetch a good one
                except OSError as exc:
                    if exc.errno in DISK_FULL:
                        raise
                    data = None
            if data is None:
                # a chunk stored as a delta is decoded against this node's own bytes of its base
                # where a version here holds them (checked: the store's base if they are not right)
                own = functools.partial(_own_bytes, src, local, length)
                if cid in in_cache:
                    data = cache.read_chunk(cid, verify=True, own_base=own)  # transient: written at once
                    counts.cached += length
                else:
                    data = store.read_chunk(cid, verify=True, own_base=own)
                    counts.fetched += length
                    if cache is not None:
                        cache.put_chunk(cid, data, verify=False)
                if len(data) != length:
                    raise IntegrityError(f"chunk {cid} in {store.uri}", f"{length} bytes", f"{len(data)} bytes")
                write(path, data, offset)
            for path2, offset2, length2 in todo[1:]:
                write(path2, data, offset2)
                counts.reused += length2

        # one thread per core for a local store, as restore: more only contend for the interpreter
        workers = store.parallelism
        # runs of chunks, one task each (a small file's chunk costs the queue little), a few per thread at least
        per = max(1, min(RUN_CHUNKS, len(places) // (4 * workers)))
        ids = list(places)
        with ThreadPoolExecutor(workers, thread_name_prefix="concord-checkout") as pool:
            # one lane of chunks per thread (in file order), their runs taken in turn: the threads
            # create files in different folders (see restore)
            lanes = round_robin(_slices(ids, lo, hi, per) for lo, hi in spans(len(ids), workers))
            for _ in bounded_map(pool, place_all, lanes, WINDOW):
                pass
        dst.close()  # with fsync, each file is flushed as it is closed
        if fs_fd is not None:
            early.wait()  # a write-back error the one in the background was told of is raised here
            local_store.syncfs(fs_fd)  # and every new file of one chunk, with the folders, all at once
        atomic_write(layout.manifest_path(root), manifest.to_json() if manifest_json is None else manifest_json, fsync=fsync)
        if kept_dir is None:
            _record_files(layout, root, part_dir, manifest, fsync, stats)
            os.rename(part_dir, layout.version_dir(root))
        else:  # the repaired copy and the damaged kept one change places at once
            if fsync:
                fsync_dir(part_dir)
            swap_dirs(part_dir, kept_dir)
            remove_tree(part_dir)
            # recorded after the old links are gone (removing a link changes a file's change time)
            _record_files(layout, root, kept_dir, manifest, fsync)
        if fsync:
            fsync_dir(layout.folder)  # the rename itself survives a power cut before the flip
    except OSError as exc:
        if exc.errno in DISK_FULL:
            dst.abandon()
            shutil.rmtree(part_dir, ignore_errors=True)
            raise CheckoutDiskFullError(layout.link, manifest.total_bytes, os.strerror(exc.errno)) from exc
        if isinstance(exc, ConcordError):
            raise
        raise LocalFileError(exc.filename if isinstance(exc.filename, str) else part_dir, exc.strerror or str(exc)) from exc
    finally:
        dst.abandon()  # closed above unless something failed
        src.abandon()
        early.close()  # done with the descriptor before it closes
        if fs_fd is not None:
            os.close(fs_fd)
        prog.close()
    return tally


def _own_bytes(src: OpenFiles, local: dict[str, tuple[str, int, bool]], length: int, cid: str) -> memoryview | None:
    """This node's bytes of chunk ``cid`` (``length`` bytes) where a version here holds it
    (``local``, as :func:`_local_sources` finds it), read into this thread's buffer (transient,
    see :mod:`concord.stores.scratch`) through ``src`` (a bounded number of files open); None where
    no version holds it or its file cannot be read that far. Not checked here: they are the base
    of a delta, whose decoded bytes are (:meth:`~concord.stores.base.Store.read_chunk`)."""
    found = local.get(cid)
    if found is None:
        return None
    path, offset, _ = found
    buf = scratch.buffer("checkout.own-base", length)
    try:
        with src.use(path) as fd:
            got = os.preadv(fd, [buf], offset)
    except OSError:
        return None  # the store's base then
    return buf if got == length else None


def _slices(items: list, lo: int, hi: int, n: int) -> Iterator[list]:
    """``items[lo:hi]`` in lists of ``n`` (the last may be shorter)."""
    for i in range(lo, hi, n):
        yield items[i : min(i + n, hi)]


def _local_errors(fn):
    """``fn`` with an OS error of this machine (the link's folder not writable, the open-file
    limit...) said as :class:`LocalFileError` naming the path, never as the store's problem."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            if isinstance(exc, ConcordError):
                raise
            dest = kwargs["dest"] if "dest" in kwargs else args[2]
            where = exc.filename if isinstance(exc.filename, str) else os.path.abspath(os.fspath(dest))
            raise LocalFileError(where, exc.strerror or str(exc)) from exc

    return wrapper


@_local_errors
def checkout(
    store: Store,
    manifest: Manifest,
    dest: str | os.PathLike,
    *,
    cache: Store | None = None,
    keep: int | None = None,
    health: HealthCheck | None = None,
    trust: TrustPolicy | None = None,
    wait: float = DEFAULT_WAIT,
    fsync: bool = True,
    rehash: bool = False,
    progress: Progress | None = None,
    manifest_json: bytes | None = None,
) -> CheckoutResult:
    """Make ``dest`` (a symlink) name ``manifest``'s snapshot, written whole and verified beside it.

    With a ``trust`` policy, a root no trusted key signed is refused
    (:class:`~concord.errors.UntrustedRootError`) before any byte is written. The same root as the current one does nothing (but ``keep`` still prunes). With
    ``health``, the gate runs after the flip; when it fails the link flips back and
    :class:`HealthCheckFailedError` is raised. ``keep`` prunes to that many versions after a
    healthy flip (never the current one or the one before). ``manifest_json``: the bytes
    ``manifest`` was read from (checked against its root), kept beside the version as they are."""
    t0 = time.perf_counter()
    layout = Layout.of(dest)
    root = manifest.root
    layout.current()  # a real folder at dest is refused before anything is made beside it
    if trust is not None:
        from concord.trust import check_root

        check_root(store, root, trust)
    os.makedirs(os.path.dirname(layout.link), exist_ok=True)
    with layout.locked(wait):
        current = layout.current()
        pending = layout.pending_gate(current)  # the version the link names never passed its gate
        if pending is not None:
            end_leftover_gate(pending)
        # where a failing gate flips back to: never to a version whose own gate never passed
        fallback = pending["previous"] if pending is not None else current
        if fallback is not None and not os.path.isdir(layout.version_dir(fallback)):
            fallback = layout.previous(current)
        tally = _Tally()
        if current == root and os.path.isdir(layout.version_dir(root)):
            if pending is None:
                pruned = tuple(prune(layout, keep)) if keep else ()
                return CheckoutResult(
                    root, layout.link, manifest.total_bytes, 0, 0, 0, layout.previous(current),
                    round(time.perf_counter() - t0, 6), False, manifest.n_files, pruned,
                )
            if health is None:
                _flip_back(layout, fallback)
                raise HealthCheckFailedError(
                    layout.link, str(pending.get("check") or "the health gate"),
                    f"it never passed: the checkout that flipped to {root[:12]} was interrupted during it, "
                    "and this run names no gate to run again", fallback,
                )
            tally.add("reused", manifest.total_bytes)
        else:
            if os.path.isdir(layout.version_dir(root)):
                # a version kept from before: re-checked in place (read, never written); a damaged
                # one is repaired in a copy built beside it
                damaged = _damaged_files(layout, manifest, rehash)
                if not damaged:
                    try:  # what was hashed need not be again (only a note: a full disk skips it)
                        _record_files(layout, root, layout.version_dir(root), manifest, fsync)
                    except OSError as exc:
                        if exc.errno not in DISK_FULL:
                            raise
                    tally.add("reused", manifest.total_bytes)
            else:
                damaged = None
            if damaged is None or damaged:
                order = ([current] if current else []) + [r for r in reversed(layout.versions()) if r != current]
                tally = materialise(
                    store, manifest, layout, sources=order, cache=cache, fsync=fsync, rehash=rehash,
                    progress=progress, damaged=damaged, manifest_json=manifest_json,
                )
            if health is not None:
                layout.mark_gate(root, fallback, health.describe())
            layout.flip(root)
            layout.record(root, "checkout")
            if health is None:
                layout.clear_gate()  # a gate pending for the version flipped away from is moot
        if health is not None:
            problem = health.run(
                layout.link, root, started=lambda pgid: layout.mark_gate(root, fallback, health.describe(), pgid)
            )
            if problem is not None:
                _flip_back(layout, fallback)
                raise HealthCheckFailedError(layout.link, health.describe(), problem, fallback)
            layout.clear_gate()
        pruned = tuple(prune(layout, keep, spare=None)) if keep else ()
    return CheckoutResult(
        root, layout.link, manifest.total_bytes, tally.fetched, tally.reused, tally.cached,
        fallback if current == root else current, round(time.perf_counter() - t0, 6), True, manifest.n_files, pruned,
    )


def _flip_back(layout: Layout, to: str | None) -> None:
    """After a gate that failed (or never passed): the link names ``to`` again (None: removed)."""
    layout.flip(to)
    layout.record(to, "health-rollback")
    layout.clear_gate()
