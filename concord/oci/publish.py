"""Publish a model version: its snapshot exported as a ModelPack artifact, and the pushed
reference and digest recorded on the MLflow model version (tags ``oci.reference`` and
``oci.digest``), so the registry entry says where the artifact is.
"""

from __future__ import annotations

from concord.errors import LineageError
from concord.lineage.client import Tracking, retry_locked
from concord.lineage.registry import model_lineage

TAG_OCI_REFERENCE = "oci.reference"
TAG_OCI_DIGEST = "oci.digest"


def version_snapshot(tracking: Tracking, name: str, version: str | int) -> tuple[str, str]:
    """``(root, store)`` a model version records (the snapshot it was registered from)."""
    found = model_lineage(tracking, name, str(version))  # reads the tags under any name they were written
    if not found.get("root") or not found.get("store"):
        raise LineageError(f"model version {name}/{version} records no Concord snapshot (root and store); register it with `concord model register`")
    return found["root"], found["store"]


def record_publication(tracking: Tracking, name: str, version: str | int, reference: str, digest: str) -> None:
    """Tag model version ``name``/``version`` with where its artifact was pushed."""
    client = tracking.client
    retry_locked(client.set_model_version_tag, name, str(version), TAG_OCI_REFERENCE, reference)
    retry_locked(client.set_model_version_tag, name, str(version), TAG_OCI_DIGEST, digest)
