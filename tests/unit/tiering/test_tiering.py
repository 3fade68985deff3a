"""Tiering on local stores: what each tier holds, verified demotion, convergence after faults."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from toy_checkpoints import files_equal, make_checkpoint, make_lora_checkpoint

from concord.errors import CheckpointConflictError, CheckpointNotReadyError, StoreUnreachableError
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore
from concord.tiering import add_checkpoint, stored_bytes, sweep, tier_status
from concord.tiering.engine import TierState, checkpoint_ready, open_tiers
from concord.tiering.policy import TierPolicy


def policy_doc(tmp_path: Path, **over) -> dict:
    doc = {
        "namespace": "run1",
        "hot": {"store": str(tmp_path / "hot"), "keep": 2},
        "warm": {"store": str(tmp_path / "warm"), "keep": 3, "media": "nas"},
        "cold": {"store": str(tmp_path / "cold"), "media": "tape", "offsite": True},
        "ready": {"marker": "COMPLETE"},
        "gc_grace": 0,
    }
    doc.update(over)
    return doc


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "base", layers=4, dim=128)


@pytest.fixture
def policy(tmp_path: Path) -> TierPolicy:
    return TierPolicy.from_dict(policy_doc(tmp_path))


def checkpoints(tmp_path: Path, base: Path, steps) -> list[Path]:
    return [make_lora_checkpoint(tmp_path / "run" / f"step-{s:04d}", base, s) for s in steps]


def add_all(policy, folders, **kw):
    out = []
    for i, f in enumerate(folders):
        os.utime(f / "COMPLETE", (1_700_000_000 + i * 60,) * 2)  # written a minute apart, in order
        out.append(add_checkpoint(policy, f, **kw))
    return out


def held(policy) -> dict[str, set[str]]:
    state = TierState.read(policy)
    return {t: set(state.held[t]) for t in ("hot", "warm", "cold")}


def test_each_tier_keeps_what_the_policy_says(tmp_path, base, policy):
    folders = checkpoints(tmp_path, base, range(10, 60, 10))
    results = add_all(policy, folders)
    assert all(r.sweep.ok for r in results)
    h = held(policy)
    assert h["hot"] == {"step-0040", "step-0050"}
    assert h["warm"] == {"step-0030", "step-0040", "step-0050"}
    assert h["cold"] == {f.name for f in folders}
    status = tier_status(policy)
    assert status["violations"] == []
    names = [c["name"] for c in status["checkpoints"]]
    assert names == ["step-0050", "step-0040", "step-0030", "step-0020", "step-0010"]
    newest = status["checkpoints"][0]
    assert newest["copies"] == 3 and all(newest["tiers"][t]["present"] for t in ("hot", "warm", "cold"))
    assert newest["tiers"]["hot"]["verified"] and newest["step"] == 50
    oldest = status["checkpoints"][-1]["tiers"]
    assert not oldest["hot"]["present"] and not oldest["warm"]["present"] and oldest["cold"]["present"]
    # every copy left is whole
    stores = open_tiers(policy)
    for t, names in h.items():
        for name in names:
            assert verify(stores[t], ref=policy.ref(name)).ok


def test_successive_checkpoints_share_the_frozen_base(tmp_path, base, policy):
    folders = checkpoints(tmp_path, base, range(10, 60, 10))
    results = add_all(policy, folders)
    one = results[0].bytes
    later = [r.new_bytes["cold"] for r in results[1:]]
    assert all(n < one * 0.1 for n in later), later
    stores = open_tiers(policy)
    plain = one * (2 + 3 + 5)
    ours = sum(stored_bytes(stores[t]) for t in ("hot", "warm", "cold"))
    assert ours < plain * 0.45, (ours, plain)


def test_garbage_of_demoted_copies_is_collected(tmp_path, base, policy):
    folders = checkpoints(tmp_path, base, range(10, 60, 10))
    add_all(policy, folders)
    stores = open_tiers(policy)
    state = TierState.read(policy, stores)
    from concord.snapshots.refs import load_manifest

    live = set()
    for root in state.held["hot"].values():
        live |= set(load_manifest(stores["hot"], root).chunk_lengths())
    assert set(stores["hot"].iter_chunks()) == live


def test_a_checkpoint_whose_name_starts_with_an_underscore_is_kept_in_every_tier(tmp_path, base, policy):
    (f,) = checkpoints(tmp_path, base, [10])
    os.utime(f / "COMPLETE", (1_700_000_000,) * 2)
    result = add_checkpoint(policy, f, name="_ck")
    assert result.sweep.ok
    assert held(policy) == {"hot": {"_ck"}, "warm": {"_ck"}, "cold": {"_ck"}}
    stores = open_tiers(policy)
    for t in ("hot", "warm", "cold"):
        assert verify(stores[t], ref=policy.ref("_ck")).ok, t
    assert [c["name"] for c in tier_status(policy)["checkpoints"]] == ["_ck"]


def test_the_ledger_head_name_is_refused_as_a_checkpoint_name(tmp_path, base, policy):
    from concord.errors import ReservedNameError

    (f,) = checkpoints(tmp_path, base, [10])
    with pytest.raises(ReservedNameError, match="reserved"):
        add_checkpoint(policy, f, name="_ledger")
    assert not (tmp_path / "hot").exists() or list(LocalDirStore(tmp_path / "hot").iter_chunks()) == []


def test_adding_again_is_idempotent_and_a_changed_folder_is_refused(tmp_path, base, policy):
    (f,) = checkpoints(tmp_path, base, [10])
    first = add_checkpoint(policy, f)
    again = add_checkpoint(policy, f)
    assert again.root == first.root and again.new_bytes["hot"] == 0
    assert held(policy)["hot"] == {"step-0010"}
    (f / "trainer_state.json").write_text('{"global_step": 11}')
    with pytest.raises(CheckpointConflictError, match="step-0010"):
        add_checkpoint(policy, f)
    assert TierState.read(policy).held["hot"]["step-0010"] == first.root


def test_a_folder_still_being_written_is_not_taken(tmp_path, base, policy):
    (f,) = checkpoints(tmp_path, base, [10])
    (f / "COMPLETE").unlink()
    with pytest.raises(CheckpointNotReadyError, match="no completion marker 'COMPLETE'"):
        add_checkpoint(policy, f)
    hot = LocalDirStore(tmp_path / "hot")
    assert hot.list_refs() == [] and list(hot.iter_chunks()) == []


def test_without_a_marker_changing_files_are_not_taken(tmp_path, base):
    (f,) = checkpoints(tmp_path, base, [10])
    growing = f / "optimizer.pt"

    def writer_still_busy(seconds):
        with open(growing, "ab") as fh:
            fh.write(b"more")

    with pytest.raises(CheckpointNotReadyError, match="optimizer.pt changed"):
        checkpoint_ready(f, settle_seconds=1, sleep=writer_still_busy)
    checkpoint_ready(f, settle_seconds=1, sleep=lambda s: None)  # nothing moves: ready


def test_a_truncated_safetensors_file_is_not_taken(tmp_path, base):
    (f,) = checkpoints(tmp_path, base, [10])
    data = (f / "adapter_model.safetensors").read_bytes()
    (f / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointNotReadyError, match="adapter_model.safetensors is not a whole safetensors file"):
        checkpoint_ready(f, marker="COMPLETE")
    (f / "model.safetensors.tmp").write_bytes(b"x")
    with pytest.raises(CheckpointNotReadyError, match="half-written"):
        checkpoint_ready(f, marker="COMPLETE")


def test_pinned_checkpoints_keep_three_copies(tmp_path, base):
    policy = TierPolicy.from_dict(policy_doc(tmp_path, pin=["step-0010"]))
    folders = checkpoints(tmp_path, base, range(10, 60, 10))
    add_all(policy, folders)
    h = held(policy)
    assert "step-0010" in h["hot"] and "step-0010" in h["warm"]
    # a root promoted in lineage pins too
    root20 = TierState.read(policy).held["cold"]["step-0020"]
    policy2 = TierPolicy.from_dict(policy_doc(tmp_path))
    r = sweep(policy2, pinned_roots=[root20])
    assert r.ok
    h = held(policy2)
    assert "step-0020" in h["hot"] and "step-0010" not in h["hot"]
    assert tier_status(policy2, pinned_roots=[root20])["checkpoints"][3]["pinned"]


class Flaky(LocalDirStore):
    """A store whose chunk reads start failing after a number of them: a server going away."""

    def __init__(self, path, fail_after: int):
        super().__init__(path)
        self.reads = 0
        self.fail_after = fail_after

    def _count(self, key):
        if key.startswith("chunks/"):
            self.reads += 1
        if self.reads > self.fail_after:
            raise StoreUnreachableError(self.uri, "connection reset by peer")

    def _get_object(self, key):
        self._count(key)
        return super()._get_object(key)

    def _read_object_transient(self, key):  # the read that verify and restore make
        self._count(key)
        return super()._read_object_transient(key)


def test_warm_failing_mid_demotion_keeps_the_hot_copy_and_a_rerun_converges(tmp_path, base, policy):
    folders = checkpoints(tmp_path, base, range(10, 60, 10))
    add_all(policy, folders[:2])
    # the third checkpoint pushes step-0010 out of hot; warm dies while it is being verified
    stores = open_tiers(policy)
    stores["warm"] = Flaky(tmp_path / "warm", fail_after=3)
    os.utime(folders[2] / "COMPLETE", (1_700_000_500,) * 2)
    r = add_checkpoint(policy, folders[2], stores=stores)
    assert not r.sweep.ok and any("step-0010" in e for e in r.sweep.errors)
    assert "step-0010" in held(policy)["hot"]  # not removed: warm could not be verified
    healthy = sweep(policy)
    assert healthy.ok, healthy.errors
    assert held(policy)["hot"] == {"step-0020", "step-0030"}


def test_a_corrupt_warm_chunk_is_repaired_from_hot_before_hot_lets_go(tmp_path, base, policy):
    folders = checkpoints(tmp_path, base, range(10, 40, 10))
    add_all(policy, folders[:2])
    warm = LocalDirStore(tmp_path / "warm")
    from concord.snapshots.refs import load_manifest

    root = warm.read_ref("run1/step-0010").root
    cid = next(iter(load_manifest(warm, root).chunk_lengths()))
    path = Path(warm.root) / "chunks" / cid[:2] / cid
    path.write_bytes(b"bit rot" + path.read_bytes()[7:])
    os.utime(folders[2] / "COMPLETE", (1_700_000_500,) * 2)
    r = add_checkpoint(policy, folders[2])
    assert r.sweep.ok, r.sweep.errors
    assert r.sweep.repaired == [{"name": "step-0010", "tier": "warm", "chunks": 1, "from": "hot"}]
    assert verify(warm, ref="run1/step-0010").ok and "step-0010" not in held(policy)["hot"]


def test_missing_copies_are_reported_and_a_sweep_restores_them(tmp_path, base, policy):
    folders = checkpoints(tmp_path, base, range(10, 40, 10))
    add_all(policy, folders)
    cold = LocalDirStore(tmp_path / "cold")
    root = cold.read_ref("run1/step-0030").root
    cold.delete_ref("run1/step-0030", root)
    violations = tier_status(policy)["violations"]
    assert any("step-0030: no cold copy" in v for v in violations)
    assert any("step-0030" in v and "needs 3-2-1" in v for v in violations)
    r = sweep(policy)
    assert r.ok and {"name": "step-0030", "tier": "cold", "from": "hot"}.items() <= r.copied[0].items()
    assert tier_status(policy)["violations"] == []


def test_dry_run_changes_nothing(tmp_path, base, policy):
    folders = checkpoints(tmp_path, base, range(10, 50, 10))
    for f in folders:
        add_checkpoint(policy, f, sweep_after=False)
    before = held(policy)
    r = sweep(policy, dry_run=True)
    assert r.demoted and held(policy) == before
    assert sweep(policy).ok and held(policy)["hot"] != before["hot"]


def test_keep_days(tmp_path, base):
    doc = policy_doc(tmp_path)
    doc["hot"] = {"store": str(tmp_path / "hot"), "keep_days": 1}
    doc["warm"] = {"store": str(tmp_path / "warm"), "keep_days": 3, "media": "nas"}
    policy = TierPolicy.from_dict(doc)
    folders = checkpoints(tmp_path, base, [10, 20, 30])
    day = 86400
    for f, age in zip(folders, (5 * day, 2 * day, 0)):
        t = time.time() - age
        for p in f.iterdir():
            os.utime(p, (t, t))
        add_checkpoint(policy, f)
    h = held(policy)
    assert h["hot"] == {"step-0030"} and h["warm"] == {"step-0020", "step-0030"} and len(h["cold"]) == 3


KILLER = textwrap.dedent(
    """
    import sys
    from concord.tiering import add_checkpoint
    from concord.tiering.policy import TierPolicy
    import json
    policy = TierPolicy.from_dict(json.loads(sys.argv[1]))
    for folder in sys.argv[2:]:
        add_checkpoint(policy, folder)
    """
)


@pytest.mark.parametrize("delay", [0.2, 0.3, 0.4, 0.6])
def test_killed_at_any_point_a_sweep_converges(tmp_path, base, delay):
    import json

    policy = TierPolicy.from_dict(policy_doc(tmp_path))
    folders = checkpoints(tmp_path, base, range(10, 60, 10))
    for i, f in enumerate(folders):
        os.utime(f / "COMPLETE", (1_700_000_000 + i * 60,) * 2)
    proc = subprocess.Popen([sys.executable, "-c", KILLER, json.dumps(policy_doc(tmp_path)), *map(str, folders)])
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # whatever was taken is either complete in a tier or absent from it
    stores = open_tiers(policy)
    state = TierState.read(policy, stores)
    for t, names in state.held.items():
        for root in names.values():
            assert verify(stores[t], root=root).ok
    for f in folders:
        add_checkpoint(policy, f)  # the job re-runs
    r = sweep(policy)
    assert r.ok, (r.errors, r.violations)
    h = held(policy)
    assert h["hot"] == {"step-0040", "step-0050"} and len(h["cold"]) == 5
    out = tmp_path / "restored"
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore

    root = stores["cold"].read_ref("run1/step-0010").root
    restore(stores["cold"], load_manifest(stores["cold"], root), out)
    assert files_equal(out, folders[0])
    shutil.rmtree(out)


def test_a_run_opens_the_tiers_once_for_every_step_and_closes_them(tmp_path, base, policy, monkeypatch):
    from concord.tiering.engine import opened_tiers
    from concord.tiering.policy import TierSpec

    opened, closed = [], []
    real_open = TierSpec.open
    monkeypatch.setattr(TierSpec, "open", lambda self: opened.append(self.tier) or real_open(self))
    monkeypatch.setattr(LocalDirStore, "close", lambda self: closed.append(self.root))
    (folder,) = checkpoints(tmp_path, base, [10])
    with opened_tiers(policy) as stores:
        add_checkpoint(policy, folder, stores=stores)
        sweep(policy, stores=stores)
        assert [c["name"] for c in tier_status(policy, stores=stores)["checkpoints"]] == ["step-0010"]
        assert closed == []
    assert opened == ["hot", "warm", "cold"]
    assert sorted(closed) == sorted(s.root for s in stores.values())


def test_a_drill_summary_keeps_the_objectives_and_cuts_the_findings():
    from concord.tiering.drill import drill_summary

    tier = {"store": "/t/hot", "rto_seconds": 2.0, "rto_objective": 1.0, "rto_ok": False, "rpo_seconds": 5.0,
            "rpo_objective": None, "rpo_ok": None, "ok": False, "sampled": ("step-0010",), "restores": [{"x": 1}]}
    drill = {"namespace": "run1", "started": "2025-01-01T00:00:00Z", "ok": False, "tiers": {"hot": tier},
             "findings": [f"finding {i}" for i in range(30)], "seconds": 3.0, "record": None}
    s = drill_summary(drill, items=20)
    assert s["tiers"]["hot"] == {k: v for k, v in tier.items() if k != "restores"} | {"sampled": ["step-0010"]}
    assert s["findings"] == drill["findings"][:20] and s["finding_count"] == 30
    assert (s["namespace"], s["started"], s["ok"]) == ("run1", "2025-01-01T00:00:00Z", False)
