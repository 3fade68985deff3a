"""Errors of lineage: data snapshots, the lineage backend, promotion, schema contracts."""

from __future__ import annotations

from concord.errors.base import ConcordError

__all__ = [
    "ContractConflictError",
    "ContractError",
    "ContractNotFoundError",
    "DataFormatError",
    "DataSnapshotNotFoundError",
    "LineageError",
    "LineageUnreachableError",
    "ModelFileNotFoundError",
    "PromotionRefused",
    "ReadOnlyArtifactsError",
]


class DataFormatError(ConcordError, ValueError):
    """A data source Concord cannot register (unknown format, unreadable file)."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(
            f"{source}: {problem}. Register a pandas DataFrame, a .parquet file or a .csv file."
        )


class DataSnapshotNotFoundError(ConcordError, KeyError):
    """No data snapshot with this id is registered in the store."""

    exit_code = 10

    def __init__(self, store: str, snapshot_id: str) -> None:
        self.store = store
        self.snapshot_id = snapshot_id
        super().__init__(
            f"no data snapshot {snapshot_id} in {store}; register the data there with "
            "`concord.lineage.data.register_data`, or sync the snapshot and its datasets/ document there."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class LineageError(ConcordError):
    """A lineage record cannot be written or read as asked."""


class LineageUnreachableError(LineageError, ConnectionError):
    """The MLflow tracking server did not answer."""

    exit_code = 14

    def __init__(self, uri: str, cause: str) -> None:
        self.uri = uri
        super().__init__(
            f"MLflow tracking server {uri} is unreachable: {cause}. Start it (`mlflow server "
            "--host 127.0.0.1 --port PORT`), or point MLFLOW_TRACKING_URI at a running one "
            "(unset it to use the embedded sqlite database under $CONCORD_HOME)."
        )


class ModelFileNotFoundError(LineageError, FileNotFoundError):
    """A model version's snapshot has no file or folder at the path asked for."""

    exit_code = 10

    def __init__(self, root: str, path: str, files: list[str]) -> None:
        self.root = root
        self.path = path
        self.files = list(files)
        shown = ", ".join(self.files[:8]) + (f" and {len(self.files) - 8} more" if len(self.files) > 8 else "")
        super().__init__(
            f"snapshot {root} has no file or folder {path!r}; its files are {shown or '(none)'}. "
            "Ask for one of them, or for the whole snapshot (no path)."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class ReadOnlyArtifactsError(LineageError, PermissionError):
    """Something tried to write through a ``concord://`` artifact URI, which only reads."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        super().__init__(
            f"{uri} is read-only: a Concord model version's files are its snapshot. Snapshot the "
            "checkpoint (`concord snapshot DIR STORE --ref models/NAME`) and register it "
            "(`concord model register NAME --store STORE --ref models/NAME`) to publish new weights."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class PromotionRefused(LineageError):
    """A model version failed the promotion gate; ``reasons`` lists every failed check."""

    def __init__(self, name: str, version: str, alias: str, reasons: list[str]) -> None:
        self.name = name
        self.version = str(version)
        self.alias = alias
        self.reasons = list(reasons)
        listed = "; ".join(f"({i}) {r}" for i, r in enumerate(self.reasons, 1))
        super().__init__(
            f"refusing to point alias {alias!r} of model {name!r} at version {version}: {listed}. "
            "Fix each reason (register data and a contract, fix the data, or publish a compatible "
            "contract version) and promote again."
        )


class ContractError(ConcordError, ValueError):
    """A schema contract is malformed, or cannot be saved or used as asked."""

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        fix = fix or (
            "Fix the contract (see concord.lineage.contracts.Contract for the fields), or infer a "
            "fresh one from good data with concord.lineage.contracts.infer_contract."
        )
        super().__init__(f"{where}: {problem}. {fix}")


class ContractConflictError(ContractError):
    """A contract version is already saved with different content; versions are immutable."""

    def __init__(self, store: str, ref: str, saved_digest: str, new_digest: str) -> None:
        self.store = store
        self.ref = ref
        self.saved_digest = saved_digest
        self.new_digest = new_digest
        super().__init__(
            f"contract {ref}",
            f"already saved in {store} with different content (saved {saved_digest[:12]}, "
            f"new {new_digest[:12]})",
            "A saved version never changes: bump the version and save again, then check the "
            "change with concord.lineage.contracts.compatible(old, new).",
        )


class ContractNotFoundError(ConcordError, KeyError, FileNotFoundError):
    """No contract of that name (or version, or file) exists."""

    exit_code = 10

    def __init__(self, where: str, ref: str, available: list[str] | None = None) -> None:
        self.where = where
        self.ref = ref
        self.available = list(available or [])
        if available is None:  # a file path: there is no list to show
            listing = ""
        elif self.available:
            listing = "; saved there: " + ", ".join(self.available[:10]) + (" ..." if len(self.available) > 10 else "")
        else:
            listing = "; none is saved there yet"
        super().__init__(
            f"no contract {ref!r} in {where}{listing}. Save it with concord.lineage.contracts.save_contract, "
            "or pass 'name@VERSION', 'name' (its latest version) or the path of a .json file."
        )

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])
