"""The lora-federation flow on a real temporary Prefect server, over small PEFT adapters in local
cluster stores: the round, its artifacts and its event, read back through the Prefect client."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from readable import unreadable

from concord.errors import TenantError
from concord.federation.ledger import list_rounds, verify_ledger
from concord.lineage import Lineage
from concord.snapshots.snapshot import snapshot
from concord.stores import open_store
from concord_pipelines.flows.federation import lora_federation

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

MODULES = ("blocks.0.query", "blocks.0.value", "blocks.1.query", "blocks.1.value")


def _by_key(artifacts, key):
    found = [a for a in artifacts if a.key == key]
    assert found, f"no artifact {key!r} among {[a.key for a in artifacts]}"
    return found[-1]


def write_adapter(path: Path, seed: int, r: int, alpha: int, scale: float = 0.1) -> Path:
    """A PEFT LoRA adapter folder (``adapter_config.json``, ``adapter_model.safetensors``)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for m in MODULES:
        tensors[f"base_model.model.{m}.lora_A.weight"] = 0.1 * torch.randn(r, 16, generator=g)
        tensors[f"base_model.model.{m}.lora_B.weight"] = scale * torch.randn(16, r, generator=g)
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "base_model_name_or_path": "tiny-base", "r": r, "lora_alpha": alpha,
        "target_modules": ["query", "value"], "bias": "none", "fan_in_fan_out": False, "lora_dropout": 0.0,
        "modules_to_save": None, "use_rslora": False, "use_dora": False, "rank_pattern": {}, "alpha_pattern": {},
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def tenant() -> str:
    """A tenant of this test alone (events on the shared server are told apart by it)."""
    return f"acme-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clusters(tmp_path, store_dirs, tenant) -> list[str]:
    """Three clusters, each holding one adapter of ``tenant`` as ``<tenant>/adapter-<cluster>``."""
    specs = [store_dirs[c] for c in ("us-east", "eu-central", "ap-south")]
    for i, (spec, (r, alpha)) in enumerate(zip(specs, [(4, 8), (2, 4), (8, 8)])):
        folder = write_adapter(tmp_path / "adapters" / str(i), seed=i, r=r, alpha=alpha)
        snapshot(folder, open_store(spec), ref=f"{tenant}/adapter-{Path(spec).name}")
    return specs


def test_the_flow_runs_a_round_writes_its_artifacts_and_emits_its_event(tmp_path, tenant, clusters, artifacts_of, events_about):
    adapters = [f"adapter-{Path(c).name}" for c in clusters]
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    state = lora_federation(tenant, clusters, adapters, method="exact", weights=[2, 1, 1], tracking_uri=tracking, return_state=True)
    assert state.is_completed(), state
    r = state.result()
    assert (r["tenant"], r["round"], r["method"], r["ref"]) == (tenant, 1, "exact", f"{tenant}/federated")
    assert [c["weight"] for c in r["clients"]] == pytest.approx([0.5, 0.25, 0.25])
    assert all(open_store(c).read_ref(f"{tenant}/federated").root == r["root"] for c in clusters)
    assert r["ledger_report"]["ok"] and r["ledger_report"]["rounds"] == 1
    assert [e["hash"] for e in list_rounds(open_store(clusters[0]), tenant)] == [r["hash"]]
    assert r["lineage"] == {"name": f"{tenant}-federated", "version": "1"}
    assert Lineage(tracking).model_lineage(f"{tenant}-federated", "1")["root"] == r["root"]

    artifacts = artifacts_of(state.state_details.flow_run_id)
    assert unreadable(artifacts, clusters) == []
    rows = json.loads(_by_key(artifacts, "federation-clients").data)
    assert [row["client"] for row in rows] == [f"{tenant}/{a}" for a in adapters]
    assert [row["status"] for row in rows] == ["accepted"] * 3
    assert [row["weight"] for row in rows] == pytest.approx([0.5, 0.25, 0.25])
    assert {"client", "cluster", "norm", "distance", "weight", "status", "reason"} <= set(rows[0])
    assert all(row["norm"] > 0 for row in rows)
    summary = _by_key(artifacts, "federation-summary").data
    assert f"Federation round 1 of `{tenant}`" in summary and r["root"][:12] in summary and r["hash"][:12] in summary
    assert "verifies" in summary and all(f"| {Path(c).name} |" in summary for c in clusters)  # each by its cluster's name

    (done,) = events_about("concord.federation.completed", f"concord.tenant.{tenant}")
    assert {k: done.payload[k] for k in ("tenant", "round", "hash", "root", "method", "rank")} == {
        "tenant": tenant, "round": 1, "hash": r["hash"], "root": r["root"], "method": "exact", "rank": r["rank"],
    }
    assert ("result", f"concord.snapshot.{r['root']}") in {(x.role, x.id) for x in done.related}
    (verified,) = events_about("concord.ledger.verified", f"concord.tenant.{tenant}")
    assert verified.payload["ok"] and verified.payload["head"] == r["hash"]

    # a second round chains onto the first
    again = lora_federation(tenant, clusters, adapters[:2], weights=[1, 3], record_lineage=False)
    assert again["round"] == 2 and again["prev"] == r["hash"] and again["lineage"] is None
    report = verify_ledger(open_store(clusters[0]), tenant)
    assert report.ok and report.rounds == 2


