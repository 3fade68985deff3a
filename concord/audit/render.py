"""An audit report as people read it: markdown, table rows and PNG histograms.

:func:`render_markdown` writes the report a person reads (the verdict first, a summary table, a
section each); :func:`column_rows`, :func:`replica_rows`, :func:`worst_tensor_rows` and
:func:`card_rows` give the rows of its tables (and of the flow's table artifacts);
:func:`plot_histograms` draws each drifted column's reference and current histograms.

numpy and matplotlib are imported inside the functions that draw.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from concord.audit.drift import PRIORITIES, ColumnHistogram, DriftReport, column_histograms
from concord.audit.inputs import slug
from concord.audit.report import AuditReport
from concord.audit.severity import SECTION_TITLES, column_order, section_severity
from concord.files import atomic_write

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "COLUMN_STATISTICS",
    "COLUMN_SUMMARY",
    "PLOT_CATEGORIES",
    "REPLICA_SUMMARY",
    "WORST_TENSOR_SUMMARY",
    "card_rows",
    "column_rows",
    "plot_histograms",
    "plot_histograms_by_column",
    "png_data_uri",
    "render_markdown",
    "replica_rows",
    "worst_tensor_rows",
]

#: categories drawn at most in one categorical overlay (the rest summed as "(other)")
PLOT_CATEGORIES = 25
#: histograms embedded at most in one report (worst first); the others are named, and all are in MLflow
EMBEDDED_PLOTS = 8
#: the largest PNG embedded (a drift overlay is about 35 KB)
EMBEDDED_PNG_BYTES = 512 * 1024
#: the columns of the report's per-column table: narrow enough for the Prefect UI's artifact pane
COLUMN_SUMMARY = ("column", "kind", "severity", "effect", "psi")
#: the statistics in the second table below it (each column's finding follows as a list)
COLUMN_STATISTICS = ("column", "p", "js", "ks", "wasserstein", "chi2", "nulls")
#: the columns of the replicas table (each replica's finding follows as a list)
REPLICA_SUMMARY = ("cluster", "root", "identical", "severity", "tensors", "failed")
#: the columns of the worst-tensors table the report and the flow's artifact show (the terminal's has all)
WORST_TENSOR_SUMMARY = ("cluster", "tensor", "dtype", "max_ulp", "max_abs_diff", "ok")


# --------------------------------------------------------------------------- table rows


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    return str(value)


def _without_p(effect: str) -> str:
    """A column's effect without the p-value it ends with (the p-value has a column of its own)."""
    head, sep, tail = effect.rpartition(", p ")
    return head if sep and tail[:1] in "<=>" else effect


def column_rows(report: AuditReport | dict) -> list[dict]:
    """One row per column of the data section, worst first: statistics rounded for reading,
    empty where a statistic does not apply; ``effect`` in readable units, ``p`` the p-value
    adjusted over the columns (Benjamini–Hochberg)."""
    data = report.data if isinstance(report, AuditReport) else report
    rows = []
    for c in sorted((data or {}).get("columns", []), key=column_order):
        nulls = ""
        if c.get("null_share_reference") is not None or c.get("null_share_current") is not None:
            nulls = f"{_num(c.get('null_share_reference'), 2) or '–'} → {_num(c.get('null_share_current'), 2) or '–'}"
        rows.append(
            {
                "column": c["column"],
                "kind": c["kind"],
                "severity": c["severity"] + (f" ({c['priority']})" if c.get("priority") else ""),
                "effect": _without_p(c.get("effect") or ""),
                "psi": _num(c.get("psi")),
                "p": _num(c.get("pvalue_adjusted"), 2),
                "kl": _num(c.get("kl")),
                "js": _num(c.get("js")),
                "ks": _num(c.get("ks")) + (f" (p {_num(c.get('ks_pvalue'), 2)})" if c.get("ks_pvalue") is not None else ""),
                "wasserstein": _num(c.get("wasserstein")),
                "chi2": _num(c.get("chi2")) + (f" (p {_num(c.get('chi2_pvalue'), 2)})" if c.get("chi2_pvalue") is not None else ""),
                "nulls": nulls,
                "finding": c.get("finding", ""),
            }
        )
    return rows


