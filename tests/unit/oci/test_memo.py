"""The digest memo of OCI exports: keyed by the bytes a file's chunk ids fix, read tolerantly
(nothing damaged is ever used), written atomically, bounded; and the upload check that holds a
remembered digest's last block back until the bytes hash to it."""

from __future__ import annotations

import hashlib
import os

import pytest

from concord.errors.oci import OciMemoContradictedError
from concord.hashing import chunk_id
from concord.oci import memo as memo_mod
from concord.oci.export import _checked
from concord.oci.memo import FORMAT, DigestMemo, content_key, resolve_memo
from concord.snapshots.manifest import make_file, make_part


def entry(path: str, *chunks: bytes, kind: str = "blob"):
    ids = [chunk_id(c) for c in chunks]
    size = sum(len(c) for c in chunks)
    return make_file(path, size, kind, [make_part("data", "", 0, size, ids)])


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_the_key_is_the_bytes_not_the_path():
    a = entry("a.bin", b"x" * 10, b"y" * 5)
    assert content_key(a) == content_key(entry("other/name.bin", b"x" * 10, b"y" * 5))
    assert content_key(a) != content_key(entry("a.bin", b"y" * 5, b"x" * 10))  # order
    assert content_key(a) != content_key(entry("a.bin", b"x" * 10, b"y" * 4))  # one byte less
    assert content_key(a) != content_key(entry("a.bin", b"x" * 10, b"z" * 5))  # one chunk other
    # the same bytes cut into parts otherwise: the same chunk ids in the same order, the same key
    split = make_file("a.bin", 15, "blob", [make_part("data", "p1", 0, 10, [chunk_id(b"x" * 10)]), make_part("data", "p2", 10, 5, [chunk_id(b"y" * 5)])])
    assert content_key(split) == content_key(a)


def test_entries_survive_a_new_instance_and_need_their_size(tmp_path):
    f = entry("a.bin", b"hello")
    memo = DigestMemo(tmp_path / "memo")
    assert memo.get(content_key(f), f.size) is None
    memo.put(content_key(f), f.size, digest(b"hello"))
    memo.save()
    again = DigestMemo(tmp_path / "memo")
    assert again.get(content_key(f), f.size) == digest(b"hello")
    assert again.get(content_key(f), f.size + 1) is None
    again.forget(content_key(f))
    again.save()
    assert DigestMemo(tmp_path / "memo").get(content_key(f), f.size) is None
    assert not [n for n in os.listdir(tmp_path / "memo") if n.startswith(".tmp-")]


def same_shard_keys(n: int, shard: str = "ab") -> list[str]:
    return [shard + hashlib.sha256(str(i).encode()).hexdigest()[:62] for i in range(n)]


def test_a_damaged_line_is_ignored_and_its_neighbours_kept(tmp_path):
    memo = DigestMemo(tmp_path)
    keys = same_shard_keys(3)
    for i, key in enumerate(keys):
        memo.put(key, 100 + i, digest(str(i).encode()))
    memo.save()
    shard = tmp_path / "ab"
    lines = shard.read_text().split("\n")
    assert lines[0] == FORMAT and len(lines) == 5
    damaged = lines[1].split(" ")
    damaged[2] = damaged[2][:-1] + ("0" if damaged[2][-1] != "0" else "1")  # one digit of the digest
    lines[1] = " ".join(damaged)
    lines[2] = lines[2] + " extra"
    shard.write_text("\n".join(lines))
    fresh = DigestMemo(tmp_path)
    found = {key: fresh.get(key, 100 + i) for i, key in enumerate(keys)}
    assert sorted(v is None for v in found.values()) == [False, True, True]


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b.replace(FORMAT.encode(), b"concord/oci-sha256@9", 1),  # another format
        lambda b: b"\xff" + b,  # not text
        lambda b: b[: len(FORMAT) - 3],  # cut inside the format line
        lambda b: b + b"x" * (memo_mod.MAX_SHARD_BYTES + 1),  # too large to be ours
    ],
)
def test_a_shard_that_is_not_a_memo_is_ignored_whole(tmp_path, damage):
    memo = DigestMemo(tmp_path)
    key = same_shard_keys(1)[0]
    memo.put(key, 7, digest(b"seven"))
    memo.save()
    shard = tmp_path / "ab"
    shard.write_bytes(damage(shard.read_bytes()))
    assert DigestMemo(tmp_path).get(key, 7) is None


