"""Import a ModelPack artifact from an OCI registry into a store, as a snapshot.

Stage everything, check everything, then commit. The manifest is checked first (its shape, a
model artifact, unarchived layers, every file path inside the folder). Each layer is streamed
into a file of a staging folder (``$CONCORD_STAGING_DIR`` or the system's temporary folder), its
SHA-256 and size checked as it arrives; the folder is snapshotted, with the chunk size the
artifact records, into a staging store beside it, so a Concord export comes back with the same
root, which is compared with the artifact's. The signatures attached as referrers must hold for
that root (:func:`~concord.oci.signatures.check_holds`), and a trust policy must trust it with
the signatures the target will hold. Only then is the target store opened and written, in the
order a reader can rely on: the chunks it lacks, the manifest, the signatures it has none of by
that key (a signature it holds is never replaced), the ref last. A refused import leaves the
target exactly as it was; the staging folder is removed whatever happens (an exception, an
interrupt).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from concord.errors import UntrustedRootError
from concord.errors.oci import (
    OciDigestMismatchError,
    OciError,
    OciNotAModelError,
    OciRegistryUnreachableError,
    OciTimeoutError,
)
from concord.oci import modelpack as mp
from concord.oci.reference import Reference
from concord.oci.registry import ATTEMPTS, BACKOFF, Registry, document
from concord.oci.signatures import check_holds, keep_signatures, pull_signatures
from concord.progress import Progress, ensure
from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE, check_chunk_size
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import chunk_dtypes, copy_chunks, missing_chunks
from concord.stores.base import Store, check_writable_ref
from concord.stores.leases import write_lease
from concord.stores.local import LocalDirStore
from concord.trust import (
    TrustPolicy,
    check_root,
    signature_documents,
    signature_key,
    verify_bundle,
)

STAGING_DIR_ENV = "CONCORD_STAGING_DIR"


@dataclass(frozen=True)
class ImportResult:
    """A ModelPack artifact pulled into a store: its digest, the root, what was new, the ref moved."""

    reference: str
    digest: str
    root: str
    files: int
    bytes: int
    new_bytes: int
    ref: str | None
    previous: str | None
    signatures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _chunk_size(annotations: dict[str, str], reference: str) -> int:
    text = annotations.get(mp.CHUNK_SIZE)
    if text is None:
        return DEFAULT_CHUNK_SIZE
    try:
        if not isinstance(text, str) or not text.isdigit() or len(text) > 12:
            raise ValueError(text)
        return check_chunk_size(int(text))
    except ValueError:
        raise OciNotAModelError(reference, f"its {mp.CHUNK_SIZE} annotation {str(text)[:40]!r} is not a chunk size") from None


def _expected_root(annotations: dict[str, str], reference: str) -> str | None:
    root = annotations.get(mp.ROOT)
    if root is None:
        return None
    if not (isinstance(root, str) and len(root) == 64 and all(c in "0123456789abcdef" for c in root)):
        raise OciNotAModelError(reference, f"its {mp.ROOT} annotation {str(root)[:40]!r} is not a 64-hex root")
    return root


def _download(reg: Registry, layer: dict[str, Any], dest: str, reference: str, path: str, prog: Progress) -> str:
    """Stream one layer into ``dest``, checking its size and SHA-256; the hex digest. A body
    that breaks off is fetched again from its start (:data:`~concord.oci.registry.ATTEMPTS`)."""
    for attempt in range(1, ATTEMPTS + 1):
        h = hashlib.sha256()
        size = 0
        try:
            with open(dest, "wb") as out:
                for block in reg.blob_blocks(layer["digest"], layer["size"]):  # refused past the declared size
                    size += len(block)
                    h.update(block)
                    out.write(block)
                    prog.advance(len(block))
            break
        except OciRegistryUnreachableError as exc:
            if isinstance(exc, OciTimeoutError) or attempt == ATTEMPTS:
                raise
            time.sleep(BACKOFF * 2 ** (attempt - 1))
    actual = "sha256:" + h.hexdigest()
    if size != layer["size"] or actual != layer["digest"]:
        got = f"{size} bytes" if size != layer["size"] else actual
        want = f"{layer['size']} bytes" if size != layer["size"] else layer["digest"]
        raise OciDigestMismatchError(reference, f"layer {path!r}", want, got)
    return h.hexdigest()


@contextmanager
def _staging(staging_dir: str | None) -> Iterator[str]:
    """A fresh staging folder, removed on the way out whatever happened (an interrupt too)."""
    root_dir = staging_dir or os.environ.get(STAGING_DIR_ENV) or None
    if root_dir:
        os.makedirs(root_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="concord-oci-", dir=root_dir)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def import_oci(
    ref: Reference,
    store: Store | Callable[[], Store],
    *,
    store_ref: str | None = None,
    plain_http: bool = False,
    progress: Progress | None = None,
    staging_dir: str | None = None,
    trust: TrustPolicy | None = None,
) -> ImportResult:
    """Pull the ModelPack artifact at ``ref`` into ``store`` as a snapshot (and point ``store_ref`` at it).

    ``store`` may be a function that opens it: it is called only once the artifact passed every
    check, so a refused artifact creates no store. A signature attached to the artifact that
    cannot hold for its root refuses the import (:class:`~concord.errors.SignatureError`). With
    a ``trust`` policy, the imported root must be signed by a trusted key (a signature that came
    with the artifact, or one the store already holds), and every attached signature by a
    trusted key must verify (:class:`~concord.errors.UntrustedRootError` otherwise). Whatever
    refuses the import, ``store`` is left as it was."""
    store_ref = check_writable_ref(store_ref) if store_ref is not None else None
    reference = str(ref)
    prog = ensure(progress)
    with Registry(ref, plain_http=plain_http) as reg, _staging(staging_dir) as tmp:
        data, _ = reg.get_manifest(ref.target)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if ref.digest and digest != ref.digest:
            raise OciDigestMismatchError(reference, "the manifest", ref.digest, digest)
        doc = document(data, reference, "manifest")
        layers = mp.check_model_manifest(doc, reference)
        annotations = doc.get("annotations") or {}
        chunk_size = _chunk_size(annotations, reference)
        expected_root = _expected_root(annotations, reference)

        # stage: the files, then a store of their snapshot
        folder = os.path.join(tmp, "model")
        os.mkdir(folder)
        sha256: dict[str, str] = {}
        prog.start(sum(layer["size"] for _, layer in layers), "import")
        try:
            for path, layer in layers:
                dest = os.path.join(folder, *path.split("/"))
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                sha256[path] = _download(reg, layer, dest, reference, path, prog)
        finally:
            prog.close()
        staged = LocalDirStore(os.path.join(tmp, "store"))
        snap = snapshot(folder, staged, chunk_size=chunk_size, progress=progress)
        shutil.rmtree(folder, ignore_errors=True)  # its bytes are in the staging store now
        root = snap.root
        if expected_root and root != expected_root:
            raise OciError(
                f"{reference}: its files snapshot to root {root}, but the artifact says {expected_root}; "
                "nothing was imported. The artifact was changed after it was published: push it again"
            )
        manifest_bytes = staged.get_manifest_bytes(root)
        manifest = load_manifest(staged, root)

        # check: every attached signature holds for the root; the policy trusts it
        sigs = pull_signatures(reg, digest)
        for key_id, bundle in sigs:
            where = f"{key_id[:16]} attached to {reference}"
            check_holds(staged, root, manifest, key_id, bundle, where, sha256)
            if trust is not None and key_id in trust.key_ids:
                verify_bundle(staged, root, bundle, trust.keys, where=where, manifest=manifest)
        if not isinstance(store, Store):
            store = store()
        held = signature_documents(store, root)
        new = [(k, b) for k, b in dict(sigs).items() if k not in held]
        for key_id, bundle in list(held.items()) + new:  # what the target will hold for the root
            staged.put_document(signature_key(root, key_id), bundle, overwrite=True)
        try:
            check_root(staged, root, trust)
        except UntrustedRootError as exc:
            raise UntrustedRootError(store.uri, root, exc.tried, exc.problems) from None

        # commit: chunks, manifest, signatures, ref last
        with write_lease(store, f"import of {reference}" + (f" to ref {store_ref}" if store_ref else "")):
            current = store.read_ref(store_ref) if store_ref else None
            previous = current.root if current else None
            missing = missing_chunks(store, list(manifest.chunk_lengths()))
            lengths = manifest.chunk_lengths()
            prog.start(sum(lengths[c] for c in missing), "store")
            try:
                _, _, new_bytes = copy_chunks(staged, store, missing, prog, dtypes=chunk_dtypes(manifest))
            finally:
                prog.close()
            store.put_manifest(root, manifest_bytes)
            keep_signatures(store, root, new)
            if store_ref:
                store.cas_ref(store_ref, previous, root, f"import of {reference} ({digest[:19]})")
    return ImportResult(
        reference=reference,
        digest=digest,
        root=root,
        files=snap.files,
        bytes=snap.bytes,
        new_bytes=new_bytes,
        ref=store_ref,
        previous=previous,
        signatures=[k for k, _ in sigs],
    )
