"""The demo's lineage chapter, on clusters set up as the snapshots chapter leaves them: every
check passes, and ``models:/minilm-demo@champion`` downloaded by MLflow's own client is the base
checkpoint, byte for byte."""

from __future__ import annotations

import pytest

from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from demo._common import CLUSTERS, REF, model_folder
from demo.lineage import MODEL, files_of, lineage_story
from demo.snapshots import fine_tune
from demo.story import Story

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(900)]


def test_every_check_of_the_lineage_chapter_passes_and_the_champion_downloads(tmp_path, monkeypatch, capsys, mlflow_quiet):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONCORD_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for name in ("CONCORD_KEY_FILE", "CONCORD_TRUSTED_KEYS", "MLFLOW_REGISTRY_URI"):
        monkeypatch.delenv(name, raising=False)
    base = model_folder()
    tuned = tmp_path / "checkpoints" / "minilm-ft"
    fine_tune(base, tuned)
    stores = {c: str(tmp_path / "stores" / c) for c in CLUSTERS}
    us, eu, ap = (LocalDirStore(stores[c]) for c in CLUSTERS)
    base_root = snapshot(base, us, ref=REF).root
    replicate(us, [eu, ap], ref=REF)  # every cluster holds the base, as the snapshots chapter leaves them
    tuned_root = snapshot(tuned, us, ref=REF).root

    story = Story()
    lineage_story(tmp_path, story, stores, base_root, tuned_root)
    shown = capsys.readouterr().out
    assert story.failed == [], shown
    assert f'models:/{MODEL}@champion' in shown and "byte for byte" in shown
    assert files_of(tmp_path / "downloads" / f"{MODEL}-champion") == files_of(base)
