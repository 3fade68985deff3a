"""The checkpoint watcher's core on local folders, and its entry point run as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toy_checkpoints import make_checkpoint

from concord.snapshots.watch import Announcement, Watcher, WatchStateError, fingerprint

ROOT = Path(__file__).resolve().parents[3]


def no_sleep(_seconds: float) -> None:
    pass


def watcher(tmp_path: Path, **kw) -> Watcher:
    kw.setdefault("sleep", no_sleep)
    return Watcher([str(tmp_path / "runs" / "llama")], state_path=str(tmp_path / "state.json"), **kw)


def checkpoint(tmp_path: Path, name: str = "step-0100", *, done: bool = True, seed: int = 0) -> Path:
    folder = make_checkpoint(tmp_path / "runs" / "llama" / name, seed=seed, layers=1, dim=16)
    if done:
        (folder / "COMPLETE").write_text("")
    return folder


def test_fingerprint_is_order_free_and_sees_sizes_and_names():
    a = [("model.safetensors", 10), ("config.json", 2)]
    assert fingerprint(a) == fingerprint(list(reversed(a)))
    assert fingerprint(a) != fingerprint([("model.safetensors", 11), ("config.json", 2)])
    assert fingerprint(a) != fingerprint([("model2.safetensors", 10), ("config.json", 2)])


def test_announced_after_the_marker_exactly_once(tmp_path):
    folder = checkpoint(tmp_path, done=False)
    w = watcher(tmp_path)
    assert w.scan() == []
    (folder / "COMPLETE").write_text("")
    [a] = w.scan()
    assert isinstance(a, Announcement)
    assert (a.store, a.name, a.step, a.model, a.changed) == ("local", "step-0100", 100, "llama", False)
    assert a.path == str(folder) and a.source == str(tmp_path / "runs" / "llama")
    assert a.files == 4 and a.bytes == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert a.to_dict()["fingerprint"] == a.fingerprint
    assert w.scan() == []
    assert w.scan() == []


def test_checkpoints_in_model_folders_are_named_after_their_model(tmp_path):
    """<watched>/<model>/<step>/: the model is the folder the checkpoint sits in; a checkpoint right
    under the watched folder keeps the watched folder's name as its model."""
    watched = tmp_path / "checkpoints"
    for model, step in (("minilm", "step-0100"), ("minilm", "step-0200"), ("llama", "step-7")):
        folder = make_checkpoint(watched / model / step, seed=len(model), layers=1, dim=16)
        (folder / "COMPLETE").write_text("")
    (make_checkpoint(watched / "step-9", seed=9, layers=1, dim=16) / "COMPLETE").write_text("")
    (watched / "empty-model").mkdir()
    w = Watcher([str(watched)], state_path=str(tmp_path / "state.json"), sleep=no_sleep)
    found = sorted((a.model, a.name, a.step, a.path) for a in w.scan())
    assert found == [
        ("checkpoints", "step-9", 9, str(watched / "step-9")),
        ("llama", "step-7", 7, str(watched / "llama" / "step-7")),
        ("minilm", "step-0100", 100, str(watched / "minilm" / "step-0100")),
        ("minilm", "step-0200", 200, str(watched / "minilm" / "step-0200")),
    ]
    assert w.scan() == []
    named = Watcher([str(watched)], state_path=str(tmp_path / "other.json"), sleep=no_sleep, model="fixed")
    assert {a.model for a in named.scan()} == {"fixed"}


def test_a_restart_does_not_announce_again(tmp_path):
    checkpoint(tmp_path)
    [first] = watcher(tmp_path).scan()
    assert watcher(tmp_path).scan() == []
    checkpoint(tmp_path, "step-0200", seed=1)
    [second] = watcher(tmp_path).scan()
    assert second.name == "step-0200" and second.step == 200
    assert json.loads((tmp_path / "state.json").read_text())["announced"].keys() == {first.path, second.path}


def test_a_changed_checkpoint_is_announced_again_as_changed(tmp_path):
    folder = checkpoint(tmp_path)
    [first] = watcher(tmp_path).scan()
    (folder / "extra.json").write_text('{"a": 1}')
    [again] = watcher(tmp_path).scan()
    assert again.changed and again.path == first.path and again.fingerprint != first.fingerprint
    assert watcher(tmp_path).scan() == []


