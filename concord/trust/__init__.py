"""Trust: who released a root. Signatures in OpenSSF Model Signing (OMS v1.0) format, trust
policies, and the checks that refuse an untrusted root before anything is materialised.

The stable API other wings and rooms call (import from ``concord.trust``)::

    # (a) a policy from --trust / CONCORD_TRUSTED_KEYS (None when neither is set; an empty
    #     list is TrustPolicyError, never "no policy")
    policy = load_policy(args.trust)                    # TrustPolicy | None
    policy = TrustPolicy.from_pems([pem, ...], "block:NAME")   # from a block's PEM text
    policy = load_policy("keys/a.pub.pem,block:prod")   # entries: PEM paths, SOURCE:NAME (block:
                                                        # through the concord.trust_sources entry point)
    register_trust_source("name", trusted=fn, signing=fn)  # teach --trust / --key a name:REST entry

    # (b) check a root in a store before materialising it; all of these call the one check,
    policy.decide(store, root) -> Verdict               # threshold of distinct trusted keys whose
                                                        # signatures hold for THIS root's bytes,
                                                        # no file of the root unsigned
    check_root(store, root, policy)                     # no-op without a policy; else raises
                                                        # UntrustedRootError (one line: root,
                                                        # store, keys tried)
    policy.require(store, root) -> Verdict              # the same, with a policy in hand
    policy.restore_check(store, root)                   # for restore's check_root hook: None, or
                                                        # the digests the restore checks as it
                                                        # writes (RestoreDigests)
    policy.report(store, root) -> Verdict               # never raises: .signed_by (verified
                                                        # signers only), .trusted, .problems

    # (c) the signature documents of a root (OMS bundles, JSON bytes)
    signature_ids(store, root) -> [key id, ...]         # sorted
    read_signature(store, root, key_id) -> bytes | None
    signature_documents(store, root) -> {key id: bytes}
    signature_key(root, key_id) -> "signatures/<root>/<key id>.sig"   # the store document key
    import_signature(store, root, bundle_bytes, keys)   # keep a bundle after it verifies

    # signing
    key = load_signing_key("key.pem", password=None)    # password default: $CONCORD_KEY_PASSWORD
    key = load_signing_key_spec("block:prod")           # KEY.pem, or a source's signing key (--key)
    result, bundle_bytes = sign_root(store, root, key, ref="models/x")
    result, checked = snapshot_signed(folder, store, bundle_bytes, policy.keys, ref="models/x")
                                                        # snapshot a model_signing-signed folder
    checked = verify_bundle(store, root, bundle_bytes, policy.keys)   # check one bundle fully

A key id is the SHA-256 of the public key's PEM, as OMS writes it in the bundle's key hint.
Errors are in :mod:`concord.errors` (``TrustError`` and subclasses). See docs/trust.md.
"""

from __future__ import annotations

from concord.trust.keys import (
    PublicKey,
    SigningKey,
    generate_key,
    load_public_key,
    load_signing_key,
    public_key_from_pem,
    signing_key_from_pem,
)
from concord.trust.policy import (
    ENV,
    SIGNING_GROUP,
    SOURCE_GROUP,
    TrustPolicy,
    Verdict,
    load_policy,
    load_signing_key_spec,
    register_trust_source,
)
from concord.trust.signing import (
    import_signature,
    read_signature,
    sign_root,
    signature_documents,
    signature_ids,
    signature_key,
    snapshot_signed,
    verify_bundle,
)


def check_root(store, root: str, policy: TrustPolicy | None) -> Verdict | None:
    """Refuse ``root`` in ``store`` unless ``policy`` trusts it (nothing to check without one)."""
    return None if policy is None else policy.require(store, root)


__all__ = [
    "ENV",
    "SIGNING_GROUP",
    "SOURCE_GROUP",
    "PublicKey",
    "SigningKey",
    "TrustPolicy",
    "Verdict",
    "check_root",
    "generate_key",
    "import_signature",
    "load_policy",
    "load_public_key",
    "load_signing_key",
    "load_signing_key_spec",
    "public_key_from_pem",
    "read_signature",
    "register_trust_source",
    "sign_root",
    "signature_documents",
    "signature_ids",
    "signature_key",
    "signing_key_from_pem",
    "snapshot_signed",
    "verify_bundle",
]
