"""A fresh copy served as ``make serve`` serves it works out of the box: every Concord pipeline
deployment run with its default parameters completes (the scheduled ones included, so each
schedule's first run does too), lineage is drawn where people look (MLflow), the serving node
``make serve`` starts has its link flipped by a checkout, a rollout and a rollback, and the champion
is published to the OCI registry it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

#: the pipelines' deployments, run with their defaults: a few at a time (all at once, 15 flow runs
#: starting on two cores make the server answer 503), then the rollback (it moves models/minilm,
#: which the others read)
AT_ONCE = (
    "snapshot-checkpoint/minilm-step-100-into-us-east",
    "snapshot-and-replicate/new-checkpoint",
    "replicate-snapshot/minilm-to-clusters",
    "diff-snapshots/minilm-last-change",
    "restore-snapshot/minilm-to-folder",
    "verify-store/eu-central-repair",
    "register-data-snapshot/penguins-table-into-us-east",
    "validate-contract/penguins-against-contract-v1",
    "register-model-version/minilm-version-in-mlflow",
    "promote/minilm-champion",
    "lora-federation/acme-weekly",
    "tier-checkpoints/hourly-sweep",
    "restore-checkpoint/minilm-nearest-tier",
    "restore-drill/every-tier-weekly",
    "nightly-drift-audit/penguins-and-minilm-nightly",
)
#: the serving node's runs, one beside each wave, in this order: the base checked out, the newest
#: rolled out, a rollback to the base; then (with the AFTER runs) the newest rolled out again
SERVING = ("checkout-node/checkout-on-node", "rollout/rollout-by-hand", "rollback-node/rollback-on-node")
PUBLISH = "publish-oci/champion-to-registry"
AFTER = ("rollback-ref/minilm-undo", "rollout/rollout-on-new-root", PUBLISH, "snapshot-spread/minilm-spread")
#: a publish run given no repository, as `make serve` deploys it where docker-registry is missing
NO_REGISTRY = f"{PUBLISH} (no repository)"
WAVE = 5
RUN_TIMEOUT = 240


def _run_all(client, names: tuple[str, ...], given: dict[str, tuple[str, dict]] | None = None) -> dict:
    """Start a run of each deployment with its defaults (and each of ``given``: label → deployment and
    the parameters it is given), wait until all are final: the runs by name."""
    started = {n: client.create_flow_run_from_deployment(client.read_deployment_by_name(n).id) for n in names}
    started |= {label: client.create_flow_run_from_deployment(client.read_deployment_by_name(n).id, parameters=params)
                for label, (n, params) in (given or {}).items()}
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        runs = {n: client.read_flow_run(r.id) for n, r in started.items()}
        if all(r.state is not None and r.state.is_final() for r in runs.values()):
            return runs
        waiting = sorted(n for n, r in runs.items() if not (r.state and r.state.is_final()))
        assert time.monotonic() < deadline, f"not finished within {RUN_TIMEOUT} s: {waiting}"
        time.sleep(0.5)


def _served_root(link) -> str | None:
    """The root the node's link names now (None: no link yet)."""
    return os.readlink(link).rsplit("/", 1)[1] if os.path.islink(link) else None


@pytest.fixture(scope="module")
def phases(served):
    """Every deployment run with its defaults, in waves; the root the serving node's link named
    after each wave (one run of the node's beside each)."""
    from prefect.client.orchestration import get_client

    link = served.project_dir / "data" / "serving" / "node-local" / "current"
    waves = [AT_ONCE[i:i + WAVE] for i in range(0, len(AT_ONCE), WAVE)]
    assert len(waves) == len(SERVING)
    runs, links = {}, []
    with get_client(sync_client=True) as client:
        for wave, on_node in zip(waves, SERVING):
            runs |= _run_all(client, (*wave, on_node))
            links.append(_served_root(link))
        runs |= _run_all(client, AFTER, {NO_REGISTRY: (PUBLISH, {"repository": None})})
        links.append(_served_root(link))
    return runs, links


@pytest.fixture(scope="module")
def default_runs(phases):
    runs, _ = phases
    return {n: r for n, r in runs.items() if n != NO_REGISTRY}


def test_the_seeded_project_holds_what_the_defaults_name(served):
    data = served.project_dir / "data"
    for path in ("checkpoints/minilm/step-0/COMPLETE", "checkpoints/minilm/step-100/COMPLETE", "datasets/penguins.csv",
                 "tiering/policy.yaml", "stores/us-east/refs/models/minilm"):
        assert (data / path).exists(), path


