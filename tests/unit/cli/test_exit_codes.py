"""The CLI's exit status tells the kind of failure apart (README "Exit codes"), each on a real case:
10 no store or not found, 11 locked or busy, 12 wrong key, 13 untrusted, 14 unreachable,
15 damaged data, 2 a usage error; the message stays one line."""

from __future__ import annotations

import pytest
from servers import free_port

from concord.cli import main
from concord.serving.versions import Layout
from concord.stores import LocalDirStore
from concord.stores.cipher import write_key_file
from concord.stores.config import configure


def run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 0 or (err.startswith("concord: error: ") and err.count("\n") == 1), err
    return code, err


@pytest.fixture
def store(tmp_path, ckpt, capsys):
    path = tmp_path / "s"
    assert run(capsys, "snapshot", ckpt, "--store", path, "--ref", "models/m")[0] == 0
    return path


def test_no_store_and_not_found_are_10(tmp_path, store, capsys):
    code, err = run(capsys, "refs", tmp_path / "typo")
    assert code == 10 and "no Concord store" in err
    code, err = run(capsys, "restore", store, "--ref", "models/nope", tmp_path / "out")
    assert code == 10 and "no ref 'models/nope'" in err


def test_a_busy_checkout_is_11(tmp_path, store, capsys):
    dest = tmp_path / "srv" / "current"
    with Layout.of(str(dest)).locked(1.0):
        code, err = run(capsys, "checkout", store, "--ref", "models/m", dest, "--wait", "0.2")
    assert code == 11 and "another checkout" in err


def test_a_wrong_key_is_12(tmp_path, ckpt, capsys):
    path, key, wrong = tmp_path / "sealed", tmp_path / "k", tmp_path / "wrong"
    write_key_file(str(key), bytes(range(32)))
    write_key_file(str(wrong), bytes(range(1, 33)))
    sealed = LocalDirStore(path)
    sealed.unlock(bytes(range(32)))
    configure(sealed, encrypt=True)
    assert run(capsys, "snapshot", ckpt, "--store", path, "--ref", "m", "--key-file", key)[0] == 0
    code, err = run(capsys, "refs", path, "--key-file", wrong)
    assert code == 12 and "not this store's key" in err
    code, err = run(capsys, "refs", path)
    assert code == 12 and "no key was given" in err


def test_an_untrusted_root_is_13(tmp_path, store, capsys):
    assert run(capsys, "keys", "generate", tmp_path / "k.pem", "--public", tmp_path / "k.pub.pem")[0] == 0
    code, err = run(capsys, "restore", store, "--ref", "models/m", tmp_path / "out", "--trust", tmp_path / "k.pub.pem")
    assert code == 13 and "not signed by a trusted key" in err and not (tmp_path / "out").exists()


def test_an_unreachable_store_is_14(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    code, err = run(capsys, "refs", "s3://no-server-here/p")
    assert code == 14 and "unreachable" in err


def test_damaged_data_is_15(tmp_path, store, capsys):
    chunk = next((store / "chunks").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    chunk.write_bytes(b"not the bytes this chunk is named by")
    code, err = run(capsys, "restore", store, "--ref", "models/m", tmp_path / "out")
    assert code == 15 and "verify" in err


def test_a_usage_error_is_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["restore", "--no-such-option"])
    assert exit_.value.code == 2
