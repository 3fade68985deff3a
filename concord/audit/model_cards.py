"""Model cards: read the card a snapshot carries, and check that every cluster's card agrees.

A card is read from the top level of a snapshot (:func:`read_card`):

* ``README.md`` (any letter case), a Hugging Face model card: the YAML front matter between two
  ``---`` lines at the very top (``license``, ``datasets``, ``language``, ``tags``, ``pipeline_tag``,
  ``base_model``, ...) gives fields as they are, and some sections of the markdown body give fields
  of their own (:data:`SECTION_FIELDS`: ``## Intended uses`` → ``intended_use``, ...). A section's
  text runs to the next heading of the same or a higher level (its subsections included), with
  whitespace collapsed to single spaces; headings inside fenced code blocks do not count, and a
  section left at the template's ``[More Information Needed]`` counts as absent. Only ATX headings
  (``#`` to ``######``) are recognised.
* ``card.json`` and ``model_card.json``: one JSON object each, of extra fields (``retention``,
  ``data_sources``, ...). Where files name the same field, ``model_card.json`` wins over
  ``card.json``, and ``README.md`` wins over both.

Field values are JSON-safe (YAML dates become ISO strings). :func:`compare_cards` compares every
cluster's card with the reference cluster's after normalising each value (:func:`normalise`):
strings stripped, lists as sorted sets of strings (a one-item list equals the item itself), empty
values as absent. Severity per cluster: no readable card, or a differing field among ``critical``
(license, intended use, datasets), is "critical" (P0); a missing required field or any other
differing field is "warning" (P1). Nothing about a card makes the comparison raise: a missing ref,
README or field is a finding of the report.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from concord.audit.drift import SEVERITIES, Prioritised
from concord.audit.replicas import check_replicas
from concord.errors import ConcordError, ModelCardError, ModelCardNotFoundError, ReplicaConfigError
from concord.snapshots.manifest import FileEntry, Manifest
from concord.snapshots.refs import load_manifest, resolve_root
from concord.stores.base import Store

__all__ = [
    "CRITICAL_FIELDS",
    "DEFAULT_REQUIRED",
    "SECTION_FIELDS",
    "CardReport",
    "ClusterCard",
    "compare_cards",
    "normalise",
    "parse_readme",
    "read_card",
]

#: fields every card must have, by default
DEFAULT_REQUIRED = ("license", "intended_use", "datasets", "retention")
#: fields whose difference from the reference is critical, by default
CRITICAL_FIELDS = ("license", "intended_use", "datasets")
#: field ← headings that give it, most specific first; headings are compared normalised (lower
#: case, "&" as "and", punctuation and "[optional]" dropped, spaces collapsed)
SECTION_FIELDS: dict[str, tuple[str, ...]] = {
    "intended_use": ("intended uses", "intended use", "intended uses and limitations", "direct use", "uses"),
    "out_of_scope_use": ("out of scope use", "out of scope uses", "misuse and out of scope use"),
    "limitations": ("limitations", "bias risks and limitations", "limitations and bias", "risks and limitations"),
    "training_data": ("training data",),
}
#: the JSON card files, the later winning over the earlier where both name a field
JSON_CARDS = ("card.json", "model_card.json")
README = "readme.md"
#: a card file larger than this is not read (a card is a few kilobytes)
MAX_CARD_BYTES = 8 * 1024 * 1024
_PLACEHOLDERS = {"[more information needed]", "more information needed"}
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


# --------------------------------------------------------------------------- reading


def _json_safe(value: Any) -> Any:
    if isinstance(value, (_dt.date, _dt.datetime, _dt.time)):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    return str(value)


def _heading_key(title: str) -> str:
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # [text](link) → text
    t = re.sub(r"\[optional\]", " ", t, flags=re.IGNORECASE)
    t = t.lower().replace("&", " and ")
    t = re.sub(r"[^0-9a-z]+", " ", t)
    return " ".join(t.split())


def _sections(lines: list[str]) -> list[tuple[str, str]]:
    """``(normalised heading, whitespace-normalised text)`` of every heading, in order."""
    heads: list[tuple[int, int, str]] = []  # (line index, level, key)
    fence: str | None = None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
            continue
        if fence is not None:
            continue
        h = _HEADING.match(line)
        if h:
            heads.append((i, len(h.group(1)), _heading_key(h.group(2))))
    out = []
    for n, (i, level, key) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
        out.append((key, " ".join(" ".join(lines[i + 1 : end]).split())))
    return out


def parse_readme(text: str, where: str = "README.md") -> dict:
    """The fields of a Hugging Face model card: its YAML front matter, then :data:`SECTION_FIELDS`."""
    import yaml

    from concord.yamlsafe import load as load_yaml

    lines = text.lstrip("\ufeff").splitlines()
    fields: dict[str, Any] = {}
    body = lines
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None)
        if end is None:
            raise ModelCardError(where, "the front matter opened by '---' on the first line is never closed")
        try:
            meta = load_yaml("\n".join(lines[1:end]))  # no anchors or aliases: no alias bombs
        except yaml.YAMLError as exc:
            raise ModelCardError(where, f"the front matter is not valid YAML ({exc})") from exc
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise ModelCardError(where, f"the front matter is a YAML {type(meta).__name__}, not a mapping")
        fields.update(_json_safe(meta))
        body = lines[end + 1 :]
    sections = _sections(body)
    for name, aliases in SECTION_FIELDS.items():
        if name in fields:
            continue
        for alias in aliases:
            text = next((t for key, t in sections if key == alias and t.lower() not in _PLACEHOLDERS and t), None)
            if text is not None:
                fields[name] = text
                break
    return fields


def _read_file(store: Store, manifest: Manifest, entry: FileEntry) -> bytes:
    if entry.size > MAX_CARD_BYTES:
        raise ModelCardError(f"{entry.path} in {store.uri}", f"{entry.size} bytes is too large for a model card")
    data = bytearray()
    for part in entry.parts:
        for cid, _, _ in part.chunk_spans(manifest.chunk_size):
            data += store.get_chunk(cid)
    return bytes(data)


def read_card(store: Store, root: str) -> dict:
    """The model card of snapshot ``root`` (a root, or a ref such as ``NAME`` or ``NAME~1``) in ``store``.

    Raises :class:`ModelCardNotFoundError` if the snapshot has no card file at its top level and
    :class:`ModelCardError` if one cannot be read as a card.
    """
    root = resolve_root(store, root)
    manifest = load_manifest(store, root)
    top = {f.path.lower(): f for f in manifest.files if "/" not in f.path}
    readme = top.get(README)
    jsons = [top[n] for n in JSON_CARDS if n in top]
    if readme is None and not jsons:
        raise ModelCardNotFoundError(store.uri, root)
    fields: dict[str, Any] = {}
    for entry in jsons:
        where = f"{entry.path} of snapshot {root[:12]} in {store.uri}"
        from concord.documents import load_json_document

        doc = load_json_document(
            _read_file(store, manifest, entry), where, max_bytes=MAX_CARD_BYTES, expect=None,
            error=lambda problem, where=where: ModelCardError(where, problem),
        )
        if not isinstance(doc, dict):
            raise ModelCardError(where, f"holds a JSON {type(doc).__name__}, not an object")
        fields.update(_json_safe(doc))
    if readme is not None:
        where = f"{readme.path} of snapshot {root[:12]} in {store.uri}"
        try:
            text = _read_file(store, manifest, readme).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelCardError(where, f"not UTF-8 text ({exc})") from exc
        fields.update(parse_readme(text, where))
    return dict(sorted(fields.items()))


# --------------------------------------------------------------------------- comparing


def normalise(value: Any) -> Any:
    """A value as it is compared: strings stripped, lists as sorted sets of strings (one item: the
    item itself), mappings with sorted keys; None for an absent or empty value."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, Mapping):
        items = tuple(sorted((str(k), normalise(v)) for k, v in value.items()))
        items = tuple(kv for kv in items if kv[1] is not None)
        return items or None
    if isinstance(value, (list, tuple, set)):
        texts = set()
        for v in value:
            n = normalise(v)
            if n is not None:
                texts.add(n if isinstance(n, str) else json.dumps(n, sort_keys=True, default=str))
        if not texts:
            return None
        ordered = tuple(sorted(texts))
        return ordered[0] if len(ordered) == 1 else ordered
    return value


