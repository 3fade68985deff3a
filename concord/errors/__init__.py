"""Every error Concord raises, grouped by area.

Each subclasses the standard exception a caller would already catch (``ValueError`` for bad
input, ``FileNotFoundError`` / ``KeyError`` for things that are not there, ``ConnectionError``
for an endpoint that does not answer), carries its context as attributes, and says in its
message what to do next.

One module per area (``base``, ``stores``, ``snapshots``, ``lineage``, ``federation``,
``tiering``, ``audit``); every error is imported from here: ``from concord.errors import X``.
"""

from __future__ import annotations

from concord.errors.base import ConcordError
from concord.errors.stores import (
    ChunkArchivedError,
    ChunkNotFoundError,
    DocumentError,
    IntegrityError,
    InvalidNameError,
    InvalidStoreURIError,
    ManifestError,
    ManifestNotFoundError,
    NotRegularFileError,
    RefConflictError,
    RefFormatError,
    RefNotFoundError,
    ReservedNameError,
    StoreAccessError,
    StoreError,
    StoreNotFoundError,
    StoreUnreachableError,
)
from concord.errors.snapshots import (
    ControlCharacterNameError,
    GcRefusedError,
    HistoryError,
    ReplicationError,
    RestoreTargetError,
    SafetensorsError,
    SourceChangedError,
    SourceNotFoundError,
    StoreLockedError,
    UnsafePathError,
    WatchStateError,
)
from concord.errors.lineage import (
    ContractConflictError,
    ContractError,
    ContractNotFoundError,
    DataFormatError,
    DataSnapshotNotFoundError,
    LineageError,
    LineageUnreachableError,
    PromotionRefused,
)
from concord.errors.federation import (
    AdapterError,
    AdapterNotFoundError,
    AdapterOutputExistsError,
    AggregationError,
    LedgerConflictError,
    LedgerError,
    RoundMismatchError,
    TenantError,
)
from concord.errors.tiering import (
    CheckpointConflictError,
    CheckpointNotFoundError,
    CheckpointNotReadyError,
    CopyRuleError,
    PolicyError,
    RestoreTimeoutError,
)
from concord.errors.audit import (
    DriftConfigError,
    ModelCardError,
    ModelCardNotFoundError,
    ReplicaConfigError,
)

__all__ = [
    "ConcordError",
    "InvalidNameError",
    "ManifestError",
    "RefFormatError",
    "StoreError",
    "InvalidStoreURIError",
    "StoreUnreachableError",
    "StoreAccessError",
    "ChunkNotFoundError",
    "ChunkArchivedError",
    "ManifestNotFoundError",
    "RefNotFoundError",
    "RefConflictError",
    "IntegrityError",
    "StoreNotFoundError",
    "NotRegularFileError",
    "DocumentError",
    "ReservedNameError",
    "SafetensorsError",
    "SourceNotFoundError",
    "SourceChangedError",
    "UnsafePathError",
    "ControlCharacterNameError",
    "StoreLockedError",
    "GcRefusedError",
    "HistoryError",
    "RestoreTargetError",
    "ReplicationError",
    "WatchStateError",
    "DataFormatError",
    "DataSnapshotNotFoundError",
    "LineageError",
    "LineageUnreachableError",
    "PromotionRefused",
    "ContractError",
    "ContractConflictError",
    "ContractNotFoundError",
    "LedgerError",
    "LedgerConflictError",
    "TenantError",
    "AdapterNotFoundError",
    "AdapterError",
    "RoundMismatchError",
    "AggregationError",
    "AdapterOutputExistsError",
    "PolicyError",
    "CheckpointNotReadyError",
    "CheckpointConflictError",
    "CheckpointNotFoundError",
    "CopyRuleError",
    "RestoreTimeoutError",
    "DriftConfigError",
    "ReplicaConfigError",
    "ModelCardNotFoundError",
    "ModelCardError",
]
