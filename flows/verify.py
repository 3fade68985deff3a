"""The integrity pipeline: re-hash a store, repair it from a replica, fail while it is broken.

The hashing fans out: the chunks to check are cut into batches of ``batch_mib`` and one task
re-hashes each batch, on the task runner ``CONCORD_TASK_RUNNER`` chooses (threads, or a Dask
cluster that may span machines; see ``concord_pipelines.flows._runner``).
"""

from __future__ import annotations

from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext
from pydantic import Field

from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import RefName, StoreAddress
from concord_pipelines.flows._report import MiB, cluster, human, md_table, short
from concord_pipelines.flows._runner import describe, fan_out, in_flight, task_runner
from concord_pipelines.flows.snapshot import DEFAULT_STORE
from concord_pipelines.tasks import signatures_task, verify_batch_task, verify_conclude_task, verify_plan_task

#: chunk ids listed in the report at most (the counts are always complete)
LISTED = 50

BatchMiB = Annotated[
    float, Field(gt=0, description="MiB of chunks one task re-hashes; the batches run in parallel on the task runner.")
]


class StoreDamaged(RuntimeError):
    """A store still has missing or corrupt data after the verify (and any repair)."""


@flow(name="verify-store", task_runner=task_runner(), **ENDED_HOOKS)
def verify_store(
    store: StoreAddress = DEFAULT_STORE,
    ref: RefName | None = None,
    repair_from: StoreAddress | None = None,
    batch_mib: BatchMiB = 256,
    trust_block: str | None = None,
) -> dict:
    """Re-hash what a store holds; repair missing or corrupt chunks from a healthy replica.

    The run fails while anything is still missing or corrupt, so a schedule or an automation
    sees a damaged store as a failed run.

    Args:
        store: The store to check.
        ref: Check only what this ref's snapshot needs; empty to check the whole store.
        repair_from: A store to fetch good copies of bad chunks from; empty to only report.
        batch_mib: MiB of chunks per hashing task. The batches are re-hashed in parallel on the
            flow's task runner (CONCORD_TASK_RUNNER on the worker: threads, or a Dask cluster).
        trust_block: A saved Concord Trust block whose trusted keys the signatures are checked
            against (empty: the worker's CONCORD_TRUSTED_KEYS; neither: signatures listed only).
    """
    plan = verify_plan_task(store, max(1, int(batch_mib * MiB)), ref=ref or None, repair_from=repair_from or None)
    batches = plan["batches"]
    runner = FlowRunContext.get().task_runner
    limit = in_flight(runner)
    get_run_logger().info(
        "re-hashing %d batch(es) on %s, %s at a time", len(batches), describe(runner), limit or "all",
    )
    progress = create_progress_artifact(0.0, key="verify-progress", description=_progress(plan, 0, 0))
    checks: list[dict | None] = [None] * len(batches)
    done = 0
    for n, (i, c) in enumerate(fan_out(lambda batch: verify_batch_task.submit(store, batch), batches, limit), start=1):
        checks[i] = c
        done += c["bytes_read"]
        update_progress_artifact(progress, 100.0 * n / len(batches), description=_progress(plan, n, done))
    if not batches:
        update_progress_artifact(progress, 100.0, description=_progress(plan, 0, 0))
    r = verify_conclude_task(
        store, checks, roots=plan["roots"], bad_manifests=plan["bad_manifests"], repaired=plan["repaired"],
        ref=ref or None, repair_from=repair_from or None,
    )
    r["batches"] = len(batches)
    r["signatures"] = signatures_task(store, r["roots"], trust_block or None)

    repaired = set(r["repaired"])
    rows = [("missing", short(c), "repaired" if c in repaired else "**broken**") for c in r["missing"][:LISTED]]
    rows += [("corrupt", short(c), "repaired" if c in repaired else "**broken**") for c in r["corrupt"][:LISTED]]
    rows += [("manifest", short(m), "repaired" if m in repaired else "**broken**") for m in r["bad_manifests"][:LISTED]]
    verdict = "healthy" if r["ok"] and not rows else "repaired" if r["ok"] else "DAMAGED"
    snapshots = ", ".join(short(x) for x in r["roots"][:5]) + (" …" if len(r["roots"]) > 5 else "")
    counts = (len(r["missing"]), len(r["corrupt"]), len(r["bad_manifests"]), len(r["repaired"]))
    report = f"## {cluster(r['store'])}: {verdict}\n\n" + md_table(
        ["snapshots", "chunks checked", "missing", "corrupt", "damaged manifests", "repaired", "repair source"],
        [(snapshots, f"{r['chunks_checked']:,}", *counts, cluster(r["repair_from"]) if r["repair_from"] else "(none)")],
    )
    if r["signatures"]:
        signed = [
            (short(x["root"]), ", ".join(k[:16] for k in x["signed_by"]) or "(none)", {None: "–", True: "yes", False: "**no**"}[x["trusted"]])
            for x in r["signatures"][:LISTED]
        ]
        report += "\n\n### Signatures\n\n" + md_table(["snapshot", "signed by", "trusted"], signed)
    if rows:
        report += "\n\n### Problems\n\n" + md_table(["kind", "id", "state"], rows)
    create_markdown_artifact(report, key="verify-report", description=f"{cluster(r['store'])}: {verdict}")
    if not r["ok"]:
        if r["repair_from"]:
            hint = f"{r['repair_from']} could not supply every copy; try another replica"
        else:
            hint = "re-run with repair_from set to a healthy replica"
        raise StoreDamaged(
            f"{r['store']} has {len(r['missing'])} missing and {len(r['corrupt'])} corrupt chunk(s), "
            f"{len(r['bad_manifests'])} damaged manifest(s), {len(r['repaired'])} repaired: {hint}"
        )
    return r


def _progress(plan: dict, batches_done: int, bytes_done: int) -> str:
    return (
        f"verify: {batches_done} of {len(plan['batches'])} batch(es), "
        f"{human(bytes_done)} of {human(plan['bytes'])} re-hashed"
    )
