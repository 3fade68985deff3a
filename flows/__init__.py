"""Pipelines: each flow sequences tasks, fans out, writes artifacts and emits events.

Flows are imported lazily (``from flows import replicate_snapshot`` works), so a script such as
``python -m demo`` can configure Prefect through the environment before Prefect loads.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "snapshot_checkpoint": "concord_pipelines.flows.snapshot",
    "diff_snapshots": "concord_pipelines.flows.snapshot",
    "restore_snapshot": "concord_pipelines.flows.snapshot",
    "rollback_ref": "concord_pipelines.flows.snapshot",
    "snapshot_spread": "concord_pipelines.flows.spread",
    "replicate_snapshot": "concord_pipelines.flows.replicate",
    "snapshot_and_replicate": "concord_pipelines.flows.replicate",
    "verify_store": "concord_pipelines.flows.verify",
    "register_data_snapshot": "concord_pipelines.flows.lineage",
    "validate_contract": "concord_pipelines.flows.lineage",
    "register_model_version": "concord_pipelines.flows.lineage",
    "promote_model": "concord_pipelines.flows.lineage",
    "publish_oci": "concord_pipelines.flows.oci",
    "lora_federation": "concord_pipelines.flows.federation",
    "tier_checkpoints": "concord_pipelines.flows.tiering",
    "restore_checkpoint_flow": "concord_pipelines.flows.tiering",
    "restore_drill": "concord_pipelines.flows.tiering",
    "nightly_drift_audit": "concord_pipelines.flows.audit",
    "checkout_node": "concord_pipelines.flows.rollout",
    "rollback_node": "concord_pipelines.flows.rollout",
    "rollout_flow": "concord_pipelines.flows.rollout",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'concord_pipelines.flows' has no attribute {name!r}")
