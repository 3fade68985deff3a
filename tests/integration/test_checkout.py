"""Checkout on a folder store and on S3 (a real moto_server): readers opening files under the
link while it flips never fail and never read a mixture; a checkout killed with SIGKILL mid-way
leaves the old version served and a re-run resumes what was fetched; a disk that fills up
leaves the old version served and no partial version."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from toy_checkpoints import files_equal

from concord.hashing import chunk_id
from concord.serving.checkout import checkout
from concord.serving.versions import Layout, rollback
from concord.snapshots.diff import diff_manifests
from concord.snapshots.snapshot import snapshot

pytestmark = pytest.mark.integration

CONCORD = str(Path(sys.executable).parent / "concord")
CHUNK = 64 * 1024


def write_version(folder: Path, seed: int, changed: int = 0) -> Path:
    """8 tensors of 1 MiB (seed 0) with the first ``changed`` of them drawn again from ``seed``."""
    g0, g = torch.Generator().manual_seed(0), torch.Generator().manual_seed(seed)
    tensors = {f"layers.{i}.weight": torch.randn(1 << 18, generator=g0) for i in range(8)}
    for i in range(changed):
        tensors[f"layers.{i}.weight"] = torch.randn(1 << 18, generator=g)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(f'{{"seed": {seed}}}')
    return folder


@pytest.fixture
def two_versions(any_store, tmp_path):
    v1 = write_version(tmp_path / "v1", 0)
    v2 = write_version(tmp_path / "v2", 7, changed=4)
    m1 = snapshot(v1, any_store, chunk_size=CHUNK, ref="models/llm").manifest
    m2 = snapshot(v2, any_store, chunk_size=CHUNK, ref="models/llm").manifest
    return any_store, (v1, m1), (v2, m2)


def store_env(store) -> dict[str, str]:
    env = {**os.environ, "CONCORD_NO_PROGRESS": "1"}
    if getattr(store, "endpoint_url", None):
        env["AWS_ENDPOINT_URL"] = store.endpoint_url
    return env


def test_readers_under_the_link_never_fail_while_it_flips(two_versions, tmp_path):
    store, (v1, m1), (v2, m2) = two_versions
    dest = tmp_path / "srv" / "current"
    checkout(store, m1, dest)
    expected = {
        chunk_id((v / "model.safetensors").read_bytes()): (v / "config.json").read_bytes() for v in (v1, v2)
    }
    stop, reads, failures = threading.Event(), [0], []

    def reader() -> None:
        while not stop.is_set():
            try:
                with open(dest / "model.safetensors", "rb") as f:
                    weights = chunk_id(f.read())
                if weights not in expected:
                    failures.append("read a model that is neither version")
                reads[0] += 1
            except OSError as exc:
                failures.append(repr(exc))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        checkout(store, m2, dest)
        for _ in range(15):
            rollback(dest)
        checkout(store, m1, dest)  # a kept version: re-verified, then flipped to
        checkout(store, m2, dest)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == [] and reads[0] > 0
    assert files_equal(dest, v2)


KILLED_RUN = textwrap.dedent(
    """
    import os, sys, time
    from concord.serving.checkout import checkout
    from concord.snapshots.refs import load_manifest
    from concord.stores import open_store

    store = open_store(sys.argv[1])
    marker, after = sys.argv[3], int(sys.argv[4])
    get, seen = store.read_chunk, [0]

    def slow_get(cid, **kw):
        data = get(cid, **kw)
        seen[0] += 1
        if seen[0] == after:
            open(marker, "w").close()
        if seen[0] >= after:
            time.sleep(60)  # killed here, with chunks written and chunks in flight
        return data

    store.read_chunk = slow_get
    checkout(store, load_manifest(store, sys.argv[2]), sys.argv[5])
    """
)


def test_a_killed_checkout_leaves_the_old_version_served_and_a_rerun_resumes(two_versions, tmp_path):
    store, (v1, m1), (v2, m2) = two_versions
    dest = tmp_path / "srv" / "current"
    checkout(store, m1, dest)
    marker = tmp_path / "fetching"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, store.uri, m2.root, str(marker), "24", str(dest)], env=store_env(store)
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the checkout never reached its 24th chunk"
            time.sleep(0.01)
        time.sleep(0.2)  # let the chunks already fetched land
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    layout = Layout.of(dest)
    assert os.readlink(dest) == layout.target(m1.root)
    assert files_equal(dest, v1)
    assert layout.versions() == [m1.root]  # no half version under a name the link could point to
    assert os.path.isdir(layout.partial_dir(m2.root))

    r = checkout(store, m2, dest)
    changed = diff_manifests(m1, m2).bytes_differing
    assert r.bytes_fetched <= changed - 16 * CHUNK  # what the killed run fetched was kept
    assert r.bytes_fetched + r.bytes_reused == m2.total_bytes
    assert files_equal(dest, v2)
    assert not os.path.exists(layout.partial_dir(m2.root))


def test_a_disk_that_fills_up_leaves_the_old_version_and_no_partial_one(two_versions, tmp_path):
    store, (v1, m1), (v2, m2) = two_versions
    dest = tmp_path / "srv" / "current"
    checkout(store, m1, dest)
    # a file size limit stands in for a full disk: writes past it fail with EFBIG, as ENOSPC would
    limit = m2.by_path["model.safetensors"].size // 2

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [CONCORD, "checkout", store.uri, "--root", m2.root, str(dest)],
        env=store_env(store), capture_output=True, text=True, preexec_fn=small_disk, timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "filled up" in done.stderr and "partial version was removed" in done.stderr
    layout = Layout.of(dest)
    assert os.readlink(dest) == layout.target(m1.root) and files_equal(dest, v1)
    assert layout.versions() == [m1.root]
    assert not os.path.exists(layout.partial_dir(m2.root))
    assert checkout(store, m2, dest).switched  # with room again, it goes through
    assert files_equal(dest, v2)
