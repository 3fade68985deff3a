"""A bucket's valid signature is never replaced by a sync from a store whose copy is damaged
(a real moto_server): both directions, folder to bucket and bucket to folder."""

from __future__ import annotations

import os

import pytest

from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.trust import generate_key, load_policy, sign_root, signature_key
from concord.trust.copying import signature_problem

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_damaged_signature_never_replaces_a_valid_one_on_s3(s3_store, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(os.urandom(200_000))
    local = LocalDirStore(tmp_path / "local")
    root = snapshot(model, local, ref="models/m", chunk_size=64 * 1024).root
    key = generate_key(tmp_path / "k.pem")
    sign_root(local, root, key, ref="models/m")
    doc = signature_key(root, key.id)
    good = local.get_document(doc)
    policy = load_policy(str(tmp_path / "k.pub.pem"))
    replicate(local, [s3_store], ref="models/m", check_signature=signature_problem)
    assert s3_store.get_document(doc) == good

    local.put_document(doc, good.replace(b'"sig"', b'"sig" ', 1)[:-40] + b"\n", overwrite=True)  # truncated
    (res,) = replicate(local, [s3_store], ref="models/m", check_signature=signature_problem)
    assert s3_store.get_document(doc) == good and doc in res.signatures_skipped[0]
    assert policy.decide(s3_store, root).trusted

    s3_store.put_document(doc, b"\x00garbage", overwrite=True)  # now the bucket's is damaged,
    local.put_document(doc, good, overwrite=True)  # the folder's valid: the valid one wins
    (res,) = replicate(local, [s3_store], ref="models/m", check_signature=signature_problem)
    assert s3_store.get_document(doc) == good and res.signatures_skipped == ()
