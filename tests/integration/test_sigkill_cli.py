"""``concord snapshot`` and ``concord tier sweep`` killed with SIGKILL at several moments, on a
local folder and on S3 (a real moto_server): the store is consistent whatever the moment (every
ref verifies, no ref names a missing manifest, each ref is at its old or its new root), and
running the same command again converges (the same roots, everything verifies).

The commands run as real subprocesses on checkpoints of a few tens of MB in 256 KiB chunks, so
that there is time to kill them while chunks are being written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultproxy import Fault, FaultProxy

from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore, open_store

pytestmark = pytest.mark.integration

CONCORD = str(Path(sys.executable).parent / "concord")
CHUNK = 256 * 1024
DEADLINE = 60.0  # seconds a command may take to reach the moment it is killed at


def write_checkpoint(folder: Path, seed: int, *, tensors: int = 6, floats: int = 1 << 20) -> Path:
    """A safetensors checkpoint of ``tensors`` × ``floats`` float32 values (4 MiB each by
    default) plus a config: every seed gives entirely different chunks."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"layers.{i}.weight": torch.randn(floats, generator=g) for i in range(tensors)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"seed": seed, "layers": tensors}))
    (folder / "COMPLETE").write_text("")
    return folder


class Place:
    """Where a store lives (a folder, or a prefix of a bucket on moto_server): the address the
    CLI is given, the environment it runs in, and a way to count what has been written."""

    def __init__(self, address: str, env: dict[str, str], endpoint: str | None = None) -> None:
        self.address, self.env, self.endpoint = address, env, endpoint

    def open(self, address: str | None = None):
        return open_store(address or self.address)

    def count(self, folder: str, address: str | None = None) -> int:
        """Objects under ``folder`` (chunks, manifests) of the store at ``address``."""
        address = address or self.address
        if self.endpoint is None:
            top = Path(address) / folder
            if not top.exists():
                return 0
            return sum(1 for p in top.rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))
        import boto3

        bucket, _, prefix = address[len("s3://"):].partition("/")
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{folder}/")
            return sum(len(page.get("Contents", [])) for page in pages)
        finally:
            client.close()

    def sub(self, name: str) -> str:
        return f"{self.address.rstrip('/')}/{name}" if self.endpoint else str(Path(self.address) / name)


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path) -> Iterator[Place]:
    if request.param == "local":
        yield Place(str(tmp_path / "stores"), {**os.environ, "CONCORD_NO_PROGRESS": "1"})
        return
    endpoint = request.getfixturevalue("moto_server")  # with the test credentials in the environment
    env = {**os.environ, "CONCORD_NO_PROGRESS": "1"}
    import boto3

    bucket = f"sigkill-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    request.getfixturevalue("monkeypatch").setenv("AWS_ENDPOINT_URL", endpoint)  # this process opens the same stores
    # the command's chunk uploads go through a proxy that holds each one a quarter of a second: the
    # moment to kill at then comes at the same pace on a fast machine as on a slow one (a chunk is one
    # request, 16 at a time: a snapshot of 96 chunks takes 1.5 s however fast the machine is)
    with FaultProxy(endpoint) as slow:
        slow.add(Fault("delay", path=r"/chunks/", method="PUT", seconds=0.25))
        env["AWS_ENDPOINT_URL"] = slow.url
        yield Place(f"s3://{bucket}/stores", env, endpoint)


def kill_when(proc: subprocess.Popen, reached) -> bool:
    """SIGKILL ``proc`` as soon as ``reached()`` is true; True if it was killed (False if it
    ended by itself first)."""
    deadline = time.monotonic() + DEADLINE
    while not reached():
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError("the command never reached the moment to kill it at")
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode == -signal.SIGKILL


def assert_consistent(store, allowed: dict[str, set]) -> None:
    """Every ref of ``store`` names a manifest that is there and verifies, and each ref in
    ``allowed`` is at one of its allowed roots (None: absent)."""
    for name in store.list_refs():
        ref = store.read_ref(name)
        load_manifest(store, ref.root)  # raises if the manifest is missing or damaged
        report = verify(store, ref=name)
        assert report.ok, (name, report.to_dict() if hasattr(report, "to_dict") else report)
    for name, roots in allowed.items():
        ref = store.read_ref(name)
        assert (ref.root if ref is not None else None) in roots, (name, ref)


def run_cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([CONCORD, *argv], capture_output=True, text=True, env=env, timeout=300)


# ----------------------------------------------------------------------------- concord snapshot


