"""What each tier holds: a ref per checkpoint copy, and a small record beside it.

A tier holds a copy of checkpoint ``NAME`` exactly when its store has the ref
``<namespace>/NAME`` (and the manifest it points at). Beside it, the document
``tiers/<namespace>/NAME.json`` records when the checkpoint was written, its step and size, and
when this copy was last verified and how. The ref is the truth; a record without a ref (a run
killed between the two deletions) is ignored and cleaned up by the next sweep.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from concord.stores.base import Store, validate_segment

RECORD_FORMAT = "concord/tier-copy@1"


def utc_iso(ts: float | None = None) -> str:
    when = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return when.isoformat(timespec="seconds")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def record_key(namespace: str, name: str) -> str:
    return f"tiers/{validate_segment(namespace, 'namespace')}/{validate_segment(name, 'checkpoint name')}.json"


@dataclass(frozen=True)
class CopyRecord:
    """One tier's copy of one checkpoint."""

    name: str
    root: str
    tier: str
    created: str  # when the checkpoint was written (its newest file), ISO UTC
    step: int | None
    bytes: int
    files: int
    added: str  # when this copy was made
    verified: str | None  # when this copy was last verified
    verified_how: str | None  # "blake3": every byte re-hashed; "on-write": hashed as sent; "present": archived, size and presence
    storage_class: str | None = None

    def to_json(self) -> bytes:
        return json.dumps({"format": RECORD_FORMAT, **asdict(self)}, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "CopyRecord | None":
        try:
            doc = json.loads(data)
            if doc.get("format") != RECORD_FORMAT:
                return None
            doc.pop("format")
            return cls(**doc)
        except (ValueError, TypeError, AttributeError):
            return None


def copies(store: Store, namespace: str) -> dict[str, str]:
    """``{checkpoint name: root}`` of every checkpoint copy the store holds in ``namespace``."""
    out = {}
    for ref in store.list_refs():
        ns, _, name = ref.partition("/")
        if ns == namespace and not name.startswith("_"):
            r = store.read_ref(ref)
            if r is not None:
                out[name] = r.root
    return out


def ref_created(store: Store, namespace: str, name: str) -> str | None:
    ref = store.read_ref(f"{namespace}/{name}")
    return ref.history[0].time if ref is not None else None


def read_records(store: Store, namespace: str) -> dict[str, CopyRecord]:
    out = {}
    for key in store.list_documents(f"tiers/{validate_segment(namespace, 'namespace')}"):
        if not key.endswith(".json"):
            continue
        data = store.get_document(key)
        rec = CopyRecord.from_json(data) if data is not None else None
        if rec is not None:
            out[rec.name] = rec
    return out


def write_record(store: Store, namespace: str, record: CopyRecord) -> None:
    store.put_document(record_key(namespace, record.name), record.to_json(), overwrite=True)


def delete_record(store: Store, namespace: str, name: str) -> None:
    store.delete_document(record_key(namespace, name))
