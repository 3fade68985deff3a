"""Writing a file atomically: the one way Concord puts a file in place.

A reader never sees a half-written file under its real name, and a process killed mid-write leaves
at most a temporary file: the bytes go to a unique temporary name in the destination folder (a
``.tmp-`` name, which folder stores never read as an object and garbage collection removes), are
flushed (and fsynced unless told otherwise), then renamed into place with ``os.replace``; the
temporary file is removed in ``finally`` whatever happened.

Every small file is written through :func:`atomic_write`: store objects, refs and documents, the
checkpoint watcher's state, the record of ``concord_pipelines.deployments.serve``, an audit's PNGs. The one
specialised path is a folder store's chunk copied in the kernel (``copy_file_range`` from the
checkpoint file into a :func:`temp_path`, then ``os.replace``), which never holds the bytes.

Restore and checkout write their files of several chunks through :class:`OpenFiles`, which keeps
a bounded number of them open (each closed, and flushed if asked, after its last piece); a file of
one chunk is opened, written and closed at once by the thread that has its bytes. They feed one
queue of chunks across all files to their threads with :func:`bounded_map`, its runs taken in turn
(:func:`round_robin`) from one lane of files per thread (:func:`spans`).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import secrets
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

#: temporary files start with this (a folder store lists them as leftovers, never as objects)
TMP_PREFIX = ".tmp-"


class _TempNames:
    """Unique temporary names without a call to the system's random source each: a random token
    drawn once per process (again in a forked child), then a counter."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.token = secrets.token_hex(10)
        self.counter = itertools.count()

    def next(self) -> str:
        return f"{TMP_PREFIX}{self.token}{next(self.counter):x}"


_TEMP_NAMES = _TempNames()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TEMP_NAMES.reset)


def temp_path(folder: str | os.PathLike) -> str:
    """A unique temporary file name in ``folder`` (nothing is created): unique across processes
    (an 80-bit random token each) and within one (a counter)."""
    return os.path.join(os.fspath(folder), _TEMP_NAMES.next())


def _load_renameat2():
    """``renameat2(2)`` of this system's C library, or None (not Linux, or a C library without it)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _load_renameat2()
_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def rename_new(src: str, dst: str) -> bool | None:
    """Rename ``src`` to ``dst`` only if nothing is at ``dst``, decided atomically by the
    filesystem in one call (``renameat2`` with ``RENAME_NOREPLACE``): True if renamed, False if
    ``dst`` exists (``src`` is left), None where this system or filesystem cannot (the caller falls
    back to a hard link)."""
    if _RENAMEAT2 is None:
        return None
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return None  # a filesystem (or kernel) without it: the hard link serves
    raise OSError(err, os.strerror(err), src, None, dst)


def fsync_path(path: str | os.PathLike) -> None:
    """Flush the file or folder at ``path`` to disk (a folder: the names in it, as a rename left
    them). Something removed meanwhile has nothing left to flush."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (``os.pwrite`` may write less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {n} bytes at offset {offset}")
        view, offset = view[n:], offset + n


#: files an :class:`OpenFiles` keeps open at once at the most (fewer under a low ``ulimit -n``)
OPEN_FILES = 64


