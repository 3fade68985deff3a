"""Signatures on S3 (a real moto_server): signed on a folder store, carried by sync to S3, checked
there under a trust policy; a forged root written straight into the bucket is refused."""

from __future__ import annotations

import os

import pytest

from concord.errors import UntrustedRootError
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.trust import generate_key, load_policy, sign_root, signature_ids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_signatures_travel_to_s3_and_a_forged_root_there_is_refused(s3_store, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(os.urandom(200_000))
    (model / "config.json").write_text("{}")
    local = LocalDirStore(tmp_path / "local")
    root = snapshot(model, local, ref="models/m", chunk_size=64 * 1024).root
    key = generate_key(tmp_path / "k.pem")
    sign_root(local, root, key, ref="models/m")
    policy = load_policy(str(tmp_path / "k.pub.pem"))

    replicate(local, [s3_store], ref="models/m", check_root=policy.require)
    assert signature_ids(s3_store, root) == [key.id] and policy.require(s3_store, root).trusted
    restore(s3_store, load_manifest(s3_store, root), tmp_path / "out", check_root=policy.restore_check)
    assert (tmp_path / "out" / "weights.bin").read_bytes() == (model / "weights.bin").read_bytes()

    (model / "weights.bin").write_bytes(b"forged" * 100)
    forged = snapshot(model, s3_store, ref="models/m", chunk_size=64 * 1024).root
    with pytest.raises(UntrustedRootError, match=forged):
        restore(s3_store, load_manifest(s3_store, forged), tmp_path / "out2", check_root=policy.restore_check)
    with pytest.raises(UntrustedRootError):
        replicate(s3_store, [local], ref="models/m", check_root=policy.require)
    assert not (tmp_path / "out2").exists() and local.read_ref("models/m").root == root
