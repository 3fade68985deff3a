"""The MLflow connection: which tracking server, whether it can take writes, the client.

Tracking defaults to sqlite in ``$CONCORD_HOME`` (``./data``) unless ``MLFLOW_TRACKING_URI`` is set
(:func:`concord.home.default_tracking_uri`).
:meth:`Tracking.ensure_ready` runs before every write: it creates a sqlite schema once, under a file
lock (two processes creating it at once corrupt it), and checks that an HTTP tracking server answers,
so an unreachable server fails before any store is touched. Writes that meet sqlite's "database is
locked" are retried with backoff (:func:`retry_locked`), so processes writing at once all succeed.

mlflow is imported inside the functions that use it.
"""

from __future__ import annotations

import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from concord.errors import LineageUnreachableError
from concord.home import default_tracking_uri

__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "HEALTH_TIMEOUT",
    "Tracking",
    "default_tracking_uri",
    "error_code",
    "retry_locked",
    "shown_uri",
    "sqlite_file",
]

HEALTH_TIMEOUT = 3.0

#: the experiment tag MLflow 3's UI reads to choose an experiment's view, and the value of its
#: classic runs view ("Machine learning"); without it the UI guesses, and may open the GenAI view
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

_LOCK_RETRIES = 12
_SQLITE_READY: set[str] = set()  # sqlite databases whose schema this process has checked
_SQLITE_READY_LOCK = threading.Lock()


def shown_uri(uri: str) -> str:
    """A tracking URI fit for messages, logs, results and artifacts: any password it carries
    replaced by ``***`` (``http://user:***@host``)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def sqlite_file(uri: str) -> str | None:
    """The absolute path of the database a ``sqlite:///…`` tracking URI names; None for any
    other URI and for an in-memory database."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return os.path.abspath(path)


def _is_locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


def retry_locked(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """Call ``fn``; on sqlite's "database is locked" (embedded or behind a server) retry with backoff."""
    attempt = 0
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            attempt += 1
            if not _is_locked(exc) or attempt >= _LOCK_RETRIES:
                raise
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))


def error_code(exc: BaseException) -> str | None:
    """MLflow's error code of ``exc`` (``RESOURCE_DOES_NOT_EXIST``, …), if it carries one."""
    return getattr(exc, "error_code", None)


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class Tracking:
    """One MLflow tracking server (and its model registry): its URI, its client, its experiments."""

    def __init__(self, tracking_uri: str | None = None, *, health_timeout: float = HEALTH_TIMEOUT) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.health_timeout = health_timeout
        self._client = None
        self._ready = False
        self._experiments: dict[str, str] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({shown_uri(self.tracking_uri)!r})"

    @property
    def remote(self) -> bool:
        return urllib.parse.urlparse(self.tracking_uri).scheme in ("http", "https")

    @property
    def client(self):
        """The MLflow client for this tracking URI (built once)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    from mlflow import MlflowClient

                    self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        return self._client

    def ensure_ready(self) -> None:
        """Make sure the tracking backend can take writes: create a sqlite schema once (under a
        file lock), or check that an HTTP server answers. Raises :class:`LineageUnreachableError`."""
        if self._ready:
            return
        db = sqlite_file(self.tracking_uri)
        if self.remote:
            self._check_server()
        elif db is not None:
            self._create_sqlite_schema(db)
        self._ready = True

    def _check_server(self) -> None:
        parts = urllib.parse.urlsplit(self.tracking_uri)
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
        url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
        try:
            with urllib.request.urlopen(url, timeout=self.health_timeout):
                return
        except urllib.error.HTTPError:
            return  # it answered (a proxy may not route /health): the API calls will tell the rest
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LineageUnreachableError(shown_uri(self.tracking_uri), f"GET {url} failed ({reason})") from exc

    def _create_sqlite_schema(self, db: str) -> None:
        with _SQLITE_READY_LOCK:
            if db in _SQLITE_READY:
                return
            with _file_lock(db + ".lock"):
                # building the tracking and registry stores creates (or checks) every table
                self.client.search_experiments(max_results=1)
                self.client.search_registered_models(max_results=1)
            _SQLITE_READY.add(db)

    def experiment_id(self, name: str) -> str:
        """The id of the experiment ``name``, created on first use (its artifacts beside a sqlite
        database rather than in the working folder), marked as a machine-learning experiment
        (:data:`EXPERIMENT_KIND`) so MLflow's UI opens it on its runs list."""
        self.ensure_ready()
        return self._experiment_id(name)

    def _experiment_id(self, name: str) -> str:
        if name in self._experiments:
            return self._experiments[name]
        client = self.client
        exp = retry_locked(client.get_experiment_by_name, name)
        if exp is None:
            location = None
            db = sqlite_file(self.tracking_uri)
            if db is not None:  # keep run artifacts next to the database, not in the working folder
                location = (Path(db).parent / "mlflow-artifacts" / name).as_uri()
            kind = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            try:
                exp_id = retry_locked(client.create_experiment, name, artifact_location=location, tags=kind)
            except Exception as exc:
                if error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp_id = client.get_experiment_by_name(name).experiment_id
                _mark_kind(client, client.get_experiment(exp_id))
        else:
            exp_id = exp.experiment_id
            _mark_kind(client, exp)  # experiments made before the mark, or marked otherwise by MLflow's UI
        self._experiments[name] = exp_id
        return exp_id


def _mark_kind(client, exp) -> None:
    """Mark a Concord experiment as a machine-learning one, unless it already is."""
    if exp is not None and (exp.tags or {}).get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        retry_locked(client.set_experiment_tag, exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
