"""A sync (and a tier sweep, which syncs) never writes a signature document that does not verify
over a target's copy: the target keeps its valid one and the skipped one is reported."""

from __future__ import annotations

import base64
import json

import pytest
from toy_checkpoints import SMALL_CHUNK, fine_tune

from concord.cli import main
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import copy_signatures, replicate
from concord.stores import LocalDirStore
from concord.trust import bundle as oms
from concord.trust import generate_key, load_policy, sign_root, signature_key
from concord.trust.copying import recover_key, signature_problem


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("keys")
    return {name: generate_key(d / f"{name}.pem") for name in ("alice", "mallory")} | {"dir": d}


@pytest.fixture
def signed(ckpt, tmp_path, keys):
    """A source holding a snapshot signed by alice, a target synced from it (the valid bundle
    with it), and the key of that bundle."""
    src, dst = LocalDirStore(tmp_path / "src"), LocalDirStore(tmp_path / "dst")
    r = snapshot(ckpt, src, ref="models/m", chunk_size=SMALL_CHUNK)
    sign_root(src, r.root, keys["alice"], ref="models/m")
    replicate(src, [dst], ref="models/m", check_signature=signature_problem)
    key = signature_key(r.root, keys["alice"].id)
    assert dst.get_document(key) == src.get_document(key)
    return src, dst, r.root, key


def _edit(data: bytes, fn) -> bytes:
    doc = json.loads(data)
    fn(doc)
    return json.dumps(doc).encode()


def _flip_signature(doc) -> None:
    sig = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[-3] ^= 0x01
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()


def _edit_payload(doc) -> None:
    payload = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    payload["subject"][0]["name"] = "renamed"
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()


