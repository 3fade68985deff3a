"""Writing a file atomically: the one way Concord puts a file in place.

A reader never sees a half-written file under its real name, and a process killed mid-write leaves
at most a temporary file: the bytes go to a unique temporary name in the destination folder (a
``.tmp-`` name, which folder stores never read as an object and garbage collection removes), are
flushed (and fsynced unless told otherwise), then renamed into place with ``os.replace``; the
temporary file is removed in ``finally`` whatever happened.

Every small file is written through :func:`atomic_write`: store objects, refs and documents, the
checkpoint watcher's state, the record of ``deployments.serve``, an audit's PNGs. The one
specialised path is a folder store's chunk copied in the kernel (``copy_file_range`` from the
checkpoint file into a :func:`temp_path`, then ``os.replace``), which never holds the bytes.
"""

from __future__ import annotations

import errno
import os
import threading
import uuid

#: temporary files start with this (a folder store lists them as leftovers, never as objects)
TMP_PREFIX = ".tmp-"


def temp_path(folder: str | os.PathLike) -> str:
    """A unique temporary file name in ``folder`` (nothing is created)."""
    return os.path.join(os.fspath(folder), f"{TMP_PREFIX}{uuid.uuid4().hex}")


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


class OpenFiles:
    """Files opened once each (with ``flags``) for threads that read or write parts of them, and
    closed together.

    :meth:`write` lets one thread at a time write into a file. A local filesystem (ext4, XFS) runs
    one buffered write into a file at a time anyway, and a thread that waits for it in the kernel
    spins on the CPU while the writer copies; waiting on a lock here sleeps instead, so the other
    threads' reading, decoding and hashing get the core. Writes to different files still run side
    by side."""

    def __init__(self, flags: int) -> None:
        self.flags = flags
        self.fds: dict[str, int] = {}
        self._writing: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def fd(self, path: str) -> int:
        with self._lock:
            if path not in self.fds:
                self.fds[path] = os.open(path, self.flags)
                self._writing[path] = threading.Lock()
            return self.fds[path]

    def write(self, path: str, data, offset: int) -> None:
        """All of ``data`` at ``offset`` of ``path``, one writer per file at a time."""
        fd = self.fd(path)
        with self._writing[path]:
            pwrite_all(fd, data, offset)

    def close(self) -> None:
        with self._lock:
            fds = list(self.fds.values())
            self.fds.clear()
        for fd in fds:
            os.close(fd)


def atomic_write(
    path: str | os.PathLike,
    data: bytes | bytearray | memoryview,
    *,
    mode: int | None = None,
    fsync: bool = True,
    exclusive: bool = False,
) -> bool:
    """Put ``data`` at ``path`` all at once: unique temp name in the same folder, ``os.replace``.

    The folder is created if needed. ``mode`` gives the file's permissions (default: as ``open``
    creates a file, 0o666 less the umask). ``fsync`` (the default) flushes the bytes to disk before
    the rename, and the folder after it, so the file is there, whole, after a power cut; a caller
    that flushes many files together (a folder store's chunks, see
    :mod:`concord.stores.local`) turns it off.

    With ``exclusive`` the file appears only if ``path`` does not exist yet, decided atomically by
    the filesystem (a hard link of the finished temp file), so of two writers racing for one name
    exactly one wins and the other's bytes are never seen. Returns whether ``data`` was written.
    """
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = temp_path(folder)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags, 0o666 if mode is None else mode)
        with open(fd, "wb") as f:
            if mode is not None:
                os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(fd)
        if not exclusive:
            os.replace(tmp, path)
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
        if fsync:
            fsync_path(folder)
        return True
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
