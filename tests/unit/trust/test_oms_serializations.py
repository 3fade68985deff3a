"""Bundles made by the real ``model_signing`` package with its other serializations (shards,
blake2b, blake3; its command line writes only files/sha256) are checked against the snapshot's
bytes, computed the same way; an unknown one is refused in one line."""

from __future__ import annotations

import base64
import json

import pytest
from oms_interop import import_model_signing

from concord.cli import main
from concord.errors import UntrustedRootError
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore
from concord.trust import load_policy, signature_ids, signature_key
from concord.trust.bundle import parse_bundle

SHARD = 65536  # the model's 300 000-byte file in five shards, cut elsewhere than its 64 KiB chunks


def oms_sign(folder, sig, key, *, shards: bool, hashing_algorithm: str):
    ms = import_model_signing()
    cfg = ms.hashing.Config()
    if shards:
        cfg = cfg.use_shard_serialization(hashing_algorithm=hashing_algorithm, shard_size=SHARD)
    else:
        cfg = cfg.use_file_serialization(hashing_algorithm=hashing_algorithm)
    cfg = cfg.set_ignored_paths(paths=[sig.name])
    ms.signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(cfg).sign(folder, sig)


def _snapshot(model, store, sig, pub, capsys):
    code = main(["snapshot", str(model), "--store", str(store), "--ref", "models/m", "--chunk-size", "64K",
                 "--signature", str(sig), "--trust", str(pub), "--json"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "shards, algorithm, method, hash_type",
    [(True, "sha256", "shards", "sha256"), (True, "blake2", "shards", "blake2b"), (False, "blake2", "files", "blake2b"), (False, "blake3", "files", "blake3")],
)
def test_other_serializations_are_checked_and_kept(model, keydir, tmp_path, capsys, shards, algorithm, method, hash_type):
    (model / "empty.txt").write_bytes(b"")  # a file with no shard at all
    sig = tmp_path / "model.sig"
    oms_sign(model, sig, keydir / "ossl.pem", shards=shards, hashing_algorithm=algorithm)
    st = parse_bundle(sig.read_bytes(), "model.sig").statement
    assert (st.serialization.method, st.serialization.hash_type) == (method, hash_type)
    if shards:
        assert st.serialization.shard_size == SHARD and "weights.bin:262144:300000" in st.resources

    store = tmp_path / "s"
    code, out, err = _snapshot(model, store, sig, keydir / "ossl.pub.pem", capsys)
    assert code == 0, err
    root = json.loads(out)["root"]
    s = LocalDirStore(store)
    policy = load_policy(str(keydir / "ossl.pub.pem"))
    assert signature_ids(s, root) == json.loads(out)["signed_by"] and policy.require(s, root).trusted
    restored = tmp_path / "out"
    restore(s, load_manifest(s, root), restored, check_root=policy.restore_check)
    assert (restored / "weights.bin").read_bytes() == (model / "weights.bin").read_bytes()


def test_a_sharded_bundle_names_the_shard_that_differs_and_holds_for_no_other_root(model, keydir, tmp_path, capsys):
    sig = tmp_path / "model.sig"
    oms_sign(model, sig, keydir / "ossl.pem", shards=True, hashing_algorithm="sha256")
    signed = LocalDirStore(tmp_path / "s")
    assert _snapshot(model, signed.root, sig, keydir / "ossl.pub.pem", capsys)[0] == 0
    good = signed.read_ref("models/m").root

    data = bytearray((model / "weights.bin").read_bytes())
    data[150_000] ^= 1  # one byte of the third shard
    (model / "weights.bin").write_bytes(bytes(data))
    other = LocalDirStore(tmp_path / "t")
    code, _, err = _snapshot(model, other.root, sig, keydir / "ossl.pub.pem", capsys)
    assert code == 13 and err.count("\n") == 1  # 13: untrusted
    assert "1 shard(s) differ from what was signed (weights.bin:131072:196608)" in err
    assert other.read_ref("models/m") is None and other.list_documents("signatures") == []  # no ref moved, nothing kept

    # the bundle copied onto a forged root (same files, other bytes) in the signed store: refused
    (model / ".gitattributes").unlink()  # (a file the bundle ignores is unsigned: refused on its own)
    forged = snapshot(model, signed, chunk_size=64 * 1024).root
    kid = signature_ids(signed, good)[0]
    signed.put_document(signature_key(forged, kid), signed.get_document(signature_key(good, kid)))
    policy = load_policy(str(keydir / "ossl.pub.pem"))
    with pytest.raises(UntrustedRootError, match=r"shard\(s\) differ"):
        restore(signed, load_manifest(signed, forged), tmp_path / "forged", check_root=policy.restore_check)
    assert not (tmp_path / "forged").exists()
    with pytest.raises(UntrustedRootError, match=r"shard\(s\) differ"):
        policy.require(signed, forged)


def test_an_unknown_serialization_is_refused_in_one_line(model, keydir, tmp_path, capsys):
    sig = tmp_path / "model.sig"
    oms_sign(model, sig, keydir / "ossl.pem", shards=True, hashing_algorithm="sha256")
    bundle = json.loads(sig.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["serialization"]["method"] = "tensors"
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    sig.write_text(json.dumps(bundle))
    code, _, err = _snapshot(model, tmp_path / "s", sig, keydir / "ossl.pub.pem", capsys)
    assert code == 13 and err.count("\n") == 1
    assert "serialization tensors/sha256: Concord reads model_signing's `files` and `shards` serializations" in err
    assert "sign with `model_signing sign key` (files, sha256)" in err and not (tmp_path / "s" / "refs").exists()
