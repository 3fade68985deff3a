"""Tiering pipelines: keep checkpoints hot, warm and cold by policy, restore one, drill restores.

``policy`` is a tier policy YAML file (relative paths are relative to the project folder
deployments run in) or ``block:NAME`` for a ``TierPolicyBlock`` saved in the Prefect UI. Lineage
lives in MLflow: ``tracking_uri`` left empty means the worker's ``$MLFLOW_TRACKING_URI``, else the
embedded sqlite database in ``$CONCORD_HOME``; MLflow being down never fails a tiering run or a
drill, it only leaves a warning.
"""

from __future__ import annotations

import os
import re
from contextlib import nullcontext
from datetime import datetime, timezone
from typing import Annotated, Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from concord.tiering.engine import opened_tiers
from concord_pipelines.flows._arguments import BadArguments, checkpoint_problems, started_by_event
from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import NAME_PATTERN
from concord_pipelines.flows._policy import final
from concord_pipelines.flows._report import cluster, human, md_facts, md_table, short
from concord_pipelines.flows._staging import staged
from concord_pipelines.tasks import (
    add_checkpoint_task,
    drill_task,
    log_drill_task,
    promoted_roots_task,
    restore_checkpoint_task,
    sign_tiers_task,
    sweep_task,
    tier_policy_task,
    tier_status_task,
)

TIERS = ("hot", "warm", "cold")

Policy = Annotated[
    str,
    Field(min_length=1, description="The tier policy: a YAML file, or block:NAME of a saved Concord Tier Policy block."),
]
CheckpointName = Annotated[
    str,
    Field(
        pattern=NAME_PATTERN,
        description="The checkpoint's name in every tier (letters, digits, '.', '_' or '-').",
    ),
]
Step = Annotated[int, Field(ge=0, description="The training step (empty: the number the name ends with).")]
Sample = Annotated[int, Field(ge=1, le=100, description="Checkpoints restored from each tier (the newest always, then random ones).")]


class TieringFailed(RuntimeError):
    """A sweep left errors or copy-rule violations (listed in the run's summary artifact)."""


class DrillFailed(RuntimeError):
    """A restore drill missed an objective, could not restore, or found damage (see its report)."""


class BadCheckpointArguments(BadArguments):
    """tier-checkpoints was given a checkpoint it cannot take in (typically a malformed
    ``concord.checkpoint.created`` event whose payload was templated into the parameters)."""

    flow = "tier-checkpoints"
    payload_fields = "path, name, step"
    fix = "a finished checkpoint: an absolute local folder or an s3://bucket/prefix"


def check_checkpoint_arguments(checkpoint_dir: object, name: object, step: object) -> None:
    """Refuse, with every reason at once, a checkpoint that cannot be taken in.

    ``checkpoint_dir`` must be an absolute path of an existing local folder (a relative path is
    refused: the worker's working folder is not the watcher's) or an ``s3://bucket/prefix`` of a
    checkpoint (staged into a temporary folder when the run takes it in), ``name`` a checkpoint
    name (empty: the folder's or prefix's last part, which must be one then), ``step`` a
    non-negative integer. Empty values mean "not given"; a name or step without a checkpoint is
    refused, since a sweep has no use for them.
    """
    given = checkpoint_dir not in (None, "")
    problems = checkpoint_problems(checkpoint_dir, "checkpoint_dir", relative=False, need_files=False) if given else []
    if name not in (None, "") and not (isinstance(name, str) and re.fullmatch(NAME_PATTERN, name)):
        problems.append(f"name must be a checkpoint name (letters, digits, '.', '_' or '-'; at most 128), got {name!r}")
    elif name in (None, "") and given and not problems:
        last = os.path.basename(checkpoint_dir.rstrip("/" + os.sep))
        if not re.fullmatch(NAME_PATTERN, last):
            problems.append(f"name is empty and the checkpoint's last part {last!r} is no checkpoint name; give a name")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        problems.append(f"step must be a non-negative integer, got {type(step).__name__} {step!r}")
    if not given and (name not in (None, "") or step is not None):
        problems.append("name and step only apply with a checkpoint_dir, which is empty")
    if problems:
        raise final(BadCheckpointArguments(problems, event=started_by_event(checkpoint_dir, name, step)))


