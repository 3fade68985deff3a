"""Shared fixtures: a real ``moto_server`` process, and stores of every kind on top of it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from concord.stores.local import LocalDirStore

TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# Whatever the developer's shell points at must not leak into the tests.
_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_http(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP status means the server is up
    except OSError:
        return False


@pytest.fixture(scope="session")
def aws_credentials(tmp_path_factory):
    """Dummy AWS credentials and region in ``os.environ`` for the session (restored afterwards)."""
    empty = tmp_path_factory.mktemp("aws") / "none"
    values = dict(TEST_CREDENTIALS, AWS_CONFIG_FILE=str(empty), AWS_SHARED_CREDENTIALS_FILE=str(empty))
    saved = {k: os.environ.get(k) for k in (*values, *_CLEARED)}
    for k in _CLEARED:
        os.environ.pop(k, None)
    os.environ.update(values)
    yield values
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def moto_server(aws_credentials, tmp_path_factory):
    """The endpoint URL of a real ``moto_server`` process on 127.0.0.1, stopped after the session."""
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        pytest.fail(f"{exe} not found: install the dev extra (moto[server]) into this environment")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so teardown reaches every child
        )
    try:
        deadline = time.monotonic() + 30
        while not _answers_http(f"{url}/moto-api/"):
            if proc.poll() is not None:
                pytest.fail(f"moto_server exited with {proc.returncode}:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"moto_server did not answer on {url} within 30 s:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def s3_store(moto_server):
    """An S3ObjectStore on a fresh bucket (created) under a fresh prefix, on the moto server."""
    from concord.stores.s3 import S3ObjectStore

    store = S3ObjectStore(
        f"concord-test-{uuid.uuid4().hex[:16]}",
        f"cluster-{uuid.uuid4().hex[:8]}/store",
        endpoint_url=moto_server,
        create_bucket=True,
    )
    store.list_refs()  # the bucket exists from here on, for other stores opened on it too
    yield store
    store.close()


@pytest.fixture
def local_store(tmp_path):
    return LocalDirStore(tmp_path / "store")


@pytest.fixture(params=["local", "s3"])
def any_store(request):
    """Each store implementation in turn: the contract must hold for all of them."""
    return request.getfixturevalue(f"{request.param}_store")
