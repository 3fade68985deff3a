"""Publish a model version: its snapshot exported as a ModelPack artifact, and the pushed
reference and digest recorded on the MLflow model version (tags ``oci.reference`` and
``oci.digest``), so the registry entry says where the artifact is.
"""

from __future__ import annotations

from concord.errors import LineageError
from concord.lineage.client import Tracking, retry_locked
from concord.lineage.registry import get_version
from concord.lineage.tags import TAG_ROOT, TAG_STORE

TAG_OCI_REFERENCE = "oci.reference"
TAG_OCI_DIGEST = "oci.digest"


def version_snapshot(tracking: Tracking, name: str, version: "str | int") -> tuple[str, str]:
    """``(root, store)`` a model version records (the snapshot it was registered from)."""
    mv = get_version(tracking, name, str(version))
    tags = mv.tags or {}
    if not tags.get(TAG_ROOT) or not tags.get(TAG_STORE):
        raise LineageError(f"model version {name}/{version} records no Concord snapshot ({TAG_ROOT}, {TAG_STORE}); register it with `concord model register`")
    return tags[TAG_ROOT], tags[TAG_STORE]


def record_publication(tracking: Tracking, name: str, version: "str | int", reference: str, digest: str) -> None:
    """Tag model version ``name``/``version`` with where its artifact was pushed."""
    client = tracking.client
    retry_locked(client.set_model_version_tag, name, str(version), TAG_OCI_REFERENCE, reference)
    retry_locked(client.set_model_version_tag, name, str(version), TAG_OCI_DIGEST, digest)
