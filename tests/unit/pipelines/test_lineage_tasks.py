"""Lineage tasks called as plain functions (``task.fn()``) on stores in tmp_path, with MLflow on
one sqlite database for the module (its schema takes seconds to create) and no Prefect server.

Events go to Prefect's in-memory asserting events client; what the tasks wrote to MLflow is read
back with MLflow's own client.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
from prefect.events.clients import AssertingEventsClient
from prefect.states import Failed
from prefect.testing.fixtures import asserting_events_worker  # noqa: F401 (a fixture)
from servers import free_port
from toy_checkpoints import make_checkpoint

from concord.errors import LineageError, LineageUnreachableError, PromotionRefused, RefNotFoundError
from concord.lineage import Lineage
from concord.lineage.contracts import ColumnSpec, infer_contract, save_contract
from concord.lineage.data import write_parquet
from concord.lineage.sources import SnapshotLocation, parse_source
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore, open_store
from concord_pipelines.tasks import (
    model_lineage_task,
    promote_task,
    record_replica_task,
    register_data_task,
    register_model_task,
    validate_contract_task,
)
from concord_pipelines.tasks.common import RETRIES, is_transient, retry_if_transient


@pytest.fixture
def mlflow_client(tracking_uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@pytest.fixture(autouse=True)
def no_server():
    """Prefect pointed at an address where nothing listens: a task reaching for an API fails."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        yield


@pytest.fixture(autouse=True)
def events(no_server, asserting_events_worker):  # noqa: F811
    """``events(name)``: the events of that name the tasks emitted so far in this test."""

    def sent(name: str) -> list:
        asserting_events_worker.wait_until_empty()
        return [e for e in AssertingEventsClient.last.events if e.event == name]

    return sent


@pytest.fixture(scope="module")
def penguins():
    from palmerpenguins import load_penguins

    return load_penguins()


@pytest.fixture
def stores(tmp_path) -> dict[str, str]:
    return {n: str(tmp_path / "stores" / n) for n in ("us", "eu", "ap", "registry")}


@pytest.fixture
def penguins_file(penguins, tmp_path) -> str:
    path = tmp_path / "penguins.parquet"
    write_parquet(penguins, path)
    return str(path)


@pytest.fixture
def contracts(penguins, stores) -> dict[str, str]:
    """penguins@1 inferred from the data; penguins@2 lowers body_mass_g's max below the heaviest
    penguin (incompatible, and violated); penguins-strict@1 requires sex (11 are unrecorded)."""
    v1 = infer_contract(penguins, "penguins", 1)
    tight = tuple(dataclasses.replace(c, max=6000.0) if c.name == "body_mass_g" else c for c in v1.columns)
    v2 = dataclasses.replace(v1, version=2, columns=tight)
    strict = dataclasses.replace(v1, name="penguins-strict", columns=(ColumnSpec("sex", "string", required=True),))
    registry = LocalDirStore(stores["registry"])
    for c in (v1, v2, strict):
        save_contract(registry, c)
    return {"v1": v1.ref, "v2": v2.ref, "strict": strict.ref}


@pytest.fixture
def data(penguins_file, stores, tracking_uri) -> dict:
    return register_data_task.fn(penguins_file, stores["us"], "penguins", tracking_uri=tracking_uri)


@pytest.fixture
def weights(stores, tmp_path) -> str:
    """A toy checkpoint (random bytes make each test's root its own) snapshotted into us, synced to eu."""
    root = snapshot(make_checkpoint(tmp_path / "ckpt"), LocalDirStore(stores["us"]), ref="models/tiny").root
    replicate(LocalDirStore(stores["us"]), [LocalDirStore(stores["eu"])], ref="models/tiny")
    return root


def _name() -> str:
    return f"tiny-{uuid.uuid4().hex[:10]}"


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# ----------------------------------------------------------------------------- data


def test_register_data_task_snapshots_the_table_and_logs_it_to_mlflow(data, penguins, stores, mlflow_client, events, penguins_file, tracking_uri):
    assert json.loads(json.dumps(data)) == data
    assert (data["name"], data["rows"], data["format"], data["ref"]) == ("penguins", 344, "parquet", "data/penguins")
    assert data["columns"] == list(penguins.columns) and data["schema"]["year"] == "int64"
    assert open_store(stores["us"]).read_ref("data/penguins").root == data["id"]

    run = mlflow_client.get_run(data["run_id"])
    assert run.data.tags["data"] == data["id"] and run.data.tags["digest"] == data["digest"]
    (di,) = run.inputs.dataset_inputs
    assert {t.key: t.value for t in di.tags}["data"] == data["id"]
    assert data["digest"].startswith(di.dataset.digest)

    (e,) = events("concord.data.registered")
    assert str(e.id) == data["event_id"] and e.resource.id == f"concord.data.{data['id']}"
    assert (e.payload["rows"], e.payload["run_id"], e.payload["ref"]) == (344, data["run_id"], "data/penguins")
    assert {(x.role, x.id) for x in e.related} == {("store", f"concord.store.{stores['us']}"), ("ref", "concord.ref.data/penguins")}

    again = register_data_task.fn(penguins_file, stores["us"], "penguins", tracking_uri=tracking_uri)
    assert again["id"] == data["id"] and again["run_id"] != data["run_id"]
    assert open_store(stores["us"]).read_ref("data/penguins").version == 1


