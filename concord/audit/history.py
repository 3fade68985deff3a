"""Consecutive nights: each night's column severities, kept for the next night's escalation.

:func:`previous_nights` and :func:`record_night` keep each night's column severities in a small
JSON document of a store (``audits/<name>/nights.json``, ``name`` from
:func:`concord.audit.inputs.audit_name`), so that the next night's
:func:`~concord.audit.drift.data_drift` gets them as ``history``. A night is a UTC date; running
the same night again replaces its record, and a night without a record breaks the chain.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import date, timedelta
from typing import TYPE_CHECKING

from concord.audit.severity import RANK, worst
from concord.errors import DriftConfigError

if TYPE_CHECKING:  # pragma: no cover
    from concord.stores.base import Store

__all__ = ["HISTORY_FORMAT", "HISTORY_NIGHTS", "HISTORY_PREFIX", "history_key", "night_of", "previous_nights", "record_night"]

HISTORY_PREFIX = "audits"
HISTORY_FORMAT = "concord/drift-nights@1"
#: nights kept per audit (far more than any escalation rule needs)
HISTORY_NIGHTS = 60


def history_key(name: str) -> str:
    from concord.stores.base import validate_segment

    return f"{HISTORY_PREFIX}/{validate_segment(name, 'audit name')}/nights.json"


def night_of(value: date | str | None) -> date:
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


def _read_nights(store: Store, name: str) -> dict[str, dict]:
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


def previous_nights(store: Store, name: str, night: date | str | None = None) -> dict[str, list[str]]:
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
        severities = {c: s for c, s in nights[day.isoformat()]["severities"].items() if s in RANK}
        columns = set(severities) if open_columns is None else open_columns & set(severities)
        for c in columns:
            history.setdefault(c, []).insert(0, severities[c])
        open_columns = columns
        day -= timedelta(days=1)
    return history


def record_night(store: Store, name: str, severities: Mapping[str, str], night: date | str | None = None, *, severity: str | None = None) -> str:
    """Keep tonight's column severities (``DriftReport.severities()``) under ``name``; a second
    record of the same night replaces the first. Keeps the last :data:`HISTORY_NIGHTS` nights.
    Returns the document's key."""
    tonight = night_of(night).isoformat()
    nights = _read_nights(store, name)
    nights[tonight] = {
        "night": tonight,
        "severities": {str(c): s for c, s in severities.items()},
        "severity": severity or worst(s for s in severities.values() if s in RANK),
    }
    kept = [nights[k] for k in sorted(nights)[-HISTORY_NIGHTS:]]
    doc = {"format": HISTORY_FORMAT, "name": name, "nights": kept}
    key = history_key(name)
    store.put_document(key, json.dumps(doc, indent=1, sort_keys=True).encode(), overwrite=True)
    return key
