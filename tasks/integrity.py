"""Check what a store holds, and repair it from a healthy replica."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks import events
from tasks.common import RETRIES, RETRY_DELAYS, open_stores, retry_if_transient
from tasks.progress import PrefectProgress, run_logger


@task(
    name="verify",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
def verify_task(store: str, ref: str | None = None, root: str | None = None, repair_from: str | None = None) -> dict:
    """Re-hash every chunk the snapshot ``ref``/``root`` needs (with neither: everything in the
    store); with ``repair_from``, fetch good copies of what is missing or corrupt.

    Returns the report (``ok`` is False while anything is still broken) rather than raising:
    the caller decides what a broken store means. Emits ``concord.store.verified``.
    """
    from concord.verify import verify

    with open_stores(store, repair_from) as (s, donor):
        r = verify(s, ref=ref, root=root, repair_from=donor, progress=PrefectProgress())
    out = r.to_dict() | {"repair_from": donor.uri if donor else None}
    related = [events.snapshot(x, "snapshot") for x in r.roots[:20]]
    if donor is not None:
        related.append(events.store(donor.uri, "repair-source"))
    out["event_id"] = events.emit(
        events.STORE_VERIFIED,
        events.store(s.uri),
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
        s.uri, r.chunks_checked, len(r.missing), len(r.corrupt), len(r.repaired),
    )
    return out
