"""A rollout on the served instance: two serving nodes, each a real process worker on its own work
queue of the ``concord-serving`` pool, both serving v1. A rollout of v2 switches the canary (its
health gate passes), then the next wave, whose health gate fails: that node flips itself back and
the canary is rolled back, so every node serves v1 again; a node × state artifact says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servers import stop
from toy_checkpoints import SMALL_CHUNK, files_equal, fine_tune, make_checkpoint

from concord_pipelines.deployments.serve import SERVING_POOL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

PROJECT_DIR = Path(__file__).resolve().parents[2]
NODES = ("node-a", "node-b")


@pytest.fixture
def nodes(served, tmp_path):
    """A worker per node, each polling its own queue; stopped (with what they started) afterwards."""
    from prefect.client.orchestration import get_client

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_PROFILE"}
    env.update(
        PREFECT_API_URL=served.api_url, PREFECT_WORKER_QUERY_SECONDS="1", CONCORD_NO_PROGRESS="1",
        CONCORD_PROJECT_DIR=str(served.project_dir),
        PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_DIR), os.environ.get("PYTHONPATH")])),
    )
    prefect = str(Path(sys.executable).parent / "prefect")
    procs = {}
    try:
        for node in NODES:
            cmd = [prefect, "worker", "start", "--pool", SERVING_POOL, "--work-queue", node, "--name", node]
            with open(tmp_path / f"{node}.log", "wb") as log:
                procs[node] = subprocess.Popen(cmd, env=env, cwd=served.project_dir, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 90
        with get_client(sync_client=True) as client:
            while {w.name for w in client.read_workers_for_work_pool(SERVING_POOL)} < set(NODES):
                for node, p in procs.items():
                    assert p.poll() is None, f"worker {node} exited:\n{(tmp_path / f'{node}.log').read_text()[-3000:]}"
                assert time.monotonic() < deadline, "the node workers never reached the server"
                time.sleep(0.5)
        yield tmp_path
    finally:
        for p in procs.values():  # both told at once, then each waited for (and killed if it hangs)
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs.values():
            stop(p)


def test_rollout_switches_the_canary_then_the_next_wave_and_rolls_all_back_when_the_wave_fails(nodes, tmp_path, client):
    from concord.serving.checkout import checkout
    from concord.serving.versions import Layout
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore
    from concord_pipelines.flows.rollout import RolloutFailed, rollout_flow

    v1 = make_checkpoint(tmp_path / "v1")
    v2 = fine_tune(v1, tmp_path / "v2", ["layers.0.attn.q.weight"])
    store = LocalDirStore(tmp_path / "store")
    m1 = snapshot(v1, store, chunk_size=SMALL_CHUNK, ref="models/toy").manifest
    m2 = snapshot(v2, store, chunk_size=SMALL_CHUNK, ref="models/toy").manifest
    dest = str(tmp_path / "{node}" / "current")
    link = {n: Path(dest.replace("{node}", n)) for n in NODES}
    # the health gate fails where an UNHEALTHY file sits beside the link
    gate = 'test ! -e "$(dirname "$CONCORD_CHECKOUT_PATH")/UNHEALTHY"'

    for n in NODES:  # both nodes serve v1 before the rollout
        checkout(store, m1, link[n])
    (tmp_path / "node-b" / "UNHEALTHY").write_text("")
    state = rollout_flow(store=store.uri, nodes=list(NODES), dest=dest, ref="models/toy", max_parallel=1,
                         health_cmd=gate, return_state=True)
    assert state.is_failed()
    with pytest.raises(RolloutFailed, match="node-b.*rolled back: node-a"):
        state.result()
    for n in NODES:
        assert os.readlink(link[n]) == Layout.of(link[n]).target(m1.root)
        assert files_equal(link[n], v1)
    # the canary switched to v2 (and passed its gate) before node-b was started; node-b switched,
    # failed its gate and flipped itself back; then the canary was rolled back
    a, b = (Layout.of(link[n]).history() for n in NODES)
    assert [(e["action"], e["root"]) for e in a] == [("checkout", m1.root), ("checkout", m2.root), ("rollback", m1.root)]
    assert [(e["action"], e["root"]) for e in b] == [("checkout", m1.root), ("checkout", m2.root), ("health-rollback", m1.root)]
    assert a[1]["time"] < b[1]["time"] < a[2]["time"]

    run_id = state.state_details.flow_run_id
    tables = [x for x in client.read_artifacts() if x.key == "rollout-nodes" and x.flow_run_id == run_id]
    final = max(tables, key=lambda x: x.created).data
    assert "| `node-a` | rolled back |" in final and "| `node-b` | **failed**" in final
