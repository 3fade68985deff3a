"""The events Concord's tasks emit, and the resource ids they speak about.

Automations match on these names (``concord.snapshot.created`` starts replication, a
``concord.replica.failed`` pages someone), so they are constants, in one place.

Resource ids::

    concord.snapshot.<root>      a snapshot, named by its Merkle root
    concord.store.<uri>          a store (a folder path, s3://bucket/prefix, ...)
    concord.ref.<namespace/name> a ref
"""

from __future__ import annotations

from typing import Any

SNAPSHOT_CREATED = "concord.snapshot.created"
REPLICA_UPDATED = "concord.replica.updated"
REPLICA_FAILED = "concord.replica.failed"
STORE_VERIFIED = "concord.store.verified"
REF_ROLLED_BACK = "concord.ref.rolled-back"


def snapshot_resource(root: str) -> str:
    return f"concord.snapshot.{root}"


def store_resource(uri: str) -> str:
    return f"concord.store.{uri}"


def ref_resource(ref: str) -> str:
    return f"concord.ref.{ref}"


def _resource(rid: str, name: str, role: str | None = None) -> dict[str, str]:
    out = {"prefect.resource.id": rid, "prefect.resource.name": name}
    if role is not None:
        out["prefect.resource.role"] = role
    return out


def snapshot(root: str, role: str | None = None) -> dict[str, str]:
    return _resource(snapshot_resource(root), root[:12], role)


def store(uri: str, role: str | None = None) -> dict[str, str]:
    return _resource(store_resource(uri), uri, role)


def ref(name: str, role: str = "ref") -> dict[str, str]:
    return _resource(ref_resource(name), name, role)


def emit(event: str, resource: dict[str, str], related: list[dict[str, str]], payload: dict[str, Any]) -> str | None:
    """Emit ``event``; the id of the event sent, or None where events are not delivered."""
    from prefect.events import emit_event

    sent = emit_event(event=event, resource=resource, related=related, payload=payload)
    return str(sent.id) if sent is not None else None