def _mark(tier: dict) -> str:
    if tier["present"]:
        return "✓"
    return "✗ missing" if tier["wanted"] else "–"


def _minute(when: str | None) -> str:
    """An ISO time as ``YYYY-MM-DD HH:MM`` (UTC): short enough for a table cell."""
    if not when:
        return ""
    try:
        t = datetime.fromisoformat(when)
    except ValueError:
        return when
    return (t.astimezone(timezone.utc) if t.tzinfo else t).strftime("%Y-%m-%d %H:%M")


def _oldest_verification(c: dict) -> str:
    """When the least recently verified copy was verified (how stale the weakest copy's check is),
    ``never`` when a copy was not verified."""
    times = [c["tiers"][t]["verified"] for t in TIERS if c["tiers"][t]["present"]]
    if not times:
        return ""
    if any(t is None for t in times):
        return "never"
    return _minute(min(times))


def status_rows(status: dict) -> list[dict]:
    """One row per checkpoint: ✓ / – per tier (✗ where the policy wants a copy that is missing),
    times in UTC to the minute."""
    return [
        {
            "checkpoint": c["name"],
            "created": _minute(c["created"]),
            "pinned": "yes" if c["pinned"] else "",
            **{t: _mark(c["tiers"][t]) for t in TIERS},
            "verified": _oldest_verification(c),
            "bytes": human(c["bytes"]) if c["bytes"] >= 0 else "?",
        }
        for c in status["checkpoints"]
    ]


def sweep_report(namespace: str, sweep: dict, added: dict | None = None) -> str:
    """A markdown summary of one sweep (and the checkpoint added before it)."""
    gc = sweep.get("gc") or {}
    deleted = ", ".join(
        f"{t}: {g.get('deleted_chunks', 0)} chunk(s), {human(g.get('deleted_bytes', 0))}" for t, g in gc.items()
    ) or "(not run)"
    rows = []
    if added is not None:
        new = ", ".join(f"{t} {human(n)}" for t, n in added["new_bytes"].items())
        rows.append(("added", f"`{added['name']}` {short(added['root'])}, {human(added['bytes'])} (new bytes, as each tier stores them: {new})"))
    rows += [
        ("copied", len(sweep["copied"])),
        ("demoted", len(sweep["demoted"])),
        ("repaired", len(sweep["repaired"])),
        ("garbage collected", deleted),
        ("errors", len(sweep["errors"])),
        ("violations", len(sweep["violations"])),
    ]
    verdict = "ok" if not sweep["errors"] and not sweep["violations"] else "**needs attention**"
    text = f"## Tiering of `{namespace}`: {verdict}\n\n" + md_facts(rows)
    details = [(f"copied to {c['tier']}", f"`{c['name']}` from {c['from']}") for c in sweep["copied"]]
    details += [
        (f"demoted from {d['tier']}", f"`{d['name']}` (verified first: {', '.join(d.get('verified') or [])})")
        for d in sweep["demoted"]
    ]
    details += [(f"repaired in {x['tier']}", f"`{x['name']}`: {x['chunks']} chunk(s) from {x['from']}") for x in sweep["repaired"]]
    details += [("violation", v) for v in sweep["violations"]] + [("error", e) for e in sweep["errors"]]
    if details:
        text += "\n\n### What happened\n\n" + md_facts(details)
    return text + "\n"


