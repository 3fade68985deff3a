"""A ``block:`` lookup reaches Prefect deliberately: a lookup that can only fail starts no server, a
temporary server that is slow or never starts and a configured API that does not answer each end
in one line with exit status 14 after a bounded wait, never in Prefect's traceback. Each command
runs as a real subprocess on a Prefect home of its own."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CONCORD = str(Path(sys.executable).parent / "concord")
#: the status of an endpoint that does not answer (README: exit codes)
UNREACHABLE = 14
_UNSET = ("PREFECT_API_URL", "PREFECT_PROFILE", "CONCORD_PREFECT_TIMEOUT", "CONCORD_PREFECT_START_TIMEOUT")


def _run(tmp_path: Path, *argv: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), CONCORD_HOME=str(tmp_path / "concord-home"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", **extra)
    return subprocess.run([CONCORD, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("concord: error: "), done.stderr
    return lines[0]


def test_a_lookup_on_a_new_prefect_home_answers_without_starting_a_server(tmp_path):
    for spec in ("block:no-such-store", "block:concord-local-store/no-such-store"):
        done = _run(tmp_path, "refs", spec)
        line = _one_error_line(done)
        assert done.returncode == 1 and "no-such-store" in line and "PREFECT_API_URL is not set" in line, line
    # no server started: it would have made its database in the Prefect home
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()


def test_a_trust_and_a_tier_policy_block_on_a_new_home_also_answer_at_once(tmp_path, toy_root):
    store, root = toy_root
    trusted = _run(tmp_path, "verify", store, "--root", root, "--trust", "block:nobody")
    assert trusted.returncode != 0 and "nobody" in _one_error_line(trusted)
    tiers = _run(tmp_path, "tier", "status", "--policy", "block:no-policy")
    assert tiers.returncode != 0 and "no-policy" in _one_error_line(tiers)
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()


def _database_holding(home: Path, slug: str, name: str) -> None:
    """A Prefect database that names a block ``slug/name`` but that no Prefect server can start on
    (block tables of its own, no migrations): the lookup must start the server to read it."""
    home.mkdir(parents=True)
    with sqlite3.connect(home / "prefect.db") as db:
        db.execute("CREATE TABLE block_type (id TEXT PRIMARY KEY, slug TEXT)")
        db.execute("CREATE TABLE block_document (id TEXT PRIMARY KEY, name TEXT, block_type_id TEXT)")
        db.execute("INSERT INTO block_type VALUES ('t', ?)", (slug,))
        db.execute("INSERT INTO block_document VALUES ('d', ?, 't')", (name,))


def test_a_temporary_server_that_never_starts_is_one_line_and_status_14(tmp_path):
    _database_holding(tmp_path / "prefect-home", "concord-local-store", "cluster")
    done = _run(tmp_path, "refs", "block:cluster", CONCORD_PREFECT_START_TIMEOUT="8")
    line = _one_error_line(done)
    assert done.returncode == UNREACHABLE, line
    assert "temporary server did not start" in line and "PREFECT_API_URL" in line and "CONCORD_PREFECT_START_TIMEOUT" in line


def test_a_temporary_server_slow_to_start_is_given_up_on_after_the_bound(tmp_path):
    _database_holding(tmp_path / "prefect-home", "concord-local-store", "cluster")
    # the temporary server's own interpreter waits before anything (Prefect marks its environment)
    slow = tmp_path / "slow-site"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('PREFECT__SERVER_EPHEMERAL') == '1':\n    time.sleep(60)\n"
    )
    done = _run(tmp_path, "refs", "block:cluster", CONCORD_PREFECT_START_TIMEOUT="3", PYTHONPATH=str(slow))
    line = _one_error_line(done)
    assert done.returncode == UNREACHABLE and "did not start within" in line, line


@contextmanager
def _silent_server(drip: bool) -> Iterator[str]:
    """An HTTP endpoint on 127.0.0.1 that accepts and then never answers (or drips one byte a second)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            if drip:
                threading.Thread(target=_drip, args=(conn, stop), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/api"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def _drip(conn: socket.socket, stop: threading.Event) -> None:
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        while not stop.wait(0.5):
            conn.sendall(b"x")
    except OSError:
        pass


@pytest.mark.parametrize("drip", [False, True], ids=["silent", "dripping"])
def test_a_configured_api_that_does_not_answer_is_one_line_and_status_14(tmp_path, drip):
    with _silent_server(drip) as api:
        # Prefect alone would wait 60 s a request, six times: past this subprocess's own bound
        done = _run(tmp_path, "refs", "block:cluster", PREFECT_API_URL=api, CONCORD_PREFECT_TIMEOUT="2")
    line = _one_error_line(done)
    assert done.returncode == UNREACHABLE and api in line and "did not answer within 2 s" in line, line


def test_a_bad_timeout_setting_is_named(tmp_path):
    with _silent_server(False) as api:
        done = _run(tmp_path, "refs", "block:cluster", PREFECT_API_URL=api, CONCORD_PREFECT_TIMEOUT="soon")
    line = _one_error_line(done)
    assert "CONCORD_PREFECT_TIMEOUT" in line and "'soon'" in line, line


@pytest.fixture
def toy_root(tmp_path) -> tuple[str, str]:
    from toy_checkpoints import make_checkpoint

    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    result = snapshot(make_checkpoint(tmp_path / "toy"), LocalDirStore(tmp_path / "store"), ref="models/toy")
    return str(tmp_path / "store"), result.root


def test_the_demo_gives_up_on_a_temporary_server_that_never_starts_in_one_line(tmp_path):
    _database_holding(tmp_path / "prefect-home", "concord-local-store", "cluster")
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), CONCORD_HOME=str(tmp_path / "demo"),
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", CONCORD_PREFECT_START_TIMEOUT="5")
    done = subprocess.run([sys.executable, "-m", "demo"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("DEMO FAILED: the demo: Prefect's temporary server did not start"), line
    assert "starting its temporary server (up to 5 s" in done.stdout


def test_a_block_in_the_temporary_servers_database_is_read_by_starting_it(tmp_path, prefect_harness):
    """The harness's database (migrated) with a saved store block, copied into a Prefect home of
    the test's own: the command starts the temporary server on it and answers with its own output only."""
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    from concord_pipelines.blocks import LocalStore

    LocalStore(path=str(tmp_path / "store")).save("api-test-store", overwrite=True)
    url = PREFECT_API_DATABASE_CONNECTION_URL.value()
    source = Path(str(url.get_secret_value() if hasattr(url, "get_secret_value") else url).partition(":///")[2])
    (tmp_path / "prefect-home").mkdir()
    with sqlite3.connect(source) as live, sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as copy:
        live.backup(copy)
    done = _run(tmp_path, "refs", "block:api-test-store", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert json.loads(done.stdout) == {"refs": [], "store": str(tmp_path / "store")}
    # the server's own output went to its log, not into the answer
    assert (tmp_path / "prefect-home" / "temporary-server.log").exists()
