"""Runs logged by the core (``Lineage.log_run``, and the audit and drill runs the audit and tiering
wings build on it), on one sqlite tracking database for the module, read back with MLflow's own
client; and the tracking helpers every caller shares (``shown_uri``, ``sqlite_file``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from concord.audit.tracking import AUDIT_EXPERIMENT, NOTE_CHARS, audit_run, log_audit
from concord.lineage import Lineage
from concord.lineage.client import shown_uri, sqlite_file
from concord.tiering.tracking import DRILL_EXPERIMENT, drill_run, log_drill


@pytest.fixture
def client(tracking_uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id, path)}


# ----------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("http://user:secret@mlflow.internal:5000", "http://user:***@mlflow.internal:5000"),
        ("https://mlflow.internal/path", "https://mlflow.internal/path"),
        ("sqlite:////data/mlflow.db", "sqlite:////data/mlflow.db"),
    ],
)
def test_shown_uri_hides_a_password_and_keeps_where(uri, shown):
    assert shown_uri(uri) == shown


def test_sqlite_file_names_the_database_of_a_sqlite_uri_only(tmp_path):
    assert sqlite_file(f"sqlite:///{tmp_path / 'm.db'}?timeout=5") == str(tmp_path / "m.db")
    assert sqlite_file("sqlite:///relative.db") == os.path.abspath("relative.db")
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("http://127.0.0.1:5000") is None


def test_repr_hides_the_password():
    assert repr(Lineage("http://u:pw@127.0.0.1:1")) == "Lineage('http://u:***@127.0.0.1:1')"


# ----------------------------------------------------------------------------- log_run


def test_log_run_writes_every_part_of_a_finished_run(tracking_uri, client, tmp_path):
    png = tmp_path / "drift-a.png"
    png.write_bytes(b"\x89PNG not really")
    top = tmp_path / "top.txt"
    top.write_text("at the top")
    run_id = Lineage(tracking_uri).log_run(
        experiment="concord-test-runs",
        run_name="one-run",
        tags={"concord.x": "1", "concord.flag": True},
        params={"bins": 10, "psi_warning": "0.25"},
        metrics={"drift_share": 0.5, "psi/a": 2},
        texts={"report.json": '{"a": 1}', "report.md": "# hello"},
        files={"histograms": [png], "": [str(top)]},
        description="# the report",
    )
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "one-run"
    assert client.get_experiment(run.info.experiment_id).name == "concord-test-runs"
    tags = run.data.tags
    assert tags["concord.x"] == "1" and tags["concord.flag"] == "True"
    assert tags["mlflow.note.content"] == "# the report"
    assert run.data.params == {"bins": "10", "psi_warning": "0.25"}
    assert run.data.metrics == {"drift_share": 0.5, "psi/a": 2.0}
    history = client.get_metric_history(run_id, "psi/a")
    assert [m.step for m in history] == [0]
    assert _artifacts(client, run_id) == {"histograms", "report.json", "report.md", "top.txt"}
    assert _artifacts(client, run_id, "histograms") == {"histograms/drift-a.png"}
    assert Path(client.download_artifacts(run_id, "report.md", str(tmp_path / "dl"))).read_text() == "# hello"


def test_log_run_keeps_artifacts_beside_a_sqlite_database(tracking_uri, client):
    run_id = Lineage(tracking_uri).log_run(experiment="concord-test-place", texts={"a.txt": "a"})
    exp = client.get_experiment(client.get_run(run_id).info.experiment_id)
    assert exp.artifact_location == (Path(sqlite_file(tracking_uri)).parent / "mlflow-artifacts" / "concord-test-place").as_uri()


def test_log_run_with_nothing_but_an_experiment_is_a_finished_empty_run(tracking_uri, client):
    run_id = Lineage(tracking_uri).log_run(experiment="concord-test-runs")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {} and run.data.params == {} and "mlflow.note.content" not in run.data.tags


def test_a_run_whose_logging_fails_ends_failed_and_raises(tracking_uri, client, tmp_path):
    lineage = Lineage(tracking_uri)
    with pytest.raises(FileNotFoundError):
        lineage.log_run(experiment="concord-test-failed", run_name="broken", files={"x": [tmp_path / "missing.png"]})
    exp = client.get_experiment_by_name("concord-test-failed")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "broken" and run.info.status == "FAILED"


def test_an_unreachable_server_fails_before_a_run_is_made():
    from servers import free_port

    from concord.errors import LineageUnreachableError

    with pytest.raises(LineageUnreachableError):
        Lineage(f"http://127.0.0.1:{free_port()}", health_timeout=0.5).log_run(experiment="never")


# ----------------------------------------------------------------------------- audits


def _audit_report(**over) -> dict:
    report = {
        "severity": "critical",
        "priority": "P0",
        "drift_share": 0.5,
        "columns_drifted": 1,
        "columns_compared": 2,
        "columns": [
            {"column": "body mass (g)", "severity": "critical", "psi": 1.2, "ks": 0.4, "js": 0.3},
            {"column": "species", "severity": "ok", "psi": 0.01, "ks": None, "js": 0.02},
        ],
        "thresholds": {"psi_warning": 0.25, "psi_critical": 0.55},
        "bins": 10,
        "contract": {"ref": "penguins@1", "ok": False, "failed": [{"expectation": "x"}, {"expectation": "y"}]},
        "replicas": {"replicas": [{"severity": "ok"}, {"severity": "critical"}, {"severity": "warning"}]},
    }
    return report | over


def test_audit_record_names_metrics_params_and_artifacts_as_the_flow_logs_them():
    report = _audit_report()
    rec = audit_run(
        report, "# Drift audit", name="penguins", night="2025-03-01", plots=["/p/a.png"],
        params={"reference": "data/a", "bins": 12, "long": "x" * 600, "none": None},
    )
    assert rec["experiment"] == AUDIT_EXPERIMENT == "concord-drift-audits"
    assert rec["run_name"] == "penguins-2025-03-01 [P0 critical]"
    assert rec["tags"] == {
        "severity": "critical",
        "priority": "P0",
        "concord.audit.name": "penguins",
        "concord.audit.night": "2025-03-01",
        "concord.audit.severity": "critical",
        "concord.audit.priority": "P0",
    }
    assert rec["description"] == "# Drift audit"
    assert rec["metrics"] == {
        "severity_rank": 2.0,
        "drift_share": 0.5,
        "columns_drifted": 1.0,
        "columns_compared": 2.0,
        "psi/body mass _g_": 1.2,
        "ks/body mass _g_": 0.4,
        "js/body mass _g_": 0.3,
        "psi/species": 0.01,
        "js/species": 0.02,
        "severity_rank/body mass _g_": 2.0,  # each column's severity, as ranked above
        "severity_rank/species": 0.0,
        "contract_failed": 2.0,
        "replicas_not_ok": 2.0,
    }
    # the caller's parameters first (cut to 500 characters), then the report's thresholds and bins
    assert rec["params"]["bins"] == "12" and rec["params"]["long"] == "x" * 500 and rec["params"]["none"] == ""
    assert rec["params"]["psi_warning"] == "0.25" and rec["params"]["psi_critical"] == "0.55"
    assert rec["files"] == {"histograms": ["/p/a.png"]}
    assert json.loads(rec["texts"]["report.json"]) == report and rec["texts"]["report.md"] == "# Drift audit"


def test_an_ok_audit_without_data_logs_only_what_it_has():
    rec = audit_run({"severity": "ok", "priority": None}, "ok", name="n", night="2025-01-01")
    assert rec["metrics"] == {"severity_rank": 0.0}
    assert rec["params"] == {} and rec["tags"]["concord.audit.priority"] == "" == rec["tags"]["priority"]
    assert rec["run_name"] == "n-2025-01-01" and rec["tags"]["severity"] == "ok"  # a quiet night has no suffix


def test_a_warning_night_says_p1_in_its_run_name():
    rec = audit_run({"severity": "warning", "priority": "P1"}, "w", name="n", night="2025-01-02")
    assert rec["run_name"] == "n-2025-01-02 [P1 warning]" and rec["tags"]["severity"] == "warning"


def test_a_long_report_is_cut_to_fit_the_description_and_kept_whole_as_an_artifact():
    markdown = "\n".join(f"line {i} " + "x" * 60 for i in range(200))
    rec = audit_run({"severity": "ok"}, markdown, name="n", night="2025-01-01")
    assert len(rec["description"]) <= NOTE_CHARS
    assert rec["description"].endswith("… (the whole report is the artifact report.md)\n")
    assert rec["texts"]["report.md"] == markdown


def test_log_audit_writes_the_audit_run(tracking_uri, client, tmp_path):
    png = tmp_path / "drift-body_mass_g.png"
    png.write_bytes(b"png")
    run_id = log_audit(
        Lineage(tracking_uri), _audit_report(), "# Drift audit: **CRITICAL (P0)**", name="penguins", night="2025-03-02", plots=[str(png)],
        params={"reference": "data/a"},
    )
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "concord-drift-audits"
    assert run.info.run_name == "penguins-2025-03-02 [P0 critical]" and run.info.status == "FINISHED"
    assert run.data.tags["concord.audit.severity"] == "critical" == run.data.tags["severity"]
    # the experiment opens on MLflow's classic runs list, not its GenAI view
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    # the P0 night is found by its tag
    found = client.search_runs([run.info.experiment_id], "tags.severity = 'critical'")
    assert run_id in {r.info.run_id for r in found}
    assert run.data.tags["mlflow.note.content"].startswith("# Drift audit: **CRITICAL (P0)**")
    assert run.data.metrics["severity_rank"] == 2 and run.data.metrics["psi/body mass _g_"] == pytest.approx(1.2)
    assert run.data.params["reference"] == "data/a" and run.data.params["bins"] == "10"
    assert _artifacts(client, run_id) == {"histograms", "report.json", "report.md"}
    assert _artifacts(client, run_id, "histograms") == {"histograms/drift-body_mass_g.png"}


# ----------------------------------------------------------------------------- drills


def _drill(ok: bool = True) -> dict:
    return {
        "namespace": "llama",
        "started": "20250301T020000Z",
        "ok": ok,
        "findings": [] if ok else ["cold: RTO 30 s over its objective 10 s"],
        "tiers": {
            "hot": {"rto_seconds": 0.5, "rto_objective": 60.0, "rpo_seconds": 120.0, "rpo_objective": None},
            "cold": {"rto_seconds": None, "rto_objective": 10.0, "rpo_seconds": None, "rpo_objective": 86400.0},
        },
    }


def test_drill_record_names_metrics_and_params_as_the_flow_logs_them():
    rec = drill_run(_drill(ok=False), sample=2)
    assert rec["experiment"] == DRILL_EXPERIMENT == "concord-restore-drills"
    assert rec["run_name"] == "llama-20250301T020000Z"
    assert rec["tags"] == {"concord.namespace": "llama", "concord.drill.ok": "false", "concord.drill.started": "20250301T020000Z"}
    assert rec["metrics"] == {"ok": 0.0, "findings": 1.0, "rto_seconds_hot": 0.5, "rpo_seconds_hot": 120.0}
    assert rec["params"] == {
        "namespace": "llama", "sample": "2",
        "rto_objective_hot": "60", "rpo_objective_hot": "none", "rto_objective_cold": "10", "rpo_objective_cold": "86400",
    }
    assert json.loads(rec["texts"]["drill.json"]) == _drill(ok=False)
    assert "description" not in rec and "files" not in rec


def test_log_drill_writes_the_drill_run(tracking_uri, client):
    run_id = log_drill(Lineage(tracking_uri), _drill(), sample=1)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "concord-restore-drills"
    assert run.info.status == "FINISHED"
    assert run.data.tags["concord.drill.ok"] == "true" and run.data.tags["concord.drill.started"] == "20250301T020000Z"
    assert run.data.metrics == {"ok": 1.0, "findings": 0.0, "rto_seconds_hot": 0.5, "rpo_seconds_hot": 120.0}
    assert run.data.params["sample"] == "1" and run.data.params["rto_objective_cold"] == "10"
    assert _artifacts(client, run_id) == {"drill.json"}


# ----------------------------------------------------------------------------- what an audit's run records


def test_audit_params_are_the_nightly_flows_inputs_and_thresholds():
    from concord.audit.drift import DriftThresholds
    from concord.audit.tracking import audit_params
    from concord_pipelines.flows.audit import Thresholds

    flow = Thresholds(psi_warning=0.2)
    expected = {"reference": "data/a", "current": "b.csv", "max_ulps": 1, "bins": 10, **flow.model_dump()}
    assert audit_params(reference="data/a", current="b.csv", thresholds=flow) == expected
    # the core's thresholds give the same parameters as the flow's form
    assert audit_params(reference="data/a", current="b.csv", thresholds=DriftThresholds(psi_warning=0.2)) == expected
    assert audit_params(ref="models/x", max_ulps=3)["max_ulps"] == 3
    assert "version" not in audit_params(version="champion")  # a version only with its model
    assert audit_params(model="m", version="champion")["version"] == "champion"
