"""One drift audit: data drift, the data's schema contract, replica weights and model cards, one verdict.

:class:`AuditReport` gathers up to four sections and gives the audit one severity, the worst of
theirs (``ok``, ``warning`` = P1, ``critical`` = P0):

* ``data``: :func:`concord.audit.drift.data_drift` of a current table against its reference (its
  severity is the worst column's, escalations included);
* ``contract``: the current table validated against its schema contract
  (:func:`concord.lineage.contracts.validate`). Data that breaks its contract is ``critical``: the
  contract is a promise every consumer relies on, and the promotion gate refuses such data too;
* ``replicas``: the weights of one model version on every cluster (``ReplicaReport.to_dict()`` of
  :mod:`concord.audit.replicas`); its own severity;
* ``cards``: the model cards of that version across clusters (``CardReport.to_dict()`` of
  :mod:`concord.audit.model_cards`); its own severity.

A section that could not be audited at all (a store that does not answer, say) is recorded in
``errors`` and counts as ``critical``: a nightly audit that cannot tell is not an "ok".

Inputs are named the way a person types them (:func:`load_table`): a ``.parquet`` or ``.csv``
file, a data snapshot id (64 hex) or a ``data/<name>`` ref in a data store. The rendering helpers
turn a report into the markdown a person reads (:func:`render_markdown`), table rows
(:func:`column_rows`, :func:`replica_rows`, :func:`card_rows`) and PNG overlays of each drifted
column's reference and current histograms (:func:`plot_histograms`).

Consecutive nights: :func:`previous_nights` and :func:`record_night` keep each night's column
severities in a small JSON document of a store (``audits/<name>/nights.json``), so that the next
night's :func:`~concord.audit.drift.data_drift` gets them as ``history``. A night is a UTC date; running
the same night again replaces its record, and a night without a record breaks the chain.

pandas, matplotlib and great-expectations are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import math
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from concord.audit.drift import PRIORITIES, SEVERITIES, ColumnHistogram, DriftReport, Prioritised, column_histograms
from concord.errors import DataFormatError, DriftConfigError
from concord.hashing import is_digest

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from concord.lineage.contracts import Contract
    from concord.audit.drift import TableBatches
    from concord.stores.base import Store

__all__ = [
    "HISTORY_FORMAT",
    "HISTORY_NIGHTS",
    "SECTIONS",
    "AuditReport",
    "OpenTable",
    "TableSource",
    "audit_data",
    "audit_name",
    "card_rows",
    "check_contract",
    "column_rows",
    "history_key",
    "load_table",
    "names_snapshot",
    "column_order",
    "model_holders",
    "night_of",
    "open_table",
    "plot_histograms",
    "plot_histograms_by_column",
    "spec_name",
    "store_labels",
    "stream_drift",
    "previous_nights",
    "record_night",
    "render_markdown",
    "replica_rows",
    "worst",
    "worst_tensor_rows",
]

SECTIONS = ("data", "contract", "replicas", "cards")
SECTION_TITLES = {"data": "data drift", "contract": "contract", "replicas": "replicas", "cards": "model cards"}
_RANK = {s: i for i, s in enumerate(SEVERITIES)}

HISTORY_PREFIX = "audits"
HISTORY_FORMAT = "concord/drift-nights@1"
#: nights kept per audit (far more than any escalation rule needs)
HISTORY_NIGHTS = 60
#: categories drawn at most in one categorical overlay (the rest summed as "(other)")
PLOT_CATEGORIES = 25
_INPUT_HELP = "Give a .parquet or .csv file, a data snapshot id (64 hex) or a data/<name> ref in the data store."


def worst(severities: Iterable[str]) -> str:
    """The worst of ``severities`` ("ok" when there is none)."""
    return max(severities, key=_RANK.__getitem__, default="ok")


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class TableSource:
    """Where a table of an audit came from."""

    spec: str  # as given
    kind: str  # "file" | "snapshot"
    name: str  # file name without extension, or the data snapshot's name
    path: str | None = None  # the file, for a file
    id: str | None = None  # the snapshot id, for a snapshot
    store: str | None = None  # the store's URI, for a snapshot

    @property
    def label(self) -> str:
        """How reports name it: the file's name, or ``name@<id prefix>``."""
        if self.kind == "file":
            return os.path.basename(self.path or self.spec)
        return f"{self.name}@{(self.id or '')[:12]}"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"label": self.label}


