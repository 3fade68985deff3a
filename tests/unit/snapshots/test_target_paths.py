"""One check for every path Concord writes from a manifest or an S3 listing (restore, checkout,
staging), with one message: relative, normalised, no control character, and, where links may be
in the folder already, not led outside it by one."""

from __future__ import annotations

import os

import pytest

from concord.errors import UnsafePathError
from concord.hashing import chunk_id
from concord.serving.checkout import checkout
from concord.snapshots.manifest import Manifest, make_file, make_part
from concord.snapshots.paths import CONTROL_REASON, OUTSIDE_REASON, relative_path, target_path, target_paths
from concord.snapshots.restore import restore
from concord.stores.local import LocalDirStore
from concord.text import control_char

BAD = [
    ("", "empty path"),
    ("../up.txt", "'..' segments"),
    ("a/../../up.txt", "'..' segments"),
    ("a/./b", "'.' and '..'"),
    ("a//b", "empty, '.'"),
    ("/etc/passwd", "absolute paths"),
    ("C:/x", "absolute paths"),
    ("a\\..\\b", "backslashes"),
    ("nul\x00.txt", "NUL bytes"),
    ("evil\nname.txt", "control character"),
    ("esc\x1b]0;pwned\x07.txt", "control character"),
    ("del\x7f.txt", "control character"),
]


@pytest.mark.parametrize(("path", "reason"), BAD)
def test_unsafe_paths_are_refused_naming_the_path(path, reason, tmp_path):
    with pytest.raises(UnsafePathError, match=reason) as exc:
        target_path(path, str(tmp_path))
    assert exc.value.path == path


def test_the_error_can_name_what_the_user_knows_instead():
    with pytest.raises(UnsafePathError) as exc:
        relative_path("a/../b", shown="s3://bucket/ckpt/a/../b")
    assert exc.value.path == "s3://bucket/ckpt/a/../b" and "'..'" in exc.value.reason
    with pytest.raises(UnsafePathError) as exc:
        relative_path("x\ny", shown="ckpt/x\ny")
    assert (exc.value.path, exc.value.reason) == ("ckpt/x\ny", CONTROL_REASON)


@pytest.mark.parametrize("code", [*range(0x80), 0x85, 0xA0, 0x2028, 0x1F600])
def test_a_name_holds_a_control_character_exactly_where_it_holds_c0_or_del(code):
    ch = chr(code)
    expected = ch if code < 0x20 or code == 0x7F else None
    for name in (f"a{ch}b.bin", f"\u00e9t\u00e9/{ch}", ch):
        assert control_char(name) == expected, (hex(code), name)
    assert control_char("caf\u00e9\x1b.txt") == "\x1b" and control_char("caf\u00e9.txt") is None


def test_safe_paths_land_under_the_folder(tmp_path):
    base = os.path.realpath(tmp_path)
    assert target_paths(["a.txt", "sub/dir/b.bin", "..x", "x.."], tmp_path) == [
        os.path.join(base, "a.txt"),
        os.path.join(base, "sub", "dir", "b.bin"),
        os.path.join(base, "..x"),
        os.path.join(base, "x.."),
    ]


def test_a_link_in_the_folder_leading_outside_is_refused_when_resolving(tmp_path):
    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    (base / "inner").mkdir()
    os.symlink(outside, base / "sub")
    os.symlink(base / "inner", base / "ok")
    real = os.path.realpath(base)
    # a folder just made holds no link: the path is used as it is
    assert target_path("sub/model.bin", real) == os.path.join(real, "sub", "model.bin")
    with pytest.raises(UnsafePathError) as exc:
        target_path("sub/model.bin", real, resolve=True)
    assert (exc.value.path, exc.value.reason) == ("sub/model.bin", OUTSIDE_REASON)
    # a link that stays inside is followed
    assert target_path("ok/x", real, resolve=True) == os.path.join(real, "inner", "x")


def _crafted(store: LocalDirStore, name: str) -> Manifest:
    data = b"payload"
    store.put_chunk(chunk_id(data), data)
    part = make_part("data", "", 0, len(data), [chunk_id(data)])
    manifest = Manifest.build(1 << 20, [make_file(n, len(data), "blob", [part]) for n in ("ok.txt", name)])
    store.put_manifest(manifest.root, manifest.to_json())
    return manifest


@pytest.mark.parametrize("name", ["../escape.txt", "/abs.txt", "bell\x07.txt"])
def test_restore_and_checkout_refuse_the_same_path_with_the_same_message(name, tmp_path):
    store = LocalDirStore(tmp_path / "s")
    manifest = _crafted(store, name)
    with pytest.raises(UnsafePathError) as by_restore:
        restore(store, manifest, tmp_path / "out")
    with pytest.raises(UnsafePathError) as by_checkout:
        checkout(store, manifest, tmp_path / "serve" / "current")
    assert str(by_restore.value) == str(by_checkout.value)
    assert by_restore.value.path == name
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()
    assert not os.path.lexists(tmp_path / "serve" / "current")
