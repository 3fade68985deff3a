"""Tasks called as plain functions (``task.fn()``) on stores in tmp_path; no server.

Events go to Prefect's in-memory asserting events client, so what each task emits can be read
back. Also here: the retry policy, the Prefect progress reporter outside a run, and a smoke test
that ``prefect.yaml`` declares a loadable deployment for every flow.
"""

from __future__ import annotations

import filecmp
import json
import os
import threading
from pathlib import Path

import pytest
import yaml
from prefect.events.clients import AssertingEventsClient
from prefect.states import Completed, Failed
from prefect.testing.fixtures import asserting_events_worker  # noqa: F401 (a fixture)
from servers import free_port

from concord.errors import (
    InvalidStoreURIError,
    RefConflictError,
    RefNotFoundError,
    RestoreTargetError,
    RestoreTimeoutError,
    StoreAccessError,
    StoreUnreachableError,
)
from concord.snapshots.refs import load_manifest
from concord.stores import open_store
from concord.stores.base import chunk_key
from concord_pipelines.tasks import diff_task, replicate_task, restore_task, rollback_task, snapshot_task, verify_task
from concord_pipelines.tasks.common import RETRIES, is_transient, retry_if_transient
from concord_pipelines.tasks.progress import PrefectProgress

ROOT = Path(__file__).resolve().parents[3]
REF = "models/tiny"
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def no_server():
    """Point Prefect at an address where nothing listens: a unit test that reached for an API
    would fail at once, instead of quietly starting a temporary server."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        yield


@pytest.fixture(autouse=True)
def events(no_server, asserting_events_worker):  # noqa: F811
    """``events()``: every event the tasks have emitted so far in this test."""

    def sent() -> list:
        asserting_events_worker.wait_until_empty()
        return list(AssertingEventsClient.last.events)

    return sent


@pytest.fixture
def checkpoint(tmp_path):
    """``checkpoint(name, **deltas)``: a small safetensors checkpoint folder with a config.json."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    base = {
        "embed.weight": torch.randn(256, 32, generator=g),
        "layer.0.weight": torch.randn(32, 32, generator=g),
        "layer.1.weight": torch.randn(32, 32, generator=g),
    }

    def make(name: str, **deltas: float) -> str:
        folder = tmp_path / "checkpoints" / name
        folder.mkdir(parents=True)
        tensors = {k: v + deltas.get(k.replace(".", "_"), 0.0) for k, v in base.items()}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text('{"hidden_size": 32}')
        return str(folder)

    return make


@pytest.fixture
def stores(tmp_path):
    return {n: str(tmp_path / "stores" / n) for n in ("a", "b")}


def _only(events, name):
    found = [e for e in events if e.event == name]
    assert len(found) == 1, [e.event for e in events]
    return found[0]


# ----------------------------------------------------------------------------- tasks


def test_snapshot_task_returns_a_plain_dict_and_emits_snapshot_created(checkpoint, stores, events):
    src = checkpoint("v1")
    r = snapshot_task.fn(src, stores["a"], ref=REF, chunk_size=1 * MiB, message="first")
    assert json.loads(json.dumps(r)) == r
    assert (r["files"], r["tensors"], r["ref"], r["ref_version"], r["previous"]) == (2, 3, REF, 1, None)
    assert (r["new_chunks"], r["new_bytes"]) == (r["chunks"], r["bytes"])  # an empty store: every chunk is new
    assert open_store(stores["a"]).read_ref(REF).root == r["root"]

    e = _only(events(), "concord.snapshot.created")
    assert str(e.id) == r["event_id"]
    assert e.resource.id == f"concord.snapshot.{r['root']}"
    assert {(x.role, x.id) for x in e.related} == {("store", f"concord.store.{stores['a']}"), ("ref", f"concord.ref.{REF}")}
    assert {k: e.payload[k] for k in ("root", "files", "tensors", "bytes", "new_bytes", "store", "ref")} == {
        "root": r["root"], "files": 2, "tensors": 3, "bytes": r["bytes"], "new_bytes": r["new_bytes"], "store": stores["a"], "ref": REF,
    }

    again = snapshot_task.fn(src, stores["a"], ref=REF, chunk_size=1 * MiB)
    assert again["root"] == r["root"] and again["new_bytes"] == 0 and again["ref_version"] == 1
    assert r["new_stored_bytes"] == r["new_bytes"] and e.payload["new_stored_bytes"] == r["new_bytes"]  # a plain store