_DATA_REF = re.compile(r"^data/[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}(~[0-9]+)?$")


def names_snapshot(text: str) -> bool:
    """A data snapshot id, or a ``data/<name>[~N]`` ref that is not a table file's path."""
    from concord.lineage.data import FORMATS

    if is_digest(text):
        return True
    if not _DATA_REF.match(text) or os.path.exists(text):
        return False
    return os.path.splitext(text.partition("~")[0])[1].lower() not in FORMATS


def load_table(spec: "str | os.PathLike", store: "Store | None" = None, *, which: str = "table") -> tuple["pd.DataFrame", TableSource]:
    """The table ``spec`` names, and where it came from.

    ``spec`` is a ``.parquet``/``.csv`` file, a data snapshot id, or a ``data/<name>`` ref
    (``data/<name>~1`` for the one before) in ``store``. ``which`` ("reference", "current")
    names the input in errors, which are :class:`~concord.errors.DriftConfigError` (a
    ``ValueError``) and say what to give instead.
    """
    text = os.fspath(spec).strip()
    if not text:
        raise DriftConfigError(which, "is empty", _INPUT_HELP)
    if names_snapshot(text):
        if store is None:
            raise DriftConfigError(which, f"{text!r} names a data snapshot but no data store was given", "Pass the store that holds it.")
        from concord.lineage.data import data_info, load_data
        from concord.snapshots.refs import resolve_root

        try:
            snapshot_id = resolve_root(store, text)
            info = data_info(store, snapshot_id)
        except (KeyError, ValueError) as exc:
            raise DriftConfigError(which, f"no data snapshot {text!r} in {store.uri} ({' '.join(str(exc).split())})", _INPUT_HELP) from exc
        df = load_data(store, snapshot_id)
        return df, TableSource(spec=text, kind="snapshot", name=info.name, id=snapshot_id, store=store.uri)
    path = os.path.abspath(text)
    if not os.path.isfile(path):
        what = "a folder, not a table" if os.path.isdir(path) else "no such file"
        raise DriftConfigError(which, f"{path}: {what}", _INPUT_HELP)
    from concord.lineage.data import read_table

    try:
        df = read_table(path)
    except DataFormatError as exc:
        raise DriftConfigError(which, f"{path}: {exc.problem}", "Give a .parquet or .csv file (the format comes from the extension).") from exc
    name = os.path.splitext(os.path.basename(path))[0]
    return df, TableSource(spec=text, kind="file", name=name, path=path)


@dataclass(frozen=True)
class OpenTable:
    """A table an audit reads in batches (:func:`open_table`): where it came from, its file and format."""

    source: TableSource
    path: str
    format: str  # "parquet" | "csv"

    def batches(self, batch_bytes: int | None = None) -> "TableBatches":
        """The table read about ``batch_bytes`` at a time (default ``concord.lineage.data.BATCH_BYTES``)."""
        from concord.lineage.data import BATCH_BYTES, table_batches

        return table_batches(self.path, batch_bytes=batch_bytes or BATCH_BYTES)

    def read(self) -> "pd.DataFrame":
        """The whole table (for what needs it whole: a contract's validation)."""
        from concord.lineage.data import read_table

        return read_table(self.path)


@contextmanager
def open_table(spec: "str | os.PathLike", store: "Store | None" = None, *, which: str = "table") -> Iterator[OpenTable]:
    """The table ``spec`` names, as :func:`load_table` takes it, without reading it: a file as it is,
    a data snapshot restored (every chunk verified) into a temporary folder removed on leaving.
    Errors are :func:`load_table`'s."""
    text = os.fspath(spec).strip()
    if not text:
        raise DriftConfigError(which, "is empty", _INPUT_HELP)
    if names_snapshot(text):
        if store is None:
            raise DriftConfigError(which, f"{text!r} names a data snapshot but no data store was given", "Pass the store that holds it.")
        from concord.lineage.data import data_file, data_info
        from concord.snapshots.refs import resolve_root

        try:
            snapshot_id = resolve_root(store, text)
            data_info(store, snapshot_id)
        except (KeyError, ValueError) as exc:
            raise DriftConfigError(which, f"no data snapshot {text!r} in {store.uri} ({' '.join(str(exc).split())})", _INPUT_HELP) from exc
        with data_file(store, snapshot_id) as (path, info):
            yield OpenTable(TableSource(spec=text, kind="snapshot", name=info.name, id=snapshot_id, store=store.uri), path, info.format)
        return
    path = os.path.abspath(text)
    if not os.path.isfile(path):
        what = "a folder, not a table" if os.path.isdir(path) else "no such file"
        raise DriftConfigError(which, f"{path}: {what}", _INPUT_HELP)
    from concord.lineage.data import FORMATS

    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        ext = os.path.splitext(path)[1].lower()
        raise DriftConfigError(
            which, f"{path}: unknown data format {ext or '(no extension)'!r}", "Give a .parquet or .csv file (the format comes from the extension)."
        )
    name = os.path.splitext(os.path.basename(path))[0]
    yield OpenTable(TableSource(spec=text, kind="file", name=name, path=path), path, fmt)


