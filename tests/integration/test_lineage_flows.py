"""The lineage flows on a real temporary Prefect server, against embedded sqlite and a real
``mlflow server``: register data → validate → register model versions → promote, read back
through the Prefect client (artifacts, logs) and MLflow's own client.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import time
import uuid

import pytest
from readable import unreadable

from concord.errors import PromotionRefused
from concord.lineage import Lineage
from concord.lineage.contracts import ColumnSpec, infer_contract, save_contract
from concord.lineage.data import write_parquet
from concord.stores import LocalDirStore, open_store
from concord_pipelines.flows.lineage import (
    ContractViolated,
    promote_model,
    register_data_snapshot,
    register_model_version,
    validate_contract,
)
from concord_pipelines.flows.replicate import replicate_snapshot
from concord_pipelines.flows.snapshot import snapshot_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

REF = "models/tiny"


def _by_key(artifacts, key):
    found = [a for a in artifacts if a.key == key]
    assert found, f"no artifact {key!r} among {[a.key for a in artifacts]}"
    return found[-1]


@pytest.fixture(scope="module")
def sqlite_uri(mlflow_quiet, tmp_path_factory) -> str:
    """One embedded tracking database for the module, its schema made once."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow-flows') / 'mlflow.db'}"
    Lineage(uri).ensure_ready()
    return uri


@pytest.fixture(params=["sqlite", "server"])
def tracking_uri(request) -> str:
    return request.getfixturevalue("sqlite_uri" if request.param == "sqlite" else "mlflow_server")


@pytest.fixture
def mlflow_client(tracking_uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@pytest.fixture(scope="module")
def penguins():
    from palmerpenguins import load_penguins

    return load_penguins()


@pytest.fixture
def lineage_setup(penguins, tmp_path, store_dirs, checkpoints):
    """The penguins as a parquet file, contracts penguins@1 (inferred), penguins@2 (body_mass_g's
    max lowered below the heaviest penguin) and penguins-strict@1 (sex required) in a registry
    store, and a checkpoint of its own (a random config, so its root is this test's alone)
    snapshotted into us-east."""
    path = tmp_path / "penguins.parquet"
    write_parquet(penguins, path)
    registry = str(tmp_path / "registry")
    v1 = infer_contract(penguins, "penguins", 1)
    tight = tuple(dataclasses.replace(c, max=6000.0) if c.name == "body_mass_g" else c for c in v1.columns)
    strict = dataclasses.replace(v1, name="penguins-strict", columns=(ColumnSpec("sex", "string", required=True),))
    for c in (v1, dataclasses.replace(v1, version=2, columns=tight), strict):
        save_contract(LocalDirStore(registry), c)
    ckpt = checkpoints("v1")
    (ckpt / "config.json").write_text(json.dumps({"model_type": "tiny", "id": uuid.uuid4().hex}))
    snap = snapshot_checkpoint(str(ckpt), store_dirs["us-east"], REF, chunk_size_mib=1)
    return {"data": str(path), "registry": registry, "root": snap["root"], "model": f"tiny-{uuid.uuid4().hex[:10]}"}


def test_register_validate_register_and_promote(tracking_uri, lineage_setup, store_dirs, artifacts_of, mlflow_client):
    us, eu = store_dirs["us-east"], store_dirs["eu-central"]
    registry, name, root = lineage_setup["registry"], lineage_setup["model"], lineage_setup["root"]
    replicate_snapshot(us, [eu], REF, record_lineage=False)

    # register the data
    state = register_data_snapshot(lineage_setup["data"], us, "penguins", tracking_uri=tracking_uri, return_state=True)
    data = state.result()
    assert (data["rows"], len(data["columns"]), data["ref"]) == (344, 8, "data/penguins")
    summary = _by_key(artifacts_of(state.state_details.flow_run_id), "data-snapshot").data
    assert data["id"] in summary and "- **rows**: 344" in summary and "- **columns**: 8" in summary
    assert unreadable(artifacts_of(state.state_details.flow_run_id), [us, eu]) == []
    assert "| body_mass_g | float64 |" in summary and "| year | int64 |" in summary
    assert mlflow_client.get_run(data["run_id"]).data.tags["data"] == data["id"]

    # validate it against the contract inferred from it
    state = validate_contract("penguins@1", registry, "data/penguins", us, return_state=True)
    assert state.is_completed(), state
    assert state.result()["success"] is True
    arts = artifacts_of(state.state_details.flow_run_id)
    assert "contract-failures" not in {a.key for a in arts}  # no empty table: the summary says it is met
    assert "meets contract `penguins@1`" in _by_key(arts, "contract-validation").data

    # two versions: the base, and a fine-tune of it (same snapshot here) with the base as parent
    common = dict(store=us, ref=REF, data_snapshot="data/penguins", contracts_store=registry, tracking_uri=tracking_uri)
    state = register_model_version(name, contract="penguins@1", holders=[eu], return_state=True, **common)
    v1 = state.result()
    assert (v1["version"], v1["root"], v1["data_snapshot"]) == ("1", root, data["id"])
    assert {h["store"] for h in v1["held_by"]} == {us, eu}
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "model-lineage").data
    assert f"## `{name}` version 1" in report and "eu-central (hot)" in report and "`penguins@1`" in report
    assert unreadable(artifacts_of(state.state_details.flow_run_id), [us, eu]) == []
    # the lineage as a table, one row per version, not as Mermaid source
    assert "```mermaid" not in report and "| version | snapshot | derived from | data | contract | aliases |" in report
    assert f"| `{name}/1` | {root[:12]} |  | penguins {data['id'][:12]} | penguins@1 |  |" in report

    state = register_model_version(name, contract="penguins@1", parents=[f"{name}/1"], return_state=True, **common)
    assert state.result()["version"] == "2"
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "model-lineage").data
    assert f"| `{name}/2` | {root[:12]} | {name}/1 | penguins {data['id'][:12]} | penguins@1 |  |" in report
    mv = mlflow_client.get_model_version(name, "2")
    assert (mv.tags["parents"], mv.tags["contract"]) == (f"{name}/1", "penguins@1")

    # promote version 1: the gate passes
    state = promote_model(name, 1, "champion", us, registry, tracking_uri=tracking_uri, return_state=True)
    assert state.is_completed(), state
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "promotion").data
    assert f"## `{name}` version 1 is now `champion`" in report
    assert "| data meets the contract | passed | every expectation met |" in report
    assert "no version holds the alias yet" in report
    assert str(mlflow_client.get_model_version_by_alias(name, "champion").version) == "1"

    # version 3 under penguins@2, which lowers a bound: refused, with both reasons, alias unmoved
    register_model_version(name, contract="penguins@2", return_state=True, **common).result()
    state = promote_model(name, 3, "champion", us, registry, tracking_uri=tracking_uri, return_state=True)
    assert state.is_failed(), state
    with pytest.raises(PromotionRefused) as info:
        state.result()
    violated, incompatible = info.value.reasons
    assert "violates contract penguins@2" in violated
    assert "penguins@2 is not compatible with penguins@1" in incompatible and "max lowered from 6300.0 to 6000.0" in incompatible
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "promotion").data
    assert "to `champion` refused" in report and "The alias did not move" in report and unreadable(artifacts_of(state.state_details.flow_run_id), [us]) == []
    assert f"\n2. {incompatible}" in report  # a numbered list: a reason is a sentence, too long for a table cell
    assert str(mlflow_client.get_model_version_by_alias(name, "champion").version) == "1"