def test_snapshot_task_into_a_compressed_store_says_what_it_stored(checkpoint, tmp_path, events):
    from concord.stores.config import configure

    store = str(tmp_path / "z")
    configure(open_store(store), compress="auto")
    r = snapshot_task.fn(checkpoint("v1"), store, ref=REF, chunk_size=1 * MiB)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "z" / "chunks").rglob("*") if p.is_file())
    assert r["new_stored_bytes"] == on_disk and on_disk < r["new_bytes"] == r["bytes"]
    assert _only(events(), "concord.snapshot.created").payload["new_stored_bytes"] == on_disk


def test_diff_task_names_the_changed_tensor(checkpoint, stores):
    v1 = snapshot_task.fn(checkpoint("v1"), stores["a"], ref=REF)
    v2 = snapshot_task.fn(checkpoint("v2", layer_1_weight=0.5), stores["a"], ref=REF)
    d = diff_task.fn(stores["a"], f"{REF}~1", REF)
    assert (d["a"], d["b"], d["same"]) == (v1["root"], v2["root"], False)
    assert d["changes"] == [{"file": "model.safetensors", "tensor": "layer.1.weight", "kind": "changed"}]
    assert d["bytes_differing"] == 32 * 32 * 4
    assert diff_task.fn(stores["a"], REF, v2["root"])["same"] is True


def test_replicate_task_sends_missing_chunks_once_and_emits_replica_updated(checkpoint, stores, events):
    snap = snapshot_task.fn(checkpoint("v1"), stores["a"], ref=REF)
    r = replicate_task.fn(stores["a"], stores["b"], ref=REF)
    assert json.loads(json.dumps(r)) == r
    assert (r["store"], r["root"]) == (stores["b"], snap["root"])
    assert (r["chunks_sent"], r["bytes_sent"]) == (snap["new_chunks"], snap["new_bytes"])
    assert open_store(stores["b"]).read_ref(REF).root == snap["root"]
    assert replicate_task.fn(stores["a"], stores["b"], ref=REF)["chunks_sent"] == 0

    updates = [e for e in events() if e.event == "concord.replica.updated"]
    assert [e.resource.id for e in updates] == [f"concord.store.{stores['b']}"] * 2
    assert [e.payload["bytes_sent"] for e in updates] == [snap["new_bytes"], 0]
    assert updates[0].payload["root"] == snap["root"] and updates[0].payload["ref"] == REF
    assert ("snapshot", f"concord.snapshot.{snap['root']}") in {(x.role, x.id) for x in updates[0].related}


def test_replicate_task_emits_replica_failed_and_reraises(checkpoint, stores, events):
    snapshot_task.fn(checkpoint("v1"), stores["a"], ref=REF)
    with pytest.raises(RefNotFoundError):
        replicate_task.fn(stores["a"], stores["b"], ref="models/absent")
    with pytest.raises(InvalidStoreURIError):
        replicate_task.fn(stores["a"], "s3://", ref=REF)
    failed = [e for e in events() if e.event == "concord.replica.failed"]
    assert [(e.resource.id, e.payload["error_type"]) for e in failed] == [
        (f"concord.store.{stores['b']}", "RefNotFoundError"),
        ("concord.store.s3://", "InvalidStoreURIError"),
    ]
    assert not [e for e in events() if e.event == "concord.replica.updated"]


def test_restore_task_writes_identical_files_and_never_overwrites(checkpoint, stores, tmp_path):
    src = checkpoint("v1")
    snap = snapshot_task.fn(src, stores["a"], ref=REF)
    out = tmp_path / "restored"
    r = restore_task.fn(stores["a"], REF, str(out))
    assert (r["root"], r["files"], r["path"]) == (snap["root"], 2, str(out))
    assert filecmp.cmpfiles(src, out, ["model.safetensors", "config.json"], shallow=False)[1:] == ([], [])
    again = restore_task.fn(stores["a"], snap["root"], str(out))  # a re-run with the same arguments
    assert again["unchanged"] and again["root"] == snap["root"] and not r["unchanged"]
    (out / "config.json").write_text("{}")  # the folder now holds something else: refused
    with pytest.raises(RestoreTargetError):
        restore_task.fn(stores["a"], snap["root"], str(out))
    assert (out / "config.json").read_text() == "{}"


