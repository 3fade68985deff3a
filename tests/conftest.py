"""Shared fixtures: a real ``moto_server`` process, stores of every kind on top of it, and a real
``mlflow server`` process."""

from __future__ import annotations

import os
import sys

# A flow called outside the test harness starts Prefect's temporary server, which gives up after its
# own 20 s: a loaded 2-core machine takes longer than that to build its database.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from servers import free_port, patched_environ, running_moto_server, running_server

from concord.localservers import AWS_CLEARED, AWS_TEST_CREDENTIALS
from concord.stores.local import LocalDirStore


@pytest.fixture(scope="session")
def aws_credentials(tmp_path_factory):
    """Dummy AWS credentials and region in ``os.environ`` for the session (restored afterwards)."""
    empty = tmp_path_factory.mktemp("aws") / "none"
    values = dict(AWS_TEST_CREDENTIALS, AWS_CONFIG_FILE=str(empty), AWS_SHARED_CREDENTIALS_FILE=str(empty))
    # whatever the developer's shell points at must not leak into the tests
    with patched_environ(values, AWS_CLEARED):
        yield values


@contextmanager
def _moto_server(tmp_path_factory, name: str) -> Iterator[str]:
    """Run a real ``moto_server`` process on 127.0.0.1; yield its endpoint URL; stop it after."""
    log = tmp_path_factory.mktemp(name) / "moto_server.log"
    with running_moto_server(log, timeout=120) as url:
        yield url


@pytest.fixture(scope="session")
def moto_server(aws_credentials, tmp_path_factory):
    """The endpoint URL of a real ``moto_server`` process on 127.0.0.1, stopped after the session."""
    with _moto_server(tmp_path_factory, "moto") as url:
        yield url


@pytest.fixture(scope="module")
def archive_moto_server(aws_credentials, tmp_path_factory):
    """A ``moto_server`` of the test module's own, for tests that change how archive restores
    progress (moto's state manager is global to a server, see ``archive_helpers``)."""
    with _moto_server(tmp_path_factory, "moto-archive") as url:
        yield url


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


# ----------------------------------------------------------------------------- mlflow server

#: no telemetry; and a server starts without its job runners (seven huey consumer processes, each
#: importing MLflow at start) since no test submits an MLflow server job
_MLFLOW_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@pytest.fixture(scope="session")
def mlflow_quiet():
    """No telemetry from MLflow in this process or the servers it starts (restored afterwards)."""
    with patched_environ(_MLFLOW_ENV):
        yield


@pytest.fixture(scope="session")
def mlflow_server(mlflow_quiet, tmp_path_factory):
    """The URI of a real ``mlflow server`` process on 127.0.0.1 (sqlite backend and artifact
    folder in a temp folder), started once per session and stopped with its whole process group."""
    port = free_port()
    base = tmp_path_factory.mktemp("mlflow-server")
    url = f"http://127.0.0.1:{port}"
    cmd = [
        str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "2",
        "--backend-store-uri", f"sqlite:///{base / 'server.db'}",
        "--artifacts-destination", str(base / "artifacts"),
    ]
    with running_server("mlflow server", cmd, f"{url}/health", base / "server.log", timeout=120, need_ok=True, cwd=base):
        yield url