def test_register_data_task_checks_the_tracking_server_before_touching_the_store(penguins_file, tmp_path):
    store = tmp_path / "never"
    with pytest.raises(LineageUnreachableError) as info:
        register_data_task.fn(penguins_file, str(store), "penguins", tracking_uri=f"http://127.0.0.1:{free_port()}")
    assert not store.exists()
    assert is_transient(info.value)  # a server that is down may be up at the next attempt


# ----------------------------------------------------------------------------- contracts


def test_validate_contract_task_passes_the_data_it_was_inferred_from(data, contracts, stores, events):
    by_ref = validate_contract_task.fn(stores["registry"], contracts["v1"], stores["us"], "data/penguins")
    assert json.loads(json.dumps(by_ref)) == by_ref
    assert (by_ref["success"], by_ref["failures"], by_ref["data_snapshot"], by_ref["rows"]) == (True, [], data["id"], 344)
    assert by_ref["evaluated"] > 8
    by_id = validate_contract_task.fn(stores["registry"], "penguins", stores["us"], data["id"])  # latest: penguins@2
    assert by_id["contract"] == "penguins@2" and by_id["success"] is False

    (ok,) = events("concord.contract.validated")
    assert ok.resource.id == "concord.contract.penguins@1" and ok.payload["success"] is True
    assert ("data", f"concord.data.{data['id']}") in {(x.role, x.id) for x in ok.related}
    (failed,) = events("concord.contract.failed")
    assert failed.resource.id == "concord.contract.penguins@2" and failed.payload["failure_count"] == 1


def test_validate_contract_task_reports_each_failing_expectation(data, contracts, stores, events):
    r = validate_contract_task.fn(stores["registry"], contracts["strict"], stores["us"], data["id"])
    assert r["success"] is False
    (f,) = r["failures"]
    assert (f["column"], f["expectation"]) == ("sex", "expect_column_values_to_not_be_null")
    assert "11 of 344 values are null" in f["details"]
    (e,) = events("concord.contract.failed")
    assert e.payload["failures"] == r["failures"] and e.payload["success"] is False
    with pytest.raises(RefNotFoundError):
        validate_contract_task.fn(stores["registry"], contracts["v1"], stores["us"], "data/absent")


# ----------------------------------------------------------------------------- model versions


def test_register_model_task_records_data_contract_parents_and_holders(data, contracts, weights, stores, mlflow_client, events, tracking_uri):
    name = _name()
    common = dict(data_snapshot="data/penguins", contract=contracts["v1"], contracts_store=stores["registry"], tracking_uri=tracking_uri)
    v1 = register_model_task.fn(name, [stores["us"], stores["eu"], stores["ap"]], "models/tiny", **common)
    assert json.loads(json.dumps(v1)) == v1
    assert (v1["version"], v1["root"], v1["data_snapshot"], v1["contract"]) == ("1", weights, data["id"], "penguins@1")
    assert v1["held_by"] == [{"store": stores["eu"], "tier": "hot"}, {"store": stores["us"], "tier": "hot"}]  # ap lacks it
    assert parse_source(v1["source"]) == SnapshotLocation(weights, (stores["us"], stores["eu"])) and v1["store"] == stores["us"]

    mv = mlflow_client.get_model_version(name, "1")
    assert (mv.tags["root"], mv.tags["data"], mv.tags["contract"]) == (weights, data["id"], "penguins@1")
    assert mv.source == v1["source"]

    v2 = register_model_task.fn(name, stores["us"], weights, parents=[f"{name}/1"], tiers={stores["us"]: "warm"}, tracking_uri=tracking_uri)
    assert (v2["version"], v2["parents"], v2["data_snapshot"], v2["contract"]) == ("2", [f"{name}/1"], None, None)
    assert v2["held_by"] == [{"store": stores["us"], "tier": "warm"}]

    e1, e2 = events("concord.model.registered")
    assert e1.resource.id == f"concord.model.{name}/1" and e1.payload["held_by"] == v1["held_by"]
    assert {x.role for x in e1.related} == {"snapshot", "store", "data", "contract"}
    assert (e2.resource.id, e2.payload["parents"]) == (f"concord.model.{name}/2", [f"{name}/1"])
    assert ("parent", f"concord.model.{name}/1") in {(x.role, x.id) for x in e2.related}

    with pytest.raises(LineageError, match="not a registered model version"):
        register_model_task.fn(name, stores["us"], weights, parents=[f"{name}/9"], tracking_uri=tracking_uri)
    assert len(mlflow_client.search_model_versions(f"name = '{name}'")) == 2


