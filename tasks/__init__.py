"""Units of work: thin Prefect tasks over the core, where retries, logging, progress artifacts
and events live. Every task takes store specs as strings and returns a plain dict."""

from tasks.federation import federate_task, verify_ledger_task
from tasks.integrity import verify_task
from tasks.lineage import (
    model_lineage_task,
    promote_task,
    record_replica_task,
    register_data_task,
    register_model_task,
    validate_contract_task,
)
from tasks.replication import replicate_task
from tasks.snapshots import diff_task, restore_task, rollback_task, snapshot_task

__all__ = [
    "diff_task",
    "federate_task",
    "model_lineage_task",
    "promote_task",
    "record_replica_task",
    "register_data_task",
    "register_model_task",
    "replicate_task",
    "restore_task",
    "rollback_task",
    "snapshot_task",
    "validate_contract_task",
    "verify_ledger_task",
    "verify_task",
]
