"""Publishing to an OCI registry: a model version's snapshot pushed as a CNCF ModelPack artifact,
with the pushed reference and digest recorded on the MLflow model version.

A thin wrapper over :mod:`concord.oci`: it reads the version's snapshot (root and store) from
MLflow, exports it (only the files the registry lacks are sent), tags the version with
``oci.reference`` and ``oci.digest``, and emits ``concord.model.published`` (every event name is in
:mod:`concord_pipelines.tasks.events`). Registry credentials come from the worker's environment
(``CONCORD_REGISTRY_USERNAME``/``CONCORD_REGISTRY_PASSWORD``) or its Docker config file, and are
never logged. A registry or tracking server that does not answer is retried; refused
credentials and bad input are not.
"""

from __future__ import annotations

from prefect import task

from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED
from concord_pipelines.tasks.lineage import checked_lineage
from concord_pipelines.tasks.progress import run_logger


def oci_reference(repository: str, name: str, version: str | int, tag: str | None = None) -> str:
    """``REGISTRY/PATH/<model name, lowercased>:<tag or v<version>>``."""
    return f"{repository.rstrip('/')}/{name.lower()}:{tag or f'v{version}'}"


@task(name="publish-oci", **RETRIED)
def publish_oci_task(
    name: str,
    version: str | int,
    repository: str,
    tag: str | None = None,
    plain_http: bool = False,
    tracking_uri: str | None = None,
) -> dict:
    """Push model version ``name``/``version`` to ``repository``/``name``:``tag`` (default
    ``v<version>``) as a ModelPack artifact, and record where on the version."""
    from concord.oci import export_oci, parse_reference
    from concord.oci.publish import record_publication, version_snapshot
    from concord.snapshots.refs import load_manifest
    from concord.stores import open_store_to_read

    version = str(version)
    lineage = checked_lineage(tracking_uri)
    ref = parse_reference(oci_reference(repository, name, version, tag))
    root, store_uri = version_snapshot(lineage, name, version)
    store = open_store_to_read(store_uri)
    try:
        r = export_oci(store, load_manifest(store, root), ref, name=name, plain_http=plain_http)
    finally:
        store.close()
    record_publication(lineage, name, version, r.reference, r.digest)
    out = r.to_dict() | {"name": name, "version": version, "store": store_uri}
    payload = {k: out[k] for k in ("name", "version", "reference", "digest", "root", "bytes_uploaded", "layers")}
    out["event_id"] = events.emit(events.MODEL_PUBLISHED, events.model(name, version), [events.snapshot(root, "snapshot")], payload)
    run_logger().info(
        "%s/%s pushed to %s (%s): %d layers, %d bytes uploaded", name, version, r.reference, r.digest, r.layers, r.bytes_uploaded
    )
    return out
