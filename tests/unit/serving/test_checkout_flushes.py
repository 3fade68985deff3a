"""A checkout of many small files flushes them all before the rename that makes the version and the
flip that serves it: by one ``syncfs`` of the version's filesystem begun after the last of them was
written (no ``fsync`` each), or, where the system has no ``syncfs``, by an ``fsync`` each; a file of
several chunks is flushed by its own ``fsync`` as before. Told ``fsync=False``, nothing is flushed.
While many are written, a ``syncfs`` also runs in the background after every ``SYNCFS_EVERY`` bytes
of them, and a write-back error it reports fails the checkout before the flip."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK

from concord.errors import LocalFileError
from concord.serving.checkout import checkout
from concord.serving.versions import Layout
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore, local

SMALL = 40  # files of one chunk each


class Recorder:
    """Every write, fsync and syncfs (by the path of its descriptor) and every rename, in order, from all threads."""

    def __init__(self, monkeypatch, under: Path, *, hold_after: int | None = None) -> None:
        """With ``hold_after``, once that many bytes of small files (writes under a chunk) are
        written every write waits (30 s at most, once) for the first ``syncfs`` to begin: a background one
        then begins while files remain to be written on any machine, however late its thread runs."""
        self.under = str(under)
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._written = 0
        began = threading.Event()
        real_pwrite, real_fsync, real_rename, real_syncfs = os.pwrite, os.fsync, os.rename, local.syncfs

        def pwrite(fd, data, offset):
            if hold_after is not None and self._written >= hold_after and self._path(fd).startswith(self.under):
                if not began.wait(30):
                    began.set()  # none began: wait no more, the test's assertions say what is wrong
            n = real_pwrite(fd, data, offset)
            self._add("write", self._path(fd))
            if n < SMALL_CHUNK:
                with self._lock:
                    self._written += n
            return n

        def fsync(fd):
            real_fsync(fd)
            self._add("fsync", self._path(fd))

        def syncfs(fd):
            self._add("syncfs-begin", self._path(fd))
            began.set()
            real_syncfs(fd)
            self._add("syncfs", self._path(fd))

        def rename(src, dst, *a, **kw):
            real_rename(src, dst, *a, **kw)
            self._add("rename", os.fspath(dst))

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(local, "syncfs", syncfs)

    @staticmethod
    def _path(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def _add(self, what: str, path: str) -> None:
        if path.startswith(self.under):
            with self._lock:
                self.events.append((what, path))

    def index(self, what: str, path: str) -> int:
        return self.events.index((what, path))

    def of(self, what: str) -> list[str]:
        return [p for w, p in self.events if w == what]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for i in range(SMALL):
        (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 4}" / f"f{i:03d}.bin").write_bytes(os.urandom(1000 + 97 * i))
    (src / "big.bin").write_bytes(os.urandom(3 * SMALL_CHUNK + 5))  # four chunks
    return src


@pytest.mark.parametrize("how", ["syncfs", "no syncfs on this system", "no fsync"])
def test_every_new_file_is_flushed_before_the_version_is_renamed_into_place(folder, tmp_path, monkeypatch, how):
    if how == "no syncfs on this system":
        monkeypatch.setattr(local, "_SYNCFS", None)
    store = LocalDirStore(tmp_path / "store")
    m = snapshot(folder, store, chunk_size=SMALL_CHUNK).manifest
    dest = tmp_path / "srv" / "current"
    rec = Recorder(monkeypatch, tmp_path / "srv")
    checkout(store, m, dest, fsync=how != "no fsync")
    layout = Layout.of(dest)
    vdir = layout.version_dir(m.root)
    part = layout.partial_dir(m.root)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.bin")) == sorted(f.path for f in m.files)
    for f in m.files:
        assert Path(vdir, f.path).read_bytes() == (folder / f.path).read_bytes()
    renamed = rec.index("rename", vdir)
    small = [os.path.join(part, f.path) for f in m.files if f.path != "big.bin"]
    big = os.path.join(part, "big.bin")
    writes = {p: max(i for i, (w, q) in enumerate(rec.events) if w == "write" and q == p) for p in [*small, big]}
    if how == "no fsync":
        assert not [p for p in rec.of("fsync") if p in writes] and not rec.of("syncfs")
        return
    assert writes[big] < rec.index("fsync", big) < renamed  # a file of several chunks: its own fsync
    if how == "syncfs":  # one syncfs, begun after the last small file was written, over before the rename
        assert not [p for p in rec.of("fsync") if p in small]
        assert rec.of("syncfs") == [part]
        assert max(writes[p] for p in small) < rec.index("syncfs-begin", part) < rec.index("syncfs", part) < renamed
    else:  # each small file flushed by its own fsync, after its write, before the rename
        assert not rec.of("syncfs")
        for p in small:
            assert writes[p] < rec.index("fsync", p) < renamed


def test_syncfs_runs_in_the_background_while_small_files_are_written_and_once_more_after_the_last(folder, tmp_path, monkeypatch):
    """After every ``SYNCFS_EVERY`` bytes of small files a ``syncfs`` starts beside the writers (so
    the disk works meanwhile); the last still begins after the last write and ends before the rename."""
    monkeypatch.setattr(local, "SYNCFS_EVERY", 8000)  # a few of the 40 small files (115 kB in all)
    store = LocalDirStore(tmp_path / "store")
    m = snapshot(folder, store, chunk_size=SMALL_CHUNK).manifest
    dest = tmp_path / "srv" / "current"
    # by 40 kB written, more than 8000 bytes of small files were handed to the flusher (two writers
    # hold 10 kB at most): a background syncfs was started, and the writes wait until it begins
    rec = Recorder(monkeypatch, tmp_path / "srv", hold_after=40_000)
    checkout(store, m, dest)
    layout = Layout.of(dest)
    part, vdir = layout.partial_dir(m.root), layout.version_dir(m.root)
    small = {os.path.join(part, f.path) for f in m.files if f.path != "big.bin"}
    writes = [i for i, (w, p) in enumerate(rec.events) if w == "write" and p in small]
    begins = [i for i, (w, p) in enumerate(rec.events) if w == "syncfs-begin" and p == part]
    assert len(begins) >= 2 and begins[0] < writes[-1], "no syncfs ran while the files were written"
    assert writes[-1] < begins[-1] < rec.index("rename", vdir)
    assert len(rec.of("syncfs")) == len(begins) and rec.events.index(("syncfs", part)) < rec.index("rename", vdir)
    for f in m.files:
        assert Path(vdir, f.path).read_bytes() == (folder / f.path).read_bytes()


def test_a_write_back_error_the_background_syncfs_reports_fails_the_checkout_before_any_flip(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(local, "SYNCFS_EVERY", 8000)
    store = LocalDirStore(tmp_path / "store")
    m1 = snapshot(folder / "d0", store, chunk_size=SMALL_CHUNK).manifest
    m2 = snapshot(folder, store, chunk_size=SMALL_CHUNK).manifest
    dest = tmp_path / "srv" / "current"
    checkout(store, m1, dest)
    calls = []
    real = local.syncfs

    def failing_once(fd):  # the first syncfs of m2's checkout: the one that runs beside the writers
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(local, "syncfs", failing_once)
    with pytest.raises(LocalFileError, match="Input/output error"):
        checkout(store, m2, dest)
    assert calls[0].startswith("concord-syncfs")  # the one beside the writers, not the last
    layout = Layout.of(dest)
    assert layout.current() == m1.root and not os.path.isdir(layout.version_dir(m2.root))


def test_the_note_of_verified_files_taken_from_their_descriptors_is_what_stat_says(folder, tmp_path):
    """The size, times and inode noted for each new file (from its descriptor after its last write)
    are what a lookup of the renamed file gives: a later checkout copies from it without reading it."""
    store = LocalDirStore(tmp_path / "store")
    m = snapshot(folder, store, chunk_size=SMALL_CHUNK).manifest
    dest = tmp_path / "srv" / "current"
    checkout(store, m, dest)
    layout = Layout.of(dest)
    vdir = layout.version_dir(m.root)
    noted = json.loads(Path(layout.manifest_path(m.root)[: -len(".json")] + ".files.json").read_bytes())["files"]
    assert sorted(noted) == sorted(f.path for f in m.files)
    for f in m.files:
        st = os.stat(os.path.join(vdir, f.path))
        assert noted[f.path] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino], f.path


def test_the_manifest_kept_beside_a_version_checked_out_through_the_api_is_the_stores_bytes(folder, tmp_path):
    import concord

    store = LocalDirStore(tmp_path / "store")
    root = snapshot(folder, store, chunk_size=SMALL_CHUNK, ref="models/small").manifest.root
    dest = tmp_path / "srv" / "current"
    r = concord.checkout(str(tmp_path / "store"), dest, ref="models/small")
    assert r.root == root and r.files == SMALL + 1
    assert Path(Layout.of(dest).manifest_path(root)).read_bytes() == store.get_manifest_bytes(root)
