"""Durable before visible: a folder store flushes the chunks and the manifest a ref names, and the
folders they are named in, before the ref moves. Observed on the real store by recording the
``fsync`` and ``syncfs`` calls it makes (and the renames that put files in place): a file is
flushed by its own ``fsync``, or by a ``syncfs`` of its filesystem that began after it was named."""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, fine_tune

import concord.files
import concord.stores.local as local
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.stores.base import chunk_key, manifest_key, ref_key


class Recorder:
    """Every fsync and syncfs (by the path of its descriptor) and every rename, in order, from all threads."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.syncfs_began = threading.Event()
        real_fsync, real_replace, real_link, real_syncfs = os.fsync, os.replace, os.link, local.syncfs
        real_rename_new = concord.files.rename_new

        def fsync(fd):
            self._add("fsync", os.readlink(f"/proc/self/fd/{fd}"))
            return real_fsync(fd)

        def syncfs(fd):  # it covers what was named before it began, once it is over
            path = os.readlink(f"/proc/self/fd/{fd}")
            self._add("syncfs-begin", path)
            self.syncfs_began.set()
            real_syncfs(fd)
            self._add("syncfs", path)

        def replace(src, dst, *a, **kw):
            out = real_replace(src, dst, *a, **kw)
            self._add("name", os.fspath(dst))
            return out

        def link(src, dst, *a, **kw):
            out = real_link(src, dst, *a, **kw)
            self._add("name", os.fspath(dst))
            return out

        def rename_new(src, dst):
            out = real_rename_new(src, dst)
            if out:
                self._add("name", os.fspath(dst))
            return out

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "link", link)
        monkeypatch.setattr(concord.files, "rename_new", rename_new)
        monkeypatch.setattr(local, "syncfs", syncfs)

    def _add(self, what: str, path: str) -> None:
        with self._lock:
            self.events.append((what, path))

    def named(self, path: str | Path) -> int:
        """Where ``path`` was (last) renamed into place among the events (-1: never, as a folder)."""
        return max((i for i, e in enumerate(self.events) if e == ("name", str(path))), default=-1)

    def flushed_before(self, path: Path, needed: set[str] = frozenset()) -> set[str]:
        """The paths fsynced before ``path`` was (last) renamed into place, and those of ``needed``
        that a syncfs of their filesystem, begun after they were named, covered by then."""
        named = self.named(path)
        out = {p for what, p in self.events[:named] if what == "fsync"}
        for begun, over, p in self.syncfs_spans():
            if over < named:
                dev = os.stat(p).st_dev
                out |= {q for q in needed if os.stat(q).st_dev == dev and self.named(q) < begun}
        return out

    def syncfs_spans(self) -> list[tuple[int, int, str]]:
        """``(where it began, where it was over, path)`` of each syncfs (one runs at a time)."""
        begins = [i for i, (what, _) in enumerate(self.events) if what == "syncfs-begin"]
        ends = [(i, p) for i, (what, p) in enumerate(self.events) if what == "syncfs"]
        return [(b, e, p) for b, (e, p) in zip(begins, ends)]

    def syncfs_calls(self) -> list[str]:
        return [p for what, p in self.events if what == "syncfs"]


def _assert_flushed_before_ref(rec: Recorder, store: LocalDirStore, r, ref: Path) -> None:
    """The manifest and chunks of snapshot ``r`` and their folders were on disk before ``ref`` moved."""
    needed = _needed(store, r.root, r.manifest.chunk_lengths())
    missing = needed - rec.flushed_before(ref, needed)
    assert not missing, f"not flushed before the ref moved: {sorted(missing)[:5]}"


def _needed(store: LocalDirStore, root: str, chunks) -> set[str]:
    """What must be on disk before a ref names ``root``: its manifest, its chunks, and the
    folders each is named in, up to the store's root."""
    out = {str(Path(store.root, *manifest_key(root).split("/")))}
    for cid in chunks:
        out.add(str(Path(store.root, *chunk_key(cid).split("/"))))
    for path in list(out):
        p = Path(path).parent
        while len(p.parts) >= len(Path(store.root).parts):
            out.add(str(p))
            p = p.parent
    return out


