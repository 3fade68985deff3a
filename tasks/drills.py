"""Giving tiered checkpoints back: restore one, or drill restores of every tier.

Thin wrappers over :func:`concord.tiering.restore.restore_checkpoint` and
:func:`concord.tiering.drill.run_drill`, given the run's loaded policy (``tier-policy``). Both are
retried when a store does not answer, but a restore is not retried after waiting out its
timeout on an archive. The tiers are opened by the core as it needs them: a restore from cold
need not reach warm, and a drill reports a tier it cannot open as a finding.

A drill is logged to MLflow (``log-drill``, experiment ``concord-restore-drills``); MLflow being
down leaves a warning, never fails the drill.

Events (an automation pages on ``concord.drill.failed``; every name is in :mod:`concord_pipelines.tasks.events`):
``concord.tier.restored`` per restore, ``concord.drill.completed`` or ``concord.drill.failed``
per drill.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from prefect import task
from prefect.cache_policies import NO_CACHE

from concord.tiering.tracking import DRILL_EXPERIMENT
from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED
from concord_pipelines.tasks.progress import PrefectProgress, run_logger

if TYPE_CHECKING:  # pragma: no cover
    from concord.tiering.policy import TierPolicy

#: what a restore's event says of it
RESTORED_KEYS = ("name", "root", "tier", "store", "seconds", "wait_seconds", "restore_requests", "bytes", "files", "path", "unchanged")


@task(name="tier-restore", task_run_name="tier-restore-{name}", **RETRIED)
def restore_checkpoint_task(
    policy: TierPolicy,
    name: str,
    out_dir: str,
    tier: Literal["hot", "warm", "cold"] | None = None,
    timeout: float | None = None,
    trust_block: str | None = None,
) -> dict:
    """Restore checkpoint ``name`` into the new folder ``out_dir``, from ``tier`` or the nearest
    tier holding it (waiting for an archive restore if it is only in an archived cold copy), and
    check every byte. Under a trust policy (the trust block ``trust_block``, else
    ``$CONCORD_TRUSTED_KEYS``) a copy no trusted key signed is refused before anything is asked
    of an archive or written. Emits ``concord.tier.restored``; returns ``TierRestoreResult.to_dict()``."""
    from concord.tiering.restore import restore_checkpoint
    from concord_pipelines.tasks.trust import trust_policy

    ns = policy.namespace
    trust = trust_policy(trust_block)
    check = trust.restore_check if trust is not None else None
    r = restore_checkpoint(policy, name, out_dir, tier=tier, timeout=timeout, progress=PrefectProgress(), check_root=check).to_dict()
    r["namespace"] = ns
    r["event_id"] = events.emit(
        events.TIER_RESTORED,
        events.checkpoint(ns, name),
        [events.snapshot(r["root"], "snapshot"), events.store(r["store"], "source")],
        {k: r[k] for k in RESTORED_KEYS},
    )
    if r["unchanged"]:
        run_logger().info("%s/%s: %s already holds %s (%d file(s), checked by content): unchanged", ns, name, r["path"], r["root"], r["files"])
    else:
        run_logger().info(
            "%s/%s restored from %s (%s) into %s: %d file(s), %d bytes in %.3g s (%.3g s waiting on the archive)",
            ns, name, r["tier"], r["store"], r["path"], r["files"], r["bytes"], r["seconds"], r["wait_seconds"],
        )
    return r


@task(name="tier-drill", **RETRIED)
def drill_task(policy: TierPolicy, sample: int = 1) -> dict:
    """Restore up to ``sample`` checkpoints from every tier, check every byte, and measure RTO
    and RPO per tier against the policy's objectives.

    Emits ``concord.drill.completed``, or ``concord.drill.failed`` when a tier missed an
    objective, a restore failed or damage was found. Returns ``DrillResult.to_dict()``; a failed
    drill is reported, not raised: the caller writes its report first.
    """
    from concord.tiering.drill import drill_summary, run_drill

    ns = policy.namespace
    r = run_drill(policy, sample=sample, progress=PrefectProgress()).to_dict()
    name = events.DRILL_COMPLETED if r["ok"] else events.DRILL_FAILED
    related = [events.store(d["store"], t) for t, d in r["tiers"].items() if d.get("store")]
    r["event_id"] = events.emit(name, events.tiers(ns), related, drill_summary(r, items=events.PAYLOAD_ITEMS))
    log = run_logger()
    for t, d in r["tiers"].items():
        log.info(
            "%s %s: RTO %s s (objective %s), RPO %s s (objective %s)",
            ns, t, _num(d["rto_seconds"]), _num(d["rto_objective"]), _num(d["rpo_seconds"]), _num(d["rpo_objective"]),
        )
    if r["ok"]:
        log.info("restore drill of %s passed", ns)
    else:
        log.error("restore drill of %s failed: %s", ns, "; ".join(map(str, r["findings"])) or "see the tiers")
    return r


def _num(value) -> str:
    return "-" if value is None else f"{value:.3g}"


@task(name="log-drill", cache_policy=NO_CACHE)
def log_drill_task(drill: dict, sample: int = 1, tracking_uri: str | None = None) -> str | None:
    """Log a drill as one run of the MLflow experiment ``concord-restore-drills``: metrics
    ``rto_seconds_<tier>`` and ``rpo_seconds_<tier>``, the objectives as parameters, the drill's
    JSON as the artifact ``drill.json``. Returns the run id.

    Never fails the drill: when MLflow cannot be written, a warning is logged and None returned.
    """
    from concord.lineage import Lineage

    log = run_logger()
    lineage = Lineage(tracking_uri)
    try:
        run_id = _log_drill(lineage, drill, sample)
    except Exception as exc:  # the drill's own report stands without MLflow
        log.warning("restore drill of %s not logged to MLflow at %r: %s", drill["namespace"], lineage, exc)
        return None
    log.info("restore drill of %s logged to MLflow run %s (experiment %s)", drill["namespace"], run_id, DRILL_EXPERIMENT)
    return run_id


def _log_drill(lineage, drill: dict, sample: int) -> str:
    from concord.tiering.tracking import log_drill

    return log_drill(lineage, drill, sample=sample)
