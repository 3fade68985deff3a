"""Rolling a model version out to serving nodes: a canary first, then the others in waves, every
switched node rolled back when a wave fails.

Each serving node runs a worker on its own work queue (``prefect worker start --pool
concord-serving --work-queue NODE``). ``checkout-node`` and ``rollback-node`` run on one node (the
rollout starts them there through their deployments, naming the node's queue); ``rollout``
sequences them, follows them in a progress artifact and its logs, and writes one node × state
table when every node is final.
"""

from __future__ import annotations

import re
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.states import Completed
from pydantic import AfterValidator, Field

from concord.stores.base import NAME_SEGMENT
from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import RefName, StoreAddress
from concord_pipelines.flows._report import cluster, events_line, md_table, short
from concord_pipelines.tasks import checkout_task, node_run_task, rollback_link_task

Node = Annotated[str, Field(pattern=re.compile(rf"^{NAME_SEGMENT}$"))]


def _unique(nodes: list[str]) -> list[str]:
    if len(set(nodes)) != len(nodes):
        raise ValueError("each node once: a node is the work queue its worker polls")
    return nodes


Nodes = Annotated[
    list[Node],
    Field(min_length=1, description="Serving nodes, by the work queue each one's worker polls; the first is the canary."),
    AfterValidator(_unique),
]
Dest = Annotated[
    str,
    Field(
        min_length=1,
        examples=["/srv/models/current", "/srv/{node}/current"],
        description="The link each node's serving process reads; {node} is replaced by the node's name.",
    ),
]
Root = Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$", description="A 64-hex root to roll out instead of the ref's.")]


def _root_of(store: str, ref: str) -> str:
    from concord.snapshots.refs import resolve_root
    from concord.stores import open_store_to_read

    src = open_store_to_read(store)
    try:
        return resolve_root(src, ref)
    finally:
        src.close()


class RolloutFailed(RuntimeError):
    """A node of the rollout failed; every node the rollout switched was rolled back."""


@flow(name="checkout-node", **ENDED_HOOKS)
def checkout_node(
    store: StoreAddress,
    dest: Dest,
    ref: RefName = "models/minilm",
    root: Root = "",
    node: str = "",
    keep: Annotated[int, Field(ge=1)] | None = 3,
    health_cmd: str | None = None,
    health_url: str | None = None,
    cache: str | None = None,
    trust: str | None = None,
):
    """Check a root out on this node beside its serving link and flip the link atomically.

    Args:
        store: The cluster's store holding the root.
        ref: The ref whose root to serve (when root is empty).
        root: The 64-hex snapshot root to serve (a rollout gives it, read once for every node).
        dest: The link the serving process reads ({node} is replaced by node).
        node: This node's name (its work queue); the host's name when empty.
        keep: Versions kept on the node after the flip (never the current one or the one before).
        health_cmd: Shell command run after the flip; failing, the link flips back.
        health_url: URL fetched after the flip; anything but 2xx flips back.
        cache: A local store the nodes of this host share downloads through.
        trust: Trusted public keys (PEM paths and block:NAME, comma-separated), or a policy file
            (keys by name, threshold): a root fewer than the threshold's distinct keys signed is refused.
    """
    r = checkout_task(
        store, root or _root_of(store, ref), dest.replace("{node}", node), node=node or None, keep=keep,
        health_cmd=health_cmd, health_url=health_url, cache=cache, trust=trust, ref=ref,
    )
    return Completed(name="Switched" if r["switched"] else "Unchanged", message=f"{r['path']} → {r['root']}")


@flow(name="rollback-node", **ENDED_HOOKS)
def rollback_node(dest: Dest, expect: str | None = None, node: str = "", reason: str = "by hand") -> dict:
    """Flip this node's serving link back to the version before (with expect: only if it names that root now).

    Args:
        dest: The link the serving process reads ({node} is replaced by node).
        expect: Roll back only if the link names this root now (a rollout undoing its own flip).
        node: This node's name (its work queue); the host's name when empty.
        reason: Why, kept in the event.
    """
    return rollback_link_task(dest.replace("{node}", node), expect=expect, node=node or None, reason=reason)


def _table(nodes: list[str], states: dict[str, str], title: str) -> str:
    return f"## {title}\n\n" + md_table(["node", "state"], [(f"`{n}`", states[n]) for n in nodes])


