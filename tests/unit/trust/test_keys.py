from __future__ import annotations

import subprocess

import pytest

from concord.errors import KeyFileError, KeyPasswordError, UnsupportedKeyError
from concord.trust import generate_key, load_public_key, load_signing_key
from concord.trust.bundle import pae


def test_openssl_key_signs_and_its_public_half_verifies(keydir):
    key = load_signing_key(keydir / "ossl.pem")
    pub = load_public_key(keydir / "ossl.pub.pem")
    assert key.id == pub.id and len(key.id) == 64
    sig = key.sign(pae(b"{}"))
    assert pub.verify(sig, pae(b"{}"))
    assert not pub.verify(sig, pae(b"{ }"))
    assert not load_public_key(keydir / "alice.pub.pem").verify(sig, pae(b"{}"))
    # a private key given as a trusted key stands for its public half
    assert load_public_key(keydir / "ossl.pem").id == pub.id


def test_password_protected_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PW", "s3cret")
    generate_key(tmp_path / "k.pem", password="s3cret")
    with pytest.raises(KeyPasswordError, match="protected by a password and none was given"):
        load_signing_key(tmp_path / "k.pem", password="")
    with pytest.raises(KeyPasswordError, match="password does not open it"):
        load_signing_key(tmp_path / "k.pem", password="wrong")
    assert load_signing_key(tmp_path / "k.pem", password="s3cret").id == load_public_key(tmp_path / "k.pub.pem").id
    # openssl's own encrypted keys too
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes256", "-pass", "pass:pw", "-out", str(tmp_path / "o.pem")],
        check=True,
    )
    assert load_signing_key(tmp_path / "o.pem", password="pw").public.key.curve.name == "secp256r1"
    monkeypatch.setenv("CONCORD_KEY_PASSWORD", "pw")
    assert load_signing_key(tmp_path / "o.pem").id


@pytest.mark.parametrize(
    "args, kind",
    [
        (["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"], "RSA"),
        (["genpkey", "-algorithm", "ED25519"], "Ed25519"),
        (["ecparam", "-name", "secp256k1", "-genkey", "-noout"], "secp256k1"),
    ],
)
def test_unsupported_key_types_are_refused(tmp_path, args, kind):
    p = tmp_path / "k.pem"
    subprocess.run(["openssl", *args, "-out", str(p)], check=True, capture_output=True)
    with pytest.raises(UnsupportedKeyError, match=f"{kind}.*not supported.*P-256"):
        load_signing_key(p)
    with pytest.raises(UnsupportedKeyError):
        load_public_key(p)


def test_bad_key_files(tmp_path, keydir):
    with pytest.raises(KeyFileError, match="no such file"):
        load_signing_key(tmp_path / "nope.pem")
    (tmp_path / "junk.pem").write_text("hello")
    with pytest.raises(KeyFileError, match="not a PEM private key"):
        load_signing_key(tmp_path / "junk.pem")
    with pytest.raises(KeyFileError, match="it is a public key"):
        load_signing_key(keydir / "alice.pub.pem")
    with pytest.raises(KeyFileError, match="exists already"):
        generate_key(keydir / "alice.pem")
