"""The nightly audit's own steps, beyond the report: tonight's data drift, and what is said about it.

:func:`nightly_drift` compares the current table with its reference (both read in batches, so
memory does not grow with them; a reference data snapshot through its stored profile, made the
first night, so that the nights after read only the current table), escalates lasting warnings with the nights before (a history
store), records tonight for the next night, and draws a PNG overlay per drifted column.
:func:`audit_summary` is what a notification about a finished audit carries: its verdict and
severities, the worst columns, the contract's failures, the replicas and the model cards, each
list cut to a few items (the report itself has them all).

The pipelines call these (``tasks/audit.py``); the CLI's one-off audit reads no history.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from concord.audit.severity import column_order

if TYPE_CHECKING:  # pragma: no cover
    from concord.audit.drift import DriftThresholds
    from concord.stores.base import Store

__all__ = ["audit_summary", "nightly_drift", "plots_folder"]


def plots_folder(name: str, night: str) -> str:
    """Where an audit's PNGs go unless told: ``$CONCORD_HOME/audits/<name>/<night>``."""
    from concord.home import concord_home

    return os.path.join(concord_home(), "audits", name, night)


def nightly_drift(
    reference: str,
    current: str,
    data_store: Store | None = None,
    history_store: Store | None = None,
    *,
    name: str | None = None,
    night: str | None = None,
    thresholds: DriftThresholds | Mapping[str, Any] | None = None,
    bins: int = 10,
    columns: Sequence[str] | None = None,
    plots_dir: str | None = None,
    draw_plots: bool = True,
    profile: str = "create",
) -> dict:
    """Tonight's data drift of ``current`` against ``reference`` (files, data snapshot ids or
    ``data/<name>`` refs in ``data_store``).

    With ``history_store``, the column severities of the unbroken run of nights before ``night``
    (YYYY-MM-DD, UTC; default today) under the audit ``name`` (default: from the two tables'
    names) escalate lasting warnings, and tonight's are recorded there. With ``draw_plots``, a PNG
    overlay per drifted column is written into ``plots_dir`` (default :func:`plots_folder`).
    ``thresholds`` are :class:`~concord.audit.drift.DriftThresholds` or their keywords.

    ``profile`` ("create", "use" or "off"; :func:`~concord.audit.inputs.open_reference`): a
    reference data snapshot with a stored profile is audited against the profile alone, without
    reading the table (memory flat in its size); with "create", one without is profiled tonight,
    as it is read, and the profile stored beside it (and written, as ``reference.profile``, beside
    the PNGs, for the audit's MLflow run), so that the next nights read only the current table. A
    table file's profile is kept in ``history_store``, keyed by the BLAKE3 of its bytes.

    Returns ``{name, night, drift: DriftReport.to_dict(), reference, current: TableSource dicts,
    history, history_key, plots: {column: path}}``.
    """
    from concord.audit.drift import DriftThresholds
    from concord.audit.history import night_of, previous_nights, record_night
    from concord.audit.inputs import OpenProfile, audit_name, open_reference, open_table, stream_drift
    from concord.audit.render import plot_histograms_by_column

    limits = thresholds if isinstance(thresholds, DriftThresholds) else DriftThresholds(**(thresholds or {}))
    with open_reference(reference, data_store, profile=profile, profile_store=history_store) as ref, open_table(current, data_store, which="current") as cur:
        ref_src, cur_src = ref.source, cur.source
        name = name or audit_name(ref_src.name, cur_src.name)
        history = previous_nights(history_store, name, night) if history_store is not None else {}
        report = stream_drift(ref, cur, columns=list(columns) if columns else None, thresholds=limits, bins=bins, history=history)
    key = record_night(history_store, name, report.severities(), night, severity=report.severity) if history_store is not None else None
    tonight = night_of(night).isoformat()
    if isinstance(ref, OpenProfile) and ref.created:  # made tonight: kept beside the PNGs for the run
        from dataclasses import replace

        from concord.audit.profile import PROFILE_FILE

        kept = os.path.join(plots_dir or plots_folder(name, tonight), PROFILE_FILE)
        ref.profile.save(kept)
        ref_src = replace(ref_src, profile_file=kept)
    plots = plot_histograms_by_column(report, out_dir=plots_dir or plots_folder(name, tonight)) if draw_plots else {}
    return {
        "name": name,
        "night": tonight,
        "drift": report.to_dict(),
        "reference": ref_src.to_dict(),
        "current": cur_src.to_dict(),
        "history": history,
        "history_key": key,
        "plots": plots,
    }


def audit_summary(
    report: Mapping[str, Any],
    *,
    name: str,
    night: str,
    run_id: str | None = None,
    plots: Sequence[str] = (),
    items: int = 20,
) -> dict:
    """What a notification says about the audit ``name`` of ``night`` (its report's dict, its
    MLflow run, its PNGs): severity, priority and verdict, the drifted columns worst first, and
    the contract, replicas and cards sections, with at most ``items`` of each list."""
    drifted = [
        {k: c.get(k) for k in ("column", "severity", "priority", "psi", "escalated", "finding")}
        for c in sorted((c for c in report.get("columns", []) if c["severity"] != "ok"), key=column_order)
    ]
    out: dict[str, Any] = {
        "audit": name,
        "night": night,
        "severity": report["severity"],
        "priority": report.get("priority"),
        "verdict": report.get("verdict"),
        "sections": report.get("sections"),
        "errors": report.get("errors") or {},
        "drift_share": report.get("drift_share"),
        "drifted_columns": drifted[:items],
        "drifted_count": len(drifted),
        "mlflow_run_id": run_id,
        "plots": list(plots),
    }
    contract = report.get("contract")
    if contract:
        failed = contract.get("failed", [])
        out["contract"] = {"ref": contract.get("ref"), "ok": contract.get("ok"), "failed": failed[:items], "failed_count": len(failed)}
    replicas = report.get("replicas")
    if replicas:
        out["replicas"] = [
            {k: r.get(k) for k in ("cluster", "store", "severity", "identical", "finding")} for r in replicas.get("replicas", [])
        ][:items]
    cards = report.get("cards")
    if cards:
        out["cards"] = {
            "severity": cards.get("severity"),
            "clusters": [
                {
                    "cluster": c.get("cluster"),
                    "severity": c.get("severity"),
                    "finding": c.get("finding"),
                    "missing_required": c.get("missing_required", []),
                    "differing": [d.get("field") for d in c.get("differing", [])],
                }
                for c in cards.get("clusters", [])[:items]
            ],
        }
    for side in ("reference", "current"):
        if report.get(side):
            out[side] = {k: report[side].get(k) for k in ("label", "kind", "id", "path")}
    if report.get("model"):
        out["model"] = report["model"]
    return out
