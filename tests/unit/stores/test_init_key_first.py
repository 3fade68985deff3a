"""``concord init --encrypt --key-file NEW``: the key is on disk before anything of the store is,
so a store never names a key that was not written."""

from __future__ import annotations

import json
import os

import pytest

import concord.files
from concord.cli import main
from concord.stores import LocalDirStore
from concord.stores.config import KEY_FILE_ENV, read_config


@pytest.fixture(autouse=True)
def _no_key_env(monkeypatch):
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)


def _init(capsys, store, key) -> tuple[int, str]:
    code = main(["init", str(store), "--encrypt", "--key-file", str(key)])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("where", ["parent is a file", "parent is missing"])
def test_a_key_that_cannot_be_written_leaves_nothing_of_the_store(tmp_path, capsys, where):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where a folder should be")
    key = blocker / "store.key" if where == "parent is a file" else tmp_path / "no-such-folder" / "store.key"
    store = tmp_path / "store"
    code, err = _init(capsys, store, key)
    assert code != 0 and "\n" not in err
    assert f"cannot write the new key file {key}" in err and "nothing of the store was written" in err
    assert not store.exists()  # no folder, no config: the store can still be made
    good = tmp_path / "store.key"
    code, err = _init(capsys, store, good)
    assert code == 0 and good.exists()
    assert read_config(LocalDirStore(store, create=False)).encrypted
    assert main(["refs", str(store), "--key-file", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["refs"] == []


def test_the_key_is_flushed_to_disk_before_the_config_is_written(tmp_path, capsys, monkeypatch):
    events: list[str] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link
    real_rename_new = concord.files.rename_new

    def fsync(fd):
        events.append(f"fsync {os.readlink(f'/proc/self/fd/{fd}')}")
        return real_fsync(fd)

    def link(src, dst, *a, **kw):
        events.append(f"name {dst}")
        return real_link(src, dst, *a, **kw)

    def replace(src, dst, *a, **kw):
        events.append(f"name {dst}")
        return real_replace(src, dst, *a, **kw)

    def rename_new(src, dst):
        named = real_rename_new(src, dst)
        if named:
            events.append(f"name {dst}")
        return named

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(concord.files, "rename_new", rename_new)
    monkeypatch.setattr(os, "replace", replace)
    key, store = tmp_path / "keys" / "store.key", tmp_path / "store"
    key.parent.mkdir()
    code, err = _init(capsys, store, key)
    assert code == 0, err
    named_key = events.index(f"name {key}")
    named_config = events.index(f"name {store / 'config'}")
    flushed_key = [i for i, e in enumerate(events) if e.startswith(f"fsync {key.parent}/")]
    assert flushed_key and flushed_key[0] < named_key  # the key's bytes, before its name
    assert f"fsync {key.parent}" in events[named_key:named_config]  # its folder, before the config
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_a_refused_init_leaves_no_new_key_behind(tmp_path, capsys):
    store, key = tmp_path / "store", tmp_path / "store.key"
    assert main(["init", str(store), "--compress", "zstd"]) == 0
    capsys.readouterr()
    code, err = _init(capsys, store, key)
    assert code != 0 and "already configured" in err
    assert not key.exists()
    assert not read_config(LocalDirStore(store, create=False)).encrypted
