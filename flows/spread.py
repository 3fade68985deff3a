"""A checkpoint spread over several nodes' local disks, snapshotted where it lies.

One ``snapshot-part`` task per node stores the chunks of that node's files in the shared store and
hands back a manifest of them; ``assemble-spread`` runs last, in the flow run's process, and writes
the one manifest of all of them (the root one snapshot of the whole folder would have) and moves
the ref. The part tasks run on the flow's task runner (``CONCORD_TASK_RUNNER``, see
``concord_pipelines.flows._runner``): on a running Dask scheduler each goes to the Dask worker that offers a resource
named after its node (``dask worker … --resources NODE=1``), so it reads that node's own disk; on
threads or a Dask cluster of this machine they all run here.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from pydantic import AfterValidator, BaseModel, Field

from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import NAME_PATTERN, RefName, StoreAddress
from concord_pipelines.flows._report import MiB, cluster, human, md_table, short
from concord_pipelines.flows._runner import describe, task_runner
from concord_pipelines.flows.snapshot import DEFAULT_REF, DEFAULT_STORE, ChunkSizeMiB
from concord_pipelines.tasks import assemble_task, snapshot_part_task


class SpreadNode(BaseModel):
    """One node of a spread checkpoint: its name and where the checkpoint lies on its disk."""

    name: Annotated[
        str,
        Field(
            pattern=NAME_PATTERN,
            description="The node's name, each node once; on a Dask scheduler its part runs on the worker "
            "that offers a resource of this name (dask worker … --resources NAME=1).",
        ),
    ]
    folder: Annotated[str, Field(min_length=1, description="The checkpoint folder on that node's own disk.")]
    paths: list[str] | None = Field(
        None, description="The files of that folder the node takes (relative, '/'-separated); empty for every file."
    )


def _unique(nodes: list[SpreadNode]) -> list[SpreadNode]:
    if len({n.name for n in nodes}) != len(nodes):
        raise ValueError("each node once: a node's name says which part is whose")
    return nodes


Nodes = Annotated[
    list[SpreadNode],
    Field(min_length=1, description="The nodes holding the checkpoint's files, each with its folder."),
    AfterValidator(_unique),
]
TimeoutMinutes = Annotated[
    float, Field(gt=0, description="How long to wait for every node's part; a node not done by then fails the run.")
]


class PartsMissing(RuntimeError):
    """A node's part failed or did not finish in time, so nothing was assembled."""


def on_node(runner, node: str) -> AbstractContextManager:
    """Where a task submitted in the body runs: on a running Dask scheduler, on a worker offering
    the resource ``node``; on any other runner, where that runner puts it."""
    if type(runner).__name__ == "DaskTaskRunner" and getattr(runner, "address", None):
        import dask

        return dask.annotate(resources={node: 1})
    return nullcontext()


@flow(name="snapshot-spread", task_runner=task_runner(), **ENDED_HOOKS)
def snapshot_spread(
    nodes: Nodes,
    store: StoreAddress = DEFAULT_STORE,
    ref: RefName | None = DEFAULT_REF,
    chunk_size_mib: ChunkSizeMiB = 4,
    message: str = "",
    timeout_minutes: TimeoutMinutes = 120,
    allow_incomplete: bool = False,
) -> dict:
    """Snapshot a checkpoint whose files lie on several nodes' own disks into one store: each node
    stores its files' chunks, then one manifest names them all (the root a snapshot of the whole
    folder would have) and the ref moves.

    Args:
        nodes: The nodes holding the checkpoint's files, each with its folder (and, optionally,
            the files of it that node takes).
        store: The store every node writes into (shared by them: an s3:// address or a block).
        ref: The ref (`namespace/name`) to move to the new snapshot; empty for none.
        chunk_size_mib: Chunk size in MiB, the same on every node.
        message: A note kept in the ref's history.
        timeout_minutes: How long to wait for every node's part before the run fails.
        allow_incomplete: Assemble even when the nodes' files miss a storage file a DCP
            `.metadata` names (a checkpoint that cannot be loaded whole); off, that is refused.
    """
    runner = FlowRunContext.get().task_runner
    get_run_logger().info("taking the parts of %d node(s) on %s", len(nodes), describe(runner))
    futures = []
    for n in nodes:
        with on_node(runner, n.name):
            futures.append(snapshot_part_task.submit(n.folder, store, n.name, n.paths, chunk_size_mib * MiB))
    deadline = time.monotonic() + timeout_minutes * 60
    for f in futures:  # each one's final state is known once it has been waited for
        f.wait(timeout=max(0.0, deadline - time.monotonic()))
    failed = [n.name for n, f in zip(nodes, futures) if not f.state.is_completed()]
    if failed:
        raise PartsMissing(
            f"node(s) {', '.join(failed)} did not store their part (failed, or not done within {timeout_minutes:g} "
            "minutes): nothing was assembled and no ref moved; run again (what the other nodes stored is not sent again)"
        )
    parts = [f.result() for f in futures]
    r = assemble_task(store, parts, [n.name for n in nodes], ref=ref or None, message=message, allow_incomplete=allow_incomplete)
    rows = [(p["node"], p["host"], p["files"], human(p["bytes"]), human(p["new_bytes"])) for p in parts]
    head = f"## Spread snapshot {short(r['root'])} in {cluster(r['store'])}\n\n"
    head += f"root `{r['root']}`: {r['files']} files, {human(r['bytes'])}"
    if r["ref"]:
        head += f"; ref `{r['ref']}` → version {r['ref_version']}"
    create_markdown_artifact(
        head + "\n\n" + md_table(["node", "host", "files", "size", "new in store"], rows)
        + "\n\n" + "\n".join(f"- {p['node']}: `{p['folder']}`" for p in parts),
        key="spread-snapshot",
        description=f"spread snapshot {r['root'][:12]}",
    )
    return r | {"parts": [{k: v for k, v in p.items() if k != "manifest"} for p in parts]}
