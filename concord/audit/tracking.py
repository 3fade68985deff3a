"""An audit as an MLflow run: one run of the experiment ``concord-drift-audits`` per audit.

The nightly flow and ``concord audit … --track`` log an audit through :func:`log_audit`, with the
report as :func:`run_markdown` renders it and the parameters :func:`audit_params` lists, so its
run is the same whichever wrote it: per column ``psi/<column>``, ``ks/<column>``,
``js/<column>``, its p-value (``pvalue/``, ``pvalue_adjusted/``) and effect (``effect/``,
``mean_shift/``, ``scale_ratio/``, ``new_share/``, ``new_share_expected/``) and
``severity_rank/<column>`` (where they apply: :func:`column_metrics`), ``drift_share``,
``severity_rank`` and the counts as metrics;
the inputs, thresholds and bins as parameters (and ``reference_profile`` when the reference was a
profile); the PNGs under ``histograms/``, ``report.json`` and ``report.md`` as artifacts (and the
profile file under ``profile/`` when it is at hand: a profile file, or one made by this audit); the
markdown also as the run's description. The run itself is written
by :meth:`concord.lineage.Lineage.log_run`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from concord.audit.drift import SEVERITIES, DriftThresholds

if TYPE_CHECKING:  # pragma: no cover
    from concord.audit.report import AuditReport
    from concord.lineage import Lineage

#: the MLflow experiment every audit is logged to, one run per audit
AUDIT_EXPERIMENT = "concord-drift-audits"
#: MLflow keeps a tag value of at most this many characters (the run's description is a tag)
NOTE_CHARS = 5000
#: run tags short enough to read in MLflow's run list: ``ok``, ``warning`` or ``critical``; P0, P1 or empty
TAG_SEVERITY = "severity"
TAG_PRIORITY = "priority"


def audit_run_name(name: str, night: str, severity: str, priority: str | None = None) -> str:
    """``<name>-<night>``, and `` [P0 critical]`` (or `` [P1 warning]``) after it when the audit pages."""
    base = f"{name}-{night}"
    return f"{base} [{priority} {severity}]" if priority and severity != "ok" else base


def audit_run(
    report: dict,
    markdown: str,
    *,
    name: str,
    night: str,
    plots: Sequence[str | os.PathLike] = (),
    params: Mapping[str, Any] | None = None,
) -> dict:
    """The run of an audit (``AuditReport.to_dict()`` and its markdown) as keyword arguments of
    :meth:`~concord.lineage.Lineage.log_run`: run ``<name>-<night>``, with `` [P0 critical]`` or
    `` [P1 warning]`` after it when the night pages (:func:`audit_run_name`), and the tags
    ``severity`` and ``priority``, so a bad night stands out in MLflow's run list and can be
    filtered (``tags.severity = 'critical'``); ``params`` (values cut to 500 characters), then the
    report's thresholds and bins, as parameters."""
    metrics = {"severity_rank": float(SEVERITIES.index(report["severity"]))}
    if report.get("drift_share") is not None:
        metrics["drift_share"] = float(report["drift_share"])
    if "columns" in report:
        metrics["columns_drifted"] = float(report.get("columns_drifted", 0))
        metrics["columns_compared"] = float(report.get("columns_compared", 0))
    for c in report.get("columns", []):
        metrics.update(column_metrics(c))
    contract = report.get("contract")
    if contract:
        metrics["contract_failed"] = float(len(contract.get("failed", [])))
    replicas = report.get("replicas")
    if replicas:
        metrics["replicas_not_ok"] = float(sum(1 for r in replicas.get("replicas", []) if r.get("severity") != "ok"))
    logged_params = {k: ("" if v is None else str(v))[:500] for k, v in (params or {}).items()}
    for k, v in (report.get("thresholds") or {}).items():
        logged_params.setdefault(k, str(v))
    if report.get("bins") is not None:
        logged_params.setdefault("bins", str(report["bins"]))
    files = {"histograms": list(plots)}
    reference = report.get("reference") or {}
    if reference.get("profile"):  # audited against a reference profile: which one, and the file when at hand
        logged_params.setdefault("reference_profile", str(reference["profile"]))
    if reference.get("profile_file") and os.path.isfile(reference["profile_file"]):
        files["profile"] = [reference["profile_file"]]
    return {
        "experiment": AUDIT_EXPERIMENT,
        "run_name": audit_run_name(name, night, report["severity"], report.get("priority")),
        "tags": {
            TAG_SEVERITY: report["severity"],
            TAG_PRIORITY: report.get("priority") or "",
            "concord.audit.name": name,
            "concord.audit.night": night,
            "concord.audit.severity": report["severity"],
            "concord.audit.priority": report.get("priority") or "",
        },
        "params": logged_params,
        "metrics": metrics,
        "files": files,
        "texts": {
            "report.json": json.dumps(report, indent=1, sort_keys=True, default=str),
            "report.md": markdown,
        },
        "description": _note(markdown),
    }