@flow(name="rollout", **ENDED_HOOKS)
def rollout_flow(
    store: StoreAddress,
    nodes: Nodes,
    dest: Dest = "/srv/models/current",
    ref: RefName = "models/minilm",
    root: Root = "",
    max_parallel: Annotated[int, Field(ge=1, le=64, description="Nodes switched at once in each wave after the canary.")] = 2,
    health_cmd: str | None = None,
    health_url: str | None = None,
    keep: Annotated[int, Field(ge=1)] | None = 3,
    node_timeout_s: Annotated[float, Field(gt=0)] = 1800,
) -> dict:
    """Roll a snapshot out to serving nodes: the canary (the first node) first, with its health
    gate, then the others in waves of max_parallel; when a node fails, every node switched so far
    is rolled back and the run fails.

    Args:
        store: The cluster's store the nodes check out from (ref and root are read here once).
        nodes: The serving nodes, by work queue; the first is the canary.
        dest: The link each node serves from ({node} is replaced by the node's name).
        ref: The ref whose root is rolled out (read once, at the start).
        root: A 64-hex root to roll out instead (an event's payload fills it).
        max_parallel: Nodes switched at once in each wave after the canary.
        health_cmd: Each node's health gate: a shell command run after its flip.
        health_url: Each node's health gate: a URL that must answer 2xx after its flip.
        keep: Versions kept on each node.
        node_timeout_s: How long to wait for one node's checkout.
    """
    log = get_run_logger()
    given = bool(root)
    root = root or _root_of(store, ref)
    params = {"store": store, "root": root, "ref": ref, "dest": dest, "keep": keep, "health_cmd": health_cmd, "health_url": health_url}
    waves = [nodes[:1]] + [nodes[i : i + max_parallel] for i in range(1, len(nodes), max_parallel)]
    states = {n: "waiting" for n in nodes}
    what = f"{root[:12]}" + ("" if given else f" ({ref} in {cluster(store)})")
    title = f"Rollout of {short(root)} to {len(nodes)} node(s)"
    log.info(
        "Concord rollout of snapshot %s to %d serving node(s): canary %s first%s; each node checks it out "
        "beside %s, every byte verified, then flips its link", what, len(nodes), nodes[0],
        f", then waves of {max_parallel}" if len(nodes) > 1 else "", dest,
    )
    progress = create_progress_artifact(0.0, key="rollout-progress", description=f"0 of {len(nodes)} node(s) switched")
    switched: list[str] = []
    failed: dict[str, str] = {}
    done = 0
    for n_wave, wave in enumerate(waves):
        for n in wave:
            states[n] = "checking out" + (" (canary)" if n_wave == 0 else f" (wave {n_wave})")
        log.info("%s: %s on %s", "canary" if n_wave == 0 else f"wave {n_wave}", "checkout-node", ", ".join(wave))
        futures = [node_run_task.submit("checkout", n, params | {"node": n}, node_timeout_s) for n in wave]
        for n, fut in zip(wave, futures):
            r = fut.result()
            done += 1
            if r["ok"]:
                states[n] = "switched" if r["switched"] else "unchanged (already served it)"
                if r["switched"]:
                    switched.append(n)
                log.info("%s: %s (%s)", n, states[n], r["message"] or r["state"])
            else:
                states[n] = f"**failed** ({r['state']}): {r['message']}"[:300]
                failed[n] = r["message"] or r["state"]
                log.error("%s: checkout failed (%s): %s", n, r["state"], r["message"])
        update_progress_artifact(progress, 100.0 * done / len(nodes), description=f"{done} of {len(nodes)} node(s) done")
        if failed:
            for n in nodes:
                if states[n] == "waiting":
                    states[n] = "not started"
            break
    rolled_back: list[str] = []
    if failed:
        futures = [
            node_run_task.submit("rollback", n, {"dest": dest, "expect": root, "node": n, "reason": "rollout"}, node_timeout_s)
            for n in switched
        ]
        for n, fut in zip(switched, futures):
            r = fut.result()
            states[n] = "rolled back" if r["ok"] else f"**rollback failed** ({r['state']}): {r['message']}"[:300]
            if r["ok"]:
                rolled_back.append(n)
            log.warning("%s: %s", n, states[n])
    # one table, once every node is final (the progress artifact follows the rollout as it goes)
    create_markdown_artifact(
        _table(nodes, states, title) + "\n\n" + events_line(), key="rollout-nodes",
        description=f"{len(switched)} of {len(nodes)} node(s) switched" + (f", {len(failed)} failed" if failed else ""),
    )
    log.info("Concord rollout of %s: %d switched, %d unchanged, %d failed, %d rolled back", root[:12], len(switched),
             sum(1 for v in states.values() if v.startswith("unchanged")), len(failed), len(rolled_back))
    summary = {"root": root, "nodes": dict(states), "switched": switched, "failed": failed, "rolled_back": rolled_back}
    if failed:
        listed = "; ".join(f"{n}: {m}" for n, m in failed.items())
        raise RolloutFailed(
            f"rollout of {root} failed on {len(failed)} node(s) ({listed}); rolled back: {', '.join(rolled_back) or 'none'}. "
            "Fix the version or the health gate, then roll out again."
        )
    return summary
