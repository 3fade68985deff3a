"""``--trust block:NAME`` and ``--key block:NAME`` at the command line, against a saved Concord
Trust block on a real temporary Prefect server: a root the block's key did not sign is refused,
``concord sign --key block:NAME`` writes a signature that then verifies, and a missing block, a
block without keys or without a signing key, or a Prefect API that does not answer is one line,
a non-zero exit and nothing written."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from servers import free_port

from concord.cli import main
from concord.trust import generate_key

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(120)]

REF = "models/m"


@pytest.fixture
def saved(tmp_path) -> dict:
    """A Trust block with one trusted key and its signing key, and one with neither (names, key id)."""
    from prefect.blocks.system import Secret

    from concord_pipelines.blocks.trust import TrustBlock

    key = generate_key(tmp_path / "keys" / "deploy.pem")
    name = f"cli-trust-{uuid.uuid4().hex[:8]}"
    Secret(value=(tmp_path / "keys" / "deploy.pem").read_text()).save(f"{name}-key")
    TrustBlock(trusted_keys=[(tmp_path / "keys" / "deploy.pub.pem").read_text()], signing_key=Secret.load(f"{name}-key")).save(name)
    TrustBlock().save(f"{name}-empty")
    return {"name": name, "empty": f"{name}-empty", "key_id": key.id, "keys": tmp_path / "keys"}


@pytest.fixture
def store(tmp_path, capsys) -> Path:
    """A store with a small model under ``models/m``, unsigned."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(os.urandom(64 * 1024))
    (model / "config.json").write_text('{"hidden": 8}')
    s = tmp_path / "store"
    assert main(["snapshot", str(model), "--store", str(s), "--ref", REF, "--json"]) == 0
    capsys.readouterr()
    return s


def run(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def one_line(err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("concord: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_restore_trusts_and_sign_signs_through_a_saved_block(saved, store, tmp_path, capsys, monkeypatch):
    block = f"block:{saved['name']}"
    code, _, err = run(capsys, "restore", str(store), "--ref", REF, str(tmp_path / "refused"), "--trust", block)
    assert code != 0
    one_line(err, "is not signed by a trusted key (it has no signature)", saved["key_id"][:16])
    assert not (tmp_path / "refused").exists()

    code, signed, err = run(capsys, "sign", str(store), "--ref", REF, "--key", block)
    assert code == 0, err
    assert signed["key_id"] == saved["key_id"]
    assert (store / signed["document"]).is_file()
    assert "PRIVATE KEY" not in json.dumps(signed) and "PRIVATE" not in err  # the key is never shown

    code, ver, err = run(capsys, "verify", str(store), "--ref", REF, "--trust", block)
    assert code == 0 and ver["trusted"] is True and ver["signed_by"] == [saved["key_id"]], err
    # a list may mix a PEM path and the block, here through CONCORD_TRUSTED_KEYS
    other = generate_key(tmp_path / "other.pem")
    monkeypatch.setenv("CONCORD_TRUSTED_KEYS", f"{other.public.source},{block}")
    code, _, err = run(capsys, "restore", str(store), "--ref", REF, str(tmp_path / "out"))
    assert code == 0, err
    assert (tmp_path / "out" / "config.json").read_text() == '{"hidden": 8}'


def test_a_missing_block_a_block_without_keys_and_no_api_are_one_line(saved, store, tmp_path, capsys):
    before = sorted(p for p in store.rglob("*"))
    missing = f"block:nosuch-{uuid.uuid4().hex[:6]}"
    code, _, err = run(capsys, "restore", str(store), "--ref", REF, str(tmp_path / "a"), "--trust", f"{saved['keys'] / 'deploy.pub.pem'},{missing}")
    assert code != 0
    one_line(err, f"trust policy from {missing}: there is no concord-trust block named", "TrustBlock(trusted_keys=")

    code, _, err = run(capsys, "restore", str(store), "--ref", REF, str(tmp_path / "b"), "--trust", f"block:{saved['empty']}")
    assert code != 0
    one_line(err, f"trust policy from block:{saved['empty']}: the block lists no trusted key", "trusted_keys")

    code, _, err = run(capsys, "sign", str(store), "--ref", REF, "--key", f"block:{saved['empty']}")
    assert code != 0
    one_line(err, f"key block:{saved['empty']}: the block has no signing key", "Secret block")
    code, _, err = run(capsys, "sign", str(store), "--ref", REF, "--key", missing)
    assert code != 0
    one_line(err, f"key {missing}: there is no concord-trust block named")

    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        code, _, err = run(capsys, "restore", str(store), "--ref", REF, str(tmp_path / "c"), "--trust", f"block:{saved['name']}")
    assert code == 14  # unreachable (README: exit codes)
    one_line(err, f"block:{saved['name']}: the Prefect API at http://127.0.0.1:", "did not answer within", "PREFECT_API_URL")

    assert not any((tmp_path / d).exists() for d in "abc")
    assert sorted(p for p in store.rglob("*")) == before  # nothing written to the store either
