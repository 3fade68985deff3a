"""The pipelines as ``prefect.yaml`` deploys them: the flows of ``flows/`` that are safe to run
again, with the retry policy of deployed runs (:mod:`concord_pipelines.flows._policy`: one retry, 30 s later, for a
run that failed on a passing fault; none for a failure that is the run's answer: a malformed
payload, copy-rule violations, or an error of :func:`concord_pipelines.flows._policy.final_errors` such as a missing
source folder or tier policy file)."""

from __future__ import annotations

from concord_pipelines.flows._policy import as_deployed
from concord_pipelines.flows.replicate import replicate_snapshot as _replicate_snapshot
from concord_pipelines.flows.replicate import snapshot_and_replicate as _snapshot_and_replicate
from concord_pipelines.flows.snapshot import snapshot_checkpoint as _snapshot_checkpoint
from concord_pipelines.flows.tiering import tier_checkpoints as _tier_checkpoints

snapshot_checkpoint = as_deployed(_snapshot_checkpoint)
snapshot_and_replicate = as_deployed(_snapshot_and_replicate)
replicate_snapshot = as_deployed(_replicate_snapshot)
tier_checkpoints = as_deployed(_tier_checkpoints)

__all__ = ["replicate_snapshot", "snapshot_and_replicate", "snapshot_checkpoint", "tier_checkpoints"]
