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

:func:`audit_data` runs the data audit of two inputs (read as :mod:`concord.audit.inputs` takes
them). The rest of the wing: :mod:`concord.audit.render` turns a report into markdown, table rows
and PNG plots; :mod:`concord.audit.history` keeps each night's column severities for the next
night's escalation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from concord.audit.drift import PRIORITIES, DriftReport, Prioritised
from concord.audit.inputs import INPUT_HELP, TableSource, check_contract, open_reference, open_table, stream_drift
from concord.audit.severity import SECTION_TITLES, SECTIONS, column_order, section_severity, worst
from concord.errors import DataFormatError, DriftConfigError

if TYPE_CHECKING:  # pragma: no cover
    from concord.lineage.contracts import Contract
    from concord.stores.base import Store

__all__ = ["AuditReport", "audit_data"]


def _as_dict(section: Any) -> dict | None:
    if section is None or isinstance(section, dict):
        return section
    if hasattr(section, "to_dict"):
        return section.to_dict()
    raise TypeError(f"an audit section must be a report with to_dict() or a dict, got {type(section).__name__}")



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
        drift: DriftReport | dict | None = None,
        reference: TableSource | dict | None = None,
        current: TableSource | dict | None = None,
        contract: dict | None = None,
        replicas: Any = None,
        cards: Any = None,
        errors: Mapping[str, str] | None = None,
        model: dict | None = None,
    ) -> AuditReport:
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
                out[name] = section_severity(section)
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
    bad = [x for x in r.get("replicas", []) if section_severity(x) != "ok"]
    if not bad:
        identical = sum(1 for x in reps if x.get("identical"))
        return f"{_plural(len(reps), 'replica')} consistent with {r.get('reference')} ({identical} identical)"
    return "; ".join(f"{x.get('cluster')}: {x.get('finding') or section_severity(x)}" for x in bad)


def _cards_summary(c: dict) -> str:
    clusters = c.get("clusters", [])
    bad = []
    for x in clusters:
        if section_severity(x) == "ok" and not x.get("missing_required") and not x.get("differing") and x.get("present", True):
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


def audit_data(
    reference: str | os.PathLike,
    current: str | os.PathLike,
    store: Store | None = None,
    *,
    contract: Contract | None = None,
    profile: str = "use",
    **options: Any,
) -> AuditReport:
    """The data audit ``concord audit data`` runs: the drift of ``current`` from ``reference`` (each a
    file, a data snapshot id or a ``data/<name>`` ref in ``store``), read batch by batch
    (:func:`stream_drift`, ``options`` are its keywords), and, with a
    ``contract``, the current table validated against it (read whole: great-expectations validates
    one DataFrame). The report's ``drift`` keeps the :class:`DriftReport` (its histograms draw the PNGs).
    ``reference`` may be a ``.profile`` file; a data snapshot's stored profile takes its place
    unless ``profile`` is "off" ("create" also profiles and stores one that has none:
    :func:`~concord.audit.inputs.open_reference`)."""
    with open_reference(reference, store, profile=profile) as ref, open_table(current, store, which="current") as cur:
        drift = stream_drift(ref, cur, **options)
        checked = None
        if contract is not None:
            try:
                frame = cur.read()
            except DataFormatError as exc:
                raise DriftConfigError("current", f"{cur.path}: {exc.problem}", INPUT_HELP) from exc
            checked = check_contract(contract, frame)
            del frame
    return AuditReport.assemble(drift=drift, reference=ref.source, current=cur.source, contract=checked)
