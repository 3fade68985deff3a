"""The integrity pipeline: re-hash a store, repair it from a replica, fail while it is broken."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows._report import md_table, short
from flows.snapshot import DEFAULT_STORE
from tasks import verify_task

#: chunk ids listed in the report at most (the counts are always complete)
LISTED = 50


class StoreDamaged(RuntimeError):
    """A store still has missing or corrupt data after the verify (and any repair)."""


@flow(name="verify-store")
def verify_store(store: str = DEFAULT_STORE, ref: str | None = None, repair_from: str | None = None) -> dict:
    """Re-hash what a store holds; repair missing or corrupt chunks from a healthy replica.

    The run fails while anything is still missing or corrupt, so a schedule or an automation
    sees a damaged store as a failed run.

    Args:
        store: The store to check.
        ref: Check only what this ref's snapshot needs; empty to check the whole store.
        repair_from: A store to fetch good copies of bad chunks from; empty to only report.
    """
    r = verify_task(store, ref=ref or None, repair_from=repair_from or None)
    repaired = set(r["repaired"])
    rows = [("missing", c, "repaired" if c in repaired else "**broken**") for c in r["missing"][:LISTED]]
    rows += [("corrupt", c, "repaired" if c in repaired else "**broken**") for c in r["corrupt"][:LISTED]]
    rows += [("manifest", m, "repaired" if m in repaired else "**broken**") for m in r["bad_manifests"][:LISTED]]
    verdict = "healthy" if r["ok"] and not rows else "repaired" if r["ok"] else "DAMAGED"
    snapshots = ", ".join(short(x) for x in r["roots"][:5]) + (" …" if len(r["roots"]) > 5 else "")
    counts = (len(r["missing"]), len(r["corrupt"]), len(r["bad_manifests"]), len(r["repaired"]))
    report = f"## `{r['store']}`: {verdict}\n\n" + md_table(
        ["snapshots", "chunks checked", "missing", "corrupt", "damaged manifests", "repaired", "repair source"],
        [(snapshots, r["chunks_checked"], *counts, r["repair_from"] or "(none)")],
    )
    if rows:
        report += "\n\n### Problems\n\n" + md_table(["kind", "id", "state"], rows)
    create_markdown_artifact(report, key="verify-report", description=f"{r['store']}: {verdict}")
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
