"""Reaching the Prefect API that a saved block needs, deliberately and within a deadline.

A ``block:NAME`` store, trust source or tier policy is read from the Prefect API. With
``PREFECT_API_URL`` set, that API must answer within ``CONCORD_PREFECT_TIMEOUT`` seconds (10 by
default); otherwise Prefect would start its temporary server, which on a new Prefect home first
builds its database (about half a minute of CPU) and then gives up after its own 20 seconds with
a traceback. Here instead:

- when the temporary server's database cannot hold the block (no database yet, or no block of that
  type and name in it), the lookup answers "no such block" at once, without starting anything;
- otherwise the server is started once, waited on for at most ``CONCORD_PREFECT_START_TIMEOUT``
  seconds (90 by default), with a line on a terminal saying what is being waited for;
- a server that does not start, or an API that does not answer, is one
  :class:`~concord.errors.PrefectUnavailableError` (exit status 14), never a traceback.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from concord.errors import PrefectUnavailableError

START_TIMEOUT_ENV = "CONCORD_PREFECT_START_TIMEOUT"
API_TIMEOUT_ENV = "CONCORD_PREFECT_TIMEOUT"
DEFAULT_START_TIMEOUT = 90.0
DEFAULT_API_TIMEOUT = 10.0

B = TypeVar("B")

__all__ = [
    "API_TIMEOUT_ENV",
    "START_TIMEOUT_ENV",
    "api_timeout",
    "configured_api",
    "ensure_api",
    "load_block",
    "start_timeout",
    "where_blocks_live",
]


def _seconds(env: str, default: float) -> float:
    text = os.environ.get(env, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise PrefectUnavailableError(env, f"{text!r} is not a number of seconds", f"Set {env} to a positive number, e.g. {default:g}")
    return value


def start_timeout() -> float:
    """How long to wait for Prefect's temporary server to start (``CONCORD_PREFECT_START_TIMEOUT``)."""
    return _seconds(START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT)


def api_timeout() -> float:
    """How long a configured Prefect API has to answer (``CONCORD_PREFECT_TIMEOUT``)."""
    return _seconds(API_TIMEOUT_ENV, DEFAULT_API_TIMEOUT)


def configured_api() -> str | None:
    """``PREFECT_API_URL`` as Prefect reads it (environment or profile), or None."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def _temporary_database() -> Path | None:
    """The SQLite file of Prefect's temporary server, or None when its database is not SQLite."""
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    url = PREFECT_API_DATABASE_CONNECTION_URL.value()
    url = url.get_secret_value() if hasattr(url, "get_secret_value") else str(url or "")
    scheme, sep, rest = url.partition(":///")
    if not sep or not scheme.startswith("sqlite") or rest.startswith(":memory:"):
        return None
    return Path(rest.split("?", 1)[0])  # sqlite:////abs/path keeps its leading slash in rest


def where_blocks_live() -> str:
    """Where a block lookup looks, for a message: the configured API or the temporary server's database."""
    api = configured_api()
    if api:
        return f"the Prefect API at {api}"
    db = _temporary_database()
    return f"Prefect's temporary server (database {db}; PREFECT_API_URL is not set)" if db else "Prefect's temporary server (PREFECT_API_URL is not set)"


def _may_hold(slug: str | None, name: str) -> bool:
    """False when the temporary server's SQLite database cannot hold a block ``slug/name`` (no
    file, no block tables, no such row), read without starting anything; True when unsure."""
    db = _temporary_database()
    if db is None:
        return True
    if not db.is_file():
        return False
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return True
    try:
        query = "SELECT 1 FROM block_document d JOIN block_type t ON t.id = d.block_type_id WHERE d.name = ?"
        args: tuple = (name,)
        if slug:
            query += " AND t.slug = ?"
            args = (name, slug)
        return conn.execute(query + " LIMIT 1", args).fetchone() is not None
    except sqlite3.OperationalError as exc:
        # a database that has no block tables yet holds no block; a locked or odd one: ask the server
        return "no such table" not in str(exc)
    except sqlite3.Error:
        return True
    finally:
        conn.close()


