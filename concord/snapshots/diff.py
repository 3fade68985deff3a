"""Merkle diff of two manifests: which files, tensors and chunks differ.

The walk descends only where hashes differ: equal roots end it at once, equal files are
skipped whole, and inside a changed file only parts whose hashes differ are opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from concord.snapshots.manifest import Manifest, Part


@dataclass(frozen=True)
class Change:
    file: str
    tensor: str | None
    kind: str  # "added" | "removed" | "changed"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "tensor": self.tensor, "kind": self.kind}


@dataclass(frozen=True)
class DiffResult:
    """What differs from snapshot ``a`` to ``b``: each file and tensor changed, and the chunks and
    bytes of ``b`` that ``a`` lacks."""

    a: str
    b: str
    same: bool
    changes: tuple[Change, ...]
    #: chunks of B (in the subtrees that differ) that A does not have there: what a sync A→B state moves
    chunks_differing: int
    bytes_differing: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "same": self.same,
            "changes": [c.to_dict() for c in self.changes],
            "chunks_differing": self.chunks_differing,
            "bytes_differing": self.bytes_differing,
        }


def diff_manifests(a: Manifest, b: Manifest) -> DiffResult:
    if a.root == b.root:
        return DiffResult(a.root, b.root, True, (), 0, 0)
    changes: list[Change] = []
    old_ids: set[str] = set()
    new_spans: dict[str, int] = {}
    fa, fb = a.by_path, b.by_path
    for path in sorted(fa.keys() | fb.keys()):
        x, y = fa.get(path), fb.get(path)
        if x is not None and y is not None and x.hash == y.hash:
            continue
        if y is None:
            changes.append(Change(path, None, "removed"))
            continue
        if x is None:
            changes.append(Change(path, None, "added"))
            for part in y.parts:
                _collect(part, b.chunk_size, new_spans)
            continue
        listed = False
        px, py = x.by_key, y.by_key
        for key in sorted(px.keys() | py.keys(), key=lambda k: (k[0] != "header", k)):
            p, q = px.get(key), py.get(key)
            if p is not None and q is not None and p.hash == q.hash:
                continue
            if p is not None:
                old_ids.update(p.chunk_ids())
            if q is not None:
                _collect(q, b.chunk_size, new_spans)
            if key[0] == "tensor":
                kind = "added" if p is None else "removed" if q is None else "changed"
                changes.append(Change(path, key[1], kind))
                listed = True
        if not listed:
            changes.append(Change(path, None, "changed"))
    moved = {cid: n for cid, n in new_spans.items() if cid not in old_ids}
    return DiffResult(a.root, b.root, False, tuple(changes), len(moved), sum(moved.values()))


def _collect(part: Part, chunk_size: int, out: dict[str, int]) -> None:
    for cid, _, n in part.chunk_spans(chunk_size):
        out[cid] = n
