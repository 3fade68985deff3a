"""Commands that open two stores give each its own key: plain → encrypted(A) → encrypted(B) →
plain, the same root everywhere and the same bytes restored; a missing or wrong key is one line
naming the store and the option that gives it, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_checkpoints import files_equal

from concord.cli import main
from concord.stores import LocalDirStore
from concord.stores.cipher import read_key_file


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def chain(tmp_path, ckpt, capsys, monkeypatch):
    """A plain store holding ``models/m`` and two empty encrypted, compressed stores A and B, each
    with its own key file."""
    monkeypatch.delenv("CONCORD_KEY_FILE", raising=False)
    plain, a, b = tmp_path / "plain", tmp_path / "enc-a", tmp_path / "enc-b"
    ka, kb = tmp_path / "a.key", tmp_path / "b.key"
    for store, key in ((a, ka), (b, kb)):
        assert run(capsys, "init", store, "--compress", "auto", "--encrypt", "--key-file", key)[0] == 0
    assert run(capsys, "snapshot", ckpt, "--store", plain, "--ref", "models/m", "--chunk-size", "64K")[0] == 0
    return plain, a, b, ka, kb


def _root(path: Path, key: Path | None = None) -> str:
    store = LocalDirStore(path)
    if key is not None:
        store.unlock(read_key_file(str(key)))
    return store.read_ref("models/m").root


def test_sync_through_two_encrypted_stores_with_their_own_keys(chain, ckpt, tmp_path, capsys):
    plain, a, b, ka, kb = chain
    back = tmp_path / "back"
    code, out, err = run(capsys, "sync", plain, a, "--ref", "models/m", "--target-key-file", ka)
    assert code == 0, err
    assert " raw);" in out  # compressed at A: the raw bytes the sent ones stand for are shown too
    code, out, err = run(capsys, "sync", a, b, "--ref", "models/m", "--source-key-file", ka, "--target-key-file", kb, "--json")
    assert code == 0, err
    target = json.loads(out)["targets"][0]
    assert target["chunks_sent"] > 0 and target["bytes_sent"] < target["raw_bytes_sent"]
    code, out, err = run(capsys, "sync", b, back, "--ref", "models/m", "--source-key-file", kb)
    assert code == 0, err
    assert "sent" in out and "raw" not in out  # a plain target: what was sent is the raw bytes

    root = _root(plain)
    assert _root(a, ka) == _root(b, kb) == _root(back) == root
    code, out, err = run(capsys, "diff", plain, "models/m", "--against", b, "models/m", "--against-key-file", kb)
    assert (code, out.strip()) == (0, f"same snapshot {root}"), err
    for store, key in ((back, None), (b, kb)):
        dest = tmp_path / f"restored-{store.name}"
        code, _, err = run(capsys, "restore", store, "--ref", "models/m", dest, *(["--key-file", key] if key else []))
        assert code == 0, err
        assert files_equal(ckpt, dest)


def test_a_missing_or_wrong_key_names_the_store_and_its_option(chain, capsys):
    plain, a, b, ka, kb = chain
    assert run(capsys, "sync", plain, a, "--ref", "models/m", "--target-key-file", ka)[0] == 0

    code, _, err = run(capsys, "sync", a, b, "--ref", "models/m", "--target-key-file", kb)
    assert code == 12 and len(err.strip().splitlines()) == 1
    assert f"store {a} is encrypted: no key was given. Give its key file with --source-key-file FILE" in err

    code, _, err = run(capsys, "sync", a, b, "--ref", "models/m", "--source-key-file", ka, "--target-key-file", ka)
    assert code == 12 and len(err.strip().splitlines()) == 1
    assert f"store {b} is encrypted: the key from --target-key-file {ka}" in err and "is not this store's key" in err
    assert "Give its key file with --target-key-file FILE" in err

    # --key-file is what a store without a key of its own takes: here A's, which is not B's
    code, _, err = run(capsys, "sync", a, b, "--ref", "models/m", "--key-file", ka)
    assert code == 12 and f"store {b} is encrypted: the key of --key-file / $CONCORD_KEY_FILE" in err

    code, _, err = run(capsys, "sync", a, b, "--ref", "models/m", "--source-key-file", a / "nowhere.key", "--target-key-file", kb)
    assert code == 12 and "--source-key-file: cannot read key file" in err

    store_b = LocalDirStore(b)
    store_b.unlock(read_key_file(str(kb)))
    assert store_b.list_refs() == [] and list(store_b.iter_chunks()) == []  # nothing written to B


def test_verify_repairs_from_a_store_with_another_key(chain, capsys):
    plain, a, b, ka, kb = chain
    assert run(capsys, "sync", plain, a, b, "--ref", "models/m", "--target-key-file", ka)[0] == 12  # B's key is not A's
    assert run(capsys, "sync", plain, a, "--ref", "models/m", "--target-key-file", ka)[0] == 0
    assert run(capsys, "sync", a, b, "--ref", "models/m", "--source-key-file", ka, "--target-key-file", kb)[0] == 0
    chunk = next(p for p in (b / "chunks").rglob("*") if p.is_file())
    chunk.unlink()  # one chunk lost in B
    code, out, err = run(capsys, "verify", b, "--ref", "models/m", "--key-file", kb, "--repair-from", a, "--repair-key-file", kb)
    assert code == 12 and f"store {a} is encrypted" in err and "--repair-key-file" in err
    code, out, err = run(capsys, "verify", b, "--ref", "models/m", "--key-file", kb, "--repair-from", a, "--repair-key-file", ka, "--json")
    assert code == 0, err
    assert len(json.loads(out)["repaired"]) == 1


def test_audit_replicas_and_cards_give_each_store_its_own_key(chain, capsys):
    plain, a, b, ka, kb = chain
    for store, key in ((a, ka), (b, kb)):
        assert run(capsys, "sync", plain, store, "--ref", "models/m", "--target-key-file", key)[0] == 0
    code, out, err = run(capsys, "audit", "replicas", "--ref", "models/m", plain, a, b,
                         "--store-key", f"{a}={ka}", "--store-key", f"{b}={kb}", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["severity"] == "ok", report
    code, out, err = run(capsys, "audit", "cards", "--ref", "models/m", a, b, "--store-key", f"{a}={ka}", "--store-key", f"{b}={kb}")
    assert code == 3 and "no model card" in err and "key" not in err, err  # read with the keys: the toy has no card
    # a store's key that is not its own is one line naming the store and the option
    code, out, err = run(capsys, "audit", "replicas", "--ref", "models/m", a, b, "--store-key", f"{a}={kb}", "--store-key", f"{b}={kb}")
    assert code == 12 and len(err.strip().splitlines()) == 1
    assert str(a) in err and f"--store-key {a}=FILE" in err and "not this store's key" in err
    # a pair naming no compared store, or no file, is refused before anything is read
    code, out, err = run(capsys, "audit", "replicas", "--ref", "models/m", a, b, "--store-key", f"{plain}={ka}")
    assert code != 0 and "is not one of the stores compared" in err
    code, out, err = run(capsys, "audit", "replicas", "--ref", "models/m", a, b, "--store-key", str(ka))
    assert code != 0 and "give STORE=FILE" in err
