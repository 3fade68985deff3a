"""The CLI on S3 stores reached through a proxy of the tests' own that breaks answers
(tests/faultproxy.py in front of a real moto_server): connection resets and cuts in the middle of
response bodies, 503 bursts and slow answers are retried, so snapshot, sync, restore, verify, info
and the tier commands complete and every ref verifies; a fault that outlives the retries is one
line naming the store, with the exit status of an unreachable store (14)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import boto3
import pytest
import yaml
from faultproxy import Fault, FaultProxy
from toy_checkpoints import files_equal, make_checkpoint, make_lora_checkpoint

from concord.cli import main

pytestmark = pytest.mark.timeout(300)

CHUNK = str(64 * 1024)
CHUNKS = r"/chunks/"


@pytest.fixture(scope="module")
def proxy(moto_server):
    with FaultProxy(moto_server) as p:
        yield p


@pytest.fixture
def env(proxy, moto_server, monkeypatch):
    """Stores reached through the proxy, with short backoffs; returns a fresh bucket's URL."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("CONCORD_NO_PROGRESS", "1")
    monkeypatch.setenv("CONCORD_S3_RETRY_BACKOFF", "0.01")
    # faults hit by count across parallel readers: a read may meet several in a row
    monkeypatch.setenv("CONCORD_S3_READ_ATTEMPTS", "10")
    monkeypatch.delenv("CONCORD_KEY_FILE", raising=False)
    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_server).create_bucket(Bucket=bucket)
    proxy.clear()
    yield f"s3://{bucket}"
    proxy.clear()


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def every_ref_verifies(capsys, store: str) -> None:
    code, out, err = cli(capsys, "verify", store, "--json")
    report = json.loads(out)
    assert code == 0 and not report.get("corrupt") and not report.get("missing"), (report, err)


def transient_faults() -> list[Fault]:
    return [
        Fault("reset", every=6, path=CHUNKS),  # every sixth chunk GET breaks off mid-body
        Fault("503", every=9, burst=2, path=CHUNKS),  # bursts of two ServiceUnavailable answers
        Fault("cut", every=5, path=r"/(manifests|refs)/"),  # a manifest or ref body cut short
        Fault("delay", every=6, seconds=0.05, path=CHUNKS),
        Fault("reset", every=5, path=r"list-type=2"),  # a listing page broken off
    ]


def test_store_commands_complete_through_resets_503s_and_delays(env, proxy, tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", layers=3)
    a, b = f"{env}/a", f"{env}/b"
    faults = transient_faults()
    proxy.add(*faults)

    code, _, err = cli(capsys, "snapshot", ckpt, "--store", a, "--ref", "models/m", "--chunk-size", CHUNK)
    assert code == 0, err
    code, _, err = cli(capsys, "sync", a, b, "--ref", "models/m")
    assert code == 0, err
    code, _, err = cli(capsys, "restore", b, "--ref", "models/m", tmp_path / "out")
    assert code == 0, err
    assert files_equal(ckpt, tmp_path / "out")
    for store in (a, b):
        code, _, err = cli(capsys, "verify", store, "--ref", "models/m")
        assert code == 0, err
        code, out, err = cli(capsys, "info", store, "--json")
        assert code == 0 and json.loads(out)["refs"] == 1, err
    assert all(f.hits > 0 for f in faults), [(f.kind, f.path, f.seen, f.hits) for f in faults]
    assert "Traceback" not in err

    proxy.clear()
    for store in (a, b):
        every_ref_verifies(capsys, store)


def write_policy(path: Path, hot: Path, bucket_url: str) -> Path:
    doc = {
        "namespace": "run1",
        "hot": {"store": str(hot), "keep": 1},
        "warm": {"store": f"{bucket_url}/warm", "keep": 2},
        "cold": {"store": f"{bucket_url}/cold"},
        "ready": {"marker": "COMPLETE"},
        "gc_grace": 0,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_tier_commands_complete_through_resets_503s_and_delays(env, proxy, tmp_path, capsys):
    policy = write_policy(tmp_path / "policy.yaml", tmp_path / "hot", env)
    base = make_checkpoint(tmp_path / "base", layers=2, dim=64)
    ckpts = [make_lora_checkpoint(tmp_path / "run" / f"step-{s:04d}", base, s) for s in (10, 20)]
    faults = transient_faults()
    proxy.add(*faults)

    for c in ckpts:
        code, _, err = cli(capsys, "tier", "add", c, "--policy", policy)
        assert code == 0, err
    code, _, err = cli(capsys, "tier", "sweep", "--policy", policy)
    assert code == 0, err
    code, out, err = cli(capsys, "tier", "status", "--policy", policy, "--json")
    assert code == 0 and json.loads(out)["violations"] == [], err
    for name, tier in (("step-0010", "cold"), ("step-0020", "warm")):
        code, _, err = cli(capsys, "tier", "restore", name, tmp_path / f"r-{name}", "--tier", tier, "--policy", policy)
        assert code == 0, err
        assert files_equal(tmp_path / "run" / name, tmp_path / f"r-{name}")
    code, _, err = cli(capsys, "tier", "drill", "--policy", policy)
    assert code == 0, err
    code, _, err = cli(capsys, "tier", "gc", "--policy", policy)
    assert code == 0, err
    assert sum(f.hits for f in faults if f.path == CHUNKS) > 0, [(f.kind, f.path, f.seen, f.hits) for f in faults]
    assert "Traceback" not in err

    proxy.clear()
    for tier in ("warm", "cold"):
        every_ref_verifies(capsys, f"{env}/{tier}")


@pytest.mark.parametrize(
    "argv, where",
    [
        (["restore", "{a}", "--ref", "models/m", "{out}"], "chunks/"),
        (["verify", "{a}"], "chunks/"),
        (["sync", "{a}", "{b}", "--ref", "models/m"], "chunks/"),
        (["info", "{a}"], "manifests/"),  # a plain store's chunks are listed, never read
    ],
    ids=["restore", "verify", "sync", "info"],
)
def test_a_fault_that_outlives_the_retries_is_one_line_naming_the_store(env, proxy, tmp_path, capsys, monkeypatch, argv, where):
    ckpt = make_checkpoint(tmp_path / "ckpt", layers=1, dim=32)
    a, b = f"{env}/a", f"{env}/b"
    code, _, err = cli(capsys, "snapshot", ckpt, "--store", a, "--ref", "models/m", "--chunk-size", CHUNK)
    assert code == 0, err
    monkeypatch.setenv("CONCORD_S3_READ_ATTEMPTS", "3")
    permanent = Fault("reset", every=1, path=f"/{where}")  # every such GET breaks off
    proxy.add(permanent)

    code, _, err = cli(capsys, *(x.format(a=a, b=b, out=tmp_path / "out") for x in argv))
    assert code == 14, err  # 14: unreachable
    assert err.startswith("concord: error: ") and err.count("\n") == 1, err
    assert f"store {a} is unreachable" in err and f"reading {where}" in err and "failed 3 time(s)" in err
    assert "Traceback" not in err and permanent.hits >= 3
