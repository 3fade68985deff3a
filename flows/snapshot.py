"""Pipelines over one store's snapshots: take one, diff two, restore one, roll a ref back.

Each flow runs its task(s) and writes what a person wants to see in the UI as artifacts. Store
parameters take a folder path, `file:///path`, `s3://bucket/prefix` or `block:NAME`;
relative paths are relative to the project folder deployments run in.
"""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import RefName, StoreAddress
from concord_pipelines.flows._report import MiB, cluster, human, md_facts, md_table, short
from concord_pipelines.tasks import diff_task, restore_task, rollback_task, sign_snapshot_task, snapshot_task

DEFAULT_STORE = "data/stores/us-east"
DEFAULT_REF = "models/minilm"

ChunkSizeMiB = Annotated[int, Field(ge=1, le=64, description="Chunk size in MiB (1 to 64).")]


@flow(name="snapshot-checkpoint", **ENDED_HOOKS)
def snapshot_checkpoint(
    source: str,
    store: StoreAddress = DEFAULT_STORE,
    ref: RefName | None = DEFAULT_REF,
    chunk_size_mib: ChunkSizeMiB = 4,
    message: str = "",
    trust_block: str | None = None,
) -> dict:
    """Snapshot a checkpoint folder into a store, and point a ref at it.

    Args:
        source: The checkpoint folder (or one file) to snapshot.
        store: The store to write into.
        ref: The ref (`namespace/name`) to move to the new snapshot; empty for none.
        chunk_size_mib: Chunk size in MiB; keep it the same across snapshots of one model so
            unchanged tensors share chunks.
        message: A note kept in the ref's history.
        trust_block: A saved Concord Trust block; with a signing key, the snapshot is signed
            (an OpenSSF Model Signing bundle kept in the store).
    """
    r = snapshot_task(source, store, ref=ref or None, chunk_size=chunk_size_mib * MiB, message=message)
    if trust_block:
        signed = sign_snapshot_task(store, r["root"], trust_block, ref=r["ref"])
        r = r | {"signed_by": [signed["key_id"]] if signed else []}
    rows = [
        ("root", f"`{r['root']}`"),
        ("files / tensors / chunks", f"{r['files']} / {r['tensors']} / {r['chunks']}"),
        ("size", human(r["bytes"])),
        ("new in store", f"{r['new_chunks']} chunk(s), {human(r['new_bytes'])}"
         + (f" ({human(r['new_stored_bytes'])} stored)" if r.get("new_stored_bytes", r["new_bytes"]) != r["new_bytes"] else "")),
    ]
    if r["ref"]:
        was = f" (was {short(r['previous'])})" if r["previous"] else " (a new ref)"
        rows.append(("ref", f"`{r['ref']}` → version {r['ref_version']}{was}"))
    if r.get("signed_by"):
        rows.append(("signed by", f"key `{r['signed_by'][0][:16]}`"))
    create_markdown_artifact(
        f"## Snapshot of `{r['source']}` in {cluster(r['store'])}\n\n" + md_facts(rows),
        key="snapshot-summary",
        description=f"snapshot {r['root'][:12]}",
    )
    return r


@flow(name="diff-snapshots", **ENDED_HOOKS)
def diff_snapshots(
    store: StoreAddress = DEFAULT_STORE,
    a: str = f"{DEFAULT_REF}~1",
    b: str = DEFAULT_REF,
    against: StoreAddress | None = None,
) -> dict:
    """List the files and tensors that differ between two snapshots.

    Args:
        store: The store holding snapshot `a` (and `b`, unless `against` is given).
        a: The older snapshot: a ref, `ref~N` (N versions back) or a 64-hex root.
        b: The newer snapshot, in the same forms.
        against: Look `b` up in this store instead (compare two clusters).
    """
    d = diff_task(store, a, b, against=against or None)
    if d["changes"]:  # no table of nothing: an empty one shows as a bare header in the UI
        create_table_artifact(
            [{"file": c["file"], "tensor": c["tensor"] or "", "kind": c["kind"]} for c in d["changes"]],
            key="diff-changes",
            description=f"{d['a'][:12]} → {d['b'][:12]}: changed files and tensors",
        )
    where = cluster(d["store"]) + (f" vs {cluster(d['against'])}" if d["against"] != d["store"] else "")
    if d["same"]:
        summary = f"## Diff in {where}\n\n`{a}` and `{b}` are the same snapshot {short(d['a'])}."
    else:
        kinds = {k: sum(1 for c in d["changes"] if c["kind"] == k) for k in ("changed", "added", "removed")}
        summary = (
            f"## Diff in {where}\n\n`{a}` ({short(d['a'])}) → `{b}` ({short(d['b'])})\n\n"
            + md_table(
                ["changes", "changed", "added", "removed", "chunks differing", "bytes differing"],
                [(len(d["changes"]), kinds["changed"], kinds["added"], kinds["removed"],
                  d["chunks_differing"], human(d["bytes_differing"]))],
            )
        )
    create_markdown_artifact(summary, key="diff-summary", description="snapshot diff summary")
    return d


@flow(name="restore-snapshot", **ENDED_HOOKS)
def restore_snapshot(
    store: StoreAddress = DEFAULT_STORE, snapshot: str = DEFAULT_REF, out_dir: str = "data/restores/minilm", trust_block: str | None = None
) -> dict:
    """Restore a snapshot into a new folder, byte-identical to the checkpoint it was taken from.

    Args:
        store: The store to restore from.
        snapshot: A ref, `ref~N` (N versions back) or a 64-hex root.
        out_dir: A folder that does not exist yet (or is empty); it appears only when complete.
        trust_block: A saved Concord Trust block; with trusted keys, a root none of them signed is
            refused and nothing is written (empty: the worker's CONCORD_TRUSTED_KEYS, if set).
    """
    r = restore_task(store, snapshot, out_dir, trust_block=trust_block or None)
    create_markdown_artifact(
        f"## Restored `{snapshot}` from {cluster(r['store'])}\n\n"
        + md_table(["root", "files", "size"], [(short(r["root"]), r["files"], human(r["bytes"]))])
        + f"\n\ninto `{r['path']}`",
        key="restore-summary",
        description=f"restore of {r['root'][:12]}",
    )
    return r


@flow(name="rollback-ref", **ENDED_HOOKS)
def rollback_ref(store: StoreAddress = DEFAULT_STORE, ref: RefName = DEFAULT_REF, to: str | None = None) -> dict:
    """Move a ref back to an earlier snapshot of its history (nothing is deleted).

    Args:
        store: The store whose ref moves.
        ref: The ref to move (`namespace/name`).
        to: A root from the ref's history (or its first 8+ hex digits); empty for the previous one.
    """
    r = rollback_task(store, ref, to=to or None)
    history = [(e["version"], short(e["root"]), e["time"], e["message"]) for e in r["history"]]
    create_markdown_artifact(
        f"## Rolled back `{r['ref']}` in {cluster(r['store'])}\n\n{short(r['previous'])} → {short(r['root'])} "
        f"(version {r['version']})\n\n### History (newest first)\n\n"
        + md_table(["version", "root", "time", "message"], history),
        key="rollback-summary",
        description=f"{r['ref']} → {r['root'][:12]}",
    )
    return r
