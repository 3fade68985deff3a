"""Starting real servers for the tests (moto_server, mlflow server, prefect server) on 127.0.0.1,
and patching the environment for a session. Shared by the conftest files.

The implementation is :mod:`concord.localservers`; here a server that does not start fails the
test (``pytest.fail``) instead of raising.
"""

from __future__ import annotations

import subprocess
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from concord import localservers as _servers
from concord.localservers import answers_http, free_port, patched_environ, stop  # noqa: F401  (the tests import them from here)


def running_server(
    name: str, cmd: list[str], health_url: str, log_path: Path, *, timeout: float = 60, need_ok: bool = False, **popen
) -> AbstractContextManager[subprocess.Popen]:
    """Run ``cmd`` in its own process group until ``health_url`` answers; stop it on exit."""
    return _servers.running_server(name, cmd, health_url, log_path, timeout=timeout, need_ok=need_ok, fail=pytest.fail, **popen)


def started_server(name: str, cmd: list[str], health_url: str, log_path: Path, *, need_ok: bool = False,
                   **popen) -> _servers.Server:
    """``cmd`` started in its own process group (stopped at the ``with`` block's end); the block gets
    the server at once, to do other work while it starts, and ``.wait(timeout)`` until it answers."""
    return _servers.Server(name, cmd, health_url, log_path, need_ok=need_ok, fail=pytest.fail, **popen)


def running_moto_server(log_path: Path, *, timeout: float = 60) -> AbstractContextManager[str]:
    """Run a real ``moto_server`` process on 127.0.0.1; its endpoint URL once it answers; stop it on exit."""
    return _servers.moto_server(log_path, timeout=timeout, fail=pytest.fail)


def running_registry(data_dir: Path, log_path: Path, *, users: dict[str, str] | None = None, timeout: float = 120):
    """Run a real CNCF distribution registry (``docker-registry``) on 127.0.0.1, with HTTP Basic
    users (bcrypt htpasswd) if given; the ``with`` block gets its ``host:port``."""
    from contextlib import contextmanager

    @contextmanager
    def run():
        with _servers.RegistryServer(data_dir, log_path, users=users, fail=pytest.fail) as server:
            yield server.wait(timeout)

    return run()
