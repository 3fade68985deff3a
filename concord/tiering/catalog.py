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

from concord.stores.base import LEDGER_HEAD, Store, validate_segment

RECORD_FORMAT = "concord/tier-copy@1"


def utc_iso(ts: float | None = None) -> str:
    when = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return when.isoformat(timespec="milliseconds")  # as precise as ref times: the two are compared


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
    def from_json(cls, data: bytes, where: str = "tier record") -> CopyRecord | None:
        """The record in ``data``; None for a document of another format (not a record of this
        version). Anything else that is not a record (not JSON, too large or deep, a field missing
        or of the wrong type) raises :class:`~concord.errors.DocumentError` naming ``where``."""
        from concord.documents import (
            MAX_RECORD_BYTES,
            load_json_document,
            need_int,
            need_optional_int,
            need_optional_str,
            need_str,
        )
        from concord.errors import DocumentError
        from concord.hashing import is_digest

        def fail(problem: str) -> DocumentError:
            return DocumentError(
                where,
                problem,
                "Remove it: the copy itself (its ref) is untouched, and the record is written again the "
                "next time `concord tier sweep` copies or verifies that checkpoint.",
            )

        doc = load_json_document(data, where, max_bytes=MAX_RECORD_BYTES, error=fail)
        if doc.get("format") != RECORD_FORMAT:
            return None
        if not is_digest(doc.get("root")):
            raise fail("root is not a 64-hex digest")
        text = {k: need_str(doc.get(k), k, fail, max_len=1024) for k in ("name", "tier", "created", "added")}
        optional = {k: need_optional_str(doc.get(k), k, fail, max_len=1024) for k in ("verified", "verified_how", "storage_class")}
        return cls(
            root=doc["root"],
            step=need_optional_int(doc.get("step"), "step", fail),
            bytes=need_int(doc.get("bytes"), "bytes", fail, low=-1),
            files=need_int(doc.get("files"), "files", fail, low=-1),
            **text,
            **optional,
        )


def copies(store: Store, namespace: str) -> dict[str, str]:
    """``{checkpoint name: root}`` of every checkpoint copy the store holds in ``namespace``."""
    out = {}
    for ref in store.list_refs():
        ns, _, name = ref.partition("/")
        if ns == namespace and name != LEDGER_HEAD:  # every other ref there is a checkpoint
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
        rec = CopyRecord.from_json(data, f"tier record {key} in {store.uri}") if data is not None else None
        if rec is not None:
            out[rec.name] = rec
    return out


def write_record(store: Store, namespace: str, record: CopyRecord) -> None:
    store.put_document(record_key(namespace, record.name), record.to_json(), overwrite=True)


def delete_record(store: Store, namespace: str, name: str) -> None:
    store.delete_document(record_key(namespace, name))
