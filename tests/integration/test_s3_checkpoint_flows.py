"""Checkpoints announced under an S3 prefix, taken in by snapshot-and-replicate and tier-checkpoints
on a real temporary Prefect server and a real moto_server; and snapshot-and-replicate refusing a
malformed payload before any store is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import free_port
from test_tier_flows import write_policy

from concord.errors import SafetensorsError, StoreUnreachableError
from concord.snapshots.snapshot import snapshot
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore, open_store
from concord_pipelines.flows.replicate import BadReplicationArguments, snapshot_and_replicate
from concord_pipelines.flows.tiering import tier_checkpoints

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

MiB = 1024 * 1024


@pytest.fixture
def s3_env(moto_server, tmp_path, monkeypatch) -> Path:
    """S3 addresses reach the moto server (as a worker's AWS_ENDPOINT_URL would); staging goes to
    a folder of the test's own, returned so that a test can check nothing is left in it."""
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("CONCORD_STAGING_DIR", str(staging))
    return staging


@pytest.fixture
def bucket(s3_store) -> tuple:
    """A boto3 client and a fresh bucket on the moto server."""
    return s3_store._client(), s3_store.bucket


def upload(client, bucket: str, prefix: str, folder: Path) -> str:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
    return f"s3://{bucket}/{prefix}"


def keys_of(client, bucket: str, prefix: str = "") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))


@pytest.fixture
def s3_checkpoint(checkpoints, bucket) -> tuple[Path, str]:
    """A finished checkpoint folder (marker written last), and the same files under an S3 prefix."""
    client, name = bucket
    folder = checkpoints("step-0100")
    (folder / "COMPLETE").write_bytes(b"")
    return folder, upload(client, name, "runs/llama/step-0100", folder)


def test_an_s3_checkpoint_is_snapshotted_and_replicated_like_a_local_one(s3_env, s3_checkpoint, bucket, store_dirs, tmp_path):
    folder, uri = s3_checkpoint
    client, name = bucket
    primary, targets = store_dirs["us-east"], [store_dirs["eu-central"], f"s3://{name}/clusters/ap-south"]
    expected = snapshot(folder, LocalDirStore(tmp_path / "reference"), chunk_size=MiB).root

    r = snapshot_and_replicate(source=uri, store=primary, targets=targets, ref="models/llama", chunk_size_mib=1, message="step 100")
    assert r["snapshot"]["root"] == expected and r["snapshot"]["source"] == uri
    assert r["snapshot"]["staged_files"] == len(list(p for p in folder.rglob("*") if p.is_file()))
    assert [x["root"] for x in r["replicas"]] == [expected, expected]
    refs = {}
    for spec in [primary, *targets]:
        store = open_store(spec)
        ref = store.read_ref("models/llama")
        assert ref.root == expected
        assert verify(store, ref="models/llama").ok
        refs[spec] = (ref.version, len(ref.history))
        store.close()
    assert list(s3_env.iterdir()) == []  # the staging folder is gone

    # the same event again (a duplicate): the same root, so no ref moves and nothing is sent
    again = snapshot_and_replicate(source=uri, store=primary, targets=targets, ref="models/llama", chunk_size_mib=1, message="again")
    assert again["snapshot"]["root"] == expected and again["snapshot"]["new_chunks"] == 0
    assert [(x["chunks_sent"], x["bytes_sent"]) for x in again["replicas"]] == [(0, 0), (0, 0)]
    for spec in [primary, *targets]:
        ref = open_store(spec).read_ref("models/llama")
        assert (ref.version, len(ref.history)) == refs[spec]
    assert list(s3_env.iterdir()) == []


def test_a_failure_after_staging_still_removes_the_staging_folder(s3_env, bucket, store_dirs):
    client, name = bucket
    client.put_object(Bucket=name, Key="runs/llama/step-0007/model.safetensors", Body=b"\xff" * 64)  # not safetensors
    client.put_object(Bucket=name, Key="runs/llama/step-0007/config.json", Body=b"{}")
    state = snapshot_and_replicate(
        source=f"s3://{name}/runs/llama/step-0007", store=store_dirs["us-east"], targets=[store_dirs["eu-central"]],
        ref="models/llama", return_state=True,
    )
    assert state.is_failed()
    with pytest.raises(SafetensorsError):
        state.result()
    assert list(s3_env.iterdir()) == []
    assert not Path(store_dirs["eu-central"]).exists()  # replication never started


