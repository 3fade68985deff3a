"""Tiering with warm and cold on real S3 servers (moto_server): archive classes, a warm server that
goes away in the middle of a demotion, and convergence once it is back."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from servers import free_port, running_server, stop
from toy_checkpoints import make_checkpoint, make_lora_checkpoint

from concord.stores import LocalDirStore
from concord.stores.s3 import S3ObjectStore
from concord.tiering import add_checkpoint, stored_bytes, sweep, tier_status
from concord.tiering.engine import TierState
from concord.tiering.policy import TierPolicy


def s3(endpoint: str, bucket: str, storage_class: str | None = None) -> S3ObjectStore:
    return S3ObjectStore(bucket, "ckpt", endpoint_url=endpoint, storage_class=storage_class, create_bucket=True)


def make_policy(tmp_path: Path, warm_bucket: str, cold_bucket: str) -> TierPolicy:
    return TierPolicy.from_dict(
        {
            "namespace": "run1",
            "hot": {"store": str(tmp_path / "hot"), "keep": 2},
            "warm": {"store": f"s3://{warm_bucket}/ckpt", "keep": 3, "storage_class": "STANDARD_IA"},
            "cold": {"store": f"s3://{cold_bucket}/ckpt", "storage_class": "GLACIER"},
            "ready": {"marker": "COMPLETE"},
            "gc_grace": 0,
        }
    )


def folders(tmp_path: Path, steps) -> list[Path]:
    base = make_checkpoint(tmp_path / "base", layers=4, dim=128)
    out = []
    for i, s in enumerate(steps):
        f = make_lora_checkpoint(tmp_path / "run" / f"step-{s:04d}", base, s)
        os.utime(f / "COMPLETE", (1_700_000_000 + i * 60,) * 2)
        out.append(f)
    return out


def test_tiers_on_s3_with_an_archive_class(tmp_path, moto_server):
    tag = uuid.uuid4().hex[:8]
    policy = make_policy(tmp_path, f"warm-{tag}", f"cold-{tag}")
    stores = {
        "hot": LocalDirStore(tmp_path / "hot"),
        "warm": s3(moto_server, f"warm-{tag}", "STANDARD_IA"),
        "cold": s3(moto_server, f"cold-{tag}", "GLACIER"),
    }
    fs = folders(tmp_path, range(10, 60, 10))
    for f in fs:
        r = add_checkpoint(policy, f, stores=stores)
        assert r.sweep.ok, (r.sweep.errors, r.sweep.violations)
    state = TierState.read(policy, stores)
    assert set(state.held["hot"]) == {"step-0040", "step-0050"}
    assert set(state.held["warm"]) == {"step-0030", "step-0040", "step-0050"}
    assert len(state.held["cold"]) == 5
    status = tier_status(policy, stores=stores)
    assert status["violations"] == []
    newest = status["checkpoints"][0]["tiers"]
    assert newest["cold"]["storage_class"] == "GLACIER" and newest["warm"]["storage_class"] == "STANDARD_IA"
    # demoting the older checkpoints verified cold without reading archived bytes
    oldest = status["checkpoints"][-1]["tiers"]
    assert oldest["cold"]["verified_how"] == "present"
    # chunks are archived; manifests, refs and records stay readable
    client = stores["cold"]._client()
    cid = next(stores["cold"].iter_chunks())
    head = client.head_object(Bucket=stores["cold"].bucket, Key=f"ckpt/chunks/{cid[:2]}/{cid}")
    assert head.get("StorageClass") == "GLACIER"
    root = state.held["cold"]["step-0010"]
    head = client.head_object(Bucket=stores["cold"].bucket, Key=f"ckpt/manifests/{root}.json")
    assert head.get("StorageClass", "STANDARD") == "STANDARD"
    # the frozen base is stored once per tier: far below a plain copy of each checkpoint kept
    one = r.bytes
    ours = sum(stored_bytes(s) for s in stores.values())
    assert ours < one * (2 + 3 + 5) * 0.45


class DyingS3(S3ObjectStore):
    """A warm store whose server is stopped (for real) the first time a chunk is read back from it."""

    def __init__(self, *args, server, **kw):
        super().__init__(*args, **kw)
        self.server = server

    def read_chunk_raw(self, cid, **kw):
        if self.server.poll() is None:
            stop(self.server)
        return super().read_chunk_raw(cid, **kw)


def test_warm_going_away_mid_demotion_keeps_hot_and_a_rerun_converges(tmp_path, aws_credentials):
    exe = str(Path(sys.executable).parent / "moto_server")
    tag = uuid.uuid4().hex[:8]
    policy = make_policy(tmp_path, f"warm-{tag}", f"cold-{tag}")
    fs = folders(tmp_path, range(10, 40, 10))
    port, cold_port = free_port(), free_port()
    endpoint, cold_endpoint = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{cold_port}"
    cmd = [exe, "-H", "127.0.0.1", "-p", str(port)]
    with running_server("moto_server", [exe, "-H", "127.0.0.1", "-p", str(cold_port)], f"{cold_endpoint}/moto-api/", tmp_path / "cold.log", timeout=120):
        hot = LocalDirStore(tmp_path / "hot")
        cold = s3(cold_endpoint, f"cold-{tag}", "GLACIER")
        with running_server("moto_server", cmd, f"{endpoint}/moto-api/", tmp_path / "warm1.log", timeout=120) as warm_server:
            warm = DyingS3(f"warm-{tag}", "ckpt", endpoint_url=endpoint, create_bucket=True, storage_class="STANDARD_IA",
                           connect_timeout=0.5, max_attempts=1, server=warm_server)
            stores = {"hot": hot, "warm": warm, "cold": cold}
            for f in fs:
                add_checkpoint(policy, f, stores=stores, sweep_after=False)
            assert len(TierState.read(policy, stores).held["hot"]) == 3
            # demoting step-0010 from hot verifies warm first: warm's server dies right then
            r = sweep(policy, stores=stores)
            assert warm_server.poll() is not None
        assert not r.ok and any("step-0010" in e and "unreachable" in e for e in r.errors), r.errors
        assert r.demoted == []
        assert hot.read_ref("run1/step-0010") is not None  # the hot copy stays
        # warm comes back (empty: a new server), and the next sweep converges
        with running_server("moto_server", cmd, f"{endpoint}/moto-api/", tmp_path / "warm2.log", timeout=120):
            stores["warm"] = s3(endpoint, f"warm-{tag}", "STANDARD_IA")
            r = sweep(policy, stores=stores)
            assert r.ok, (r.errors, r.violations)
            state = TierState.read(policy, stores)
            assert set(state.held["hot"]) == {"step-0020", "step-0030"}
            assert set(state.held["warm"]) == {"step-0010", "step-0020", "step-0030"}
            assert tier_status(policy, stores=stores)["violations"] == []


@pytest.fixture(autouse=True)
def _quiet_endpoint(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
