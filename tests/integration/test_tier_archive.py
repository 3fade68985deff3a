"""Restores from a cold tier in S3 GLACIER, against a real moto_server.

The cold tier's chunks are written in GLACIER: reading one needs an archive restore first. moto
completes a restore at once by default; with its state manager (``archive_helpers``) a restore
is held "in progress" for a number of reads, or forever.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from archive_helpers import archive_store, hold_restores_in_progress
from safetensors.numpy import save_file

from concord.errors import ChunkArchivedError, RestoreTimeoutError
from concord.snapshots.refs import load_manifest
from concord.stores import LocalDirStore
from concord.tiering import add_checkpoint
from concord.tiering.drill import run_drill
from concord.tiering.engine import TierState
from concord.tiering.policy import TierPolicy
from concord.tiering.restore import restore_checkpoint

T0 = 1_700_000_000


def files_equal(a: Path, b: Path) -> bool:
    import filecmp

    left = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    right = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return left == right and all(filecmp.cmp(a / p, b / p, shallow=False) for p in left)


def make_ckpt(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(step)
    save_file(
        {"embed.weight": rng.standard_normal((256, 64), dtype=np.float32), "mlp.weight": rng.standard_normal(40_000, dtype=np.float32)},
        str(folder / "model.safetensors"),
    )
    torch.save({"step": step, "exp_avg": torch.from_numpy(rng.standard_normal(3000, dtype=np.float32))}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for f in folder.iterdir():
        os.utime(f, (T0 + step * 60,) * 2)
    return folder


class Recorder:
    """A Progress that remembers every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._lock = threading.Lock()

    def start(self, total: int, desc: str) -> None:
        self.calls.append(("start", total, desc))

    def advance(self, n: int) -> None:
        with self._lock:
            self.calls.append(("advance", n))

    def close(self) -> None:
        self.calls.append(("close",))

    def phase(self, desc: str) -> tuple[int, list[int]]:
        """The total and the advances of the (first) phase named ``desc``."""
        i = next(i for i, c in enumerate(self.calls) if c[0] == "start" and c[2] == desc)
        total, advances = self.calls[i][1], []
        for c in self.calls[i + 1 :]:
            if c[0] != "advance":
                break
            advances.append(c[1])
        return total, advances


@pytest.fixture
def tiers(tmp_path, archive_moto_server):
    """A policy whose cold tier is S3 GLACIER, its stores, and three checkpoints added:
    step-1 only in cold, step-2 in warm and cold, step-3 in every tier."""
    cold = archive_store(archive_moto_server, "GLACIER")
    policy = TierPolicy.from_dict(
        {
            "namespace": "run1",
            "hot": {"store": str(tmp_path / "hot"), "keep": 1},
            "warm": {"store": str(tmp_path / "warm"), "keep": 2, "media": "nas"},
            "cold": {"store": f"s3://{cold.bucket}/{cold.prefix}", "storage_class": "GLACIER"},
            "ready": {"settle": 0},
            "restore": {"poll": "0.1s", "timeout": "60s", "tier": "Expedited"},
        }
    )
    stores = {"hot": LocalDirStore(tmp_path / "hot"), "warm": LocalDirStore(tmp_path / "warm"), "cold": cold}
    folders = {}
    for step in (1, 2, 3):
        folder = make_ckpt(tmp_path / "run" / f"step-{step}", step)
        result = add_checkpoint(policy, folder, gc=False, stores=stores)
        assert result.sweep.ok, result.sweep.to_dict()
        folders[folder.name] = folder
    state = TierState.read(policy, stores)
    assert set(state.held["cold"]) == {"step-1", "step-2", "step-3"} and set(state.held["hot"]) == {"step-3"}
    yield policy, stores, folders
    cold.close()


def chunk_ids(stores, name: str) -> list[str]:
    ref = stores["cold"].read_ref(f"run1/{name}")
    return list(load_manifest(stores["cold"], ref.root).chunk_lengths())