def stream_drift(
    reference: OpenTable,
    current: OpenTable,
    *,
    which: tuple[str, str] = ("reference", "current"),
    batch_bytes: int | None = None,
    **options: Any,
) -> DriftReport:
    """:func:`~concord.audit.drift.data_drift_batches` of two open tables, read about ``batch_bytes`` at a
    time (options: columns, thresholds, bins, history, sample_size); a file that turns out
    unreadable is a :class:`DriftConfigError` naming the input."""
    from concord.audit.drift import data_drift_batches

    tables = []
    for label, table in zip(which, (reference, current)):
        try:
            tables.append(table.batches(batch_bytes))
        except DataFormatError as exc:
            raise DriftConfigError(label, f"{table.path}: {exc.problem}", "Give a .parquet or .csv file (the format comes from the extension).") from exc
    try:
        return data_drift_batches(tables[0], tables[1], **options)
    except DataFormatError as exc:
        label = which[0] if exc.source == reference.path else which[1]
        raise DriftConfigError(label, f"{exc.source}: {exc.problem}", "Give a .parquet or .csv file (the format comes from the extension).") from exc


def audit_data(
    reference: "str | os.PathLike",
    current: "str | os.PathLike",
    store: "Store | None" = None,
    *,
    contract: "Contract | None" = None,
    **options: Any,
) -> "AuditReport":
    """The data audit ``concord audit data`` runs: the drift of ``current`` from ``reference`` (each a
    file, a data snapshot id or a ``data/<name>`` ref in ``store``), read batch by batch
    (:func:`stream_drift`, ``options`` are its keywords), and, with a
    ``contract``, the current table validated against it (read whole: great-expectations validates
    one DataFrame). The report's ``drift`` keeps the :class:`DriftReport` (its histograms draw the PNGs)."""
    with open_table(reference, store, which="reference") as ref, open_table(current, store, which="current") as cur:
        drift = stream_drift(ref, cur, **options)
        checked = None
        if contract is not None:
            try:
                frame = cur.read()
            except DataFormatError as exc:
                raise DriftConfigError("current", f"{cur.path}: {exc.problem}", _INPUT_HELP) from exc
            checked = check_contract(contract, frame)
            del frame
    return AuditReport.assemble(drift=drift, reference=ref.source, current=cur.source, contract=checked)


def check_contract(contract: "Contract", df: "pd.DataFrame") -> dict:
    """The contract section: ``{name, version, ref, digest, ok, evaluated, failed: [...]}``, each
    failed expectation as ``{expectation, column, details}``; ``severity`` is critical when any failed."""
    from concord.lineage.contracts import validate

    result = validate(contract, df)
    return {
        "name": contract.name,
        "version": contract.version,
        "ref": contract.ref,
        "digest": contract.digest(),
        "ok": result.success,
        "evaluated": result.evaluated,
        "failed": [f.to_dict() for f in result.failures],
        "severity": "ok" if result.success else "critical",
    }


def store_labels(specs: Sequence[str]) -> list[str]:
    """A cluster label per store spec: its last path segment (``data/stores/us-east`` →
    ``us-east``) when those are unique among ``specs``, else the specs themselves."""
    tails = [str(s).rstrip("/").rsplit("/", 1)[-1] or str(s) for s in specs]
    if len(set(tails)) == len(tails):
        return tails
    return [str(s) for s in specs]


