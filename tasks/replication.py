"""Replicate one snapshot to one target store: a task per target, so a flow can fan out."""

from __future__ import annotations

from prefect import task

from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, named_by, open_stores
from concord_pipelines.tasks.progress import PrefectProgress, run_logger


@task(name="replicate", task_run_name=named_by("replicate-to", "target"), **RETRIED)
def replicate_task(source: str, target: str, ref: str | None = None, root: str | None = None) -> dict:
    """Bring ``target`` up to the snapshot ``ref`` (or ``root``) names in ``source``.

    Only chunks the target lacks are sent, each verified; the ref moves last, by
    compare-and-swap. Emits ``concord.replica.updated``, or ``concord.replica.failed`` (then
    re-raises: an unreachable store is retried, anything else fails the task at once).
    """
    from concord.snapshots.sync import replicate
    from concord.trust.copying import signature_problem

    target_uri, source_uri = target, source
    try:
        with open_stores(source, target) as (src, dst):
            source_uri, target_uri = src.uri, dst.uri
            # a signature that does not verify is never copied over the target's own
            (r,) = replicate(src, [dst], ref=ref, root=root, progress=PrefectProgress(), check_signature=signature_problem)
    except Exception as exc:
        related = [events.store(source_uri, "source")] + ([events.ref(ref)] if ref else [])
        if root:
            related.append(events.snapshot(root, "snapshot"))
        events.emit(
            events.REPLICA_FAILED,
            events.store(target_uri),
            related,
            {
                "source": source_uri,
                "target": target_uri,
                "ref": ref,
                "root": root,
                "error_type": type(exc).__name__,
                "error": str(exc),
            },
        )
        run_logger().error("replication %s → %s failed: %s", source_uri, target_uri, exc)
        raise
    out = r.to_dict() | {"source": source_uri}
    related = [events.snapshot(r.root, "snapshot"), events.store(source_uri, "source")] + ([events.ref(r.ref)] if r.ref else [])
    out["event_id"] = events.emit(
        events.REPLICA_UPDATED,
        events.store(r.store),
        related,
        {
            "root": r.root,
            "ref": r.ref,
            "ref_version": r.ref_version,
            "chunks_sent": r.chunks_sent,
            "bytes_sent": r.bytes_sent,
            "chunks_present": r.chunks_present,
            "source": source_uri,
        },
    )
    run_logger().info(
        "%s: %s, sent %d chunk(s) / %d bytes, %d already there", r.store, r.root[:12], r.chunks_sent, r.bytes_sent, r.chunks_present
    )
    for line in r.signatures_skipped:
        run_logger().warning("%s: signature left behind: %s", r.store, line)
    return out
