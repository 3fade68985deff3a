"""The training-script story, as a user writes it: a loop saves a checkpoint with safetensors every
N steps, ``concord.snapshot``s it and ``concord.sync``s it to a replica; a second script, another
process, ``concord.checkout``s the newest root under the trust policy of ``CONCORD_TRUSTED_KEYS``.
A signed root is served; an unsigned one, or one carrying another root's signature, is refused
with the untrusted error and the node keeps what it served. On a folder store and on S3."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import concord
from concord.snapshots.refs import resolve_root
from concord.stores import open_store
from concord.trust import generate_key, read_signature, signature_key

TRAIN = """
import os, sys

import torch
from safetensors.torch import save_file

import concord

primary, replica, first, last, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(first)
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(first, last + 1):
    x = torch.randn(8, 32)
    loss = ((model(x) - x) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % every == 0:
        folder = os.path.join("ckpt", f"step-{step}")
        os.makedirs(folder, exist_ok=True)
        weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(weights, os.path.join(folder, "model.safetensors"))
        r = concord.snapshot(folder, primary, ref="models/tiny", message=f"step {step}")
        concord.sync(primary, [replica], ref="models/tiny")
        print(step, r.root, flush=True)
"""

SERVE = """
import sys

import concord

try:
    r = concord.checkout(sys.argv[1], sys.argv[2], ref="models/tiny")
except concord.UntrustedRootError as exc:
    print(f"not deployed: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
print(r.root)
"""


@pytest.fixture(params=["folder", "s3"])
def site(request, tmp_path):
    """The scripts in a folder, the two stores they name, and the environment they run in."""
    s3 = request.getfixturevalue("s3_store") if request.param == "s3" else None  # its credentials are in os.environ
    env = {**os.environ, "CONCORD_NO_PROGRESS": "1", "CONCORD_HOME": str(tmp_path / "home")}
    env.pop("CONCORD_KEY_FILE", None)
    env.pop("CONCORD_TRUSTED_KEYS", None)
    if s3 is not None:
        env["AWS_ENDPOINT_URL"] = s3.endpoint_url
        base = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}"
    else:
        base = str(tmp_path / "stores")
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "serve.py").write_text(SERVE)
    key = generate_key(tmp_path / "release.pem")
    return {"dir": tmp_path, "env": env, "primary": f"{base}/us-east", "replica": f"{base}/eu-west", "key": key}


def run(site: dict, *args: str, trusted: bool = False) -> subprocess.CompletedProcess:
    env = dict(site["env"])
    if trusted:
        env["CONCORD_TRUSTED_KEYS"] = str(site["dir"] / "release.pub.pem")
    return subprocess.run(
        [sys.executable, *args], cwd=site["dir"], env=env, capture_output=True, text=True, timeout=300
    )


def replica_store(site: dict):
    """The replica, opened in this process with the scripts' endpoint."""
    if "AWS_ENDPOINT_URL" in site["env"]:
        from concord.stores.address import StoreAddress

        address = StoreAddress.parse(site["replica"])
        from concord.stores.s3 import S3ObjectStore

        return S3ObjectStore(address.bucket, address.prefix, endpoint_url=site["env"]["AWS_ENDPOINT_URL"])
    return open_store(site["replica"])


def test_a_training_loop_snapshots_and_syncs_and_a_server_checks_out_only_signed_roots(site):
    train = run(site, "train.py", site["primary"], site["replica"], "1", "6", "2")
    assert train.returncode == 0, train.stderr
    saved = [line.split() for line in train.stdout.splitlines()]
    assert [s for s, _ in saved] == ["2", "4", "6"]
    replica = replica_store(site)
    history = replica.read_ref("models/tiny").history
    assert [e.root for e in history] == [root for _, root in saved]  # every checkpoint reached the replica

    # the release step: the newest root is signed; the server checks it out
    newest = saved[-1][1]
    concord.sign(replica, site["dir"] / "release.pem", root=newest, progress=False)
    dest = site["dir"] / "srv" / "current"
    served = run(site, "serve.py", site["replica"], str(dest), trusted=True)
    assert served.returncode == 0, served.stderr
    assert served.stdout.strip() == newest
    assert (dest / "model.safetensors").read_bytes() == (
        site["dir"] / "ckpt" / "step-6" / "model.safetensors"
    ).read_bytes()

    # training goes on: the next root is unsigned, and refused
    more = run(site, "train.py", site["primary"], site["replica"], "7", "8", "2")
    assert more.returncode == 0, more.stderr
    unsigned = more.stdout.split()[1]
    assert resolve_root(replica, "models/tiny") == unsigned != newest
    link = os.readlink(dest)
    refused = run(site, "serve.py", site["replica"], str(dest), trusted=True)
    assert refused.returncode == concord.UntrustedRootError.exit_code == 13
    assert f"not deployed: root {unsigned}" in refused.stderr and "not signed by a trusted key" in refused.stderr
    assert os.readlink(dest) == link  # the node serves what it served

    # a signature of the released root, copied onto the new one, is no signature of it
    key_id = site["key"].id
    replica.put_document(signature_key(unsigned, key_id), read_signature(replica, newest, key_id))
    forged = run(site, "serve.py", site["replica"], str(dest), trusted=True)
    assert forged.returncode == 13, forged.stderr
    assert f"not deployed: root {unsigned}" in forged.stderr and os.readlink(dest) == link
    assert (dest / "model.safetensors").read_bytes() == (
        site["dir"] / "ckpt" / "step-6" / "model.safetensors"
    ).read_bytes()

    # without a policy in the environment the same script serves it: the check came from there
    untrusted = run(site, "serve.py", site["replica"], str(dest))
    assert untrusted.returncode == 0 and untrusted.stdout.strip() == unsigned
    assert (
        Path(dest / "model.safetensors").read_bytes()
        == (site["dir"] / "ckpt" / "step-8" / "model.safetensors").read_bytes()
    )
