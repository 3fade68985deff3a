"""The tiering flows on a real temporary Prefect server, over small checkpoints in local tier
stores: tier-checkpoints (adds, sweeps, pins promoted versions, fails on violations),
restore-checkpoint, and restore-drill logging to a real ``mlflow server``; artifacts and events
read back through the Prefect client, drill runs through MLflow's own client."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from readable import unreadable
from safetensors.numpy import save_file
from servers import free_port

from concord.lineage.tags import TAG_ROOT
from concord.stores import LocalDirStore
from concord_pipelines.flows.tiering import (
    DrillFailed,
    TieringFailed,
    restore_checkpoint_flow,
    restore_drill,
    tier_checkpoints,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

TIERS = ("hot", "warm", "cold")


def _by_key(artifacts, key):
    found = [a for a in artifacts if a.key == key]
    assert found, f"no artifact {key!r} among {[a.key for a in artifacts]}"
    return found[-1]


def make_checkpoint(folder: Path, step: int, when: float) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(step)
    tensors = {"base.weight": np.ones((64, 64), dtype=np.float32), "lora.weight": rng.standard_normal((16, 64)).astype(np.float32)}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "optimizer.pt").write_bytes(rng.bytes(2000))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for f in folder.iterdir():
        os.utime(f, (when, when))
    return folder


@pytest.fixture
def namespace() -> str:
    """A namespace of this test alone (events on the shared server are told apart by it)."""
    return f"run-{uuid.uuid4().hex[:8]}"


def write_policy(path: Path, base: Path, namespace: str, **tiers) -> str:
    doc = {
        "namespace": namespace,
        "hot": {"store": str(base / "hot"), "keep": 1, **tiers.get("hot", {})},
        "warm": {"store": str(base / "warm"), "keep": 2, "media": "nas", **tiers.get("warm", {})},
        "cold": {"store": str(base / "cold"), "media": "tape", "offsite": True, **tiers.get("cold", {})},
        "ready": {"settle": 0},
        "gc_grace": 0,
    }
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.fixture
def policy(tmp_path, namespace) -> str:
    return write_policy(tmp_path / "policy.yaml", tmp_path / "tiers", namespace)


@pytest.fixture
def ckpts(tmp_path) -> list[Path]:
    t0 = time.time() - 600
    return [make_checkpoint(tmp_path / "ckpts" / f"step-{s}", s, t0 + 60 * i) for i, s in enumerate((100, 200, 300))]


@pytest.fixture
def no_mlflow(tmp_path) -> str:
    """A tracking URI nothing answers on."""
    return f"http://127.0.0.1:{free_port()}"


def test_tier_checkpoints_adds_sweeps_pins_promoted_versions_and_reports(
    tmp_path, namespace, policy, ckpts, mlflow_quiet, artifacts_of, events_about
):
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for c in ckpts[:2]:
        state = tier_checkpoints(policy, checkpoint_dir=str(c), tracking_uri=tracking, return_state=True)
        assert state.is_completed(), state
    first = state.result()["added"]
    assert first["name"] == "step-200" and first["sweep"]["demoted"][0]["name"] == "step-100"

    # step-100 is promoted in MLflow: the next run keeps it hot and warm again
    from mlflow import MlflowClient

    from concord.lineage import Lineage

    Lineage(tracking).ensure_ready()
    client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    hot = LocalDirStore(tmp_path / "tiers" / "hot")
    cold = LocalDirStore(tmp_path / "tiers" / "cold")
    root100 = cold.read_ref(f"{namespace}/step-100").root
    client.create_registered_model(f"{namespace}-model")
    client.create_model_version(f"{namespace}-model", f"file:///{tmp_path}/manifests/{root100}.json", tags={TAG_ROOT: root100})
    client.set_registered_model_alias(f"{namespace}-model", "champion", "1")

    state = tier_checkpoints(policy, checkpoint_dir=str(ckpts[2]), name="step-300", step=300, tracking_uri=tracking, return_state=True)
    assert state.is_completed(), state
    r = state.result()
    assert r["pinned_roots"] == [root100]
    assert r["added"]["step"] == 300 and r["sweep"]["violations"] == [] and r["sweep"]["errors"] == []
    held = {c["name"]: {t for t in TIERS if c["tiers"][t]["present"]} for c in r["status"]["checkpoints"]}
    assert held == {"step-300": set(TIERS), "step-200": {"warm", "cold"}, "step-100": set(TIERS)}
    assert hot.read_ref(f"{namespace}/step-100").root == root100

    artifacts = artifacts_of(state.state_details.flow_run_id)
    assert unreadable(artifacts, [str(tmp_path)]) == []
    rows = {row["checkpoint"]: row for row in json.loads(_by_key(artifacts, "tier-status").data)}
    assert set(rows) == {"step-100", "step-200", "step-300"}
    assert {k: rows["step-200"][k] for k in TIERS} == {"hot": "–", "warm": "✓", "cold": "✓"}
    assert {k: rows["step-100"][k] for k in TIERS} == {"hot": "✓", "warm": "✓", "cold": "✓"} and rows["step-100"]["pinned"] == "yes"
    assert rows["step-300"]["verified"] and rows["step-300"]["bytes"].endswith("KiB")
    summary = _by_key(artifacts, "tier-summary").data
    assert f"Tiering of `{namespace}`: ok" in summary and "step-300" in summary
    assert "copied to hot" in summary  # the pinned step-100 came back to hot

    (added,) = events_about("concord.tier.added", f"concord.checkpoint.{namespace}/step-300")
    assert added.payload["root"] == r["added"]["root"] and added.payload["namespace"] == namespace
    assert ("snapshot", f"concord.snapshot.{r['added']['root']}") in {(x.role, x.id) for x in added.related}
    demoted = events_about("concord.tier.demoted", f"concord.checkpoint.{namespace}/step-200")
    assert [e.payload["tier"] for e in demoted] == ["hot"]
    assert set(demoted[0].payload["verified"]) == {"warm", "cold"}

    # an hourly run without a checkpoint changes nothing, and MLflow down only warns
    again = tier_checkpoints(policy, tracking_uri=f"http://127.0.0.1:{free_port()}")
    assert again["added"] is None and again["pinned_roots"] == []
    assert again["sweep"]["copied"] == [] and again["sweep"]["violations"] == []
    # without its pin, step-100 leaves hot and warm again
    assert {(d["name"], d["tier"]) for d in again["sweep"]["demoted"]} == {("step-100", "hot"), ("step-100", "warm")}


def test_a_sweep_that_leaves_a_violation_fails_after_its_report(tmp_path, namespace, policy, ckpts, no_mlflow, artifacts_of, events_about):
    for c in ckpts:
        tier_checkpoints(policy, checkpoint_dir=str(c), pin_promoted=False)
    newest = LocalDirStore(tmp_path / "tiers" / "cold").read_ref(f"{namespace}/step-300").root
    LocalDirStore(tmp_path / "tiers" / "cold").delete_ref(f"{namespace}/step-300", newest)
    for t in ("hot", "warm"):  # and no readable copy is left to copy it back from
        for part in ("chunks", "manifests"):
            for f in (tmp_path / "tiers" / t / part).rglob("*"):
                if f.is_file():
                    f.unlink()

    state = tier_checkpoints(policy, tracking_uri=no_mlflow, return_state=True)
    assert state.is_failed()
    with pytest.raises(TieringFailed, match="violation"):
        state.result()
    artifacts = artifacts_of(state.state_details.flow_run_id)
    rows = {row["checkpoint"]: row for row in json.loads(_by_key(artifacts, "tier-status").data)}
    assert rows["step-300"]["cold"] == "✗ missing"
    summary = _by_key(artifacts, "tier-summary").data
    assert "needs attention" in summary and "**violation**" in summary and "**error**" in summary
    (violation,) = events_about("concord.tier.violation", f"concord.tiers.{namespace}")
    assert any("step-300" in v and "cold" in v for v in violation.payload["violations"])
    assert violation.payload["error_count"] >= 1


def test_restore_checkpoint_restores_from_the_nearest_tier(tmp_path, namespace, policy, ckpts, artifacts_of, events_about):
    for c in ckpts[:2]:
        tier_checkpoints(policy, checkpoint_dir=str(c), pin_promoted=False)
    state = restore_checkpoint_flow(policy, "step-100", str(tmp_path / "out"), return_state=True)
    assert state.is_completed(), state
    r = state.result()
    assert (r["tier"], r["files"]) == ("warm", 3)
    for f in ckpts[0].iterdir():
        assert (tmp_path / "out" / f.name).read_bytes() == f.read_bytes()
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "tier-restore").data
    assert "step-100" in report and "warm" in report
    (restored,) = events_about("concord.tier.restored", f"concord.checkpoint.{namespace}/step-100")
    assert restored.payload["tier"] == "warm" and restored.payload["bytes"] == r["bytes"]

    r = restore_checkpoint_flow(policy, "step-100", str(tmp_path / "out-cold"), tier="cold")
    assert r["tier"] == "cold" and r["unchanged"] is False
    # a re-run into the same folder (a retried task does this) completes, unchanged, and says so
    state = restore_checkpoint_flow(policy, "step-100", str(tmp_path / "out"), return_state=True)
    assert state.is_completed(), state
    assert state.result()["unchanged"] is True
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "tier-restore").data
    assert "unchanged" in report and "step-100" in report


def test_restore_drill_reports_and_logs_to_mlflow(tmp_path, namespace, policy, ckpts, mlflow_server, artifacts_of, events_about):
    for c in ckpts:
        tier_checkpoints(policy, checkpoint_dir=str(c), pin_promoted=False)
    state = restore_drill(policy, sample=2, tracking_uri=mlflow_server, return_state=True)
    assert state.is_completed(), state
    r = state.result()
    assert r["ok"] and r["mlflow_run_id"]
    assert [len(r["tiers"][t]["sampled"]) for t in TIERS] == [1, 2, 2]

    report = _by_key(artifacts_of(state.state_details.flow_run_id), "restore-drill").data
    assert f"Restore drill of `{namespace}`: passed" in report and r["mlflow_run_id"] in report
    assert all(f"| {t} |" in report for t in TIERS)
    (done,) = events_about("concord.drill.completed", f"concord.tiers.{namespace}")
    assert done.payload["ok"] is True and set(done.payload["tiers"]) == set(TIERS)
    assert {"rto_seconds", "rto_objective", "rpo_seconds", "rpo_objective"} <= done.payload["tiers"]["hot"].keys()

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(r["mlflow_run_id"])
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.name == "concord-restore-drills" and run.info.status == "FINISHED"
    assert {f"rto_seconds_{t}" for t in TIERS} | {f"rpo_seconds_{t}" for t in TIERS} <= run.data.metrics.keys()
    assert run.data.metrics["rto_seconds_cold"] == pytest.approx(r["tiers"]["cold"]["rto_seconds"])
    assert run.data.params["rto_objective_hot"] == "none" and run.data.params["sample"] == "2"
    assert run.data.tags["concord.namespace"] == namespace
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["drill.json"]
    logged = json.loads(Path(client.download_artifacts(run.info.run_id, "drill.json", str(tmp_path))).read_text())
    assert logged["namespace"] == namespace and logged["ok"] is True


def test_a_drill_missing_its_rto_fails_the_run_and_emits_drill_failed(tmp_path, namespace, ckpts, no_mlflow, artifacts_of, events_about):
    loose = write_policy(tmp_path / "loose.yaml", tmp_path / "tiers", namespace)
    tier_checkpoints(loose, checkpoint_dir=str(ckpts[0]), pin_promoted=False)
    strict = write_policy(tmp_path / "strict.yaml", tmp_path / "tiers", namespace, hot={"rto": 0.000001}, cold={"rto": "1h"})

    state = restore_drill(strict, tracking_uri=no_mlflow, return_state=True)  # MLflow down: a warning, not the failure
    assert state.is_failed()
    with pytest.raises(DrillFailed, match="hot"):
        state.result()
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "restore-drill").data
    assert "**FAILED**" in report and "not logged to MLflow" in report and "RTO" in report
    (failed,) = events_about("concord.drill.failed", f"concord.tiers.{namespace}")
    hot = failed.payload["tiers"]["hot"]
    assert failed.payload["ok"] is False and hot["rto_ok"] is False and hot["rto_objective"] == pytest.approx(1e-6)
    assert failed.payload["tiers"]["cold"]["rto_ok"] is True and failed.payload["tiers"]["cold"]["rto_objective"] == 3600
    assert any("RTO" in f for f in failed.payload["findings"])
