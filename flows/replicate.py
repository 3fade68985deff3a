"""Pipelines that move snapshots between clusters: replicate one, or snapshot then replicate."""

from __future__ import annotations

from typing import Annotated

from prefect import flow, unmapped
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.futures import as_completed
from pydantic import Field

from flows._report import human, md_table, short
from flows.lineage import record_holders
from flows.snapshot import DEFAULT_REF, ChunkSizeMiB, snapshot_checkpoint
from tasks import replicate_task

Targets = Annotated[list[str], Field(min_length=1, description="Stores to bring up to date, one per cluster.")]


class ReplicationFailed(RuntimeError):
    """Some targets of a replication failed; the others completed (see the summary artifact)."""


@flow(name="replicate-snapshot")
def replicate_snapshot(source: str, targets: Targets, ref: str = DEFAULT_REF, record_lineage: bool = True) -> list[dict]:
    """Replicate a snapshot to every target store at once; only chunks a target lacks are sent.

    Args:
        source: The store holding the snapshot.
        targets: The stores to bring up to date (one task per target, run concurrently).
        ref: The ref to replicate; it moves on each target by compare-and-swap, after every
            chunk and the manifest are there.
        record_lineage: Record each updated target as a holder of the model versions registered
            with the snapshot (MLflow lineage). Never fails the replication: when lineage is
            unreachable, a warning is logged.
    """
    futures = replicate_task.map(source=unmapped(source), target=targets, ref=unmapped(ref))
    target_of = {f: t for f, t in zip(futures, targets)}
    progress_id = create_progress_artifact(0.0, key="replication-progress", description=f"0 of {len(targets)} target(s) done")
    results: dict[str, dict] = {}
    failures: dict[str, BaseException] = {}
    for n, future in enumerate(as_completed(list(futures)), start=1):
        target = target_of[future]
        try:
            results[target] = future.result()
        except Exception as exc:  # reported per target below, raised together at the end
            failures[target] = exc
        update_progress_artifact(progress_id, 100.0 * n / len(targets), description=f"{n} of {len(targets)} target(s) done")

    held = record_holders([results[t] for t in targets if t in results]) if record_lineage and results else {}

    rows = []
    for t in targets:
        if t in results:
            r = results[t]
            sent = (r["chunks_sent"], human(r["bytes_sent"]), r["chunks_present"])
            versions = ", ".join(held.get(r["store"], []))
            status = f"updated; held-by recorded on {versions}" if versions else "updated"
            rows.append((f"`{r['store']}`", status, short(r["root"]), *sent, r["ref_version"]))
        else:
            rows.append((f"`{t}`", f"**failed**: {failures[t]}", "", "", "", "", ""))
    create_markdown_artifact(
        f"## Replication of `{ref}` from `{source}`\n\n"
        + md_table(["target", "status", "root", "chunks sent", "bytes sent", "chunks already there", "ref version"], rows),
        key="replication-summary",
        description=f"{len(results)} of {len(targets)} target(s) updated",
    )
    if failures:
        listed = "; ".join(f"{t}: {exc}" for t, exc in failures.items())
        raise ReplicationFailed(
            f"replication of {ref} failed for {len(failures)} of {len(targets)} target(s) ({listed}). "
            "Re-run the flow: it sends only what is still missing."
        ) from next(iter(failures.values()))
    return [results[t] for t in targets]


@flow(name="snapshot-and-replicate")
def snapshot_and_replicate(
    source: str,
    store: str,
    targets: Targets,
    ref: str = DEFAULT_REF,
    chunk_size_mib: ChunkSizeMiB = 4,
    message: str = "",
) -> dict:
    """Snapshot a new checkpoint into the primary store, then replicate it to every cluster.

    Args:
        source: The checkpoint folder (or file) to snapshot.
        store: The primary store the snapshot is taken into.
        targets: The stores of the other clusters.
        ref: The ref moved to the new snapshot, here and on every target.
        chunk_size_mib: Chunk size in MiB (keep it stable across snapshots of one model).
        message: A note kept in the ref's history.
    """
    snap = snapshot_checkpoint(source=source, store=store, ref=ref, chunk_size_mib=chunk_size_mib, message=message)
    replicas = replicate_snapshot(targets=targets, source=store, ref=ref)
    return {"snapshot": snap, "replicas": replicas}
