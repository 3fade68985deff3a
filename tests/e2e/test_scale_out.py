"""Beyond one machine, on one machine: a real Prefect server, TWO process workers on the one
``concord-process`` pool, a ``moto_server`` as the S3 store every worker shares, and a real
``mlflow server`` as the remote tracking server; all on 127.0.0.1, every process stopped after.

Flow runs are started through the API only. Each worker runs one flow run at a time, so runs
submitted together spread over both. The stores are ``s3://`` addresses that reach the moto server
through the workers' ``AWS_ENDPOINT_URL``; lineage reaches MLflow through a run's ``tracking_uri``
or, without one, the workers' ``MLFLOW_TRACKING_URI``. One verify-store run hashes on a Dask
cluster (``CONCORD_TASK_RUNNER=dask`` in the run's job variables).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import free_port, patched_environ, started_server, stop
from toy_checkpoints import make_checkpoint

from concord_pipelines.deployments.serve import WORK_POOL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROJECT_DIR = Path(__file__).resolve().parents[2]
#: what a flow run needs from the project: the code and the deployments
LINKED = ("concord", "blocks", "tasks", "flows", "deployments", "prefect.yaml")
#: the deployments of prefect.yaml these runs use, by flow
DEPLOYED = {"snapshot-checkpoint": "minilm-step-100-into-us-east", "snapshot-and-replicate": "new-checkpoint",
            "register-model-version": "minilm-version-in-mlflow", "verify-store": "eu-central-repair"}
WORKERS = ("scale-out-a", "scale-out-b")
#: every flow run's state is final within this many seconds
RUN_TIMEOUT = 240


@dataclass(frozen=True)
class Cluster:
    api_url: str
    s3_endpoint: str
    mlflow_url: str
    bucket: str
    workers: dict[str, subprocess.Popen]
    logs: Path

    def store(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"


def _prefect() -> str:
    return str(Path(sys.executable).parent / "prefect")


def _setup(cmd: list[str], env: dict, cwd: Path, log: Path) -> None:
    with open(log, "ab") as out:
        rc = subprocess.run(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            timeout=180).returncode
    if rc != 0:
        pytest.fail(f"`{' '.join(cmd[1:])}` failed with exit code {rc}:\n{log.read_text()[-4000:]}")


def _wait_for_workers(procs: dict[str, subprocess.Popen], logs: Path, timeout: float = 90) -> None:
    """Until the server lists every worker on the pool (each has polled it at least once)."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    pytest.fail(f"worker {name} exited with {proc.returncode}:\n{(logs / f'{name}.log').read_text()[-4000:]}")
            online = {w.name for w in client.read_workers_for_work_pool(WORK_POOL)}
            if set(procs) <= online:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"only {sorted(online)} of the workers {sorted(procs)} reached the server in {timeout:.0f} s")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    """A Prefect server with the four deployments used here, two workers on its pool sharing the
    moto S3 endpoint and the MLflow server, and a fresh bucket; everything stopped afterwards.
    The Prefect server starts while the moto and MLflow servers do, the workers while the
    deployments are made."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from concord.stores.s3 import S3ObjectStore

    base = tmp_path_factory.mktemp("scale-out")
    logs, project = base / "logs", base / "project"
    logs.mkdir()
    project.mkdir()
    for name in LINKED:  # flow runs start here, so nothing they write lands in the checkout
        (project / name).symlink_to(PROJECT_DIR / name)
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    ours = dict(
        PREFECT_HOME=str(base / "prefect-home"),
        PREFECT_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="true",
        PREFECT_WORKER_QUERY_SECONDS="1",
        CONCORD_PROJECT_DIR=str(project),
        PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_DIR), os.environ.get("PYTHONPATH")])),
    )

    def environ() -> dict[str, str]:  # this process's environment as it is now, and ours
        return {**{k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_PROFILE")}, **ours}

    with ExitStack() as stack:
        cmd = [_prefect(), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
        server = stack.enter_context(started_server("prefect server", cmd, f"{api_url}/health", logs / "server.log",
                                                    need_ok=True, env=environ(), cwd=base))
        # with the test credentials in this process's environment from here on
        moto_server, mlflow_server = request.getfixturevalue("moto_server"), request.getfixturevalue("mlflow_server")
        ours.update(AWS_ENDPOINT_URL=moto_server, MLFLOW_TRACKING_URI=mlflow_server)
        env = environ()
        bucket = f"concord-scale-{uuid.uuid4().hex[:12]}"
        S3ObjectStore(bucket, "setup", endpoint_url=moto_server, create_bucket=True).list_refs()
        server.wait(180)
        _setup([_prefect(), "work-pool", "create", WORK_POOL, "--type", "process"], env, base, logs / "setup.log")

        procs: dict[str, subprocess.Popen] = {}
        left: list[str] = []
        stack.callback(_stop_together, procs, left)
        for name in WORKERS:
            cmd = [_prefect(), "worker", "start", "--pool", WORK_POOL, "--name", name, "--limit", "1"]
            with open(logs / f"{name}.log", "wb") as log:
                procs[name] = subprocess.Popen(cmd, env=env, cwd=project, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True)
        names = [a for d, n in DEPLOYED.items() for a in ("--name", f"{d}/{n}")]
        _setup([_prefect(), "--no-prompt", "deploy", *names], env, project, logs / "setup.log")
        stack.enter_context(patched_environ({"PREFECT_API_URL": api_url}))
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api_url}))
        _wait_for_workers(procs, logs)
        yield Cluster(api_url, moto_server, mlflow_server, bucket, procs, logs)
    assert not left, f"processes the workers started still ran after they stopped (killed now): {left}"


def _stop_together(procs: dict[str, subprocess.Popen], left: list[str]) -> None:
    """Stop the workers and everything they started. Their descendants (flow runs, which run in
    sessions of their own, and their Dask processes) are listed first and given a minute to end by
    themselves (every run is final by now; a local Dask cluster can take a while to close on a
    busy machine); then SIGTERM goes to every worker's process group at once and each worker is
    waited for (SIGKILL if it hangs). A descendant still running after that is killed and
    described in ``left``."""
    import psutil

    started = []
    for proc in procs.values():
        try:
            started += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs([p for p in started if "prefect.engine" in " ".join(_cmdline(p))], timeout=60)
    for proc in procs.values():
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs.values():
        stop(proc)
    _, alive = psutil.wait_procs(started, timeout=15)
    for p in alive:
        try:
            left.append(" ".join(p.cmdline())[:200])
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _cmdline(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:
        return []


# ----------------------------------------------------------------------------- the runs


def _run_all(cluster: Cluster, runs: dict[str, tuple[str, dict, dict]]) -> dict:
    """Start every run (``label: (deployment, parameters, job variables)``) through the API at
    once, then wait until each has a final state; the flow runs by label."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    started = {k: run_deployment(f"{d}/{DEPLOYED[d]}", parameters=p, job_variables=j, timeout=0) for k, (d, p, j) in runs.items()}
    deadline = time.monotonic() + RUN_TIMEOUT
    with get_client(sync_client=True) as client:
        while True:
            now = {k: client.read_flow_run(r.id) for k, r in started.items()}
            if all(r.state is not None and r.state.is_final() for r in now.values()):
                return now
            if time.monotonic() > deadline:
                pending = {k: r.state.name if r.state else None for k, r in now.items() if not (r.state and r.state.is_final())}
                tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(cluster.logs.glob("*.log")))
                pytest.fail(f"flow runs not finished after {RUN_TIMEOUT} s: {pending}\n{tails}")
            time.sleep(1)