def open_files_limit(share: int = 4) -> int:
    """How many files one :class:`OpenFiles` may keep open: :data:`OPEN_FILES`, or a ``share``-th
    of the process's open-file limit (``ulimit -n``) when that is lower, so that a command's other
    files (store objects, sockets, the fsync pool's) always find room. At least 4."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return OPEN_FILES
    if soft == getattr(resource, "RLIM_INFINITY", -1) or soft <= 0:
        return OPEN_FILES
    return max(4, min(OPEN_FILES, soft // share))


class _Open:
    __slots__ = ("fd", "left", "users", "writing")

    def __init__(self) -> None:
        self.fd: int | None = None
        self.users = 0  # threads using the fd now: it is never closed under them
        self.left: int | None = None  # pieces still to come (None: not said, closed when evicted or at the end)
        self.writing = threading.Lock()


class OpenFiles:
    """Files that threads read or write parts of, each opened (with ``flags``, new files with
    ``mode``) when first used, with at most ``limit`` open at once whatever their number.

    A caller that knows how many pieces a file takes says so (:meth:`expect`) and reports each
    one done (:meth:`done`): the file is closed as soon as its last piece is, and with ``fsync``
    flushed first, so a restore of 100,000 files never holds more than a few of them. A file
    that needs a place while ``limit`` are open takes that of the one used least recently and not
    in use now (flushed first too, with ``fsync``); it is opened again if needed. Use a file's fd
    only inside :meth:`use`, which keeps it open meanwhile.

    :meth:`write` lets one thread at a time write into a file. A local filesystem (ext4, XFS) runs
    one buffered write into a file at a time anyway, and a thread that waits for it in the kernel
    spins on the CPU while the writer copies; waiting on a lock here sleeps instead, so the other
    threads' reading, decoding and hashing get the core. Writes to different files still run side
    by side."""

    def __init__(self, flags: int, *, limit: int | None = None, fsync: bool = False, mode: int = 0o666) -> None:
        self.flags = flags
        self.limit = limit or open_files_limit()
        self.fsync = fsync
        self.mode = mode
        self.peak = 0  # the most files open at once
        self._files: dict[str, _Open] = {}
        self._idle: dict[str, None] = {}  # open and unused, least recently used first
        self._open = 0
        self._lock = threading.Lock()

    @property
    def fds(self) -> dict[str, int]:
        """The files open now, with their fds."""
        with self._lock:
            return {p: e.fd for p, e in self._files.items() if e.fd is not None}

    def expect(self, path: str, pieces: int) -> None:
        """``path`` takes ``pieces`` more pieces: it is closed once :meth:`done` said so of each."""
        with self._lock:
            e = self._files.setdefault(path, _Open())
            e.left = (e.left or 0) + pieces

    def done(self, path: str) -> None:
        """One piece of ``path`` is written (or read): after the last, the file is closed."""
        close = None
        with self._lock:
            e = self._files.get(path)
            if e is None or e.left is None:
                return
            e.left -= 1
            if e.left <= 0 and e.users == 0:
                close = self._forget(path, e)
        self._close(close)

    @contextmanager
    def use(self, path: str) -> Iterator[int]:
        """The fd of ``path``, open until the block ends."""
        victims: list[int] = []
        with self._lock:
            e = self._files.setdefault(path, _Open())
            if e.fd is None:
                victims = self._make_room()
                try:  # opened under the lock: two threads never open one file twice
                    e.fd = os.open(path, self.flags, self.mode)
                except BaseException:
                    self._open -= 1
                    if e.users == 0 and e.left is None:
                        del self._files[path]
                    self._close_all(victims)
                    raise
            e.users += 1
            self._idle.pop(path, None)
        try:
            self._close_all(victims)
            yield e.fd
        finally:
            close = None
            with self._lock:
                e.users -= 1
                if e.users == 0:
                    if e.left is not None and e.left <= 0:
                        close = self._forget(path, e)
                    elif e.fd is not None:
                        self._idle[path] = None
            self._close(close)

    def write(self, path: str, data, offset: int) -> None:
        """All of ``data`` at ``offset`` of ``path``, one writer per file at a time."""
        with self.use(path) as fd, self._files[path].writing:
            pwrite_all(fd, data, offset)

    def read(self, path: str, length: int, offset: int) -> bytes:
        with self.use(path) as fd:
            return os.pread(fd, length, offset)

    def close(self) -> None:
        """Close (and with ``fsync`` flush) every file still open; the first error is raised."""
        with self._lock:
            closing = [e.fd for e in self._files.values() if e.fd is not None]
            self._files.clear()
            self._idle.clear()
            self._open = 0
        self._close_all(closing)

    def abandon(self) -> None:
        """Close every file still open, flushing none and raising nothing (what failed is being
        raised already, and what was written is thrown away)."""
        with self._lock:
            closing = [e.fd for e in self._files.values() if e.fd is not None]
            self._files.clear()
            self._idle.clear()
            self._open = 0
        for fd in closing:
            try:
                os.close(fd)
            except OSError:
                pass

    # -- under self._lock

    def _make_room(self) -> list[int]:
        """Reserve a place for one more open file (closing idle ones: returned, to be closed)."""
        victims = []
        while self._open >= self.limit and self._idle:
            path = next(iter(self._idle))
            del self._idle[path]
            e = self._files[path]
            victims.append(e.fd)
            e.fd = None
            self._open -= 1
            if e.left is None:  # nothing to count: forgotten until used again
                del self._files[path]
        self._open += 1  # over the limit only when every open file is in use
        self.peak = max(self.peak, self._open)
        return victims

    def _forget(self, path: str, e: _Open) -> int | None:
        del self._files[path]
        self._idle.pop(path, None)
        if e.fd is None:
            return None
        self._open -= 1
        return e.fd

    # -- outside it

    def _close(self, fd: int | None) -> None:
        """Close ``fd`` (with ``fsync``, flushed first: a file is on disk once it is closed)."""
        if fd is None:
            return
        try:
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _close_all(self, fds: list[int]) -> None:
        """Close every fd of ``fds``; the first error is raised once all are closed."""
        error = None
        for fd in fds:
            try:
                self._close(fd)
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error


def bounded_map(pool, fn, items: Iterable, window: int) -> Iterator:
    """``pool.map(fn, items)`` in order with at most ``window`` tasks in flight, so memory stays
    bounded however many items (one queue across every file of a snapshot, restore or checkout:
    many small files keep every worker busy as one large one does)."""
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


def spans(n: int, k: int) -> list[tuple[int, int]]:
    """``range(n)`` cut into ``k`` contiguous ``(start, end)`` spans as even as can be (fewer when
    ``n < k``; none when ``n`` is 0)."""
    k = max(1, min(k, n))
    return [(n * i // k, n * (i + 1) // k) for i in range(k)] if n else []


def round_robin(iterables: Iterable[Iterable]) -> Iterator:
    """One item of each of ``iterables`` in turn, then the next of each, and so on; an exhausted
    one drops out. Each is read lazily and in its own order."""
    its = deque(iter(x) for x in iterables)
    while its:
        it = its.popleft()
        for item in itertools.islice(it, 1):
            yield item
            its.append(it)


def atomic_write(
    path: str | os.PathLike,
    data: bytes | bytearray | memoryview,
    *,
    mode: int | None = None,
    fsync: bool = True,
    exclusive: bool = False,
    make_folder: bool = True,
) -> bool:
    """Put ``data`` at ``path`` all at once: unique temp name in the same folder, ``os.replace``.

    The folder is created if needed (a caller that knows it is there passes ``make_folder=False``
    and gets :class:`FileNotFoundError` if it is gone). ``mode`` gives the file's permissions (default: as ``open``
    creates a file, 0o666 less the umask). ``fsync`` (the default) flushes the bytes to disk before
    the rename, and the folder after it, so the file is there, whole, after a power cut; a caller
    that flushes many files together (a folder store's chunks, see
    :mod:`concord.stores.local`) turns it off.

    With ``exclusive`` the file appears only if ``path`` does not exist yet, decided atomically by
    the filesystem (a rename that refuses to replace, :func:`rename_new`; where the filesystem has
    none, a hard link of the finished temp file), so of two writers racing for one name exactly one
    wins and the other's bytes are never seen. Returns whether ``data`` was written.
    """
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if make_folder:
        os.makedirs(folder, exist_ok=True)
    tmp: str | None = temp_path(folder)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666 if mode is None else mode)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
            pwrite_all(fd, data, 0)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if not exclusive:
            os.replace(tmp, path)
            tmp = None
        else:
            renamed = rename_new(tmp, path)
            if renamed is False:
                return False
            if renamed:
                tmp = None
            else:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
                except OSError as exc:
                    if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                        raise
                    # a filesystem without hard links: fall back to check-then-replace (a narrow window)
                    if os.path.exists(path):
                        return False
                    os.replace(tmp, path)
                    tmp = None
        if fsync:
            fsync_path(folder)
        return True
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)  # the link's second name, or what is left of a failed write
            except FileNotFoundError:
                pass
