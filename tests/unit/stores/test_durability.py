"""Durable before visible: a folder store flushes the chunks and the manifest a ref names, and the
folders they are named in, before the ref moves. Observed on the real store by recording the
``fsync`` calls it makes (and the renames that put files in place)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, fine_tune

from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.stores.base import chunk_key, manifest_key, ref_key


class Recorder:
    """Every fsync (by the path of its descriptor) and every rename, in order, from all threads."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

        def fsync(fd):
            self._add("fsync", os.readlink(f"/proc/self/fd/{fd}"))
            return real_fsync(fd)

        def replace(src, dst, *a, **kw):
            out = real_replace(src, dst, *a, **kw)
            self._add("name", os.fspath(dst))
            return out

        def link(src, dst, *a, **kw):
            out = real_link(src, dst, *a, **kw)
            self._add("name", os.fspath(dst))
            return out

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "link", link)

    def _add(self, what: str, path: str) -> None:
        with self._lock:
            self.events.append((what, path))

    def flushed_before(self, path: Path) -> set[str]:
        """The paths fsynced before ``path`` was (last) renamed into place."""
        named = max(i for i, e in enumerate(self.events) if e == ("name", str(path)))
        return {p for what, p in self.events[:named] if what == "fsync"}


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


def test_a_snapshot_flushes_its_chunks_manifest_and_folders_before_the_ref(ckpt, tmp_path, monkeypatch):
    store = LocalDirStore(tmp_path / "store")
    rec = Recorder(monkeypatch)
    r = snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
    ref = Path(store.root, *ref_key("models/m").split("/"))
    missing = _needed(store, r.root, r.manifest.chunk_lengths()) - rec.flushed_before(ref)
    assert not missing, f"not flushed before the ref moved: {sorted(missing)[:5]}"
    assert ("fsync", str(ref.parent)) in rec.events[rec.events.index(("name", str(ref))) :]  # the ref's folder, after it


def test_a_sync_flushes_what_it_sent_before_the_target_ref(ckpt, tmp_path, monkeypatch):
    src, dst = LocalDirStore(tmp_path / "src"), LocalDirStore(tmp_path / "dst")
    r = snapshot(ckpt, src, ref="models/m", chunk_size=SMALL_CHUNK)
    rec = Recorder(monkeypatch)
    (res,) = replicate(src, [dst], ref="models/m")
    assert res.chunks_sent == len(r.manifest.chunk_lengths())
    ref = Path(dst.root, *ref_key("models/m").split("/"))
    missing = _needed(dst, r.root, r.manifest.chunk_lengths()) - rec.flushed_before(ref)
    assert not missing, f"not flushed before the ref moved: {sorted(missing)[:5]}"


def test_chunks_already_held_are_not_flushed_again(ckpt, tmp_path, monkeypatch):
    store = LocalDirStore(tmp_path / "store")
    first = snapshot(ckpt, store, ref="models/m", chunk_size=SMALL_CHUNK)
    tuned = fine_tune(ckpt, tmp_path / "tuned", ["embed.weight"])
    rec = Recorder(monkeypatch)
    second = snapshot(tuned, LocalDirStore(store.root), ref="models/m", chunk_size=SMALL_CHUNK)
    chunk_files = {p for what, p in rec.events if what == "fsync" and "/chunks/" in p and os.path.isfile(p)}
    new = set(second.manifest.chunk_lengths()) - set(first.manifest.chunk_lengths())
    assert new and chunk_files == {str(Path(store.root, *chunk_key(c).split("/"))) for c in new}


def test_a_flush_that_fails_stops_the_ref(ckpt, tmp_path, monkeypatch):
    from concord.errors import StoreAccessError

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
