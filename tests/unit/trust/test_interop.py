"""Both sides of OpenSSF Model Signing interop, with the real ``model_signing`` package."""

from __future__ import annotations

import json
import shutil

import pytest
from oms_interop import import_model_signing

from concord.errors import SignatureError
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore
from concord.trust import load_policy, load_signing_key, sign_root, signature_ids
from concord.trust.bundle import PREDICATE_TYPE, parse_bundle
from concord.trust.signing import snapshot_signed


def oms_verify(folder, sig, pub):
    ms = import_model_signing()
    ms.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(folder, sig)


def oms_sign(folder, sig, key, password=None):
    ms = import_model_signing()
    hashing = ms.hashing.Config().set_ignored_paths(paths=[sig.name] if sig.parent == folder else [])
    ms.signing.Config().use_elliptic_key_signer(private_key=key, password=password).set_hashing_config(hashing).sign(folder, sig)


def test_concord_signature_verifies_with_model_signing_on_the_restored_folder(snap, keydir, tmp_path):
    store, root = snap
    r, data = sign_root(store, root, load_signing_key(keydir / "alice.pem"), ref="models/m")
    assert r.files == 3  # .gitattributes is left to the root, as OMS ignores it by default
    sig = tmp_path / "m.sig"
    sig.write_bytes(data)
    out = tmp_path / "out"
    restore(store, load_manifest(store, root), out)
    oms_verify(out, sig, keydir / "alice.pub.pem")
    # the root rides in the signed statement, beside what OMS reads
    statement = parse_bundle(data, "m.sig").statement
    assert statement.root == root and statement.ref == "models/m"
    payload = json.loads(__import__("base64").b64decode(json.loads(data)["dsseEnvelope"]["payload"]))
    assert payload["predicateType"] == PREDICATE_TYPE and payload["predicate"]["concord"]["root"] == root
    # another key, or a changed file, fails in model_signing
    with pytest.raises(ValueError, match="Key mismatch"):
        oms_verify(out, sig, keydir / "mallory.pub.pem")
    (out / "sub" / "tok.txt").write_text("a b d")
    with pytest.raises(ValueError, match="Signature mismatch"):
        oms_verify(out, sig, keydir / "alice.pub.pem")


def test_model_signing_signature_is_kept_by_snapshot_and_trusted(model, keydir, tmp_path):
    sig = model / "model.sig"
    oms_sign(model, sig, keydir / "ossl.pem")
    store = LocalDirStore(tmp_path / "s")
    keys = load_policy(str(keydir / "ossl.pub.pem")).keys
    r, checked = snapshot_signed(model, store, sig.read_bytes(), keys, ref="models/m")
    assert not checked.root_bound and signature_ids(store, r.root) == [checked.key_id]
    assert store.read_ref("models/m").root == r.root
    policy = load_policy(str(keydir / "ossl.pub.pem"))
    assert policy.require(store, r.root).trusted
    # restore under the policy checks the restored files against the signed SHA-256
    restore(store, load_manifest(store, r.root), tmp_path / "out", check_root=policy.restore_check)
    # the root holds only what the bundle signs: not the bundle itself, nor the .gitattributes it ignores
    assert not (tmp_path / "out" / "model.sig").exists() and not (tmp_path / "out" / ".gitattributes").exists()
    oms_verify(tmp_path / "out", sig, keydir / "ossl.pub.pem")


def test_model_signing_signature_refused_with_another_key_or_other_files(model, keydir, tmp_path):
    sig = tmp_path / "model.sig"
    oms_sign(model, sig, keydir / "ossl.pem")
    store = LocalDirStore(tmp_path / "s")
    with pytest.raises(SignatureError, match="not among the keys given"):
        snapshot_signed(model, store, sig.read_bytes(), load_policy(str(keydir / "alice.pub.pem")).keys, ref="models/m")
    assert not (tmp_path / "s" / "manifests").exists() or not list((tmp_path / "s" / "manifests").iterdir())
    (model / "extra.txt").write_text("added after signing")
    keys = load_policy(str(keydir / "ossl.pub.pem")).keys
    with pytest.raises(SignatureError, match="files not signed: extra.txt"):
        snapshot_signed(model, store, sig.read_bytes(), keys, ref="models/m")
    (model / "extra.txt").unlink()
    (model / "config.json").write_text('{"hidden": 9}')  # same names, other bytes
    with pytest.raises(SignatureError, match="differ from what was signed.*config.json"):
        snapshot_signed(model, store, sig.read_bytes(), keys, ref="models/m")
    assert store.read_ref("models/m") is None  # no ref moved


def test_concord_bundle_for_one_root_does_not_vouch_for_another(snap, keydir, tmp_path, model):
    store, root = snap
    _, data = sign_root(store, root, load_signing_key(keydir / "alice.pem"))
    (model / "config.json").write_text('{"hidden": 10}')
    other = snapshot(model, store, ref="models/other").root
    dest = tmp_path / "c1" / "signatures" / other
    shutil.copytree(tmp_path / "c1" / "signatures" / root, dest)  # a signature copied onto another root
    v = load_policy(str(keydir / "alice.pub.pem")).report(store, other)
    assert not v.trusted and f"signs root {root}, not {other}" in next(iter(v.problems.values()))


def test_a_model_signing_bundle_copied_onto_a_forged_root_is_caught_by_restore_and_sync(model, keydir, tmp_path):
    from concord.errors import IntegrityError, UntrustedRootError
    from concord.snapshots.sync import replicate
    from concord.trust import signature_key

    sig = tmp_path / "model.sig"
    oms_sign(model, sig, keydir / "ossl.pem")
    store = LocalDirStore(tmp_path / "s")
    policy = load_policy(str(keydir / "ossl.pub.pem"))
    r, checked = snapshot_signed(model, store, sig.read_bytes(), policy.keys, ref="models/m")
    # the same file names, other bytes, and the trusted bundle (which names no root) copied onto it
    (model / ".gitattributes").unlink()  # (a file the bundle ignores is unsigned: refused on its own)
    (model / "weights.bin").write_bytes(b"forged" * 1000)
    forged = snapshot(model, store, ref="models/m").root
    store.put_document(signature_key(forged, checked.key_id), sig.read_bytes())
    with pytest.raises(IntegrityError, match="weights.bin.*checked against its signature"):
        restore(store, load_manifest(store, forged), tmp_path / "out", check_root=policy.restore_check)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.concord-tmp-*"))
    with pytest.raises(UntrustedRootError, match="differ from what was signed"):
        replicate(store, [LocalDirStore(tmp_path / "t")], ref="models/m", check_root=policy.require)
    assert policy.require(store, r.root).trusted  # the real one still is
