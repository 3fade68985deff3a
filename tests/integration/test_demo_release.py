"""The demo's release chapter, on clusters set up as the snapshots chapter leaves them."""

from __future__ import annotations

from pathlib import Path

from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from demo._common import CLUSTERS, REF, model_folder
from demo.release import release_story
from demo.snapshots import fine_tune
from demo.story import Story


def test_every_check_of_the_release_chapter_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONCORD_KEY_FILE", raising=False)
    monkeypatch.delenv("CONCORD_TRUSTED_KEYS", raising=False)
    base = model_folder()
    tuned = tmp_path / "checkpoints" / "minilm-ft"
    fine_tune(base, tuned)
    stores = {c: str(tmp_path / "stores" / c) for c in CLUSTERS}
    us, eu, ap = (LocalDirStore(stores[c]) for c in CLUSTERS)
    snapshot(base, us, ref=REF)
    replicate(us, [eu], ref=REF)  # eu-central stays at the base model (the snapshots chapter rolls it back)
    snapshot(tuned, us, ref=REF)
    replicate(us, [ap], ref=REF)
    story = Story()
    release_story(tmp_path, story, stores, base, tuned)
    shown = capsys.readouterr().out
    assert story.failed == [] and story.passed >= 14, shown
    # the commands are shown as a person types them, paths relative to where they run
    assert "$ concord sign stores/us-east --ref models/minilm --key release/release.pem" in shown
    # the forged root is still in eu-central, and refused; ap-south kept the release
    assert LocalDirStore(stores["ap-south"]).read_ref(REF).root == us.read_ref(REF).root
    assert not Path(tmp_path / "release" / "restored-eu-central").exists()
