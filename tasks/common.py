"""What every Concord task shares: the retry policy (``RETRIED``), opening stores from their specs,
and the short names a store goes by in task run names and artifacts (:func:`store_name`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect import Task
    from prefect.client.schemas.objects import TaskRun
    from prefect.states import State

    from concord.stores.base import Store

#: attempts after the first, for errors a later attempt can cure
RETRIES = 2
#: seconds to wait before each retry
RETRY_DELAYS = [2, 10]


def is_transient(exc: BaseException) -> bool:
    """An error worth another attempt: the store's endpoint did not answer, or timed out.

    ``StoreUnreachableError`` is a ``ConnectionError``. Bad input (``ValueError``), refused
    credentials (``PermissionError``), missing snapshots (``KeyError``) and a ref moved by
    someone else (``RefConflictError``) fail the same way every time, so they are not retried;
    nor is an archive restore that timed out (it already waited as long as the policy allows).
    """
    from concord.errors import RestoreTimeoutError

    if isinstance(exc, RestoreTimeoutError):
        return False  # it already waited as long as the policy allows: a retry would wait again
    return isinstance(exc, (ConnectionError, TimeoutError))


def retry_if_transient(task: Task, task_run: TaskRun, state: State) -> bool:
    """``retry_condition_fn`` for store tasks: retry only :func:`is_transient` errors."""
    try:
        state.result()
    except Exception as exc:
        return is_transient(exc)
    return False


def _retried() -> dict:
    from prefect.cache_policies import NO_CACHE

    return dict(retries=RETRIES, retry_delay_seconds=RETRY_DELAYS, retry_condition_fn=retry_if_transient, cache_policy=NO_CACHE)


#: the options of a task that is safe to run again: ``@task(name=..., **RETRIED)`` retries it on
#: :func:`is_transient` errors, and never reuses a cached result
RETRIED = _retried()


@contextmanager
def open_stores(*specs: str | None) -> Iterator[list[Store | None]]:
    """The stores named by ``specs`` (None stays None), closed on the way out."""
    from concord.stores import open_store

    with ExitStack() as stack:
        stores: list[Store | None] = []
        for spec in specs:
            if spec is None:
                stores.append(None)
                continue
            store = open_store(spec)
            stack.callback(store.close)
            stores.append(store)
        yield stores


def store_name(store: object) -> str:
    """A store as a person reads it in the UI: its cluster's short name (``data/stores/eu-central``,
    ``/srv/stores/eu-central`` and ``s3://bucket/stores/eu-central`` → ``eu-central``), never a long
    path that pushes a table off the right edge or a task run name out of its column; the address
    itself when it names no store."""
    from concord.stores.address import StoreAddress

    text = str(store or "")
    try:
        return StoreAddress.parse(text, check=False).name or text
    except ValueError:
        return text


def named_by(prefix: str, parameter: str, short: Callable[[object], str] = store_name) -> Callable[[], str]:
    """A ``task_run_name`` for ``@task``: ``PREFIX-SHORT`` where SHORT is ``short`` of the task
    run's ``parameter`` (by default the short name of the store it names), so a run is named
    ``replicate-to-eu-central``, never by a path or a 64-hex root."""

    def run_name() -> str:
        from prefect.runtime import task_run

        value = task_run.parameters.get(parameter)
        return f"{prefix}-{short(value)}" if value else prefix

    run_name.__name__ = f"{prefix.replace('-', '_')}_run_name"
    return run_name
