"""The file helpers (concord/files.py): the atomic writer (the file appears whole or not at all,
and no temporary file is left behind, whatever happened), writes that finish what a short write
left, and one lock per file."""

from __future__ import annotations

import os
import stat
import threading

import pytest

import concord.files
from concord.files import TMP_PREFIX, atomic_write, rename_new, temp_path


def leftovers(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(TMP_PREFIX)]


def test_a_write_puts_the_bytes_in_place_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "deep" / "er" / "state.json"
    assert atomic_write(path, b"first") is True
    assert path.read_bytes() == b"first"
    assert atomic_write(str(path), memoryview(b"second"), fsync=False) is True
    assert path.read_bytes() == b"second"
    assert leftovers(path.parent) == []


def test_mode_sets_the_permissions_exactly(tmp_path):
    path = tmp_path / "record.json"
    atomic_write(path, b"{}", mode=0o600)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    old = os.umask(0o077)
    try:
        atomic_write(tmp_path / "plain", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "plain").st_mode) == 0o600  # 0o666 less the umask


def test_exclusive_writes_only_a_new_name(tmp_path):
    path = tmp_path / "000001.json"
    assert atomic_write(path, b"winner", exclusive=True) is True
    assert atomic_write(path, b"loser", exclusive=True) is False
    assert path.read_bytes() == b"winner"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("renameat2", [True, False], ids=["rename-noreplace", "hard-link"])
def test_of_writers_racing_for_one_name_exactly_one_wins_whole(tmp_path, monkeypatch, renameat2):
    if not renameat2:  # a system whose C library has no renameat2: the hard link decides
        monkeypatch.setattr(concord.files, "_RENAMEAT2", None)
    path = tmp_path / "chunk"
    start = threading.Barrier(8)
    won: list[bytes] = []

    def write(i: int) -> None:
        data = bytes([i]) * 100_000
        start.wait()
        if atomic_write(path, data, exclusive=True, fsync=False):
            won.append(data)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and path.read_bytes() == won[0]
    assert leftovers(tmp_path) == []


def test_rename_new_refuses_to_replace_and_leaves_both_files(tmp_path):
    (tmp_path / "a").write_bytes(b"new")
    (tmp_path / "b").write_bytes(b"held")
    assert rename_new(str(tmp_path / "a"), str(tmp_path / "b")) is False
    assert (tmp_path / "a").read_bytes() == b"new" and (tmp_path / "b").read_bytes() == b"held"
    assert rename_new(str(tmp_path / "a"), str(tmp_path / "c")) is True
    assert not (tmp_path / "a").exists() and (tmp_path / "c").read_bytes() == b"new"
    with pytest.raises(FileNotFoundError):
        rename_new(str(tmp_path / "gone"), str(tmp_path / "d"))


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "state.json"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        atomic_write(path, "text is not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_a_temporary_name_is_unique_and_in_the_folder(tmp_path):
    a, b = temp_path(tmp_path), temp_path(tmp_path)
    assert a != b and os.path.dirname(a) == str(tmp_path) and os.path.basename(a).startswith(TMP_PREFIX)
    assert not os.path.exists(a)


def test_a_forked_child_draws_temporary_names_of_its_own(tmp_path):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next name, to the parent
        try:
            os.write(write, os.path.basename(temp_path(tmp_path)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        child = f.read().decode()
    os.waitpid(pid, 0)
    mine = os.path.basename(temp_path(tmp_path))
    token = slice(len(TMP_PREFIX), len(TMP_PREFIX) + 20)  # the process's random token, before the counter
    assert child.startswith(TMP_PREFIX) and child[token] != mine[token]


def test_pwrite_all_finishes_what_a_short_write_leaves(tmp_path, monkeypatch):
    from concord import files

    real = os.pwrite
    calls = []

    def short(fd, data, offset):  # the kernel may write less than asked (signals, limits)
        calls.append(len(data))
        return real(fd, memoryview(data)[:1000], offset)

    monkeypatch.setattr(files.os, "pwrite", short)
    path = tmp_path / "f"
    path.write_bytes(b"\0" * 10)
    fd = os.open(path, os.O_WRONLY)
    try:
        files.pwrite_all(fd, bytes(range(256)) * 20, 5)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\0" * 5 + bytes(range(256)) * 20
    assert calls == [5120, 4120, 3120, 2120, 1120, 120]


def test_pwrite_all_refuses_a_write_of_nothing(tmp_path, monkeypatch):
    from concord import files

    monkeypatch.setattr(files.os, "pwrite", lambda fd, data, offset: 0)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError, match="wrote 0 bytes at offset 7"):
            files.pwrite_all(fd, b"abc", 7)
    finally:
        os.close(fd)


def test_open_files_open_each_file_once_and_write_whole_buffers(tmp_path):
    import threading

    from concord.files import OpenFiles

    paths = [str(tmp_path / name) for name in ("a", "b")]
    for p in paths:
        with open(p, "wb") as f:
            f.truncate(64 * 1024)
    files = OpenFiles(os.O_WRONLY)

    def fill(k: int) -> None:
        files.write(paths[k % 2], bytes([k]) * 1024, (k // 2) * 1024)

    threads = [threading.Thread(target=fill, args=(k,)) for k in range(128)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(files.fds) == 2
    files.close()
    assert files.fds == {}
    for i, p in enumerate(paths):
        data = open(p, "rb").read()
        assert data == b"".join(bytes([2 * j + i]) * 1024 for j in range(64))
