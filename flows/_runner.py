"""The task runner of the flows whose tasks fan out, chosen by the environment.

``CONCORD_TASK_RUNNER``:

- ``threads`` (the default): Prefect's thread pool, inside the flow run's own process.
- ``dask``: a temporary Dask cluster on the flow run's machine (127.0.0.1 only), started with the
  run and stopped after it, with ``CONCORD_DASK_WORKERS`` worker processes (default: one per core),
  one task at a time each.
- ``tcp://HOST:PORT`` (or ``tls://``): a running Dask scheduler, whose workers may sit on many
  machines; each must have the project installed and reach the stores and the Prefect API.

The choice is read when the flow's module is imported, which a worker does for every flow run:
set the variable in the worker's environment, or in a deployment's job variables (``env``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from prefect.futures import PrefectFuture
    from prefect.task_runners import TaskRunner

T = TypeVar("T")

RUNNER_VAR = "CONCORD_TASK_RUNNER"
WORKERS_VAR = "CONCORD_DASK_WORKERS"
ACCEPTED = "threads (the default), dask (a Dask cluster on this machine), or tcp://HOST:PORT (a running Dask scheduler; tls://HOST:PORT with TLS)"
#: fan-out tasks a thread pool keeps running at once: each already works on the store's own
#: threads, so more at once would only multiply threads and memory, not speed
THREADS_IN_FLIGHT = 2
_SCHEDULER = re.compile(r"^(tcp|tls)://[^\s:/]+:\d{1,5}$")


class TaskRunnerChoiceError(ValueError):
    """``CONCORD_TASK_RUNNER`` or ``CONCORD_DASK_WORKERS`` holds a value no task runner answers to."""


def dask_workers(environ: Mapping[str, str] | None = None) -> int:
    """``CONCORD_DASK_WORKERS``: the worker processes of a local Dask cluster (default: the cores)."""
    raw = (os.environ if environ is None else environ).get(WORKERS_VAR, "").strip()
    if not raw:
        return os.cpu_count() or 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise TaskRunnerChoiceError(
            f"{WORKERS_VAR}={raw!r} is not a number of Dask workers: set a whole number of at least 1, "
            "or unset it for one per core"
        )
    return n


def task_runner(environ: Mapping[str, str] | None = None) -> TaskRunner:
    """The task runner ``CONCORD_TASK_RUNNER`` names in ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    choice = env.get(RUNNER_VAR, "").strip()
    if choice in ("", "threads"):
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner()
    if choice == "dask":
        from prefect_dask import DaskTaskRunner

        # one task per worker process (a batch hashes on the store's own threads); everything, the
        # status page included, on 127.0.0.1, the page on a free port
        cluster = {"n_workers": dask_workers(env), "threads_per_worker": 1, "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}
        return DaskTaskRunner(cluster_kwargs=cluster)
    if _SCHEDULER.match(choice):
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=choice)
    raise TaskRunnerChoiceError(f"{RUNNER_VAR}={choice!r} is not a task runner: set it to {ACCEPTED}")


def describe(runner: TaskRunner) -> str:
    """Where a task runner runs the tasks, in a few words for a run's log."""
    if type(runner).__name__ == "DaskTaskRunner":
        address = getattr(runner, "address", None)
        if address:
            return f"the Dask scheduler at {address}"
        workers = (getattr(runner, "cluster_kwargs", None) or {}).get("n_workers", "?")
        return f"a Dask cluster on this machine ({workers} worker process(es))"
    return f"{type(runner).__name__} (threads in the flow run's process)"


def in_flight(runner: TaskRunner) -> int | None:
    """How many fan-out tasks to keep submitted at once on ``runner``: a few on threads, no limit
    on Dask (each Dask worker takes one task at a time and the scheduler queues the rest)."""
    from prefect.task_runners import ThreadPoolTaskRunner

    return THREADS_IN_FLIGHT if isinstance(runner, ThreadPoolTaskRunner) else None


def fan_out(submit: Callable[[T], PrefectFuture], items: Sequence[T], limit: int | None) -> Iterator[tuple[int, Any]]:
    """Submit ``submit(item)`` for every item, at most ``limit`` unfinished at once (None: all at
    once), and yield ``(index of the item, result)`` as each finishes. A task's failure is raised
    here, when its turn comes."""
    from prefect.futures import as_completed

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1 (or None for no limit), got {limit!r}")
    upcoming = iter(enumerate(items))
    pending: dict[PrefectFuture, int] = {}
    unsubmitted = len(items)
    while pending or unsubmitted:
        room = unsubmitted if limit is None else min(unsubmitted, limit - len(pending))
        for i, item in islice(upcoming, room):
            pending[submit(item)] = i
        unsubmitted -= room
        for future in as_completed(list(pending)):
            yield pending.pop(future), future.result()
            if unsubmitted:  # a slot is free and items wait: submit before waiting again
                break