def test_an_unreachable_s3_endpoint_fails_before_any_store_is_touched(s3_env, store_dirs, monkeypatch):
    from concord_pipelines.flows import _staging
    from concord_pipelines.tasks.staging import stage_checkpoint_task

    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    # the staging task is still retried as deployed, only without the pauses between its attempts
    monkeypatch.setattr(_staging, "stage_checkpoint_task", stage_checkpoint_task.with_options(retry_delay_seconds=0))
    with pytest.raises(StoreUnreachableError, match="unreachable") as err:
        snapshot_and_replicate.fn(
            source="s3://checkpoints/runs/llama/step-0100", store=store_dirs["us-east"],
            targets=[store_dirs["eu-central"]], ref="models/llama",
        )
    assert dead in str(err.value)
    assert list(s3_env.iterdir()) == []
    assert not any(Path(p).exists() for p in store_dirs.values())


def test_staging_is_a_retried_task_that_starts_over_in_an_empty_folder(s3_env, s3_checkpoint, store_dirs, tmp_path, monkeypatch, prefect_client):
    """S3 going away mid-download fails one attempt of stage-checkpoint, not the run: the next
    attempt finds the staging folder empty again, and the folder is gone afterwards."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    import concord.snapshots.staging as staging
    from concord_pipelines.flows import _staging
    from concord_pipelines.tasks.staging import stage_checkpoint_task

    folder, uri = s3_checkpoint
    real, attempts = staging.stage, []

    def flaky(source, into, **kw):
        attempts.append(sorted(p.name for p in Path(into).iterdir()))
        if len(attempts) == 1:
            (Path(into) / "model.safetensors").write_bytes(b"half a download")
            raise StoreUnreachableError(source, "connection reset by peer")
        return real(source, into, **kw)

    monkeypatch.setattr(staging, "stage", flaky)
    monkeypatch.setattr(_staging, "stage_checkpoint_task", stage_checkpoint_task.with_options(retry_delay_seconds=0))
    expected = snapshot(folder, LocalDirStore(tmp_path / "reference"), chunk_size=MiB).root
    state = snapshot_and_replicate(
        source=uri, store=store_dirs["us-east"], targets=[store_dirs["eu-central"]], ref="models/llama",
        chunk_size_mib=1, return_state=True,
    )
    assert state.is_completed() and state.result()["snapshot"]["root"] == expected
    assert attempts == [[], []]  # the second attempt started from an empty folder
    assert list(s3_env.iterdir()) == []
    runs = prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    (staged,) = [r for r in runs if r.name.startswith("stage-")]
    assert staged.run_count == 2 and staged.state.is_completed()


# ----------------------------------------------------------------------------- malformed payloads


@pytest.fixture
def payload_cases(tmp_path, checkpoints, store_dirs):
    """Good parameters, and the folders a bad payload may point at."""
    good = checkpoints("step-0200")
    a_file = tmp_path / "weights.safetensors"
    a_file.write_bytes(b"x")
    marker_only = tmp_path / "step-0300"
    marker_only.mkdir()
    (marker_only / "COMPLETE").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    params = {"source": str(good), "store": store_dirs["us-east"], "targets": [store_dirs["eu-central"]], "ref": "models/llama"}
    folders = {"file": a_file, "marker_only": marker_only, "empty": tmp_path / "empty", "missing": tmp_path / "step-0400"}
    return params, {k: str(v) for k, v in folders.items()}


BAD = [
    ({"source": ""}, "source is empty"),
    ({"source": "{{ event.payload.path }}"}, "did not fill in"),
    ({"source": "runs/llama/step-0200"}, "relative path that does not exist on this worker"),
    ({"source": "file"}, "is a file, not a checkpoint folder"),
    ({"source": "marker_only"}, "holds no checkpoint files"),
    ({"source": "empty"}, "holds no checkpoint files"),
    ({"source": "missing"}, "is not a folder on this worker"),
    ({"source": "s3://checkpoints"}, "whole bucket"),
    ({"ref": "models/"}, "is not a ref name"),
    ({"ref": "models/../x"}, "is not a ref name"),
    ({"ref": "models/{{ event.payload.model }}"}, "did not fill in"),
    ({"targets": []}, "targets is empty"),
    ({"targets": ["PRIMARY"]}, "is the primary store itself"),
    ({"targets": ["file://PRIMARY"]}, "is the primary store itself"),
    ({"store": "s3://Not_A_Bucket/stores/us-east"}, "is not a store address"),
    ({"store": "nosuchscheme:us-east"}, "unknown scheme"),
    ({"targets": ["s3://checkpoints/x?y=1"]}, "is not a store address"),
]


def _fill(params: dict, bad: dict, folders: dict) -> dict:
    out = params | bad
    if bad.get("source") in folders:
        out["source"] = folders[bad["source"]]
    out["targets"] = [t.replace("PRIMARY", params["store"]) for t in out["targets"]]
    return out


def _nothing_written(params: dict, store_dirs: dict, client, bucket: str) -> None:
    assert not any(Path(p).exists() for p in store_dirs.values())
    assert keys_of(client, bucket) == []


@pytest.mark.parametrize("bad, said", BAD, ids=[f"{k}={v!r}" for (d, _) in BAD for k, v in d.items()])
def test_a_malformed_payload_is_refused_with_nothing_written(payload_cases, store_dirs, bucket, s3_env, bad, said):
    params, folders = payload_cases
    client, name = bucket
    bad = {k: (v.replace("checkpoints", name) if isinstance(v, str) else v) for k, v in bad.items()}
    params["targets"] = params["targets"] + [f"s3://{name}/clusters/ap-south"]
    with pytest.raises(BadReplicationArguments, match="before touching any store") as err:
        snapshot_and_replicate.fn(**_fill(params, bad, folders))
    assert any(said in p for p in err.value.problems), err.value.problems
    assert "checkpoint watcher" in str(err.value)
    _nothing_written(params, store_dirs, client, name)
    assert list(s3_env.iterdir()) == []


def test_every_problem_is_named_at_once_and_an_unrendered_template_points_at_the_event(payload_cases, store_dirs, bucket):
    params, _ = payload_cases
    client, name = bucket
    bad = {"source": "{{ event.payload.path }}", "ref": "models/", "targets": [params["store"]]}
    with pytest.raises(BadReplicationArguments) as err:
        snapshot_and_replicate.fn(**(params | bad))
    assert len(err.value.problems) == 3 and err.value.event
    assert "An event started this run" in str(err.value) and "(path, model, name, step)" in str(err.value)
    _nothing_written(params, store_dirs, client, name)


def test_a_refused_run_fails_before_any_task(payload_cases, store_dirs, prefect_client):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    params, folders = payload_cases
    state = snapshot_and_replicate(**(params | {"source": folders["marker_only"]}), return_state=True)
    assert state.is_failed() and "holds no checkpoint files" in str(state.result(raise_on_failure=False))
    run_id = state.state_details.flow_run_id
    assert prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))) == []
    assert not any(Path(p).exists() for p in store_dirs.values())


# ----------------------------------------------------------------------------- tier-checkpoints


def test_tier_checkpoints_takes_an_s3_checkpoint_in(s3_env, s3_checkpoint, tmp_path):
    folder, uri = s3_checkpoint
    tiers = tmp_path / "tiers"
    policy = write_policy(tmp_path / "policy.yaml", tiers, "s3-run")
    expected = snapshot(folder, LocalDirStore(tmp_path / "reference")).root

    r = tier_checkpoints(policy, checkpoint_dir=uri, pin_promoted=False)
    added = r["added"]
    assert (added["name"], added["step"], added["root"]) == ("step-0100", 100, expected)
    assert not r["sweep"]["errors"] and not r["sweep"]["violations"]
    hot = LocalDirStore(tiers / "hot")
    (ref_name,) = [n for n in hot.list_refs() if n.endswith("/step-0100")]
    before = hot.read_ref(ref_name)
    assert before.root == expected
    assert list(s3_env.iterdir()) == []

    again = tier_checkpoints(policy, checkpoint_dir=uri, name="step-0100", step=100, pin_promoted=False)
    assert again["added"]["root"] == expected and again["added"]["created"] == added["created"]
    after = hot.read_ref(ref_name)
    assert (after.version, len(after.history)) == (before.version, len(before.history))
    assert list(s3_env.iterdir()) == []