def test_register_model_task_checks_the_tracking_server_before_reading_stores(weights, stores, tmp_path):
    never = tmp_path / "never"
    before = _tree(Path(stores["us"]))
    with pytest.raises(LineageUnreachableError):
        register_model_task.fn(_name(), [str(never), stores["us"]], weights, tracking_uri=f"http://127.0.0.1:{free_port()}")
    assert not never.exists() and _tree(Path(stores["us"])) == before


def test_promote_task_passes_the_gate_then_refuses_an_incompatible_contract(data, contracts, weights, stores, mlflow_client, events, tracking_uri):
    name = _name()
    register = dict(data_snapshot=data["id"], contracts_store=stores["registry"], tracking_uri=tracking_uri)
    register_model_task.fn(name, stores["us"], weights, contract=contracts["v1"], **register)
    register_model_task.fn(name, stores["us"], weights, contract=contracts["v2"], **register)

    ok = promote_task.fn(name, 1, "champion", stores["us"], stores["registry"], tracking_uri=tracking_uri)
    assert json.loads(json.dumps(ok)) == ok
    assert (ok["version"], ok["alias"], ok["checks"]["previous"]) == ("1", "champion", None)
    assert ok["checks"]["validation"]["success"] is True
    assert str(mlflow_client.get_model_version_by_alias(name, "champion").version) == "1"
    (promoted,) = events("concord.model.promoted")
    assert promoted.resource.id == f"concord.model.{name}/1" and promoted.payload["alias"] == "champion"

    with pytest.raises(PromotionRefused) as info:
        promote_task.fn(name, "2", "champion", stores["us"], stores["registry"], tracking_uri=tracking_uri)
    violated, incompatible = info.value.reasons
    assert "violates contract penguins@2" in violated and "column 'body_mass_g'" in violated
    assert "penguins@2 is not compatible with penguins@1" in incompatible
    assert "max lowered from 6300.0 to 6000.0" in incompatible
    assert str(mlflow_client.get_model_version_by_alias(name, "champion").version) == "1"
    (refused,) = events("concord.promotion.refused")
    assert refused.resource.id == f"concord.model.{name}/2" and refused.payload["reasons"] == info.value.reasons
    assert not retry_if_transient(promote_task, None, Failed(data=info.value))  # a refusal is final


def test_record_replica_task_adds_a_holder_to_every_version_of_the_root(data, weights, stores, tmp_path, tracking_uri):
    name = _name()
    register_model_task.fn(name, stores["us"], weights, tracking_uri=tracking_uri)
    register_model_task.fn(name, stores["us"], weights, tracking_uri=tracking_uri)
    replicate(LocalDirStore(stores["us"]), [LocalDirStore(stores["ap"])], root=weights)

    r = record_replica_task.fn(weights, stores["ap"], "cold", tracking_uri=tracking_uri)
    assert (r["updated"], r["store"], r["tier"]) == ([f"{name}/1", f"{name}/2"], stores["ap"], "cold")
    replicas = Lineage(tracking_uri).model_lineage(name, 2)["replicas"]
    assert replicas == [{"store": stores["ap"], "tier": "cold"}, {"store": stores["us"], "tier": "hot"}]

    assert record_replica_task.fn(data["id"], stores["ap"], tracking_uri=tracking_uri)["updated"] == []  # no version has it
    fresh = tmp_path / "fresh" / "mlflow.db"
    assert record_replica_task.fn(weights, stores["ap"], tracking_uri=f"sqlite:///{fresh}")["updated"] == []
    assert not fresh.parent.exists()  # no database was created just to find it empty


def test_model_lineage_task_returns_the_graph_as_mermaid(data, contracts, weights, stores, tracking_uri):
    name = _name()
    common = dict(data_snapshot=data["id"], contract=contracts["v1"], contracts_store=stores["registry"], tracking_uri=tracking_uri)
    register_model_task.fn(name, stores["us"], weights, **common)
    register_model_task.fn(name, stores["us"], weights, parents=[f"{name}/1"], **common)
    out = model_lineage_task.fn(name, 2, tracking_uri=tracking_uri)
    assert json.loads(json.dumps(out)) == out
    assert [(p["name"], p["version"]) for p in out["parents"]] == [(name, "1")]
    assert out["data_snapshots"] == [data["id"]] and out["contract"]["ref"] == "penguins@1"
    assert out["mermaid"].startswith("flowchart LR")
    assert f"{name} v1" in out["mermaid"] and f"{name} v2" in out["mermaid"] and "-->|parent|" in out["mermaid"]
    assert {n["kind"] for n in out["graph"]["nodes"]} == {"data", "contract", "version"}


# ----------------------------------------------------------------------------- retry policy


def test_lineage_tasks_retry_only_an_unreachable_server_or_store():
    for t in (register_data_task, validate_contract_task, register_model_task, promote_task, record_replica_task, model_lineage_task):
        assert t.retries == RETRIES and t.retry_condition_fn is retry_if_transient
    assert retry_if_transient(register_data_task, None, Failed(data=LineageUnreachableError("http://x", "refused")))
    assert not retry_if_transient(register_model_task, None, Failed(data=LineageError("no store holds it")))
