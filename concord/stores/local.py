"""A store in a local (or network-mounted) folder.

Every write goes to a unique temporary name in the destination folder and is renamed into place
with ``os.replace``, so a reader (or a process killed mid-write) never leaves a half-written
object under a real name.

Durable before visible: the chunks, manifests and documents a store writes are flushed to disk,
with the folders they are named in, before a ref moves (:meth:`Store.flush`, which
:meth:`~concord.stores.base.Store.cas_ref` calls), as restic flushes every object it writes. The
flushes are batched so the write path stays fast. An object of at least ``SYNCFS_BELOW`` bytes
(a chunk of a large file) has its ``fsync`` started on a small thread pool as soon as it is
renamed into place, overlapping the writes still to come, and each of its folders is flushed
once, at the end. Smaller objects (the chunks of a folder of many small files) are flushed all
at once, at the end, by one ``syncfs`` of each filesystem they were written to, which writes
their bytes and names, and their folders', in one journal commit instead of one per file; on a
system without ``syncfs`` they are flushed as the large ones are. The ref itself is written flushed,
and its folder after it. Ref updates take an ``flock`` only for the read-compare-write of the
compare-and-swap (and the compare-and-delete of a ref); correctness of everything else comes from
atomic renames and content addressing.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from concord.errors import NotRegularFileError, StoreAccessError, StoreNotFoundError
from concord.files import TMP_PREFIX, atomic_write, fsync_path, pwrite_all, temp_path
from concord.stores import scratch
from concord.stores.base import Store, chunk_key

#: the folders a store has once anything was written to it
STORE_FOLDERS = ("chunks", "manifests", "refs")
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def file_kind(mode: int) -> str:
    """What a ``stat`` mode says a path is, in words (for errors)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a fifo"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a file"


def read_regular_file(path: str, *, store: str, key: str, slot: str | None = None) -> bytes | memoryview | None:
    """The bytes of the regular file at ``path`` (a symbolic link is followed to its target), or
    None if nothing is there. Never blocks and never opens anything else: a FIFO, device, socket or
    folder (or a link to one) raises :class:`~concord.errors.NotRegularFileError` naming ``key``
    and ``store``. The path is looked at before it is opened (so a device is never opened), then
    opened with ``O_NONBLOCK`` and checked again on the open descriptor (so a swap in between is
    caught too). With ``slot``, the bytes are read into this thread's buffer of that name and a
    transient view of them is returned (see :mod:`concord.stores.scratch`)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError(store, key, "a symbolic link that loops") from None
        raise StoreAccessError(store, f"cannot read {key} ({exc.strerror})") from exc
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(store, key, file_kind(st.st_mode))
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None  # removed since we looked
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):
            raise NotRegularFileError(store, key, "replaced by something that is not a file while it was read") from None
        raise StoreAccessError(store, f"cannot read {key} ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(store, key, file_kind(st.st_mode))
        if slot is not None:
            return _read_into(fd, scratch.buffer(slot, st.st_size))
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    except NotRegularFileError:
        raise
    except OSError as exc:
        raise StoreAccessError(store, f"cannot read {key} ({exc.strerror})") from exc
    finally:
        os.close(fd)


def _read_into(fd: int, buf: memoryview) -> memoryview:
    """Fill ``buf`` from ``fd``'s start; the part filled if the file ends sooner."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], got)
        if not n:
            break
        got += n
    return buf[:got]


def _write_new(dst: str, data) -> None:
    """Write ``data`` into the new file ``dst``."""
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        pwrite_all(out, data, 0)
    finally:
        os.close(out)


def _copy_range(src_fd: int, offset: int, length: int, dst: str) -> None:
    """Copy ``length`` bytes of ``src_fd`` at ``offset`` into the new file ``dst`` in the kernel."""
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        done = 0
        while done < length:
            n = os.copy_file_range(src_fd, out, length - done, offset + done)
            if n <= 0:
                raise OSError(errno.EIO, "copy_file_range copied nothing")
            done += n
    finally:
        os.close(out)


def _object_place(key: str) -> bool:
    """Whether only an object (never a folder) belongs at ``key``: a ref (``refs/NS/NAME``), a
    chunk (``chunks/XX/ID``) or any ``.json`` document."""
    parts = key.split("/")
    return key.endswith(".json") or (parts[0] in ("refs", "chunks") and len(parts) == 3)