def test_validate_contract_fails_the_run_after_listing_the_failing_expectations(sqlite_uri, lineage_setup, store_dirs, artifacts_of):
    us = store_dirs["us-east"]
    data = register_data_snapshot(lineage_setup["data"], us, "penguins", tracking_uri=sqlite_uri)
    state = validate_contract("penguins-strict@1", lineage_setup["registry"], data["id"], us, return_state=True)
    assert state.is_failed(), state
    with pytest.raises(ContractViolated, match=r"violates contract penguins-strict@1: 1 of \d+ expectation"):
        state.result()
    arts = artifacts_of(state.state_details.flow_run_id)
    rows = json.loads(_by_key(arts, "contract-failures").data)
    assert rows == [
        {"expectation": "expect_column_values_to_not_be_null", "column": "sex", "details": "11 of 344 values are null"}
    ]
    summary = _by_key(arts, "contract-validation").data
    assert "**violates** contract `penguins-strict@1`" in summary
    assert "- `expect_column_values_to_not_be_null` on `sex`: 11 of 344 values are null" in summary and unreadable(arts, [us]) == []


def _warnings(client, flow_run_id, timeout: float = 30.0) -> list[str]:
    """The WARNING lines a flow run logged, read once the flow's own last line reached the server (logs
    go in batches)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    deadline = time.monotonic() + timeout
    while True:
        logs = client.read_logs(log_filter=flt)
        # the flow run's own last line (its tasks log "Finished in state" too, earlier)
        done = any("Finished in state" in log.message and log.task_run_id is None for log in logs)
        if done or time.monotonic() > deadline:
            return [log.message for log in logs if log.level == logging.WARNING]
        time.sleep(0.25)


def test_replication_records_holders_and_never_fails_for_lineage(
    sqlite_uri, lineage_setup, store_dirs, artifacts_of, prefect_client, monkeypatch
):
    us, eu, ap = store_dirs["us-east"], store_dirs["eu-central"], store_dirs["ap-south"]
    name, root = lineage_setup["model"], lineage_setup["root"]
    register_model_version(name, us, REF, data_snapshot=None, contract=None, tracking_uri=sqlite_uri)
    lineage = Lineage(sqlite_uri)
    assert lineage.model_lineage(name, 1)["replicas"] == [{"store": us, "tier": "hot"}]

    # lineage down: the replication completes and warns
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nowhere)
    state = replicate_snapshot(us, [eu], REF, return_state=True)
    assert state.is_completed(), state
    assert open_store(eu).read_ref(REF).root == root
    warnings = _warnings(prefect_client, state.state_details.flow_run_id)
    assert any("replicas not recorded in lineage" in m and nowhere in m for m in warnings), warnings
    assert lineage.model_lineage(name, 1)["replicas"] == [{"store": us, "tier": "hot"}]

    # lineage up: every updated target is recorded as a holder
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_uri)
    state = replicate_snapshot(us, [eu, ap], REF, return_state=True)
    assert state.is_completed(), state
    held = {h["store"] for h in lineage.model_lineage(name, 1)["replicas"]}
    assert held == {us, eu, ap}
    summary = _by_key(artifacts_of(state.state_details.flow_run_id), "replication-summary").data
    assert summary.count(f"held-by recorded on {name}/1") == 2

    # and not at all when asked not to
    replicate_snapshot(ap, [us + "-copy"], REF, record_lineage=False)
    assert {h["store"] for h in lineage.model_lineage(name, 1)["replicas"]} == {us, eu, ap}
