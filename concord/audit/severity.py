"""The vocabulary every part of an audit shares: its sections, how severities rank, the worst of several.

Severities are ``ok``, ``warning`` (P1) and ``critical`` (P0), as :mod:`concord.audit.drift` names
them; an audit's severity is the worst of its sections', and a section that says only ``ok: false``
counts as critical.
"""

from __future__ import annotations

from collections.abc import Iterable

from concord.audit.drift import SEVERITIES

__all__ = ["RANK", "SECTIONS", "SECTION_TITLES", "column_order", "section_severity", "worst"]

SECTIONS = ("data", "contract", "replicas", "cards")
SECTION_TITLES = {"data": "data drift", "contract": "contract", "replicas": "replicas", "cards": "model cards"}
#: a severity's rank, ok lowest
RANK = {s: i for i, s in enumerate(SEVERITIES)}


def worst(severities: Iterable[str]) -> str:
    """The worst of ``severities`` ("ok" when there is none)."""
    return max(severities, key=RANK.__getitem__, default="ok")


def section_severity(section: dict) -> str:
    """A section's (or a replica's, a card's) severity: its own, else critical when it says it is not ok."""
    sev = section.get("severity")
    if sev in RANK:
        return sev
    return "ok" if section.get("ok", True) else "critical"


def column_order(c: dict) -> tuple:
    """Sort key of a column's dict: worst severity first, then the largest PSI, then the name."""
    return (-RANK[c["severity"]], -(c.get("psi") or 0.0), c["column"])
