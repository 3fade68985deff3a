"""The health gate is bounded and judged by what it checks: a URL within one deadline over its
whole answer, a command by its own exit (its whole process group killed when it runs out of
time); a checkout killed during its gate leaves a pending gate that its re-run runs again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, files_equal, fine_tune

from concord.cli import main
from concord.errors import HealthCheckFailedError
from concord.serving.checkout import checkout
from concord.serving.health import HealthCheck
from concord.serving.versions import Layout, status
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

CONCORD = str(Path(sys.executable).parent / "concord")


@pytest.fixture
def versions(ckpt, tmp_path):
    store = LocalDirStore(tmp_path / "store")
    v2 = fine_tune(ckpt, tmp_path / "v2", ["layers.0.attn.q.weight"])
    m1 = snapshot(ckpt, store, chunk_size=SMALL_CHUNK).manifest
    m2 = snapshot(v2, store, chunk_size=SMALL_CHUNK).manifest
    dest = tmp_path / "current"
    checkout(store, m1, dest)
    return store, dest, (ckpt, m1), (v2, m2)


class Peer:
    """A TCP server on 127.0.0.1 of the test's own: ``answer(conn)`` speaks for it."""

    def __init__(self, answer) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/health"
        self.stop = threading.Event()
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.answer(conn, self.stop)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def dripping(conn, stop) -> None:
    """A 200 whose headers come one byte every 50 ms for up to 8 s, then end: each read is quick,
    the whole answer is not."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not stop.is_set():
        conn.sendall(b"X")
        time.sleep(0.05)
    conn.sendall(b": drip\r\nContent-Length: 0\r\n\r\n")


def hanging(conn, stop) -> None:
    stop.wait(30)


@pytest.mark.parametrize("answer", [dripping, hanging])
def test_a_health_url_is_bounded_by_one_deadline_over_its_whole_answer(versions, answer):
    store, dest, (d1, m1), (d2, m2) = versions
    peer = Peer(answer)
    try:
        with pytest.raises(HealthCheckFailedError, match="within 0.5 s"):
            checkout(store, m2, dest, health=HealthCheck(url=peer.url, timeout=0.5))
    finally:
        peer.close()
    assert files_equal(dest, d1)


def test_a_health_url_that_answers_2xx_passes(versions):
    store, dest, (d1, m1), (d2, m2) = versions
    peer = Peer(lambda conn, stop: conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"))
    try:
        assert checkout(store, m2, dest, health=HealthCheck(url=peer.url, timeout=5)).switched
    finally:
        peer.close()
    assert files_equal(dest, d2)


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie no one reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, bound: float = 10.0) -> bool:
    deadline = time.monotonic() + bound
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_health_command_that_runs_out_of_time_is_killed_with_its_children(versions, tmp_path):
    store, dest, (d1, m1), (d2, m2) = versions
    pids = tmp_path / "pids"
    gate = HealthCheck(cmd=f"sleep 30 & echo $$ $! > {pids}; wait", timeout=3)
    try:
        with pytest.raises(HealthCheckFailedError, match="within 3 s"):
            checkout(store, m2, dest, health=gate)
        shell, child = (int(p) for p in pids.read_text().split())
        assert wait_gone(shell) and wait_gone(child)
    finally:
        for p in pids.read_text().split() if pids.exists() else ():
            try:
                os.kill(int(p), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert files_equal(dest, d1)


def test_a_healthy_command_that_leaves_a_background_child_passes(versions, tmp_path):
    store, dest, (d1, m1), (d2, m2) = versions
    pid = tmp_path / "child"
    gate = HealthCheck(cmd=f"sleep 30 & echo $! > {pid}; echo ok", timeout=10)
    try:
        r = checkout(store, m2, dest, health=gate)
    finally:
        if pid.exists():
            os.kill(int(pid.read_text()), signal.SIGKILL)
    assert r.switched and files_equal(dest, d2)


def test_a_failing_command_reports_the_tail_of_its_output(versions):
    store, dest, (d1, m1), (d2, m2) = versions
    gate = HealthCheck(cmd="yes filler | head -c 100000; echo 'model not loaded' >&2; exit 4", timeout=10)
    with pytest.raises(HealthCheckFailedError, match="exit status 4: .*model not loaded") as caught:
        checkout(store, m2, dest, health=gate)
    assert len(str(caught.value)) < 1000 and files_equal(dest, d1)


@pytest.fixture
def gates():
    """The process groups of the gates the killed checkouts left running, killed at the end."""
    left: list[int] = []
    yield left
    for pgid in left:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def gate_recorded(dest: Path) -> bool:
    """Whether the checkout has noted its gate's process group in ``gate.json``."""
    try:
        return "pgid" in json.loads((Path(Layout.of(dest).folder) / "gate.json").read_text())
    except (OSError, ValueError):
        return False


