"""Real servers on 127.0.0.1 that the demo, the tests and the benchmarks start, and the environment they run in.

This is development infrastructure, not part of the library: no other module of Concord imports it
(the import-linter contracts keep it so), and ``import concord`` does not load it.

A server (``moto_server``, ``mlflow server``, ``prefect server``) runs in a process group of its
own, on a free port, its output in a log file; it is ready once its health URL answers, and
stopping it stops the whole group (servers fork workers). When a server cannot start, ``fail``
is called with what went wrong (the tests pass ``pytest.fail``); by default
:class:`~concord.errors.localservers.LocalServerError` is raised.

S3 is ``moto_server`` with its data in memory. :data:`AWS_TEST_CREDENTIALS` are the dummy
credentials it accepts, and :data:`AWS_CLEARED` what a developer's shell may point at that must
not reach it (or send anything to AWS). Only the standard library and :mod:`concord.home` are imported here.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import NoReturn

from concord.errors.localservers import LocalServerError
from concord.home import patched_environ

AWS_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
#: whatever the shell points at must not reach a local S3 server (or send requests to AWS)
AWS_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
)


def _raise(message: str) -> NoReturn:
    raise LocalServerError(message)


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


class Server:
    """``cmd`` run in its own process group, its output in ``log_path``.

    ``with Server(...) as server:`` starts it, :meth:`wait` blocks until ``health_url`` answers
    (so that other work can go on while it starts), and the block's end stops it, failure or not.
    """

    def __init__(
        self,
        name: str,
        cmd: list[str],
        health_url: str,
        log_path: Path,
        *,
        need_ok: bool = False,
        missing: str = "install the project with `make install` (dev extra)",
        fail: Callable[[str], NoReturn] | None = None,
        **popen,
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.health_url = health_url
        self.log_path = Path(log_path)
        self.need_ok = need_ok
        self.missing = missing
        self.fail = fail or _raise
        self.popen = popen
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        if not Path(self.cmd[0]).exists():
            self.fail(f"{self.cmd[0]} not found: {self.missing}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **self.popen)
        return self

    def wait(self, timeout: float = 60) -> None:
        """Block until the server answers on its health URL."""
        if self.proc is None:
            raise LocalServerError(f"{self.name}: wait() before start(): the server is not started")
        deadline = time.monotonic() + timeout
        while not answers_http(self.health_url, need_ok=self.need_ok):
            if self.proc.poll() is not None:
                self.fail(f"{self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            if time.monotonic() > deadline:
                self.fail(f"{self.name} did not answer on {self.health_url} within {timeout:.0f} s:\n{self.log_path.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop(proc)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def running_server(
    name: str,
    cmd: list[str],
    health_url: str,
    log_path: Path,
    *,
    timeout: float = 60,
    need_ok: bool = False,
    fail: Callable[[str], NoReturn] | None = None,
    **popen,
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` in its own process group until ``health_url`` answers; stop it on exit."""
    with Server(name, cmd, health_url, log_path, need_ok=need_ok, fail=fail, **popen) as server:
        server.wait(timeout)
        yield server.proc


class MotoServer(Server):
    """S3 on this machine: a ``moto_server`` process on 127.0.0.1 and a free port, keeping its
    data in memory. ``with MotoServer(log) as s3:`` starts it, :meth:`wait` returns its endpoint
    once it answers, and the block's end stops it (its whole process group), failure or not."""

    def __init__(self, log_path: Path, *, fail: Callable[[str], NoReturn] | None = None) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).parent / "moto_server"
        super().__init__(
            "moto_server",
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            f"{self.endpoint}/moto-api/",
            log_path,
            missing="install moto's server with `pip install 'moto[server]>=5'` (the dev extra; `make install` and `make demo` install it)",
            fail=fail,
        )

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def wait(self, timeout: float = 60) -> str:
        """Block until the server answers on ``/moto-api/``; its endpoint URL."""
        super().wait(timeout)
        return self.endpoint

    def create_buckets(self, *names: str) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=AWS_TEST_CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=AWS_TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=AWS_TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        try:
            for name in names:
                client.create_bucket(Bucket=name)
        finally:
            client.close()


@contextmanager
def moto_server(log_path: Path, *, timeout: float = 60, fail: Callable[[str], NoReturn] | None = None) -> Iterator[str]:
    """Run a ``moto_server`` until the block ends; yield its endpoint URL once it answers."""
    with MotoServer(log_path, fail=fail) as server:
        yield server.wait(timeout)


def aws_environment(endpoint: str) -> AbstractContextManager[None]:
    """Point this process's S3 clients at ``endpoint`` with :data:`AWS_TEST_CREDENTIALS`, nothing
    of :data:`AWS_CLEARED` left; put the environment back as it was afterwards."""
    return patched_environ({**AWS_TEST_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}, AWS_CLEARED)


#: Debian's package of CNCF distribution (``apt-get install docker-registry``; ``make test-prereqs``)
REGISTRY_BIN = "/usr/bin/docker-registry"


class RegistryServer(Server):
    """An OCI registry on this machine: CNCF distribution (``docker-registry serve``) on 127.0.0.1
    and a free port, its blobs in ``data_dir``, speaking plain HTTP. With ``users`` (name →
    password) it asks for HTTP Basic credentials, checked against an htpasswd file of bcrypt
    hashes (``htpasswd -B``). :meth:`wait` returns its ``host:port``."""

    def __init__(
        self, data_dir: Path, log_path: Path, *, users: dict[str, str] | None = None, fail: Callable[[str], NoReturn] | None = None
    ) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        auth = ""
        if users:
            htpasswd = data_dir / "htpasswd"
            lines = []
            for user, password in users.items():
                out = subprocess.run(["htpasswd", "-Bbn", user, password], check=True, capture_output=True, text=True)
                lines.append(out.stdout.strip())
            htpasswd.write_text("\n".join(lines) + "\n")
            auth = f"auth:\n  htpasswd:\n    realm: concord\n    path: {htpasswd}\n"
        config = data_dir / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {data_dir / 'storage'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n{auth}"
        )
        super().__init__(
            "docker-registry",
            [REGISTRY_BIN, "serve", str(config)],
            f"http://{self.address}/v2/",
            log_path,
            missing="install CNCF distribution with `apt-get install -y docker-registry apache2-utils` (`make test-prereqs`)",
            fail=fail,
        )

    def __enter__(self) -> RegistryServer:
        self.start()
        return self

    def wait(self, timeout: float = 60) -> str:
        super().wait(timeout)
        return self.address
