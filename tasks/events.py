"""The events Concord's tasks emit, and the resource ids they speak about.

Automations match on these names (``concord.snapshot.created`` starts replication, a
``concord.replica.failed`` pages someone), so they are constants, in one place.

Resource ids::

    concord.snapshot.<root>      a snapshot, named by its Merkle root
    concord.store.<uri>          a store (a folder path, s3://bucket/prefix, ...)
    concord.ref.<namespace/name> a ref
    concord.checkpoint.<namespace/name>  a tiered checkpoint (one per name, whatever tiers hold it)
    concord.tiers.<namespace>    a namespace's hot, warm and cold tiers (sweeps, drills)
"""

from __future__ import annotations

from typing import Any

SNAPSHOT_CREATED = "concord.snapshot.created"
REPLICA_UPDATED = "concord.replica.updated"
REPLICA_FAILED = "concord.replica.failed"
STORE_VERIFIED = "concord.store.verified"
REF_ROLLED_BACK = "concord.ref.rolled-back"
TIER_ADDED = "concord.tier.added"
TIER_DEMOTED = "concord.tier.demoted"
TIER_RESTORED = "concord.tier.restored"
TIER_VIOLATION = "concord.tier.violation"
DRILL_COMPLETED = "concord.drill.completed"
DRILL_FAILED = "concord.drill.failed"
CHECKPOINT_CREATED = "concord.checkpoint.created"


def snapshot_resource(root: str) -> str:
    return f"concord.snapshot.{root}"


def store_resource(uri: str) -> str:
    return f"concord.store.{uri}"


def ref_resource(ref: str) -> str:
    return f"concord.ref.{ref}"


def checkpoint_resource(namespace: str, name: str) -> str:
    return f"concord.checkpoint.{namespace}/{name}"


def tiers_resource(namespace: str) -> str:
    return f"concord.tiers.{namespace}"


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


def checkpoint(namespace: str, name: str, role: str | None = None) -> dict[str, str]:
    return _resource(checkpoint_resource(namespace, name), f"{namespace}/{name}", role)


def tiers(namespace: str, role: str | None = None) -> dict[str, str]:
    return _resource(tiers_resource(namespace), namespace, role)


def emit(event: str, resource: dict[str, str], related: list[dict[str, str]], payload: dict[str, Any]) -> str | None:
    """Emit ``event``; the id of the event sent, or None where events are not delivered."""
    from prefect.events import emit_event

    sent = emit_event(event=event, resource=resource, related=related, payload=payload)
    return str(sent.id) if sent is not None else None
