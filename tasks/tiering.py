"""Tiering tasks: take a checkpoint into the tiers, sweep, report status, restore, drill.

Thin wrappers over :mod:`concord.tiering`: each loads the policy from its spec (a YAML file or
``block:NAME``), calls the core with byte progress reported to Prefect, emits events and returns
a plain dict. Adds, sweeps and drills are safe to run again, so they are retried when a store does
not answer; a restore is retried too, but not after waiting out its timeout on an archive.

Two helpers talk to MLflow and never fail the tiering because of it: the roots of the model
versions an alias points at (kept hot and warm like pinned checkpoints), and the drill's run.

Events (an automation pages on ``concord.tier.violation`` and ``concord.drill.failed``)::

    concord.tier.added        resource concord.checkpoint.<namespace>/<name>
    concord.tier.demoted      resource concord.checkpoint.<namespace>/<name>   (one per demotion)
    concord.tier.restored     resource concord.checkpoint.<namespace>/<name>
    concord.tier.violation    resource concord.tiers.<namespace>
    concord.drill.completed   resource concord.tiers.<namespace>
    concord.drill.failed      resource concord.tiers.<namespace>
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Literal, Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from concord.tiering.tracking import DRILL_EXPERIMENT
from tasks import events
from tasks.common import RETRIES, RETRY_DELAYS, retry_if_transient
from tasks.progress import PrefectProgress, run_logger

if TYPE_CHECKING:  # pragma: no cover
    from concord.stores.base import Store
    from concord.tiering.policy import TierPolicy

from concord.tiering.policy import TIERS
#: findings and violations carried in an event's payload at most (the task's result has them all)
EVENT_ITEMS = 20


def _load(policy: str) -> "TierPolicy":
    from concord.tiering.policy import load_policy

    return load_policy(policy)


@contextmanager
def _tiers(policy: "TierPolicy") -> Iterator[dict[str, "Store"]]:
    """The three tiers' stores, closed on the way out."""
    opened: dict[str, Store] = {}
    try:
        for t in TIERS:
            opened[t] = policy.tier(t).open()
        yield opened
    finally:
        for store in opened.values():
            store.close()


def _checkpoint_run_name() -> str:
    from prefect.runtime import task_run

    params = task_run.parameters
    name = params.get("name") or os.path.basename(str(params.get("checkpoint_dir", "")).rstrip("/\\"))
    return f"tier-add-{name}"


# ----------------------------------------------------------------------------- events


def _report_sweep(policy: "TierPolicy", uris: dict[str, str], r: dict) -> None:
    """One ``concord.tier.demoted`` per demotion, and ``concord.tier.violation`` when the sweep
    leaves copy-rule violations; ids of the events sent are added to ``r``."""
    ns = policy.namespace
    log = run_logger()
    ids = []
    if not r["dry_run"]:
        for d in r["demoted"]:
            verified = d.get("verified") or {}
            related = [events.store(uris[d["tier"]], f"demoted-from-{d['tier']}")]
            related += [events.store(uris[t], f"verified-{t}") for t in verified if t in uris]
            ids.append(
                events.emit(
                    events.TIER_DEMOTED,
                    events.checkpoint(ns, d["name"]),
                    related,
                    {"namespace": ns, "name": d["name"], "tier": d["tier"], "verified": verified},
                )
            )
    r["demoted_event_ids"] = ids
    r["violation_event_id"] = None
    if r["violations"]:
        r["violation_event_id"] = events.emit(
            events.TIER_VIOLATION,
            events.tiers(ns),
            [events.store(uri, t) for t, uri in uris.items()],
            {
                "namespace": ns,
                "violations": r["violations"][:EVENT_ITEMS],
                "violation_count": len(r["violations"]),
                "errors": r["errors"][:EVENT_ITEMS],
                "error_count": len(r["errors"]),
            },
        )
        log.error("%s: %d copy-rule violation(s) left: %s", ns, len(r["violations"]), "; ".join(r["violations"]))
    for e in r["errors"]:
        log.error("%s: %s", ns, e)
    log.info(
        "sweep of %s%s: %d copied, %d demoted, %d repaired, %d error(s), %d violation(s)",
        ns, " (dry run)" if r["dry_run"] else "", len(r["copied"]), len(r["demoted"]), len(r["repaired"]),
        len(r["errors"]), len(r["violations"]),
    )