def test_verify_task_reports_instead_of_raising_and_repairs(checkpoint, stores, events):
    snap = snapshot_task.fn(checkpoint("v1"), stores["a"], ref=REF)
    replicate_task.fn(stores["a"], stores["b"], ref=REF)
    (model,) = [f for f in load_manifest(open_store(stores["b"]), snap["root"]).files if f.path == "model.safetensors"]
    cid = model.parts[1].chunk_ids()[0]  # the first tensor's (parts[0] is the header)
    path = os.path.join(stores["b"], *chunk_key(cid).split("/"))
    with open(path, "r+b") as f:
        f.write(b"\x00\x01\x02\x03")

    bad = verify_task.fn(stores["b"], ref=REF)
    assert (bad["ok"], bad["corrupt"], bad["missing"], bad["repaired"]) == (False, [cid], [], [])
    good = verify_task.fn(stores["b"], ref=REF, repair_from=stores["a"])
    assert (good["ok"], good["repaired"], good["repair_from"]) == (True, [cid], stores["a"])
    assert verify_task.fn(stores["b"])["corrupt"] == []
    verdicts = [e for e in events() if e.event == "concord.store.verified"]
    seen = [(e.payload["ok"], e.payload["corrupt"], e.payload["repaired"]) for e in verdicts]
    assert seen == [(False, 1, 0), (True, 1, 1), (True, 0, 0)]


def test_rollback_task_moves_the_ref_and_returns_its_history(checkpoint, stores, events):
    v1 = snapshot_task.fn(checkpoint("v1"), stores["a"], ref=REF)
    v2 = snapshot_task.fn(checkpoint("v2", embed_weight=1.0), stores["a"], ref=REF)
    r = rollback_task.fn(stores["a"], REF)
    assert (r["root"], r["previous"], r["version"]) == (v1["root"], v2["root"], 3)
    assert [e["root"] for e in r["history"]] == [v1["root"], v2["root"], v1["root"]]
    e = _only(events(), "concord.ref.rolled-back")
    assert e.resource.id == f"concord.ref.{REF}" and e.payload["root"] == v1["root"]


# ----------------------------------------------------------------------------- retry policy


@pytest.mark.parametrize(
    "exc, retried",
    [
        (StoreUnreachableError("s3://b/p", "connection refused"), True),
        (TimeoutError("read timed out"), True),
        (InvalidStoreURIError("s3://", "no bucket"), False),
        (StoreAccessError("s3://b/p", "AccessDenied"), False),
        (RefConflictError("/s", REF, "a" * 64, "b" * 64), False),
        (RefNotFoundError("/s", REF), False),
        (ValueError("bad chunk size"), False),
        (RestoreTimeoutError("s3://b/cold", 3, 5, 3600.0), False),  # it already waited its full time
    ],
)
def test_only_transient_store_errors_are_retried(exc, retried):
    assert is_transient(exc) is retried
    assert retry_if_transient(replicate_task, None, Failed(data=exc)) is retried


def test_store_tasks_carry_the_retry_policy():
    assert retry_if_transient(replicate_task, None, Completed(data={})) is False
    for t in (snapshot_task, replicate_task, restore_task, verify_task):
        assert t.retries == RETRIES and t.retry_condition_fn is retry_if_transient


# ----------------------------------------------------------------------------- progress


def test_prefect_progress_outside_a_run_counts_from_many_threads():
    p = PrefectProgress(interval=0.05)
    p.start(8000, "test")
    threads = [threading.Thread(target=lambda: [p.advance(1) for _ in range(1000)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (p.done, p.total, p.percent()) == (8000, 8000, 100.0)
    p.close()
    p.start(0, "empty")
    assert p.percent() == 100.0 and p.done == 0
    p.close()
    with pytest.raises(ValueError):
        PrefectProgress(interval=0)


# ----------------------------------------------------------------------------- deployments


def test_prefect_yaml_declares_a_loadable_deployment_for_every_flow(monkeypatch):
    from prefect.cli.deploy._models import PrefectYamlModel
    from prefect.flows import load_flow_from_entrypoint

    from concord_pipelines import flows

    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    model = PrefectYamlModel.model_validate(doc)
    assert (model.name, model.build, model.push) == ("concord", None, None)
    assert model.prefect_version and model.prefect_version.split(".")[0] == "3"
    (step,) = model.pull
    assert step == {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $CONCORD_PROJECT_DIR }}"}}

    monkeypatch.chdir(ROOT)
    deployed, pairs = set(), []
    for d in model.deployments:
        # a serving node's own work runs on the serving pool (each node polls its own queue)
        pool = "concord-serving" if d.entrypoint.endswith(("checkout_node", "rollback_node")) else "concord-process"
        assert d.work_pool is not None and d.work_pool.name == pool
        assert d.description and "concord" in d.tags
        fl = load_flow_from_entrypoint(d.entrypoint)
        fl.validate_parameters(d.parameters)  # the defaults fit the flow's typed parameters
        for value in (v for k, v in d.parameters.items() if k in ("store", "source") and "stores" in str(v)):
            assert value.startswith("data/stores/")
        deployed.add(fl.name)
        pairs.append((fl.name, d.name))
    assert len(pairs) == len(set(pairs)), pairs
    assert deployed == {getattr(flows, name).name for name in flows.__all__}
