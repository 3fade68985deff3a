"""The versions folder beside a serving link: layout, lock, the atomic flip, history, status, pruning.

A link ``DEST`` (say ``/srv/models/current``) is a symlink to ``.current.versions/<root>``, a
folder beside it on the same filesystem::

    /srv/models/current -> .current.versions/<root>
    /srv/models/.current.versions/
        <root>/                 a complete, verified version (renamed into place whole)
        .partial-<root>/        a version being written (never named by the link; a re-run resumes it)
        .manifests/<root>.json  each version's manifest (which byte ranges are which chunk)
        .manifests/<root>.files.json  each file's size, times and inode once verified
        history.json            every flip, oldest first: which version was current before which
        gate.json               while a health gate runs: the version it judges and where a failure flips back
        .lock                   held (flock) by a checkout, rollback or prune of this link

The flip is a new link made under a temporary name and renamed over ``DEST`` (``rename(2)`` is
atomic), so a reader opening ``DEST/model.safetensors`` resolves either the old version or the new,
never a mixture and never nothing. Versions are removed only by pruning, which never removes the
current version or the one before it, and renames a version away before deleting its files.

A kept version is never modified in place: a repaired copy is built beside it as a partial
version (its unchanged files hard-linked) and exchanged with it in one ``renameat2`` call.

``gate.json`` is written before a flip that a health gate must confirm and removed once the gate
has decided. A checkout killed in between leaves it naming the version the link names, so the
next checkout, rollback or prune of the link knows that version never passed its gate.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import overload

from concord.errors import CheckoutBusyError, CheckoutTargetError, NoPreviousVersionError
from concord.files import atomic_write
from concord.hashing import is_digest

STATE_FORMAT = "concord/checkout@1"
PARTIAL_PREFIX = ".partial-"
TRASH_PREFIX = ".trash-"
MANIFESTS = ".manifests"
HISTORY = "history.json"
GATE = "gate.json"
LOCK = ".lock"
#: flips remembered in history.json (older ones are dropped; versions are named by their folders)
HISTORY_LIMIT = 200
#: how long a checkout waits for another checkout of the same link by default (seconds)
DEFAULT_WAIT = 600.0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Layout:
    """Where a link's versions live. ``link`` is absolute; ``folder`` is the versions folder."""

    link: str
    folder: str

    @classmethod
    def of(cls, dest: str | os.PathLike) -> Layout:
        link = os.path.abspath(os.fspath(dest))
        name = os.path.basename(link)
        if not name or name in (".", ".."):
            raise CheckoutTargetError(link, "is not a name a link can have", "give a path such as /srv/models/current")
        return cls(link, os.path.join(os.path.dirname(link), f".{name}.versions"))

    @property
    def name(self) -> str:
        return os.path.basename(self.link)

    def target(self, root: str) -> str:
        """What the link holds for ``root``: a path relative to the link's folder."""
        return f".{self.name}.versions/{root}"

    def version_dir(self, root: str) -> str:
        return os.path.join(self.folder, root)

    def partial_dir(self, root: str) -> str:
        return os.path.join(self.folder, PARTIAL_PREFIX + root)

    def manifest_path(self, root: str) -> str:
        return os.path.join(self.folder, MANIFESTS, f"{root}.json")

    # ------------------------------------------------------------------ reading the link

    def current(self) -> str | None:
        """The root the link names now, or None when there is no link. Anything else at ``link``
        (a real folder or file, a link Concord did not make) is refused."""
        if not os.path.lexists(self.link):
            return None
        if not os.path.islink(self.link):
            kind = "a real folder" if os.path.isdir(self.link) else "a file"
            raise CheckoutTargetError(
                self.link,
                f"is {kind}, not a link Concord manages",
                f"to adopt it, move it aside and snapshot it (`mv {self.link} {self.link}.adopt && concord snapshot "
                f"{self.link}.adopt --store STORE --ref NAME`), then `concord checkout STORE --ref NAME {self.link}`",
            )
        target = os.readlink(self.link)
        prefix = f".{self.name}.versions/"
        root = target[len(prefix):] if target.startswith(prefix) else ""
        if not is_digest(root):
            raise CheckoutTargetError(
                self.link,
                f"is a link to {target}, not to a version Concord checked out",
                f"remove the link (`rm {self.link}`; what it points at is left alone) and check out again",
            )
        return root

    def versions(self) -> list[str]:
        """The roots of the complete versions on this node."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if is_digest(n) and os.path.isdir(os.path.join(self.folder, n)))

    # ------------------------------------------------------------------ the flip

    def flip(self, root: str | None) -> None:
        """Point the link at ``root`` atomically (None: remove the link)."""
        parent = os.path.dirname(self.link)
        if root is None:
            try:
                os.unlink(self.link)
            except FileNotFoundError:
                pass
        else:
            tmp = os.path.join(parent, f".{self.name}.tmp-{uuid.uuid4().hex}")
            os.symlink(self.target(root), tmp)
            try:
                os.replace(tmp, self.link)
            finally:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
        fsync_dir(parent)

    # ------------------------------------------------------------------ history

    def history(self) -> list[dict]:
        """Every flip recorded, oldest first: ``{"root", "time", "action"}`` (``root`` None when
        the link was removed)."""
        try:
            with open(os.path.join(self.folder, HISTORY), "rb") as f:
                doc = json.loads(f.read(4 * 1024 * 1024) or b"{}")
        except FileNotFoundError:
            return []
        except ValueError:
            return []  # a damaged history only loses the order of old flips: the link stays the truth
        entries = doc.get("history") if isinstance(doc, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def record(self, root: str | None, action: str) -> None:
        """Add a flip to the history. On a full disk the entry is lost, never the flip: a
        rollback must work when nothing else can be written."""
        entries = self.history() + [{"root": root, "time": _now(), "action": action}]
        doc = {"format": STATE_FORMAT, "link": self.link, "history": entries[-HISTORY_LIMIT:]}
        try:
            atomic_write(os.path.join(self.folder, HISTORY), json.dumps(doc, indent=1).encode())
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise

    def previous(self, current: str | None) -> str | None:
        """The version the link named before ``current`` that is still on this node, or None."""
        have = set(self.versions())
        for e in reversed(self.history()):
            r = e.get("root")
            if isinstance(r, str) and r != current and r in have:
                return r
        return None

    # ------------------------------------------------------------------ the pending health gate

    def pending_gate(self, current: str | None) -> dict | None:
        """The gate record of ``current`` (the root the link names) when its gate never decided:
        ``{"root", "previous", "check", "pgid", "started"}``; None otherwise. A record naming
        another root is stale (the link moved on) and is removed (the caller holds the lock)."""
        doc = _read_gate(self)
        if doc is None or doc.get("root") != current or current is None:
            self.clear_gate()
            return None
        previous = doc.get("previous")
        doc["previous"] = previous if isinstance(previous, str) and is_digest(previous) else None
        return doc

    def mark_gate(self, root: str, previous: str | None, check: str, pgid: int | None = None) -> None:
        """Note, durably and before the flip, that ``root``'s gate has not passed yet."""
        doc = {"format": STATE_FORMAT, "root": root, "previous": previous, "check": check, "since": _now()}
        if pgid is not None:
            doc.update(pgid=pgid, started=process_start(pgid))
        atomic_write(os.path.join(self.folder, GATE), json.dumps(doc).encode())
        fsync_dir(self.folder)

    def clear_gate(self) -> None:
        try:
            os.unlink(os.path.join(self.folder, GATE))
        except FileNotFoundError:
            return
        fsync_dir(self.folder)

    # ------------------------------------------------------------------ the lock

    @contextmanager
    def locked(self, wait: float = DEFAULT_WAIT) -> Iterator[None]:
        """Hold this link's lock: one checkout, rollback or prune at a time. Waits up to ``wait``
        seconds for another holder, then raises :class:`CheckoutBusyError` (nothing touched)."""
        os.makedirs(os.path.join(self.folder, MANIFESTS), exist_ok=True)
        fd = os.open(os.path.join(self.folder, LOCK), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise CheckoutBusyError(self.link, wait) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a folder; the rename is still atomic
    finally:
        os.close(fd)


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``), or None: with its
    pid, it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def end_leftover_gate(pending: dict) -> None:
    """Kill what is left of the gate command of a checkout that was killed while it ran (its
    process group, when its leader is still the process that was started)."""
    pgid, started = pending.get("pgid"), pending.get("started")
    if isinstance(pgid, int) and pgid > 1 and started is not None and process_start(pgid) == started:
        from concord.serving.health import kill_group

        kill_group(pgid)