@dataclass(frozen=True)
class ClusterCard(Prioritised):
    """One cluster's card against the reference's. ``fields`` is the card as read (not in to_dict)."""

    cluster: str
    store: str
    spec: str
    root: str | None
    reference: bool
    present: bool  # a card was found and read
    severity: str
    finding: str
    missing_required: tuple[str, ...] = ()
    differing: tuple[dict, ...] = ()  # {field, reference, value}: values as read, None where absent
    fields: dict = field(default_factory=dict, repr=False, compare=False)


    def to_dict(self) -> dict:
        return {
            "cluster": self.cluster,
            "store": self.store,
            "spec": self.spec,
            "root": self.root,
            "reference": self.reference,
            "present": self.present,
            "severity": self.severity,
            "priority": self.priority,
            "finding": self.finding,
            "missing_required": list(self.missing_required),
            "differing": [dict(d) for d in self.differing],
        }


@dataclass(frozen=True)
class CardReport(Prioritised):
    reference: str
    required: tuple[str, ...]
    critical: tuple[str, ...]
    clusters: tuple[ClusterCard, ...]  # in the order given, the reference included
    severity: str

    @property
    def ok(self) -> bool:
        return self.severity == "ok"


    def cluster(self, label: str) -> ClusterCard:
        for c in self.clusters:
            if c.cluster == label:
                return c
        raise KeyError(f"no cluster {label!r} in this report; it has {', '.join(c.cluster for c in self.clusters)}")

    def to_dict(self) -> dict:
        return {
            "reference": self.reference,
            "required": list(self.required),
            "critical": list(self.critical),
            "severity": self.severity,
            "priority": self.priority,
            "ok": self.ok,
            "clusters": [c.to_dict() for c in self.clusters],
        }


