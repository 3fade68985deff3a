"""The nightly-drift-audit flow with a data snapshot as its reference, on a real temporary Prefect
server and a real ``mlflow server``: the first night profiles the reference and stores the profile
beside it (logged to the night's MLflow run), the next night audits against that profile alone,
with the same verdict; ``reference_profile="off"`` reads the table."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from concord.audit.profile import PROFILE_FILE, TableProfile, stored_profile
from concord.lineage.data import register_data
from concord.stores import LocalDirStore
from concord_pipelines.flows.audit import AuditFailed, nightly_drift_audit


def _statistics(result: dict) -> list[tuple]:
    """Each column's statistics (the severities may escalate from one night to the next)."""
    return [tuple(c.get(k) for k in ("column", "psi", "ks", "wasserstein", "chi2", "new_share")) for c in result["columns"]]


pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness", "mlflow_quiet"), pytest.mark.timeout(300)]


def test_the_flow_profiles_its_reference_once_and_audits_against_the_profile(tmp_path, mlflow_server):
    from mlflow import MlflowClient
    from palmerpenguins import load_penguins

    df = load_penguins()
    registry = tmp_path / "registry"
    store = LocalDirStore(registry)
    snap = register_data(df[df.species == "Adelie"], store, name="adelie")
    gentoo = tmp_path / "gentoo.parquet"
    df[df.species == "Gentoo"].to_parquet(gentoo, index=False)
    name = f"profiled-{uuid.uuid4().hex[:8]}"
    common = dict(name=name, registry=str(registry), tracking_uri=mlflow_server, fail_on="never")

    first = nightly_drift_audit("data/adelie", str(gentoo), night="2025-06-01", plots_dir=str(tmp_path / "night-1"), **common)
    root, profile = stored_profile(store, snap.id)
    assert first["severity"] == "critical" and first["reference"]["profile"] == root
    assert profile.rows == snap.rows and profile.source["id"] == snap.id
    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(first["mlflow_run_id"])
    assert run.data.params["reference_profile"] == root
    logged = Path(client.download_artifacts(run.info.run_id, f"profile/{PROFILE_FILE}", str(tmp_path / "dl")))
    assert TableProfile.from_bytes(logged.read_bytes()).to_bytes() == profile.to_bytes()

    second = nightly_drift_audit("data/adelie", str(gentoo), night="2025-06-02", plots_dir=str(tmp_path / "night-2"), **common)
    assert second["reference"]["profile"] == root and stored_profile(store, snap.id)[0] == root
    assert _statistics(second) == _statistics(first)
    run = client.get_run(second["mlflow_run_id"])
    assert run.data.params["reference_profile"] == root
    assert "profile" not in {a.path for a in client.list_artifacts(run.info.run_id)}  # used, not made: not logged again

    raw = nightly_drift_audit(
        "data/adelie", str(gentoo), night="2025-06-03", plots_dir=str(tmp_path / "night-3"), reference_profile="off", **common
    )
    assert raw["reference"]["profile"] is None and _statistics(raw) == _statistics(first)
    with pytest.raises(AuditFailed):  # the P0 night still fails the run by default
        nightly_drift_audit(
            "data/adelie",
            str(gentoo),
            night="2025-06-04",
            name=name,
            registry=str(registry),
            tracking_uri=mlflow_server,
            plots_dir=str(tmp_path / "night-4"),
        )
