"""LoRA federation: one round of a tenant's adapters from every cluster, aggregated, replicated
back to every cluster, recorded in the tenant's hash-chained ledger.

Store parameters take a folder path, `file:///path`, `s3://bucket/prefix` or `block:NAME`;
relative paths are relative to the project folder deployments run in.
"""

from __future__ import annotations

from typing import Annotated, Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import NAME_PATTERN
from concord_pipelines.flows._report import cluster, human, md_facts, md_table, short
from concord_pipelines.tasks import federate_task, verify_ledger_task

Tenant = Annotated[str, Field(pattern=NAME_PATTERN, description="The tenant: its adapters are the refs TENANT/NAME.")]
Clusters = Annotated[
    list[str], Field(min_length=1, description="Cluster stores, searched in order for each adapter; the first receives the result.")
]
Adapters = Annotated[
    list[Annotated[str, Field(pattern=r"^[^\s/]+(/[^\s/]+)?$")]],
    Field(min_length=1, description="Adapter refs: NAME or TENANT/NAME."),
]
Rank = Annotated[int, Field(ge=1, description="exact only: cap each module's rank (empty: the exact rank).")]
Weight = Annotated[float, Field(ge=0)]
ClipNorm = Annotated[float, Field(gt=0, description="Scale down client updates whose norm exceeds this.")]
OutName = Annotated[str, Field(pattern=NAME_PATTERN, description="The result's ref is TENANT/OUT_NAME.")]
BaseRef = Annotated[str, Field(pattern=r"^[^\s/]+(/[^\s/]+)?$", description="fedex only: the base model's ref (empty: TENANT/OUT_NAME-base).")]
BlockName = Annotated[str, Field(min_length=1, description="The name of a saved Concord Trust block.")]
Threshold = Annotated[int, Field(ge=1, description="How many distinct trusted keys must sign each round and the head.")]


