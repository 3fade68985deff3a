"""``concord sign``, ``keys generate``, ``--trust`` and ``--signature`` at the command line:
the acceptance path with the real ``model_signing`` CLI, and each bad input as one clear line,
a non-zero exit and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from concord.cli import main

#: the real model_signing command line, installed beside the interpreter by the package
OMS_CLI = str(Path(sys.executable).with_name("model_signing"))


def oms(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([OMS_CLI, *argv], capture_output=True, text=True)


def run(capsys, *argv):
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def written(store) -> list:
    """Every object a store folder holds (chunks, manifests, refs, signatures)."""
    return [p for p in store.rglob("*") if p.is_file() and p.parts[-2:-1] != ("gc",) and "leases" not in p.parts] if store.exists() else []


def one_line_error(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("concord: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_acceptance_sign_restore_verify_with_model_signing(capsys, model, keydir, tmp_path, monkeypatch):
    c1, c2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    code, snap, _ = run(capsys, "snapshot", str(model), "--store", c1, "--ref", "models/m")
    code, signed, _ = run(capsys, "sign", c1, "--ref", "models/m", "--key", str(keydir / "ossl.pem"), "--out", str(tmp_path / "m.sig"))
    assert code == 0 and signed["root"] == snap["root"]
    code, _, err = run(capsys, "restore", c1, "--ref", "models/m", str(tmp_path / "out"), "--trust", str(keydir / "ossl.pub.pem"))
    assert code == 0, err
    ok = oms("verify", "key", str(tmp_path / "out"), "--signature", str(tmp_path / "m.sig"), "--public_key", str(keydir / "ossl.pub.pem"))
    assert ok.returncode == 0 and "Verification succeeded" in ok.stdout, ok.stderr
    # (another key fails in model_signing: tests/unit/trust/test_interop.py, in process)
    # sync carries the signature; verify and log report it
    monkeypatch.setenv("CONCORD_TRUSTED_KEYS", str(keydir / "ossl.pub.pem"))
    code, _, err = run(capsys, "sync", c1, c2, "--ref", "models/m")
    assert code == 0, err
    code, ver, _ = run(capsys, "verify", c2, "--ref", "models/m")
    assert code == 0 and ver["trusted"] is True and ver["signed_by"] == [signed["key_id"]]
    code, log, _ = run(capsys, "log", c2, "models/m")
    assert log["history"][0]["signed_by"] == [signed["key_id"]]


def test_model_signing_signed_folder_is_accepted_by_snapshot(capsys, model, keydir, tmp_path):
    sig = tmp_path / "model.sig"
    r = oms("sign", "key", str(model), "--signature", str(sig), "--private_key", str(keydir / "alice.pem"))
    assert r.returncode == 0, r.stderr
    c1 = str(tmp_path / "c1")
    code, snap, err = run(
        capsys, "snapshot", str(model), "--store", c1, "--ref", "models/m", "--signature", str(sig), "--trust", str(keydir / "alice.pub.pem")
    )
    assert code == 0, err
    code, ver, _ = run(capsys, "verify", c1, "--ref", "models/m", "--trust", str(keydir / "alice.pub.pem"))
    assert code == 0 and ver["trusted"] and ver["signed_by"] == snap["signed_by"]
    # signed by a key that is not trusted: refused, nothing kept, no ref
    c2 = str(tmp_path / "c2")
    code, _, err = run(capsys, "snapshot", str(model), "--store", c2, "--ref", "models/m", "--signature", str(sig), "--trust", str(keydir / "ossl.pub.pem"))
    assert code == 13
    one_line_error(err, str(sig), "not among the keys given")
    assert [p for p in written(tmp_path / "c2") if "refs" in p.parts or "signatures" in p.parts] == []


@pytest.fixture
def signed_store(capsys, model, keydir, tmp_path):
    c1 = str(tmp_path / "c1")
    run(capsys, "snapshot", str(model), "--store", c1, "--ref", "models/m")
    code, signed, _ = run(capsys, "sign", c1, "--ref", "models/m", "--key", str(keydir / "alice.pem"))
    assert code == 0
    return c1, signed


def test_bad_inputs_each_one_line_nonzero_nothing_written(capsys, signed_store, keydir, tmp_path, model):
    c1, signed = signed_store
    alice, mallory = str(keydir / "alice.pub.pem"), str(keydir / "mallory.pub.pem")
    out = tmp_path / "out"
    # a wrong key
    code, _, err = run(capsys, "restore", c1, "--ref", "models/m", str(out), "--trust", mallory)
    assert code == 13 and not out.exists()
    one_line_error(err, signed["root"], "keys tried", "not among the keys given")
    # a tampered bundle
    sig = next((tmp_path / "c1" / "signatures").rglob("*.sig"))
    good = sig.read_bytes()
    sig.write_bytes(good.replace(b'"sig": "', b'"sig": "AAAA', 1))
    code, _, err = run(capsys, "restore", c1, "--ref", "models/m", str(out), "--trust", alice)
    assert code == 13 and not out.exists()
    one_line_error(err, "not signed by a trusted key")
    # a truncated bundle
    sig.write_bytes(good[:100])
    code, _, err = run(capsys, "restore", c1, "--ref", "models/m", str(out), "--trust", alice)
    assert code == 13 and not out.exists()
    one_line_error(err, "not signed by a trusted key")
    sig.write_bytes(good)
    # a signature over another root: moved onto a second snapshot
    (model / "config.json").write_text("{}")
    code, other, _ = run(capsys, "snapshot", str(model), "--store", c1, "--ref", "models/n")
    (tmp_path / "c1" / "signatures" / other["root"]).mkdir()
    sig.rename(tmp_path / "c1" / "signatures" / other["root"] / sig.name)
    code, _, err = run(capsys, "sync", c1, str(tmp_path / "c2"), "--ref", "models/n", "--trust", alice)
    assert code == 13 and written(tmp_path / "c2") == []
    one_line_error(err, f"signs root {signed['root']}, not {other['root']}")


def test_bad_keys_at_the_command_line(capsys, signed_store, keydir, tmp_path, monkeypatch):
    c1, _ = signed_store
    before = sorted(p.name for p in (tmp_path / "c1" / "signatures").rglob("*"))
    subprocess.run(["openssl", "genpkey", "-algorithm", "ED25519", "-out", str(tmp_path / "ed.pem")], check=True)
    code, _, err = run(capsys, "sign", c1, "--ref", "models/m", "--key", str(tmp_path / "ed.pem"))
    assert code == 1
    one_line_error(err, "Ed25519 key is not supported", "P-256")
    monkeypatch.setenv("PW", "pw")
    code, _, err = run(capsys, "keys", "generate", str(tmp_path / "enc.pem"), "--password-env", "PW")
    assert code == 0
    monkeypatch.delenv("CONCORD_KEY_PASSWORD", raising=False)
    code, _, err = run(capsys, "sign", c1, "--ref", "models/m", "--key", str(tmp_path / "enc.pem"))
    assert code == 12
    one_line_error(err, "enc.pem", "protected by a password", "CONCORD_KEY_PASSWORD")
    assert sorted(p.name for p in (tmp_path / "c1" / "signatures").rglob("*")) == before
    code, signed, _ = run(capsys, "sign", c1, "--ref", "models/m", "--key", str(tmp_path / "enc.pem"), "--key-password-env", "PW")
    assert code == 0 and len(signed["key_id"]) == 64


def test_verify_lists_signatures_without_a_policy(capsys, signed_store, monkeypatch):
    c1, signed = signed_store
    monkeypatch.delenv("CONCORD_TRUSTED_KEYS", raising=False)
    code, ver, _ = run(capsys, "verify", c1, "--ref", "models/m")
    # nothing is verified without a policy: the document is listed as unchecked, its key never named a signer
    assert code == 0 and ver["signed_by"] is None and ver["unchecked"] == [signed["key_id"]] and ver["trusted"] is None