def _field_names(value: Any, what: str) -> tuple[str, ...]:
    names_ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value)
    if not names_ok:
        raise ReplicaConfigError(
            "compare_cards",
            f"{what} must be a list of field names, got {value!r}",
            f"Pass e.g. {what}=('license', 'retention').",
        )
    return tuple(dict.fromkeys(value))


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compare_cards(
    cards: Mapping[str, tuple[Store, str]],
    *,
    reference: str | None = None,
    required: Sequence[str] = DEFAULT_REQUIRED,
    critical: Sequence[str] = CRITICAL_FIELDS,
) -> CardReport:
    """Compare every cluster's model card with the reference cluster's (``reference``, else the first).

    ``cards`` maps a cluster label to ``(store, ref or root)``, as :func:`concord.audit.replicas.replicas_of`
    builds it. ``required`` fields must be present (not empty) on every card; a differing field among
    ``critical`` is critical, any other a warning.
    """
    ref_label = check_replicas(cards, reference, "compare_cards")
    required = _field_names(required, "required")
    critical = _field_names(critical, "critical")
    read: dict[str, dict | str] = {}  # per cluster: the card, or why there is none
    roots: dict[str, str | None] = {}
    by_root: dict[str, dict | str] = {}  # one read per root: content addressing makes them equal
    for label, (store, spec) in cards.items():
        try:
            root = resolve_root(store, spec)
        except ConcordError as exc:
            roots[label], read[label] = None, f"cannot resolve {spec!r}: {exc}"
            continue
        roots[label] = root
        if root not in by_root:
            try:
                by_root[root] = read_card(store, root)
            except ModelCardNotFoundError as exc:
                by_root[root] = f"no model card: {exc}"
            except ConcordError as exc:
                by_root[root] = f"card unreadable: {exc}"
        read[label] = by_root[root]
    ref_card = read[ref_label]
    out = []
    for label, (store, spec) in cards.items():
        card = read[label]
        base = dict(cluster=label, store=store.uri, spec=spec, root=roots[label], reference=label == ref_label)
        if isinstance(card, str):
            out.append(ClusterCard(present=False, severity="critical", finding=card, **base))
            continue
        missing = tuple(f for f in required if normalise(card.get(f)) is None)
        differing: list[dict] = []
        if isinstance(ref_card, dict) and label != ref_label:
            names = sorted(ref_card.keys() | card.keys(), key=lambda f: (f not in critical, f))
            for f in names:
                if normalise(ref_card.get(f)) != normalise(card.get(f)):
                    differing.append({"field": f, "reference": ref_card.get(f), "value": card.get(f)})
        notes = []
        severity = "ok"
        bad = [d for d in differing if d["field"] in critical]
        if bad:
            severity = "critical"
            notes.extend(
                f"{d['field']} differs (reference {_short(d['reference'])}, here {_short(d['value'])})" for d in bad
            )
        others = [d["field"] for d in differing if d["field"] not in critical]
        if others:
            notes.append("other fields differ: " + ", ".join(others))
        if missing:
            notes.append("missing required: " + ", ".join(missing))
        if (others or missing) and severity == "ok":
            severity = "warning"
        if isinstance(ref_card, str) and label != ref_label:
            notes.append(f"not compared: the reference cluster {ref_label!r} has no readable card")
            severity = max(severity, "warning", key=_RANK.__getitem__)
        if not notes:
            notes.append("the reference card" if label == ref_label else "same card as the reference")
        out.append(
            ClusterCard(
                present=True, severity=severity, finding="; ".join(notes), missing_required=missing,
                differing=tuple(differing), fields=card, **base,
            )
        )
    worst = max((c.severity for c in out), key=_RANK.__getitem__)
    return CardReport(reference=ref_label, required=required, critical=critical, clusters=tuple(out), severity=worst)
