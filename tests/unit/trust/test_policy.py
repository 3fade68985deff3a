"""Trust policies: what restore and sync refuse, and bundles that do not hold."""

from __future__ import annotations

import base64
import json

import pytest

from concord.errors import SignatureFormatError, TrustPolicyError, UntrustedRootError
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.trust import ENV, check_root, load_policy, load_signing_key, sign_root, signature_key
from concord.trust.bundle import parse_bundle


@pytest.fixture
def signed(snap, keydir):
    store, root = snap
    sign_root(store, root, load_signing_key(keydir / "alice.pem"), ref="models/m")
    return store, root


def test_sync_carries_signatures_and_the_replica_stays_trusted(signed, keydir, tmp_path):
    store, root = signed
    policy = load_policy(str(keydir / "alice.pub.pem"))
    replica = LocalDirStore(tmp_path / "c2")
    replicate(store, [replica], ref="models/m", check_root=policy.require)
    assert policy.require(replica, root).trusted_by == policy.key_ids[0]
    restore(replica, load_manifest(replica, root), tmp_path / "out", check_root=policy.restore_check)
    assert (tmp_path / "out" / "config.json").exists()


def test_forged_root_in_a_replica_is_refused_by_restore_and_sync(signed, keydir, tmp_path, model):
    store, root = signed
    policy = load_policy(str(keydir / "alice.pub.pem"))
    replica = LocalDirStore(tmp_path / "c2")
    replicate(store, [replica], ref="models/m")
    # someone who can write the replica snapshots their own model under the same ref: valid chunks, no signature
    (model / "weights.bin").write_bytes(b"evil" * 1000)
    forged = snapshot(model, replica, ref="models/m").root
    with pytest.raises(UntrustedRootError) as exc:
        restore(replica, load_manifest(replica, forged), tmp_path / "out", check_root=policy.restore_check)
    msg = str(exc.value)
    assert forged in msg and policy.key_ids[0][:16] in msg and "\n" not in msg
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.concord-tmp-*"))
    third = LocalDirStore(tmp_path / "c3")
    with pytest.raises(UntrustedRootError):
        replicate(replica, [store, third], ref="models/m", check_root=policy.require)
    assert store.read_ref("models/m").root == root  # no ref moved
    assert not (tmp_path / "c3" / "manifests").exists() or not list((tmp_path / "c3" / "manifests").iterdir())
    with pytest.raises(UntrustedRootError):
        check_root(replica, forged, policy)
    assert check_root(replica, forged, None) is None  # no policy, no check


@pytest.mark.parametrize("damage", ["truncate", "payload", "signature", "media", "not json"])
def test_tampered_or_truncated_bundles_do_not_count(signed, keydir, damage):
    store, root = signed
    policy = load_policy(str(keydir / "alice.pub.pem"))
    key = signature_key(root, policy.key_ids[0])
    data = store.get_document(key)
    doc = json.loads(data)
    if damage == "truncate":
        bad = data[: len(data) // 2]
    elif damage == "payload":  # the statement edited, its subject digest kept consistent or not
        stmt = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
        stmt["predicate"]["concord"]["root"] = "0" * 64
        doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
        bad = json.dumps(doc).encode()
    elif damage == "signature":
        sig = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
        sig[-3] ^= 1
        doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
        bad = json.dumps(doc).encode()
    elif damage == "media":
        doc["mediaType"] = "application/json"
        bad = json.dumps(doc).encode()
    else:
        bad = b"\x00\x01garbage"
    store.put_document(key, bad, overwrite=True)
    v = policy.report(store, root)
    # the damaged document is a problem of its key id, never a signer
    assert not v.trusted and v.signed_by == () and v.documents == (policy.key_ids[0],) and policy.key_ids[0] in v.problems
    with pytest.raises(UntrustedRootError, match=r"not signed by a trusted key \("):
        policy.require(store, root)
    if damage in ("truncate", "media", "not json"):
        with pytest.raises(SignatureFormatError):
            parse_bundle(bad, "x")


def test_policy_sources(keydir, monkeypatch):
    assert load_policy(None, environ={}) is None
    p = load_policy(None, environ={ENV: f"{keydir / 'alice.pub.pem'}, {keydir / 'ossl.pub.pem'}"})
    assert len(p.keys) == 2 and p.source == ENV
    assert load_policy(str(keydir / "alice.pub.pem"), environ={ENV: "/nope.pem"}).source == "--trust"
    with pytest.raises(TrustPolicyError, match="list of trusted keys is empty"):
        load_policy(" , ")
    from concord.trust import TrustPolicy

    assert TrustPolicy.from_pems([(keydir / "alice.pub.pem").read_text()], "block:k").key_ids == p.key_ids[:1]


def test_replica_audit_flags_an_unsigned_root_on_any_cluster(signed, keydir, tmp_path, model):
    from concord.audit.replicas import compare_replicas

    store, root = signed
    policy = load_policy(str(keydir / "alice.pub.pem"))
    replica = LocalDirStore(tmp_path / "c2")
    replicate(store, [replica], ref="models/m")
    clean = compare_replicas({"a": (store, "models/m"), "b": (replica, "models/m")}, trust=policy)
    assert clean.ok and [r.trusted for r in clean.replicas] == [True, True]
    # the same bytes on a third cluster, but its signature was never copied there
    bare = LocalDirStore(tmp_path / "c3")
    replicate(store, [bare], ref="models/m")
    for p in (tmp_path / "c3" / "signatures").rglob("*.sig"):
        p.unlink()
    report = compare_replicas({"a": (store, "models/m"), "b": (replica, "models/m"), "c": (bare, "models/m")}, trust=policy)
    c = report.replica("c")
    assert report.severity == "critical" and c.severity == "critical" and c.trusted is False
    assert "is unsigned" in c.finding and c.identical  # identical bytes, still flagged
    assert compare_replicas({"a": (store, "models/m"), "c": (bare, "models/m")}).ok  # without a policy: as before