def model_holders(lineage: Any, name: str, version: "str | int") -> dict:
    """The snapshot root of model version ``name``/``version`` (a number, or an alias such as
    ``champion``) and the stores lineage records as holding it (``concord.held_by``; the store its
    source points into when none is recorded): ``{name, version, root, stores}``."""
    from concord.errors import LineageError

    text = str(version).strip()
    if not text.isdigit():
        try:
            text = str(lineage.client.get_model_version_by_alias(name, text).version)
        except Exception as exc:
            raise LineageError(f"model {name!r} has no version with alias {text!r} ({' '.join(str(exc).split())[:200]})") from exc
    info = lineage.model_lineage(name, text)
    stores = [h["store"] for h in info.get("replicas") or [] if h.get("store")]
    if not stores and info.get("store"):
        stores = [info["store"]]
    if not info.get("root") or not stores:
        raise LineageError(
            f"model version {name}/{text} records no snapshot root or no store holding it; "
            "register it with `concord model register NAME --store STORE --ref REF`"
        )
    return {"name": name, "version": text, "root": info["root"], "stores": stores}


# --------------------------------------------------------------------------- the report


def _as_dict(section: Any) -> dict | None:
    if section is None or isinstance(section, dict):
        return section
    if hasattr(section, "to_dict"):
        return section.to_dict()
    raise TypeError(f"an audit section must be a report with to_dict() or a dict, got {type(section).__name__}")


def _section_severity(section: dict) -> str:
    sev = section.get("severity")
    if sev in _RANK:
        return sev
    return "ok" if section.get("ok", True) else "critical"


