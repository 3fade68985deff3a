"""``--trust`` lists that mix PEM paths and ``SOURCE:NAME`` entries, and ``--key SOURCE:NAME``,
through :func:`register_trust_source` (no Prefect: a source registered here stands for ``block``)."""

from __future__ import annotations

import json

import pytest

from concord.cli import main
from concord.errors import KeyFileError, TrustPolicyError
from concord.trust import (
    SOURCE_GROUP,
    TrustPolicy,
    load_policy,
    load_public_key,
    load_signing_key,
    load_signing_key_spec,
    register_trust_source,
)
from concord.trust import policy as policy_module


@pytest.fixture
def vault(keydir, monkeypatch):
    """A ``vault:NAME`` source: ``alice`` trusts alice's key, ``both`` returns a policy of alice and
    ossl, ``empty`` lists none; ``alice`` also signs with alice's key."""
    monkeypatch.setattr(policy_module, "_SOURCES", policy_module._SOURCES.copy())
    monkeypatch.setattr(policy_module, "_SIGNERS", policy_module._SIGNERS.copy())
    asked: list[str] = []

    def trusted(name: str):
        asked.append(name)
        if name == "both":
            return TrustPolicy.from_paths([keydir / "alice.pub.pem", keydir / "ossl.pub.pem"])
        return {"alice": [(keydir / "alice.pub.pem").read_text()], "empty": []}[name]

    def signing(name: str):
        if name != "alice":
            raise KeyFileError(f"vault:{name}", "the vault has no signing key")
        return load_signing_key(keydir / "alice.pem")

    register_trust_source("vault", trusted=trusted, signing=signing)
    return asked


def test_a_list_mixes_paths_and_sources(vault, keydir):
    alice, mallory, ossl = (load_public_key(keydir / f"{k}.pub.pem").id for k in ("alice", "mallory", "ossl"))
    p = load_policy(f" {keydir / 'mallory.pub.pem'} , vault:alice,vault:both ")
    assert p.key_ids == (mallory, alice, ossl) and p.source == "--trust"  # in order, each key once
    assert vault == ["alice", "both"]
    env = load_policy(None, environ={"CONCORD_TRUSTED_KEYS": "vault:alice"})
    assert env.key_ids == (alice,) and env.source == "CONCORD_TRUSTED_KEYS"


def test_a_source_that_names_no_key_fails_naming_it(vault, keydir):
    with pytest.raises(TrustPolicyError, match=r"trust policy from vault:empty: it lists no trusted key\. Add"):
        load_policy(f"{keydir / 'alice.pub.pem'},vault:empty")
    with pytest.raises(TrustPolicyError, match=r"vault:: no name after 'vault:'"):
        load_policy("vault:")
    with pytest.raises(TrustPolicyError, match=r"there is no trust source 'nosuch'.*vault:NAME"):
        load_policy("nosuch:x")


def test_paths_are_still_paths(vault, keydir, tmp_path, monkeypatch):
    """A drive letter, a colon inside a folder name, or an existing file whose name looks like an
    entry of an unknown source are paths."""
    odd = tmp_path / "keys:2024"
    odd.mkdir()
    (odd / "a.pem").write_bytes((keydir / "alice.pub.pem").read_bytes())
    alice = load_public_key(keydir / "alice.pub.pem").id
    assert load_policy(str(odd / "a.pem")).key_ids == (alice,)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old:alice.pem").write_bytes((keydir / "alice.pub.pem").read_bytes())
    assert load_policy("old:alice.pem").key_ids == (alice,)
    with pytest.raises(KeyFileError, match=r"key C:\\k\.pem: no such file"):
        load_policy("C:\\k.pem")


def test_a_signing_key_from_a_source(vault, keydir):
    assert load_signing_key_spec("vault:alice").id == load_public_key(keydir / "alice.pub.pem").id
    assert load_signing_key_spec(str(keydir / "ossl.pem")).id == load_public_key(keydir / "ossl.pub.pem").id
    with pytest.raises(KeyFileError, match="vault:bob: the vault has no signing key"):
        load_signing_key_spec("vault:bob")
    with pytest.raises(KeyFileError, match="no signing-key source 'nosuch'"):
        load_signing_key_spec("nosuch:x")


def test_the_block_source_is_an_entry_point():
    """``block`` reaches the blocks package through the installed entry points (pip install -e .)."""
    from importlib.metadata import entry_points

    assert {ep.name: ep.value for ep in entry_points(group=SOURCE_GROUP)}["block"] == "concord_pipelines.blocks.trust:trusted_keys_of_block"
    assert {ep.name: ep.value for ep in entry_points(group="concord.signing_key_sources")}["block"] == "concord_pipelines.blocks.trust:signing_key_of_block"


def test_the_command_line_signs_and_trusts_through_a_source(vault, keydir, model, tmp_path, capsys):
    store = str(tmp_path / "s")
    assert main(["snapshot", str(model), "--store", store, "--ref", "models/m", "--json"]) == 0
    capsys.readouterr()
    code = main(["restore", store, "--ref", "models/m", str(tmp_path / "no"), "--trust", "vault:alice"])
    err = capsys.readouterr().err
    assert code != 0 and "is not signed by a trusted key (it has no signature)" in err, err
    assert not (tmp_path / "no").exists()
    assert main(["sign", store, "--ref", "models/m", "--key", "vault:alice", "--json"]) == 0
    signed = json.loads(capsys.readouterr().out)
    assert signed["key_id"] == load_public_key(keydir / "alice.pub.pem").id
    assert main(["restore", store, "--ref", "models/m", str(tmp_path / "out"), "--trust", f"{keydir / 'mallory.pub.pem'},vault:alice"]) == 0
    assert (tmp_path / "out" / "config.json").exists()
    capsys.readouterr()
    assert main(["restore", store, "--ref", "models/m", str(tmp_path / "bad"), "--trust", "vault:empty"]) != 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "vault:empty: it lists no trusted key" in lines[0], lines
    assert not (tmp_path / "bad").exists()
