"""``concord audit … --track`` and ``concord tier drill --track``: the audit or drill is also logged
to MLflow, as the flows log it (same experiment, run name, tags, metrics, parameters, artifacts),
on one sqlite tracking database for the module; without ``--track`` nothing is logged."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from servers import free_port
from toy_checkpoints import make_checkpoint

from concord.cli import main
from concord.lineage import Lineage
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore


@pytest.fixture
def client(tracking_uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def run(capsys, *argv):
    code = main([*map(str, argv), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def tonight() -> str:
    return datetime.now(timezone.utc).date().isoformat()


def logged(client, run_id: str, experiment: str):
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == experiment
    assert run.info.status == "FINISHED"
    return run


def artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id, path)}


# ----------------------------------------------------------------------------- audits


@pytest.fixture
def tables(tmp_path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    out = {}
    for key, shift in {"ref": 0.0, "hot": 900.0}.items():
        frame = pd.DataFrame({"mass": rng.normal(4000, 500, 1500) + shift, "kind": rng.choice(["a", "b"], 1500)})
        out[key] = tmp_path / f"{key}.parquet"
        frame.to_parquet(out[key], index=False)
    return out


def test_audit_data_track_logs_the_run_the_nightly_flow_logs(capsys, tables, tracking_uri, client, tmp_path):
    from concord.audit.inputs import audit_name

    plots = tmp_path / "plots"
    code, d, err = run(capsys, "audit", "data", tables["ref"], tables["hot"], "--plots", plots, "--track", "--tracking-uri", tracking_uri)
    assert code == 3 and d["severity"] == "critical"  # the status is the audit's, logged or not
    assert d["plots"] and all(Path(p).parent == plots for p in d["plots"])
    r = logged(client, d["mlflow_run_id"], "concord-drift-audits")
    name = audit_name("ref", "hot")
    assert r.info.run_name == f"{name}-{tonight()} [P0 critical]"
    assert r.data.tags["concord.audit.name"] == name and r.data.tags["concord.audit.night"] == tonight()
    assert r.data.tags["concord.audit.severity"] == "critical" and r.data.tags["concord.audit.priority"] == "P0"
    assert r.data.tags["mlflow.note.content"].startswith("# Drift audit: **CRITICAL (P0)**")
    metrics = r.data.metrics
    assert metrics["severity_rank"] == 2 and metrics["drift_share"] == pytest.approx(d["drift_share"])
    assert metrics["columns_compared"] == 2 and metrics["columns_drifted"] == d["columns_drifted"]
    mass = next(c for c in d["columns"] if c["column"] == "mass")
    assert metrics["psi/mass"] == pytest.approx(mass["psi"]) and metrics["ks/mass"] == pytest.approx(mass["ks"])
    # each column's p-values and effects, as the report has them, so a night's run shows why it drifted
    kind = next(c for c in d["columns"] if c["column"] == "kind")
    for column, stats in (("mass", ("pvalue", "pvalue_adjusted", "mean_shift", "scale_ratio")), ("kind", ("pvalue", "pvalue_adjusted", "new_share_expected"))):
        row = mass if column == "mass" else kind
        for stat in stats:
            assert metrics[f"{stat}/{column}"] == pytest.approx(row[stat], rel=1e-12, abs=1e-300), (stat, column)
    assert metrics["effect/mass"] == pytest.approx(mass["effect_size"]) and metrics["effect/kind"] == pytest.approx(kind["effect_size"])
    assert metrics["mean_shift/mass"] > 1.5 and metrics["pvalue_adjusted/mass"] < 1e-9  # 900 on a σ of 500
    assert metrics["severity_rank/mass"] == 2 and metrics["severity_rank/kind"] == ["ok", "warning", "critical"].index(kind["severity"])
    assert "mean_shift/kind" not in metrics and "new_share_expected/mass" not in metrics
    params = r.data.params
    assert params["reference"] == str(tables["ref"]) and params["current"] == str(tables["hot"])
    assert params["bins"] == "10" and params["max_ulps"] == "1"
    assert params["psi_warning"] == "0.25" and params["escalate_after_nights"] == "2"
    assert "model" not in params and "version" not in params
    assert artifacts(client, r.info.run_id) == {"histograms", "report.json", "report.md"}
    assert {Path(p).name for p in artifacts(client, r.info.run_id, "histograms")} == {Path(p).name for p in d["plots"]}
    report = json.loads(Path(client.download_artifacts(r.info.run_id, "report.json", str(tmp_path / "dl"))).read_text())
    assert report == {k: v for k, v in d.items() if k not in ("plots", "mlflow_run_id")}
    md = Path(client.download_artifacts(r.info.run_id, "report.md", str(tmp_path / "dl"))).read_text()
    assert "histograms/" in md  # the PNGs are linked where the run keeps them


def test_audit_data_track_logs_the_histograms_without_writing_any(capsys, tables, tracking_uri, client, tmp_path):
    before = set(tmp_path.iterdir())
    code, d, _ = run(capsys, "audit", "data", tables["ref"], tables["hot"], "--track", "--tracking-uri", tracking_uri)
    assert code == 3 and "plots" not in d
    assert set(tmp_path.iterdir()) == before
    assert artifacts(client, d["mlflow_run_id"], "histograms")  # drawn for the run, as the flow draws them


def test_without_track_nothing_is_logged(capsys, tables, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'never.db'}")
    code, d, _ = run(capsys, "audit", "data", tables["ref"], tables["ref"])
    assert code == 0 and "mlflow_run_id" not in d
    assert not (tmp_path / "never.db").exists()


@pytest.fixture
def clusters(tmp_path) -> dict[str, str]:
    """Two cluster stores holding the same models/toy."""
    ckpt = make_checkpoint(tmp_path / "ckpt")
    (ckpt / "README.md").write_text("---\nlicense: apache-2.0\nretention: 90d\n---\n# toy\n")
    out = {}
    for c in ("us-east", "eu-central"):
        out[c] = str(tmp_path / "stores" / c)
        snapshot(ckpt, LocalDirStore(out[c]), ref="models/toy")
    return out


def test_audit_replicas_and_cards_track(capsys, clusters, tracking_uri, client):
    from concord.audit.inputs import audit_name

    stores = list(clusters.values())
    code, d, err = run(capsys, "audit", "replicas", "--ref", "models/toy", *stores, "--max-ulps", "2", "--track", "--tracking-uri", tracking_uri)
    assert code == 0, err
    r = logged(client, d["mlflow_run_id"], "concord-drift-audits")
    assert r.info.run_name == f"{audit_name('toy')}-{tonight()}"
    assert r.data.metrics["replicas_not_ok"] == 0 and r.data.metrics["severity_rank"] == 0
    assert r.data.params["ref"] == "models/toy" and r.data.params["max_ulps"] == "2"
    assert artifacts(client, r.info.run_id) == {"report.json", "report.md"}

    code, d, err = run(capsys, "audit", "cards", "--ref", "models/toy", *stores, "--require", "license", "--track", "--tracking-uri", tracking_uri)
    assert code == 0, err
    r = logged(client, d["mlflow_run_id"], "concord-drift-audits")
    assert r.data.tags["concord.audit.severity"] == d["severity"] and r.data.params["ref"] == "models/toy"


def test_audit_model_track(capsys, clusters, tracking_uri, client):
    from concord.audit.inputs import audit_name
    from concord.audit.tracking import audit_run_name
    from concord.snapshots.refs import resolve_root

    lineage = Lineage(tracking_uri)
    root = resolve_root(LocalDirStore(clusters["us-east"]), "models/toy")
    mv = lineage.register_model_version("toy-tracked", root, list(clusters.values()))
    code, d, err = run(capsys, "audit", "model", "toy-tracked", mv["version"], "--track", "--tracking-uri", tracking_uri)
    assert code == 0, err
    r = logged(client, d["mlflow_run_id"], "concord-drift-audits")
    assert r.info.run_name == audit_run_name(audit_name("toy-tracked"), tonight(), d["severity"], d["priority"])
    assert r.data.tags["severity"] == d["severity"]
    assert r.data.params["model"] == "toy-tracked" and r.data.params["version"] == str(mv["version"])
    assert r.data.metrics["replicas_not_ok"] == 0


# ----------------------------------------------------------------------------- drills


@pytest.fixture
def policy(tmp_path, capsys) -> Path:
    """A local three-tier policy holding two small checkpoints."""
    base = tmp_path / "tiers"
    doc = {
        "namespace": "track-lora",
        "hot": {"store": str(base / "hot"), "keep": 2},
        "warm": {"store": str(base / "warm"), "keep": 3, "media": "nas"},
        "cold": {"store": str(base / "cold"), "media": "tape", "offsite": True},
        "ready": {"settle": 0},
        "gc_grace": 0,
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    t0 = time.time() - 600
    for i, step in enumerate((100, 200)):
        ckpt = make_checkpoint(tmp_path / "ckpts" / f"step-{step}", seed=step, layers=1, dim=16)
        for f in ckpt.iterdir():
            os.utime(f, (t0 + 60 * i, t0 + 60 * i))
        code, _, err = run(capsys, "tier", "add", "--policy", path, ckpt)
        assert code == 0, err
    return path


def test_tier_drill_track_logs_the_run_the_restore_drill_flow_logs(capsys, policy, tracking_uri, client, tmp_path):
    code, d, err = run(capsys, "tier", "drill", "--policy", policy, "--sample", 2, "--track", "--tracking-uri", tracking_uri)
    assert code == 0, err
    r = logged(client, d["mlflow_run_id"], "concord-restore-drills")
    assert r.info.run_name == f"track-lora-{d['started']}"
    assert r.data.tags["concord.namespace"] == "track-lora" and r.data.tags["concord.drill.ok"] == "true"
    assert r.data.tags["concord.drill.started"] == d["started"]
    assert r.data.metrics["ok"] == 1 and r.data.metrics["findings"] == 0
    for t, tier in d["tiers"].items():
        assert r.data.metrics[f"rto_seconds_{t}"] == pytest.approx(tier["rto_seconds"])
        assert f"rpo_objective_{t}" in r.data.params
    assert r.data.params["namespace"] == "track-lora" and r.data.params["sample"] == "2"
    drill = json.loads(Path(client.download_artifacts(r.info.run_id, "drill.json", str(tmp_path / "dl"))).read_text())
    assert drill == {k: v for k, v in d.items() if k != "mlflow_run_id"}


def test_an_unreachable_tracking_server_fails_before_the_drill(capsys, policy, tmp_path):
    before = sorted(p.name for p in (tmp_path / "tiers" / "hot").rglob("*"))
    code, d, err = run(capsys, "tier", "drill", "--policy", policy, "--track", "--tracking-uri", f"http://127.0.0.1:{free_port()}")
    assert code == 14 and d is None and err.count("\n") == 1 and "unreachable" in err
    assert sorted(p.name for p in (tmp_path / "tiers" / "hot").rglob("*")) == before  # no drill record was written
