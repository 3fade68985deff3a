"""Federation tasks: run one LoRA federation round of a tenant, and verify a tenant's ledger.

Thin wrappers over :func:`concord.federation.rounds.run_round` and :func:`concord.federation.ledger.verify_ledger`:
they open the stores from their specs, call the core, emit an event and return a plain dict.

Both keep the worker's memory of how far each ledger went (``$CONCORD_HOME/ledgers-seen.json`` on
the machine the task runs on, :mod:`concord.federation.seen`): a ledger rolled back below it, or
rewritten, is refused by ``federate_task`` before any adapter is read and reported tampered by
``verify_ledger_task``.

Events (an automation pages on ``concord.ledger.tampered``)::

    concord.federation.completed   resource concord.tenant.<tenant>
    concord.ledger.verified        resource concord.tenant.<tenant>
    concord.ledger.tampered        resource concord.tenant.<tenant>
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task

from concord.federation.rounds import DEFAULT_OUT
from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, open_stores
from concord_pipelines.tasks.progress import PrefectProgress, run_logger


@task(name="federate", task_run_name="federate-{tenant}", **RETRIED)
def federate_task(
    tenant: str,
    clusters: Sequence[str],
    adapters: Sequence[str],
    method: str = "exact",
    rank: int | None = None,
    weights: Sequence[float] | None = None,
    clip_norm: float | None = None,
    robust: str = "none",
    out_name: str = DEFAULT_OUT,
    ledger_store: str | None = None,
    record_lineage: bool = False,
    tracking_uri: str | None = None,
    trust_block: str | None = None,
    remember: bool = True,
    cosigner_blocks: Sequence[str] | None = None,
    base: str | None = None,
) -> dict:
    """One federation round of ``tenant``: aggregate ``adapters`` (refs ``NAME`` or
    ``tenant/NAME``) found in ``clusters``, snapshot the result into the first cluster under
    ``tenant/out_name``, replicate it to the others and append the round to the ledger in
    ``ledger_store`` (default: the first cluster). With ``record_lineage`` the result is
    registered as MLflow model version ``<tenant>-<out_name>``; a lineage failure is logged and
    reported in the result, never raised.

    With ``trust_block`` (a saved Concord Trust block holding this cluster's signing key) the
    round is signed over its hash, so ``verify_ledger_task`` under that block's trusted keys
    accepts it. ``cosigner_blocks`` are the trust blocks of the other clusters, in the clusters'
    order: each one's signing key co-signs the round once its cluster has checked the aggregate it
    received (a quorum for a threshold policy). ``base`` is the base model of a ``fedex`` round.
    With ``remember`` (the default) a ledger behind what this worker saw of it is
    refused before any adapter is read, and the round is remembered. Emits ``concord.federation.completed``. Retried only when a store does not answer; a retry
    before the ledger append redoes nothing already done (same result, same root, ref in place).
    """
    from concord.federation.rounds import run_round
    from concord.federation.seen import LedgerMemory

    specs = list(clusters)
    key = None
    if trust_block:
        from concord_pipelines.blocks.trust import load_trust_block

        key = load_trust_block(trust_block).get_signing_key()
    cosigners = [_signing_key_of(name) for name in cosigner_blocks or ()]  # a block without a key fails before any store is read
    lineage = None
    if record_lineage:
        from concord.lineage import Lineage

        lineage = Lineage(tracking_uri)
    with open_stores(*specs, ledger_store) as opened:
        stores, ledger = opened[:-1], opened[-1]
        r = run_round(
            tenant,
            stores,
            list(adapters),
            method=method,
            rank=rank,
            weights=list(weights) if weights else None,
            clip_norm=clip_norm,
            robust=robust,
            out_name=out_name,
            ledger_store=ledger,
            lineage=lineage,
            progress=PrefectProgress(),
            key=key,
            memory=LedgerMemory() if remember else None,
            cosigners=cosigners,
            base=base,
        )
    log = run_logger()
    if r["lineage"] and "error" in r["lineage"]:
        log.warning("round %d of %s is in the ledger but not in lineage: %s", r["round"], tenant, r["lineage"]["error"])
    related = [events.snapshot(r["root"], "result"), events.ref(r["ref"]), events.store(r["ledger"], "ledger")]
    related += [events.store(p["store"], "cluster") for p in r["replicas"]]
    related += [events.snapshot(i["root"], "input") for i in r["inputs"]]
    payload = {
        "tenant": tenant,
        "round": r["round"],
        "hash": r["hash"],
        "root": r["root"],
        "ref": r["ref"],
        "method": r["method"],
        "rank": r["rank"],
        "clients": len(r["clients"]),
        "rejected": sum(1 for c in r["clients"] if not c["accepted"]),
        "relative_error": r["relative_error"],
    }
    r["event_id"] = events.emit(events.FEDERATION_COMPLETED, events.tenant(tenant), related, payload)
    rejected = [c["adapter"] for c in r["clients"] if not c["accepted"]]
    log.info(
        "round %d of %s: %s over %d adapter(s) → %s %s (rank %s, relative error %s)%s; ledger: %s",
        r["round"], tenant, r["method"], len(r["clients"]), r["ref"], r["root"][:12], r["rank"], r["relative_error"],
        f"; rejected {', '.join(rejected)}" if rejected else "", r["ledger_note"],
    )
    return r


def _signing_key_of(block: str):
    """The signing key of the trust block ``block`` (one line naming it when it has none)."""
    from concord.errors import KeyFileError
    from concord_pipelines.blocks.trust import load_trust_block

    key = load_trust_block(block).get_signing_key()
    if key is None:
        raise KeyFileError(f"block:{block}", "the co-signer's trust block has no signing key", "Set its signing_key, or leave it out of cosigner_blocks")
    return key


@task(name="verify-ledger", task_run_name="verify-ledger-{tenant}", **RETRIED)
def verify_ledger_task(store: str, tenant: str, trust_block: str | None = None, remember: bool = True, threshold: int | None = None) -> dict:
    """Check ``tenant``'s ledger in ``store`` (round hashes, chain, head; under a trust policy,
    the trust block's keys or ``$CONCORD_TRUSTED_KEYS``, every round's signatures too: at least
    the policy's threshold of distinct keys, or ``threshold``; ``signed_by`` names them per round). With
    ``remember`` (the default), also against what this worker saw of it before, as ``concord
    federate verify`` does: a ledger rolled back below that round, or rewritten, is tampered
    (``error`` names it and the fix); one that verifies is remembered. Returns the report rather
    than raising: the caller decides what tampering means. Emits ``concord.ledger.verified`` or
    ``concord.ledger.tampered``."""
    from concord.federation.seen import LedgerMemory, verify_remembered
    from concord_pipelines.tasks.trust import trust_policy

    policy = trust_policy(trust_block, threshold)
    with open_stores(store) as (s,):
        result = verify_remembered(s, tenant, trust=policy, memory=LedgerMemory() if remember else None)
    report = result.report
    out = result.to_dict()
    out["error"] = str(result.error) if result.error is not None else None
    name = events.LEDGER_VERIFIED if report.ok else events.LEDGER_TAMPERED
    out["event_id"] = events.emit(name, events.tenant(tenant), [events.store(report.store, "ledger")], dict(out))
    log = run_logger()
    if report.ok:
        log.info("ledger of %s in %s: %d round(s), head %s", tenant, report.store, report.rounds, (report.head or "(none)")[:12])
    else:
        log.error("ledger of %s in %s does not verify: %s", tenant, report.store, out["error"] or "; ".join(report.problems))
    return out