@flow(name="tier-checkpoints", **ENDED_HOOKS)
def tier_checkpoints(
    policy: Policy,
    checkpoint_dir: str | None = None,
    name: CheckpointName | None = None,
    step: Step | None = None,
    pin_promoted: bool = True,
    tracking_uri: str | None = None,
    trust_block: str | None = None,
) -> dict:
    """Keep a namespace's checkpoints hot, warm and cold as its policy says.

    With a checkpoint folder, take it into hot (only once it is complete), replicate it to warm
    and cold, then sweep; without one, only sweep (the hourly run): copy what is missing, demote
    what is no longer kept, after verifying every copy that stays, collect garbage. Writes the
    status table (artifact `tier-status`) and a summary (`tier-summary`); the run fails after
    writing them while errors or copy-rule violations are left.

    Args:
        policy: The tier policy: a YAML file, or block:NAME of a saved Concord Tier Policy block.
        checkpoint_dir: A finished checkpoint to add: an absolute folder on the worker, or an
            s3://bucket/prefix (downloaded into a temporary folder first); empty for a sweep only.
        name: The checkpoint's name; empty for the folder's name.
        step: The training step; empty for the number the name ends with.
        pin_promoted: Keep the snapshots of MLflow model versions that hold an alias hot and warm,
            like pinned checkpoints. When MLflow cannot be read, a warning is logged and only the
            policy's pins apply.
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database).
        trust_block: A saved Concord Trust block; with a signing key, a checkpoint added is signed
            and its signature copied to every tier holding it.
    """
    check_checkpoint_arguments(checkpoint_dir, name, step)
    pinned = promoted_roots_task(tracking_uri or None) if pin_promoted else []
    tiers = tier_policy_task(policy)  # read and validated once for the run
    added = None
    # an s3:// checkpoint is staged into a temporary local folder (removed whatever happens) before
    # the tiers are opened, once, for every task of the run
    with staged(checkpoint_dir) if checkpoint_dir else nullcontext() as checkpoint, opened_tiers(tiers) as stores:
        if checkpoint is not None:
            added = add_checkpoint_task(tiers, stores, checkpoint["path"], name=name or None, step=step, pinned_roots=pinned)
            if trust_block:
                added["signed"] = sign_tiers_task(stores, added["root"], trust_block, ref=tiers.ref(added["name"]))
            swept = added["sweep"]
            namespace = added["namespace"]
        else:
            swept = sweep_task(tiers, stores, pinned_roots=pinned)
            namespace = swept["namespace"]
        status = tier_status_task(tiers, stores, pinned_roots=pinned)

    rows = status_rows(status)
    create_table_artifact(
        rows,
        key="tier-status",
        description=f"{namespace}: {len(rows)} checkpoint(s), {len(status['violations'])} violation(s); times in UTC",
    )
    create_markdown_artifact(
        sweep_report(namespace, swept, added),
        key="tier-summary",
        description=(
            f"{namespace}: {len(swept['copied'])} copied, {len(swept['demoted'])} demoted, "
            f"{len(swept['errors'])} error(s), {len(swept['violations'])} violation(s)"
        ),
    )
    if swept["errors"] or swept["violations"]:
        problems = swept["errors"] + swept["violations"]
        failed = TieringFailed(
            f"tiering of {namespace} left {len(swept['errors'])} error(s) and {len(swept['violations'])} "
            f"copy-rule violation(s) (first: {problems[0]}); fix the cause and run again: a sweep "
            "copies what is missing and converges"
        )
        # errors (a store away) may pass by the retry; violations alone are the sweep's answer
        raise final(failed) if not swept["errors"] else failed
    return {"added": added, "sweep": swept, "status": status, "pinned_roots": pinned}


@flow(name="restore-checkpoint", **ENDED_HOOKS)
def restore_checkpoint_flow(
    policy: Policy,
    name: CheckpointName,
    out_dir: Annotated[
        str, Field(min_length=1, description="A new folder to restore into (never overwritten; one already holding this checkpoint is left unchanged).")
    ],
    tier: Literal["nearest", "hot", "warm", "cold"] = "nearest",
    trust_block: str | None = None,
) -> dict:
    """Restore a tiered checkpoint into a new folder and check every byte.

    Args:
        policy: The tier policy: a YAML file, or block:NAME of a saved Concord Tier Policy block.
        name: The checkpoint to restore.
        out_dir: A new folder to restore into; Concord never overwrites files (a folder that
            already holds exactly this checkpoint is left as it is, and the run says unchanged).
        tier: The tier to restore from; nearest takes the fastest tier holding a copy (hot, then
            warm, then cold, waiting for an archive restore if cold is archived).
        trust_block: A saved Concord Trust block; with trusted keys, a copy none of them signed is
            refused before anything is written (empty: the worker's CONCORD_TRUSTED_KEYS, if set).
    """
    r = restore_checkpoint_task(
        tier_policy_task(policy), name, out_dir, tier=None if tier == "nearest" else tier, trust_block=trust_block or None
    )
    if r["unchanged"]:
        create_markdown_artifact(
            f"## Restore of `{r['name']}`: unchanged\n\n`{r['path']}` already holds {short(r['root'])} "
            f"({r['files']} file(s), {human(r['bytes'])}, every chunk checked by content): nothing was written.",
            key="tier-restore",
            description=f"{r['name']}: unchanged",
        )
        return r
    rows = [
        ("checkpoint", f"`{r['name']}` {short(r['root'])}"),
        ("from", f"{r['tier']} ({cluster(r['store'])})"),
        ("into", f"`{r['path']}`"),
        ("files / size", f"{r['files']} / {human(r['bytes'])}"),
        ("time", f"{r['seconds']:.3g} s ({r['wait_seconds']:.3g} s waiting on the archive, {r['restore_requests']} restore request(s))"),
        ("throughput", f"{human(r['bytes_per_second'])}/s"),
    ]
    create_markdown_artifact(
        f"## Restore of `{r['name']}` from {r['tier']}\n\n" + md_facts(rows),
        key="tier-restore",
        description=f"{r['name']} from {r['tier']} in {r['seconds']:.3g} s",
    )
    return r