@pytest.mark.parametrize("moment", [("chunks", 1), ("chunks", 48), ("manifests", 1)], ids=["first-chunk", "mid-way", "manifest"])
def test_a_killed_snapshot_leaves_the_store_consistent_and_a_rerun_converges(tmp_path, place, moment):
    old, new = write_checkpoint(tmp_path / "v1", seed=1), write_checkpoint(tmp_path / "v2", seed=2)
    store = place.open()
    old_root = snapshot(old, store, ref="models/ckpt", chunk_size=CHUNK).root
    new_root = snapshot(new, LocalDirStore(tmp_path / "scratch"), chunk_size=CHUNK).root  # what the store will hold
    assert new_root != old_root
    before = {"chunks": place.count("chunks"), "manifests": place.count("manifests")}

    folder, n = moment
    argv = ["snapshot", str(new), "--store", place.address, "--ref", "models/ckpt", "--chunk-size", "256K"]
    proc = subprocess.Popen([CONCORD, *argv], env=place.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    killed = kill_when(proc, lambda: place.count(folder) >= before[folder] + n)
    if folder == "chunks":  # far from the end: the kill lands while chunks are being written
        assert killed, proc.stderr.read()

    store = place.open()
    assert_consistent(store, {"models/ckpt": {old_root, new_root}})
    assert store.read_ref("models/ckpt").history[0].root == old_root

    again = run_cli(*argv, "--json", env=place.env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["root"] == new_root
    store = place.open()
    assert_consistent(store, {"models/ckpt": {new_root}})
    assert [e.root for e in store.read_ref("models/ckpt").history] == [old_root, new_root]


# ----------------------------------------------------------------------------- concord tier sweep


def _policy(tmp_path: Path, place: Place, warm: str, cold: str) -> Path:
    import yaml

    doc = {
        "namespace": "run1",
        "hot": {"store": place.sub("hot"), "keep": 2},
        "warm": {"store": place.sub(warm), "keep": 3, "media": "nas"},
        "cold": {"store": place.sub(cold), "media": "tape", "offsite": True},
        "ready": {"marker": "COMPLETE"},
        "gc_grace": 0,
    }
    path = tmp_path / f"policy-{warm}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("moment", [("warm", 1), ("cold", 24), ("demotion", 0)], ids=["first-copy", "mid-way", "demotion"])
def test_a_killed_tier_sweep_leaves_every_tier_consistent_and_a_rerun_converges(tmp_path, place, moment):
    # three checkpoints in the hot tier only; the sweep copies them to warm and cold (empty), then
    # demotes the oldest from hot once its copies are verified. Each is 32 chunks: the mid-way kill
    # (24 chunks into cold) lands inside the first checkpoint's copy
    hot = place.open(place.sub("hot"))
    roots = {}
    for i, step in enumerate((10, 20, 30)):
        folder = write_checkpoint(tmp_path / "run" / f"step-{step:04d}", seed=10 + i, tensors=2)
        roots[f"step-{step:04d}"] = snapshot(folder, hot, ref=f"run1/step-{step:04d}", chunk_size=CHUNK).root
    policy = _policy(tmp_path, place, "warm", "cold")
    stores = {t: place.sub(t) for t in ("hot", "warm", "cold")}

    tier, n = moment
    proc = subprocess.Popen([CONCORD, "tier", "sweep", "--policy", str(policy)], env=place.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if tier == "demotion":  # the oldest checkpoint's hot ref is gone: kill at once
        reached = lambda: place.open(stores["hot"]).read_ref("run1/step-0010") is None  # noqa: E731
    else:
        reached = lambda: place.count("chunks", stores[tier]) >= n  # noqa: E731
    killed = kill_when(proc, reached)
    if tier != "demotion":
        assert killed, proc.stderr.read()

    for address in stores.values():
        allowed = {f"run1/{name}": {None, root} for name, root in roots.items()}
        assert_consistent(place.open(address), allowed)
    held = {name for name in roots if any(place.open(a).read_ref(f"run1/{name}") is not None for a in stores.values())}
    assert held == set(roots)  # a checkpoint is never lost: demotion comes after the copies

    again = run_cli("tier", "sweep", "--policy", str(policy), "--json", env=place.env)
    assert again.returncode == 0, again.stdout + again.stderr
    expected = {
        "hot": {"step-0020", "step-0030"},
        "warm": {"step-0010", "step-0020", "step-0030"},
        "cold": {"step-0010", "step-0020", "step-0030"},
    }
    for t, address in stores.items():
        store = place.open(address)
        assert_consistent(store, {f"run1/{name}": {roots[name]} for name in expected[t]})
        assert {r.split("/", 1)[1] for r in store.list_refs() if r.startswith("run1/")} == expected[t], t
    status = run_cli("tier", "status", "--policy", str(policy), "--json", env=place.env)
    assert status.returncode == 0 and json.loads(status.stdout)["violations"] == [], status.stdout + status.stderr