#: threads flushing files, shared by every folder store of the process (a sync to a hundred
#: folders flushes on these few, not on a pool per folder)
FSYNC_WORKERS = 8
#: objects smaller than this are flushed together by one ``syncfs`` of their filesystem when the
#: store flushes, instead of by an ``fsync`` each as they land (thousands of small files: one
#: journal commit, and no hand-off to the flushing pool per file)
SYNCFS_BELOW = 1024 * 1024
#: while small objects keep coming, a ``syncfs`` starts in the background after every this many
#: of their bytes, so that the disk writes them back while the rest are written
SYNCFS_EVERY = 128 * 1024 * 1024
#: a chunk of at least this many bytes is copied from the checkpoint file in the kernel
#: (``copy_file_range``); a smaller one is written from the bytes just hashed
KERNEL_COPY = 1024 * 1024


def _load_syncfs():
    """``syncfs(2)`` of this system's C library, or None (not Linux: every file gets its ``fsync``)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


_SYNCFS = _load_syncfs()


def syncfs(fd: int) -> None:
    """Flush the whole filesystem ``fd`` is open on (every file's bytes and names, and the
    folders'), raising ``OSError`` if a write-back on it failed since ``fd`` was opened."""
    if _SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
_FSYNC_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (the process it belongs to, the pool)
_FSYNC_LOCK = threading.Lock()


def _fsync_pool() -> ThreadPoolExecutor:
    """The process's flushing pool (a forked child makes its own: its parent's threads are not in it)."""
    global _FSYNC_POOL
    with _FSYNC_LOCK:
        if _FSYNC_POOL is None or _FSYNC_POOL[0] != os.getpid():
            _FSYNC_POOL = (os.getpid(), ThreadPoolExecutor(FSYNC_WORKERS, thread_name_prefix="concord-fsync"))
        return _FSYNC_POOL[1]


class _Flushes:
    """Files written but not yet flushed, and the folders they were named in.

    A large file's ``fsync`` runs on the process's flushing pool from the moment it is added;
    :meth:`wait` lets them finish, then flushes each of their folders once (a chunk's
    ``chunks/XX``, ``chunks``, the store's root...). A small file (under ``SYNCFS_BELOW``) is only
    noted, with the filesystem of each of its folders: :meth:`wait` runs one ``syncfs`` on each,
    through a descriptor opened when the first small file there was added, so that a write-back
    error on it since (or one no flush reported yet) is reported there. While they keep coming,
    one such ``syncfs`` at a time also runs in the background after every ``SYNCFS_EVERY`` bytes
    of them (its error too is raised by :meth:`wait`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: list[Future] = []
        self._folders: set[str] = set()
        self._dev: dict[str, int] = {}  # folder -> its filesystem (st_dev), as first seen
        self._fs: dict[int, int] = {}  # filesystem -> a descriptor on it, while small files there wait
        self._covered: set[str] = set()  # folders whose filesystems, and their parents', are in _fs
        self._small = 0  # bytes of small files added since the last syncfs began
        self._early: Future | None = None  # the syncfs running in the background, if any

    def add(self, path: str, folders: tuple[str, ...], size: int | None = None) -> None:
        """``path`` (of ``size`` bytes) was named in ``folders``, its own first."""
        if size is not None and size < SYNCFS_BELOW and _SYNCFS is not None:
            with self._lock:
                if folders[0] not in self._covered and not self._watch(folders):
                    self._files.append(_fsync_pool().submit(fsync_path, path))
                    self._folders.update(folders)
                    return
                self._small += size
                if self._small >= SYNCFS_EVERY and (self._early is None or self._early.done()):
                    self._small = 0
                    self._early = _fsync_pool().submit(_syncfs_all, list(self._fs.values()), self._early)
            return
        with self._lock:
            self._files.append(_fsync_pool().submit(fsync_path, path))
            self._folders.update(folders)

    def _watch(self, folders: tuple[str, ...]) -> bool:
        """Note the filesystems of ``folders`` (under the lock), with a descriptor open on each;
        False if one cannot be opened (its files are then flushed one by one)."""
        for folder in folders:
            dev = self._dev.get(folder)
            if dev is not None and dev in self._fs:
                continue
            try:
                fd = os.open(folder, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return False
            dev = self._dev[folder] = os.fstat(fd).st_dev
            if dev in self._fs:
                os.close(fd)
            else:
                self._fs[dev] = fd
        self._covered.add(folders[0])
        return True

    def _take(self) -> tuple[list[Future], set[str], dict[int, int], Future | None]:
        """What waits to be flushed, the next round starting empty (under the lock)."""
        with self._lock:
            out = self._files, self._folders, self._fs, self._early
            self._files, self._folders, self._fs, self._early = [], set(), {}, None
            self._covered, self._small = set(), 0
        return out

    def wait(self) -> None:
        files, folders, filesystems, early = self._take()
        try:
            if early is not None:
                early.result()  # a failed write-back it was told of is this flush's error
            for f in files:
                f.result()  # an error of any file's flush is raised here, before the ref moves
            _syncfs_all(list(filesystems.values()))
        finally:
            if early is not None:
                early.exception()  # done with the descriptors before they close
            for fd in filesystems.values():
                os.close(fd)
        if folders:
            pool = _fsync_pool()
            for f in [pool.submit(fsync_path, d) for d in folders]:
                f.result()

    def close(self) -> None:
        """Let what was added finish (the pool is shared: it stays); what waits for a ``syncfs``
        is left unflushed, as an unflushed write is."""
        files, _, filesystems, early = self._take()
        for f in [*files, *([early] if early is not None else [])]:
            f.exception()  # waited for
        for fd in filesystems.values():
            os.close(fd)


def _syncfs_all(fds: list[int], before: Future | None = None) -> None:
    """:func:`syncfs` on each of ``fds``, after ``before`` (an earlier one, whose error is raised first)."""
    if before is not None:
        before.result()
    for fd in fds:
        syncfs(fd)


#: questions about one chunk folder answered with a ``stat`` each before an operation's
#: inventory lists that folder instead (a few chunks into a large store: a ``stat`` each; the
#: tens of chunks a folder gets from a snapshot of thousands of files: one listing)
LIST_AFTER = 8


class _Inventory:
    """Which chunks a folder store holds, as one operation (under its garbage-collection lease)
    learns it: each chunk folder (``chunks/XX``) listed once, after :data:`LIST_AFTER` questions
    about it, instead of a ``stat`` per chunk; a chunk written or found present meanwhile is
    added, one deleted is removed. A listing can miss a chunk another writer adds meanwhile: it
    is then written again and its rename finds it there; no collection deletes a listed chunk
    while the lease holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, set[str]] = {}  # chunk folder -> names of the files in it
        self._asked: dict[str, int] = {}

    def holds(self, path: str) -> bool | None:
        """Whether the chunk file ``path`` is there, if this inventory knows; None: ask the file."""
        folder, name = os.path.split(path)
        with self._lock:
            names = self._held.get(folder)
            if names is not None:
                return name in names
            asked = self._asked[folder] = self._asked.get(folder, 0) + 1
        if asked < LIST_AFTER:
            return None
        try:
            with os.scandir(folder) as entries:
                found = {e.name for e in entries if not e.name.startswith(".") and e.is_file()}
        except (FileNotFoundError, NotADirectoryError):
            found = set()
        with self._lock:
            names = self._held.setdefault(folder, found)
            return name in names

    def add(self, path: str) -> None:
        folder, name = os.path.split(path)
        with self._lock:
            names = self._held.get(folder)
            if names is not None:
                names.add(name)

    def discard(self, path: str) -> None:
        folder, name = os.path.split(path)
        with self._lock:
            names = self._held.get(folder)
            if names is not None:
                names.discard(name)