def test_an_outlier_is_rejected_and_shown_in_the_clients_table(tmp_path, tenant, clusters, artifacts_of):
    # a fourth client pushing against the first: its update is -5 times client 0's, large but
    # within 10x the median norm, so it is the trimmed mean's job to catch it
    folder = write_adapter(tmp_path / "adapters" / "rogue", seed=0, r=4, alpha=8, scale=-0.5)
    snapshot(folder, open_store(clusters[0]), ref=f"{tenant}/rogue")
    adapters = [f"adapter-{Path(c).name}" for c in clusters] + ["rogue"]
    state = lora_federation(tenant, clusters, adapters, method="exact", robust="trimmed", record_lineage=False, return_state=True)
    assert state.is_completed(), state
    r = state.result()
    verdicts = {c["adapter"]: c["accepted"] for c in r["clients"]}
    assert verdicts[f"{tenant}/rogue"] is False and sum(verdicts.values()) == 3
    rows = {row["client"]: row for row in json.loads(_by_key(artifacts_of(state.state_details.flow_run_id), "federation-clients").data)}
    assert rows[f"{tenant}/rogue"]["status"] == "rejected" and rows[f"{tenant}/rogue"]["reason"].startswith("trimmed")
    assert [rows[f"{tenant}/adapter-{Path(c).name}"]["status"] for c in clusters] == ["accepted"] * 3
    assert rows[f"{tenant}/rogue"]["weight"] == 0 and rows[f"{tenant}/rogue"]["distance"] > max(
        row["distance"] for row in rows.values() if row["status"] == "accepted"
    )
    (entry,) = list_rounds(open_store(clusters[0]), tenant)
    assert [c["accepted"] for c in entry["metrics"]["clients"]] == [True, True, True, False]


def test_another_tenants_adapter_fails_the_run_and_records_nothing(tmp_path, tenant, clusters):
    other = f"globex-{uuid.uuid4().hex[:8]}"
    snapshot(write_adapter(tmp_path / "adapters" / "globex", seed=5, r=4, alpha=8), open_store(clusters[0]), ref=f"{other}/adapter")
    state = lora_federation(tenant, clusters, ["adapter-us-east", f"{other}/adapter"], record_lineage=False, return_state=True)
    assert state.is_failed()
    with pytest.raises(TenantError):
        state.result()
    assert all(open_store(c).read_ref(f"{tenant}/federated") is None for c in clusters)
    assert list_rounds(open_store(clusters[0]), tenant) == [] and list_rounds(open_store(clusters[0]), other) == []