@flow(name="lora-federation", **ENDED_HOOKS)
def lora_federation(
    tenant: Tenant,
    clusters: Clusters,
    adapters: Adapters,
    method: Literal["exact", "stack", "fedavg", "fedex"] = "exact",
    rank: Rank | None = None,
    weights: list[Weight] | None = None,
    clip_norm: ClipNorm | None = None,
    robust: Literal["none", "krum", "trimmed"] = "none",
    out_name: OutName = "federated",
    record_lineage: bool = True,
    tracking_uri: str | None = None,
    trust_block: str | None = None,
    cosigner_blocks: list[BlockName] | None = None,
    trust_threshold: Threshold | None = None,
    base: BaseRef | None = None,
) -> dict:
    """Aggregate one tenant's LoRA adapters from the clusters into one adapter, replicate it to
    every cluster, and append the round to the tenant's ledger.

    A round never reads or writes another tenant's refs or ledger: naming another tenant's
    adapter fails the run before any store is read. The worker remembers how far each ledger
    went (in its own CONCORD_HOME): a ledger rolled back below that fails the run before any
    adapter is read, and the ledger check afterwards reports it.

    Args:
        tenant: The tenant whose adapters are aggregated.
        clusters: The cluster stores; each adapter is looked up in them in order, the result is
            snapshotted into the first and replicated to the others (only missing chunks move).
        adapters: The adapter refs, as NAME or TENANT/NAME.
        method: exact (the weighted mean of the clients' updates, refactored to its true rank),
            stack (the clients' factors side by side), fedavg (the mean of the A and B
            factors: needs equal ranks, not exact), or fedex (the mean of the factors at the
            clients' rank, the rest of the exact mean folded into the base model: exact at a
            fixed rank; needs base on the first round).
        rank: exact only: keep each module's largest singular values up to this rank; empty for
            the exact rank.
        weights: One weight per adapter (normalised); empty for equal weights.
        clip_norm: Scale down client updates whose norm exceeds this; empty for no clipping.
        robust: Reject outlying clients: none, krum or trimmed (clients over 10x the median
            update norm are always rejected).
        out_name: The result's ref is TENANT/OUT_NAME.
        record_lineage: Register the result as MLflow model version TENANT-OUT_NAME. Never
            fails the round: a lineage failure is logged.
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database).
        trust_block: A saved Concord Trust block: its signing key (the first cluster's) signs
            the round, its trusted keys (and threshold) check every round of the ledger afterwards.
        cosigner_blocks: The trust blocks of the other clusters, in the clusters' order: each
            cluster checks the aggregate it received, then its block's key co-signs the round and
            the head. Empty: only the first cluster signs.
        trust_threshold: How many distinct trusted keys must have signed each round and the head
            (empty: the trust block's threshold).
        base: fedex only: the ref of the base model the adapters were trained on; empty for the
            tenant's folded base of the round before (TENANT/OUT_NAME-base).
    """
    r = federate_task(
        tenant,
        clusters,
        adapters,
        method=method,
        rank=rank,
        weights=weights or None,
        clip_norm=clip_norm,
        robust=robust,
        out_name=out_name,
        record_lineage=record_lineage,
        tracking_uri=tracking_uri or None,
        trust_block=trust_block or None,
        cosigner_blocks=cosigner_blocks or None,
        base=base or None,
    )
    ledger = verify_ledger_task(
        clusters[0], tenant, trust_block or None, threshold=trust_threshold
    )  # the spec, not the URI: a block's credentials stay with it
    r["ledger_report"] = ledger

    create_table_artifact(
        [
            {
                "client": c["adapter"],
                "cluster": cluster(c["cluster"]),
                "norm": round(c["norm"], 6),
                "distance": round(c["distance"], 6),
                "weight": round(c["weight"], 6),
                "status": ("accepted, clipped" if c["clipped"] else "accepted") if c["accepted"] else "rejected",
                "reason": c["reason"] or "",
            }
            for c in r["clients"]
        ],
        key="federation-clients",
        description=f"{tenant} round {r['round']}: {sum(c['accepted'] for c in r['clients'])} of {len(r['clients'])} client(s) accepted",
    )
    err = "n/a" if r["relative_error"] is None else f"{r['relative_error']:.3g}"
    lineage = r["lineage"]
    if lineage is None:
        lineage_text = "(not recorded)"
    elif "version" in lineage:
        lineage_text = f"`{lineage['name']}` version {lineage['version']}"
    else:
        lineage_text = f"**not recorded**: {lineage['error']}"
    verdict = "verifies" if ledger["ok"] else "**does not verify**: " + "; ".join(ledger["problems"])
    rows = [
        ("method", f"{r['method']} (robust: {r['robust']})"),
        ("rank", f"{r['rank']} (clients: {', '.join(map(str, r['client_ranks']))})"),
        ("relative error", err),
        ("result", f"`{r['ref']}` → {short(r['root'])}"),
        ("ledger", f"round {r['round']}, hash {short(r['hash'])}, prev {short(r['prev'])} in {cluster(r['ledger'])}; {ledger['rounds']} round(s), {verdict}"),
        ("lineage", lineage_text),
        ("signed by", ", ".join(ledger.get("signed_by", {}).get(str(r["round"]), [])) or (
            f"{len(r['signatures'])} key(s), not checked (no trust policy)" if r["signatures"] else "nobody (no signing key)")),
    ]
    if r.get("base"):
        b = r["base"]
        rows.append(("folded base", f"`{b['from']}` {short(b['parent'])} → `{b['ref']}` {short(b['root'])}: {b['modules']} module(s), "
                                    f"{human(b['folded_bytes'])} folded, share {r['residual_share']:.3g} of the update"))
    signers = md_table(["round", "signed by"], [(n, ", ".join(names) or "(none)") for n, names in ledger.get("signed_by", {}).items()])
    replicas = md_table(
        ["cluster", "root", "chunks sent", "bytes sent", "ref version"],
        [(cluster(p["store"]), short(p["root"]), p["chunks_sent"], human(p["bytes_sent"]), p["ref_version"]) for p in r["replicas"]],
    )
    inputs = md_table(["adapter", "root", "found in"], [(f"`{i['adapter']}`", short(i["root"]), cluster(i["cluster"])) for i in r["inputs"]])
    create_markdown_artifact(
        f"## Federation round {r['round']} of `{tenant}`\n\n"
        + md_facts(rows)
        + f"\n\n### Inputs\n\n{inputs}\n\n### Result on every cluster\n\n{replicas}\n"
        + (f"\n### Who signed each round\n\n{signers}\n" if ledger.get("signed_by") else ""),
        key="federation-summary",
        description=f"{tenant} round {r['round']}: {r['method']} → {r['root'][:12]}",
    )
    return r
