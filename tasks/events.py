"""Every event Concord's tasks emit, and the resource ids they speak about.

Automations match on these names (``concord.snapshot.created`` starts replication, a
``concord.replica.failed`` pages someone), so they are constants, in one place: the tasks emit
them from here, ``deployments/automations.py`` and the checkpoint watcher name them from here.

Events and their resources::

    concord.checkpoint.created    concord.checkpoint.<model>/<name>    the watcher: a finished checkpoint
    concord.snapshot.created      concord.snapshot.<root>
    concord.snapshot.signed       concord.snapshot.<root>   signed by a deployment's key (OMS bundle in the store)
    concord.replica.updated       concord.store.<target>
    concord.replica.failed        concord.store.<target>
    concord.store.verified        concord.store.<uri>
    concord.ref.rolled-back       concord.ref.<namespace/name>
    concord.tier.added            concord.checkpoint.<namespace>/<name>
    concord.tier.demoted          concord.checkpoint.<namespace>/<name>  (one per demotion)
    concord.tier.restored         concord.checkpoint.<namespace>/<name>
    concord.tier.violation        concord.tiers.<namespace>
    concord.drill.completed       concord.tiers.<namespace>
    concord.drill.failed          concord.tiers.<namespace>
    concord.federation.completed  concord.tenant.<tenant>
    concord.ledger.verified       concord.tenant.<tenant>
    concord.ledger.tampered       concord.tenant.<tenant>
    concord.data.registered       concord.data.<id>
    concord.contract.validated    concord.contract.<name@version>
    concord.contract.failed       concord.contract.<name@version>
    concord.model.registered      concord.model.<name>/<version>
    concord.model.promoted        concord.model.<name>/<version>   labelled concord.alias (champion, ...)
    concord.model.published       concord.model.<name>/<version>   pushed to an OCI registry
    concord.promotion.refused     concord.model.<name>/<version>
    concord.drift.detected        concord.audit.<name>   severity warning (P1) or critical (P0)
    concord.drift.audited         concord.audit.<name>   severity ok
    concord.checkout.switched     concord.link.<node>:<path>   a serving link now names a new root
    concord.checkout.rolled_back  concord.link.<node>:<path>   flipped back (health gate, rollout, by hand)

An audit's resource carries the labels ``concord.severity`` and ``concord.priority`` (P0, P1, or
"none"), so an automation's trigger can match a P0 alone without reading the payload.
"""

from __future__ import annotations

from typing import Any

CHECKPOINT_CREATED = "concord.checkpoint.created"
SNAPSHOT_CREATED = "concord.snapshot.created"
SNAPSHOT_SIGNED = "concord.snapshot.signed"
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
FEDERATION_COMPLETED = "concord.federation.completed"
LEDGER_VERIFIED = "concord.ledger.verified"
LEDGER_TAMPERED = "concord.ledger.tampered"
DATA_REGISTERED = "concord.data.registered"
CONTRACT_VALIDATED = "concord.contract.validated"
CONTRACT_FAILED = "concord.contract.failed"
MODEL_REGISTERED = "concord.model.registered"
MODEL_PROMOTED = "concord.model.promoted"
MODEL_PUBLISHED = "concord.model.published"
PROMOTION_REFUSED = "concord.promotion.refused"
DRIFT_DETECTED = "concord.drift.detected"
DRIFT_AUDITED = "concord.drift.audited"
CHECKOUT_SWITCHED = "concord.checkout.switched"
CHECKOUT_ROLLED_BACK = "concord.checkout.rolled_back"

#: items of a list (findings, violations, failures, drifted columns...) carried in an event's
#: payload at most; the task's result has them all
PAYLOAD_ITEMS = 20


# ----------------------------------------------------------------------------- resource ids


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


def tenant_resource(tenant: str) -> str:
    return f"concord.tenant.{tenant}"


def data_resource(snapshot_id: str) -> str:
    return f"concord.data.{snapshot_id}"


def contract_resource(ref: str) -> str:
    return f"concord.contract.{ref}"


def model_resource(name: str, version: str | int) -> str:
    return f"concord.model.{name}/{version}"


def audit_resource(name: str) -> str:
    return f"concord.audit.{name}"


def link_resource(node: str, path: str) -> str:
    return f"concord.link.{node}:{path}"


# ----------------------------------------------------------------------------- resources


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


def tenant(name: str, role: str | None = None) -> dict[str, str]:
    return _resource(tenant_resource(name), name, role)


def data(snapshot_id: str, name: str = "", role: str | None = None) -> dict[str, str]:
    return _resource(data_resource(snapshot_id), name or snapshot_id[:12], role)


def contract(ref: str, role: str | None = None) -> dict[str, str]:
    return _resource(contract_resource(ref), ref, role)


def model(name: str, version: str | int, role: str | None = None) -> dict[str, str]:
    return _resource(model_resource(name, version), f"{name}/{version}", role)


def promoted_model(name: str, version: str | int, alias: str) -> dict[str, str]:
    """A model version that was just promoted, labelled with its alias (``concord.alias``), so a
    trigger can match one alias (publish on ``champion``) without reading the payload."""
    return model(name, version) | {"concord.alias": alias}


def link(node: str, path: str, role: str | None = None) -> dict[str, str]:
    """A serving link on a node (the work queue its worker polls, or the host's name)."""
    return _resource(link_resource(node, path), f"{node}:{path}", role)


def audit(name: str, severity: str, priority: str | None) -> dict[str, str]:
    """An audit, labelled with its severity and priority (``"none"`` when it has none)."""
    return _resource(audit_resource(name), name) | {"concord.severity": severity, "concord.priority": priority or "none"}


# ----------------------------------------------------------------------------- sending


def emit(event: str, resource: dict[str, str], related: list[dict[str, str]], payload: dict[str, Any]) -> str | None:
    """Emit ``event``; the id of the event sent, or None where events are not delivered."""
    from prefect.events import emit_event

    sent = emit_event(event=event, resource=resource, related=related, payload=payload)
    return str(sent.id) if sent is not None else None
