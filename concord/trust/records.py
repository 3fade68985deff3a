"""Signatures over small Concord records (a federation round's hash), in the DSSE manner.

A record's signature is ``{"key_id": <key id>, "sig": base64(DER ECDSA over PAE(type, payload))}``
with DSSE's pre-authentication encoding (:func:`concord.trust.bundle.pae`), the payload type
naming what is signed (``application/vnd.concord.ledger-round+json`` for a round) and the payload
the record's hash as ASCII hex. Signing the hash signs everything the hash covers.

A ledger's head is signed the same way with its own type
(``application/vnd.concord.ledger-head+json``) over the canonical JSON of what it says (format,
tenant, round number, round hash): a signature over one tenant's head, or one round's, holds for
nothing else.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable

from concord.trust.bundle import pae
from concord.trust.keys import PublicKey, SigningKey

ROUND_TYPE = "application/vnd.concord.ledger-round+json"
HEAD_TYPE = "application/vnd.concord.ledger-head+json"


def sign_record(key: SigningKey, payload_type: str, digest: str) -> dict:
    """The signature of ``digest`` (a record's hash, or the canonical JSON a head says) by
    ``key``, as a JSON-ready dict."""
    sig = key.sign(pae(digest.encode(), payload_type))
    return {"key_id": key.id, "sig": base64.b64encode(sig).decode()}


def check_record(signature: object, payload_type: str, digest: str, keys: Iterable[PublicKey]) -> tuple[str | None, str | None]:
    """(trusted key id, None) if ``signature`` is one of ``keys``' over ``digest``, else
    (None, the problem in a few words)."""
    if signature is None:
        return None, "not signed"
    if not isinstance(signature, dict) or not isinstance(signature.get("key_id"), str) or not isinstance(signature.get("sig"), str):
        return None, "its signature is malformed"
    kid = signature["key_id"]
    key = next((k for k in keys if k.id == kid), None)
    if key is None:
        return None, f"signed by key {kid[:16]}, which is not trusted"
    try:
        raw = base64.b64decode(signature["sig"], validate=True)
    except (binascii.Error, ValueError):
        return None, "its signature is not base64 (altered)"
    if not key.verify(raw, pae(digest.encode(), payload_type)):
        return None, f"its signature by key {kid[:16]} does not verify (forged or edited)"
    return kid, None
