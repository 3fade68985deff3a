"""Drift audit tasks: data drift with its nightly history, contract validation, replica weights,
model cards, the MLflow run of an audit and its event.

Thin wrappers over :mod:`concord.audit.nightly`, :mod:`concord.audit.inputs`,
:mod:`concord.audit.replicas` and :mod:`concord.audit.model_cards`: each opens its stores from
their specs, calls the core and returns a plain dict. Reading is safe to repeat, so every task that reads a store is retried when the store
does not answer; recording a night twice replaces the first record.

Logging an audit to MLflow never fails the audit: when MLflow cannot be written, a warning is
logged and the report stands on its Prefect artifacts.

Events (an automation notifies on ``concord.drift.detected``; every name is in :mod:`concord_pipelines.tasks.events`)::

    concord.drift.detected   resource concord.audit.<name>   severity warning (P1) or critical (P0)
    concord.drift.audited    resource concord.audit.<name>   severity ok

The resource carries the labels ``concord.severity`` and ``concord.priority`` (P0, P1, or
"none"), so an automation's trigger can match a P0 alone without reading the payload.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE

from concord.audit.tracking import AUDIT_EXPERIMENT
from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, open_stores, store_name
from concord_pipelines.tasks.progress import PrefectProgress, run_logger

if TYPE_CHECKING:  # pragma: no cover
    from concord.lineage import Lineage


def _related(report: dict) -> list[dict[str, str]]:
    """The data snapshots, contract, model version and stores an audit speaks about."""
    out = []
    for side in ("reference", "current"):
        src = report.get(side) or {}
        if src.get("kind") == "snapshot" and src.get("id"):
            out.append(events.data(src["id"], src.get("name") or "", side))
    contract = report.get("contract") or {}
    if contract.get("ref"):
        out.append(events.contract(contract["ref"], "contract"))
    model = report.get("model") or {}
    if model.get("name") and model.get("version"):
        out.append(events.model(model["name"], model["version"], "model"))
    if model.get("root"):
        out.append(events.snapshot(model["root"], "snapshot"))
    for r in (report.get("replicas") or {}).get("replicas", []):
        if r.get("store"):
            out.append(events.store(r["store"], f"replica-{r.get('cluster')}"))
    return out


# ----------------------------------------------------------------------------- data


@task(name="data-drift", **RETRIED)
def data_drift_task(
    reference: str,
    current: str,
    data_store: str | None = None,
    history_store: str | None = None,
    name: str | None = None,
    night: str | None = None,
    thresholds: dict | None = None,
    bins: int = 10,
    columns: Sequence[str] | None = None,
    plots_dir: str | None = None,
    draw_plots: bool = True,
    profile: str = "create",
) -> dict:
    """Compare the current table with its reference column by column, with the previous nights.

    ``reference`` and ``current`` are .parquet/.csv files, data snapshot ids or ``data/<name>``
    refs in ``data_store``. With ``history_store``, the column severities of the unbroken run of
    nights before ``night`` (YYYY-MM-DD, UTC; default today) under the audit ``name`` (default:
    from the two tables' names) escalate lasting warnings, and tonight's are recorded there. With
    ``draw_plots``, a PNG overlay per drifted column is written into ``plots_dir`` (default
    ``$CONCORD_HOME/audits/<name>/<night>``). ``profile``: how a reference data snapshot's stored
    profile is taken ("create", "use", "off"; :func:`concord.audit.nightly.nightly_drift`).

    Returns ``{name, night, drift: DriftReport.to_dict(), reference, current: TableSource dicts,
    history, history_key, plots: {column: path}}``.
    """
    from concord.audit.drift import DriftThresholds
    from concord.audit.nightly import nightly_drift

    limits = DriftThresholds(**(thresholds or {}))  # refused before any store is opened
    with open_stores(data_store, history_store) as (ds, hs):
        r = nightly_drift(
            reference, current, ds, hs, name=name, night=night, thresholds=limits, bins=bins, columns=columns,
            plots_dir=plots_dir, draw_plots=draw_plots, profile=profile,
        )
    log, drift = run_logger(), r["drift"]
    for c in drift["columns"]:
        if c["severity"] != "ok":
            (log.error if c["severity"] == "critical" else log.warning)("%s: %s", c["column"], c["finding"])
    log.info(
        "data drift %s → %s: %s, %d of %d column(s) drifted; %d PNG(s)", r["reference"]["label"], r["current"]["label"],
        drift["severity"], drift["columns_drifted"], drift["columns_compared"], len(r["plots"]),
    )
    return r


@task(name="audit-contract", **RETRIED)
def audit_contract_task(contract: str, contracts_store: str, current: str, data_store: str | None = None) -> dict:
    """Validate the current table (a file, a data snapshot id or ``data/<name>`` in
    ``data_store``) against ``contract`` (``name@version``, ``name`` for its latest, or a .json
    file) of ``contracts_store`` with great-expectations. Returns the audit's contract section
    (``check_contract``): a violation is reported, not raised."""
    from concord.audit.inputs import check_contract, load_table
    from concord.lineage.contracts import load_contract

    with open_stores(contracts_store, data_store) as (cs, ds):
        c = load_contract(cs, contract)
        df, src = load_table(current, ds, which="current")
    out = check_contract(c, df) | {"data": src.to_dict()}
    log = run_logger()
    if out["ok"]:
        log.info("%s meets contract %s (%d expectations)", src.label, c.ref, out["evaluated"])
    else:
        log.error("%s violates contract %s: %d of %d expectation(s) failed", src.label, c.ref, len(out["failed"]), out["evaluated"])
    return out


# ----------------------------------------------------------------------------- weights and cards


@task(name="model-holders", **RETRIED)
def model_holders_task(model: str, version: str, tracking_uri: str | None = None) -> dict:
    """The snapshot root of model version ``model``/``version`` (a number or an alias such as
    champion) and the stores lineage records as holding it: ``{name, version, root, stores}``."""
    from concord.audit.inputs import model_holders
    from concord.lineage import Lineage

    lineage = Lineage(tracking_uri)
    lineage.ensure_ready()  # an unreachable server is a ConnectionError: retried
    out = model_holders(lineage, model, version)
    run_logger().info("%s/%s: root %s held by %s", out["name"], out["version"], out["root"][:12], ", ".join(map(store_name, out["stores"])))
    return out


@task(name="audit-replicas", **RETRIED)
def audit_replicas_task(
    snapshot: str, stores: Sequence[str], reference: str | None = None, max_ulps: int = 1, top: int = 10, trust_block: str | None = None
) -> dict:
    """Compare snapshot ``snapshot`` (a ref or a root) on every store with the first store's (or
    ``reference``'s, a cluster label): by Merkle root, then tensor by tensor in ULPs of the lower
    precision. Clusters are labelled by the stores' last path segments. Under a trust policy (the
    trust block ``trust_block``, else ``$CONCORD_TRUSTED_KEYS``) a root no trusted key signed, on
    any cluster, is critical. Returns ``ReplicaReport.to_dict()``: differences are reported, not raised."""
    from concord.audit.inputs import store_labels
    from concord.audit.replicas import compare_replicas
    from concord_pipelines.tasks.trust import trust_policy

    specs = list(stores)
    labels = store_labels(specs)
    with open_stores(*specs) as opened:
        r = compare_replicas(
            {label: (s, snapshot) for label, s in zip(labels, opened)},
            reference=reference or None, max_ulps=max_ulps, top=top, progress=PrefectProgress(), trust=trust_policy(trust_block),
        ).to_dict()
    log = run_logger()
    for x in r["replicas"]:
        (log.info if x["severity"] == "ok" else log.error if x["severity"] == "critical" else log.warning)("%s: %s", x["cluster"], x["finding"])
    return r


@task(name="audit-cards", **RETRIED)
def audit_cards_task(snapshot: str, stores: Sequence[str], required: Sequence[str] | None = None, reference: str | None = None) -> dict:
    """Compare the model card of snapshot ``snapshot`` on every store with the first store's (or
    ``reference``'s, a cluster label), and check the required fields (``required``; default: the
    core's list). Returns ``CardReport.to_dict()``."""
    from concord.audit.inputs import store_labels
    from concord.audit.model_cards import compare_cards

    specs = list(stores)
    labels = store_labels(specs)
    kwargs = {"required": tuple(required)} if required else {}
    with open_stores(*specs) as opened:
        r = compare_cards({label: (s, snapshot) for label, s in zip(labels, opened)}, reference=reference or None, **kwargs).to_dict()
    run_logger().info("model cards of %s across %d store(s): %s", snapshot[:12] if len(snapshot) == 64 else snapshot, len(specs), r.get("severity"))
    return r


