"""Restoring tiered checkpoints and restore drills, on local stores."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from toy_checkpoints import files_equal

from concord.errors import CheckpointNotFoundError, IntegrityError, RestoreTargetError
from concord.snapshots.refs import load_manifest
from concord.stores import LocalDirStore
from concord.stores.base import chunk_key
from concord.tiering import add_checkpoint
from concord.tiering.drill import run_drill
from concord.tiering.engine import TierState
from concord.tiering.policy import TierPolicy
from concord.tiering.restore import TierCopyNotFoundError, check_restored, restore_checkpoint

T0 = 1_700_000_000


def policy_doc(tmp_path: Path, **over) -> dict:
    doc = {
        "namespace": "run1",
        "hot": {"store": str(tmp_path / "hot"), "keep": 1},
        "warm": {"store": str(tmp_path / "warm"), "keep": 2, "media": "nas"},
        "cold": {"store": str(tmp_path / "cold"), "media": "tape", "offsite": True},
        "ready": {"settle": 0},
    }
    doc.update(over)
    return doc


def make_ckpt(folder: Path, step: int) -> Path:
    """A small training checkpoint: weights (safetensors), optimizer state and trainer state."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(step)
    save_file(
        {
            "embed.weight": rng.standard_normal((256, 64), dtype=np.float32),
            "mlp.weight": rng.standard_normal(80_000, dtype=np.float32),  # > one 64 KiB chunk
            "norm.weight": np.ones(64, dtype=np.float32),
        },
        str(folder / "model.safetensors"),
    )
    torch.save({"step": step, "exp_avg": torch.from_numpy(rng.standard_normal(5000, dtype=np.float32))}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for f in folder.iterdir():  # written in step order, a minute apart
        os.utime(f, (T0 + step * 60,) * 2)
    return folder


@pytest.fixture
def policy(tmp_path: Path) -> TierPolicy:
    return TierPolicy.from_dict(policy_doc(tmp_path))


@pytest.fixture
def tiered(tmp_path: Path, policy: TierPolicy) -> dict[str, Path]:
    """step-1 only in cold, step-2 in warm and cold, step-3 in all three tiers."""
    folders = {}
    for step in (1, 2, 3):
        folder = make_ckpt(tmp_path / "run" / f"step-{step}", step)
        result = add_checkpoint(policy, folder, gc=False)
        assert result.sweep.ok, result.sweep.to_dict()
        folders[folder.name] = folder
    state = TierState.read(policy)
    assert set(state.held["hot"]) == {"step-3"}
    assert set(state.held["warm"]) == {"step-2", "step-3"}
    assert set(state.held["cold"]) == {"step-1", "step-2", "step-3"}
    return folders


def corrupt_a_chunk(store: LocalDirStore, root: str) -> str:
    manifest = load_manifest(store, root)
    cid = max(manifest.chunk_lengths().items(), key=lambda kv: kv[1])[0]
    path = Path(store.root, *chunk_key(cid).split("/"))
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    return cid


# --------------------------------------------------------------------------- restore


def test_restore_comes_from_the_nearest_tier_and_is_byte_identical(tmp_path, policy, tiered):
    expected_tier = {"step-3": "hot", "step-2": "warm", "step-1": "cold"}
    for name, tier in expected_tier.items():
        out = tmp_path / "out" / name
        r = restore_checkpoint(policy, name, out)
        assert r.tier == tier and r.store == policy.tier(tier).open().uri
        assert files_equal(tiered[name], out)
        assert r.path == str(out) and r.files == 3
        assert r.bytes == sum(f.stat().st_size for f in tiered[name].iterdir())
        assert r.restore_requests == 0 and r.wait_seconds == 0 and r.seconds > 0 and r.bytes_per_second > 0
        assert r.root == TierState.read(policy).held[tier][name]
        # where it came from and how long it took, recorded in the hot store
        doc = json.loads(LocalDirStore(tmp_path / "hot").get_document(r.record))
        assert r.record.startswith("tier-restores/run1/") and r.record.endswith(f"-{name}.json")
        assert doc["tier"] == tier and doc["name"] == name and doc["seconds"] == r.seconds and doc["root"] == r.root
    hot = LocalDirStore(tmp_path / "hot")
    assert len(hot.list_documents("tier-restores/run1")) == 3
    assert r.to_dict()["tier"] == "cold"


def test_a_forced_tier_is_used_even_when_a_nearer_one_holds_the_checkpoint(tmp_path, policy, tiered):
    r = restore_checkpoint(policy, "step-3", tmp_path / "from-cold", tier="cold", record=False)
    assert r.tier == "cold" and r.record is None
    assert files_equal(tiered["step-3"], tmp_path / "from-cold")
    assert LocalDirStore(tmp_path / "hot").list_documents("tier-restores/run1") == []
    with pytest.raises(TierCopyNotFoundError, match="hot tier holds no copy of checkpoint 'step-1'.*held in cold") as info:
        restore_checkpoint(policy, "step-1", tmp_path / "nope", tier="hot")
    assert isinstance(info.value, CheckpointNotFoundError) and info.value.held_in == ["cold"]
    assert not (tmp_path / "nope").exists()
    with pytest.raises(ValueError, match="unknown tier"):
        restore_checkpoint(policy, "step-3", tmp_path / "nope", tier="glacier")


def test_a_checkpoint_no_tier_holds_is_refused(tmp_path, policy, tiered):
    with pytest.raises(CheckpointNotFoundError, match="no tier holds checkpoint 'step-9'"):
        restore_checkpoint(policy, "step-9", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_in_the_way_is_refused_before_anything_is_read(tmp_path, policy, tiered):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(RestoreTargetError):
        restore_checkpoint(policy, "step-3", out)
    assert os.listdir(out) == ["mine.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    restore_checkpoint(policy, "step-3", empty)  # an empty folder is fine
    assert files_equal(tiered["step-3"], empty)


def test_a_rerun_into_the_folder_it_restored_is_unchanged_and_anything_else_is_refused(tmp_path, policy, tiered):
    out = tmp_path / "out"
    first = restore_checkpoint(policy, "step-3", out)
    assert not first.unchanged and first.record is not None
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = restore_checkpoint(policy, "step-3", out)  # a retried restore
    assert again.unchanged and again.root == first.root and again.record is None
    assert again.files == first.files and again.bytes == first.bytes and again.restore_requests == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == mtimes  # nothing written
    assert again.to_dict()["unchanged"] is True
    # the folder holds another checkpoint's root: refused, untouched
    with pytest.raises(RestoreTargetError, match=str(out)):
        restore_checkpoint(policy, "step-2", out)
    assert files_equal(tiered["step-3"], out)
    # an extra file, or one byte changed (same size, same file set): refused, untouched
    (out / "extra.txt").write_text("mine")
    with pytest.raises(RestoreTargetError):
        restore_checkpoint(policy, "step-3", out)
    assert (out / "extra.txt").read_text() == "mine"
    (out / "extra.txt").unlink()
    target = out / "trainer_state.json"
    data = bytearray(target.read_bytes())
    data[-2] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(RestoreTargetError):
        restore_checkpoint(policy, "step-3", out)
    assert target.read_bytes() == bytes(data)
    # a file where the folder should be
    (tmp_path / "file").write_text("x")
    with pytest.raises(RestoreTargetError):
        restore_checkpoint(policy, "step-3", tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"


def test_a_damaged_tier_copy_fails_the_restore_and_leaves_no_folder(tmp_path, policy, tiered):
    warm = LocalDirStore(tmp_path / "warm")
    corrupt_a_chunk(warm, TierState.read(policy).held["warm"]["step-2"])
    with pytest.raises(IntegrityError):
        restore_checkpoint(policy, "step-2", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_the_restored_files_are_checked_byte_for_byte(tmp_path, policy, tiered):
    r = restore_checkpoint(policy, "step-3", tmp_path / "out", record=False)
    manifest = load_manifest(LocalDirStore(tmp_path / "hot"), r.root)
    check_restored(manifest, r.path)  # as restored: identical
    target = tmp_path / "out" / "optimizer.pt"
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="optimizer.pt"):
        check_restored(manifest, r.path)
    target.write_bytes(bytes(data) + b"x")
    with pytest.raises(IntegrityError, match="optimizer.pt"):
        check_restored(manifest, r.path)


# --------------------------------------------------------------------------- drills


def test_a_drill_measures_rto_and_rpo_in_every_tier(tmp_path, policy, tiered):
    now = T0 + 3 * 60 + 600  # ten minutes after step-3 was written
    d = run_drill(policy, sample=3, now=now, rng_seed=1, scratch=str(tmp_path / "scratch"))
    assert d.ok, d.findings
    assert d.findings == []
    assert d.tiers["hot"]["sampled"] == ["step-3"]
    assert d.tiers["warm"]["sampled"][0] == "step-3" and set(d.tiers["warm"]["sampled"]) == {"step-2", "step-3"}
    assert d.tiers["cold"]["sampled"][0] == "step-3" and len(d.tiers["cold"]["sampled"]) == 3
    for t in ("hot", "warm", "cold"):
        row = d.tiers[t]
        assert row["ok"] and row["store"] == str(tmp_path / t)
        assert all(r["ok"] and r["seconds"] > 0 and r["bytes"] > 0 and r["error"] is None for r in row["restores"])
        assert row["rto_seconds"] == max(r["seconds"] for r in row["restores"])
        assert row["rpo_seconds"] == pytest.approx(600)  # every tier holds step-3
        assert row["rto_objective"] is None and row["rto_ok"] is None
        assert row["rpo_objective"] is None and row["rpo_ok"] is None
    assert os.listdir(tmp_path / "scratch") == []  # restored copies removed
    doc = json.loads(LocalDirStore(tmp_path / "hot").get_document(d.record))
    assert d.record.startswith("tier-drills/run1/") and doc["ok"] is True
    assert doc["tiers"]["cold"]["sampled"] == d.tiers["cold"]["sampled"]
    assert json.loads(json.dumps(d.to_dict())) == {**{k: v for k, v in doc.items() if k not in ("format", "finished")}, "record": d.record}


def test_missed_objectives_fail_the_drill(tmp_path, tiered):
    doc = policy_doc(tmp_path, rpo="5m")
    doc["warm"] = {**doc["warm"], "rto": "0.000001s"}
    policy = TierPolicy.from_dict(doc)
    d = run_drill(policy, now=T0 + 3 * 60 + 600)
    assert not d.ok
    warm, hot = d.tiers["warm"], d.tiers["hot"]
    assert warm["rto_objective"] == 0.000001 and warm["rto_ok"] is False and warm["rto_seconds"] > 0
    assert hot["rto_ok"] is None
    for t in ("hot", "warm", "cold"):
        assert d.tiers[t]["rpo_objective"] == 300 and d.tiers[t]["rpo_ok"] is False and not d.tiers[t]["ok"]
    assert any(f.startswith("warm: RTO") and "objective" in f for f in d.findings)
    assert any(f.startswith("cold: RPO") and "step-3" in f for f in d.findings)
    met = run_drill(TierPolicy.from_dict(policy_doc(tmp_path, rpo="1h")), now=T0 + 3 * 60 + 600)
    assert met.ok and all(met.tiers[t]["rpo_ok"] is True for t in ("hot", "warm", "cold"))


def test_a_drill_finds_a_corrupt_warm_chunk_repairs_it_and_fails(tmp_path, policy, tiered):
    warm = LocalDirStore(tmp_path / "warm")
    root = TierState.read(policy).held["warm"]["step-3"]
    cid = corrupt_a_chunk(warm, root)
    d = run_drill(policy, sample=1)
    assert not d.ok
    assert d.tiers["hot"]["ok"] and d.tiers["cold"]["ok"]
    row = d.tiers["warm"]
    assert not row["ok"] and row["sampled"] == ["step-3"]
    (r,) = row["restores"]
    assert r["name"] == "step-3" and r["repaired"] == 1 and r["repaired_from"] == "hot"
    assert cid in r["error"]
    assert r["ok"] and r["seconds"] > 0 and row["rto_seconds"] == r["seconds"]  # timed after the repair
    assert any(f.startswith("warm: step-3 was damaged") and "repaired 1 chunk(s) from hot" in f for f in d.findings)
    assert warm.get_chunk(cid)  # repaired in place
    again = run_drill(policy, sample=1)
    assert again.ok, again.findings
    assert again.record != d.record and len(LocalDirStore(tmp_path / "hot").list_documents("tier-drills/run1")) == 2


def test_without_repair_damage_is_reported_and_left(tmp_path, policy, tiered):
    cold = LocalDirStore(tmp_path / "cold")
    root = TierState.read(policy).held["cold"]["step-1"]
    cid = max(load_manifest(cold, root).chunk_lengths().items(), key=lambda kv: kv[1])[0]  # step-1's own
    cold.delete_chunk(cid)
    d = run_drill(policy, sample=3, repair=False, rng_seed=0)
    assert not d.ok and not d.tiers["cold"]["ok"] and d.tiers["warm"]["ok"]
    (r,) = [r for r in d.tiers["cold"]["restores"] if r["name"] == "step-1"]
    assert not r["ok"] and r["repaired"] is None and cid in r["error"]
    assert any("cold: step-1 is damaged" in f and "not repaired" in f for f in d.findings)
    assert cid not in cold.has_chunks([cid])
    # step-1 is held only in cold: nothing to repair it from
    d = run_drill(policy, sample=3, rng_seed=0)
    (r,) = [r for r in d.tiers["cold"]["restores"] if r["name"] == "step-1"]
    assert not r["ok"] and r["repaired"] == 0
    assert any("no other tier holds a readable copy" in f for f in d.findings)


def test_a_tier_holding_nothing_is_a_finding(tmp_path, policy, tiered):
    hot = LocalDirStore(tmp_path / "hot")
    hot.delete_ref("run1/step-3", hot.read_ref("run1/step-3").root)
    d = run_drill(policy)
    assert not d.ok and not d.tiers["hot"]["ok"]
    assert d.tiers["hot"]["sampled"] == [] and d.tiers["hot"]["rpo_seconds"] is None
    assert "hot: holds no checkpoint of run1, so its RPO is unknown" in d.findings
    assert d.tiers["warm"]["ok"] and d.tiers["cold"]["ok"]


def test_a_restore_that_fails_its_byte_check_leaves_no_folder(tmp_path, policy, tiered, monkeypatch):
    import concord.tiering.restore as tr

    def damaged(manifest, path, progress=None):
        raise IntegrityError(f"restored file {path}/optimizer.pt", "x", "y")

    monkeypatch.setattr(tr, "check_restored", damaged)
    with pytest.raises(IntegrityError, match="optimizer.pt"):
        restore_checkpoint(policy, "step-3", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert LocalDirStore(tmp_path / "hot").list_documents("tier-restores/run1") == []


class ScriptedArchive(LocalDirStore):
    """A local store that answers chunk states from a script, one entry per poll."""

    def __init__(self, path, script):
        super().__init__(path)
        self.script = list(script)
        self.requested: list[list[str]] = []

    @property
    def archive(self) -> bool:
        return True

    def chunk_states(self, ids):
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return {c: step.get(c, "available") for c in ids}

    def request_restore(self, ids, *, days=1, tier="Standard"):
        self.requested.append(list(ids))
        return len(ids)


def test_waiting_for_an_archive_re_requests_expired_restores_and_refuses_missing_chunks(tmp_path, policy):
    from concord.errors import ChunkNotFoundError, RestoreTimeoutError
    from concord.tiering.restore import wait_for_archive

    a, b = "a" * 64, "b" * 64
    clock = iter(range(100)).__next__
    store = ScriptedArchive(
        tmp_path / "arch",
        [{a: "archived", b: "restoring"}, {a: "restoring", b: "available"}, {a: "archived"}, {a: "available"}],
    )
    requests, waited = wait_for_archive(store, [a, b], policy, timeout=50, poll=1, sleep=lambda s: None, clock=clock)
    assert store.requested == [[a], [a]] and requests == 2 and waited > 0
    with pytest.raises(ChunkNotFoundError, match=b):
        wait_for_archive(ScriptedArchive(tmp_path / "m", [{a: "archived", b: "missing"}]), [a, b], policy, timeout=5, poll=1, sleep=lambda s: None)
    stuck = ScriptedArchive(tmp_path / "s", [{a: "restoring"}])
    with pytest.raises(RestoreTimeoutError, match="1 of 2 objects still restoring"):
        wait_for_archive(stuck, [a, b], policy, timeout=3, poll=1, sleep=lambda s: None, clock=iter(range(100)).__next__)