def test_a_line_in_the_wrong_shard_is_ignored(tmp_path):
    memo = DigestMemo(tmp_path)
    key = same_shard_keys(1, "cd")[0]
    memo.put(key, 7, digest(b"seven"))
    memo.save()
    os.replace(tmp_path / "cd", tmp_path / "ab")  # its check holds, but it is not where its key says
    moved = "ab" + key[2:]
    assert DigestMemo(tmp_path).get(moved, 7) is None and DigestMemo(tmp_path).get(key, 7) is None


def test_a_shard_keeps_its_most_recently_used_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(memo_mod, "MAX_PER_SHARD", 4)
    day = [1000]
    monkeypatch.setattr(memo_mod.time, "time", lambda: day[0] * 86400.0)
    keys = same_shard_keys(6)
    memo = DigestMemo(tmp_path)
    for key in keys[:4]:
        memo.put(key, 1, digest(key.encode()))
    memo.save()
    day[0] += 1
    memo = DigestMemo(tmp_path)
    assert memo.get(keys[0], 1) is not None  # used again: kept longer
    memo.put(keys[4], 1, digest(b"4"))
    memo.put(keys[5], 1, digest(b"5"))
    memo.save()
    kept = DigestMemo(tmp_path)
    found = [kept.get(k, 1) is not None for k in keys]
    assert found.count(True) == 4 and found[0] and found[4] and found[5]  # one of the three unused ones left
    assert len((tmp_path / "ab").read_text().strip().split("\n")) == 1 + 4


def test_saving_merges_what_another_export_wrote_meanwhile(tmp_path):
    k1, k2 = same_shard_keys(2)
    one, two = DigestMemo(tmp_path), DigestMemo(tmp_path)
    assert one.get(k1, 1) is None and two.get(k2, 1) is None  # both read the (empty) shard
    one.put(k1, 1, digest(b"1"))
    one.save()
    two.put(k2, 1, digest(b"2"))
    two.save()
    both = DigestMemo(tmp_path)
    assert both.get(k1, 1) == digest(b"1") and both.get(k2, 1) == digest(b"2")


def test_a_memo_that_cannot_be_written_costs_nothing_but_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the memo's folder should be")
    memo = DigestMemo(blocker / "memo")
    memo.put(same_shard_keys(1)[0], 1, digest(b"1"))
    memo.save()  # no error
    assert DigestMemo(blocker / "memo").get(same_shard_keys(1)[0], 1) is None


def test_the_environment_turns_the_memo_off(tmp_path, monkeypatch):
    monkeypatch.setenv("CONCORD_HOME", str(tmp_path))
    monkeypatch.delenv(memo_mod.NO_MEMO_ENV, raising=False)
    assert resolve_memo(True).folder == str(tmp_path / memo_mod.MEMO_DIR)
    assert resolve_memo(False) is None
    monkeypatch.setenv(memo_mod.NO_MEMO_ENV, "1")
    assert resolve_memo(True) is None
    own = DigestMemo(tmp_path / "own")
    assert resolve_memo(own) is own


def test_an_upload_checked_on_the_way_holds_its_last_block_back():
    blocks = [b"a" * 10, b"b" * 10, b"c" * 3]
    assert list(_checked(iter(blocks), "f", digest(b"".join(blocks)))) == blocks
    sent = []
    with pytest.raises(OciMemoContradictedError) as err:
        for block in _checked(iter(blocks), "f", digest(b"other")):
            sent.append(len(block))
    assert sent == [10, 10] and err.value.exit_code == 15 and "f:" in str(err.value)
    assert list(_checked(iter([]), "empty", digest(b""))) == []
