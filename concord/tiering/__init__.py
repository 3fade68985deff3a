"""Hot / warm / cold checkpoint tiering: policies, verified demotion, restores and drills."""

from concord.tiering.engine import (
    AddResult,
    SweepResult,
    add_checkpoint,
    checkpoint_ready,
    copy_rule_violations,
    stored_bytes,
    sweep,
    tier_status,
)
from concord.tiering.policy import TierPolicy, TierSpec, load_policy

__all__ = [
    "AddResult",
    "SweepResult",
    "TierPolicy",
    "TierSpec",
    "add_checkpoint",
    "checkpoint_ready",
    "copy_rule_violations",
    "load_policy",
    "stored_bytes",
    "sweep",
    "tier_status",
]

from concord.tiering.drill import DrillResult, run_drill  # noqa: E402
from concord.tiering.restore import TierCopyNotFoundError, TierRestoreResult, restore_checkpoint  # noqa: E402

__all__ += ["DrillResult", "TierCopyNotFoundError", "TierRestoreResult", "restore_checkpoint", "run_drill"]
