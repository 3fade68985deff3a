"""The nightly-drift-audit flow on a real temporary Prefect server, over the Palmer penguins:
its report and table artifacts, the MLflow run (a real ``mlflow server``) with the PNGs, the
``concord.drift.detected`` / ``concord.drift.audited`` events, the failed run on a P0 night,
escalation over consecutive nights, and replicas and model cards in the same audit."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
from readable import markdown_tables, unreadable
from servers import free_port

from concord.audit.history import HISTORY_FORMAT, history_key
from concord.stores import LocalDirStore
from concord_pipelines.flows.audit import AuditFailed, Thresholds, nightly_drift_audit

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness", "mlflow_quiet"), pytest.mark.timeout(300)]

PNG = b"\x89PNG\r\n\x1a\n"


def _by_key(artifacts, key):
    found = [a for a in artifacts if a.key == key]
    assert found, f"no artifact {key!r} among {[a.key for a in artifacts]}"
    return found[-1]


@pytest.fixture
def name() -> str:
    """An audit name of this test alone (events on the shared server are told apart by it)."""
    return f"audit-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def penguins(tmp_path) -> dict[str, str]:
    """Two random halves of the penguins, and the Gentoo and Adelie penguins apart, as parquet."""
    from palmerpenguins import load_penguins

    df = load_penguins()
    idx = np.random.default_rng(0).permutation(len(df))
    tables = {
        "half-a": df.iloc[idx[: len(df) // 2]],
        "half-b": df.iloc[idx[len(df) // 2 :]],
        "adelie": df[df.species == "Adelie"],
        "gentoo": df[df.species == "Gentoo"],
    }
    out = {}
    for key, t in tables.items():
        out[key] = str(tmp_path / f"{key}.parquet")
        t.to_parquet(out[key], index=False)
    return out


@pytest.fixture
def no_mlflow() -> str:
    return f"http://127.0.0.1:{free_port()}"


def detected_events(prefect_client, name: str) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    flt = EventFilter(event=EventNameFilter(name=["concord.drift.detected"]), resource=EventResourceFilter(id=[f"concord.audit.{name}"]))
    return list(prefect_client.read_events(filter=flt, limit=50).events)


def test_two_halves_of_the_penguins_are_audited_without_drift(tmp_path, name, penguins, no_mlflow, artifacts_of, events_about, prefect_client):
    state = nightly_drift_audit(
        penguins["half-a"], penguins["half-b"], name=name, registry=str(tmp_path / "registry"),
        plots_dir=str(tmp_path / "plots"), tracking_uri=no_mlflow, return_state=True,
    )
    assert state.is_completed(), state
    r = state.result()
    assert r["severity"] == "ok" and r["plots"] == {} and r["mlflow_run_id"] is None  # MLflow down: a warning only
    artifacts = artifacts_of(state.state_details.flow_run_id)
    report = _by_key(artifacts, "drift-report").data
    assert report.startswith("# Drift audit: ok") and "not logged to MLflow" in report
    rows = json.loads(_by_key(artifacts, "drift-columns").data)
    assert {row["column"] for row in rows} == {"species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "sex", "year"}
    assert all(row["severity"] == "ok" for row in rows)
    (audited,) = events_about("concord.drift.audited", f"concord.audit.{name}")
    assert audited.payload["severity"] == "ok" and audited.payload["drifted_columns"] == []
    assert audited.resource["concord.priority"] == "none"
    assert detected_events(prefect_client, name) == []


def test_drift_between_species_is_detected_logged_and_fails_the_night(
    tmp_path, name, penguins, mlflow_server, artifacts_of, events_about
):
    state = nightly_drift_audit(
        penguins["adelie"], penguins["gentoo"], name=name, registry=str(tmp_path / "registry"),
        plots_dir=str(tmp_path / "plots"), tracking_uri=mlflow_server, night="2025-03-01", return_state=True,
    )
    assert state.is_failed()
    with pytest.raises(AuditFailed, match="CRITICAL \\(P0\\)"):
        state.result()

    # written before the run failed: the report, the table, the PNGs, the MLflow run, the event
    artifacts = artifacts_of(state.state_details.flow_run_id)
    report = _by_key(artifacts, "drift-report").data
    assert report.startswith("# Drift audit: **CRITICAL (P0)**")
    assert "body_mass_g" in report and "species" in report and "### Histograms of the drifted columns" in report
    # narrow tables that fit the artifact pane: the rest of the statistics in a second table, the findings below it
    headers = [t[0] for t in markdown_tables(report)]
    assert ["column", "kind", "severity", "effect", "psi"] in headers and ["column", "p", "js", "ks", "wasserstein", "chi2", "nulls"] in headers
    assert "- `body_mass_g`: " in report and "reference rows" in report
    assert unreadable(artifacts, [str(tmp_path)]) == [] and str(tmp_path) not in report
    rows = json.loads(_by_key(artifacts, "drift-columns").data)
    assert list(rows[0]) == ["column", "kind", "severity", "effect", "psi"]
    assert rows[0]["severity"] == "critical (P0)"
    drifted = {row["column"] for row in rows if row["severity"] != "ok"}
    assert {"species", "island", "bill_length_mm", "flipper_length_mm", "body_mass_g"} <= drifted
    pngs = sorted((tmp_path / "plots").glob("*.png"))  # beside them, the reference's profile made tonight
    assert {p.name for p in pngs} >= {"drift-body_mass_g.png", "drift-species.png"}
    assert all(p.read_bytes().startswith(PNG) for p in pngs)

    (detected,) = events_about("concord.drift.detected", f"concord.audit.{name}")
    p = detected.payload
    assert p["severity"] == "critical" and p["priority"] == "P0" and p["night"] == "2025-03-01"
    assert detected.resource["concord.priority"] == "P0" and detected.resource["concord.severity"] == "critical"
    from prefect.events.schemas.events import ResourceSpecification

    # the trigger docs/drift.md gives for paging on P0 matches it
    assert ResourceSpecification({"prefect.resource.id": "concord.audit.*", "concord.priority": "P0"}).matches(detected.resource)
    assert {c["column"] for c in p["drifted_columns"]} == drifted and p["drifted_count"] == len(drifted)
    run_id = p["mlflow_run_id"]
    assert run_id and f"run `{run_id}`" in report

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "concord-drift-audits" and run.info.status == "FINISHED"
    assert run.data.tags["concord.audit.severity"] == "critical" and run.data.tags["concord.audit.name"] == name
    assert run.data.tags["mlflow.note.content"].startswith("# Drift audit: **CRITICAL (P0)**")
    metrics = run.data.metrics
    assert metrics["drift_share"] == pytest.approx(p["drift_share"]) and metrics["severity_rank"] == 2
    assert {"psi/body_mass_g", "ks/body_mass_g", "js/body_mass_g", "psi/species", "js/species"} <= metrics.keys()
    assert "ks/species" not in metrics
    # each column's p-value and effect, so the nightly run shows why a column drifted
    logged_report = json.loads(Path(client.download_artifacts(run_id, "report.json", str(tmp_path / "dl-json"))).read_text())
    columns = {c["column"]: c for c in logged_report["columns"]}
    for column, stats in (("body_mass_g", ("pvalue_adjusted", "effect", "mean_shift", "scale_ratio")), ("species", ("pvalue_adjusted", "effect", "new_share"))):
        for stat in stats:
            assert metrics[f"{stat}/{column}"] == pytest.approx(columns[column]["effect_size" if stat == "effect" else stat]), (stat, column)
        assert metrics[f"pvalue_adjusted/{column}"] < 0.005
        assert metrics[f"severity_rank/{column}"] == ["ok", "warning", "critical"].index(columns[column]["severity"]) > 0
    assert run.data.params["psi_warning"] == "0.25" and run.data.params["escalate_after_nights"] == "2"
    top = {a.path for a in client.list_artifacts(run_id)}
    assert top == {"histograms", "profile", "report.json", "report.md"}  # the reference's profile, made tonight
    from concord.audit.profile import stored_profile
    from concord.lineage.data import file_digest

    root, _ = stored_profile(LocalDirStore(tmp_path / "registry"), file_digest(penguins["adelie"]))
    assert run.data.params["reference_profile"] == root
    logged = {Path(a.path).name for a in client.list_artifacts(run_id, "histograms")}
    assert logged == {p.name for p in pngs}
    png = Path(client.download_artifacts(run_id, "histograms/drift-body_mass_g.png", str(tmp_path / "dl")))
    assert png.read_bytes() == (tmp_path / "plots" / "drift-body_mass_g.png").read_bytes()
    md = Path(client.download_artifacts(run_id, "report.md", str(tmp_path / "dl"))).read_text()
    assert md.startswith("# Drift audit: **CRITICAL (P0)**") and "`histograms/drift-body_mass_g.png`" in md
    doc = json.loads(Path(client.download_artifacts(run_id, "report.json", str(tmp_path / "dl"))).read_text())
    assert doc["severity"] == "critical" and {c["column"] for c in doc["columns"]} >= drifted


def test_a_lasting_warning_escalates_on_the_second_night(tmp_path, name, penguins, no_mlflow, events_about):
    import pandas as pd

    half_b = pd.read_parquet(penguins["half-b"])
    gentoo = half_b.species == "Gentoo"
    half_b.loc[gentoo, "body_mass_g"] *= 1.2  # one species put on weight (15 % is within the noise of 171 rows: p 0.03 adjusted over 8 columns)
    current = tmp_path / "tonight.parquet"
    half_b.to_parquet(current, index=False)
    registry = tmp_path / "registry"
    common = dict(name=name, registry=str(registry), tracking_uri=no_mlflow, plots_dir=str(tmp_path / "plots"))

    first = nightly_drift_audit(penguins["half-a"], str(current), night="2025-04-01", **common)
    mass = {c["column"]: c for c in first["columns"]}["body_mass_g"]
    assert first["severity"] == "warning" and mass["severity"] == "warning" and not mass["escalated"]
    assert list(first["plots"]) == ["body_mass_g"]

    state = nightly_drift_audit(penguins["half-a"], str(current), night="2025-04-02", return_state=True, **common)
    assert state.is_failed()
    events = events_about("concord.drift.detected", f"concord.audit.{name}", minimum=2)
    by_night = {e.payload["night"]: e.payload for e in events}
    assert by_night["2025-04-01"]["priority"] == "P1" and by_night["2025-04-02"]["priority"] == "P0"
    (col,) = by_night["2025-04-02"]["drifted_columns"]
    assert col["column"] == "body_mass_g" and col["escalated"] is True and col["finding"].startswith("escalated to P0")

    doc = json.loads(LocalDirStore(registry).get_document(history_key(name)))
    assert doc["format"] == HISTORY_FORMAT and [n["night"] for n in doc["nights"]] == ["2025-04-01", "2025-04-02"]
    # warnings stay green unless asked: fail_on=never keeps even a P0 night's run completed
    again = nightly_drift_audit(penguins["half-a"], str(current), night="2025-04-02", fail_on="never", **common)
    assert again["severity"] == "critical"
    # a stricter rule: one night is enough
    strict = nightly_drift_audit(
        penguins["half-a"], str(current), night="2025-05-01", fail_on="never",
        thresholds=Thresholds(escalate_after_nights=1), **common,
    )
    assert strict["severity"] == "critical"


def _checkpoint(folder: Path, flip: bool = False, license: str = "apache-2.0") -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    rng = np.random.default_rng(5)
    tensors = {"embed.weight": rng.standard_normal((64, 16)).astype(np.float32), "layer.0.attn.weight": rng.standard_normal((16, 16)).astype(np.float32)}
    if flip:
        tensors["layer.0.attn.weight"] = -tensors["layer.0.attn.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "README.md").write_text(f"---\nlicense: {license}\ndatasets:\n- penguins\n---\n\n# toy\n\n## Intended uses\n\nTests.\n")
    return folder


def test_replicas_and_cards_in_the_same_audit(tmp_path, name, penguins, no_mlflow, artifacts_of, events_about):
    from concord.snapshots.snapshot import snapshot

    stores = {}
    for cluster, kwargs in {"us-east": {}, "eu-central": {}, "ap-south": {"flip": True, "license": "cc-by-nc-4.0"}}.items():
        stores[cluster] = str(tmp_path / "stores" / cluster)
        snapshot(_checkpoint(tmp_path / "ckpt" / cluster, **kwargs), LocalDirStore(stores[cluster]), ref="models/toy")

    state = nightly_drift_audit(
        penguins["half-a"], penguins["half-b"], ref="models/toy", stores=list(stores.values()),
        card_fields=["license", "datasets", "intended_use"], name=name, registry=str(tmp_path / "registry"),
        tracking_uri=no_mlflow, return_state=True,
    )
    assert state.is_failed()
    artifacts = artifacts_of(state.state_details.flow_run_id)
    report = _by_key(artifacts, "drift-report").data
    assert "- **data drift**: ok: " in report
    assert "layer.0.attn.weight" in report and "cc-by-nc-4.0" in report
    assert "Reference replica: `us-east`" in report and unreadable(artifacts, [str(tmp_path)]) == []
    worst = json.loads(_by_key(artifacts, "drift-replicas").data)
    assert [(w["cluster"], w["tensor"], w["ok"]) for w in worst if w["ok"] == "✗"] == [("ap-south", "layer.0.attn.weight", "✗")]
    (detected,) = events_about("concord.drift.detected", f"concord.audit.{name}")
    p = detected.payload
    assert p["sections"] == {"data": "ok", "replicas": "critical", "cards": "critical"}
    assert {r["cluster"]: r["severity"] for r in p["replicas"]} == {"us-east": "ok", "eu-central": "ok", "ap-south": "critical"}
    assert {c["cluster"]: c["differing"] for c in p["cards"]["clusters"]} == {"us-east": [], "eu-central": [], "ap-south": ["license"]}
    assert ("concord.store." + os.path.abspath(stores["ap-south"]), "replica-ap-south") in {(x.id, x.role) for x in detected.related}


def test_a_store_that_cannot_be_read_is_reported_not_lost(tmp_path, name, penguins, no_mlflow, artifacts_of, events_about):
    state = nightly_drift_audit(
        penguins["half-a"], str(tmp_path / "missing.parquet"), name=name, registry=str(tmp_path / "registry"),
        tracking_uri=no_mlflow, return_state=True,
    )
    assert state.is_failed()
    with pytest.raises(AuditFailed) as caught:  # the failure carries the report the run would have returned
        state.result()
    assert caught.value.report["sections"] == {"data": "critical"} and caught.value.report["name"] == name
    report = _by_key(artifacts_of(state.state_details.flow_run_id), "drift-report").data
    assert "## Data drift: could not be audited" in report and "missing.parquet: no such file" in report
    (detected,) = events_about("concord.drift.detected", f"concord.audit.{name}")
    assert detected.payload["severity"] == "critical" and "no such file" in detected.payload["errors"]["data"]


def test_parameters_are_checked_before_anything_runs():
    from pydantic import ValidationError

    with pytest.raises(ValueError, match="both reference and current"):
        nightly_drift_audit.fn(reference="a.parquet")
    with pytest.raises(ValueError, match="nothing to audit"):
        nightly_drift_audit.fn()
    with pytest.raises(ValueError, match="without current"):
        nightly_drift_audit.fn(contract="penguins@1", model="minilm")
    with pytest.raises(ValueError, match="without stores"):
        nightly_drift_audit.fn(ref="models/minilm")
    with pytest.raises(ValidationError, match="must be below psi_critical"):
        Thresholds(psi_warning=0.6, psi_critical=0.5)
    from prefect.exceptions import ParameterTypeError

    with pytest.raises(ParameterTypeError, match="fail_on"):  # what a deployment's form would refuse
        nightly_drift_audit.validate_parameters({"reference": "a.csv", "current": "b.csv", "fail_on": "sometimes"})
