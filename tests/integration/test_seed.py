"""What ``make serve`` seeds (deployments/seed.py): everything the deployments' defaults name, once,
and nothing of the user's overwritten."""

from __future__ import annotations

import json

import numpy as np
import pytest

from concord_pipelines.deployments.seed import CLUSTERS, POLICY_HEADER, Seeder

pytestmark = pytest.mark.integration

USER_POLICY = """\
# the user's own policy: never rewritten, its tiers left alone
namespace: mine
hot: {store: ../mine/hot, keep: 1}
warm: {store: ../mine/warm, keep: 2, media: nas}
cold: {store: ../mine/cold, media: tape, offsite: true}
"""


def _checkpoint(folder):
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    g = np.random.default_rng(3)
    save_file({"encoder.layer.0.attention.self.query.weight": g.standard_normal((16, 16)).astype(np.float32)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"hidden_size": 16, "num_hidden_layers": 1}))
    return folder


def test_seeding_makes_what_is_missing_once_and_leaves_what_is_there(tmp_path):
    from mlflow import MlflowClient

    from concord.stores import open_store

    project = tmp_path / "project"
    policy = project / "data" / "tiering" / "policy.yaml"
    policy.parent.mkdir(parents=True)
    policy.write_text(USER_POLICY)
    uri = f"sqlite:///{project / 'data' / 'mlflow.db'}"
    said: list[str] = []
    seeder = Seeder(project, source=_checkpoint(tmp_path / "base"), tracking_uri=uri,
                    watcher_state=tmp_path / "watcher.json", say=said.append)
    seeder.run()

    data = project / "data"
    for step in ("step-0", "step-100"):
        assert (data / "checkpoints" / "minilm" / step / "COMPLETE").is_file()
    assert sorted(json.loads((tmp_path / "watcher.json").read_text())["announced"]) == [
        str(data / "checkpoints" / "minilm" / s) for s in ("step-0", "step-100")]
    refs = {c: open_store(str(data / "stores" / c)).read_ref("models/minilm") for c in CLUSTERS}
    assert refs["us-east"].version == 2 and len({r.root for r in refs.values()}) == 1, refs
    assert all(open_store(str(data / "stores" / c)).read_ref(f"acme/adapter-{c}") for c in CLUSTERS)
    assert open_store(str(data / "stores" / "us-east")).read_ref("data/penguins") is not None
    assert (data / "datasets" / "penguins.csv").is_file()
    # tonight's penguins, the nightly audit's default current table: body_mass_g drifts (a warning,
    # its histogram drawn), nothing else, and the contract still holds
    from concord.audit.inputs import check_contract, load_table
    from concord.audit.nightly import nightly_drift
    from concord.lineage.contracts import load_contract

    us = open_store(str(data / "stores" / "us-east"))
    night = nightly_drift(str(data / "datasets" / "penguins.csv"), "data/penguins-tonight", us, plots_dir=str(tmp_path / "plots"))
    drifted = {c["column"]: c["severity"] for c in night["drift"]["columns"] if c["severity"] != "ok"}
    assert drifted == {"body_mass_g": "warning"} and list(night["plots"]) == ["body_mass_g"], drifted
    tonight, _ = load_table("data/penguins-tonight", us, which="current")
    assert check_contract(load_contract(open_store(str(data / "registry")), "penguins@1"), tonight)["ok"]
    assert policy.read_text() == USER_POLICY and not (data / "mine").exists() and not (data / "tiers").exists()
    assert any("yours, left as it is" in line for line in said), said
    mlflow = MlflowClient(tracking_uri=uri, registry_uri=uri)
    [v1] = mlflow.search_model_versions("name = 'minilm'")
    assert str(mlflow.get_model_version_by_alias("minilm", "champion").version) == str(v1.version) == "1"

    said.clear()
    seeder.run()  # again: nothing new, nothing moved
    assert all(("there already" in line or "already" in line or "left as it is" in line) for line in said), said
    again = {c: open_store(str(data / "stores" / c)).read_ref("models/minilm") for c in CLUSTERS}
    assert {c: (r.root, r.version) for c, r in again.items()} == {c: (r.root, r.version) for c, r in refs.items()}
    assert len(mlflow.search_model_versions("name = 'minilm'")) == 1


def test_a_seeded_policy_says_so_and_gets_the_seeded_checkpoints(tmp_path, monkeypatch):
    from concord_pipelines.deployments.seed import policy_text

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    text = policy_text()
    assert text.startswith(POLICY_HEADER) and "s3://" not in text
    assert "offsite: true, compress: auto" in text and "compress" not in policy_text(compress_cold=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert "s3://concord-warm" in policy_text() and "s3://concord-cold" in policy_text()


def test_with_an_s3_endpoint_warm_and_cold_are_seeded_on_s3(moto_server, tmp_path, monkeypatch):
    from concord.tiering import load_policy, tier_status

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    seeder = Seeder(tmp_path / "project", source=_checkpoint(tmp_path / "base"),
                    tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", say=lambda line: None)
    seeder.seed_checkpoints()
    seeder.seed_tiers()
    status = tier_status(load_policy(str(seeder.policy_path)))
    assert status["stores"]["warm"].startswith("s3://concord-warm") and status["stores"]["cold"].startswith("s3://concord-cold")
    rows = {c["name"]: c for c in status["checkpoints"]}
    assert set(rows) == {"minilm-step-0", "minilm-step-100"} and status["violations"] == []
    assert all(rows[n]["tiers"]["cold"]["present"] for n in rows)
    from concord.stores.config import read_config

    assert read_config(load_policy(str(seeder.policy_path)).cold.open()).compress == "auto"


def test_the_seeded_cold_tier_is_compressed_unless_it_already_holds_raw_snapshots(tmp_path, monkeypatch):
    from concord.snapshots.snapshot import snapshot
    from concord.stores import open_store
    from concord.stores.config import read_config
    from concord.tiering import load_policy, tier_status

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    fresh = Seeder(tmp_path / "fresh", source=_checkpoint(tmp_path / "base"),
                   tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", say=lambda line: None)
    fresh.seed_checkpoints()
    fresh.seed_tiers()
    cold = open_store(str(fresh.data / "tiers" / "cold"))
    assert read_config(cold).compress == "auto" and "compress: auto" in fresh.policy_path.read_text()
    rows = {c["name"]: c for c in tier_status(load_policy(str(fresh.policy_path)))["checkpoints"]}
    assert all(rows[n]["tiers"]["cold"]["present"] for n in ("minilm-step-0", "minilm-step-100"))

    # a project whose cold tier was seeded raw before (its policy since deleted): left raw, still works
    old = Seeder(tmp_path / "old", source=_checkpoint(tmp_path / "base-2"),
                 tracking_uri=f"sqlite:///{tmp_path / 'mlflow-2.db'}", say=lambda line: None)
    raw_cold = old.data / "tiers" / "cold"
    raw_cold.mkdir(parents=True)
    snapshot(tmp_path / "base-2", open_store(str(raw_cold)), ref="earlier/run")
    old.seed_checkpoints()
    old.seed_tiers()
    assert "compress" not in old.policy_path.read_text() and read_config(open_store(str(raw_cold))) is None
    status = tier_status(load_policy(str(old.policy_path)))
    assert status["violations"] == [] and all(c["tiers"]["cold"]["present"] for c in status["checkpoints"])