def kill_during_gate(store, root: str, dest: Path, tmp_path: Path, gates: list[int]) -> int:
    """Run ``concord checkout`` with a gate that stalls, and SIGKILL the checkout there (its gate,
    a session of its own, is left running). Returns the gate's process group."""
    marker = tmp_path / "gating"
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [CONCORD, "checkout", store.uri, "--root", root, str(dest), "--health-cmd", f"echo $$ > {marker}; sleep 60"],
        env={**os.environ, "CONCORD_NO_PROGRESS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text().strip() and gate_recorded(dest)):
            assert proc.poll() is None and time.monotonic() < deadline, "the checkout never reached its gate"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if marker.exists() and marker.read_text().strip():
            gates.append(int(marker.read_text()))
    return gates[-1]


def test_a_checkout_killed_during_its_gate_runs_the_gate_again_when_re_run(versions, tmp_path, capsys, gates):
    store, dest, (d1, m1), (d2, m2) = versions
    layout = Layout.of(dest)
    gate = kill_during_gate(store, m2.root, dest, tmp_path, gates)
    assert os.readlink(dest) == layout.target(m2.root)  # killed after the flip, before the verdict
    assert status(dest).to_dict()["pending_gate"] == m2.root
    assert not gone(gate)
    # the same checkout again, with a gate that now fails: flipped back, never "nothing to do"
    assert main(["checkout", store.uri, "--root", m2.root, str(dest), "--health-cmd", "exit 5"]) != 0
    assert "exit status 5" in capsys.readouterr().err
    assert wait_gone(gate)  # what the killed checkout's gate left running was ended too
    assert os.readlink(dest) == layout.target(m1.root) and files_equal(dest, d1)
    assert status(dest).pending_gate is None

    kill_during_gate(store, m2.root, dest, tmp_path, gates)
    assert main(["checkout", store.uri, "--root", m2.root, str(dest), "--health-cmd", "true", "--json"]) == 0
    assert os.readlink(dest) == layout.target(m2.root) and status(dest).pending_gate is None
    capsys.readouterr()
    assert main(["checkout", store.uri, "--root", m2.root, str(dest)]) == 0  # now it has passed: nothing to do
    assert "nothing to do" in capsys.readouterr().out


def test_a_re_run_without_the_gate_or_a_rollback_never_keeps_the_ungated_version(versions, tmp_path, capsys, gates):
    store, dest, (d1, m1), (d2, m2) = versions
    layout = Layout.of(dest)
    kill_during_gate(store, m2.root, dest, tmp_path, gates)
    assert main(["checkout", store.uri, "--root", m2.root, str(dest)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "never passed" in err
    assert os.readlink(dest) == layout.target(m1.root) and status(dest).pending_gate is None

    kill_during_gate(store, m2.root, dest, tmp_path, gates)
    assert main(["checkout", "--rollback", str(dest)]) == 0
    assert os.readlink(dest) == layout.target(m1.root) and status(dest).pending_gate is None
    assert files_equal(dest, d1)
