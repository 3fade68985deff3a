"""A DCP checkpoint spread over three nodes' folders, snapshotted by parts: into the moto S3 store
through the library, and through the snapshot-spread flow on a real temporary Prefect server, on
threads and on a running Dask scheduler whose workers each offer one node's resource. Every way
gives the root of one snapshot of the whole folder, and a part that cannot be assembled leaves no
manifest and no moved ref."""

from __future__ import annotations

import pytest
from readable import unreadable
from toy_checkpoints import files_equal, make_spread_checkpoint

from concord.errors import SpreadSnapshotError
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.spread import assemble, snapshot_part
from concord.stores import LocalDirStore
from concord.stores.s3 import S3ObjectStore
from concord_pipelines.flows._runner import task_runner
from concord_pipelines.flows.spread import snapshot_spread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MiB = 1024 * 1024
REF = "ckpt/run"


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spread")
    whole, nodes = make_spread_checkpoint(folder)
    single = snapshot(whole, LocalDirStore(folder / "single"), chunk_size=MiB)
    return whole, nodes, single.root


def test_parts_stored_in_s3_make_the_snapshot_of_the_whole_folder(spread, s3_store, moto_server, tmp_path):
    whole, nodes, root = spread
    # each node opens the shared store on its own, as separate machines would
    node_stores = [S3ObjectStore(s3_store.bucket, s3_store.prefix, endpoint_url=moto_server) for _ in nodes]
    parts = [snapshot_part(n, s, node=n.name, chunk_size=MiB).to_dict() for n, s in zip(nodes, node_stores)]
    for s in node_stores:
        s.close()
    assert not list(s3_store.iter_manifests())
    r = assemble(s3_store, parts, nodes=[n.name for n in nodes], ref=REF)
    assert r.root == root and s3_store.read_ref(REF).root == root
    restore(s3_store, r.manifest, tmp_path / "out")
    assert files_equal(whole, tmp_path / "out")


def test_a_part_whose_chunks_are_not_in_s3_is_refused(spread, s3_store, tmp_path):
    _, nodes, _ = spread
    parts = [snapshot_part(n, s3_store, node=n.name, chunk_size=MiB) for n in nodes[:2]]
    parts.append(snapshot_part(nodes[2], LocalDirStore(tmp_path / "elsewhere"), node=nodes[2].name, chunk_size=MiB))
    with pytest.raises(SpreadSnapshotError, match=r"lacks \d+ chunk.* of node node-2's part"):
        assemble(s3_store, parts, ref=REF)
    assert (list(s3_store.iter_manifests()), s3_store.read_ref(REF)) == ([], None)


def _nodes(nodes) -> list[dict]:
    return [{"name": n.name, "folder": str(n)} for n in nodes]


@pytest.mark.usefixtures("prefect_harness")
def test_the_flow_on_threads_gives_the_root_of_the_whole_folder(spread, tmp_path, artifacts_of):
    _, nodes, root = spread
    store = str(tmp_path / "store")
    state = snapshot_spread.with_options(task_runner=task_runner({"CONCORD_TASK_RUNNER": "threads"}))(
        _nodes(nodes), store, REF, chunk_size_mib=1, return_state=True
    )
    r = state.result()
    assert r["root"] == root and LocalDirStore(store).read_ref(REF).root == root
    assert [p["node"] for p in r["parts"]] == ["node-0", "node-1", "node-2"]
    (report,) = [a for a in artifacts_of(state.state_details.flow_run_id) if a.key == "spread-snapshot"]
    assert unreadable([report], [store]) == [] and "in store\n" in report.data
    assert root in report.data and "node-2" in report.data

    gone = _nodes(nodes) + [{"name": "node-3", "folder": str(tmp_path / "not-there")}]
    failed = snapshot_spread(gone, str(tmp_path / "other"), REF, chunk_size_mib=1, return_state=True)
    assert failed.is_failed() and "node(s) node-3 did not store their part" in failed.message
    assert not list(LocalDirStore(tmp_path / "other").iter_manifests())
    assert LocalDirStore(tmp_path / "other").read_ref(REF) is None


@pytest.fixture
def node_scheduler():
    """A running Dask scheduler on 127.0.0.1 with three workers, each offering one node's resource
    only: node-0, node-1 and node-9 (no worker offers node-2's); and the workers by resource."""
    from distributed import Scheduler, SpecCluster, Worker

    workers = {
        name: {"cls": Worker, "options": {"nthreads": 1, "host": "127.0.0.1", "resources": {name: 1}}}
        for name in ("node-0", "node-1", "node-9")
    }
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster:
        yield cluster.scheduler_address, cluster.workers


@pytest.mark.usefixtures("prefect_harness")
def test_the_flow_on_a_dask_scheduler_runs_each_part_on_its_nodes_worker(spread, node_scheduler, tmp_path):
    _, nodes, root = spread
    address, workers = node_scheduler
    runs = snapshot_spread.with_options(task_runner=task_runner({"CONCORD_TASK_RUNNER": address}))
    named = _nodes(nodes)
    named[2]["name"] = "node-9"  # the third folder, on the worker that offers node-9
    store = str(tmp_path / "store")
    r = runs(named, store, REF, chunk_size_mib=1)
    assert r["root"] == root and LocalDirStore(store).read_ref(REF).root == root
    assert {name: w.state.executed_count for name, w in workers.items()} == {"node-0": 1, "node-1": 1, "node-9": 1}

    # no worker offers node-2: its part waits for one, and the run fails when its time is up
    other = str(tmp_path / "other")
    state = runs(_nodes(nodes), other, REF, chunk_size_mib=1, timeout_minutes=0.25, return_state=True)
    assert state.is_failed() and "node-2" in state.message and "not done within 0.25 minutes" in state.message
    assert not list(LocalDirStore(other).iter_manifests()) and LocalDirStore(other).read_ref(REF) is None
