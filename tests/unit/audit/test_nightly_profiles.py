"""The nightly audit and ``audit_data`` against reference profiles: a data snapshot's profile made
and stored the first night, used (without reading the table) the nights after, its report equal to
the raw reference's; a .profile file as the reference; the profile in the audit's MLflow run."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from palmerpenguins import load_penguins

from concord.audit.inputs import open_reference
from concord.audit.nightly import nightly_drift, plots_folder
from concord.audit.profile import PROFILE_FILE, TableProfile, profile_table, stored_profile
from concord.audit.report import audit_data
from concord.audit.tracking import audit_run
from concord.errors import DriftConfigError, ProfileError
from concord.lineage.data import register_data
from concord.stores import LocalDirStore


@pytest.fixture
def penguins(tmp_path):
    """The registry with the Adelie penguins and one random half of them all as data snapshots, the
    Gentoo penguins and the other half as files."""
    df = load_penguins()
    idx = np.random.default_rng(0).permutation(len(df))
    store = LocalDirStore(tmp_path / "registry")
    snaps = {
        "adelie": register_data(df[df.species == "Adelie"], store, name="adelie"),
        "half": register_data(df.iloc[idx[: len(df) // 2]], store, name="half"),
    }
    files = {"gentoo": tmp_path / "gentoo.parquet", "other-half": tmp_path / "other-half.parquet"}
    df[df.species == "Gentoo"].to_parquet(files["gentoo"], index=False)
    df.iloc[idx[len(df) // 2 :]].to_parquet(files["other-half"], index=False)
    return store, snaps, {k: str(v) for k, v in files.items()}


def _without_profile(source: dict) -> dict:
    return {k: v for k, v in source.items() if k not in ("profile", "profile_file")}


def test_the_first_night_profiles_the_reference_and_the_next_nights_use_the_profile(tmp_path, penguins, monkeypatch):
    store, snaps, files = penguins
    kw = dict(name="p", plots_dir=str(tmp_path / "plots"))
    raw = nightly_drift("data/adelie", files["gentoo"], store, None, profile="off", **kw)
    assert raw["reference"]["profile"] is None and stored_profile(store, snaps["adelie"].id) is None

    first = nightly_drift("data/adelie", files["gentoo"], store, None, night="2025-05-01", **kw)
    root, stored = stored_profile(store, snaps["adelie"].id)
    assert first["reference"]["profile"] == root and stored.rows == snaps["adelie"].rows
    assert first["reference"]["profile_file"] == os.path.join(kw["plots_dir"], PROFILE_FILE)
    assert TableProfile.load(first["reference"]["profile_file"]).to_bytes() == stored.to_bytes()

    # the nights after: the profile alone; the reference table is never restored
    import concord.lineage.data as data

    restored = []
    real = data.data_file

    def spy(store_, snapshot_id, **kw_):
        restored.append(snapshot_id)
        return real(store_, snapshot_id, **kw_)

    monkeypatch.setattr(data, "data_file", spy)
    second = nightly_drift("data/adelie", files["gentoo"], store, None, night="2025-05-02", **kw)
    assert restored == [] and second["reference"]["profile"] == root and second["reference"]["profile_file"] is None
    assert stored_profile(store, snaps["adelie"].id)[0] == root  # used, not made again
    for night in (first, second):
        assert night["drift"] == raw["drift"]
        assert _without_profile(night["reference"]) == _without_profile(raw["reference"])
    assert second["drift"]["severity"] == "critical"
    # "use" never makes one; a snapshot without one is read as it is
    quiet = nightly_drift("data/half", files["other-half"], store, None, profile="use", **kw)
    assert quiet["drift"]["severity"] == "ok" and quiet["reference"]["profile"] is None
    assert stored_profile(store, snaps["half"].id) is None
    # without a folder for the PNGs, the profile made tonight goes where they would
    made = nightly_drift("data/half", files["other-half"], store, None, name="q", night="2025-05-01")
    assert made["reference"]["profile_file"] == os.path.join(plots_folder("q", "2025-05-01"), PROFILE_FILE)


def test_a_table_files_profile_is_kept_in_the_history_store_by_its_bytes(tmp_path, penguins):
    from concord.lineage.data import file_digest

    store, snaps, files = penguins
    history = LocalDirStore(tmp_path / "history")
    kw = dict(name="f", plots_dir=str(tmp_path / "plots"))
    raw = nightly_drift(files["other-half"], files["gentoo"], None, history, profile="off", **kw)
    first = nightly_drift(files["other-half"], files["gentoo"], None, history, night="2025-05-01", **kw)
    digest = file_digest(files["other-half"])
    root, prof = stored_profile(history, digest)
    assert first["reference"]["profile"] == root and prof.source["id"] == digest and first["reference"]["kind"] == "file"
    second = nightly_drift(files["other-half"], files["gentoo"], None, history, night="2025-05-02", **kw)
    assert second["reference"]["profile"] == root and second["reference"]["profile_file"] is None
    assert first["drift"]["columns"] == raw["drift"]["columns"]
    assert [c["psi"] for c in second["drift"]["columns"]] == [c["psi"] for c in raw["drift"]["columns"]]
    # other bytes, another profile; without a history store, the file is read as it is
    pd.read_parquet(files["other-half"]).iloc[:100].to_parquet(files["other-half"], index=False)
    third = nightly_drift(files["other-half"], files["gentoo"], None, history, night="2025-05-03", **kw)
    assert third["reference"]["profile"] not in (None, root) and third["drift"]["rows_reference"] == 100
    assert nightly_drift(files["other-half"], files["gentoo"], **kw)["reference"]["profile"] is None


def test_audit_data_takes_a_profile_file_as_its_reference(tmp_path, penguins):
    store, snaps, files = penguins
    with open_reference("data/half", store, profile="off") as ref:
        profile = profile_table(ref.batches(), source={"label": "half", "kind": "snapshot", "id": snaps["half"].id})
    path = tmp_path / "half.profile"
    profile.save(path)
    against = audit_data(str(path), files["other-half"])
    raw = audit_data("data/half", files["other-half"], store, profile="off")
    assert against.data["columns"] == raw.data["columns"] and against.severity == "ok"
    ref = against.data["reference"]
    assert (ref["kind"], ref["label"], ref["profile_file"], ref["id"]) == ("profile", "half.profile", str(path), snaps["half"].id)
    # its MLflow run names the profile and keeps the file
    run = audit_run(against.to_dict(), "# report", name="n", night="2025-05-01")
    assert run["params"]["reference_profile"] == ref["profile"] and run["files"]["profile"] == [str(path)]
    assert "reference_profile" not in audit_run(raw.to_dict(), "# report", name="n", night="2025-05-01")["params"]
    # a damaged profile file is one line naming it
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ProfileError, match="half.profile"):
        audit_data(str(path), files["other-half"])
    with pytest.raises(DriftConfigError, match="profile: is 'always'"):
        with open_reference("data/half", store, profile="always"):
            pass


def test_a_store_that_refuses_the_profile_leaves_the_audit_as_it_is(tmp_path, penguins, caplog, monkeypatch):
    store, snaps, files = penguins
    import concord.audit.profile as profiles

    def refuse(*args, **kwargs):
        raise PermissionError(13, "read-only store")

    monkeypatch.setattr(profiles, "store_profile", refuse)
    night = nightly_drift("data/adelie", files["gentoo"], store, None, name="p", plots_dir=str(tmp_path / "plots"))
    assert night["drift"]["severity"] == "critical" and night["reference"]["profile"] is None
    assert "not stored" in caplog.text and stored_profile(store, snaps["adelie"].id) is None
    assert pd.read_parquet(files["gentoo"]).shape[0] == night["drift"]["rows_current"]
