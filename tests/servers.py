"""Starting real servers for the tests (moto_server, mlflow server, prefect server) on 127.0.0.1,
and patching the environment for a session. Shared by the conftest files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_http(url: str, *, need_ok: bool = False) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200 or not need_ok
    except urllib.error.HTTPError:
        return not need_ok  # any HTTP status means the server is up
    except OSError:
        return False


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Stop ``proc`` and its whole process group (servers fork workers)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


@contextmanager
def running_server(
    name: str, cmd: list[str], health_url: str, log_path: Path, *, timeout: float = 60, need_ok: bool = False, **popen
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` in its own process group until ``health_url`` answers; stop it on exit."""
    if not Path(cmd[0]).exists():
        pytest.fail(f"{cmd[0]} not found: install the project with `make install` (dev extra)")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **popen)
    try:
        deadline = time.monotonic() + timeout
        while not answers_http(health_url, need_ok=need_ok):
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} did not answer on {health_url} within {timeout:.0f} s:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield proc
    finally:
        stop(proc)


@contextmanager
def patched_environ(values: Mapping[str, str], cleared: tuple[str, ...] = ()) -> Iterator[None]:
    """Set ``values`` and remove ``cleared`` in ``os.environ``; restore everything afterwards."""
    saved = {k: os.environ.get(k) for k in (*values, *cleared)}
    for k in cleared:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
