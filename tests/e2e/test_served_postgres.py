"""Served on PostgreSQL, as ``make serve`` serves: eight deployments run at once with their defaults
all complete, the Prefect server never says "database is locked", and what the runs recorded is in
the cluster's databases (Prefect's flow runs, MLflow's runs). A fresh copy of its own (the same
``serving`` as the package's instance), so that no other test's runs come before or beside these."""

from __future__ import annotations

import time
import urllib.parse

import pytest

from e2e.conftest import serving

pytestmark = pytest.mark.e2e

#: the flows whose deployments run at once (each has one deployment in prefect.yaml): the first
#: and the third wave of test_defaults, less the restores that work once only into their folder
AT_ONCE = ("snapshot-checkpoint", "snapshot-and-replicate", "replicate-snapshot", "diff-snapshots",
           "lora-federation", "tier-checkpoints", "restore-drill", "nightly-drift-audit")
RUN_TIMEOUT = 420


@pytest.fixture(scope="module")
def served_pg(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("served-postgres")) as instance:
        yield instance


@pytest.fixture(scope="module")
def concurrent_runs(served_pg):
    """A run of each of AT_ONCE's deployments, all created before any is awaited: the final runs by flow."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        deployments = {flows[d.flow_id]: d for d in client.read_deployments() if flows.get(d.flow_id) in AT_ONCE}
        assert sorted(deployments) == sorted(AT_ONCE), f"deployed: {sorted(deployments)}"
        started = {name: client.create_flow_run_from_deployment(d.id) for name, d in deployments.items()}
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            runs = {n: client.read_flow_run(r.id) for n, r in started.items()}
            waiting = sorted(n for n, r in runs.items() if not (r.state and r.state.is_final()))
            if not waiting:
                return runs
            assert time.monotonic() < deadline, f"not finished within {RUN_TIMEOUT} s: {waiting}"
            time.sleep(1.0)


def _record(served):
    from concord_pipelines.deployments import serve

    return serve.read_record(served.state_dir)


def _count(url: str, sql: str) -> int:
    import psycopg

    parts = urllib.parse.urlsplit(url.replace("+asyncpg", "").replace("+psycopg", ""))
    with psycopg.connect(host=parts.hostname, port=parts.port, user=parts.username,
                         password=urllib.parse.unquote(parts.password or ""), dbname=parts.path.lstrip("/"),
                         connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def test_both_servers_run_on_the_served_postgres(served_pg):
    data = _record(served_pg)
    env = data["env"]
    names = [p.name for p in data["processes"]]
    # the database started before its servers: `stop` ends it after them
    assert names.index("postgres") < names.index("mlflow") < names.index("server"), names
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://concord:"), "Prefect not on Postgres"
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg://concord:"), "MLflow not on Postgres"
    assert env["MLFLOW_TRACKING_URI"] == served_pg.tracking_uri and served_pg.tracking_uri.startswith("http://127.0.0.1:")
    out = served_pg.start_output
    assert "starting PostgreSQL on 127.0.0.1:" in out and "postgresql+asyncpg://concord:***@" in out, out
    assert "View run" not in out, out  # MLflow's own lines stay out of what `make serve` prints
    assert f"{served_pg.tracking_uri}/#/experiments/" in out and "/runs" in out, out


def test_eight_deployments_at_once_all_complete(concurrent_runs):
    failed = {n: f"{r.state.type.value}: {r.state.message}" for n, r in concurrent_runs.items() if not r.state.is_completed()}
    assert failed == {}
    assert len(concurrent_runs) == 8


def test_the_server_never_says_database_is_locked(concurrent_runs, served_pg):
    logs = {p.name: p.read_text(errors="replace") for p in (served_pg.state_dir / "logs").glob("*.log")}
    locked = sorted(name for name, text in logs.items() if "database is locked" in text)
    assert locked == [], locked
    assert "Check out the dashboard at" in logs["server.log"]  # the log read is the server's


def test_the_runs_are_in_the_clusters_databases(concurrent_runs, served_pg):
    env = _record(served_pg)["env"]
    ids = ", ".join(f"'{r.id}'" for r in concurrent_runs.values())
    assert _count(env["PREFECT_API_DATABASE_CONNECTION_URL"],
                  f"SELECT count(*) FROM flow_run WHERE id IN ({ids}) AND state_type = 'COMPLETED'") == 8
    # the seeding and the audit, the drill and the federation round logged MLflow runs
    assert _count(env["MLFLOW_BACKEND_STORE_URI"], "SELECT count(*) FROM runs") >= 4
