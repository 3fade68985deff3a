"""Every flow, run on a real temporary Prefect server, over small checkpoints and local stores.

What the flows wrote is read back through the Prefect client: artifacts by flow run, events
from the server's event store, task runs for their retry counts.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import socket
import threading
import time
import uuid

import pytest
from prefect import flow, task
from readable import unreadable

from concord.hashing import chunk_id
from concord.snapshots.refs import load_manifest
from concord.stores import open_store
from concord.stores.base import chunk_key
from concord_pipelines.flows.replicate import ReplicationFailed, replicate_snapshot, snapshot_and_replicate
from concord_pipelines.flows.snapshot import diff_snapshots, restore_snapshot, rollback_ref, snapshot_checkpoint
from concord_pipelines.flows.verify import StoreDamaged, verify_store
from concord_pipelines.tasks.progress import PrefectProgress
from concord_pipelines.tasks.replication import replicate_task

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

REF = "models/tiny"


def _by_key(artifacts, key):
    found = [a for a in artifacts if a.key == key]
    assert found, f"no artifact {key!r} among {[a.key for a in artifacts]}"
    return found[-1]


def _snapshot(source, store, **kw) -> dict:
    state = snapshot_checkpoint(str(source), store, REF, chunk_size_mib=1, return_state=True, **kw)
    assert state.is_completed(), state
    return state.result()


def _task_runs(client, flow_run_id):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _corrupt(store_path: str, cid: str) -> str:
    path = os.path.join(store_path, *chunk_key(cid).split("/"))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_snapshot_then_replicate_to_two_targets(checkpoints, store_dirs, artifacts_of, events_about):
    us, eu, ap = store_dirs["us-east"], store_dirs["eu-central"], store_dirs["ap-south"]
    snap_state = snapshot_checkpoint(str(checkpoints("v1")), us, REF, chunk_size_mib=1, return_state=True)
    snap = snap_state.result()
    assert (snap["files"], snap["tensors"]) == (2, 4)
    assert snap["ref"] == REF and snap["ref_version"] == 1
    assert snap["new_bytes"] > 0 and snap["new_chunks"] == snap["chunks"]

    state = replicate_snapshot(us, [eu, ap], REF, return_state=True)
    assert state.is_completed(), state
    results = state.result()
    assert [r["store"] for r in results] == [eu, ap]
    for target, r in zip((eu, ap), results):
        s = open_store(target)
        assert s.read_ref(REF).root == snap["root"]
        manifest = load_manifest(s, snap["root"])
        assert s.has_chunks(list(manifest.chunk_lengths())) == set(manifest.chunk_lengths())
        assert (r["chunks_sent"], r["bytes_sent"], r["chunks_present"]) == (snap["new_chunks"], snap["new_bytes"], 0)

    again = replicate_snapshot(us, [eu, ap], REF)
    assert all(r["chunks_sent"] == 0 and r["chunks_present"] == snap["chunks"] for r in again)

    artifacts = artifacts_of(state.state_details.flow_run_id)
    summary = _by_key(artifacts, "replication-summary").data
    assert summary.count("updated") == 2
    assert "| eu-central | updated |" in summary and "| ap-south | updated |" in summary  # clusters by name
    assert eu not in summary and ap not in summary  # no store path to cut the table off on the right
    assert unreadable(artifacts, store_dirs.values()) == []
    progress = [a for a in artifacts if a.type == "progress"]
    assert len(progress) == 3  # the flow's count of targets, and one per replicate task
    assert all(a.data == 100 for a in progress)
    assert "snapshot-summary" in {a.key for a in artifacts_of(snap_state.state_details.flow_run_id)}

    (created,) = events_about(
        "concord.snapshot.created", f"concord.snapshot.{snap['root']}", where=lambda e: e.payload["store"] == us
    )
    assert created.payload["tensors"] == 4 and created.payload["new_bytes"] == snap["new_bytes"]
    assert {(r.role, r.id) for r in created.related} >= {("store", f"concord.store.{us}"), ("ref", f"concord.ref.{REF}")}
    for target in (eu, ap):
        updates = events_about("concord.replica.updated", f"concord.store.{target}", minimum=2)
        sent = sorted(e.payload["bytes_sent"] for e in updates)
        assert sent == [0, snap["new_bytes"]]
        assert all(e.payload["root"] == snap["root"] and e.payload["ref"] == REF for e in updates)


def test_diff_flow_lists_the_changed_tensor(checkpoints, store_dirs, artifacts_of):
    us, eu = store_dirs["us-east"], store_dirs["eu-central"]
    v1 = _snapshot(checkpoints("v1"), us)
    replicate_snapshot(us, [eu], REF)
    v2 = _snapshot(checkpoints("v2", changed={"layer.0.attn.weight": 0.01}), us)
    assert v2["root"] != v1["root"]

    state = diff_snapshots(us, f"{REF}~1", REF, return_state=True)
    d = state.result()
    assert (d["a"], d["b"], d["same"]) == (v1["root"], v2["root"], False)
    rows = json.loads(_by_key(artifacts_of(state.state_details.flow_run_id), "diff-changes").data)
    assert rows == [{"file": "model.safetensors", "tensor": "layer.0.attn.weight", "kind": "changed"}]
    assert d["bytes_differing"] == 64 * 64 * 4  # only that tensor's one chunk moves
    summary = _by_key(artifacts_of(state.state_details.flow_run_id), "diff-summary").data
    assert v1["root"][:12] in summary and v2["root"][:12] in summary

    # across clusters: eu still holds v1
    across = diff_snapshots(eu, REF, REF, against=us)
    assert [(c["tensor"], c["kind"]) for c in across["changes"]] == [("layer.0.attn.weight", "changed")]
    same = diff_snapshots(us, REF, v2["root"])
    assert same["same"] is True and same["changes"] == []


def test_verify_fails_on_damaged_chunks_and_passes_after_repair(checkpoints, store_dirs, artifacts_of, events_about):
    us, eu = store_dirs["us-east"], store_dirs["eu-central"]
    snap = _snapshot(checkpoints("v1"), us)
    replicate_snapshot(us, [eu], REF)
    manifest = load_manifest(open_store(eu), snap["root"])
    (f,) = [f for f in manifest.files if f.path == "model.safetensors"]
    parts = {p.name: p for p in f.parts}
    corrupt_id = parts["layer.0.attn.weight"].chunk_ids()[0]
    missing_id = parts["embed.weight"].chunk_ids()[0]
    path = _corrupt(eu, corrupt_id)
    os.unlink(os.path.join(eu, *chunk_key(missing_id).split("/")))

    failed = verify_store(eu, ref=REF, return_state=True)
    assert failed.is_failed()
    with pytest.raises(StoreDamaged, match="1 missing and 1 corrupt"):
        failed.result()
    artifacts = artifacts_of(failed.state_details.flow_run_id)
    report = _by_key(artifacts, "verify-report").data
    assert "DAMAGED" in report and corrupt_id[:12] in report and missing_id[:12] in report
    assert report.startswith("## eu-central: DAMAGED") and unreadable(artifacts, [us, eu]) == []

    repaired = verify_store(eu, ref=REF, repair_from=us, return_state=True)
    assert repaired.is_completed(), repaired
    r = repaired.result()
    assert r["ok"] and set(r["repaired"]) == {corrupt_id, missing_id}
    assert chunk_id(open(path, "rb").read()) == corrupt_id
    assert "repaired" in _by_key(artifacts_of(repaired.state_details.flow_run_id), "verify-report").data

    healthy = verify_store(eu)  # the whole store this time
    assert healthy["ok"] and healthy["repaired"] == [] and healthy["chunks_checked"] == snap["chunks"]

    verdicts = events_about("concord.store.verified", f"concord.store.{eu}", minimum=3)
    assert sorted((e.payload["ok"], e.payload["corrupt"], e.payload["missing"]) for e in verdicts) == [
        (False, 1, 1),
        (True, 0, 0),
        (True, 1, 1),
    ]


def test_verify_without_a_healthy_donor_still_fails(checkpoints, store_dirs):
    us, eu = store_dirs["us-east"], store_dirs["eu-central"]
    snap = _snapshot(checkpoints("v1"), us)
    replicate_snapshot(us, [eu], REF)
    cid = load_manifest(open_store(us), snap["root"]).files[0].parts[0].chunk_ids()[0]
    _corrupt(us, cid)
    _corrupt(eu, cid)
    state = verify_store(eu, ref=REF, repair_from=us, return_state=True)
    assert state.is_failed()
    with pytest.raises(StoreDamaged, match="could not supply"):
        state.result()


def test_rollback_flow_moves_the_ref_back(checkpoints, store_dirs, artifacts_of, events_about):
    us = store_dirs["us-east"]
    v1 = _snapshot(checkpoints("v1"), us)
    v2 = _snapshot(checkpoints("v2", changed={"layer.1.attn.weight": -0.5}), us)

    state = rollback_ref(us, REF, return_state=True)
    r = state.result()
    assert (r["root"], r["previous"], r["version"]) == (v1["root"], v2["root"], 3)
    assert open_store(us).read_ref(REF).root == v1["root"]
    assert [e["root"] for e in r["history"]] == [v1["root"], v2["root"], v1["root"]]
    artifacts = artifacts_of(state.state_details.flow_run_id)
    summary = _by_key(artifacts, "rollback-summary").data
    assert v1["root"][:12] in summary and v2["root"][:12] in summary
    assert f"`{REF}` in us-east" in summary and unreadable(artifacts, [us]) == []

    forward = rollback_ref(us, REF, to=v2["root"][:10])
    assert forward["root"] == v2["root"] and forward["version"] == 4
    (event,) = events_about(
        "concord.ref.rolled-back", f"concord.ref.{REF}", where=lambda e: e.payload["store"] == us and e.payload["version"] == 3
    )
    assert event.payload["root"] == v1["root"]

    bad = rollback_ref(us, REF, to="nothex!!", return_state=True)
    assert bad.is_failed()


def test_restore_flow_writes_identical_files(checkpoints, store_dirs, tmp_path, prefect_client):
    us, ap = store_dirs["us-east"], store_dirs["ap-south"]
    source = checkpoints("v1")
    _snapshot(source, us)
    replicate_snapshot(us, [ap], REF)
    out = tmp_path / "restored"

    r = restore_snapshot(ap, REF, str(out))
    assert r["files"] == 2 and r["path"] == str(out)
    match, mismatch, errors = filecmp.cmpfiles(source, out, ["model.safetensors", "config.json"], shallow=False)
    assert (mismatch, errors) == ([], []) and len(match) == 2

    same = restore_snapshot(ap, REF, str(out))  # a re-run into a folder holding that root: unchanged
    assert same["unchanged"] and same["root"] == r["root"]
    (out / "config.json").write_text("{}")  # now it holds something else
    again = restore_snapshot(ap, REF, str(out), return_state=True)
    assert again.is_failed()  # never overwrites; and not retried: the folder will still be there
    (run,) = _task_runs(prefect_client, again.state_details.flow_run_id)
    assert run.run_count == 1
    assert (out / "config.json").read_text() == "{}"


def test_snapshot_and_replicate_pipeline(checkpoints, store_dirs, events_about, artifacts_of):
    us, eu, ap = store_dirs["us-east"], store_dirs["eu-central"], store_dirs["ap-south"]
    state = snapshot_and_replicate(str(checkpoints("v1")), us, [eu, ap], REF, chunk_size_mib=1, message="nightly", return_state=True)
    out = state.result()
    # the parent's summary links its subflow runs' artifacts and Concord's event feed
    summary = _by_key(artifacts_of(state.state_details.flow_run_id), "snapshot-and-replicate-summary").data
    links = dict(re.findall(r"\[([a-z -]+)\]\(([^)]+)\)", summary))
    assert {"snapshot-summary", "replication-summary"} <= set(links), summary
    for key in ("snapshot-summary", "replication-summary"):
        artifact_id = links[key].rsplit("/artifacts/artifact/", 1)[1]
        assert prefect_artifact_key(artifact_id) == key
    assert "events?events=concord.*" in links["event feed"]
    assert "| us-east (primary) | snapshotted |" in summary and us not in summary
    root = out["snapshot"]["root"]
    for s in (us, eu, ap):
        assert open_store(s).read_ref(REF).root == root
    assert open_store(us).read_ref(REF).history[-1].message == "nightly"
    assert [r["store"] for r in out["replicas"]] == [eu, ap]
    events_about("concord.snapshot.created", f"concord.snapshot.{root}", where=lambda e: e.payload["store"] == us)


def prefect_artifact_key(artifact_id: str) -> str | None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        found = [a for a in client.read_artifacts() if str(a.id) == artifact_id]
    return found[0].key if found else None


def test_replication_reports_a_bad_target_and_completes_the_others(checkpoints, store_dirs, artifacts_of, events_about, prefect_client):
    us, eu = store_dirs["us-east"], store_dirs["eu-central"]
    snap = _snapshot(checkpoints("v1"), us)
    bad = "s3://Not_A_Bucket/x"
    state = replicate_snapshot(us, [eu, bad], REF, return_state=True)
    assert state.is_failed()
    with pytest.raises(ReplicationFailed, match="1 of 2 target"):
        state.result()
    assert open_store(eu).read_ref(REF).root == snap["root"]
    summary = _by_key(artifacts_of(state.state_details.flow_run_id), "replication-summary").data
    assert "**failed**" in summary and "updated" in summary

    runs = {r.name: r for r in _task_runs(prefect_client, state.state_details.flow_run_id)}
    # each replicate task run is named by its target's cluster, never by its address
    assert {"replicate-to-eu-central", "replicate-to-x"} <= set(runs)
    assert runs["replicate-to-x"].run_count == 1  # bad input is not retried
    assert runs["replicate-to-x"].state.is_failed()
    (failed,) = events_about("concord.replica.failed", f"concord.store.{bad}", where=lambda e: e.payload["source"] == us)
    assert failed.payload["error_type"] == "InvalidStoreURIError" and failed.payload["ref"] == REF


@flow
def _replicate_once(source: str, target: str, ref: str):
    future = replicate_task.with_options(retry_delay_seconds=0).submit(source, target, ref=ref)
    future.wait()
    return str(future.task_run_id)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_store_is_retried(checkpoints, store_dirs, aws_credentials, monkeypatch, prefect_client, events_about):
    us = store_dirs["us-east"]
    _snapshot(checkpoints("v1"), us)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    target = f"s3://concord-unreachable/{uuid.uuid4().hex[:8]}"

    task_run_id = _replicate_once(us, target, REF)
    run = prefect_client.read_task_run(uuid.UUID(task_run_id))
    assert run.state.is_failed()
    assert run.run_count == 3  # the first attempt and two retries
    failures = events_about("concord.replica.failed", f"concord.store.{target}", minimum=3)
    assert {e.payload["error_type"] for e in failures} == {"StoreUnreachableError"}


def test_prefect_progress_updates_its_artifact_while_running():
    from prefect.artifacts import Artifact

    key = f"progress-test-{uuid.uuid4().hex[:8]}"

    @task
    def work() -> tuple[float, str, float]:
        progress = PrefectProgress(key=key, interval=0.1)
        progress.start(1000, "test")
        threads = [threading.Thread(target=progress.advance, args=(100,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1.0)  # several publishing intervals
        mid = Artifact.get(key, _sync=True)
        progress.close()
        return mid.data, mid.description, Artifact.get(key, _sync=True).data

    @flow
    def run_work():
        return work()

    mid, description, final = run_work()
    assert mid == 40.0 and "test" in description
    assert final == 100.0


def test_flow_parameters_are_validated(checkpoints, store_dirs):
    with pytest.raises(Exception, match="chunk_size_mib"):
        snapshot_checkpoint(str(checkpoints("v1")), store_dirs["us-east"], REF, chunk_size_mib=0)
    with pytest.raises(Exception, match="targets"):
        replicate_snapshot(store_dirs["us-east"], [], REF)
