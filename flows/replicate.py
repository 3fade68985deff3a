"""Pipelines that move snapshots between clusters: replicate one, or snapshot then replicate."""

from __future__ import annotations

from typing import Annotated

from prefect import flow, unmapped
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.futures import as_completed
from pydantic import Field

from concord_pipelines.flows._arguments import (
    BadArguments,
    checkpoint_problems,
    ref_problems,
    started_by_event,
    store_problems,
    targets_problems,
)
from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import RefName, StoreAddress
from concord_pipelines.flows._policy import final
from concord_pipelines.flows._report import artifact_links, cluster, events_line, human, md_table, short
from concord_pipelines.flows._runner import task_runner
from concord_pipelines.flows._staging import staged
from concord_pipelines.flows.lineage import record_holders
from concord_pipelines.flows.snapshot import DEFAULT_REF, ChunkSizeMiB, snapshot_checkpoint
from concord_pipelines.tasks import check_trust_task, replicate_task

Targets = Annotated[list[str], Field(min_length=1, description="Stores to bring up to date, one per cluster.")]


class ReplicationFailed(RuntimeError):
    """Some targets of a replication failed; the others completed (see the summary artifact)."""


@flow(name="replicate-snapshot", task_runner=task_runner(), **ENDED_HOOKS)
def replicate_snapshot(
    source: StoreAddress, targets: Targets, ref: RefName = DEFAULT_REF, record_lineage: bool = True, trust_block: str | None = None
) -> list[dict]:
    """Replicate a snapshot to every target store at once; only chunks a target lacks are sent.

    Args:
        source: The store holding the snapshot.
        targets: The stores to bring up to date (one task per target, run concurrently).
        ref: The ref to replicate; it moves on each target by compare-and-swap, after every
            chunk and the manifest are there.
        record_lineage: Record each updated target as a holder of the model versions registered
            with the snapshot (MLflow lineage). Never fails the replication: when lineage is
            unreachable, a warning is logged.
        trust_block: A saved Concord Trust block; with trusted keys, a snapshot none of them
            signed is refused before any target is touched (empty: the worker's
            CONCORD_TRUSTED_KEYS, if set).
    """
    check_trust_task(source, ref, trust_block or None)  # refuses an untrusted root before any target
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

    rows, notes = [], []  # a sentence is a line below the table: the UI never wraps a table cell
    names = {t: cluster(t) for t in targets}
    for t in targets:
        if t in results:
            r = results[t]
            sent = (r["chunks_sent"], human(r["bytes_sent"]), r["chunks_present"])
            rows.append((names[t], "updated", short(r["root"]), *sent, r["ref_version"]))
            if held.get(r["store"]):
                notes.append(f"- {names[t]}: held-by recorded on {', '.join(held[r['store']])}")
        else:
            rows.append((names[t], "**failed**", "", "", "", "", ""))
            notes.append(f"- {names[t]}: {' '.join(str(failures[t]).split())}")
    create_markdown_artifact(
        f"## Replication of `{ref}` from {cluster(source)}\n\n"
        + md_table(["target", "status", "root", "chunks sent", "bytes sent", "already there", "ref version"], rows)
        + "".join(f"\n{line}" for line in ["", *notes] if notes),
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


class BadReplicationArguments(BadArguments):
    """snapshot-and-replicate was given parameters it cannot run with (typically a malformed
    ``concord.checkpoint.created`` event whose payload was templated into them)."""

    flow = "snapshot-and-replicate"
    payload_fields = "path, model, name, step"
    fix = (
        "a finished checkpoint (a folder on the worker or an s3://bucket/prefix), a ref like "
        "models/NAME and the stores of the other clusters as targets"
    )


def check_replication_arguments(source: object, store: object, targets: object, ref: object) -> None:
    """Refuse, with every reason at once, what snapshot-and-replicate cannot run with, before
    any store is opened.

    ``source`` must be a folder on the worker holding checkpoint files (a relative path is taken
    from the working folder and must exist there) or an ``s3://bucket/prefix`` of a checkpoint;
    ``ref`` a ref name; ``store`` and every target a store address; ``targets`` not empty, each
    store once, the primary store not among them.
    """
    problems = checkpoint_problems(source, "source", relative=True, need_files=True)
    problems += ref_problems(ref)
    problems += store_problems(store, "store")
    problems += targets_problems(targets, store)
    if problems:
        raise final(BadReplicationArguments(problems, event=started_by_event(source, store, ref, *(targets or ()))))


@flow(name="snapshot-and-replicate", **ENDED_HOOKS)
def snapshot_and_replicate(
    source: str,
    store: str,
    targets: Targets,
    ref: str = DEFAULT_REF,
    chunk_size_mib: ChunkSizeMiB = 4,
    message: str = "",
    trust_block: str | None = None,
) -> dict:
    """Snapshot a new checkpoint into the primary store, then replicate it to every cluster.

    The parameters are checked first, every problem named at once (`BadReplicationArguments`),
    before any store is touched. An s3:// checkpoint is downloaded into a temporary folder on the
    worker (the stage-checkpoint task, retried when S3 does not answer), snapshotted from there,
    and the folder removed whatever happens. Running it again on the same checkpoint changes
    nothing: the snapshot has the same root, so no ref moves.

    Args:
        source: The checkpoint: a folder on the worker, or s3://bucket/prefix (staged first).
        store: The primary store the snapshot is taken into.
        targets: The stores of the other clusters.
        ref: The ref moved to the new snapshot, here and on every target.
        chunk_size_mib: Chunk size in MiB (keep it stable across snapshots of one model).
        message: A note kept in the ref's history.
        trust_block: A saved Concord Trust block: its signing key signs the snapshot, its trusted
            keys are checked before replicating.
    """
    check_replication_arguments(source, store, targets, ref)
    with staged(source) as checkpoint:
        snap_state = snapshot_checkpoint(
            source=checkpoint["path"], store=store, ref=ref, chunk_size_mib=chunk_size_mib, message=message, trust_block=trust_block,
            return_state=True,
        )
        snap = snap_state.result()
    if checkpoint["staged"]:
        snap = snap | {"source": source, "staged_files": checkpoint["files"], "staged_bytes": checkpoint["bytes"]}
    replicas_state = replicate_snapshot(targets=targets, source=store, ref=ref, trust_block=trust_block, return_state=True)
    replicas = replicas_state.result()
    links = {"snapshot": artifact_links(snap_state.state_details.flow_run_id),
             "replication": artifact_links(replicas_state.state_details.flow_run_id)}
    create_markdown_artifact(pipeline_summary(source, ref, snap, replicas, links), key="snapshot-and-replicate-summary",
                             description=f"{snap['root'][:12]} in {1 + len(replicas)} store(s)")
    return {"snapshot": snap, "replicas": replicas}


def pipeline_summary(source: str, ref: str, snap: dict, replicas: list[dict], links: dict[str, str] | None = None) -> str:
    """The parent run's own account of both steps, each store by its cluster's name; ``links``
    (step → markdown links to its subflow run's artifacts) are where the details are."""
    names = {s: cluster(s) for s in (snap["store"], *(r["store"] for r in replicas))}
    was = f" (was {short(snap['previous'])})" if snap.get("previous") else " (a new ref)"
    moved = f"version {snap['ref_version']}{was}" if snap.get("previous") != snap["root"] else "unchanged"
    rows = [(f"{names[snap['store']]} (primary)", "snapshotted", f"{snap['new_chunks']} new chunk(s), {human(snap['new_bytes'])}"
             + (f" ({human(snap['new_stored_bytes'])} stored)" if snap.get("new_stored_bytes", snap["new_bytes"]) != snap["new_bytes"] else ""), moved)]
    rows += [(names[r["store"]], "replicated", f"{r['chunks_sent']} chunk(s) sent, {human(r['bytes_sent'])}"
              + (f" ({human(r['raw_bytes_sent'])} raw)" if r.get("raw_bytes_sent", r["bytes_sent"]) != r["bytes_sent"] else ""),
              f"version {r['ref_version']}") for r in replicas]
    return (
        f"## `{source}` as `{ref}`: snapshot {short(snap['root'])}, {human(snap['bytes'])}\n\n"
        + md_table(["store", "step", "what moved", f"`{ref}`"], rows)
        + "\n\n" + _details(links or {}) + "\n\n" + events_line()
    )


def _details(links: dict[str, str]) -> str:
    listed = [f"{step}: {text}" for step, text in links.items() if text]
    if not listed:
        return "The details are on the subflow runs' artifacts (snapshot-summary, replication-summary)."
    return "The details, on the subflow runs' artifacts: " + "; ".join(listed) + "."
