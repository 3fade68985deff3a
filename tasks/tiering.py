"""Tiering tasks: read the run's policy, take a checkpoint into the tiers, sweep, report status.

Thin wrappers over :mod:`concord.tiering`. A run reads its policy once (``tier-policy``: a YAML
file or ``block:NAME``, validated) and opens the three tiers once
(:func:`concord.tiering.engine.opened_tiers`); every task gets both, calls the core with byte
progress reported to Prefect, emits events and returns a plain dict. Adds and sweeps are safe to
run again, so they are retried when a store does not answer. Restores and drills are in
:mod:`concord_pipelines.tasks.drills`.

``promoted-roots`` reads MLflow and never fails the tiering because of it: the roots of the
model versions an alias points at are kept hot and warm like pinned checkpoints.

Events (an automation pages on ``concord.tier.violation``; every name is in :mod:`concord_pipelines.tasks.events`):
``concord.tier.added`` per checkpoint taken in, ``concord.tier.demoted`` per demotion,
``concord.tier.violation`` when a sweep leaves copy-rule violations.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE

from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED
from concord_pipelines.tasks.progress import PrefectProgress, run_logger

if TYPE_CHECKING:  # pragma: no cover
    from concord.stores.base import Store
    from concord.tiering.policy import TierPolicy


@task(name="tier-policy", **RETRIED)
def tier_policy_task(policy: str) -> TierPolicy:
    """The tier policy ``policy`` names (a YAML file, or ``block:NAME`` of a saved Concord Tier
    Policy block), read and validated once for the whole run: every problem is listed at once
    (``PolicyError``); a Prefect API that does not answer for a block is retried."""
    from concord.tiering.policy import load_policy

    return load_policy(policy)


def _checkpoint_run_name() -> str:
    from prefect.runtime import task_run

    params = task_run.parameters
    name = params.get("name") or os.path.basename(str(params.get("checkpoint_dir", "")).rstrip("/\\"))
    return f"tier-add-{name}"


def _report_sweep(policy: TierPolicy, uris: dict[str, str], r: dict) -> None:
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
                "violations": r["violations"][: events.PAYLOAD_ITEMS],
                "violation_count": len(r["violations"]),
                "errors": r["errors"][: events.PAYLOAD_ITEMS],
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


@task(name="tier-add", task_run_name=_checkpoint_run_name, **RETRIED)
def add_checkpoint_task(
    policy: TierPolicy,
    stores: dict[str, Store],
    checkpoint_dir: str,
    name: str | None = None,
    step: int | None = None,
    pinned_roots: Sequence[str] = (),
) -> dict:
    """Take a finished checkpoint folder into hot, replicate it to warm and cold, then sweep
    (``stores``: the run's open tiers).

    Refused, with nothing written, while the folder is still being written. Emits
    ``concord.tier.added``, then what the sweep does (``concord.tier.demoted`` per demotion,
    ``concord.tier.violation`` when violations are left). Returns ``AddResult.to_dict()`` plus
    the tiers' store URIs (``stores``).
    """
    from concord.tiering.engine import add_checkpoint

    uris = {t: s.uri for t, s in stores.items()}
    r = add_checkpoint(policy, checkpoint_dir, name, step=step, pinned_roots=list(pinned_roots), progress=PrefectProgress(), stores=stores).to_dict()
    r["stores"] = uris
    r["namespace"] = policy.namespace
    related = [events.snapshot(r["root"], "snapshot")] + [events.store(uri, t) for t, uri in uris.items()]
    r["event_id"] = events.emit(
        events.TIER_ADDED,
        events.checkpoint(policy.namespace, r["name"]),
        related,
        {k: r[k] for k in ("name", "root", "step", "created", "bytes", "new_bytes")} | {"namespace": policy.namespace},
    )
    run_logger().info(
        "%s/%s: %s, %d bytes; new bytes %s", policy.namespace, r["name"], r["root"][:12], r["bytes"],
        ", ".join(f"{t} {n}" for t, n in r["new_bytes"].items()),
    )
    if r["sweep"] is not None:
        _report_sweep(policy, uris, r["sweep"])
    return r


@task(name="tier-sweep", **RETRIED)
def sweep_task(policy: TierPolicy, stores: dict[str, Store], pinned_roots: Sequence[str] = (), dry_run: bool = False) -> dict:
    """Bring every tier to what the policy wants: copy what is missing, demote what is no longer
    kept (after verifying the copies that stay), collect garbage after the grace period.

    Returns ``SweepResult.to_dict()`` plus ``stores``; errors and violations are reported in it
    (and as events), not raised: the caller decides, after writing its report.
    """
    from concord.tiering.engine import sweep

    uris = {t: s.uri for t, s in stores.items()}
    r = sweep(policy, pinned_roots=list(pinned_roots), dry_run=dry_run, progress=PrefectProgress(), stores=stores).to_dict()
    r["stores"] = uris
    _report_sweep(policy, uris, r)
    return r


@task(name="tier-status", **RETRIED)
def tier_status_task(policy: TierPolicy, stores: dict[str, Store], pinned_roots: Sequence[str] = ()) -> dict:
    """Each checkpoint × tier: present, wanted, verified when and how, bytes; plus violations
    (``tier_status``'s dict). Reads refs and records only."""
    from concord.tiering.engine import tier_status

    return tier_status(policy, pinned_roots=list(pinned_roots), stores=stores)


# ----------------------------------------------------------------------------- pins from MLflow


@task(name="promoted-roots", cache_policy=NO_CACHE)
def promoted_roots_task(tracking_uri: str | None = None) -> list[str]:
    """The snapshot roots of every MLflow model version an alias points at (``root``
    tag), to keep them hot and warm like pinned checkpoints.

    Never fails: when MLflow cannot be read, a warning is logged and no root is returned, so
    tiering goes on with the policy's own pins.
    """
    from concord.lineage import Lineage
    from concord.lineage.client import default_tracking_uri, sqlite_file

    log = run_logger()
    uri = tracking_uri or default_tracking_uri()
    db = sqlite_file(uri)
    if db is not None and not os.path.exists(db):
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
