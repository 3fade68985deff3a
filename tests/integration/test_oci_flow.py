"""The publish-oci flow on the Prefect test harness, against a real CNCF distribution registry
and MLflow (embedded sqlite): a registered model version is pushed as a ModelPack artifact and
the pushed reference and digest are recorded on the version."""

from __future__ import annotations

import hashlib

import pytest
import requests
from servers import patched_environ, running_registry
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.lineage import Lineage
from concord.snapshots.snapshot import snapshot
from concord.stores.local import LocalDirStore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]


def test_publish_oci_pushes_a_version_and_records_it_in_mlflow(mlflow_quiet, tmp_path):
    from mlflow import MlflowClient

    from concord_pipelines.flows.oci import publish_oci

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = LocalDirStore(str(tmp_path / "store"))
    root = snapshot(make_checkpoint(tmp_path / "ckpt"), store, ref="models/toy", chunk_size=SMALL_CHUNK).root
    version = Lineage(uri).register_model_version("Toy", root, [store.uri])["version"]
    env = {"DOCKER_CONFIG": str(tmp_path / "none"), "CONCORD_HOME": str(tmp_path / "home")}  # the digest memo goes there
    with patched_environ(env, ("CONCORD_REGISTRY_USERNAME", "CONCORD_REGISTRY_PASSWORD")):
        with running_registry(tmp_path / "registry", tmp_path / "registry.log") as address:
            r = publish_oci("Toy", int(version), repository=f"{address}/models", plain_http=True, tracking_uri=uri)
            assert r["reference"] == f"{address}/models/toy:v{version}" and r["root"] == root
            body = requests.get(
                f"http://{address}/v2/models/toy/manifests/v{version}",
                headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}, timeout=10,
            ).content
    assert r["digest"] == "sha256:" + hashlib.sha256(body).hexdigest()
    tags = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version("Toy", version).tags
    assert (tags["oci.reference"], tags["oci.digest"]) == (r["reference"], r["digest"])
