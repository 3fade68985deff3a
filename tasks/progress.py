"""The core's ``Progress`` protocol, reported to Prefect: a progress artifact and INFO log lines.

Core functions call ``advance`` from their worker threads, many times a second. Those calls only
add to a counter under a lock; a small publisher thread turns the counter into at most one
artifact update every ``interval`` seconds, and ``close`` publishes 100 %. The publisher runs in a
copy of the context ``start`` was called in (the task run's), so its API calls go to the same
server, with the same settings, as the task's own.

Outside a flow or task run (a task's ``.fn()`` called directly) there is nothing to attach an
artifact to: progress is then only logged.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from uuid import UUID

#: log a line each time this many percent more is done
LOG_STEP_PERCENT = 25


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The current run's logger (its lines reach the Prefect UI), or a plain one outside a run."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_logger, get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return get_logger("concord.tasks")


def in_run() -> bool:
    """True inside a Prefect flow run or task run (where artifacts can be attached)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return TaskRunContext.get() is not None or FlowRunContext.get() is not None


def human_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class PrefectProgress:
    """Report a core operation's byte progress as a Prefect progress artifact.

    One artifact per phase (each ``start``). ``advance`` is safe from any thread and never
    talks to the API; the artifact is updated by a publisher thread at most every ``interval``
    seconds, and set to 100 % by ``close``.
    """

    def __init__(self, *, key: str | None = None, interval: float = 0.5) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.key = key
        self.interval = interval
        self._lock = threading.Lock()
        self._done = 0
        self._total = 0
        self._desc = ""
        self._logged_step = 0
        self._logger: logging.Logger | logging.LoggerAdapter = logging.getLogger("concord.tasks")
        self._artifact_id: UUID | None = None
        self._stop = threading.Event()
        self._publisher: threading.Thread | None = None

    # ------------------------------------------------------------------ the Progress protocol

    def start(self, total: int, desc: str) -> None:
        self.close()
        with self._lock:
            self._total = max(0, int(total))
            self._done = 0
            self._desc = desc
            self._logged_step = 0
        self._logger = run_logger()
        self._logger.info("%s: %s to process", desc, human_bytes(self._total))
        if not in_run():
            return
        from prefect.artifacts import create_progress_artifact

        self._artifact_id = create_progress_artifact(0.0, key=self.key, description=self._describe(0, self._total), _sync=True)
        self._stop = threading.Event()
        context = contextvars.copy_context()
        self._publisher = threading.Thread(
            target=context.run, args=(self._publish_loop,), name="concord-progress", daemon=True
        )
        self._publisher.start()

    def advance(self, n: int) -> None:
        with self._lock:
            self._done += n

    def close(self) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            self._stop.set()
            publisher.join()
        artifact_id, self._artifact_id = self._artifact_id, None
        with self._lock:
            done, total, desc = self._done, self._total, self._desc
        if artifact_id is not None:
            self._update(artifact_id, 100.0, f"{desc}: done, {human_bytes(done)} processed")
        if desc:
            self._logger.info("%s: done, %s of %s", desc, human_bytes(done), human_bytes(total))
        with self._lock:
            self._desc = ""

    # ------------------------------------------------------------------ internals

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    @property
    def total(self) -> int:
        with self._lock:
            return self._total

    def percent(self) -> float:
        with self._lock:
            done, total = self._done, self._total
        if total <= 0:
            return 100.0
        return max(0.0, min(100.0, 100.0 * done / total))

    def _describe(self, done: int, total: int) -> str:
        return f"{self._desc}: {human_bytes(done)} of {human_bytes(total)}"

    def _publish_loop(self) -> None:
        published = -1.0
        while not self._stop.wait(self.interval):
            pct = self.percent()
            if pct != published and self._artifact_id is not None:
                published = pct
                self._update(self._artifact_id, pct, self._describe(self.done, self.total))
            self._maybe_log(pct)

    def _maybe_log(self, pct: float) -> None:
        step = int(pct // LOG_STEP_PERCENT)
        if 0 < step < 100 // LOG_STEP_PERCENT and step > self._logged_step:
            self._logged_step = step
            self._logger.info("%s: %d%% (%s of %s)", self._desc, int(pct), human_bytes(self.done), human_bytes(self.total))

    def _update(self, artifact_id: UUID, pct: float, description: str) -> None:
        from prefect.artifacts import update_progress_artifact

        try:
            update_progress_artifact(artifact_id, pct, description=description, _sync=True)
        except Exception as exc:  # a missed progress update must never fail the work itself
            self._logger.warning("could not update progress artifact %s: %s", artifact_id, exc)
