"""The task runner choice (CONCORD_TASK_RUNNER) and how a verify cuts its chunks into batches."""

from __future__ import annotations

import pytest
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_dask import DaskTaskRunner

from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
from concord.snapshots.verify import VerifyPlan
from concord_pipelines.flows._runner import TaskRunnerChoiceError, dask_workers, describe, task_runner


@pytest.mark.parametrize("env", [{}, {"CONCORD_TASK_RUNNER": ""}, {"CONCORD_TASK_RUNNER": "threads"}])
def test_threads_are_the_default(env):
    assert isinstance(task_runner(env), ThreadPoolTaskRunner)


def test_dask_is_a_local_cluster_of_the_workers_asked_for():
    r = task_runner({"CONCORD_TASK_RUNNER": "dask", "CONCORD_DASK_WORKERS": "3"})
    assert isinstance(r, DaskTaskRunner) and r.address is None
    assert r.cluster_kwargs["n_workers"] == 3 and r.cluster_kwargs["threads_per_worker"] == 1
    assert r.cluster_kwargs["host"] == "127.0.0.1"


def test_dask_workers_default_to_the_cores():
    import os

    assert dask_workers({}) == (os.cpu_count() or 1)


@pytest.mark.parametrize("address", ["tcp://10.1.2.3:8786", "tcp://scheduler.internal:8786", "tls://dask:8786"])
def test_a_scheduler_address_uses_that_scheduler(address):
    r = task_runner({"CONCORD_TASK_RUNNER": address})
    assert isinstance(r, DaskTaskRunner) and r.address == address


@pytest.mark.parametrize("value", ["ray", "Dask ", "tcp://host", "tcp://:8786", "http://host:8786", "thread"])
def test_an_unknown_runner_names_the_variable_and_what_it_accepts(value):
    with pytest.raises(TaskRunnerChoiceError) as info:
        task_runner({"CONCORD_TASK_RUNNER": value})
    message = str(info.value)
    assert "CONCORD_TASK_RUNNER" in message and repr(value.strip()) in message
    assert "threads" in message and "dask" in message and "tcp://HOST:PORT" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_worker_count_names_its_variable(value):
    with pytest.raises(TaskRunnerChoiceError, match=f"CONCORD_DASK_WORKERS='{value}'.*at least 1"):
        task_runner({"CONCORD_TASK_RUNNER": "dask", "CONCORD_DASK_WORKERS": value})


# ----------------------------------------------------------------------------- batches


def _plan(lengths: dict[str, int]) -> VerifyPlan:
    return VerifyPlan("/store", ("r" * 64,), lengths)


def _weight(n: int) -> int:
    return n if n >= 0 else DEFAULT_CHUNK_SIZE


@pytest.mark.parametrize("max_bytes, max_chunks", [(1, 4096), (100, 4096), (250, 3), (10**9, 2), (10**9, 4096)])
def test_batches_are_the_chunks_in_order_within_the_limits(max_bytes, max_chunks):
    import random

    rng = random.Random(max_bytes * 31 + max_chunks)
    lengths = {f"{rng.getrandbits(256):064x}": rng.choice([-1, 0, 1, 40, 99, 100, 180]) for _ in range(60)}
    batches = _plan(lengths).batches(max_bytes, max_chunks=max_chunks)
    assert [c for b in batches for c in b] == sorted(lengths)
    assert all(b[c] == lengths[c] for b in batches for c in b)
    for b in batches:
        assert 1 <= len(b) <= max_chunks
        assert len(b) == 1 or sum(_weight(n) for n in b.values()) <= max_bytes


def test_no_chunks_make_no_batches_and_a_batch_needs_room():
    assert _plan({}).batches(10) == []
    with pytest.raises(ValueError, match="must be positive"):
        _plan({"a" * 64: 1}).batches(0)


def test_a_run_log_says_where_the_tasks_run():
    assert "threads" in describe(task_runner({}))
    assert "Dask cluster on this machine (2 worker" in describe(task_runner({"CONCORD_TASK_RUNNER": "dask", "CONCORD_DASK_WORKERS": "2"}))
    assert "tcp://10.1.2.3:8786" in describe(task_runner({"CONCORD_TASK_RUNNER": "tcp://10.1.2.3:8786"}))
