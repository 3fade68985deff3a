"""Checking out a version the node already keeps (rolling forward to it again) never modifies it:
a damaged one is repaired in a new copy built beside it, so a checkout killed while it works, or
stopped by a full disk, leaves the kept version whole and ``--rollback`` able to go back to it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, files_equal, fine_tune

from concord.cli import main
from concord.serving.checkout import checkout
from concord.serving.versions import Layout
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

CHANGED = ["layers.0.attn.q.weight", "layers.2.attn.k.weight"]
CONCORD = str(Path(sys.executable).parent / "concord")


@pytest.fixture
def served(ckpt, tmp_path):
    """A node that served v1, then v2 (v1 kept, one byte of a tensor only v1 holds damaged)."""
    store = LocalDirStore(tmp_path / "store")
    v2 = fine_tune(ckpt, tmp_path / "v2", CHANGED)
    m1 = snapshot(ckpt, store, chunk_size=SMALL_CHUNK, ref="models/toy").manifest
    m2 = snapshot(v2, store, chunk_size=SMALL_CHUNK, ref="models/toy").manifest
    dest = tmp_path / "srv" / "current"
    checkout(store, m1, dest)
    checkout(store, m2, dest)
    part = m1.by_path["model.safetensors"].by_key[("tensor", CHANGED[0])]
    kept = Path(Layout.of(dest).version_dir(m1.root)) / "model.safetensors"
    data = bytearray(kept.read_bytes())
    data[part.offset + 10] ^= 0xFF
    kept.write_bytes(bytes(data))
    return store, dest, (ckpt, m1), (v2, m2), part


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tree_inodes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_ino for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_good_kept_version_is_flipped_to_unmodified(ckpt, tmp_path):
    store = LocalDirStore(tmp_path / "store")
    v2 = fine_tune(ckpt, tmp_path / "v2", CHANGED)
    m1 = snapshot(ckpt, store, chunk_size=SMALL_CHUNK).manifest
    m2 = snapshot(v2, store, chunk_size=SMALL_CHUNK).manifest
    dest = tmp_path / "current"
    checkout(store, m1, dest)
    checkout(store, m2, dest)
    kept = Path(Layout.of(dest).version_dir(m1.root))
    inodes, folder = tree_inodes(kept), kept.stat()
    r = checkout(store, m1, dest, rehash=True)  # every byte read back, none written
    assert r.switched and r.bytes_fetched == 0 and r.bytes_reused == m1.total_bytes
    # never renamed (a rename changes the folder's change time), no file replaced
    assert (kept.stat().st_ino, kept.stat().st_ctime_ns) == (folder.st_ino, folder.st_ctime_ns)
    assert tree_inodes(kept) == inodes
    assert files_equal(dest, ckpt)


def test_a_damaged_kept_version_is_repaired_in_a_copy_beside_it(served):
    store, dest, (d1, m1), (d2, m2), part = served
    layout = Layout.of(dest)
    kept = Path(layout.version_dir(m1.root))
    before = tree_inodes(kept)
    r = checkout(store, m1, dest)
    assert r.bytes_fetched == min(SMALL_CHUNK, part.length)  # only the damaged chunk comes from the store
    assert files_equal(dest, d1)
    after = tree_inodes(kept)
    # the damaged file is a new one; every other file is the kept one itself (hard-linked, not copied)
    assert after["model.safetensors"] != before["model.safetensors"]
    assert {k: v for k, v in after.items() if k != "model.safetensors"} == {
        k: v for k, v in before.items() if k != "model.safetensors"
    }
    assert [n for n in os.listdir(layout.folder) if n.startswith((".partial-", ".trash-"))] == []


KILLED_REPAIR = textwrap.dedent(
    """
    import sys, time
    from concord.serving.checkout import checkout
    from concord.snapshots.refs import load_manifest
    from concord.stores import open_store

    store = open_store(sys.argv[1])
    get = store.read_chunk

    def stalled_get(cid, **kw):
        open(sys.argv[3], "w").close()
        time.sleep(60)  # killed here: the repair is fetching the damaged chunk
        return get(cid, **kw)

    store.read_chunk = stalled_get
    checkout(store, load_manifest(store, sys.argv[2]), sys.argv[4])
    """
)


def test_a_checkout_to_a_kept_version_killed_while_it_repairs_leaves_it_for_rollback(served, tmp_path):
    store, dest, (d1, m1), (d2, m2), part = served
    layout = Layout.of(dest)
    kept = Path(layout.version_dir(m1.root))
    before = tree_bytes(kept)
    marker = tmp_path / "fetching"
    env = {**os.environ, "CONCORD_NO_PROGRESS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_REPAIR, store.uri, m1.root, str(marker), str(dest)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the repair never fetched the damaged chunk"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert os.readlink(dest) == layout.target(m2.root)
    assert sorted(layout.versions()) == sorted([m1.root, m2.root])  # the kept version is still a version
    assert tree_bytes(kept) == before  # not one byte of it changed
    assert main(["checkout", "--rollback", str(dest)]) == 0
    assert os.readlink(dest) == layout.target(m1.root)
    assert main(["checkout", "--rollback", str(dest)]) == 0  # back to v2, and check v1 out again: repaired
    assert files_equal(dest, d2)
    r = checkout(store, m1, dest)
    assert r.switched and files_equal(dest, d1)
    assert not os.path.exists(layout.partial_dir(m1.root))


def test_a_full_disk_while_repairing_a_kept_version_leaves_it_intact(served):
    store, dest, (d1, m1), (d2, m2), part = served
    layout = Layout.of(dest)
    kept = Path(layout.version_dir(m1.root))
    before = tree_bytes(kept)
    def small_disk(limit: int):
        """A file size limit stands in for a full disk (writes past it fail with EFBIG, as ENOSPC would)."""

        def limited() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return limited

    def concord(*args: str, limit: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [CONCORD, "checkout", *args], env={**os.environ, "CONCORD_NO_PROGRESS": "1"},
            capture_output=True, text=True, preexec_fn=small_disk(limit), timeout=120,
        )

    done = concord(store.uri, "--root", m1.root, str(dest), limit=part.offset)  # the repaired chunk lies past it
    assert done.returncode != 0 and "filled up" in done.stderr and done.stderr.count("\n") == 1
    assert os.readlink(dest) == layout.target(m2.root)
    assert sorted(layout.versions()) == sorted([m1.root, m2.root])
    assert tree_bytes(kept) == before
    assert not os.path.exists(layout.partial_dir(m1.root))
    done = concord("--rollback", str(dest), limit=0)  # and a rollback needs no byte of room
    assert done.returncode == 0, done.stderr
    assert os.readlink(dest) == layout.target(m1.root)

