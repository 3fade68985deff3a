"""Import a ModelPack artifact from an OCI registry into a store, as a snapshot.

The manifest is checked first (a model artifact, unarchived layers, every file path inside the
folder) before a byte is written. Each layer is streamed into a file of a staging folder
(``$CONCORD_STAGING_DIR`` or the system's temporary folder), its SHA-256 and size checked as it
arrives; then the folder is snapshotted with the chunk size the artifact records, so a Concord
export comes back with the same root. The root is compared with the artifact's before the ref
moves; the staging folder is removed whatever happens. Signatures attached as referrers are
written to ``signatures/<root>/`` of the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable

from concord.errors.oci import OciDigestMismatchError, OciError, OciNotAModelError
from concord.oci import modelpack as mp
from concord.oci.reference import Reference
from concord.oci.registry import READ_SIZE, Registry
from concord.oci.signatures import keep_signatures, pull_signatures
from concord.progress import Progress, ensure
from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE, check_chunk_size
from concord.snapshots.snapshot import snapshot
from concord.stores.base import Store, check_writable_ref
from concord.trust import TrustPolicy, check_root

STAGING_DIR_ENV = "CONCORD_STAGING_DIR"


@dataclass(frozen=True)
class ImportResult:
    reference: str
    digest: str
    root: str
    files: int
    bytes: int
    new_bytes: int
    ref: str | None
    previous: str | None
    signatures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _chunk_size(annotations: dict, reference: str) -> int:
    text = annotations.get(mp.CHUNK_SIZE)
    if text is None:
        return DEFAULT_CHUNK_SIZE
    try:
        return check_chunk_size(int(text))
    except ValueError:
        raise OciNotAModelError(reference, f"its {mp.CHUNK_SIZE} annotation {text!r} is not a chunk size") from None


def _download(reg: Registry, layer: dict, dest: str, reference: str, path: str, prog: Progress) -> None:
    h = hashlib.sha256()
    size = 0
    r = reg.get_blob(layer["digest"])
    try:
        with open(dest, "wb") as out:
            for block in r.iter_content(READ_SIZE):
                size += len(block)
                if size > layer["size"]:
                    break
                h.update(block)
                out.write(block)
                prog.advance(len(block))
    finally:
        r.close()
    actual = "sha256:" + h.hexdigest()
    if size != layer["size"] or actual != layer["digest"]:
        got = f"{size} bytes" if size != layer["size"] else actual
        want = f"{layer['size']} bytes" if size != layer["size"] else layer["digest"]
        raise OciDigestMismatchError(reference, f"layer {path!r}", want, got)


def import_oci(
    ref: Reference,
    store: "Store | Callable[[], Store]",
    *,
    store_ref: str | None = None,
    plain_http: bool = False,
    progress: Progress | None = None,
    staging_dir: str | None = None,
    trust: "TrustPolicy | None" = None,
) -> ImportResult:
    """Pull the ModelPack artifact at ``ref`` into ``store`` as a snapshot (and point ``store_ref`` at it).

    ``store`` may be a function that opens it: it is called only once the manifest passed every
    check, so a refused artifact creates no store. With a ``trust`` policy, the imported root must
    be signed by a trusted key (a signature that came with the artifact) before the ref moves
    (:class:`~concord.errors.UntrustedRootError` otherwise; the snapshot stays unreferenced)."""
    store_ref = check_writable_ref(store_ref) if store_ref is not None else None
    reference = str(ref)
    prog = ensure(progress)
    with Registry(ref, plain_http=plain_http) as reg:
        data, _ = reg.get_manifest(ref.target)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if ref.digest and digest != ref.digest:
            raise OciDigestMismatchError(reference, "the manifest", ref.digest, digest)
        try:
            doc = json.loads(data)
        except ValueError:
            raise OciNotAModelError(reference, "its manifest is not JSON") from None
        layers = mp.check_model_manifest(doc, reference)
        annotations = doc.get("annotations") if isinstance(doc.get("annotations"), dict) else {}
        chunk_size = _chunk_size(annotations, reference)
        expected_root = annotations.get(mp.ROOT)
        if not isinstance(store, Store):
            store = store()
        root_dir = staging_dir or os.environ.get(STAGING_DIR_ENV) or None
        if root_dir:
            os.makedirs(root_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="concord-oci-", dir=root_dir)
        try:
            folder = os.path.join(tmp, "model")
            os.mkdir(folder)
            prog.start(sum(layer["size"] for _, layer in layers), "import")
            try:
                for path, layer in layers:
                    dest = os.path.join(folder, *path.split("/"))
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    _download(reg, layer, dest, reference, path, prog)
            finally:
                prog.close()
            current = store.read_ref(store_ref) if store_ref else None
            previous = current.root if current else None
            snap = snapshot(folder, store, chunk_size=chunk_size, progress=progress)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if expected_root and snap.root != expected_root:
            raise OciError(
                f"{reference}: its files snapshot to root {snap.root}, but the artifact says {expected_root}; "
                "the ref was not moved. The artifact was changed after it was published: push it again"
            )
        sigs = pull_signatures(reg, digest)
        keep_signatures(store, snap.root, sigs)
    check_root(store, snap.root, trust)
    if store_ref:
        store.cas_ref(store_ref, previous, snap.root, f"import of {reference} ({digest[:19]})")
    return ImportResult(
        reference=reference,
        digest=digest,
        root=snap.root,
        files=snap.files,
        bytes=snap.bytes,
        new_bytes=snap.new_bytes,
        ref=store_ref,
        previous=previous,
        signatures=[k for k, _ in sigs],
    )
