"""A snapshot of a checkpoint spread over several machines' local disks, taken where it lies.

A training job whose ranks write to node-local disks leaves each node with its own files (a PyTorch
DCP checkpoint: each rank's ``.distcp`` files). Each node snapshots the files it holds
(:func:`snapshot_part`): their chunks go into the shared store (S3, usually) under the node's own
write lease, and the node hands back a :class:`NodePart`, a manifest of its files alone that is
never written to the store. :func:`assemble` then takes every node's part and, under one write
lease of its own:

* checks them: each part a valid manifest (its hashes recomputed when it arrives as a dict), one
  chunk size, every expected node once, no path from two nodes with different contents (a file every
  node holds a copy of, such as the DCP ``.metadata``, counts once), no ``.distcp`` file cut as one blob on a node
  that lacked the ``.metadata`` another node has, every chunk the parts name held by the store, and
  every storage file a DCP ``.metadata`` names reported by some node (unless ``allow_incomplete``);
* builds the manifest of all the files as one snapshot of the whole folder would (the same file
  entries, sorted by path, so the same root);
* writes it, after every chunk it names, then moves the ref by compare-and-swap.

A refusal is one line and leaves nothing behind: no manifest written, no ref moved. The chunks the
parts stored stay, unnamed, until a garbage collection older than its grace period takes them (a
re-run sends none of them again).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from concord.errors import ManifestError, SourceNotFoundError, SpreadSnapshotError
from concord.progress import Progress, ensure
from concord.snapshots.formats.common import Unreadable
from concord.snapshots.formats.dcp import METADATA, SUFFIX
from concord.snapshots.formats.dcp import storage_files as dcp_storage_files
from concord.snapshots.formats.safepickle import MAX_PICKLE_BYTES
from concord.snapshots.manifest import (
    DEFAULT_CHUNK_SIZE,
    FileEntry,
    Manifest,
    check_chunk_size,
    safe_relpath,
)
from concord.snapshots.snapshot import SnapshotResult, _Snapshotter, collect_files
from concord.stores.base import Store, check_writable_ref
from concord.stores.leases import write_lease
from concord.text import control_char

__all__ = ["NodePart", "assemble", "snapshot_part"]

#: chunk ids named in a refusal at the most (the count is always complete)
NAMED = 3


@dataclass(frozen=True)
class NodePart:
    """What one node stored of a spread snapshot: the manifest of its files alone (never written
    to the store) and what it added to the store."""

    node: str
    folder: str
    manifest: Manifest = field(repr=False)
    new_chunks: int = 0
    new_bytes: int = 0
    new_stored_bytes: int = 0

    @property
    def chunk_size(self) -> int:
        return self.manifest.chunk_size

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (a task's result), read back by :meth:`from_dict`."""
        return {
            "node": self.node,
            "folder": self.folder,
            "root": self.manifest.root,
            "files": self.manifest.n_files,
            "bytes": self.manifest.total_bytes,
            "chunks": self.manifest.n_chunks,
            "new_chunks": self.new_chunks,
            "new_bytes": self.new_bytes,
            "new_stored_bytes": self.new_stored_bytes,
            "manifest": self.manifest.to_json().decode(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodePart:
        """A part from :meth:`to_dict`'s form, its manifest parsed and every hash recomputed."""
        node = d.get("node") if isinstance(d, Mapping) else None
        if not isinstance(node, str) or not node:
            raise SpreadSnapshotError("a part names no node (a dict from NodePart.to_dict is expected)")
        doc, folder = d.get("manifest"), d.get("folder", "")
        if not isinstance(doc, str) or not isinstance(folder, str):
            raise SpreadSnapshotError(f"node {node}'s part carries no manifest; take the part again with snapshot_part")
        counts = [d.get(k, 0) for k in ("new_chunks", "new_bytes", "new_stored_bytes")]
        if not all(type(n) is int and n >= 0 for n in counts):
            raise SpreadSnapshotError(f"node {node}'s part has counts that are not whole numbers; take the part again")
        try:
            manifest = Manifest.from_json(doc.encode(), expected_root=d.get("root"), verify=True)
        except ManifestError as exc:
            raise SpreadSnapshotError(f"node {node}'s part is not a valid manifest ({exc}); take the part again") from exc
        return cls(node, folder, manifest, *counts)


def snapshot_part(
    folder: str | os.PathLike[str],
    store: Store,
    *,
    node: str,
    paths: Iterable[str] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    progress: Progress | None = None,
    workers: int | None = None,
) -> NodePart:
    """Store the chunks of the files of ``folder`` (on this node's disk) in ``store``, and return
    this node's part of a spread snapshot, for :func:`assemble`.

    ``node`` names the node (every node of one snapshot a different name); ``paths`` the files of
    the folder (relative, ``/``-separated) this node takes, by default all of them. Each file is cut
    as a snapshot of the whole folder would cut it, so a DCP ``.distcp`` file needs the checkpoint's
    ``.metadata`` beside it on this node (copy it there: it is small). The chunks are durable in the
    store when this returns; nothing names them until :func:`assemble` writes the manifest.
    """
    check_chunk_size(chunk_size)
    if not isinstance(node, str) or not node or control_char(node) is not None:
        raise ValueError(f"node name {node!r} is not usable: give each node a printable, non-empty name")
    files = collect_files(folder)
    if paths is not None:
        wanted = {safe_relpath(p) for p in paths}
        have = {rel for rel, _ in files}
        for rel in sorted(wanted - have):
            raise SourceNotFoundError(os.path.join(os.path.abspath(os.fspath(folder)), rel))
        files = [f for f in files if f[0] in wanted]
    prog = ensure(progress)
    sizes = [os.path.getsize(p) for _, p in files]
    prog.start(sum(sizes), f"snapshot part {node}")
    snap = _Snapshotter(store, chunk_size, prog, workers)
    with write_lease(store, f"part {node} of a spread snapshot"):
        try:
            with ThreadPoolExecutor(snap.workers, thread_name_prefix="concord-snapshot") as pool:
                entries = snap.entries(files, pool, sizes)
        finally:
            prog.close()
        store.flush()  # durable before this node reports them
    return NodePart(
        node, os.path.abspath(os.fspath(folder)), Manifest.build(chunk_size, entries),
        snap.new_chunks, snap.new_bytes, snap.new_stored_bytes,
    )


def assemble(
    store: Store,
    parts: Iterable[NodePart | Mapping[str, Any]],
    *,
    nodes: Sequence[str] | None = None,
    ref: str | None = None,
    message: str = "",
    allow_incomplete: bool = False,
) -> SnapshotResult:
    """Build one snapshot out of every node's part (:func:`snapshot_part`), write its manifest
    and, with ``ref``, point that ref at its root (compare-and-swap). The root is the one a single
    snapshot of all the nodes' files in one folder would have.

    ``nodes`` names the nodes whose parts are expected (by default: those given); a part may be a
    :class:`NodePart` or its :meth:`~NodePart.to_dict` form (then checked as a manifest read from a
    store is). Refused with :class:`~concord.errors.SpreadSnapshotError`, before anything is
    written, when a node is missing or reported twice, the parts disagree on a file or the chunk
    size, the store lacks a chunk a part names, or a DCP ``.metadata`` among the files names a
    ``.distcp`` file no part holds (a rank whose node was left out); ``allow_incomplete=True``
    writes such a snapshot all the same (a checkpoint that cannot be loaded whole).
    """
    ref = check_writable_ref(ref) if ref is not None else None  # "" is a mistake, not "no ref"
    got = [p if isinstance(p, NodePart) else NodePart.from_dict(p) for p in parts]
    if not got:
        raise SpreadSnapshotError("no node reported a part; run snapshot_part (concord snapshot-part) on every node first")
    files = _merge(got, list(nodes) if nodes is not None else None)
    manifest = Manifest.build(got[0].chunk_size, files)
    what = f"spread snapshot of {len(got)} node(s)" + (f" to ref {ref}" if ref else "")
    with write_lease(store, what):
        _check_chunks(store, got)
        if not allow_incomplete:
            _check_complete(store, manifest)
        expected = None
        if ref:
            current = store.read_ref(ref)
            expected = current.root if current else None
        store.put_manifest(manifest.root, manifest.to_json())
        version = None
        if ref:
            version = store.cas_ref(ref, expected, manifest.root, message or what).version
    return SnapshotResult.of(
        manifest, new_chunks=sum(p.new_chunks for p in got), new_bytes=sum(p.new_bytes for p in got),
        new_stored_bytes=sum(p.new_stored_bytes for p in got), ref=ref, version=version, previous=expected,
    )


def _merge(parts: list[NodePart], nodes: list[str] | None) -> list[FileEntry]:
    """The file entries of all ``parts``, each path once, after the checks :func:`assemble` names."""
    seen: dict[str, NodePart] = {}
    for p in parts:
        if p.node in seen:
            raise SpreadSnapshotError(f"node {p.node} reported two parts; give each node its own name and report it once")
        seen[p.node] = p
    if nodes is not None:
        missing = [n for n in dict.fromkeys(nodes) if n not in seen]
        if missing:
            raise SpreadSnapshotError(
                f"node(s) {', '.join(missing)} never reported a part; run snapshot_part (concord snapshot-part) there, then assemble again"
            )
        extra = [n for n in seen if n not in nodes]
        if extra:
            raise SpreadSnapshotError(f"node(s) {', '.join(extra)} reported a part but are not among the nodes expected; name every node")
    sizes = {p.chunk_size for p in parts}
    if len(sizes) > 1:
        raise SpreadSnapshotError(
            f"the parts were cut at different chunk sizes ({', '.join(map(str, sorted(sizes)))}); take every part with one chunk size"
        )
    files: dict[str, tuple[FileEntry, NodePart]] = {}
    for p in parts:
        for f in p.manifest.files:
            other = files.get(f.path)
            if other is None:
                files[f.path] = (f, p)
            elif other[0].hash != f.hash:
                raise SpreadSnapshotError(
                    f"{f.path} was reported by node {other[1].node} and by node {p.node} with different contents; "
                    "give the file to one node (snapshot_part's paths) or make the copies equal"
                )
    _check_dcp_cuts(files)
    return [f for f, _ in files.values()]


def _check_dcp_cuts(files: dict[str, tuple[FileEntry, NodePart]]) -> None:
    """A ``.distcp`` file cut as one blob by a node that did not hold the ``.metadata`` of its
    folder, which another node reported: one folder would have cut it at its tensors."""
    for path, (f, p) in files.items():
        if f.kind != "blob" or not path.endswith(SUFFIX):
            continue
        md = posixpath.join(posixpath.dirname(path), METADATA)
        if md in files and md not in p.manifest.by_path:
            raise SpreadSnapshotError(
                f"node {p.node} cut {path} as one blob since it lacks the {md} node {files[md][1].node} has; "
                f"copy {md} beside it on node {p.node}, take that node's part again, then assemble"
            )


def _check_chunks(store: Store, parts: list[NodePart]) -> None:
    """Every chunk the parts name is in ``store`` (asked under the assembly's lease)."""
    for p in parts:
        ids = p.manifest.chunk_lengths()
        missing = sorted(set(ids) - store.has_chunks(ids))
        if missing:
            named = ", ".join(c[:12] for c in missing[:NAMED]) + (" …" if len(missing) > NAMED else "")
            raise SpreadSnapshotError(
                f"{store.uri} lacks {len(missing)} chunk(s) of node {p.node}'s part ({named}); "
                "take that node's part again into this store, then assemble"
            )


def _check_complete(store: Store, manifest: Manifest) -> None:
    """Every storage file each DCP ``.metadata`` of the snapshot names is among its files.

    The ``.metadata`` is read back from the store's chunks (the assembly need not hold the files)
    and walked as a pickle, never loaded. One that is not a DCP ``Metadata`` (or too large to be
    one) names no files, so it asks for none.
    """
    for f in manifest.files:
        if posixpath.basename(f.path) != METADATA or f.size > MAX_PICKLE_BYTES:
            continue
        data = b"".join(store.get_chunk(cid) for p in f.parts for cid in p.chunk_ids())
        try:
            named = dcp_storage_files(data)
        except Unreadable:
            continue
        folder = posixpath.dirname(f.path)
        missing = sorted(rel for rel in named if posixpath.join(folder, rel) not in manifest.by_path)
        if missing:
            shown = ", ".join(_with_rank(posixpath.join(folder, rel)) for rel in missing[:NAMED])
            raise SpreadSnapshotError(
                f"{f.path} names {len(missing)} storage file(s) no node reported ({shown}"
                + (" …" if len(missing) > NAMED else "")
                + "); run snapshot_part (concord snapshot-part) on the node(s) holding them and assemble every part, "
                "or accept a checkpoint that cannot be loaded whole (allow_incomplete=True, --allow-incomplete)"
            )


def _with_rank(path: str) -> str:
    """``ckpt/__3_0.distcp (rank 3)``: the rank DCP's file system writer puts in a file's name."""
    m = re.fullmatch(r"__(\d+)_\d+\.distcp", posixpath.basename(path))
    return f"{path} (rank {int(m.group(1))})" if m else path