@dataclass(frozen=True)
class AuditReport(Prioritised):
    """One audit's sections and its overall severity (the worst section's).

    ``data`` is ``DriftReport.to_dict()`` plus ``reference`` and ``current`` (each
    ``TableSource.to_dict()``, when known); ``contract`` is :func:`check_contract`'s dict;
    ``replicas`` and ``cards`` the replica and card reports' dicts; ``errors`` maps a section that
    could not be audited to why. ``drift`` keeps the :class:`DriftReport` itself when the audit ran
    in this process (its histograms draw the PNGs); it is not part of the dict.
    """

    data: dict | None = None
    contract: dict | None = None
    replicas: dict | None = None
    cards: dict | None = None
    errors: Mapping[str, str] = field(default_factory=dict)
    model: dict | None = None  # {name, version, root} of the audited model version, when known
    drift: DriftReport | None = field(default=None, repr=False, compare=False)

    @classmethod
    def assemble(
        cls,
        *,
        drift: "DriftReport | dict | None" = None,
        reference: "TableSource | dict | None" = None,
        current: "TableSource | dict | None" = None,
        contract: dict | None = None,
        replicas: Any = None,
        cards: Any = None,
        errors: Mapping[str, str] | None = None,
        model: dict | None = None,
    ) -> "AuditReport":
        """A report from its sections: report objects or their dicts, any of them absent."""
        unknown = set(errors or {}) - set(SECTIONS)
        if unknown:
            raise ValueError(f"errors name unknown sections {sorted(unknown)}; sections are {', '.join(SECTIONS)}")
        data = None
        if drift is not None:
            data = dict(_as_dict(drift))
            for key, source in (("reference", reference), ("current", current)):
                if source is not None:
                    data[key] = _as_dict(source)
        return cls(
            data=data,
            contract=_as_dict(contract),
            replicas=_as_dict(replicas),
            cards=_as_dict(cards),
            errors=dict(errors or {}),
            model=model,
            drift=drift if isinstance(drift, DriftReport) else None,
        )

    @property
    def sections(self) -> dict[str, str]:
        """Each section present (audited, or failed to be) → its severity."""
        out = {}
        for name in SECTIONS:
            section = getattr(self, name)
            if name in self.errors:
                out[name] = "critical"
            elif section is not None:
                out[name] = _section_severity(section)
        return out

    @property
    def severity(self) -> str:
        return worst(self.sections.values())

    @property
    def ok(self) -> bool:
        return self.severity == "ok"

    def drifted_columns(self) -> list[dict]:
        """The data section's columns that are not ok, worst first (then by PSI)."""
        columns = (self.data or {}).get("columns", [])
        return sorted((c for c in columns if c["severity"] != "ok"), key=column_order)

    def summaries(self) -> dict[str, str]:
        """One line per section saying what was found."""
        out = {}
        for name in self.sections:
            if name in self.errors:
                out[name] = f"could not be audited: {self.errors[name]}"
            else:
                out[name] = _SUMMARIES[name](getattr(self, name))
        return out

    def verdict(self) -> str:
        """One line: the severity, then what made it (or what was audited, when all is well)."""
        sev = self.severity
        head = sev.upper() + (f" ({PRIORITIES[sev]})" if sev in PRIORITIES else "")
        sections, summaries = self.sections, self.summaries()
        if not sections:
            return f"{head}: nothing audited"
        bad = [f"{SECTION_TITLES[n]}: {summaries[n]}" for n, s in sections.items() if s != "ok"]
        if bad:
            return f"{head}: " + "; ".join(bad)
        return f"{head}: " + ", ".join(SECTION_TITLES[n] for n in sections) + " checked, nothing drifted"

    def to_dict(self) -> dict:
        """The verdict, the sections' severities and every section. The data section's keys are at
        the top (``columns``, ``drift_share``, ...; its own severity is ``sections["data"]``)."""
        out: dict[str, Any] = {
            "severity": self.severity,
            "priority": self.priority,
            "ok": self.ok,
            "verdict": self.verdict(),
            "sections": self.sections,
            "errors": dict(self.errors),
        }
        if self.data is not None:
            out.update({k: v for k, v in self.data.items() if k not in ("severity", "priority")})
        for name in ("contract", "replicas", "cards", "model"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def column_order(c: dict) -> tuple:
    """Sort key of a column's dict: worst severity first, then the largest PSI, then the name."""
    return (-_RANK[c["severity"]], -(c.get("psi") or 0.0), c["column"])


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def _data_summary(d: dict) -> str:
    drifted = [c for c in d.get("columns", []) if c["severity"] != "ok"]
    compared = d.get("columns_compared", len(d.get("columns", [])))
    if not drifted:
        return f"no drift in {_plural(compared, 'column')}"
    ranked = sorted(drifted, key=column_order)
    shown = ", ".join(f"{c['column']} ({c['priority'] or c['severity']})" for c in ranked[:6])
    more = f" and {len(ranked) - 6} more" if len(ranked) > 6 else ""
    share = d.get("drift_share")
    return f"{len(drifted)} of {_plural(compared, 'column')} drifted" + (f" (share {share:.2f})" if share is not None else "") + f": {shown}{more}"


def _contract_summary(c: dict) -> str:
    if c.get("ok"):
        return f"{c.get('ref')} met ({_plural(c.get('evaluated', 0), 'expectation')})"
    failed = c.get("failed", [])
    cols = sorted({f["column"] for f in failed if f.get("column")})
    where = f" on {', '.join(cols[:6])}" if cols else ""
    return f"{c.get('ref')} violated: {_plural(len(failed), 'failing expectation')}{where}"


def _replicas_summary(r: dict) -> str:
    reps = [x for x in r.get("replicas", []) if not x.get("reference")]
    bad = [x for x in r.get("replicas", []) if _section_severity(x) != "ok"]
    if not bad:
        identical = sum(1 for x in reps if x.get("identical"))
        return f"{_plural(len(reps), 'replica')} consistent with {r.get('reference')} ({identical} identical)"
    return "; ".join(f"{x.get('cluster')}: {x.get('finding') or _section_severity(x)}" for x in bad)


def _cards_summary(c: dict) -> str:
    clusters = c.get("clusters", [])
    bad = []
    for x in clusters:
        if _section_severity(x) == "ok" and not x.get("missing_required") and not x.get("differing") and x.get("present", True):
            continue
        if x.get("finding"):
            bad.append(f"{x.get('cluster')}: {x['finding']}")
            continue
        problems = []
        if not x.get("present", True):
            problems.append("no card")
        if x.get("missing_required"):
            problems.append("missing " + ", ".join(x["missing_required"]))
        if x.get("differing"):
            problems.append("differs in " + ", ".join(d["field"] for d in x["differing"]))
        bad.append(f"{x.get('cluster')}: {'; '.join(problems)}")
    if not bad:
        return f"consistent across {_plural(len(clusters), 'cluster')}"
    return "; ".join(bad)


_SUMMARIES = {"data": _data_summary, "contract": _contract_summary, "replicas": _replicas_summary, "cards": _cards_summary}


# --------------------------------------------------------------------------- table rows


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    return str(value)


def column_rows(report: "AuditReport | dict") -> list[dict]:
    """One row per column of the data section, worst first: statistics rounded for reading,
    empty where a statistic does not apply."""
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
                "psi": _num(c.get("psi")),
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


def replica_rows(replicas: dict | None) -> list[dict]:
    """One row per replica: cluster, store, root, identical, severity, counts, finding."""
    rows = []
    for x in (replicas or {}).get("replicas", []):
        rows.append(
            {
                "cluster": x.get("cluster"),
                "store": x.get("store"),
                "root": (x.get("root") or "")[:12],
                "identical": "yes" if x.get("identical") else "no",
                "severity": _section_severity(x),
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
                "severity": _section_severity(x),
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


def render_markdown(
    report: AuditReport,
    *,
    title: str = "Drift audit",
    plots: Mapping[str, str] | Sequence[str] | None = None,
    links: Mapping[str, str] | None = None,
) -> str:
    """The report a person reads: the verdict first, a summary table, then a section each.

    ``plots`` maps a column to its PNG (or lists the PNGs); ``links`` are extra lines at the end,
    label → text (an MLflow run, a folder).
    """
    sev = report.severity
    verdict = report.verdict()
    lines = [f"# {title}: {_badge(sev).upper() if sev != 'ok' else 'ok'}", "", verdict.split(": ", 1)[-1], ""]
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
    lines.append(
        _md_table(
            [{"section": SECTION_TITLES[n], "severity": _badge(s), "summary": summaries[n]} for n, s in report.sections.items()]
        )
    )

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
            + f"; {d.get('rows_reference')} reference rows, {d.get('rows_current')} current rows; "
            + f"{d.get('bins')} quantile bins, epsilon {d.get('epsilon')}; PSI warning > {t.get('psi_warning')}, "
            + f"critical > {t.get('psi_critical')}; a warning on {t.get('escalate_after_nights')} consecutive nights escalates.",
            "",
            _md_table(column_rows(d), ["column", "kind", "severity", "psi", "js", "ks", "wasserstein", "chi2", "nulls", "finding"]),
        ]
        listed = dict(plots) if isinstance(plots, Mapping) else {os.path.basename(p): p for p in plots or []}
        if listed:
            lines += ["", "### Histograms of the drifted columns", ""]
            lines += [f"- `{col}`: `{path}`" for col, path in listed.items()]

    if "contract" in report.errors:
        lines += ["", "## Contract: could not be audited", "", report.errors["contract"]]
    elif report.contract is not None:
        c = report.contract
        lines += ["", f"## Contract `{c.get('ref')}`: {'met' if c.get('ok') else _badge('critical') + ' violated'}", ""]
        lines.append(
            f"{c.get('evaluated', 0)} expectation(s) evaluated, {len(c.get('failed', []))} failed."
        )
        if c.get("failed"):
            lines += ["", "### Failing expectations", "", _md_table(c["failed"], ["expectation", "column", "details"])]

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
            _md_table(replica_rows(r)),
        ]
        worst_rows = worst_tensor_rows(r)
        if worst_rows:
            lines += ["", "### Worst tensors", "", _md_table(worst_rows)]

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
            _md_table(card_rows(c)),
        ]

    if links:
        lines += ["", "---", ""] + [f"- {label}: {text}" for label, text in links.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- histograms


def _slug(text: str, limit: int = 80) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-")[:limit]
    return slug or "column"


def plot_histograms_by_column(
    report: "AuditReport | DriftReport",
    reference: "pd.DataFrame | None" = None,
    current: "pd.DataFrame | None" = None,
    out_dir: "str | os.PathLike" = ".",
) -> dict[str, str]:
    """Like :func:`plot_histograms`, as ``{column: path}``."""
    return _plot(report, reference, current, out_dir)


def plot_histograms(
    report: "AuditReport | DriftReport",
    reference: "pd.DataFrame | None" = None,
    current: "pd.DataFrame | None" = None,
    out_dir: "str | os.PathLike" = ".",
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
        name = _slug(c["column"])
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
        ax.set_xticklabels([_short(label, 18) for label in labels], rotation=45 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center", fontsize=8)
        ax.set_xlabel("category")
    ax.set_ylabel("share of values")
    ax.set_ylim(0, max(float(ref.max(initial=0)), float(cur.max(initial=0))) * 1.15 or 1.0)
    sev = column["severity"] + (f", {column['priority']}" if column.get("priority") else "")
    stats = [f"PSI {_num(column.get('psi'))}"]
    for key, label in (("js", "JS"), ("ks", "KS"), ("wasserstein", "W1"), ("chi2", "χ²")):
        if column.get(key) is not None:
            stats.append(f"{label} {_num(column.get(key))}")
    ax.set_title(f"{hist.column}: {sev}\n" + ", ".join(stats), fontsize=10)
    ax.legend(loc="best", fontsize=8, framealpha=0.8)
    fig.tight_layout()
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --------------------------------------------------------------------------- consecutive nights


def spec_name(spec: str) -> str:
    """The short name of an input as given: a file's name without extension, a ``data/<name>``
    ref's name, the first 12 hex of a snapshot id, a store's last path segment."""
    text = str(spec).strip()
    if is_digest(text):
        return text[:12]
    if names_snapshot(text):
        return text[len("data/"):].partition("~")[0]
    return os.path.splitext(os.path.basename(text.rstrip("/")))[0] or text


def audit_name(*labels: str) -> str:
    """A document-safe name for an audit from what it compares (e.g. the two tables' names):
    readable, with a short hash of the exact text so different inputs never share a history."""
    from blake3 import blake3

    text = "--".join(str(x) for x in labels)
    return f"{_slug(text, 100)}-{blake3(text.encode()).hexdigest()[:8]}"


def history_key(name: str) -> str:
    from concord.stores.base import validate_segment

    return f"{HISTORY_PREFIX}/{validate_segment(name, 'audit name')}/nights.json"


def night_of(value: "date | str | None") -> date:
    """A night as a date: ``value`` itself, parsed from YYYY-MM-DD, or today (UTC) for None."""
    if value is None:
        from datetime import datetime, timezone

        return datetime.now(timezone.utc).date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value))
    except ValueError as exc:
        raise DriftConfigError("night", f"{value!r} is not a date", "Give it as YYYY-MM-DD (UTC).") from exc


def _read_nights(store: "Store", name: str) -> dict[str, dict]:
    raw = store.get_document(history_key(name))
    if raw is None:
        return {}
    from concord.documents import MAX_SMALL_DOCUMENT_BYTES, load_json_document

    try:
        doc = load_json_document(raw, history_key(name), max_bytes=MAX_SMALL_DOCUMENT_BYTES)
        if doc.get("format") != HISTORY_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        return {str(n["night"]): n for n in doc["nights"] if isinstance(n.get("severities"), dict)}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}  # an unreadable history is no history: tonight starts a new chain


