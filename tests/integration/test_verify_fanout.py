"""verify-store's hashing fanned out in batches, on threads, on a Dask cluster started for the run
and on a running Dask scheduler, on a real temporary Prefect server: the same findings and repairs
as one verify in a single call. And the bounded fan-out the flows use."""

from __future__ import annotations

import os

import pytest

from concord.hashing import chunk_id
from concord.snapshots.refs import load_manifest
from concord.snapshots.verify import verify
from concord.stores import open_store
from concord.stores.base import chunk_key
from concord_pipelines.flows._runner import task_runner
from concord_pipelines.flows.replicate import replicate_snapshot
from concord_pipelines.flows.snapshot import snapshot_checkpoint
from concord_pipelines.flows.verify import StoreDamaged, verify_store

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

REF = "models/tiny"
#: small enough that the tiny checkpoint's chunks need several batches
BATCH_MIB = 0.25
COMPARED = ("roots", "chunks_checked", "missing", "corrupt", "repaired", "bad_manifests", "ok")


def _damage(store: str, missing: str, corrupt: list[str]) -> None:
    os.unlink(os.path.join(store, *chunk_key(missing).split("/")))
    for cid in corrupt:
        path = os.path.join(store, *chunk_key(cid).split("/"))
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0xFF
        with open(path, "wb") as f:
            f.write(data)


@pytest.fixture
def damaged(checkpoints, tmp_path):
    """A primary store and four replicas damaged alike (one chunk gone, two corrupt, and a valid
    chunk that no manifest names), with the ids of the damage."""
    primary = str(tmp_path / "stores" / "primary")
    replicas = [str(tmp_path / "stores" / name) for name in ("a", "b", "c", "d")]
    state = snapshot_checkpoint(str(checkpoints("v1")), primary, REF, chunk_size_mib=1, return_state=True)
    root = state.result()["root"]
    replicate_snapshot(primary, replicas, REF, record_lineage=False)
    ids = sorted(load_manifest(open_store(primary), root).chunk_lengths())
    orphan = b"a chunk no snapshot names"
    for store in replicas:
        _damage(store, ids[0], [ids[1], ids[-1]])
        open_store(store).put_chunk(chunk_id(orphan), orphan)
    return primary, replicas, {"missing": [ids[0]], "corrupt": [ids[1], ids[-1]], "chunks": len(ids) + 1}


def _runs_with(runner_env: dict[str, str]):
    return verify_store.with_options(task_runner=task_runner(runner_env))


@pytest.fixture
def dask_scheduler():
    """The address of a running Dask scheduler with two worker processes, on 127.0.0.1."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        yield cluster.scheduler_address


def test_batches_on_threads_and_on_dask_find_and_repair_what_one_verify_does(damaged, dask_scheduler, artifacts_of):
    primary, (a, b, c, d), damage = damaged
    expected = verify(open_store(a), repair_from=open_store(primary)).to_dict()
    assert (expected["missing"], sorted(expected["corrupt"])) == (damage["missing"], sorted(damage["corrupt"]))
    assert expected["chunks_checked"] == damage["chunks"]

    threads = _runs_with({"CONCORD_TASK_RUNNER": "threads"})(b, repair_from=primary, batch_mib=BATCH_MIB, return_state=True)
    dask = _runs_with({"CONCORD_TASK_RUNNER": "dask", "CONCORD_DASK_WORKERS": "2"})(
        c, repair_from=primary, batch_mib=BATCH_MIB, return_state=True
    )
    scheduler = _runs_with({"CONCORD_TASK_RUNNER": dask_scheduler})(d, repair_from=primary, batch_mib=BATCH_MIB, return_state=True)
    for state in (threads, dask, scheduler):
        assert state.is_completed(), state
        r = state.result()
        assert r["batches"] > 2, r["batches"]
        assert {k: r[k] for k in COMPARED} == {k: expected[k] for k in COMPARED}
        progress = [x for x in artifacts_of(state.state_details.flow_run_id) if x.key == "verify-progress"]
        assert progress and progress[-1].data == 100.0
    for store in (b, c, d):
        assert verify(open_store(store)).ok, f"{store} still damaged after the repair"


def test_a_damaged_store_fails_with_every_batch_counted(damaged):
    _, (a, *_), _ = damaged
    state = verify_store(a, batch_mib=BATCH_MIB, return_state=True)
    assert state.is_failed()
    with pytest.raises(StoreDamaged, match="1 missing and 2 corrupt"):
        state.result()


def test_a_ref_verify_in_one_batch_or_many_checks_the_same_chunks(damaged):
    primary, _, damage = damaged
    whole = verify_store(primary, ref=REF, batch_mib=1024)
    fine = verify_store(primary, ref=REF, batch_mib=BATCH_MIB)
    assert whole["batches"] == 1 and fine["batches"] > 2
    assert {k: whole[k] for k in COMPARED} == {k: fine[k] for k in COMPARED}
    assert whole["ok"] and whole["chunks_checked"] == damage["chunks"] - 1


def test_fan_out_keeps_at_most_the_limit_in_flight_and_returns_every_result():
    import threading
    import time

    from prefect import flow, task

    from concord_pipelines.flows._runner import fan_out

    lock, running, seen = threading.Lock(), [0], []

    @task
    def square(x: int) -> int:
        with lock:
            running[0] += 1
            seen.append(running[0])
        time.sleep(0.05)  # long enough for a runner that ignored the limit to start the others
        with lock:
            running[0] -= 1
        if x == 99:
            raise ValueError("item 99 is refused")
        return x * x

    items = list(range(7))
    everyone = threading.Barrier(len(items), timeout=60)

    @task
    def meet(x: int) -> int:
        everyone.wait()  # passes only once every item is in flight at the same time
        return x

    @flow(task_runner=task_runner({}))
    def fanned(items: list[int], limit: int | None, unlimited: bool = False) -> list:
        return list(fan_out(meet.submit if unlimited else square.submit, items, limit))

    limited = fanned(items, 2)
    assert sorted(limited) == [(i, x * x) for i, x in enumerate(items)] and max(seen) <= 2
    assert sorted(fanned(items, None, unlimited=True)) == [(i, x) for i, x in enumerate(items)]
    with pytest.raises(ValueError, match="item 99"):
        fanned([1, 99, 2], 1)
    with pytest.raises(ValueError, match="limit must be at least 1"):
        fanned(items, 0)
