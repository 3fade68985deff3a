"""A fresh copy served as ``make serve`` serves it works out of the box: every Concord pipeline
deployment run with its default parameters completes (the scheduled ones included, so each
schedule's first run does too), and lineage is drawn where people look (MLflow)."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e

#: the pipelines' deployments, run with their defaults: a few at a time (all at once, 15 flow runs
#: starting on two cores make the server answer 503), then the rollback (it moves models/minilm,
#: which the others read)
AT_ONCE = (
    "snapshot-checkpoint/minilm-local",
    "snapshot-and-replicate/new-checkpoint",
    "replicate-snapshot/minilm-to-clusters",
    "diff-snapshots/minilm-last-change",
    "restore-snapshot/minilm-latest",
    "verify-store/eu-central-repair",
    "register-data-snapshot/penguins",
    "validate-contract/penguins-v1",
    "register-model-version/minilm-latest",
    "promote/minilm-champion",
    "lora-federation/acme-weekly",
    "tier-checkpoints/hourly-sweep",
    "restore-checkpoint/minilm-nearest-tier",
    "restore-drill/weekly",
    "nightly-drift-audit/nightly",
)
AFTER = ("rollback-ref/minilm-undo",)
WAVE = 5
RUN_TIMEOUT = 240


def _run_all(client, names: tuple[str, ...]) -> dict:
    """Start a run of each deployment with its defaults, wait until all are final: the runs by name."""
    started = {n: client.create_flow_run_from_deployment(client.read_deployment_by_name(n).id) for n in names}
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        runs = {n: client.read_flow_run(r.id) for n, r in started.items()}
        if all(r.state is not None and r.state.is_final() for r in runs.values()):
            return runs
        waiting = sorted(n for n, r in runs.items() if not (r.state and r.state.is_final()))
        assert time.monotonic() < deadline, f"not finished within {RUN_TIMEOUT} s: {waiting}"
        time.sleep(1.0)


@pytest.fixture(scope="module")
def default_runs(served):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        runs = {}
        for i in range(0, len(AT_ONCE), WAVE):
            runs |= _run_all(client, AT_ONCE[i:i + WAVE])
        runs |= _run_all(client, AFTER)
    return runs


def test_the_seeded_project_holds_what_the_defaults_name(served):
    data = served.project_dir / "data"
    for path in ("checkpoints/minilm/step-0/COMPLETE", "checkpoints/minilm/step-100/COMPLETE", "datasets/penguins.csv",
                 "tiering/policy.yaml", "mlflow.db", "stores/us-east/refs/models/minilm"):
        assert (data / path).exists(), path


def test_start_says_what_it_seeded_and_how_to_open_mlflow(served):
    out = served.start_output
    assert "seeding what the deployments' defaults name" in out and "promoted to champion" in out, out
    assert f"mlflow ui --backend-store-uri {served.tracking_uri}" in out, out


def test_every_deployment_run_with_its_defaults_completes(default_runs, client):
    failed = {n: f"{r.state.type.value}: {r.state.message}" for n, r in default_runs.items() if not r.state.is_completed()}
    assert failed == {}
    assert {n: r.run_count for n, r in default_runs.items() if r.run_count != 1} == {}  # none needed a retry


def test_the_scheduled_deployments_are_among_them(client):
    scheduled = {f"{client.read_flow(d.flow_id).name}/{d.name}" for d in client.read_deployments()
                 if any(s.active for s in d.schedules)}
    assert scheduled <= set(AT_ONCE) | set(AFTER), scheduled - set(AT_ONCE) - set(AFTER)
    assert {"tier-checkpoints/hourly-sweep", "restore-drill/weekly", "nightly-drift-audit/nightly"} <= scheduled


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