def test_the_same_content_has_the_same_fingerprint(tmp_path):
    checkpoint(tmp_path)
    [first] = watcher(tmp_path).scan()
    os.remove(tmp_path / "state.json")
    [again] = watcher(tmp_path).scan()
    assert again.fingerprint == first.fingerprint and not again.changed


def test_partial_files_are_not_taken(tmp_path):
    folder = checkpoint(tmp_path)
    (folder / "model.safetensors.part").write_bytes(b"half")
    w = watcher(tmp_path)
    assert w.scan() == []
    os.remove(folder / "model.safetensors.part")
    assert [a.name for a in w.scan()] == ["step-0100"]


def test_a_truncated_safetensors_file_is_not_taken(tmp_path):
    folder = checkpoint(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert watcher(tmp_path).scan() == []


def test_without_a_marker_stable_files_are_taken_after_the_settle_time(tmp_path):
    checkpoint(tmp_path, done=False)
    waits = []
    [a] = watcher(tmp_path, marker=None, settle_seconds=3, sleep=waits.append).scan()
    assert waits == [3] and a.files == 4


def test_a_missing_folder_is_nothing_yet(tmp_path):
    assert watcher(tmp_path).scan() == []


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 1, "announced": {"x": 3}}', '{"version": 99}'])
def test_a_corrupt_state_file_is_a_clear_error(tmp_path, text):
    state = tmp_path / "state.json"
    state.write_text(text)
    with pytest.raises(WatchStateError) as err:
        watcher(tmp_path)
    assert str(state) in str(err.value) and "delete it" in str(err.value)
    assert state.read_text() == text  # not silently reset


def test_the_state_is_written_atomically(tmp_path):
    checkpoint(tmp_path)
    watcher(tmp_path).scan()
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["state.json"]


def test_the_entry_point_announces_once_and_exits(tmp_path):
    folder = checkpoint(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "concord_pipelines.deployments.watcher", "--watch", str(folder.parent),
           "--state", str(tmp_path / "state.json"), "--once"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    a = json.loads(line)
    assert (a["name"], a["step"], a["model"], a["store"], a["path"]) == ("step-0100", 100, "llama", "local", str(folder))
    assert "new checkpoint llama/step-0100" in out.stderr
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0 and again.stdout == "", again.stderr


def test_the_event_is_keyed_by_the_checkpoint_and_its_content(tmp_path):
    from concord_pipelines.deployments.watcher import event_id, event_of

    checkpoint(tmp_path)
    [a] = watcher(tmp_path).scan()
    ev = event_of(a)
    assert ev["event"] == "concord.checkpoint.created"
    assert ev["resource"]["prefect.resource.id"] == "concord.checkpoint.llama/step-0100"
    assert ev["resource"]["concord.store"] == "local" and ev["resource"]["concord.path"] == a.path
    assert {"step", "model", "store", "path", "fingerprint"} <= ev["payload"].keys()
    assert ev["id"] == event_id(a)
    # the same checkpoint again: the same id; a different checkpoint with the same files: another
    os.remove(tmp_path / "state.json")
    [b] = watcher(tmp_path).scan()
    assert event_of(b)["id"] == ev["id"]
    other = Announcement(**dict(a.to_dict(), path=a.path + "-copy"))
    assert event_id(other) != ev["id"]


def test_the_entry_point_refuses_a_corrupt_state_file(tmp_path):
    (tmp_path / "state.json").write_text("{")
    out = subprocess.run(
        [sys.executable, "-m", "concord_pipelines.deployments.watcher", "--watch", str(tmp_path), "--state", str(tmp_path / "state.json"), "--once"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2 and "state.json is unusable" in out.stderr


def test_the_loop_stops_cleanly_on_sigterm(tmp_path):
    import signal
    import time

    folder = checkpoint(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PYTHONPATH=str(ROOT))
    state = tmp_path / "state.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "concord_pipelines.deployments.watcher", "--watch", str(folder.parent), "--state", str(state), "--interval", "0.2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # a few more scans: nothing more to announce
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["step-0100"]
    assert "SIGTERM: stopping after the current scan" in err
