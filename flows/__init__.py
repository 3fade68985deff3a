"""Pipelines: each flow sequences tasks, fans out, writes artifacts and emits events.

Flows are imported lazily (``from flows import replicate_snapshot`` works), so a script such as
``python -m demo`` can configure Prefect through the environment before Prefect loads.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "snapshot_checkpoint": "flows.snapshot",
    "diff_snapshots": "flows.snapshot",
    "restore_snapshot": "flows.snapshot",
    "rollback_ref": "flows.snapshot",
    "snapshot_spread": "flows.spread",
    "replicate_snapshot": "flows.replicate",
    "snapshot_and_replicate": "flows.replicate",
    "verify_store": "flows.verify",
    "register_data_snapshot": "flows.lineage",
    "validate_contract": "flows.lineage",
    "register_model_version": "flows.lineage",
    "promote_model": "flows.lineage",
    "publish_oci": "flows.oci",
    "lora_federation": "flows.federation",
    "tier_checkpoints": "flows.tiering",
    "restore_checkpoint_flow": "flows.tiering",
    "restore_drill": "flows.tiering",
    "nightly_drift_audit": "flows.audit",
    "checkout_node": "flows.rollout",
    "rollback_node": "flows.rollout",
    "rollout_flow": "flows.rollout",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'flows' has no attribute {name!r}")
