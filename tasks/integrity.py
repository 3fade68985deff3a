"""Check what a store holds, and repair it from a healthy replica.

``verify_task`` does it in one task. The verify-store flow fans the hashing out instead:
``verify_plan_task`` lists the chunks and cuts them into batches, ``verify_batch_task`` re-hashes
one batch (one task per batch, so a Dask cluster hashes them on many machines), and
``verify_conclude_task`` repairs and combines. Both ways give the same report and emit the same
event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import task

from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, open_stores
from concord_pipelines.tasks.progress import PrefectProgress, human_bytes, run_logger

if TYPE_CHECKING:
    from concord.snapshots.verify import VerifyResult
    from concord.stores.base import Store


def _reported(r: VerifyResult, store: Store, donor: Store | None, ref: str | None) -> dict:
    """The report of a verify as a plain dict; emits ``concord.store.verified`` and logs the verdict."""
    out = r.to_dict() | {"repair_from": donor.uri if donor else None}
    related = [events.snapshot(x, "snapshot") for x in r.roots[:20]]
    if donor is not None:
        related.append(events.store(donor.uri, "repair-source"))
    out["event_id"] = events.emit(
        events.STORE_VERIFIED,
        events.store(store.uri),
        related,
        {
            "ok": r.ok,
            "chunks_checked": r.chunks_checked,
            "missing": len(r.missing),
            "corrupt": len(r.corrupt),
            "repaired": len(r.repaired),
            "bad_manifests": len(r.bad_manifests),
            "ref": ref,
        },
    )
    log = run_logger()
    (log.info if r.ok else log.error)(
        "%s: %d chunk(s) checked, %d missing, %d corrupt, %d repaired",
        store.uri, r.chunks_checked, len(r.missing), len(r.corrupt), len(r.repaired),
    )
    return out


@task(name="verify", **RETRIED)
def verify_task(store: str, ref: str | None = None, root: str | None = None, repair_from: str | None = None) -> dict:
    """Re-hash every chunk the snapshot ``ref``/``root`` needs (with neither: everything in the
    store); with ``repair_from``, fetch good copies of what is missing or corrupt.

    Returns the report (``ok`` is False while anything is still broken) rather than raising:
    the caller decides what a broken store means. Emits ``concord.store.verified``.
    """
    from concord.snapshots.verify import verify

    with open_stores(store, repair_from) as (s, donor):
        r = verify(s, ref=ref, root=root, repair_from=donor, progress=PrefectProgress())
        return _reported(r, s, donor, ref)


@task(name="verify-plan", **RETRIED)
def verify_plan_task(
    store: str, batch_bytes: int, ref: str | None = None, root: str | None = None, repair_from: str | None = None
) -> dict:
    """What a verify of ``store`` checks (see ``verify_task``), with the chunks cut into batches of
    about ``batch_bytes``: ``{store, roots, bad_manifests, repaired, chunks, bytes, batches}``,
    each batch a ``{chunk id: expected length}`` in id order. Damaged manifests are repaired here."""
    from concord.snapshots.verify import plan

    with open_stores(store, repair_from) as (s, donor):
        p = plan(s, ref=ref, root=root, repair_from=donor)
    batches = p.batches(batch_bytes)
    run_logger().info(
        "%s: %d chunk(s), %s, in %d batch(es) of up to %s",
        p.store, len(p.lengths), human_bytes(p.total_bytes), len(batches), human_bytes(batch_bytes),
    )
    return {
        "store": p.store,
        "roots": list(p.roots),
        "bad_manifests": list(p.bad_manifests),
        "repaired": list(p.repaired),
        "chunks": len(p.lengths),
        "bytes": p.total_bytes,
        "batches": batches,
    }


@task(name="verify-batch", **RETRIED)
def verify_batch_task(store: str, batch: dict[str, int]) -> dict:
    """Re-hash one batch of chunks (``{chunk id: expected length, -1 if unknown}``):
    ``{missing, corrupt, chunks, bytes_read}``, ids in order. Reads only; repairs nothing."""
    from concord.snapshots.verify import check

    with open_stores(store) as (s,):
        return check(s, batch).to_dict()


@task(name="verify-conclude", **RETRIED)
def verify_conclude_task(
    store: str,
    checks: list[dict],
    *,
    roots: list[str],
    bad_manifests: list[str],
    repaired: list[str],
    ref: str | None = None,
    repair_from: str | None = None,
) -> dict:
    """Combine the checks of a plan's batches (in batch order) into the report ``verify_task``
    gives, repairing first from ``repair_from``; ``roots``, ``bad_manifests`` and ``repaired``
    come from the plan. Emits ``concord.store.verified``."""
    from concord.snapshots.verify import Checked, conclude

    parts = [Checked(tuple(c["missing"]), tuple(c["corrupt"]), c["chunks"], c["bytes_read"]) for c in checks]
    with open_stores(store, repair_from) as (s, donor):
        r = conclude(s, roots=roots, checks=parts, bad_manifests=bad_manifests, repaired=repaired, repair_from=donor)
        return _reported(r, s, donor, ref)