def replica_rows(replicas: dict | None, *, stores: bool = False) -> list[dict]:
    """One row per replica: cluster, root, identical, severity, counts, finding (the cluster by its
    name: a store's full address would push a markdown table off the right edge); with ``stores``
    (a terminal's table) the store's address follows the cluster."""
    rows = []
    for x in (replicas or {}).get("replicas", []):
        rows.append(
            {
                "cluster": x.get("cluster") or x.get("store"),
                **({"store": x.get("store")} if stores else {}),
                "root": (x.get("root") or "")[:12],
                "identical": "yes" if x.get("identical") else "no",
                "severity": section_severity(x),
                "tensors": x.get("tensors_compared"),
                "failed": len(x.get("tensors_failed") or []) if isinstance(x.get("tensors_failed"), list) else x.get("tensors_failed"),
                "finding": x.get("finding", ""),
            }
        )
    return rows


def worst_tensor_rows(replicas: dict | None) -> list[dict]:
    """The worst tensors of every replica, as rows."""
    rows = []
    for x in (replicas or {}).get("replicas", []):
        for t in x.get("worst") or []:
            dtypes = t.get("dtype_reference")
            if t.get("dtype_replica") and t.get("dtype_replica") != dtypes:
                dtypes = f"{dtypes} → {t.get('dtype_replica')}"
            rows.append(
                {
                    "cluster": x.get("cluster"),
                    "tensor": t.get("tensor"),
                    "file": t.get("file"),
                    "dtype": dtypes,
                    "shape": "×".join(map(str, t.get("shape") or [])),
                    "max_ulp": _num(t.get("max_ulp")),
                    "mean_ulp": _num(t.get("mean_ulp")),
                    "max_abs_diff": _num(t.get("max_abs_diff")),
                    "differing": _num(t.get("differing_share")),
                    "allclose": "" if t.get("allclose") is None else "yes" if t.get("allclose") else "no",
                    "ok": "✓" if t.get("ok") else "✗",
                }
            )
    return rows


def card_rows(cards: dict | None) -> list[dict]:
    """One row per cluster's model card: present, missing required fields, differing fields."""
    rows = []
    for x in (cards or {}).get("clusters", []):
        rows.append(
            {
                "cluster": x.get("cluster"),
                "severity": section_severity(x),
                "present": "yes" if x.get("present", True) else "no",
                "missing_required": ", ".join(x.get("missing_required") or []),
                "differing": "; ".join(
                    f"{d['field']}: {_short(d.get('value'))} (reference {_short(d.get('reference'))})" for d in x.get("differing") or []
                ),
            }
        )
    return rows