class LocalDirStore(Store):
    #: local hashing and copying are CPU-bound: one thread per core
    parallelism = max(2, os.cpu_count() or 2)
    _copy_file_range = hasattr(os, "copy_file_range")

    def __init__(
        self, path: str | os.PathLike, *, create: bool = True, fsync: bool = False, must_exist: bool = False
    ) -> None:
        self.root = os.path.abspath(os.fspath(path))
        self.uri = self.root
        self.fsync = fsync
        self._flushes = _Flushes()
        self._made: set[str] = set()  # chunk folders known to exist
        self._chains: dict[str, tuple[str, ...]] = {}  # a folder -> it and its parents up to the root
        if must_exist:  # a command that only reads: a mistyped path is said, never created
            if not os.path.isdir(self.root):
                what = "nothing is there" if not os.path.lexists(self.root) else "the path is not a folder"
                raise StoreNotFoundError(self.root, what)
            if not any(os.path.isdir(os.path.join(self.root, d)) for d in STORE_FOLDERS) and not os.path.isfile(
                os.path.join(self.root, "config")
            ):
                raise StoreNotFoundError(self.root)
            create = False
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StoreAccessError(self.root, "the path exists and is not a folder")
        if create:
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as exc:
                raise StoreAccessError(self.root, f"cannot create the store folder ({exc.strerror})") from exc

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_flushes", None)  # what is pending is this process's to flush
        state.pop("_made", None)
        state.pop("_chains", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._flushes = _Flushes()
        self._made, self._chains = set(), {}

    def _new_inventory(self) -> _Inventory:
        """What one operation learns of the chunks here: one listing of each chunk folder asked
        about often, instead of a ``stat`` each (:class:`_Inventory`)."""
        return _Inventory()

    def _chunk_there(self, path: str) -> bool:
        """Whether the chunk file ``path`` is there: from the operation's inventory, else its ``stat``."""
        inventory = self._inventory
        known = inventory.holds(path) if inventory is not None else None
        return os.path.exists(path) if known is None else known

    def _written(self, key: str, path: str, size: int | None = None) -> None:
        """``path`` (object ``key``, of ``size`` bytes) was renamed into place unflushed: flush
        it, and the folders from its own up to the store's root, before the next ref moves."""
        folder = os.path.dirname(path)
        chain = self._chains.get(folder)
        if chain is None:
            parts = key.split("/")[:-1]
            chain = self._chains[folder] = tuple(os.path.join(self.root, *parts[:i]) for i in range(len(parts), -1, -1))
        self._flushes.add(path, chain, size)

    def flush(self) -> None:
        """Wait until every object written so far is on disk, with the folders it is named in."""
        try:
            self._flushes.wait()
        except OSError as exc:
            raise StoreAccessError(self.uri, f"cannot flush what was written to disk ({exc.strerror})") from exc

    def close(self) -> None:
        self._flushes.close()
        super().close()

    def _put_object(self, key: str, data: bytes | memoryview, *, overwrite: bool) -> bool:
        path = self._path(key)
        chunk = key.startswith("chunks/")
        if not overwrite and (self._chunk_there(path) if chunk else os.path.exists(path)):
            return False
        folder = os.path.dirname(path)
        try:
            try:  # a folder this store made is not made again (a mkdir and two stats an object)
                written = atomic_write(path, data, fsync=self.fsync, exclusive=not overwrite, make_folder=folder not in self._made)
            except FileNotFoundError:
                if folder not in self._made:
                    raise
                self._made.discard(folder)  # removed since: made again
                written = atomic_write(path, data, fsync=self.fsync, exclusive=not overwrite)
            self._made.add(folder)
        except OSError as exc:
            raise StoreAccessError(self.uri, f"cannot write {key} ({exc.strerror})") from exc
        if written and not self.fsync:
            self._written(key, path, len(data))
        if chunk and self._inventory is not None:
            self._inventory.add(path)  # written now, or another writer's copy was there
        return written

    def put_chunk_from_file(
        self, cid: str, fd: int, offset: int, length: int, data: memoryview, *, dtype: str | None = None, base: str | None = None
    ) -> int | None:
        if self.encoding().framed:  # the bytes are encoded first: no kernel copy
            return self.put_chunk_sized(cid, data, verify=False, dtype=dtype, base=base)
        key = chunk_key(cid)
        folder = os.path.join(self.root, "chunks", cid[:2])
        path = os.path.join(folder, cid)
        if self._chunk_there(path):
            return None
        kernel = self._copy_file_range and length >= KERNEL_COPY
        # the one write that is not atomic_write's: a large chunk is copied by the kernel, a small
        # one written from the bytes just hashed (one copy either way)
        tmp: str | None = None
        try:
            tmp = self._temp_in(folder)
            if kernel:
                _copy_range(fd, offset, length, tmp)
            else:
                _write_new(tmp, data)
            if self.fsync:
                fsync_path(tmp)
            os.replace(tmp, path)
            tmp = None
            if self._inventory is not None:
                self._inventory.add(path)
            if self.fsync:
                fsync_path(folder)
            else:
                self._written(key, path, length)
        except OSError as exc:
            if kernel and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                type(self)._copy_file_range = False  # this kernel or filesystem pair can't: write instead
                return self.put_chunk_sized(cid, data, verify=False)
            if isinstance(exc, FileNotFoundError) and folder in self._made:  # its folder was removed since
                self._made.discard(folder)
                return self.put_chunk_from_file(cid, fd, offset, length, data, dtype=dtype)
            raise StoreAccessError(self.uri, f"cannot write chunk {cid} ({exc.strerror})") from exc
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        return length

    def _temp_in(self, folder: str) -> str:
        """A temporary name in the chunk folder ``folder``, made the first time this store writes there."""
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        return temp_path(folder)

    def _get_object(self, key: str) -> bytes | None:
        return read_regular_file(self._path(key), store=self.uri, key=key)

    def _read_object_transient(self, key: str) -> memoryview | None:
        return read_regular_file(self._path(key), store=self.uri, key=key, slot="object")

    def _read_head(self, key: str, n: int) -> bytes | None:
        """The first ``n`` bytes of a regular file, looked at before it is opened and checked
        again on the open descriptor, as :func:`read_regular_file` does."""
        path = self._path(key)
        try:
            if not stat.S_ISREG(mode := os.stat(path).st_mode):
                raise NotRegularFileError(self.uri, key, file_kind(mode))
            fd = os.open(path, _OPEN_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except NotRegularFileError:
            raise
        except OSError as exc:
            raise StoreAccessError(self.uri, f"cannot read {key} ({exc.strerror})") from exc
        try:
            if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
                raise NotRegularFileError(self.uri, key, file_kind(mode))
            return os.pread(fd, n, 0)
        except OSError as exc:
            if isinstance(exc, NotRegularFileError):
                raise
            raise StoreAccessError(self.uri, f"cannot read {key} ({exc.strerror})") from exc
        finally:
            os.close(fd)

    def _exists_many(self, keys: list[str]) -> list[bool]:
        inventory = self._inventory
        out = []
        for k in keys:
            path = self._path(k)
            known = inventory.holds(path) if inventory is not None and k.startswith("chunks/") else None
            out.append(os.path.isfile(path) if known is None else known)
        return out

    def _delete_object(self, key: str) -> None:
        path = self._path(key)
        if self._inventory is not None:
            self._inventory.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _list_keys(self, prefix: str) -> Iterator[str]:
        """Every name under ``prefix`` where an object is: regular files, and also whatever else
        sits where only an object can be (a FIFO, a folder named like a document or in a ref's
        place, a link to one), so that reading it says what it is instead of it silently missing."""
        base = self._path(prefix.rstrip("/"))
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            keep = []
            for d in dirnames:
                if d.startswith("."):
                    continue
                if _object_place(f"{rel}/{d}"):
                    yield f"{rel}/{d}"  # a folder (or a link to one) where an object belongs
                else:
                    keep.append(d)
            dirnames[:] = keep
            for fn in filenames:
                if not fn.startswith("."):
                    yield f"{rel}/{fn}"

    def _list_stats(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        yield from self._scan(prefix.strip("/"))

    def _scan(self, folder_key: str) -> Iterator[tuple[str, int, float]]:
        """Walk ``folder_key`` with ``os.scandir`` (one ``stat`` per file, none per folder),
        skipping dot-names (temporary files, locks) as :meth:`_list_keys` does."""
        try:
            entries = os.scandir(self._path(folder_key) if folder_key else self.root)
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                key = f"{folder_key}/{entry.name}" if folder_key else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        yield from self._scan(key)
                        continue
                    if not entry.is_file():
                        continue  # a link to a folder, a socket...: not an object
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # removed while we looked: it is not there any more
                yield key, st.st_size, st.st_mtime

    def iter_leftovers(self) -> Iterator[tuple[str, int, float]]:
        """The temporary files (``.tmp-*``) of writes a killed process never finished."""
        for folder, _, names in os.walk(self.root):
            for name in names:
                if name.startswith(TMP_PREFIX):
                    path = os.path.join(folder, name)
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:
                        continue  # the write finished (or gave up) while we looked
                    yield os.path.relpath(path, self.root).replace(os.sep, "/"), st.st_size, st.st_mtime

    def delete_leftover(self, key: str) -> None:
        if not key.rsplit("/", 1)[-1].startswith(TMP_PREFIX) or ".." in key.split("/"):
            raise ValueError(f"{key!r} is not a leftover temporary file of {self.uri}")
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def _read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
        data = self._get_object(key)
        if data is None:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    @contextmanager
    def _locked(self, key: str):
        path = self._path(key)
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f".{name}.lock"), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _write_if(self, key: str, data: bytes, token: str | None) -> bool:
        with self._locked(key):
            _, now = self._read_with_token(key)
            if now != token:
                return False
            atomic_write(self._path(key), data, fsync=True)
            return True

    def _delete_if(self, key: str, token: str) -> bool:
        with self._locked(key):
            _, now = self._read_with_token(key)
            if now != token:
                return False
            try:
                os.unlink(self._path(key))
            except FileNotFoundError:
                return False
            return True