@dataclass(frozen=True)
class Runs:
    flow_runs: dict  # label -> flow run, as the server last saw it
    damaged: dict[str, str]  # what was done to eu-central before it was verified: chunk id -> "missing"/"corrupt"


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory) -> Runs:
    """Two checkpoints snapshotted into the primary S3 store and replicated to the two others, at
    once. Then, once a chunk of eu-central is deleted and another one corrupted: a third
    checkpoint snapshotted, two model versions registered in MLflow and eu-central verified and
    repaired on a Dask cluster, at once."""
    ckpts = tmp_path_factory.mktemp("checkpoints")
    us, eu, ap = cluster.store("us-east"), cluster.store("eu-central"), cluster.store("ap-south")
    shared = {"store": us, "chunk_size_mib": 1}
    replicated = _run_all(cluster, {
        name: ("snapshot-and-replicate", dict(shared, source=str(make_checkpoint(ckpts / name, seed=seed)), targets=[eu, ap],
                                              ref=f"models/{name}"), {})
        for name, seed in (("alpha", 1), ("beta", 2))
    })
    damaged = _damage(_stores(cluster)["eu-central"])
    lineage = {"store": us, "data_snapshot": None, "contract": None, "parents": [], "holders": [eu, ap],
               "contracts_store": cluster.store("registry")}
    dask = {"env": {"CONCORD_TASK_RUNNER": "dask", "CONCORD_DASK_WORKERS": "2"}}
    later = _run_all(cluster, {
        "gamma": ("snapshot-checkpoint", dict(shared, source=str(make_checkpoint(ckpts / "gamma", seed=3)), ref="models/gamma"), {}),
        "register alpha": ("register-model-version", dict(lineage, name="alpha", ref="models/alpha", tracking_uri=cluster.mlflow_url), {}),
        "register beta": ("register-model-version", dict(lineage, name="beta", ref="models/beta"), {}),  # the workers' MLFLOW_TRACKING_URI
        "verify": ("verify-store", {"store": eu, "ref": None, "repair_from": us, "batch_mib": 0.25}, dask),
    })
    return Runs(replicated | later, damaged)