def swap_dirs(a: str, b: str) -> None:
    """Exchange two folders atomically (``renameat2(RENAME_EXCHANGE)``): at every moment each name
    holds one whole folder. Where the kernel or filesystem cannot, ``b`` is moved aside and ``a``
    renamed to it (a moment with nothing at ``b``), and ``a`` holds what ``b`` held."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        fn = None
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        at_fdcwd, rename_exchange = -100, 2
        if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), b)
    aside = os.path.join(os.path.dirname(b), f"{TRASH_PREFIX}{uuid.uuid4().hex}")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def remove_tree(path: str) -> None:
    """Remove a folder of the versions folder so that no half of it is ever seen under its name:
    renamed to a ``.trash-`` name first, then deleted. Readers with files open keep reading them."""
    if not os.path.lexists(path):
        return
    trash = os.path.join(os.path.dirname(path), f"{TRASH_PREFIX}{uuid.uuid4().hex}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


# ----------------------------------------------------------------------------- rollback, status, prune


@dataclass(frozen=True)
class RollbackResult:
    """What :func:`rollback` did: the link ``path`` now names ``root`` again, instead of
    ``previous``."""

    root: str
    previous: str
    path: str
    seconds: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@overload
def rollback(dest: str | os.PathLike[str], *, expect: None = None, wait: float = DEFAULT_WAIT) -> RollbackResult: ...
@overload
def rollback(dest: str | os.PathLike[str], *, expect: str, wait: float = DEFAULT_WAIT) -> RollbackResult | None: ...


def rollback(dest: str | os.PathLike[str], *, expect: str | None = None, wait: float = DEFAULT_WAIT) -> RollbackResult | None:
    """Flip the link back to the version it named before the current one, at once (no byte is
    read: that version was verified when it was checked out). With ``expect``, only when the
    link names that root now (a rollout undoing its own flip); otherwise None, nothing touched."""
    t0 = time.perf_counter()
    layout = Layout.of(dest)
    current = layout.current()  # refuse a real folder before making anything beside it
    if expect is not None and current != expect:
        return None
    if not os.path.isdir(layout.folder):
        raise NoPreviousVersionError(layout.link)
    with layout.locked(wait):
        current = layout.current()
        if expect is not None and current != expect:
            return None
        pending = layout.pending_gate(current)
        if pending is not None:
            end_leftover_gate(pending)
        previous = layout.previous(current)
        if pending is not None and pending["previous"] in layout.versions():
            previous = pending["previous"]  # where the gate it never passed would have flipped back
        if previous is None or current is None:
            raise NoPreviousVersionError(layout.link)
        layout.flip(previous)
        layout.record(previous, "rollback")
        layout.clear_gate()
    return RollbackResult(previous, current, layout.link, round(time.perf_counter() - t0, 6))


@dataclass(frozen=True)
class VersionInfo:
    root: str
    path: str
    bytes: int | None
    files: int | None
    current: bool
    previous: bool
    last_used: str | None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Status:
    link: str
    current: str | None
    previous: str | None
    versions: list[VersionInfo] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    #: the current root when a checkout flipped to it and was interrupted before its gate passed
    pending_gate: str | None = None

    def to_dict(self) -> dict:
        return {
            "link": self.link,
            "current": self.current,
            "previous": self.previous,
            "versions": [v.to_dict() for v in self.versions],
            "partial": list(self.partial),
            "pending_gate": self.pending_gate,
        }


def _manifest_figures(layout: Layout, root: str) -> tuple[int | None, int | None]:
    try:
        with open(layout.manifest_path(root), "rb") as f:
            doc = json.loads(f.read())
        files = doc["files"]
        return sum(int(f["size"]) for f in files), len(files)
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def _last_used(layout: Layout) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in layout.history():
        if isinstance(e.get("root"), str):
            out[e["root"]] = str(e.get("time", ""))
    return out


def status(dest: str | os.PathLike) -> Status:
    """The versions on this node beside ``dest``, which is current and which came before it."""
    layout = Layout.of(dest)
    current = layout.current()
    previous = layout.previous(current)
    used = _last_used(layout)
    versions = []
    for root in layout.versions():
        size, files = _manifest_figures(layout, root)
        versions.append(
            VersionInfo(root, layout.version_dir(root), size, files, root == current, root == previous, used.get(root))
        )
    versions.sort(key=lambda v: v.last_used or "", reverse=True)
    versions.sort(key=lambda v: (not v.current, not v.previous))  # stable: current, previous, then most recent
    partial = []
    if os.path.isdir(layout.folder):
        partial = sorted(n[len(PARTIAL_PREFIX):] for n in os.listdir(layout.folder) if n.startswith(PARTIAL_PREFIX))
    pending = _read_gate(layout)
    gate = current if pending is not None and pending.get("root") == current else None
    return Status(layout.link, current, previous, versions, partial, gate)


def _read_gate(layout: Layout) -> dict | None:
    """``gate.json`` as it is, without the lock (status only reads)."""
    try:
        with open(os.path.join(layout.folder, GATE), "rb") as f:
            doc = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def prune(layout: Layout, keep: int, *, spare: str | None = None) -> list[str]:
    """Remove all but the ``keep`` most recently used versions (the caller holds the lock).
    The current version and the one before it are always kept, and so is ``spare`` (a version a
    checkout is about to use); leftover partial versions of other roots and trash go too.
    Returns the roots removed."""
    if keep < 1:
        raise ValueError(f"keep must be 1 or more (the current version is always kept), got {keep!r}")
    current = layout.current()
    previous = layout.previous(current)
    pending = layout.pending_gate(current)
    used = _last_used(layout)
    roots = layout.versions()

    def recency(root: str) -> tuple[str, float]:
        return (used.get(root, ""), os.stat(layout.version_dir(root)).st_mtime)

    ordered = sorted(roots, key=recency, reverse=True)
    back = pending["previous"] if pending is not None else None  # where an ungated current flips back to
    kept = set(ordered[:keep]) | {r for r in (current, previous, spare, back) if r}
    removed = []
    for root in ordered:
        if root in kept:
            continue
        remove_tree(layout.version_dir(root))
        for doc in (layout.manifest_path(root), layout.manifest_path(root)[: -len(".json")] + ".files.json"):
            try:
                os.unlink(doc)
            except FileNotFoundError:
                pass
        removed.append(root)
    for name in os.listdir(layout.folder):
        if name.startswith(TRASH_PREFIX) or (name.startswith(PARTIAL_PREFIX) and name[len(PARTIAL_PREFIX):] != spare):
            shutil.rmtree(os.path.join(layout.folder, name), ignore_errors=True)
    return removed