@contextmanager
def _waiting(what: str, seconds: float) -> Iterator[None]:
    """A line on a terminal saying what is awaited and for how long; erased when done."""
    shown = sys.stderr.isatty()
    if shown:
        print(f"concord: {what} (up to {seconds:g} s) …", end="", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        if shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _start_temporary_server(where: str) -> None:
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_ENABLED

    if not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        raise PrefectUnavailableError(
            where,
            "PREFECT_API_URL is not set and Prefect's temporary server is turned off (PREFECT_SERVER_ALLOW_EPHEMERAL_MODE)",
            "Set PREFECT_API_URL to a running Prefect server (`make serve` starts one)",
        )
    server = SubprocessASGIServer()
    if server.running:
        return
    seconds = start_timeout()
    log = _server_log()
    _quiet_start(server, log)
    t0 = time.monotonic()
    with _waiting(f"starting Prefect's temporary server for {where}; set PREFECT_API_URL to use a running one", seconds):
        try:
            # Prefect counts only its sleeps against this bound: the deadline below is the wall clock's
            server.start(timeout=max(1, int(seconds)))
        except Exception as exc:  # noqa: BLE001 - Prefect raises RuntimeError (timeout) or httpx errors
            process = server.server_process
            code = process.poll() if process is not None else None
            server.stop()
            exited = f"; its process exited with status {code}" if code not in (None, 0) else ""
            raise PrefectUnavailableError(
                where,
                f"Prefect's temporary server did not start within {time.monotonic() - t0:.0f} s{exited} "
                f"({type(exc).__name__}; its log: {log})",
            ) from None


def _server_log() -> Path:
    """Where the temporary server's own output goes: a file in the Prefect home, never this terminal."""
    from prefect.settings import PREFECT_HOME

    home = Path(PREFECT_HOME.value()).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home / "temporary-server.log"


def _quiet_start(server, log: Path) -> None:
    """The temporary server's process is started with its stdout and stderr on ``log``: its
    tracebacks would break the CLI's one line, and its output a ``--json`` answer."""
    launch = getattr(server, "_run_uvicorn_command", None)
    if launch is None:  # another Prefect: its output is left where Prefect puts it
        return

    def launch_quietly():
        with open(log, "ab") as sink:
            saved = [os.dup(1), os.dup(2)]
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(sink.fileno(), 1)
                os.dup2(sink.fileno(), 2)
                return launch()
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)

    server._run_uvicorn_command = launch_quietly


def _check_configured(api: str, where: str) -> None:
    """The configured API answers ``/health`` (any HTTP answer) within the deadline, or one error."""
    import httpx

    seconds = api_timeout()
    deadline = time.monotonic() + seconds
    try:
        with httpx.Client(timeout=httpx.Timeout(seconds)) as client:
            with client.stream("GET", api.rstrip("/") + "/health") as response:
                for _ in response.iter_raw():  # each network read, not 1 KiB gathered
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the answer did not end in time")
                    if response.num_bytes_downloaded > 65536:
                        break
    except httpx.HTTPError as exc:
        raise PrefectUnavailableError(
            where,
            f"the Prefect API at {api} did not answer within {seconds:g} s ({type(exc).__name__})",
            f"Start it (`make serve`), set PREFECT_API_URL to one that runs, or raise {API_TIMEOUT_ENV}",
        ) from None


def ensure_api(where: str) -> None:
    """Make sure a Prefect API answers before ``where`` needs it: the configured one within
    ``CONCORD_PREFECT_TIMEOUT``, or Prefect's temporary server started within
    ``CONCORD_PREFECT_START_TIMEOUT``; otherwise one :class:`PrefectUnavailableError`."""
    api = configured_api()
    if api:
        _check_configured(api, where)
    else:
        _start_temporary_server(where)


def load_block(block_type: type[B], name: str, where: str, *, slug: str | None = None) -> B | None:
    """``block_type.load(name)``, or None when no such block is saved. ``slug`` is the block type's
    slug (``block_type``'s own when omitted); a lookup that can only fail starts no server."""
    import httpx
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    if slug is None:
        slug = block_type.get_block_type_slug()  # type: ignore[attr-defined]
    if not configured_api() and not _may_hold(slug, name.rpartition("/")[2]):
        return None
    ensure_api(where)
    seconds = api_timeout()

    updates = {PREFECT_API_REQUEST_TIMEOUT: seconds, PREFECT_CLIENT_MAX_RETRIES: 1}
    if not configured_api():
        # the server just started, by its address: the block's "loaded" event then goes to it too,
        # instead of to an in-process copy of the server Prefect would build at exit to send it
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import PREFECT_API_URL

        updates[PREFECT_API_URL] = SubprocessASGIServer().api_url

    def load():
        with temporary_settings(updates=updates):
            return block_type.load(name, _sync=True)  # type: ignore[attr-defined]

    try:
        return _within(3 * seconds, load, where)
    except ValueError as exc:
        if isinstance(exc.__cause__, ObjectNotFound):
            return None
        raise
    except httpx.TransportError as exc:
        raise PrefectUnavailableError(
            where, f"{where_blocks_live()} did not answer ({type(exc).__name__})", "Start it, or set PREFECT_API_URL to one that runs"
        ) from None


def _within(seconds: float, fn, where: str):
    """``fn()`` on a daemon thread, given up on after ``seconds`` of wall clock (an API that answers
    its health check but drips a block's bytes would hold the caller far past any read timeout)."""
    import threading

    result: list = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"concord-prefect-{where}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise PrefectUnavailableError(
            where,
            f"{where_blocks_live()} did not finish answering within {seconds:g} s",
            f"Check that server, or raise {API_TIMEOUT_ENV}",
        )
    if failure:
        raise failure[0]
    return result[0]
