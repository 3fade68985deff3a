"""Signatures travel with the artifact: each signature document a store holds for a root
(``signatures/<root>/<key id>.sig``, an OpenSSF Model Signing bundle, a Sigstore bundle) is
pushed as an OCI referrer of the model manifest: a manifest whose ``subject`` is the model's,
``artifactType`` the Sigstore bundle's media type, one layer holding the bundle, annotated with
its key id. A registry with the referrers API lists it there; for one without (CNCF
distribution 2.8) the referrers tag schema's index (tag ``sha256-<hex of the subject>``) is
updated too. An import reads them back into ``signatures/<root>/`` of the target store.
"""

from __future__ import annotations

import hashlib
import json

from concord.errors.oci import OciNotFoundError
from concord.oci.registry import INDEX_TYPE, MANIFEST_TYPE, Registry, fallback_tag
from concord.stores.base import Store
from concord.trust import signature_documents, signature_key

SIGNATURE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
KEY_ID = "dev.concord.key-id"
#: a signature bundle larger than this is not a signature
MAX_SIGNATURE = 1024 * 1024


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push_signatures(reg: Registry, store: Store, root: str, subject: dict) -> list[str]:
    """Push each signature of ``root`` as a referrer of ``subject``; the key ids pushed."""
    documents = signature_documents(store, root)
    if not documents:
        return []
    empty = _digest(EMPTY)
    if not reg.has_blob(empty):
        reg.put_blob(empty, len(EMPTY), lambda: [EMPTY])
    pushed: list[tuple[str, dict]] = []
    for key_id, bundle in sorted(documents.items()):
        digest = _digest(bundle)
        if not reg.has_blob(digest):
            reg.put_blob(digest, len(bundle), lambda b=bundle: [b])
        doc = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "artifactType": SIGNATURE_TYPE,
            "config": {"mediaType": EMPTY_TYPE, "digest": empty, "size": len(EMPTY)},
            "layers": [{"mediaType": SIGNATURE_TYPE, "digest": digest, "size": len(bundle), "annotations": {KEY_ID: key_id}}],
            "subject": subject,
            "annotations": {KEY_ID: key_id},
        }
        body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        mdigest = _digest(body)
        reg.put_manifest(body, mdigest)
        pushed.append((key_id, {"mediaType": MANIFEST_TYPE, "digest": mdigest, "size": len(body), "artifactType": SIGNATURE_TYPE, "annotations": {KEY_ID: key_id}}))
    _update_fallback_index(reg, subject["digest"], [d for _, d in pushed])
    return [k for k, _ in pushed]


def _update_fallback_index(reg: Registry, subject_digest: str, descriptors: list[dict]) -> None:
    """Add ``descriptors`` to the referrers tag schema's index of the subject (kept as it was
    for the referrers already listed)."""
    tag = fallback_tag(subject_digest)
    try:
        data, _ = reg.get_manifest(tag, accept=(INDEX_TYPE,))
        manifests = list(json.loads(data).get("manifests") or [])
    except (OciNotFoundError, ValueError):
        manifests = []
    have = {m.get("digest") for m in manifests if isinstance(m, dict)}
    manifests += [d for d in descriptors if d["digest"] not in have]
    index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": manifests}
    reg.put_manifest(json.dumps(index, sort_keys=True, separators=(",", ":")).encode(), tag, INDEX_TYPE)


def pull_signatures(reg: Registry, subject_digest: str) -> list[tuple[str, bytes]]:
    """``(key id, bundle)`` of every signature referrer of ``subject_digest``, each blob checked
    against its digest."""
    from concord.errors.oci import OciDigestMismatchError

    out = []
    for desc in reg.referrers(subject_digest):
        if not isinstance(desc, dict) or desc.get("artifactType") != SIGNATURE_TYPE or not isinstance(desc.get("digest"), str):
            continue
        data, _ = reg.get_manifest(desc["digest"])
        if _digest(data) != desc["digest"]:
            raise OciDigestMismatchError(str(reg.ref), "a signature manifest", desc["digest"], _digest(data))
        doc = json.loads(data)
        if (doc.get("subject") or {}).get("digest") != subject_digest:
            continue
        for layer in doc.get("layers") or []:
            key_id = (layer.get("annotations") or {}).get(KEY_ID) or (doc.get("annotations") or {}).get(KEY_ID)
            if layer.get("mediaType") != SIGNATURE_TYPE or not _is_key_id(key_id):
                continue
            bundle = reg.read_blob(layer["digest"], MAX_SIGNATURE)
            if _digest(bundle) != layer["digest"]:
                raise OciDigestMismatchError(str(reg.ref), f"signature {key_id}", layer["digest"], _digest(bundle))
            out.append((key_id, bundle))
    return out


def _is_key_id(value: object) -> bool:
    """A key id as the trust wing writes one: the SHA-256 (64 lowercase hex) of a public key."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def keep_signatures(store: Store, root: str, signatures: list[tuple[str, bytes]]) -> None:
    """Keep imported bundles as the trust wing keeps them (``signatures/<root>/<key id>.sig``),
    as they came: a trust policy checks them where a root is restored, synced or checked out."""
    for key_id, bundle in signatures:
        store.put_document(signature_key(root, key_id), bundle, overwrite=True)
