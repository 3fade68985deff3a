"""Units of work: thin Prefect tasks over the core, where retries, logging, progress artifacts
and events live. Every task takes store specs as strings (the tiering tasks take the run's loaded
policy) and returns a plain dict.

The tasks are imported on first use (``from tasks import snapshot_task`` imports
``concord_pipelines.tasks.snapshots`` then), so that ``from tasks import events`` stays light: the checkpoint watcher,
the automations and ``concord_pipelines.deployments.serve`` name events without loading Prefect's task machinery.
"""

from __future__ import annotations

import importlib
from typing import Any

#: every task, by the module that defines it
_WHERE = {
    "audit_cards_task": "audit",
    "audit_contract_task": "audit",
    "audit_event_task": "audit",
    "audit_replicas_task": "audit",
    "data_drift_task": "audit",
    "log_audit_task": "audit",
    "model_holders_task": "audit",
    "federate_task": "federation",
    "verify_ledger_task": "federation",
    "verify_batch_task": "integrity",
    "verify_conclude_task": "integrity",
    "verify_plan_task": "integrity",
    "verify_task": "integrity",
    "register_data_task": "lineage",
    "validate_contract_task": "lineage",
    "model_lineage_task": "models",
    "promote_task": "models",
    "publish_oci_task": "oci",
    "record_replica_task": "models",
    "register_model_task": "models",
    "replicate_task": "replication",
    "diff_task": "snapshots",
    "restore_task": "snapshots",
    "rollback_task": "snapshots",
    "snapshot_task": "snapshots",
    "snapshot_part_task": "snapshots",
    "assemble_task": "snapshots",
    "check_trust_task": "trust",
    "sign_snapshot_task": "trust",
    "sign_tiers_task": "trust",
    "signatures_task": "trust",
    "checkout_task": "serving",
    "rollback_link_task": "serving",
    "node_run_task": "serving",
    "stage_checkpoint_task": "staging",
    "drill_task": "drills",
    "log_drill_task": "drills",
    "restore_checkpoint_task": "drills",
    "add_checkpoint_task": "tiering",
    "promoted_roots_task": "tiering",
    "sweep_task": "tiering",
    "tier_policy_task": "tiering",
    "tier_status_task": "tiering",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'concord_pipelines.tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"concord_pipelines.tasks.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
