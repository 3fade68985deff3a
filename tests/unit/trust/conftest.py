"""Fixtures of the trust tests: key pairs (made once per session), a small model folder, a store
holding its snapshot, and the real ``model_signing`` package for interop.

The real ``model_signing`` package is imported through ``oms_interop.import_model_signing``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from concord.stores import LocalDirStore
from concord.trust import generate_key

# the helpers of the federation and pipeline tests (a LoRA adapter writer, the offline logo check)
for _sibling in ("federation", "pipelines"):
    _path = str(Path(__file__).parents[1] / _sibling)
    if _path not in sys.path:
        sys.path.append(_path)


@pytest.fixture(scope="session")
def keydir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    generate_key(d / "alice.pem")
    generate_key(d / "mallory.pem")
    # made by openssl itself, the way the docs tell people to
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(d / "ossl.pem")], check=True)
    subprocess.run(["openssl", "ec", "-in", str(d / "ossl.pem"), "-pubout", "-out", str(d / "ossl.pub.pem")], check=True, capture_output=True)
    return d


@pytest.fixture(scope="module")
def clusters(tmp_path_factory) -> Path:
    """A key pair per cluster (and one outside the policy), and ``policy.yaml``: threshold 2."""
    from quorum_keys import make_cluster_keys

    return make_cluster_keys(tmp_path_factory.mktemp("cluster-keys"))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    m = tmp_path / "model"
    (m / "sub").mkdir(parents=True)
    (m / "weights.bin").write_bytes(os.urandom(300_000))
    (m / "config.json").write_text('{"hidden": 8}')
    (m / "sub" / "tok.txt").write_text("a b c")
    (m / ".gitattributes").write_text("*.bin filter=lfs")
    return m


@pytest.fixture
def snap(tmp_path: Path, model: Path):
    """(store, root) of ``model`` snapshotted under ref ``models/m``."""
    from concord.snapshots.snapshot import snapshot

    store = LocalDirStore(tmp_path / "c1")
    r = snapshot(model, store, ref="models/m", chunk_size=64 * 1024)
    return store, r.root