#: a column's statistics logged as metrics ``<name>/<column>``, where they apply: the divergences;
#: the rule's p-value (its tests combined) and that p-value adjusted over the audit's columns
#: (Benjamini–Hochberg: what ``alpha`` judges); the effect the floor judges (numeric: Wasserstein
#: distance in reference σ, categorical: share of mass moved) and its readable parts
COLUMN_METRICS = {
    "psi": "psi", "ks": "ks", "js": "js",
    "pvalue": "pvalue", "pvalue_adjusted": "pvalue_adjusted",
    "effect_size": "effect", "mean_shift": "mean_shift", "scale_ratio": "scale_ratio",
    "new_share": "new_share", "new_share_expected": "new_share_expected",
}


def column_metrics(column: Mapping[str, Any]) -> dict[str, float]:
    """One column's metrics (a ``ColumnDrift.to_dict()``): each statistic of :data:`COLUMN_METRICS`
    it has, as ``<name>/<column>``, and ``severity_rank/<column>`` (0 ok, 1 warning, 2 critical)
    for a compared column. A statistic that is not a finite number (the mean shift of a constant
    reference) is left out: its finding says it."""
    out: dict[str, float] = {}
    for stat, name in COLUMN_METRICS.items():
        value = column.get(stat)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[_metric_key(name, column["column"])] = float(value)
    if column.get("compared", True) and column.get("severity") in SEVERITIES:
        out[_metric_key("severity_rank", column["column"])] = float(SEVERITIES.index(column["severity"]))
    return out


def audit_params(
    *,
    reference: str | None = None,
    current: str | None = None,
    contract: str | None = None,
    model: str | None = None,
    version: str | None = None,
    ref: str | None = None,
    max_ulps: int = 1,
    bins: int = 10,
    thresholds: Any = None,
) -> dict:
    """An audit's inputs and settings as its run's parameters: those not given left out,
    ``version`` only with a ``model``, and every threshold (``thresholds``: a
    :class:`~concord.audit.drift.DriftThresholds` or anything with its fields; default: its defaults)."""
    limits = DriftThresholds() if thresholds is None else thresholds
    params = {
        "reference": reference, "current": current, "contract": contract, "model": model,
        "version": version if model else None, "ref": ref, "max_ulps": max_ulps, "bins": bins,
        **{f.name: getattr(limits, f.name) for f in dataclasses.fields(DriftThresholds)},
    }
    return {k: v for k, v in params.items() if v is not None}


def run_markdown(report: AuditReport, *, name: str, night: str, plots: Mapping[str, str] | None = None) -> str:
    """The report as the run keeps it (``report.md`` and the description): each drifted column's
    PNG (``plots``: column → file) linked where the run keeps it, ``histograms/<file>``."""
    from concord.audit.render import render_markdown

    logged = {col: f"histograms/{os.path.basename(path)}" for col, path in (plots or {}).items()}
    return render_markdown(report, plots=logged, links={"night": night, "audit": f"`{name}`"})


def log_audit(
    lineage: Lineage,
    report: dict,
    markdown: str,
    *,
    name: str,
    night: str,
    plots: Sequence[str | os.PathLike] = (),
    params: Mapping[str, Any] | None = None,
) -> str:
    """Log an audit as one run of ``concord-drift-audits`` (:func:`audit_run`); return the run id."""
    return lineage.log_run(**audit_run(report, markdown, name=name, night=night, plots=plots, params=params))


def _metric_key(prefix: str, column: str) -> str:
    return f"{prefix}/" + (re.sub(r"[^\w.\- :/]", "_", column)[:200] or "_")


def _note(markdown: str) -> str:
    if len(markdown) <= NOTE_CHARS:
        return markdown
    cut = markdown[: NOTE_CHARS - 200].rsplit("\n", 1)[0]
    return cut + "\n\n… (the whole report is the artifact report.md)\n"