def _damage(store) -> dict[str, str]:
    """Delete the first chunk of the store and corrupt the last one (ids in order)."""
    first, *_, last = sorted(store.iter_chunks())
    store.delete_chunk(first)
    store.put_chunk(last, b"not the bytes this chunk was named for", verify=False, overwrite=True)
    return {first: "missing", last: "corrupt"}


def _stores(cluster: Cluster) -> dict:
    from concord.stores import open_store

    with patched_environ({"AWS_ENDPOINT_URL": cluster.s3_endpoint}):
        return {name: open_store(cluster.store(name)) for name in ("us-east", "eu-central", "ap-south")}


def _log_of(flow_run) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id]))
        return "\n".join(line.message for line in client.read_logs(log_filter=flt, limit=200))


def _artifact(flow_run, key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]), key=ArtifactFilterKey(any_=[key]))
        found = client.read_artifacts(artifact_filter=flt)
    assert found, f"flow run {flow_run.name} has no artifact {key!r}"
    return found[-1]


def test_every_run_completes(runs):
    failed = {k: f"{r.state.name}: {r.state.message}" for k, r in runs.flow_runs.items() if not r.state.is_completed()}
    assert not failed, failed


def test_both_workers_ran_flow_runs(runs):
    by_worker: dict[str, list[str]] = {}
    for label, r in runs.flow_runs.items():
        by_worker.setdefault(r.labels.get("prefect.worker.name"), []).append(label)
    assert set(by_worker) == set(WORKERS), by_worker


def test_the_shared_s3_stores_hold_and_verify_every_snapshot(cluster, runs):
    from concord.snapshots.verify import verify

    stores = _stores(cluster)
    roots = {ref: stores["us-east"].read_ref(f"models/{ref}").root for ref in ("alpha", "beta", "gamma")}
    for name in ("eu-central", "ap-south"):
        assert {ref: stores[name].read_ref(f"models/{ref}").root for ref in ("alpha", "beta")} == {
            ref: roots[ref] for ref in ("alpha", "beta")
        }
        assert stores[name].read_ref("models/gamma") is None  # snapshotted, never replicated
    for name, store in stores.items():
        r = verify(store)
        assert r.ok and not (r.missing or r.corrupt) and len(r.roots) == (3 if name == "us-east" else 2), (name, r)


def test_verify_store_repaired_in_batches_hashed_on_a_dask_cluster(runs):
    run = runs.flow_runs["verify"]
    log = _log_of(run)
    assert "on a Dask cluster on this machine (2 worker process(es))" in log, log
    assert int(log.split("re-hashing ")[1].split(" batch")[0]) > 1, log
    report = _artifact(run, "verify-report").data
    assert ": repaired" in report, report
    for cid, kind in runs.damaged.items():  # a chunk by its first 12 hex digits, as the UI shows ids
        assert f"| {kind} | `{cid[:12]}` | repaired |" in report, report
    assert _artifact(run, "verify-progress").data == 100.0


def test_the_model_versions_are_in_the_remote_mlflow_server(cluster, runs):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=cluster.mlflow_url)
    primary = _stores(cluster)["us-east"]
    for name in ("alpha", "beta"):
        (version,) = client.search_model_versions(f"name='{name}'")
        assert version.tags["root"] == primary.read_ref(f"models/{name}").root
        assert version.tags["store"] == primary.uri
