"""Model version tasks: register a snapshot as a version, promote it through the gate, record
which stores hold it, and read its lineage.

Thin wrappers over ``concord.lineage.Lineage``, as the tasks of :mod:`concord_pipelines.tasks.lineage` are: each
checks the tracking backend first, opens the stores from their specs, calls the core, emits an
event and returns a plain dict. A model version is named ``name/version``; a snapshot as a ref,
``ref~N`` or a 64-hex root; data and contracts as :mod:`concord_pipelines.tasks.lineage` names them.

Events (a ``concord.promotion.refused`` is what an automation pages on; every name is in
:mod:`concord_pipelines.tasks.events`): ``concord.model.registered``, ``concord.model.promoted``,
``concord.promotion.refused``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from prefect import task

from concord.lineage.client import shown_uri, sqlite_file
from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, named_by, open_stores
from concord_pipelines.tasks.lineage import checked_lineage, data_snapshot_id
from concord_pipelines.tasks.progress import run_logger

# ----------------------------------------------------------------------------- model versions


@task(name="register-model", **RETRIED)
def register_model_task(
    name: str,
    stores: str | Sequence[str],
    snapshot: str,
    data_snapshot: str | None = None,
    contract: str | None = None,
    parents: Sequence[str] = (),
    tiers: dict[str, str] | None = None,
    description: str = "",
    data_store: str | None = None,
    contracts_store: str | None = None,
    tracking_uri: str | None = None,
) -> dict:
    """Register snapshot ``snapshot`` (a ref, ``ref~N`` or a 64-hex root, looked up in the first
    of ``stores``) as a new version of model ``name`` in MLflow's registry.

    Every store of ``stores`` that holds the snapshot is recorded as a holder (tier from
    ``tiers``, keyed by spec or URI; default ``hot``). ``data_snapshot`` (an id, or a ref such as
    ``data/penguins``, resolved in the first store unless ``data_store`` is given) is looked up in
    ``data_store`` (default: ``stores``), ``contract`` (``name@version``) in ``contracts_store``
    (default: ``stores``); ``parents`` are
    ``name/version`` of registered versions. Emits ``concord.model.registered``.

    The tracking backend is checked before any store is read; the only errors retried (a
    server or store that does not answer) come before anything is written to MLflow.
    """
    specs = [stores] if isinstance(stores, str) else list(stores)
    if not specs:
        raise ValueError("no stores given: name at least the store that holds the snapshot")
    from concord.lineage.tags import TAG_CONTRACT, TAG_CONTRACT_DIGEST, TAG_DATA_NAME, TAG_STORE, replicas_of
    from concord.snapshots.refs import resolve_root

    lineage = checked_lineage(tracking_uri)
    # a store is opened only when it is looked in (opening a folder store creates it)
    with open_stores(*specs, data_store if data_snapshot else None, contracts_store if contract else None) as opened:
        held, ds, cs = opened[: len(specs)], opened[-2], opened[-1]
        root = resolve_root(held[0], snapshot.strip())
        data_id = data_snapshot_id(ds or held[0], data_snapshot) if data_snapshot else None
        r = lineage.register_model_version(
            name,
            root,
            held,
            data_snapshot=data_id,
            contract=contract or None,
            parents=list(parents),
            tiers=tiers,
            description=description,
            data_store=ds,
            contracts_store=cs,
        )
    tags = r["tags"]
    out = r | {
        "snapshot": snapshot,
        "store": tags[TAG_STORE],
        "held_by": replicas_of(tags),
        "data_snapshot": data_id,
        "data_name": tags.get(TAG_DATA_NAME),
        "contract": tags.get(TAG_CONTRACT),
        "contract_digest": tags.get(TAG_CONTRACT_DIGEST),
        "parents": list(parents),
        "tracking_uri": shown_uri(lineage.tracking_uri),
    }
    related = [events.snapshot(root, "snapshot"), events.store(out["store"], "store")]
    if data_id:
        related.append(events.data(data_id, out["data_name"] or "", "data"))
    if out["contract"]:
        related.append(events.contract(out["contract"], "contract"))
    related += [events.model(*p.rsplit("/", 1), role="parent") for p in out["parents"]]
    fields = ("name", "version", "root", "source", "store", "held_by", "data_snapshot", "contract", "parents", "run_id")
    out["event_id"] = events.emit(events.MODEL_REGISTERED, events.model(name, r["version"]), related, {k: out[k] for k in fields})
    run_logger().info(
        "%s/%s registered: snapshot %s in %s, held by %d store(s)%s%s%s",
        name, r["version"], root[:12], out["store"], len(out["held_by"]),
        f", data {data_id[:12]}" if data_id else "",
        f", contract {out['contract']}" if out["contract"] else "",
        f", parents {', '.join(out['parents'])}" if out["parents"] else "",
    )
    return out


@task(name="promote", **RETRIED)
def promote_task(
    name: str,
    version: str | int,
    alias: str,
    data_store: str,
    contracts_store: str,
    tracking_uri: str | None = None,
) -> dict:
    """Point ``alias`` of model ``name`` at ``version`` if the promotion gate passes: data and a
    contract recorded, the data valid under the contract, and the contract compatible with the
    one of the version ``alias`` points at now (data in ``data_store``, contracts in
    ``contracts_store``).

    Emits ``concord.model.promoted``, or ``concord.promotion.refused`` and re-raises
    :class:`~concord.errors.PromotionRefused` (its ``reasons`` list every failed check; never retried).
    """
    from concord.errors import PromotionRefused

    lineage = checked_lineage(tracking_uri)
    version = str(version)
    with open_stores(data_store, contracts_store) as (ds, cs):
        try:
            r = lineage.promote(name, version, alias, data_store=ds, contracts=cs)
        except PromotionRefused as exc:
            events.emit(
                events.PROMOTION_REFUSED,
                events.model(name, version),
                [events.store(ds.uri, "data-store"), events.store(cs.uri, "contract-store")],
                {"name": name, "version": version, "alias": alias, "reasons": exc.reasons},
            )
            raise  # Prefect logs the failed task run with every reason
    checks = r["checks"]
    out = r | {"data_store": ds.uri, "contracts_store": cs.uri, "tracking_uri": shown_uri(lineage.tracking_uri)}
    related = [events.store(ds.uri, "data-store"), events.store(cs.uri, "contract-store")]
    if "contract" in checks:
        related.append(events.contract(checks["contract"]["ref"], "contract"))
    if "validation" in checks:
        related.append(events.data(checks["validation"]["data_snapshot"], role="data"))
    if checks.get("previous"):
        related.append(events.model(*checks["previous"].rsplit("/", 1), role="previous"))
    payload = {"name": name, "version": version, "alias": alias, "time": r["time"], "previous": checks.get("previous")}
    out["event_id"] = events.emit(events.MODEL_PROMOTED, events.promoted_model(name, version, alias), related, payload)
    run_logger().info("%s/%s is now %r (was %s)", name, version, alias, checks.get("previous") or "unset")
    return out


@task(name="record-replica", task_run_name=named_by("record-replica", "store"), **RETRIED)
def record_replica_task(root: str, store: str, tier: str = "hot", tracking_uri: str | None = None) -> dict:
    """Record that ``store`` holds snapshot ``root`` on ``tier``, on every model version
    registered with that root (none registered: nothing to record).

    An embedded sqlite database that does not exist yet holds no versions: it is left
    uncreated rather than made just to find that out.
    """
    from concord.lineage import Lineage

    lineage = Lineage(tracking_uri)
    out = {"root": root, "store": store, "tier": tier, "updated": [], "tracking_uri": shown_uri(lineage.tracking_uri)}
    db = sqlite_file(lineage.tracking_uri)
    if db is not None and not os.path.exists(db):
        run_logger().info("no lineage database at %s yet: no model version to record %s on", db, store)
        return out
    lineage.ensure_ready()
    with open_stores(store) as (s,):
        out["store"] = s.uri
        out["updated"] = lineage.record_replica(root, s, tier)
    run_logger().info(
        "%s (%s) recorded as a holder of %s on %s",
        s.uri, tier, root[:12], ", ".join(out["updated"]) or "no model version (none registered with this root)",
    )
    return out


# ----------------------------------------------------------------------------- reading


@task(name="model-lineage", **RETRIED)
def model_lineage_task(name: str, version: str | int, tracking_uri: str | None = None) -> dict:
    """Everything recorded about ``name``/``version`` (snapshot, data, contract, parents, holders,
    aliases, dataset inputs), with the lineage graph of model ``name`` as ``graph`` and as a
    Mermaid flowchart in ``mermaid``."""
    from concord.lineage.graph import to_mermaid

    lineage = checked_lineage(tracking_uri)
    out = lineage.model_lineage(name, str(version))
    graph = lineage.lineage_graph(name)
    return out | {"graph": graph, "mermaid": to_mermaid(graph), "tracking_uri": shown_uri(lineage.tracking_uri)}

