"""The CLI answers with its own lines only: nothing from Prefect's telemetry when a store is a
saved block, nothing from MLflow's logging when it reads lineage, and an error about the user's
file names that file, not a temporary copy of it. Each command runs as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port

from concord.cli import main

pytestmark = pytest.mark.integration

CONCORD = str(Path(sys.executable).parent / "concord")
#: what would turn telemetry or library logging off (or point at a server): none of it is set
_UNSET = (
    "PREFECT_API_URL",
    "PREFECT_SERVER_ANALYTICS_ENABLED",
    "DO_NOT_TRACK",
    "PREFECT_LOGGING_LEVEL",
    "MLFLOW_LOGGING_LEVEL",
    "MLFLOW_DISABLE_TELEMETRY",
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), CONCORD_HOME=str(tmp_path / "concord-home"), **extra)
    return env


@pytest.mark.parametrize("analytics", [None, "true"], ids=["analytics-default", "analytics-on"])
def test_a_block_store_answers_in_one_line_without_prefect_telemetry(tmp_path, analytics):
    # no Prefect API: the lookup starts Prefect's temporary server, whose telemetry heartbeat
    # cannot be sent from here (every outside address goes to a proxy nobody answers on)
    dead = f"http://127.0.0.1:{free_port()}"
    extra = {"HTTPS_PROXY": dead, "HTTP_PROXY": dead, "NO_PROXY": "127.0.0.1,localhost"}
    if analytics:
        extra["PREFECT_SERVER_ANALYTICS_ENABLED"] = analytics
    done = subprocess.run(
        [CONCORD, "refs", "block:no-such-store"], capture_output=True, text=True, env=_env(tmp_path, **extra), cwd=tmp_path, timeout=180
    )
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("concord: error: cannot use 'block:no-such-store' as a store"), done.stderr


@pytest.fixture
def toy_store(tmp_path) -> str:
    """A local store holding a toy checkpoint (with a model card) under models/toy."""
    from toy_checkpoints import make_checkpoint

    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    base = make_checkpoint(tmp_path / "toy")
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# toy\n")
    snapshot(base, LocalDirStore(tmp_path / "store"), ref="models/toy")
    return str(tmp_path / "store")


def _cli(tmp_path: Path, *argv: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([CONCORD, *argv], capture_output=True, text=True, env=_env(tmp_path, **extra), cwd=tmp_path, timeout=180)


def test_lineage_commands_print_no_mlflow_log_lines(tmp_path, toy_store):
    # a new sqlite tracking database: MLflow creates its tables, and says so at INFO level
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    reg = _cli(tmp_path, "model", "register", "toy", "--store", toy_store, "--ref", "models/toy", "--tracking-uri", tracking, "--json")
    assert reg.returncode == 0 and reg.stderr == "", reg.stderr
    ok = _cli(tmp_path, "audit", "model", "toy", "1", "--tracking-uri", tracking, "--require", "license", "--json")
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == "" and ok.stdout.startswith("{")
    missing = _cli(tmp_path, "audit", "model", "toy", "9", "--tracking-uri", f"sqlite:///{tmp_path / 'other.db'}")
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1, missing.stderr
    assert missing.stderr.startswith("concord: error: ") and "toy/9" in missing.stderr


def test_a_user_who_asks_for_mlflow_logs_gets_them(tmp_path):
    done = _cli(tmp_path, "audit", "model", "toy", "9", "--tracking-uri", f"sqlite:///{tmp_path / 'new.db'}", MLFLOW_LOGGING_LEVEL="INFO")
    assert done.returncode == 1 and "INFO mlflow" in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith("concord: error: ")


@pytest.mark.parametrize(
    "name, content, problem",
    [
        ("prices.csv", b'a,b\n1,2\n"unterminated\n', "cannot read it as csv"),
        ("prices.parquet", b"PAR1 not really parquet", "cannot read it as parquet"),
    ],
)
def test_a_data_register_error_names_the_users_file(tmp_path, capsys, name, content, problem):
    bad = tmp_path / "inputs" / name
    bad.parent.mkdir()
    bad.write_bytes(content)
    code = main(["data", "register", str(bad), "--name", "prices", "--registry", str(tmp_path / "registry"), "--no-track"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"concord: error: {bad}: {problem}"), err
    assert "concord-data-" not in err and "data." + name.split(".")[1] not in err.replace(str(bad), "")