def previous_nights(store: "Store", name: str, night: "date | str | None" = None) -> dict[str, list[str]]:
    """Each column's severities on the nights before ``night`` (default today, UTC), oldest first,
    as :func:`~concord.audit.drift.data_drift` takes ``history``. Only an unbroken run of nights counts:
    walking back from the night before, the first night without a record (or without the column)
    ends that column's list."""
    tonight = night_of(night)
    nights = _read_nights(store, name)
    history: dict[str, list[str]] = {}
    open_columns: set[str] | None = None
    day = tonight - timedelta(days=1)
    while day.isoformat() in nights:
        severities = {c: s for c, s in nights[day.isoformat()]["severities"].items() if s in _RANK}
        columns = set(severities) if open_columns is None else open_columns & set(severities)
        for c in columns:
            history.setdefault(c, []).insert(0, severities[c])
        open_columns = columns
        day -= timedelta(days=1)
    return history


def record_night(store: "Store", name: str, severities: Mapping[str, str], night: "date | str | None" = None, *, severity: str | None = None) -> str:
    """Keep tonight's column severities (``DriftReport.severities()``) under ``name``; a second
    record of the same night replaces the first. Keeps the last :data:`HISTORY_NIGHTS` nights.
    Returns the document's key."""
    tonight = night_of(night).isoformat()
    nights = _read_nights(store, name)
    nights[tonight] = {
        "night": tonight,
        "severities": {str(c): s for c, s in severities.items()},
        "severity": severity or worst(s for s in severities.values() if s in _RANK),
    }
    kept = [nights[k] for k in sorted(nights)[-HISTORY_NIGHTS:]]
    doc = {"format": HISTORY_FORMAT, "name": name, "nights": kept}
    key = history_key(name)
    store.put_document(key, json.dumps(doc, indent=1, sort_keys=True).encode(), overwrite=True)
    return key