@pytest.mark.parametrize("how", ["syncfs for small files", "fsync each file", "no syncfs on this system"])
def test_a_snapshot_flushes_its_chunks_manifest_and_folders_before_the_ref(ckpt, tmp_path, monkeypatch, how):
    if how == "fsync each file":
        monkeypatch.setattr(local, "SYNCFS_BELOW", 1)  # every chunk as a large file's is
    elif how == "no syncfs on this system":
        monkeypatch.setattr(local, "_SYNCFS", None)
    store = LocalDirStore(tmp_path / "store")
    rec = Recorder(monkeypatch)
    r = snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
    ref = Path(store.root, *ref_key("models/m").split("/"))
    _assert_flushed_before_ref(rec, store, r, ref)
    assert ("fsync", str(ref.parent)) in rec.events[rec.events.index(("name", str(ref))) :]  # the ref's folder, after it
    chunk_fsyncs = [p for what, p in rec.events if what == "fsync" and "/chunks/" in p and os.path.isfile(p)]
    if how == "syncfs for small files":  # one syncfs of the store's filesystem, no fsync per chunk file
        assert rec.syncfs_calls() and not chunk_fsyncs
    else:
        assert not rec.syncfs_calls() and len(chunk_fsyncs) == len(r.manifest.chunk_lengths())


def test_chunks_on_another_filesystem_are_synced_there_too(ckpt, tmp_path, monkeypatch):
    """A store whose ``chunks`` folder is a link to another filesystem (here /dev/shm, a tmpfs)
    runs a syncfs on each filesystem it wrote to, and holds no descriptor open after."""
    elsewhere = Path(os.path.realpath("/dev/shm"), f"concord-test-{os.getpid()}-{tmp_path.name}")
    assert os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev, "this test needs /dev/shm on a filesystem of its own"
    elsewhere.mkdir()
    try:
        (tmp_path / "store").mkdir()
        (tmp_path / "store" / "chunks").symlink_to(elsewhere)
        store = LocalDirStore(tmp_path / "store")
        rec = Recorder(monkeypatch)
        r = snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
        ref = Path(store.root, *ref_key("models/m").split("/"))
        _assert_flushed_before_ref(rec, store, r, ref)
        assert {os.stat(p).st_dev for p in rec.syncfs_calls()} == {os.stat(tmp_path).st_dev, os.stat(elsewhere).st_dev}
        assert not _open_under(tmp_path, elsewhere)
    finally:
        shutil.rmtree(elsewhere)


