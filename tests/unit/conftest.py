"""Fixtures for the core's tests: a toy checkpoint and local stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from toy_checkpoints import make_checkpoint

from concord.home import patched_environ
from concord.stores import LocalDirStore


@pytest.fixture(scope="module", autouse=True)
def concord_home(tmp_path_factory):
    """A home of the module's own (what this machine remembers of ledgers, the default registry),
    so no test writes into the checkout's ``data`` folder; a test may still set its own."""
    import os

    if os.environ.get("CONCORD_HOME"):
        yield os.environ["CONCORD_HOME"]
        return
    home = str(tmp_path_factory.mktemp("concord-home"))
    with patched_environ({"CONCORD_HOME": home}):
        yield home


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "ckpt")


@pytest.fixture
def stores(tmp_path: Path):
    return [LocalDirStore(tmp_path / f"c{i}") for i in range(3)]


_QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_LOGGING_LEVEL": "WARNING"}


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory) -> str:
    """One sqlite tracking database for the module, its schema created once up front (parallel
    first use would corrupt it); MLflow kept quiet meanwhile."""
    from concord.lineage import Lineage

    with patched_environ(_QUIET):
        uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
        Lineage(uri).ensure_ready()
        yield uri