def test_start_says_what_it_seeded_and_how_to_open_mlflow(served):
    out = served.start_output
    assert "seeding what the deployments' defaults name" in out and "promoted to champion" in out, out
    assert "starting the serving node node-local" in out and "OCI registry: 127.0.0.1:" in out, out
    # MLflow is served (on the instance's PostgreSQL), and opens on the runs list of Concord's lineage
    assert f"open {served.tracking_uri}/#/experiments/" in out and "/runs" in out, out


def test_every_deployment_run_with_its_defaults_completes(default_runs, client):
    failed = {n: f"{r.state.type.value}: {r.state.message}" for n, r in default_runs.items() if not r.state.is_completed()}
    assert failed == {}
    assert {n: r.run_count for n, r in default_runs.items() if r.run_count != 1} == {}  # none needed a retry


def test_the_serving_node_is_flipped_by_a_checkout_a_rollout_and_a_rollback(phases, served):
    from concord.stores import open_store

    _, links = phases
    data = served.project_dir / "data"
    base = open_store(str(data / "stores" / "us-east")).read_ref("models/minilm-base").root
    newest = open_store(str(data / "stores" / "eu-central")).read_ref("models/minilm").root
    assert base != newest
    # checkout-on-node: the base; rollout-by-hand: the newest; rollback-on-node: the base again;
    # rollout-on-new-root: the newest again
    assert links == [base, newest, base, newest]


def test_the_champion_is_published_to_the_served_registry(default_runs, served):
    from mlflow import MlflowClient

    from concord_pipelines.deployments.serve import read_record

    registry = read_record(served.state_dir)["registry"]
    assert default_runs[PUBLISH].state.is_completed()
    with urllib.request.urlopen(f"http://{registry}/v2/models/minilm/tags/list", timeout=10) as resp:
        assert "v1" in json.loads(resp.read())["tags"]
    mlflow = MlflowClient(tracking_uri=served.tracking_uri, registry_uri=served.tracking_uri)
    assert mlflow.get_model_version("minilm", "1").tags["oci.reference"] == f"{registry}/models/minilm:v1"


def test_publishing_without_a_registry_fails_once_saying_how_to_get_one(phases):
    runs, _ = phases
    run = runs[NO_REGISTRY]
    assert run.state.is_failed() and run.run_count == 1
    assert "no OCI registry to publish to" in run.state.message and "docker-registry" in run.state.message
    assert "\n" not in run.state.message


def test_status_shows_the_serving_node_and_the_registry(served):
    out = subprocess.run([sys.executable, "-m", "concord_pipelines.deployments.serve", "--dir", str(served.state_dir), "status"],
                         cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "running" in lines["node-local"] and "running" in lines["registry"], out
    assert "OCI registry: 127.0.0.1:" in out, out


def test_the_scheduled_deployments_are_among_them(client):
    scheduled = {f"{client.read_flow(d.flow_id).name}/{d.name}" for d in client.read_deployments()
                 if any(s.active for s in d.schedules)}
    assert scheduled <= set(AT_ONCE) | set(AFTER), scheduled - set(AT_ONCE) - set(AFTER)
    assert {"tier-checkpoints/hourly-sweep", "restore-drill/every-tier-weekly", "nightly-drift-audit/penguins-and-minilm-nightly"} <= scheduled


def test_snapshot_and_replicate_shows_its_own_summary(default_runs, client):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    run = default_runs["snapshot-and-replicate/new-checkpoint"]
    artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    summary = [a for a in artifacts if a.key == "snapshot-and-replicate-summary"]
    assert summary, [a.key for a in artifacts]
    assert "models/minilm" in summary[0].data and "eu-central" in summary[0].data


def test_the_newest_model_version_carries_its_lineage_picture(default_runs, served):
    """register-model-version ran with its defaults: its version's run holds lineage/lineage.png."""
    from mlflow import MlflowClient

    mlflow = MlflowClient(tracking_uri=served.tracking_uri, registry_uri=served.tracking_uri)
    versions = mlflow.search_model_versions("name = 'minilm'")
    assert len(versions) >= 2, versions  # the seeded champion, and the one registered by the run
    newest = max(versions, key=lambda v: int(v.version))
    listed = [a.path for a in mlflow.list_artifacts(newest.run_id, "lineage")]
    assert "lineage/lineage.png" in listed, listed
    local = mlflow.download_artifacts(newest.run_id, "lineage/lineage.png", str(served.state_dir))
    with open(local, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
