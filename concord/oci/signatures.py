"""Signatures travel with the artifact: each signature document a store holds for a root
(``signatures/<root>/<key id>.sig``, an OpenSSF Model Signing bundle, a Sigstore bundle) is
pushed as an OCI referrer of the model manifest: a manifest whose ``subject`` is the model's,
``artifactType`` the Sigstore bundle's media type, one layer holding the bundle, annotated with
its key id. A registry with the referrers API lists it there; for one without (CNCF
distribution 2.8) the referrers tag schema's index (tag ``sha256-<hex of the subject>``) is
updated too. An import reads them back into ``signatures/<root>/`` of the target store.

A signature is pushed, or kept from a registry, only when it holds for the root as far as the
bytes can tell without the signer's key (:func:`check_holds`): it parses as a bundle, names the
key id it is filed under, and signs this root (or, made by ``model_signing``, exactly its files'
digests). A trust policy checks the key's signature itself where the root is used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from concord.errors import SignatureError
from concord.errors.oci import OciDigestMismatchError, OciNotFoundError
from concord.oci.registry import (
    INDEX_TYPE,
    MANIFEST_TYPE,
    Registry,
    descriptors,
    doc_field,
    document,
    fallback_tag,
)
from concord.snapshots.manifest import Manifest
from concord.stores.base import Store
from concord.trust import bundle as oms
from concord.trust import signature_key
from concord.trust.signing import Checked, check_digests, check_names, compare_digests

SIGNATURE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
KEY_ID = "dev.concord.key-id"
#: a signature bundle larger than this is not a signature
MAX_SIGNATURE = 1024 * 1024


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push_signatures(reg: Registry, documents: Mapping[str, bytes], subject: dict) -> list[str]:
    """Push each signature (key id → bundle, checked with :func:`check_holds`) as a referrer of
    ``subject``; the key ids pushed."""
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
        pushed.append(
            (
                key_id,
                {
                    "mediaType": MANIFEST_TYPE,
                    "digest": mdigest,
                    "size": len(body),
                    "artifactType": SIGNATURE_TYPE,
                    "annotations": {KEY_ID: key_id},
                },
            )
        )
    _update_fallback_index(reg, subject["digest"], [d for _, d in pushed])
    return [k for k, _ in pushed]


def _update_fallback_index(reg: Registry, subject_digest: str, added: list[dict]) -> None:
    """Add ``added`` to the referrers tag schema's index of the subject (kept as it was
    for the referrers already listed)."""
    tag = fallback_tag(subject_digest)
    what = f"referrers index {tag}"
    try:
        data, _ = reg.get_manifest(tag, accept=(INDEX_TYPE,))
    except OciNotFoundError:
        data = None
    manifests = [] if data is None else list(descriptors(document(data, str(reg.ref), what), "manifests", str(reg.ref), what))
    have = {m.get("digest") for m in manifests if isinstance(m, dict)}
    manifests += [d for d in added if d["digest"] not in have]
    index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": manifests}
    reg.put_manifest(json.dumps(index, sort_keys=True, separators=(",", ":")).encode(), tag, INDEX_TYPE)


def pull_signatures(reg: Registry, subject_digest: str) -> list[tuple[str, bytes]]:
    """``(key id, bundle)`` of every signature referrer of ``subject_digest``, each manifest and
    blob checked against its digest and for its shape (:class:`OciDocumentError` otherwise)."""
    reference = str(reg.ref)
    out = []
    for desc in reg.referrers(subject_digest):
        if desc.get("artifactType") != SIGNATURE_TYPE or not _is_digest(desc.get("digest")):
            continue
        data, _ = reg.get_manifest(desc["digest"])
        if _digest(data) != desc["digest"]:
            raise OciDigestMismatchError(reference, "a signature manifest", desc["digest"], _digest(data))
        what = f"signature manifest {desc['digest']}"
        doc = document(data, reference, what)
        subject = doc_field(doc, "subject", dict, reference, what, required=False) or {}
        if subject.get("digest") != subject_digest:
            continue
        annotations = doc_field(doc, "annotations", dict, reference, what, required=False) or {}
        for layer in descriptors(doc, "layers", reference, what):
            layer_annotations = layer.get("annotations") if isinstance(layer.get("annotations"), dict) else {}
            key_id = layer_annotations.get(KEY_ID) or annotations.get(KEY_ID)
            if layer.get("mediaType") != SIGNATURE_TYPE or not _is_key_id(key_id) or not _is_digest(layer.get("digest")):
                continue
            bundle = reg.read_blob(layer["digest"], MAX_SIGNATURE)
            if _digest(bundle) != layer["digest"]:
                raise OciDigestMismatchError(reference, f"signature {key_id}", layer["digest"], _digest(bundle))
            out.append((key_id, bundle))
    return out


def _is_digest(value: object) -> bool:
    from concord.oci.modelpack import is_sha256_digest

    return is_sha256_digest(value)


def _is_key_id(value: object) -> bool:
    """A key id as the trust wing writes one: the SHA-256 (64 lowercase hex) of a public key."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def check_holds(
    store: Store,
    root: str,
    manifest: Manifest,
    key_id: str,
    data: bytes,
    where: str,
    sha256: Mapping[str, str] | None = None,
) -> oms.Bundle:
    """Refuse a signature of ``root`` that cannot hold for it, whoever's key made it: not a
    bundle, filed under a key id it does not name, signing another root or other files, or
    (a root-less bundle) other digests than the root's files have. ``sha256`` (path → hex digest
    of the root's files, computed from verified bytes) spares a read for files/sha256 bundles;
    other digests are computed from the chunks of ``store``. :class:`SignatureError` otherwise."""
    parsed = oms.parse_bundle(data, where)
    if parsed.key_hint and parsed.key_hint != key_id:
        raise SignatureError(
            where,
            f"it names key {parsed.key_hint[:16]}, not the key {key_id[:16]} it is filed under",
            "Attach each signature under its own key id",
        )
    st = parsed.statement
    if st.root is not None and st.root != root:
        raise SignatureError(where, f"it signs root {st.root}, not {root}", "A signature holds for the root it names only")
    check_names(((f.path, f.size) for f in manifest.files), st, where)
    if st.root is None:
        expected = dict(st.resources)
        if sha256 is not None and st.serialization.whole_file_sha256:
            compare_digests(expected, {p: sha256[p] for p in expected if p in sha256}, where)
        else:
            check_digests(store, manifest, Checked(key_id, "", False, expected, st.serialization), where)
    return parsed


def keep_signatures(store: Store, root: str, signatures: list[tuple[str, bytes]]) -> list[str]:
    """Keep imported bundles as the trust wing keeps them (``signatures/<root>/<key id>.sig``),
    where the store has none by that key yet: a signature the store holds is never replaced.
    The key ids written."""
    written = []
    for key_id, bundle in signatures:
        if store.put_document(signature_key(root, key_id), bundle, overwrite=False):
            written.append(key_id)
    return written
