"""Tasks of trust: sign a snapshot with a deployment's key, refuse a root no trusted key signed,
report the signatures of roots.

A deployment names a saved trust block (``concord_pipelines.blocks.trust.TrustBlock``, by name); without one the
worker's ``CONCORD_TRUSTED_KEYS`` (comma-separated PEM paths) is the policy, and without that
nothing is checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task

from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, open_stores
from concord_pipelines.tasks.progress import run_logger


def trust_policy(trust_block: str | None, threshold: int | None = None):
    """The policy of the trust block ``trust_block``, else of ``$CONCORD_TRUSTED_KEYS`` (and
    ``$CONCORD_TRUST_THRESHOLD``), else None; ``threshold`` replaces the policy's own."""
    from concord.trust import load_policy

    if trust_block:
        from concord_pipelines.blocks.trust import load_trust_block

        return load_policy(load_trust_block(trust_block).get_policy(), threshold=threshold)
    return load_policy(None, threshold=threshold)


@task(name="sign-snapshot", **RETRIED)
def sign_snapshot_task(store: str, root: str, trust_block: str, ref: str | None = None) -> dict | None:
    """Sign ``root`` in ``store`` with the signing key of the trust block ``trust_block`` (an
    OpenSSF Model Signing bundle kept at ``signatures/<root>/<key id>.sig``); None when the block
    has no signing key. Emits ``concord.snapshot.signed``. Safe to retry: a new signature by the
    same key replaces the old one."""
    from concord.trust import sign_root
    from concord_pipelines.blocks.trust import load_trust_block

    key = load_trust_block(trust_block).get_signing_key()
    if key is None:
        run_logger().info("trust block %s has no signing key: %s left unsigned", trust_block, root[:12])
        return None
    with open_stores(store) as (s,):
        r, _ = sign_root(s, root, key, ref=ref)
        uri = s.uri
    out = r.to_dict() | {"store": uri}
    related = [events.store(uri, "store")] + ([events.ref(ref)] if ref else [])
    payload = {k: out[k] for k in ("root", "key_id", "document", "files", "bytes", "ref", "store")}
    out["event_id"] = events.emit(events.SNAPSHOT_SIGNED, events.snapshot(root), related, payload)
    run_logger().info("signed %s in %s with key %s (%d files)", root[:12], uri, r.key_id[:16], r.files)
    return out


@task(name="sign-tiers", **RETRIED)
def sign_tiers_task(stores: dict, root: str, trust_block: str, ref: str | None = None) -> dict | None:
    """Sign ``root`` (a checkpoint just tiered) in the first tier holding it (hot, warm, cold:
    ``stores``, the run's open tiers) with the trust block's signing key, then copy the signature
    to every other tier holding it. None when the block has no signing key. Emits
    ``concord.snapshot.signed``."""
    from concord.snapshots.sync import copy_signatures
    from concord.trust import sign_root
    from concord_pipelines.blocks.trust import load_trust_block

    key = load_trust_block(trust_block).get_signing_key()
    if key is None:
        return None
    holding = [s for s in stores.values() if s.has_manifest(root)]
    if not holding:
        from concord.errors import ManifestNotFoundError

        raise ManifestNotFoundError(", ".join(s.uri for s in stores.values()), root)
    first, others = holding[0], holding[1:]
    r, _ = sign_root(first, root, key, ref=ref)
    for s in others:
        copy_signatures(first, s, root)
    out = r.to_dict() | {"store": first.uri, "copied_to": [s.uri for s in others]}
    related = [events.store(s.uri, "store") for s in holding] + ([events.ref(ref)] if ref else [])
    payload = {k: out[k] for k in ("root", "key_id", "document", "files", "bytes", "ref", "store", "copied_to")}
    out["event_id"] = events.emit(events.SNAPSHOT_SIGNED, events.snapshot(root), related, payload)
    run_logger().info("signed %s with key %s in %s, copied to %d other tier(s)", root[:12], r.key_id[:16], first.uri, len(others))
    return out


@task(name="check-trust", **RETRIED)
def check_trust_task(store: str, snapshot: str, trust_block: str | None = None) -> dict:
    """Refuse (:class:`~concord.errors.UntrustedRootError`) snapshot ``snapshot`` (a ref or a
    root) of ``store`` unless a trusted key signed it; ``{"root", "trusted": None}`` without a
    policy, else the verdict (``signed_by``, ``trusted``, ``trusted_by``)."""
    from concord.snapshots.refs import resolve_root

    policy = trust_policy(trust_block)
    with open_stores(store) as (s,):
        root = resolve_root(s, snapshot)
        if policy is None:
            return {"root": root, "store": s.uri, "trusted": None, "signed_by": []}
        v = policy.require(s, root)
    run_logger().info("%s in %s: signed by trusted key %s", root[:12], v.store, (v.trusted_by or "")[:16])
    return v.to_dict()


@task(name="signatures", **RETRIED)
def signatures_task(store: str, roots: Sequence[str], trust_block: str | None = None) -> list[dict]:
    """For each root, under a policy: the trusted keys whose signatures hold for it in ``store``
    (``signed_by``) and whether they are enough (``trusted``); without one, the key ids its
    signature documents claim (``unchecked``), ``signed_by`` empty and ``trusted`` None.
    Reports; never refuses."""
    from concord.trust import signature_ids

    policy = trust_policy(trust_block)
    out = []
    with open_stores(store) as (s,):
        for root in roots:
            if policy is None:
                # nothing is verified without a policy: the documents are unchecked, never signers
                out.append({"root": root, "signed_by": [], "unchecked": signature_ids(s, root), "trusted": None})
            else:
                out.append(policy.report(s, root).to_dict())
    return out