# ----------------------------------------------------------------------------- add, sweep, status


@task(
    name="tier-add",
    task_run_name=_checkpoint_run_name,
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
def add_checkpoint_task(
    policy: str,
    checkpoint_dir: str,
    name: str | None = None,
    step: int | None = None,
    pinned_roots: Sequence[str] = (),
) -> dict:
    """Take a finished checkpoint folder into hot, replicate it to warm and cold, then sweep.

    Refused, with nothing written, while the folder is still being written. Emits
    ``concord.tier.added``, then what the sweep does (``concord.tier.demoted`` per demotion,
    ``concord.tier.violation`` when violations are left). Returns ``AddResult.to_dict()`` plus
    the tiers' store URIs (``stores``).
    """
    from concord.tiering.engine import add_checkpoint

    p = _load(policy)
    with _tiers(p) as stores:
        uris = {t: s.uri for t, s in stores.items()}
        r = add_checkpoint(p, checkpoint_dir, name, step=step, pinned_roots=list(pinned_roots), progress=PrefectProgress(), stores=stores).to_dict()
    r["stores"] = uris
    r["namespace"] = p.namespace
    related = [events.snapshot(r["root"], "snapshot")] + [events.store(uri, t) for t, uri in uris.items()]
    r["event_id"] = events.emit(
        events.TIER_ADDED,
        events.checkpoint(p.namespace, r["name"]),
        related,
        {k: r[k] for k in ("name", "root", "step", "created", "bytes", "new_bytes")} | {"namespace": p.namespace},
    )
    run_logger().info(
        "%s/%s: %s, %d bytes; new bytes %s", p.namespace, r["name"], r["root"][:12], r["bytes"],
        ", ".join(f"{t} {n}" for t, n in r["new_bytes"].items()),
    )
    if r["sweep"] is not None:
        _report_sweep(p, uris, r["sweep"])
    return r


@task(
    name="tier-sweep",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
def sweep_task(policy: str, pinned_roots: Sequence[str] = (), dry_run: bool = False) -> dict:
    """Bring every tier to what the policy wants: copy what is missing, demote what is no longer
    kept (after verifying the copies that stay), collect garbage after the grace period.

    Returns ``SweepResult.to_dict()`` plus ``stores``; errors and violations are reported in it
    (and as events), not raised: the caller decides, after writing its report.
    """
    from concord.tiering.engine import sweep

    p = _load(policy)
    with _tiers(p) as stores:
        uris = {t: s.uri for t, s in stores.items()}
        r = sweep(p, pinned_roots=list(pinned_roots), dry_run=dry_run, progress=PrefectProgress(), stores=stores).to_dict()
    r["stores"] = uris
    _report_sweep(p, uris, r)
    return r


@task(
    name="tier-status",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
def tier_status_task(policy: str, pinned_roots: Sequence[str] = ()) -> dict:
    """Each checkpoint × tier: present, wanted, verified when and how, bytes; plus violations
    (``tier_status``'s dict). Reads refs and records only."""
    from concord.tiering.engine import tier_status

    p = _load(policy)
    with _tiers(p) as stores:
        return tier_status(p, pinned_roots=list(pinned_roots), stores=stores)


# ----------------------------------------------------------------------------- restore and drill


@task(
    name="tier-restore",
    task_run_name="tier-restore-{name}",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
def restore_checkpoint_task(
    policy: str,
    name: str,
    out_dir: str,
    tier: Literal["hot", "warm", "cold"] | None = None,
    timeout: float | None = None,
) -> dict:
    """Restore checkpoint ``name`` into the new folder ``out_dir``, from ``tier`` or the nearest
    tier holding it (waiting for an archive restore if it is only in an archived cold copy), and
    check every byte. Emits ``concord.tier.restored``; returns ``TierRestoreResult.to_dict()``."""
    from concord.tiering.restore import restore_checkpoint

    p = _load(policy)
    r = restore_checkpoint(p, name, out_dir, tier=tier, timeout=timeout, progress=PrefectProgress()).to_dict()
    r["namespace"] = p.namespace
    r["event_id"] = events.emit(
        events.TIER_RESTORED,
        events.checkpoint(p.namespace, name),
        [events.snapshot(r["root"], "snapshot"), events.store(r["store"], "source")],
        {k: r[k] for k in ("name", "root", "tier", "store", "seconds", "wait_seconds", "restore_requests", "bytes", "files", "path")},
    )
    run_logger().info(
        "%s/%s restored from %s (%s) into %s: %d file(s), %d bytes in %.3g s (%.3g s waiting on the archive)",
        p.namespace, name, r["tier"], r["store"], r["path"], r["files"], r["bytes"], r["seconds"], r["wait_seconds"],
    )
    return r


def drill_summary(r: dict) -> dict:
    """What an event says about a drill: per tier, RTO and RPO against their objectives."""
    keys = ("store", "rto_seconds", "rto_objective", "rto_ok", "rpo_seconds", "rpo_objective", "rpo_ok", "ok")
    return {
        "namespace": r["namespace"],
        "started": r["started"],
        "ok": r["ok"],
        "tiers": {t: {k: d.get(k) for k in keys} | {"sampled": list(d.get("sampled") or [])} for t, d in r["tiers"].items()},
        "findings": list(r["findings"][:EVENT_ITEMS]),
        "finding_count": len(r["findings"]),
    }


@task(
    name="tier-drill",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
def drill_task(policy: str, sample: int = 1) -> dict:
    """Restore up to ``sample`` checkpoints from every tier, check every byte, and measure RTO
    and RPO per tier against the policy's objectives.

    Emits ``concord.drill.completed``, or ``concord.drill.failed`` when a tier missed an
    objective, a restore failed or damage was found. Returns ``DrillResult.to_dict()``; a failed
    drill is reported, not raised: the caller writes its report first.
    """
    from concord.tiering.drill import run_drill

    p = _load(policy)
    r = run_drill(p, sample=sample, progress=PrefectProgress()).to_dict()
    name = events.DRILL_COMPLETED if r["ok"] else events.DRILL_FAILED
    related = [events.store(d["store"], t) for t, d in r["tiers"].items() if d.get("store")]
    r["event_id"] = events.emit(name, events.tiers(p.namespace), related, drill_summary(r))
    log = run_logger()
    for t, d in r["tiers"].items():
        log.info(
            "%s %s: RTO %s s (objective %s), RPO %s s (objective %s)",
            p.namespace, t, _num(d["rto_seconds"]), _num(d["rto_objective"]), _num(d["rpo_seconds"]), _num(d["rpo_objective"]),
        )
    if r["ok"]:
        log.info("restore drill of %s passed", p.namespace)
    else:
        log.error("restore drill of %s failed: %s", p.namespace, "; ".join(map(str, r["findings"])) or "see the tiers")
    return r


def _num(value) -> str:
    return "-" if value is None else f"{value:.3g}"


# ----------------------------------------------------------------------------- MLflow


@task(name="promoted-roots", cache_policy=NO_CACHE)
def promoted_roots_task(tracking_uri: str | None = None) -> list[str]:
    """The snapshot roots of every MLflow model version an alias points at (``concord.root``
    tag), to keep them hot and warm like pinned checkpoints.

    Never fails: when MLflow cannot be read, a warning is logged and no root is returned, so
    tiering goes on with the policy's own pins.
    """
    from concord.lineage import Lineage
    from concord.lineage.client import default_tracking_uri

    log = run_logger()
    uri = tracking_uri or default_tracking_uri()
    if uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///"):].split("?", 1)[0]):
        log.info("no lineage database at %s yet: no promoted model versions to keep", uri)
        return []
    lineage = Lineage(uri)
    try:
        roots = lineage.promoted_roots()
    except Exception as exc:  # lineage is advisory here: tiering must go on without it
        log.warning("could not read promoted model versions from %r (%s); keeping only the policy's pins", lineage, exc)
        return []
    log.info("%d snapshot root(s) of promoted model versions kept hot and warm", len(roots))
    return sorted(roots)


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
