"""Units of work: thin Prefect tasks over the core, where retries, logging, progress artifacts
and events live. Every task takes store specs as strings and returns a plain dict."""

from tasks.federation import federate_task, verify_ledger_task
from tasks.integrity import verify_batch_task, verify_conclude_task, verify_plan_task, verify_task
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
from tasks.tiering import (
    add_checkpoint_task,
    drill_task,
    log_drill_task,
    promoted_roots_task,
    restore_checkpoint_task,
    sweep_task,
    tier_status_task,
)

__all__ = [
    "add_checkpoint_task",
    "diff_task",
    "drill_task",
    "federate_task",
    "log_drill_task",
    "model_lineage_task",
    "promote_task",
    "promoted_roots_task",
    "record_replica_task",
    "register_data_task",
    "register_model_task",
    "replicate_task",
    "restore_checkpoint_task",
    "restore_task",
    "rollback_task",
    "snapshot_task",
    "sweep_task",
    "tier_status_task",
    "validate_contract_task",
    "verify_batch_task",
    "verify_conclude_task",
    "verify_ledger_task",
    "verify_plan_task",
    "verify_task",
]
