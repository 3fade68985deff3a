"""Serving: check a root out beside a node's serving link, roll it back, and start either on a node.

``checkout_task`` and ``rollback_task`` run on the serving node itself (its worker polls the
node's own work queue); ``node_run_task`` starts one of them on a node from a rollout, through
the node's deployment, and waits for it.
"""

from __future__ import annotations

import socket

from prefect import task

from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, named_by
from concord_pipelines.tasks.progress import PrefectProgress, human_bytes, run_logger

#: the deployments a rollout starts on each node (``flow name/deployment name``)
CHECKOUT_DEPLOYMENT = "checkout-node/checkout-on-node"
ROLLBACK_DEPLOYMENT = "rollback-node/rollback-on-node"


def _node(node: str | None) -> str:
    return node or socket.gethostname()


def _checkout_run_name() -> str:
    """``checkout-<root, 12 hex>-<ref>``: readable in the UI, and still unique enough to find."""
    from prefect.runtime import task_run

    params = task_run.parameters
    ref = params.get("ref")
    return f"checkout-{str(params.get('root', ''))[:12]}" + (f"-{ref}" if ref else "")


@task(name="checkout", task_run_name=_checkout_run_name, **RETRIED)
def checkout_task(
    store: str,
    root: str,
    dest: str,
    *,
    node: str | None = None,
    keep: int | None = None,
    health_cmd: str | None = None,
    health_url: str | None = None,
    cache: str | None = None,
    trust: str | None = None,
    ref: str | None = None,
) -> dict:
    """Check ``root`` out beside ``dest`` on this node and flip the link (see
    :func:`concord.serving.checkout.checkout`); ``ref`` only names the task run. Emits ``concord.checkout.switched``, or
    ``concord.checkout.rolled_back`` when the health gate failed (then re-raises)."""
    from concord.errors import HealthCheckFailedError
    from concord.serving.checkout import checkout
    from concord.serving.health import HealthCheck
    from concord.snapshots.refs import load_manifest
    from concord.stores import open_store, open_store_to_read
    from concord.trust import check_root, load_policy

    node = _node(node)
    health = HealthCheck(cmd=health_cmd, url=health_url) if (health_cmd or health_url) else None
    policy = load_policy(trust)
    src = open_store_to_read(store)
    cache_store = open_store(cache) if cache else None
    try:
        check_root(src, root, policy)
        manifest = load_manifest(src, root)
        try:
            r = checkout(src, manifest, dest, cache=cache_store, keep=keep, health=health, trust=policy, progress=PrefectProgress())
        except HealthCheckFailedError as exc:
            events.emit(
                events.CHECKOUT_ROLLED_BACK, events.link(node, exc.path), [events.snapshot(root, "rejected")],
                {"node": node, "path": exc.path, "root": exc.restored, "rejected": root, "reason": "health", "error": str(exc)},
            )
            run_logger().error("%s: %s", node, exc)
            raise
    finally:
        src.close()
        if cache_store is not None:
            cache_store.close()
    out = r.to_dict() | {"node": node}
    if r.switched:
        out["event_id"] = events.emit(
            events.CHECKOUT_SWITCHED, events.link(node, r.path), [events.snapshot(r.root, "snapshot")],
            {k: out[k] for k in ("node", "path", "root", "previous", "bytes", "bytes_fetched", "bytes_reused", "seconds")},
        )
    run_logger().info(
        "Concord checkout on %s: %s → %s%s, %s fetched, %s reused from the versions already there",
        node, r.path, r.root[:12], f" ({ref})" if ref else "", human_bytes(r.bytes_fetched), human_bytes(r.bytes_reused),
    )
    return out


@task(name="rollback-link", task_run_name=named_by("rollback", "dest"))
def rollback_link_task(dest: str, *, expect: str | None = None, node: str | None = None, reason: str = "by hand") -> dict:
    """Flip ``dest`` back to its previous version (with ``expect``: only if it names that root
    now). Emits ``concord.checkout.rolled_back`` when it flipped."""
    from concord.serving.versions import rollback

    node = _node(node)
    r = rollback(dest, expect=expect)
    if r is None:
        run_logger().info("%s: %s does not name %s; nothing to roll back", node, dest, (expect or "")[:12])
        return {"node": node, "path": dest, "rolled_back": False}
    out = r.to_dict() | {"node": node, "rolled_back": True}
    out["event_id"] = events.emit(
        events.CHECKOUT_ROLLED_BACK, events.link(node, r.path), [events.snapshot(r.root, "snapshot")],
        {"node": node, "path": r.path, "root": r.root, "rejected": r.previous, "reason": reason},
    )
    run_logger().info("%s: %s rolled back to %s", node, r.path, r.root[:12])
    return out


@task(name="on-node", task_run_name="{action}-on-{node}")
def node_run_task(action: str, node: str, parameters: dict, timeout: float) -> dict:
    """Run the node's ``checkout`` or ``rollback`` deployment on its own work queue (named
    ``node``) and wait for it: ``{"node", "state", "ok", "switched", "flow_run_id"}``. A node's
    failure is its answer, returned, not raised: the rollout decides what follows."""
    from prefect.deployments import run_deployment

    name = CHECKOUT_DEPLOYMENT if action == "checkout" else ROLLBACK_DEPLOYMENT
    run = run_deployment(name, parameters=parameters, work_queue_name=node, timeout=timeout, poll_interval=1)
    state = run.state
    ok = bool(state is not None and state.is_completed())
    return {
        "node": node,
        "state": state.name if state is not None else "unknown",
        "ok": ok,
        "switched": ok and state.name == "Switched",
        "message": (state.message or "") if state is not None else "",
        "flow_run_id": str(run.id),
    }
