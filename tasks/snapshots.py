"""Tasks over one store's snapshots: take one, diff two, restore one, move a ref back.

Each task opens its stores from their specs, calls one core function, and returns a plain,
JSON-serialisable dict. Side effects (chunks, refs, files) make caching wrong here: refs move and
folders change under the same inputs, so every task runs every time.
"""

from __future__ import annotations

import os
import socket

from prefect import task
from prefect.cache_policies import NO_CACHE

from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, open_stores
from concord_pipelines.tasks.progress import PrefectProgress, run_logger


@task(name="snapshot", **RETRIED)
def snapshot_task(
    source: str,
    store: str,
    ref: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    message: str = "",
) -> dict:
    """Snapshot the checkpoint at ``source`` into ``store`` (and point ``ref`` at it).

    Emits ``concord.snapshot.created``. Safe to retry: chunks already written are not sent
    again, and a ref already at the new root is left as it is.
    """
    from concord.snapshots.snapshot import snapshot

    with open_stores(store) as (s,):
        r = snapshot(source, s, ref=ref, chunk_size=chunk_size, message=message, progress=PrefectProgress())
    return _announce(r, s.uri, os.path.abspath(source))


def _announce(r, store: str, source: str) -> dict:
    """A snapshot's result as a task returns it, after emitting ``concord.snapshot.created`` and
    logging it."""
    out = r.to_dict() | {"store": store, "source": source}
    related = [events.store(store, "store")] + ([events.ref(r.ref)] if r.ref else [])
    fields = ("root", "files", "tensors", "chunks", "bytes", "new_chunks", "new_bytes", "new_stored_bytes")
    payload = {k: out[k] for k in fields + ("store", "ref", "ref_version", "previous", "source")}
    out["event_id"] = events.emit(events.SNAPSHOT_CREATED, events.snapshot(r.root), related, payload)
    stored = f", {r.new_stored_bytes} stored" if r.new_stored_bytes != r.new_bytes else ""
    run_logger().info(
        "snapshot %s: %d files, %d tensors, %d bytes (%d new%s) in %s%s",
        r.root[:12], r.files, r.tensors, r.bytes, r.new_bytes, stored, store, f"; ref {r.ref} v{r.ref_version}" if r.ref else "",
    )
    return out


@task(name="snapshot-part", task_run_name="snapshot-part-{node}", **RETRIED)
def snapshot_part_task(
    folder: str, store: str, node: str, paths: list[str] | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> dict:
    """Store the chunks of the files of ``folder`` on this node in ``store``: this node's part of a
    spread snapshot (:func:`concord.snapshots.spread.snapshot_part`), as a dict for
    :func:`assemble_task`. Safe to retry: chunks already stored are not sent again."""
    from concord.snapshots.spread import snapshot_part

    with open_stores(store) as (s,):
        part = snapshot_part(folder, s, node=node, paths=paths, chunk_size=chunk_size, progress=PrefectProgress())
    run_logger().info(
        "node %s: %d files, %d bytes (%d new) of %s stored in %s",
        node, part.manifest.n_files, part.manifest.total_bytes, part.new_bytes, part.folder, s.uri,
    )
    return part.to_dict() | {"store": s.uri, "host": socket.gethostname()}


@task(name="assemble-spread", cache_policy=NO_CACHE)
def assemble_task(
    store: str, parts: list[dict], nodes: list[str], ref: str | None = None, message: str = "", allow_incomplete: bool = False
) -> dict:
    """One snapshot out of every node's part (:func:`concord.snapshots.spread.assemble`): the
    manifest written and ``ref`` moved, or nothing written when the parts do not make one
    snapshot (``allow_incomplete``: even one missing a storage file its DCP ``.metadata`` names).
    Emits ``concord.snapshot.created``."""
    from concord.snapshots.spread import assemble

    with open_stores(store) as (s,):
        r = assemble(s, parts, nodes=nodes, ref=ref, message=message, allow_incomplete=allow_incomplete)
    return _announce(r, s.uri, ", ".join(f"{p['node']}:{p['folder']}" for p in parts))


@task(name="diff", cache_policy=NO_CACHE)
def diff_task(store: str, a: str, b: str, against: str | None = None) -> dict:
    """Which files and tensors differ between snapshot ``a`` in ``store`` and ``b`` (in
    ``against`` if given, else in ``store``). ``a``/``b``: a ref, ``ref~N`` or a 64-hex root."""
    from concord.snapshots.diff import diff_manifests
    from concord.snapshots.refs import load_manifest, resolve_root

    with open_stores(store, against) as (sa, sb):
        sb = sb or sa
        ra, rb = resolve_root(sa, a), resolve_root(sb, b)
        d = diff_manifests(load_manifest(sa, ra), load_manifest(sb, rb), source=sb)
    run_logger().info("diff %s → %s: %d change(s), %d bytes differ", ra[:12], rb[:12], len(d.changes), d.bytes_differing)
    return d.to_dict() | {"store": sa.uri, "against": sb.uri, "a_spec": a, "b_spec": b}


@task(name="restore", **RETRIED)
def restore_task(store: str, snapshot: str, out_dir: str, trust_block: str | None = None) -> dict:
    """Write snapshot ``snapshot`` (ref, ``ref~N`` or root) of ``store`` into the new folder ``out_dir``.

    The folder appears only when complete, so a failed attempt leaves nothing to clean up. Under a
    trust policy (the trust block ``trust_block``, else ``$CONCORD_TRUSTED_KEYS``) a root no
    trusted key signed is refused before anything is written.
    """
    from concord.snapshots.refs import load_manifest, resolve_root
    from concord.snapshots.restore import restore
    from concord_pipelines.tasks.trust import trust_policy

    policy = trust_policy(trust_block)
    with open_stores(store) as (s,):
        root = resolve_root(s, snapshot)
        check = policy.restore_check if policy is not None else None
        r = restore(s, load_manifest(s, root), out_dir, progress=PrefectProgress(), check_root=check)
    if r.unchanged:
        run_logger().info("unchanged: %s already holds %s (%d files, checked by content)", r.path, r.root[:12], r.files)
    else:
        run_logger().info("restored %s: %d files, %d bytes into %s", r.root[:12], r.files, r.bytes, r.path)
    return r.to_dict() | {"store": s.uri, "snapshot": snapshot}


@task(name="rollback", cache_policy=NO_CACHE)
def rollback_task(store: str, ref: str, to: str | None = None) -> dict:
    """Move ``ref`` in ``store`` back to ``to`` (a root of its history, or 8+ hex of one), by
    default to the root it held before. Emits ``concord.ref.rolled-back``."""
    from concord.snapshots.refs import rollback

    with open_stores(store) as (s,):
        r = rollback(s, ref, to)
        current = s.read_ref(r.ref)
    history = [e.__dict__ for e in reversed(current.history)] if current else []
    out = r.to_dict() | {"store": s.uri, "history": history}
    out["event_id"] = events.emit(
        events.REF_ROLLED_BACK,
        events.ref(r.ref, role=None),  # the primary resource carries no role
        [events.store(s.uri, "store"), events.snapshot(r.root, "snapshot"), events.snapshot(r.previous, "previous")],
        {"ref": r.ref, "root": r.root, "previous": r.previous, "version": r.version, "store": s.uri},
    )
    run_logger().info("%s in %s: %s → %s (version %d)", r.ref, s.uri, r.previous[:12], r.root[:12], r.version)
    return out