def test_restore_from_glacier_requests_restores_and_is_byte_identical(tmp_path, tiers):
    policy, stores, folders = tiers
    cold = stores["cold"]
    ids = chunk_ids(stores, "step-1")
    assert cold.archive and set(cold.chunk_states(ids).values()) == {"archived"}
    with pytest.raises(ChunkArchivedError):
        cold.get_chunk(ids[0])
    progress = Recorder()
    r = restore_checkpoint(policy, "step-1", tmp_path / "out", stores=stores, progress=progress)  # only cold holds it
    assert r.tier == "cold" and r.store == cold.uri
    assert r.restore_requests == len(ids)
    assert 0 < r.wait_seconds <= r.seconds
    assert files_equal(folders["step-1"], tmp_path / "out")
    assert set(cold.chunk_states(ids).values()) == {"available"}
    total, advances = progress.phase("archive restore")
    assert total == len(ids) and sum(advances) == len(ids) and advances[0] == 0
    doc = json.loads(stores["hot"].get_document(r.record))
    assert doc["tier"] == "cold" and doc["restore_requests"] == len(ids) and doc["wait_seconds"] == r.wait_seconds
    # restored chunks stay readable for the days asked: a second restore waits for nothing
    again = restore_checkpoint(policy, "step-1", tmp_path / "again", stores=stores, record=False)
    assert again.restore_requests == 0 and again.wait_seconds == 0.0
    assert files_equal(folders["step-1"], tmp_path / "again")


def test_a_forced_cold_restore_of_a_checkpoint_hot_also_holds(tmp_path, tiers):
    policy, stores, folders = tiers
    r = restore_checkpoint(policy, "step-3", tmp_path / "out", tier="cold", stores=stores, record=False)
    assert r.tier == "cold" and r.restore_requests == len(chunk_ids(stores, "step-3"))
    assert files_equal(folders["step-3"], tmp_path / "out")


def test_a_restore_in_progress_for_a_few_polls_completes(tmp_path, tiers, archive_moto_server):
    policy, stores, folders = tiers
    ids = chunk_ids(stores, "step-2")
    progress = Recorder()
    with hold_restores_in_progress(archive_moto_server, stores["cold"], ids, reads=3):
        assert set(stores["cold"].chunk_states(ids).values()) == {"restoring"}  # the first of 3 reads
        r = restore_checkpoint(policy, "step-2", tmp_path / "out", tier="cold", stores=stores, progress=progress, poll=0.1)
    assert r.restore_requests == 0  # already requested: it only waits for them
    assert files_equal(folders["step-2"], tmp_path / "out")
    total, advances = progress.phase("archive restore")
    assert total == len(ids) and sum(advances) == len(ids)
    assert advances[0] == 0 and advances[1] == 0  # still restoring when first read and at the first poll
    assert len(advances) >= 3 and r.wait_seconds >= 0.1


def test_a_restore_in_progress_forever_times_out_and_leaves_no_folder(tmp_path, tiers, archive_moto_server):
    policy, stores, folders = tiers
    ids = chunk_ids(stores, "step-1")
    out = tmp_path / "out"
    with hold_restores_in_progress(archive_moto_server, stores["cold"], ids):
        with pytest.raises(RestoreTimeoutError) as info:
            restore_checkpoint(policy, "step-1", out, stores=stores, timeout=1, poll=0.1)
    err = info.value
    assert err.waiting == len(ids) and err.seconds >= 1 and err.store == stores["cold"].uri
    assert f"{len(ids)} of {len(ids)} objects still restoring" in str(err)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert stores["hot"].list_documents("tier-restores/run1") == []


def test_a_drill_restores_from_the_archive_tier_too(tmp_path, tiers):
    policy, stores, folders = tiers
    d = run_drill(policy, sample=3, stores=stores, rng_seed=0, now=T0 + 3 * 60 + 60)
    assert d.ok, d.findings
    cold = d.tiers["cold"]
    assert sorted(cold["sampled"]) == ["step-1", "step-2", "step-3"] and cold["sampled"][0] == "step-3"
    assert all(r["ok"] for r in cold["restores"]) and cold["rto_seconds"] > 0
    assert cold["rpo_seconds"] == pytest.approx(60)
    assert json.loads(stores["hot"].get_document(d.record))["tiers"]["cold"]["store"] == stores["cold"].uri