def _short(value: Any, n: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------- markdown


def _findings(rows: Sequence[dict], key: str, name: str = "cluster") -> list[str]:
    """The rows' ``key`` (a sentence, too long for a table cell) as a list, each by its row's ``name``."""
    return [f"- `{_cell(r[name])}`: {_cell(r[key])}" for r in rows if r.get(key)]


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def _md_table(rows: Sequence[dict], headers: Sequence[str] | None = None) -> str:
    if not rows:
        return "(none)"
    keys = list(headers or rows[0].keys())
    lines = ["| " + " | ".join(k.replace("_", " ") for k in keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def _badge(severity: str) -> str:
    if severity == "ok":
        return "ok"
    return f"**{severity} ({PRIORITIES[severity]})**"


def png_data_uri(path: str | os.PathLike) -> str | None:
    """A PNG file as a ``data:image/png;base64,...`` URI, which markdown viewers (Prefect's UI
    among them) show inline; None when the file is missing, not a PNG or over
    ``EMBEDDED_PNG_BYTES``."""
    try:
        with open(path, "rb") as f:
            png = f.read(EMBEDDED_PNG_BYTES + 1)
    except OSError:
        return None
    if len(png) > EMBEDDED_PNG_BYTES or not png.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def render_markdown(
    report: AuditReport,
    *,
    title: str = "Drift audit",
    plots: Mapping[str, str] | Sequence[str] | None = None,
    links: Mapping[str, str] | None = None,
    embed: bool = False,
    plots_where: str | None = None,
) -> str:
    """The report a person reads: the verdict first, a summary table, then a section each.

    ``plots`` maps a column to its PNG (or lists the PNGs); ``links`` are extra lines at the end,
    label → text (an MLflow run, a folder). With ``embed`` the PNGs (the ``EMBEDDED_PLOTS`` worst)
    are drawn in the report itself, as data URIs, and named by file only, ``plots_where`` saying
    where they are kept (an MLflow run); without it they are listed by path.
    """
    sev = report.severity
    # the verdict's words are the section list below (and the artifact's description above): the
    # heading gives the level only, so a reader meets each finding once
    lines = [f"# {title}: {_badge(sev).upper() if sev != 'ok' else 'ok'}", ""]
    if sev == "ok":  # "data drift, contract checked, nothing drifted": the night in one line
        quiet = report.verdict().split(": ", 1)[-1]
        lines += [quiet[:1].upper() + quiet[1:] + ".", ""]
    subject = []
    if report.data is not None:
        ref, cur = report.data.get("reference"), report.data.get("current")
        if ref or cur:
            subject.append(f"data `{(ref or {}).get('label', '?')}` → `{(cur or {}).get('label', '?')}`")
    if report.model:
        m = report.model
        name = f"{m.get('name')}/{m.get('version')}" if m.get("name") else m.get("ref", "")
        subject.append(f"model `{name}`" + (f" (root `{m['root'][:12]}`)" if m.get("root") else ""))
    if subject:
        lines += ["Audited: " + "; ".join(subject) + ".", ""]
    summaries = report.summaries()
    # lists, not tables, for sentences: the UI never wraps a table cell, so a long one pushes the
    # table off the right edge of the artifact pane
    lines += [f"- **{SECTION_TITLES[n]}**: {_badge(s)}: {_cell(summaries[n])}" for n, s in report.sections.items()]

    if "data" in report.errors:
        lines += ["", "## Data drift: could not be audited", "", report.errors["data"]]
    elif report.data is not None:
        d = report.data
        t = d.get("thresholds") or {}
        share = d.get("drift_share")
        lines += [
            "",
            f"## Data drift: {_badge(report.sections['data'])}",
            "",
            f"{d.get('columns_drifted', 0)} of {d.get('columns_compared', 0)} column(s) drifted"
            + (f" (drift share {share:.3g})" if share is not None else "")
            + f"; {_count(d.get('rows_reference'))} reference rows, {_count(d.get('rows_current'))} current rows; "
            + f"{d.get('bins')} quantile bins, epsilon {d.get('epsilon')}; drift: significant at {t.get('alpha')} "
            + f"(Benjamini–Hochberg over the columns) and at least the floor ({t.get('floor')}σ Wasserstein, "
            + f"{t.get('share_floor')} of categorical mass"
            + (", per column: " + ", ".join(f"{k} {v}" for k, v in t["floors"].items()) if t.get("floors") else "")
            + ") "
            + f"or PSI > {t.get('psi_warning')}; critical when PSI > {t.get('psi_critical')}; "
            + f"a warning on {t.get('escalate_after_nights')} consecutive nights escalates.",
            "",
            _md_table(column_rows(d), COLUMN_SUMMARY),
        ]
        listed = dict(plots) if isinstance(plots, Mapping) else {os.path.basename(p): p for p in plots or []}
        if listed:
            lines += ["", "### Histograms of the drifted columns", ""]
            lines += _plot_lines(listed, embed, plots_where)
        rows = column_rows(d)
        if rows:
            # the adjusted p-value is the one the rule reads: the tests' own p-values are in MLflow
            plain = [r | {k: r[k].split(" (p ", 1)[0] for k in ("ks", "chi2")} for r in rows]
            lines += ["", "### Statistics per column", "", _md_table(plain, COLUMN_STATISTICS), ""]
            lines += _findings([r for r in rows if not r["severity"].startswith("ok")], "finding", "column")  # the drifted

    if "contract" in report.errors:
        lines += ["", "## Contract: could not be audited", "", report.errors["contract"]]
    elif report.contract is not None:
        c = report.contract
        lines += ["", f"## Contract `{c.get('ref')}`: {'met' if c.get('ok') else _badge('critical') + ' violated'}", ""]
        lines.append(
            f"{c.get('evaluated', 0)} expectation(s) evaluated, {len(c.get('failed', []))} failed."
        )
        if c.get("failed"):
            lines += ["", "### Failing expectations", ""] + [
                f"- `{_cell(f.get('expectation'))}`" + (f" on `{_cell(f['column'])}`" if f.get("column") else "") + f": {_cell(f.get('details'))}"
                for f in c["failed"]
            ]

    if "replicas" in report.errors:
        lines += ["", "## Replicas: could not be audited", "", report.errors["replicas"]]
    elif report.replicas is not None:
        r = report.replicas
        lines += [
            "",
            f"## Replicas: {_badge(report.sections['replicas'])}",
            "",
            f"Reference replica: `{r.get('reference')}`.",
            "",
            _md_table(replica_rows(r), REPLICA_SUMMARY),
            "",
            *_findings(replica_rows(r), "finding"),
        ]
        worst_rows = worst_tensor_rows(r)
        if worst_rows:
            lines += ["", "### Worst tensors", "", _md_table(worst_rows, WORST_TENSOR_SUMMARY)]

    if "cards" in report.errors:
        lines += ["", "## Model cards: could not be audited", "", report.errors["cards"]]
    elif report.cards is not None:
        c = report.cards
        required = ", ".join(c.get("required") or []) or "(none)"
        lines += [
            "",
            f"## Model cards: {_badge(report.sections['cards'])}",
            "",
            f"Reference card: `{c.get('reference')}`; required fields: {required}.",
            "",
            _md_table(card_rows(c), ("cluster", "severity", "present", "missing_required")),
            "",
            *_findings(card_rows(c), "differing"),
        ]

    if links:
        lines += ["", "---", ""] + [f"- {label}: {text}" for label, text in links.items()]
    return "\n".join(lines) + "\n"


def _plot_lines(listed: Mapping[str, str], embed: bool, where: str | None) -> list[str]:
    if not embed:
        return [f"- `{col}`: `{path}`" for col, path in listed.items()]
    lines: list[str] = []
    if where:
        lines += [f"Reference as bars, tonight as the red line; the PNGs are kept in {where}.", ""]
    named = []
    for n, (col, path) in enumerate(listed.items()):
        uri = png_data_uri(path) if n < EMBEDDED_PLOTS else None
        if uri is None:
            named.append(f"`{col}` (`{os.path.basename(path)}`)")
            continue
        lines += [f"#### `{col}`", "", f"![{_cell(col)}: reference and tonight]({uri})", ""]
    if named:
        lines.append("Not drawn here: " + ", ".join(named) + ".")
    return lines


# --------------------------------------------------------------------------- histograms


def plot_histograms_by_column(
    report: AuditReport | DriftReport,
    reference: pd.DataFrame | None = None,
    current: pd.DataFrame | None = None,
    out_dir: str | os.PathLike = ".",
) -> dict[str, str]:
    """Like :func:`plot_histograms`, as ``{column: path}``."""
    return _plot(report, reference, current, out_dir)


def plot_histograms(
    report: AuditReport | DriftReport,
    reference: pd.DataFrame | None = None,
    current: pd.DataFrame | None = None,
    out_dir: str | os.PathLike = ".",
) -> list[str]:
    """Draw one PNG per drifted column: the reference's and the current table's shares per bin.

    Numeric columns are drawn on the reference's quantile bins (the bins PSI is computed on), each
    bin the same width, so the reference is nearly flat and what moved stands out: reference as
    bars, current as a step line, the bin edges on the axis. Categorical columns are grouped bars
    per category (the ``PLOT_CATEGORIES`` largest; the rest summed). Columns whose drift is
    structural (missing, changed type, no values) have no histogram and no PNG.

    The histogram data comes from the report's :class:`DriftReport`; when it has none for a drifted
    column (a report rebuilt from a dict), ``reference`` and ``current`` give it. Returns the paths
    written, worst column first.
    """
    return list(_plot(report, reference, current, out_dir).values())


def _plot(report, reference, current, out_dir) -> dict[str, str]:
    drift = report.drift if isinstance(report, AuditReport) else report
    data = report.data if isinstance(report, AuditReport) else (report.to_dict() if report is not None else None)
    if data is None:
        return {}
    hists: dict[str, ColumnHistogram] = drift.histograms() if drift is not None else {}
    bins = int(data.get("bins") or 10)
    out = os.path.abspath(os.fspath(out_dir))
    written: dict[str, str] = {}
    used: set[str] = set()
    for c in sorted((c for c in data.get("columns", []) if c["severity"] != "ok"), key=column_order):
        hist = hists.get(c["column"])
        if hist is None and reference is not None and current is not None:
            hist = column_histograms(reference, current, c["column"], bins)
        if hist is None:
            continue
        name = slug(c["column"])
        stem, n = name, 1
        while name.lower() in used:
            n += 1
            name = f"{stem}-{n}"
        used.add(name.lower())
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"drift-{name}.png")
        _draw(hist, c, path)
        written[c["column"]] = path
    return written


def _edge_label(x: float) -> str:
    return f"{x:.4g}"


def _draw(hist: ColumnHistogram, column: dict, path: str) -> None:
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ref = np.asarray(hist.reference, dtype=float)
    cur = np.asarray(hist.current, dtype=float)
    fig = Figure(figsize=(8, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    if hist.kind == "numeric":
        edges = list(hist.edges or ())
        x = np.arange(len(ref))
        ax.bar(x, ref, width=1.0, align="edge", color="#9ecae1", edgecolor="#4a90c2", label="reference")
        ax.step(np.append(x, len(ref)), np.append(cur, cur[-1]), where="post", color="#d6604d", lw=2.2, label="current")
        low = hist.low if hist.low is not None else (edges[0] if edges else 0.0)
        high = hist.high if hist.high is not None else (edges[-1] if edges else 1.0)
        bounds = [min(low, edges[0]) if edges else low, *edges, max(high, edges[-1]) if edges else high]
        ax.set_xticks(np.arange(len(bounds)))
        ax.set_xticklabels([_edge_label(b) for b in bounds], rotation=45, ha="right", fontsize=8)
        ax.set_xlim(0, len(ref))
        ax.set_xlabel("reference quantile bins (equal width here; edges in the column's units)")
    else:
        labels = list(hist.categories or ())
        if len(labels) > PLOT_CATEGORIES:
            order = np.argsort(-(ref + cur), kind="stable")
            keep = np.sort(order[: PLOT_CATEGORIES - 1])
            rest = np.setdiff1d(np.arange(len(labels)), keep)
            labels = [labels[i] for i in keep] + [f"(other {len(rest)})"]
            ref = np.append(ref[keep], ref[rest].sum())
            cur = np.append(cur[keep], cur[rest].sum())
        x = np.arange(len(labels))
        ax.bar(x - 0.2, ref, width=0.4, color="#9ecae1", edgecolor="#4a90c2", label="reference")
        ax.bar(x + 0.2, cur, width=0.4, color="#f4a582", edgecolor="#d6604d", label="current")
        ax.set_xticks(x)
        ax.set_xticklabels(
            [_short(label, 18) for label in labels],
            rotation=45 if len(labels) > 4 else 0,
            ha="right" if len(labels) > 4 else "center",
            fontsize=8,
        )
        ax.set_xlabel("category")
    ax.set_ylabel("share of values")
    ax.set_ylim(0, max(float(ref.max(initial=0)), float(cur.max(initial=0))) * 1.15 or 1.0)
    sev = column["severity"] + (f", {column['priority']}" if column.get("priority") else "")
    stats = [f"PSI {_num(column.get('psi'))}"]
    for key, label in (("js", "JS"), ("ks", "KS"), ("wasserstein", "W1"), ("chi2", "χ²")):
        if column.get(key) is not None:
            stats.append(f"{label} {_num(column.get(key))}")
    effect = f"\n{column['effect']}" if column.get("effect") else ""
    ax.set_title(f"{hist.column}: {sev}{effect}\n" + ", ".join(stats), fontsize=10)
    ax.legend(loc="best", fontsize=8, framealpha=0.8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    atomic_write(path, png.getbuffer())
