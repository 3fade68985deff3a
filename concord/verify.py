"""Re-hash what a store holds; report missing and corrupt chunks; repair from another store."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from concord.errors import ChunkNotFoundError, IntegrityError, ManifestError, ManifestNotFoundError
from concord.hashing import chunk_id
from concord.manifest import Manifest
from concord.progress import Progress, ensure
from concord.refs import resolve_root
from concord.stores.base import Store


@dataclass(frozen=True)
class VerifyResult:
    store: str
    roots: tuple[str, ...]
    chunks_checked: int
    missing: tuple[str, ...]
    corrupt: tuple[str, ...]
    repaired: tuple[str, ...]
    bad_manifests: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when nothing is missing or corrupt any more (after repair)."""
        broken = set(self.missing) | set(self.corrupt) | set(self.bad_manifests)
        return broken <= set(self.repaired)

    def to_dict(self) -> dict:
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}
        d["ok"] = self.ok
        return d


def _load(store: Store, root: str, repair_from: Store | None, repaired: list[str], bad: list[str]) -> Manifest | None:
    try:
        return Manifest.from_json(store.get_manifest_bytes(root), expected_root=root, verify=True)
    except (ManifestError, ManifestNotFoundError):
        bad.append(root)
        if repair_from is None:
            return None
        data = repair_from.get_manifest_bytes(root)
        manifest = Manifest.from_json(data, expected_root=root, verify=True)
        store.put_manifest(root, data, overwrite=True)  # replaces the damaged copy
        repaired.append(root)
        return manifest


def verify(
    store: Store,
    *,
    ref: str | None = None,
    root: str | None = None,
    repair_from: Store | None = None,
    progress: Progress | None = None,
) -> VerifyResult:
    """Check every chunk the snapshot named by ``ref``/``root`` needs, or with neither, every
    manifest and chunk in the store. With ``repair_from``, fetch good copies of what is bad."""
    repaired: list[str] = []
    bad_manifests: list[str] = []
    if ref or root:
        roots = [resolve_root(store, ref or root)]
    else:
        roots = sorted(store.iter_manifests())
    lengths: dict[str, int] = {}
    for r in roots:
        m = _load(store, r, repair_from, repaired, bad_manifests)
        if m is not None:
            lengths.update(m.chunk_lengths())
    if not (ref or root):
        for cid in store.iter_chunks():
            lengths.setdefault(cid, -1)
    prog = ensure(progress)
    prog.start(sum(n for n in lengths.values() if n > 0), "verify")

    def check(cid: str) -> str | None:
        data = store.read_chunk_raw(cid)
        if data is None:
            return "missing"
        prog.advance(len(data))
        expected_len = lengths[cid]
        if chunk_id(data) != cid or (expected_len >= 0 and len(data) != expected_len):
            return "corrupt"
        return None

    missing, corrupt = [], []
    ids = sorted(lengths)
    try:
        with ThreadPoolExecutor(store.parallelism, thread_name_prefix="concord-verify") as pool:
            for cid, state in zip(ids, pool.map(check, ids)):
                if state == "missing":
                    missing.append(cid)
                elif state == "corrupt":
                    corrupt.append(cid)
    finally:
        prog.close()
    if repair_from is not None:
        for cid in missing + corrupt:
            try:
                data = repair_from.get_chunk(cid, verify=True)
            except (ChunkNotFoundError, IntegrityError):
                continue  # reported as still broken: ok is False
            store.put_chunk(cid, data, verify=False, overwrite=True)
            repaired.append(cid)
    return VerifyResult(
        store=store.uri,
        roots=tuple(roots),
        chunks_checked=len(ids),
        missing=tuple(missing),
        corrupt=tuple(corrupt),
        repaired=tuple(repaired),
        bad_manifests=tuple(bad_manifests),
    )