# ----------------------------------------------------------------------------- MLflow and the event


@task(name="log-audit", cache_policy=NO_CACHE)
def log_audit_task(
    report: dict,
    markdown: str,
    name: str,
    night: str,
    plots: Sequence[str] = (),
    params: dict | None = None,
    tracking_uri: str | None = None,
) -> str | None:
    """Log an audit as one run of the MLflow experiment ``concord-drift-audits``: per column
    ``psi/<column>``, ``ks/<column>``, ``js/<column>`` (where they apply), ``drift_share`` and
    the counts as metrics; thresholds and inputs as parameters; the PNGs under ``histograms/``,
    ``report.json`` and ``report.md`` as artifacts; the markdown also as the run's description.
    Returns the run id.

    Never fails the audit: when MLflow cannot be written, a warning is logged and None returned.
    """
    from concord.lineage import Lineage

    log = run_logger()
    lineage = Lineage(tracking_uri)
    try:
        run_id = _log_audit(lineage, report, markdown, name, night, list(plots), params or {})
    except Exception as exc:  # the report stands on its Prefect artifacts without MLflow
        log.warning("audit %s not logged to MLflow at %r: %s", name, lineage, " ".join(str(exc).split())[:500])
        return None
    log.info("audit %s logged to MLflow run %s (experiment %s)", name, run_id, AUDIT_EXPERIMENT)
    return run_id


def _log_audit(lineage: Lineage, report: dict, markdown: str, name: str, night: str, plots: list[str], params: dict) -> str:
    from concord.audit.tracking import log_audit

    return log_audit(lineage, report, markdown, name=name, night=night, plots=plots, params=params)


@task(name="audit-event", cache_policy=NO_CACHE)
def audit_event_task(report: dict, name: str, night: str, run_id: str | None = None, plots: Sequence[str] = ()) -> str | None:
    """Emit ``concord.drift.detected`` (severity and priority in the payload) when the audit's
    severity is not ok, else ``concord.drift.audited``; resource ``concord.audit.<name>``.
    Returns the event's id."""
    from concord.audit.nightly import audit_summary

    payload = audit_summary(report, name=name, night=night, run_id=run_id, plots=plots, items=events.PAYLOAD_ITEMS)
    event = events.DRIFT_AUDITED if report["severity"] == "ok" else events.DRIFT_DETECTED
    resource = events.audit(name, report["severity"], report.get("priority"))
    event_id = events.emit(event, resource, _related(report), payload)
    level = {"ok": logging.INFO, "warning": logging.WARNING}.get(report["severity"], logging.ERROR)
    run_logger().log(level, "audit %s: %s", name, report.get("verdict"))
    return event_id
