"""The clusters of the quorum tests, each with its own key (the ``clusters`` fixture makes them)."""

from __future__ import annotations

from pathlib import Path

#: the clusters, in the order the policy file lists them
CLUSTERS = ("us-east", "eu-central", "ap-south")


def key(clusters: Path, name: str):
    """The signing key of cluster ``name``."""
    from concord.trust import load_signing_key

    return load_signing_key(clusters / f"{name}.pem")
