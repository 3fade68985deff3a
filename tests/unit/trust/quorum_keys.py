"""The clusters of the quorum tests, each with its own key (the ``clusters`` fixture makes them)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

#: the clusters, in the order the policy file lists them
CLUSTERS = ("us-east", "eu-central", "ap-south")


def key(clusters: Path, name: str):
    """The signing key of cluster ``name``."""
    from concord.trust import load_signing_key

    return load_signing_key(clusters / f"{name}.pem")


def make_cluster_keys(d: Path) -> Path:
    """A key pair per cluster (and one outside the policy) in ``d``, and ``d/policy.yaml``:
    the three cluster keys, by name, threshold 2."""
    from concord.trust import generate_key

    for name in (*CLUSTERS, "outsider"):
        generate_key(d / f"{name}.pem")
    lines = ["threshold: 2", "keys:"] + [f"  {n}: {n}.pub.pem" for n in CLUSTERS]
    (d / "policy.yaml").write_text("\n".join(lines) + "\n")
    return d


def forge(bundle: bytes) -> bytes:
    """``bundle`` (an OMS bundle) with one bit of its signature flipped, the payload left as it was."""
    doc = json.loads(bundle)
    sig = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[len(sig) // 2] ^= 0x01
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    return json.dumps(doc).encode()
