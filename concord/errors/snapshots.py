"""Errors of snapshots: the files read, garbage collection, rollback, restore, replication, the checkpoint watcher."""

from __future__ import annotations

from typing import Any

from concord.errors.base import ConcordError
from concord.errors.stores import StoreError

__all__ = [
    "ControlCharacterNameError",
    "GcRefusedError",
    "HistoryError",
    "ReplicationError",
    "RestoreTargetError",
    "SafetensorsError",
    "SourceChangedError",
    "SourceNotFoundError",
    "SpreadSnapshotError",
    "StoreLockedError",
    "UnsafePathError",
    "WatchStateError",
]


class SafetensorsError(ConcordError, ValueError):
    """A file that claims to be safetensors is not a valid one."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(
            f"{path}: not a valid safetensors file: {problem}. "
            "Re-export it with safetensors.torch.save_file, or rename it to another "
            "extension to snapshot it as an opaque file."
        )


class SourceNotFoundError(ConcordError, FileNotFoundError):
    """The checkpoint folder or file to snapshot does not exist."""

    exit_code = 10

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: no such file or folder to snapshot; check the path.")


class SourceChangedError(ConcordError, RuntimeError):
    """A file changed while it was being snapshotted."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} changed while it was being snapshotted; nothing of it was kept. Snapshot a "
            "checkpoint only once its writer has finished (write a completion marker, then snapshot)."
        )


class SpreadSnapshotError(ConcordError, ValueError):
    """The nodes' parts of a spread snapshot do not make one snapshot (a node missing or twice, a
    file two nodes disagree on, chunks the store lacks); nothing was written."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"spread snapshot refused: {problem}. No manifest was written and no ref moved.")


class UnsafePathError(ConcordError, ValueError):
    """A path from a manifest or a name would escape the folder it belongs in."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"refusing path {path!r}: {reason}. Manifest paths must be relative, use '/', "
            "and stay inside the restore folder."
        )


class ControlCharacterNameError(ConcordError, ValueError):
    """A file to snapshot has a control character (``\\x00``-``\\x1f``, ``\\x7f``) in its name."""

    def __init__(self, path: str) -> None:
        from concord.text import printable

        self.path = path
        super().__init__(
            f"{printable(path)}: the file name holds a control character (shown escaped); such a "
            "name cannot be printed or restored safely. Rename the file, then snapshot again."
        )


class StoreLockedError(StoreError, TimeoutError):
    """A writer waited for a garbage collection of the store to finish, and it did not in time."""

    exit_code = 11

    def __init__(self, store: str, holder: str, waited: float) -> None:
        self.store = store
        self.holder = holder
        self.waited = waited
        super().__init__(
            f"{store} is being garbage-collected ({holder}) and the collection did not finish within "
            f"{waited:g} s; run again once it has (a collection killed midway stops holding the "
            "store when its heartbeat stops, within 10 minutes)."
        )


class GcRefusedError(StoreError):
    """Garbage collection stopped before deleting anything: a ref names a snapshot whose
    manifest is missing or damaged, so what that snapshot keeps alive cannot be known."""

    def __init__(self, store: str, ref: str, root: str | None, problem: str) -> None:
        self.store = store
        self.ref = ref
        self.root = root
        self.problem = problem
        which = f"snapshot {root}" if root else "its snapshots"
        super().__init__(
            f"garbage collection of {store} refused: ref {ref!r} names {which}, but {problem}. "
            f"Nothing was deleted. Repair the store first (`concord verify {store} --repair-from "
            "OTHER_STORE`, from a store that holds the snapshot), then collect again."
        )


class HistoryError(ConcordError, ValueError):
    """A rollback target is not in the ref's history."""


class RestoreTargetError(ConcordError, FileExistsError):
    """A restore's target folder already holds something: Concord restores only into a new or empty
    folder."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} already exists and holds something other than this snapshot (another root, "
            "a changed or extra file); restore into a new or empty folder: Concord never "
            "overwrites or deletes files. Running again into a folder that holds exactly this "
            "snapshot succeeds, unchanged."
        )


class LocalFileError(ConcordError, OSError):
    """A file or folder on this machine could not be made, written or read (its permissions, a
    full disk, the open-file limit): a local problem, never the store's."""

    def __init__(self, path: str, cause: str) -> None:
        self.path = path
        self.cause = cause
        super().__init__(
            f"{path}: {cause}; a problem of this machine, not of the store: check that folder's "
            "permissions and free space, and the open-file limit (ulimit -n), then run again."
        )

    def __str__(self) -> str:  # OSError would format its own fields otherwise
        return str(self.args[0])


class ReplicationError(ConcordError):
    """One or more targets of a replication failed; the others completed."""

    def __init__(self, results: list[Any], failures: dict[str, BaseException]) -> None:
        self.results = results
        self.failures = failures
        lines = "; ".join(f"{store}: {exc}" for store, exc in failures.items())
        done = ", ".join(r.store for r in results) or "none"
        super().__init__(
            f"replication failed for {len(failures)} target(s) ({lines}). Completed: {done}. "
            "Re-run the same sync: it sends only what is still missing."
        )


class WatchStateError(ConcordError, ValueError):
    """The watcher's state file cannot be read as watcher state."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(
            f"watcher state file {path} is unusable: {problem}. Fix it, or delete it (every complete "
            "checkpoint is then announced again; the flows they trigger are idempotent)."
        )
