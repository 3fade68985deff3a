"""Checking out a delta-stored version on a node that holds its base: each delta is decoded against
the node's own bytes of its base chunk, read from the version's file that holds them, instead of
the base read and decoded from the store (docs/deltas.md). The result is hash-checked as always: a
local copy that rotted or was edited gives way to the store's base, never to a failed checkout or
bad bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from counting import CountingStore
from safetensors.torch import save_file
from toy_checkpoints import SMALL_CHUNK, files_equal

from concord.serving.checkout import checkout
from concord.serving.versions import Layout
from concord.snapshots.manifest import Manifest
from concord.snapshots.snapshot import snapshot
from concord.stores.config import configure

NAMES = [f"layers.{i}.mlp.weight" for i in range(4)]


def _write(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text('{"hidden_size": 256}')
    return folder


@pytest.fixture
def family(tmp_path: Path, request) -> tuple[CountingStore, Manifest, Manifest, Path]:
    """A compressed store (encrypted with ``request.param``) holding a bf16 base (v1) and its full
    fine-tune (v2, every weight moved by 1e-3 of its mean size) stored as deltas of it."""
    g = torch.Generator().manual_seed(0)
    base = {n: torch.randn(512, 256, generator=g).to(torch.bfloat16) for n in NAMES}
    tuned = {
        n: (w.float() + 1e-3 * w.float().abs().mean() * torch.randn(w.shape, generator=g)).to(torch.bfloat16)
        for n, w in base.items()
    }
    a, b = _write(tmp_path / "a", base), _write(tmp_path / "b", tuned)
    store = CountingStore(tmp_path / "store")
    key = os.urandom(32) if getattr(request, "param", False) else None
    configure(store, compress="auto", encrypt=key is not None, key=key)
    m1 = snapshot(a, store, chunk_size=SMALL_CHUNK, ref="models/m").manifest
    m2 = snapshot(b, store, chunk_size=SMALL_CHUNK, ref="models/m").manifest
    deltas = [c for c in m2.chunk_lengths() if store.delta_of(c) is not None]
    assert len(deltas) == 4 * 512 * 256 * 2 // SMALL_CHUNK  # every weight chunk, none of the rest
    return store, m1, m2, b


def _base_reads(store: CountingStore, m1: Manifest, m2: Manifest) -> dict[str, int]:
    """How often each chunk only the base holds was read from ``store`` since its count was reset."""
    only = set(m1.chunk_lengths()) - set(m2.chunk_lengths())
    return {c: store.reads[f"chunks/{store.chunk_object_name(c)[:2]}/{store.chunk_object_name(c)}"] for c in only}


@pytest.mark.parametrize("family", [False, True], ids=["compressed", "encrypted"], indirect=True)
def test_a_node_holding_the_base_decodes_each_delta_against_its_own_bytes(family, tmp_path):
    store, m1, m2, b = family
    dest = tmp_path / "node" / "current"
    checkout(store, m1, dest)
    store.reads.clear()
    r = checkout(store, m2, dest)
    assert files_equal(dest, b) and r.root == m2.root
    reads = _base_reads(store, m1, m2)
    assert len(reads) == 16 and sum(reads.values()) == 0  # not one base chunk read from the store
    assert r.bytes_fetched == sum(n for c, n in m2.chunk_lengths().items() if store.delta_of(c))


def test_a_damaged_local_base_gives_way_to_the_stores_and_the_checkout_is_right(family, tmp_path):
    store, m1, m2, b = family
    dest = tmp_path / "node" / "current"
    checkout(store, m1, dest)
    # one byte of the base version's copy of a weight rots (a chunk the fine-tune lacks)
    part = m1.by_path["model.safetensors"].by_key[("tensor", NAMES[2])]
    rotten, offset, _ = next(iter(part.chunk_spans(m1.chunk_size)))
    kept = Path(Layout.of(dest).version_dir(m1.root)) / "model.safetensors"
    with open(kept, "r+b") as f:
        f.seek(offset + 100)
        byte = f.read(1)
        f.seek(offset + 100)
        f.write(bytes([byte[0] ^ 0x40]))
    store.reads.clear()
    r = checkout(store, m2, dest)
    assert files_equal(dest, b) and r.root == m2.root
    reads = _base_reads(store, m1, m2)
    assert reads.pop(rotten) == 1  # that delta alone was decoded against the store's base
    assert sum(reads.values()) == 0


def test_a_node_without_the_base_reads_it_from_the_store(family, tmp_path):
    store, m1, m2, b = family
    store.reads.clear()
    checkout(store, m2, tmp_path / "fresh" / "current")
    assert files_equal(tmp_path / "fresh" / "current", b)
    reads = _base_reads(store, m1, m2)
    assert set(reads.values()) == {1}  # each base chunk read once, for the one delta built on it
