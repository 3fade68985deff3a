"""The project-local PostgreSQL of ``make serve`` (``concord_pipelines.deployments.postgres``), for
real: ``initdb`` once, a server on 127.0.0.1 that wants the password, the servers' databases made on
first use, a fast stop by ``stop``; and which servers get a database of it."""

from __future__ import annotations

import io
import os
import pwd
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from concord_pipelines.deployments import postgres, serve


@pytest.fixture
def cluster_root():
    """A folder the cluster's owner can enter (run as root, that is the postgres user, and pytest's
    folders are 0700): removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="concord-pg-test-"))
    base.chmod(0o755)
    yield base / "cluster"
    shutil.rmtree(base, ignore_errors=True)


def _connect(port: int, password: str | None):
    import psycopg

    return psycopg.connect(host="127.0.0.1", port=port, user=postgres.ROLE, password=password, dbname="postgres",
                           connect_timeout=10)


def test_a_cluster_is_made_once_served_on_127_0_0_1_with_a_password_and_stopped_fast(cluster_root, tmp_path):
    import psycopg

    found = postgres.cluster(tmp_path)
    assert found is not None, f"PostgreSQL is not installed: {postgres.INSTALL}"
    cluster = postgres.Cluster(cluster_root, found.bin, postgres.owner())
    said: list[str] = []
    cluster.init(said.append)
    assert cluster.exists() and len(said) == 1 and "initdb" in said[0]
    password = cluster.password()
    assert oct(cluster.password_file.stat().st_mode & 0o777) == "0o600"
    if cluster.user:  # run as root: the data belongs to the postgres user, the password stays root's
        assert cluster.data.stat().st_uid == pwd.getpwnam(cluster.user).pw_uid
        assert cluster.password_file.stat().st_uid == os.geteuid()
    cluster.init(said.append)  # a second time: nothing to do
    assert len(said) == 1 and cluster.password() == password

    state = tmp_path / "serve"
    port = serve._free_port()
    p = serve.spawn(state, "postgres", cluster.command(port), cwd=cluster.root, stop_signal=signal.SIGINT)
    try:
        cluster.wait_ready(port, lambda: serve.is_alive(p), 60, p.log)
        assert cluster.ensure_database(port, "prefect") is True
        assert cluster.ensure_database(port, "prefect") is False  # made on first use only
        with _connect(port, password) as conn:
            names = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
            listen = conn.execute("SHOW listen_addresses").fetchone()[0]
        assert "prefect" in names and listen == "127.0.0.1"
        with pytest.raises(psycopg.OperationalError):
            _connect(port, "not-the-password").close()
        with pytest.raises(postgres.PostgresError, match="no database name"):
            cluster.ensure_database(port, 'x"; DROP DATABASE prefect; --')
    finally:
        how = serve.terminate(p, timeout=20)
    assert how == "stopped" and not serve.is_alive(p)
    assert "database system is shut down" in Path(p.log).read_text()  # SIGINT: a fast, clean shutdown
    assert "fast shutdown request" in Path(p.log).read_text()


def test_each_server_started_here_gets_a_database_of_the_cluster(cluster_root, tmp_path, monkeypatch):
    monkeypatch.setenv(postgres.DIR_ENV, str(cluster_root))
    state, out = tmp_path / "serve", io.StringIO()
    try:
        env = {k: v for k, v in os.environ.items() if k not in (*serve.PREFECT_DB_ENVS, serve.MLFLOW_BACKEND_ENV, serve.DATABASE_ENV)}
        got = serve.start_databases(state, tmp_path, env, own_server=True, own_mlflow=True, out=out)
        record = serve.read_record(state)
        assert [p.name for p in record["processes"]] == ["postgres"]
        port = int(record["postgres"].rsplit(":", 1)[1])
        password = postgres.Cluster(cluster_root, Path("/"), None).password()
        assert got == {
            serve.PREFECT_DB_ENV: f"postgresql+asyncpg://concord:{password}@127.0.0.1:{port}/prefect",
            serve.MLFLOW_BACKEND_ENV: f"postgresql+psycopg://concord:{password}@127.0.0.1:{port}/mlflow",
        }
        assert "created the databases prefect, mlflow" in out.getvalue() and password not in out.getvalue()
    finally:
        serve.stop_all(state, out=out)
    assert "postgres (pid" in out.getvalue() and "stopped" in out.getvalue()


def test_a_variable_naming_another_database_starts_no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv(postgres.DIR_ENV, str(tmp_path / "never"))
    env = {serve.PREFECT_DB_ENV: "postgresql+asyncpg://u:p@db.internal/prefect",
           serve.MLFLOW_BACKEND_ENV: "postgresql+psycopg://u:p@db.internal/mlflow"}
    out = io.StringIO()
    assert serve.start_databases(tmp_path / "serve", tmp_path, env, own_server=True, own_mlflow=True, out=out) == {}
    assert serve.read_record(tmp_path / "serve")["processes"] == [] and not (tmp_path / "never").exists()
    # a server not started here needs no database either
    assert serve.start_databases(tmp_path / "serve", tmp_path, {}, own_server=False, own_mlflow=False, out=out) == {}


def test_sqlite_chosen_keeps_both_servers_on_sqlite_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(postgres.DIR_ENV, str(tmp_path / "never"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = io.StringIO()
    got = serve.start_databases(tmp_path / "serve", tmp_path, {serve.DATABASE_ENV: "sqlite"}, own_server=True,
                                own_mlflow=True, out=out)
    assert got == {serve.MLFLOW_BACKEND_ENV: f"sqlite:///{tmp_path.resolve() / 'data' / 'mlflow.db'}"}
    assert "keep their data in SQLite" in out.getvalue() and not (tmp_path / "never").exists()
