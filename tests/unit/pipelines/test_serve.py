"""The bookkeeping of ``python -m concord_pipelines.deployments.serve``: what ``start`` records is what ``stop`` ends,
and nothing else. The processes here are ``sleep``s the tests start themselves."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from concord_pipelines.deployments import serve

SLEEP = ["sleep", "300"]


def _reap(started: serve.Started) -> None:
    """The sleeps are children of this process: collect their exit status once they end."""
    import os

    try:
        os.waitpid(started.pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _wait_dead(started: serve.Started, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(started)
        if not serve.is_alive(started):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def state(tmp_path):
    yield tmp_path / "serve"
    # whatever a failing test left running
    for p in serve.read_record(tmp_path / "serve")["processes"]:
        serve.terminate(p, timeout=2)
        _reap(p)


def test_spawn_records_each_process_with_its_log(state):
    a = serve.spawn(state, "one", [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(300)"])
    b = serve.spawn(state, "two", SLEEP)
    record = json.loads((state / serve.RECORD).read_text())
    assert [p["name"] for p in record["processes"]] == ["one", "two"]
    assert [p["pid"] for p in record["processes"]] == [a.pid, b.pid]
    assert record["processes"][1]["command"] == SLEEP
    assert serve.is_alive(a) and serve.is_alive(b)
    deadline = time.monotonic() + 10
    while "hello" not in (state / "logs" / "one.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "hello" in (state / "logs" / "one.log").read_text()


def test_stop_ends_recorded_processes_and_removes_the_record(state):
    started = [serve.spawn(state, f"p{i}", SLEEP) for i in range(3)]
    out = io.StringIO()
    assert serve.stop_all(state, timeout=5, out=out) == 0
    assert all(_wait_dead(p) for p in started)
    assert not (state / serve.RECORD).exists()
    assert out.getvalue().count("stopped") == 3


def test_stop_ends_the_whole_process_group(state, tmp_path):
    # a shell that starts a child of its own and waits: the child must go too
    pid_file = tmp_path / "child.pid"
    shell = serve.spawn(state, "shell", ["sh", "-c", f"sleep 300 & echo $! > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; wait"])
    deadline = time.monotonic() + 10
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    child_rec = serve.Started("child", child, SLEEP, "", serve._proc_start_time(child))
    serve.stop_all(state, timeout=5, out=io.StringIO())
    assert _wait_dead(shell)
    assert _wait_dead(child_rec)


def test_stop_never_touches_an_unrecorded_process(state):
    recorded = serve.spawn(state, "recorded", SLEEP)
    bystander = subprocess.Popen(SLEEP, start_new_session=True)
    try:
        serve.stop_all(state, timeout=5, out=io.StringIO())
        assert _wait_dead(recorded)
        time.sleep(0.2)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_sigkill_after_the_timeout_when_sigterm_is_ignored(state):
    stubborn = serve.spawn(state, "stubborn", [sys.executable, "-c",
                           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"])
    deadline = time.monotonic() + 10
    while "ready" not in (state / "logs" / "stubborn.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    out = io.StringIO()
    serve.stop_all(state, timeout=0.5, out=out)
    assert _wait_dead(stubborn)
    assert "killed" in out.getvalue()


def test_a_stale_record_of_a_dead_pid_is_left_alone(state):
    gone = serve.spawn(state, "gone", ["true"])
    assert _wait_dead(gone)
    out = io.StringIO()
    assert serve.status(state, out=out) == 3
    assert "dead" in out.getvalue()
    assert serve.stop_all(state, timeout=1, out=out) == 0
    assert "not running" in out.getvalue()
    assert not (state / serve.RECORD).exists()


def test_a_reused_pid_is_not_the_recorded_process(state):
    # the pid runs, but it started at another time than the recorded process: not ours
    bystander = subprocess.Popen(SLEEP, start_new_session=True)
    try:
        started_at = serve._proc_start_time(bystander.pid)
        assert started_at is not None, "a running process's start time must be readable (Linux /proc)"
        impostor = serve.Started("server", bystander.pid, SLEEP, "", started_at - 1)
        serve.write_record(state, {"processes": [impostor]})
        assert not serve.is_alive(impostor)
        serve.stop_all(state, timeout=1, out=io.StringIO())
        time.sleep(0.2)
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


def test_start_when_already_running_says_so_and_starts_nothing(state):
    serve.spawn(state, "server", SLEEP)
    before = (state / serve.RECORD).read_text()
    out = io.StringIO()
    assert serve.start(state, out=out) == 0
    assert "already running" in out.getvalue()
    assert json.loads((state / serve.RECORD).read_text())["processes"] == json.loads(before)["processes"]


def test_status_lists_running_processes(state):
    serve.spawn(state, "worker", SLEEP)
    out = io.StringIO()
    assert serve.status(state, out=out) == 0
    assert "worker" in out.getvalue() and "running" in out.getvalue()
    nothing = io.StringIO()
    assert serve.status(state / "elsewhere", out=nothing) == 0  # `make status` with nothing started is no error
    assert "not running" in nothing.getvalue()


# ----------------------------------------------------------------------------- restart


def _log_says(path, text: str, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return True
        time.sleep(0.05)
    return False


def test_restart_starts_a_dead_process_again_in_its_place_folder_and_environment(state, tmp_path, monkeypatch):
    monkeypatch.delenv("CONCORD_TEST_SETTING", raising=False)
    serve.write_record(state, {"processes": [], "env": {"CONCORD_TEST_SETTING": "from-the-record"}})
    first = serve.spawn(state, "server", SLEEP)
    worker = serve.spawn(state, "worker", ["sh", "-c", 'echo "setting=$CONCORD_TEST_SETTING in $PWD"; exec sleep 300'],
                         cwd=tmp_path)
    last = serve.spawn(state, "watcher", SLEEP)
    serve.terminate(worker, timeout=2)
    assert _wait_dead(worker)

    out = io.StringIO()
    assert serve.restart(state, ["worker"], out=out) == 0
    processes = serve.read_record(state)["processes"]
    assert [p.name for p in processes] == ["server", "worker", "watcher"]  # stop still ends the server last
    again = processes[1]
    assert again.pid != worker.pid and serve.is_alive(again)
    assert (again.command, again.cwd) == (worker.command, str(tmp_path))
    assert processes[0] == first and processes[2] == last and serve.is_alive(first)
    assert _log_says(state / "logs" / "worker.log", f"setting=from-the-record in {tmp_path}")
    assert "not running" in out.getvalue() and f"pid {again.pid}" in out.getvalue()


def test_restart_ends_a_running_process_before_starting_it_again(state):
    serve.write_record(state, {"processes": [], "env": {}})
    old = serve.spawn(state, "worker", SLEEP)
    out = io.StringIO()
    serve.restart(state, ["worker", "worker"], timeout=5, out=out)
    assert _wait_dead(old)
    (new,) = serve.read_record(state)["processes"]
    assert new.pid != old.pid and serve.is_alive(new)
    assert "stopped" in out.getvalue()


def test_restart_of_a_name_not_recorded_names_the_recorded_ones_and_stops_nothing(state, capsys):
    serve.write_record(state, {"processes": [], "env": {}})
    worker = serve.spawn(state, "worker", SLEEP)
    with pytest.raises(serve.ServeError, match=r"no process named 'server' is recorded .*\(recorded: worker\)"):
        serve.restart(state, ["worker", "server"], out=io.StringIO())
    assert serve.read_record(state)["processes"] == [worker] and serve.is_alive(worker)
    assert serve.main(["--dir", str(state), "restart", "sever"]) == 1
    assert "no process named 'sever'" in capsys.readouterr().err


def test_start_while_some_processes_died_names_the_restart_that_brings_them_back(state):
    serve.spawn(state, "server", SLEEP)
    gone = serve.spawn(state, "worker", ["true"])
    assert _wait_dead(gone)
    out = io.StringIO()
    assert serve.start(state, out=out) == 0
    assert "Not running: worker" in out.getvalue() and "restart worker" in out.getvalue()


def test_restart_refuses_a_record_without_the_environment_its_processes_started_in(state):
    worker = serve.spawn(state, "worker", SLEEP)  # a record as an older serve wrote it: no "env"
    with pytest.raises(serve.ServeError, match="does not record the environment.*`stop`, then `start`"):
        serve.restart(state, ["worker"], out=io.StringIO())
    assert serve.read_record(state)["processes"] == [worker] and serve.is_alive(worker)


# ----------------------------------------------------------------------------- the OCI registry


def test_the_registry_started_answers_is_recorded_shown_and_stopped(state, tmp_path):
    """A real CNCF distribution registry (``make test-prereqs`` installs it)."""
    exe = serve.registry_exe()
    assert exe is not None, f"{serve.REGISTRY_EXE} is not installed: {serve.REGISTRY_INSTALL}"
    out = io.StringIO()
    address = serve.start_registry(state, tmp_path / "oci registry", dict(os.environ), exe, out)
    assert address.startswith("127.0.0.1:") and address in out.getvalue()
    record = serve.read_record(state)
    assert record["registry"] == address
    (p,) = record["processes"]
    serve._wait_registry(address, p, 30)
    shown = io.StringIO()
    assert serve.status(state, out=shown) == 0
    assert f"OCI registry: {address}" in shown.getvalue() and "registry" in shown.getvalue()
    serve.stop_all(state, out=io.StringIO())
    assert _wait_dead(p)
    assert (tmp_path / "oci registry" / "config.yml").is_file()


def test_without_the_registry_one_line_says_how_to_install_it_and_nothing_starts(state):
    out = io.StringIO()
    assert serve.start_registry(state, state / "oci", dict(os.environ), None, out) is None
    (line,) = out.getvalue().splitlines()
    assert "docker-registry is not installed" in line and "apt-get install -y docker-registry" in line
    assert serve.read_record(state)["processes"] == [] and not (state / "oci").exists()


def test_publish_oci_given_no_repository_fails_at_once_saying_how_to_get_one():
    from concord_pipelines.flows.oci import NoRegistryError, publish_oci

    with pytest.raises(NoRegistryError, match=r"no OCI registry to publish to.*docker-registry.*repository=REGISTRY/PATH"):
        publish_oci.fn("minilm", 1, repository=None)
    assert not issubclass(NoRegistryError, (ConnectionError, TimeoutError))  # never retried


def test_the_publish_deployment_is_found_in_prefect_yaml(tmp_path):
    assert serve._declares(serve.PROJECT_DIR, serve.PUBLISH_DEPLOYMENT)
    (tmp_path / "prefect.yaml").write_text("deployments:\n  - name: other\n")
    assert not serve._declares(tmp_path, serve.PUBLISH_DEPLOYMENT)
    assert not serve._declares(tmp_path / "missing", serve.PUBLISH_DEPLOYMENT)
