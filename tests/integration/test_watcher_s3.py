"""The checkpoint watcher on S3 prefixes, against a real moto_server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from concord.snapshots.watch import Watcher

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bucket(moto_server):
    import boto3

    client = boto3.client("s3", endpoint_url=moto_server)
    name = f"watch-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    yield client, name
    client.close()


def upload_checkpoint(client, bucket: str, prefix: str, *, marker: bool) -> None:
    import numpy as np
    from safetensors.numpy import save

    body = save({"w": np.arange(64, dtype=np.float32).reshape(8, 8)})
    client.put_object(Bucket=bucket, Key=f"{prefix}/model.safetensors", Body=body)
    client.put_object(Bucket=bucket, Key=f"{prefix}/config.json", Body=b'{"hidden_size": 8}')
    if marker:
        client.put_object(Bucket=bucket, Key=f"{prefix}/COMPLETE", Body=b"")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_checkpoint_is_announced_once_its_marker_is_uploaded(bucket, moto_server, tmp_path):
    client, name = bucket
    source = f"s3://{name}/runs/llama"
    state = str(tmp_path / "state.json")
    w = Watcher([source], state_path=state, endpoint_url=moto_server)
    assert w.scan() == []
    upload_checkpoint(client, name, "runs/llama/step-0100", marker=False)
    assert w.scan() == []  # files all there, but no marker yet
    client.put_object(Bucket=name, Key="runs/llama/step-0100/COMPLETE", Body=b"")
    [a] = w.scan()
    assert (a.store, a.path, a.name, a.step, a.model) == ("s3", f"{source}/step-0100", "step-0100", 100, "llama")
    assert a.files == 2 and not a.changed
    assert w.scan() == []
    w.close()
    restarted = Watcher([source], state_path=state, endpoint_url=moto_server)
    assert restarted.scan() == []
    # a new object under the same checkpoint: announced again, as changed
    client.put_object(Bucket=name, Key="runs/llama/step-0100/extra.json", Body=b"{}")
    [again] = restarted.scan()
    assert again.changed and again.fingerprint != a.fingerprint
    restarted.close()


def test_checkpoints_under_model_prefixes_are_named_after_their_model(bucket, moto_server, tmp_path):
    client, name = bucket
    upload_checkpoint(client, name, "ckpt/minilm/step-0100", marker=True)
    upload_checkpoint(client, name, "ckpt/step-0005", marker=True)
    w = Watcher([f"s3://{name}/ckpt"], state_path=str(tmp_path / "state.json"), endpoint_url=moto_server)
    found = sorted((a.model, a.name, a.path) for a in w.scan())
    assert found == [("ckpt", "step-0005", f"s3://{name}/ckpt/step-0005"),
                     ("minilm", "step-0100", f"s3://{name}/ckpt/minilm/step-0100")]
    w.close()


def test_without_a_marker_a_checkpoint_is_announced_once_settled(bucket, moto_server, tmp_path):
    client, name = bucket
    clock = Clock()
    w = Watcher([f"s3://{name}/runs/llama"], state_path=str(tmp_path / "s.json"), marker=None,
                settle_seconds=5, endpoint_url=moto_server, clock=clock)
    client.put_object(Bucket=name, Key="runs/llama/step-0001/config.json", Body=b"{}")
    assert w.scan() == [] and w.pending == 0  # no safetensors object: not a checkpoint yet
    upload_checkpoint(client, name, "runs/llama/step-0001", marker=False)
    assert w.scan() == [] and w.pending == 1
    clock.now += 2
    assert w.scan() == []  # not settled long enough
    client.put_object(Bucket=name, Key="runs/llama/step-0001/more.safetensors", Body=b"x" * 10)
    clock.now += 4
    assert w.scan() == []  # changed since: the settle time starts again
    clock.now += 5
    [a] = w.scan()
    assert a.name == "step-0001" and a.step == 1 and a.files == 3
    clock.now += 60
    assert w.scan() == [] and w.pending == 0
    w.close()


def test_the_entry_point_once_waits_out_the_settle_time(bucket, moto_server, tmp_path):
    client, name = bucket
    upload_checkpoint(client, name, "runs/mistral/step-0042", marker=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "concord_pipelines.deployments.watcher", "--watch", f"s3://{name}/runs/mistral", "--marker", "",
         "--settle", "1", "--endpoint-url", moto_server, "--state", str(tmp_path / "state.json"), "--once"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    a = json.loads(line)
    assert (a["store"], a["model"], a["name"], a["step"]) == ("s3", "mistral", "step-0042", 42)