def _forgeries(src, root, keys, tmp_path, ckpt) -> dict[str, bytes]:
    """Bundles that must never replace alice's valid one for ``root``."""
    good = src.get_document(signature_key(root, keys["alice"].id))
    other = LocalDirStore(tmp_path / "other")
    r2 = snapshot(fine_tune(ckpt, tmp_path / "ft", ["embed.weight"]), other, chunk_size=SMALL_CHUNK)
    _, for_other_root = sign_root(other, r2.root, keys["alice"])
    _, by_mallory = sign_root(src, root, keys["mallory"])
    src.delete_document(signature_key(root, keys["mallory"].id))
    files = {f.path: "0" * 64 for f in load_manifest(src, root).files}
    payload = oms.statement_bytes("m", files)  # root-less, as model_signing writes: wrong digests
    rootless = oms.bundle_bytes(payload, keys["alice"].sign(oms.pae(payload)), keys["alice"].id)
    return {
        "garbage bytes": b"\x00\x01 not a bundle",
        "wrong JSON shape": b'["a", "list"]',
        "truncated": good[: len(good) // 2],
        "signature bit flipped": _edit(good, _flip_signature),
        "payload edited": _edit(good, _edit_payload),
        "signed for another root": for_other_root,
        "mallory's, named as alice's": _edit(by_mallory, lambda d: d["verificationMaterial"]["publicKey"].update(hint=keys["alice"].id)),
        "root-less, other bytes": rootless,
    }


def test_no_forged_or_damaged_bundle_replaces_a_valid_one(signed, keys, tmp_path, ckpt):
    src, dst, root, key = signed
    good = dst.get_document(key)
    policy = load_policy(str(keys["dir"] / "alice.pub.pem"))
    for name, bad in _forgeries(src, root, keys, tmp_path, ckpt).items():
        src.put_document(key, bad, overwrite=True)
        (res,) = replicate(src, [dst], ref="models/m", check_signature=signature_problem)
        assert dst.get_document(key) == good, name
        assert len(res.signatures_skipped) == 1 and key in res.signatures_skipped[0] and "kept" in res.signatures_skipped[0], name
        assert policy.decide(dst, root).trusted, name


def test_a_damaged_bundle_is_not_copied_where_there_was_none(signed, tmp_path):
    src, _, root, key = signed
    src.put_document(key, b"{}", overwrite=True)
    fresh = LocalDirStore(tmp_path / "fresh")
    (res,) = replicate(src, [fresh], ref="models/m", check_signature=signature_problem)
    assert fresh.get_document(key) is None and "not copied" in res.signatures_skipped[0]
    assert fresh.read_ref("models/m").root == root  # the snapshot itself still travels


def test_a_new_valid_signature_replaces_the_old_one(signed, keys):
    src, dst, root, key = signed
    old = dst.get_document(key)
    _, again = sign_root(src, root, keys["alice"], ref="models/m")  # ECDSA: new bytes, same key
    assert again != old
    (res,) = replicate(src, [dst], ref="models/m", check_signature=signature_problem)
    assert dst.get_document(key) == again and res.signatures_skipped == ()


def test_without_a_check_a_held_document_is_never_replaced(signed, tmp_path):
    src, dst, root, key = signed
    good = dst.get_document(key)
    src.put_document(key, b"damaged", overwrite=True)
    (res,) = replicate(src, [dst], ref="models/m")
    assert dst.get_document(key) == good and "no signature check" in res.signatures_skipped[0]
    fresh = LocalDirStore(tmp_path / "fresh")
    assert copy_signatures(src, fresh, root).written == 1  # one it lacks is copied


def test_cli_sync_keeps_the_valid_signature_and_says_so(signed, capsys):
    src, dst, root, key = signed
    good = dst.get_document(key)
    src.put_document(key, _edit(good, _flip_signature), overwrite=True)
    assert main(["sync", src.root, dst.root, "--ref", "models/m"]) == 0
    out = capsys.readouterr().out
    assert dst.get_document(key) == good
    (line,) = [x for x in out.splitlines() if "signature left behind" in x]
    assert key in line and "does not verify" in line


def test_a_tier_sweep_keeps_the_tiers_valid_signature(tmp_path, ckpt, keys):
    from concord.tiering.engine import add_checkpoint, sweep
    from concord.tiering.policy import TierPolicy

    policy = TierPolicy.from_dict(
        {
            "namespace": "run1",
            "hot": {"store": str(tmp_path / "hot"), "keep": 1},
            "warm": {"store": str(tmp_path / "warm"), "keep": 2, "media": "nas"},
            "cold": {"store": str(tmp_path / "cold"), "media": "tape", "offsite": True},
            "ready": {"settle": 0},
        }
    )
    added = add_checkpoint(policy, ckpt, "step-1", gc=False)
    hot, warm = policy.tier("hot").open(), policy.tier("warm").open()
    sign_root(hot, added.root, keys["alice"])
    key = signature_key(added.root, keys["alice"].id)
    good = hot.get_document(key)
    warm.put_document(key, good)
    hot.put_document(key, _edit(good, _edit_payload), overwrite=True)
    warm.delete_ref(policy.ref("step-1"), added.root)  # the warm copy is missing: the sweep copies it again
    r = sweep(policy, gc=False)
    assert any(c["tier"] == "warm" for c in r.copied)
    assert warm.get_document(key) == good
    assert len(r.signatures_skipped) == 1 and key in r.signatures_skipped[0]


@pytest.mark.parametrize("curve", ["SECP256R1", "SECP384R1", "SECP521R1"])
def test_the_key_is_recovered_from_the_signature_alone(curve):
    from cryptography.hazmat.primitives.asymmetric import ec

    from concord.trust.keys import PublicKey, SigningKey

    k = ec.generate_private_key(getattr(ec, curve)())
    key = SigningKey(k, PublicKey.of(k.public_key()))
    sig = key.sign(b"message")
    assert recover_key(sig, b"message", key.id).id == key.id
    assert recover_key(sig, b"massage", key.id) is None
    assert recover_key(sig, b"message", "0" * 64) is None
    assert recover_key(b"\x30\x00", b"message", key.id) is None