def _seconds(value) -> str:
    return "–" if value is None else f"{value:.3g} s"


def _check(ok) -> str:
    return "–" if ok is None else "✓" if ok else "✗"


def drill_report(r: dict, run_id: str | None) -> str:
    rows = [
        (
            t,
            ", ".join(f"`{n}`" for n in d.get("sampled") or []) or "(none)",
            _seconds(d["rto_seconds"]),
            _seconds(d["rto_objective"]),
            _check(d["rto_ok"]),
            _seconds(d["rpo_seconds"]),
            _seconds(d["rpo_objective"]),
            _check(d["rpo_ok"]),
            _check(d["ok"]),
        )
        for t, d in r["tiers"].items()
    ]
    text = f"## Restore drill of `{r['namespace']}`: {'passed' if r['ok'] else '**FAILED**'}\n\n" + md_table(
        ["tier", "restored", "RTO", "RTO objective", "RTO met", "RPO", "RPO objective", "RPO met", "ok"], rows
    )
    if r["findings"]:
        text += "\n\n### Findings\n\n" + "\n".join(f"- {f}" for f in r["findings"])
    text += f"\n\nStarted {r['started']}; " + (f"MLflow run `{run_id}`." if run_id else "not logged to MLflow.")
    return text + "\n"


@flow(name="restore-drill", **ENDED_HOOKS)
def restore_drill(policy: Policy, sample: Sample = 1, tracking_uri: str | None = None) -> dict:
    """Prove every tier can give its checkpoints back: restore samples from hot, warm and cold,
    check every byte, measure RTO and RPO per tier against the policy's objectives.

    Logs the drill to MLflow (experiment concord-restore-drills: RTO and RPO per tier as metrics,
    the objectives as parameters, the drill's JSON as an artifact), writes the report (artifact
    `restore-drill`), emits concord.drill.completed or concord.drill.failed, and fails the run
    when the drill failed.

    Args:
        policy: The tier policy: a YAML file, or block:NAME of a saved Concord Tier Policy block.
        sample: Checkpoints restored from each tier: the newest always, then random others.
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database). MLflow being down leaves a warning, never fails the drill.
    """
    r = drill_task(tier_policy_task(policy), sample=sample)
    run_id = log_drill_task(r, sample=sample, tracking_uri=tracking_uri or None)
    r["mlflow_run_id"] = run_id
    create_markdown_artifact(
        drill_report(r, run_id),
        key="restore-drill",
        description=f"{r['namespace']}: {'passed' if r['ok'] else 'FAILED'}, {len(r['findings'])} finding(s)",
    )
    if not r["ok"]:
        failed = [t for t, d in r["tiers"].items() if not d["ok"]]
        raise DrillFailed(
            f"restore drill of {r['namespace']} failed in {', '.join(failed) or 'the drill itself'}: "
            + "; ".join(map(str, r["findings"][:5]))
            + (" …" if len(r["findings"]) > 5 else "")
        )
    return r