def _open_under(*folders: Path) -> list[str]:
    """What this process holds open under ``folders``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if any(path == str(f) or path.startswith(f"{f}/") for f in folders):
            out.append(path)
    return out


def test_a_sync_flushes_what_it_sent_before_the_target_ref(ckpt, tmp_path, monkeypatch):
    src, dst = LocalDirStore(tmp_path / "src"), LocalDirStore(tmp_path / "dst")
    r = snapshot(ckpt, src, ref="models/m", chunk_size=SMALL_CHUNK)
    rec = Recorder(monkeypatch)
    (res,) = replicate(src, [dst], ref="models/m")
    assert res.chunks_sent == len(r.manifest.chunk_lengths())
    ref = Path(dst.root, *ref_key("models/m").split("/"))
    _assert_flushed_before_ref(rec, dst, r, ref)


@pytest.mark.parametrize("small_below", [local.SYNCFS_BELOW, 1])
def test_chunks_already_held_are_not_written_or_flushed_again(ckpt, tmp_path, monkeypatch, small_below):
    monkeypatch.setattr(local, "SYNCFS_BELOW", small_below)
    store = LocalDirStore(tmp_path / "store")
    first = snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
    tuned = fine_tune(ckpt, tmp_path / "tuned", ["embed.weight"])
    rec = Recorder(monkeypatch)
    second = snapshot(tuned, LocalDirStore(store.root), ref="models/m", chunk_size=SMALL_CHUNK)
    new = set(second.manifest.chunk_lengths()) - set(first.manifest.chunk_lengths())
    new_files = {str(Path(store.root, *chunk_key(c).split("/"))) for c in new}
    named = {p for what, p in rec.events if what == "name" and "/chunks/" in p}
    flushed = {p for what, p in rec.events if what == "fsync" and "/chunks/" in p and os.path.isfile(p)}
    assert new and named == new_files
    assert flushed == (new_files if small_below == 1 else set())


def test_a_flush_that_fails_stops_the_ref(ckpt, tmp_path, monkeypatch):
    from concord.errors import StoreAccessError

    monkeypatch.setattr(local, "SYNCFS_BELOW", 1)  # each chunk flushed by its own fsync
    store = LocalDirStore(tmp_path / "store")
    real = os.fsync

    def failing(fd):
        if "/chunks/" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(5, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StoreAccessError, match="cannot flush"):
        snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
    assert store.read_ref("models/m") is None


def test_a_syncfs_that_reports_a_failed_write_back_stops_the_ref(ckpt, tmp_path, monkeypatch):
    from concord.errors import StoreAccessError

    store = LocalDirStore(tmp_path / "store")
    real = local._SYNCFS

    def failing(fd):  # as syncfs answers when a write-back on the filesystem failed
        real(fd)
        ctypes.set_errno(5)
        return -1

    monkeypatch.setattr(local, "_SYNCFS", failing)
    with pytest.raises(StoreAccessError, match="cannot flush .*Input/output error"):
        snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
    assert store.read_ref("models/m") is None
    # the next snapshot, its syncfs answering well, moves the ref
    monkeypatch.setattr(local, "_SYNCFS", real)
    r = snapshot(ckpt, LocalDirStore(store.root), ref="models/m", chunk_size=SMALL_CHUNK)
    assert store.read_ref("models/m").root == r.root


def test_syncfs_runs_in_the_background_while_small_files_keep_coming_and_once_more_before_the_ref(ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(local, "SYNCFS_EVERY", 1)  # one after every small file (one at a time)
    rec = Recorder(monkeypatch)

    class Patient(LocalDirStore):
        """Writes its second chunk only once a syncfs has begun (so one begins while chunks come)."""

        def put_chunk_from_file(self, *args, **kw):
            if self.written_chunks == 1:
                assert rec.syncfs_began.wait(60), "no syncfs began after the first chunk"
            self.written_chunks += 1
            return super().put_chunk_from_file(*args, **kw)

    store = Patient(tmp_path / "store")
    store.written_chunks = 0
    r = snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK, workers=1)
    ref = Path(store.root, *ref_key("models/m").split("/"))
    _assert_flushed_before_ref(rec, store, r, ref)
    spans = [span for span in rec.syncfs_spans() if span[1] < rec.named(ref)]
    last_chunk = max(i for i, (what, p) in enumerate(rec.events) if what == "name" and "/chunks/" in p)
    assert spans[0][0] < last_chunk < spans[-1][0]  # one began while chunks were written, one after the last
    assert not _open_under(tmp_path)


def test_a_failed_write_back_a_background_syncfs_was_told_of_stops_the_ref(ckpt, tmp_path, monkeypatch):
    """The first syncfs, in the background, is told of the failure (and the filesystem tells no
    one else, so a later syncfs would answer well): its error is the flush's."""
    from concord.errors import StoreAccessError

    monkeypatch.setattr(local, "SYNCFS_EVERY", 1)
    real, calls = local._SYNCFS, []

    def first_fails(fd):
        calls.append(fd)
        real(fd)
        if len(calls) == 1:
            ctypes.set_errno(5)
            return -1
        return 0

    monkeypatch.setattr(local, "_SYNCFS", first_fails)
    store = LocalDirStore(tmp_path / "store")
    with pytest.raises(StoreAccessError, match="cannot flush .*Input/output error"):
        snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
    assert calls and store.read_ref("models/m") is None
    assert not _open_under(tmp_path)
