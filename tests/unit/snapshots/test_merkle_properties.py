"""Properties of the Merkle tree, on real safetensors files written by safetensors itself.

Leaves and inner nodes are hashed under different tag bytes, so no chunk id can equal a node hash
of any level; a tensor is chunked from its own first byte, so its last chunk is its tail and a
change in the tail changes that one chunk; what a tensor is (name, dtype, shape) is part of its
hash, where it sits (offset, file) is not.
"""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from toy_checkpoints import SMALL_CHUNK

from concord.hashing import FILE, LEAF, PART, SNAPSHOT, canonical_json, chunk_id, node_hash
from concord.snapshots.manifest import MIN_CHUNK_SIZE, Manifest, chunk_count
from concord.snapshots.safetensors_header import read_header
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

CHUNK = MIN_CHUNK_SIZE
NODE_TAGS = (PART, FILE, SNAPSHOT)
# every example writes and snapshots a few hundred KB: few examples, no deadline
FILES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HASHES = settings(max_examples=200, deadline=None)

digests = st.binary(min_size=32, max_size=32).map(bytes.hex)
metas = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.text(max_size=16), st.lists(st.integers(0, 2**32), max_size=4)),
    max_size=5,
)
# a tensor's byte length: whole chunks and a tail (either may be empty, not both)
lengths = st.tuples(st.integers(0, 2), st.integers(0, CHUNK - 1)).map(lambda t: t[0] * CHUNK + t[1]).filter(lambda n: n > 0)


# --------------------------------------------------------------------------- helpers


def random_bytes(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


def u8(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def take(folder: Path, store_dir: Path) -> Manifest:
    """The manifest of a snapshot of ``folder`` chunked at :data:`CHUNK`."""
    return snapshot(folder, LocalDirStore(store_dir), chunk_size=CHUNK).manifest


def write(folder: Path, tensors: dict[str, torch.Tensor], name: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / name))
    return folder / name


def tensor_part(manifest: Manifest, name: str, path: str = "model.safetensors"):
    return manifest.by_path[path].by_key[("tensor", name)]


def chunk_ids(manifest: Manifest) -> list[str]:
    """Every chunk id of the snapshot, in tree order (file, part, chunk)."""
    return [cid for f in manifest.files for p in f.parts for cid in p.chunk_ids()]


# --------------------------------------------------------------------------- tags


def test_every_level_has_its_own_one_byte_tag():
    tags = (LEAF, *NODE_TAGS)
    assert all(isinstance(t, bytes) and len(t) == 1 for t in tags)
    assert len(set(tags)) == len(tags)


@HASHES
@given(tag=st.sampled_from(NODE_TAGS), meta=metas, children=st.lists(digests, max_size=6), data=st.binary(max_size=512))
def test_a_leaf_never_hashes_like_a_node(tag, meta, children, data):
    node = node_hash(tag, meta, children)
    m = canonical_json(meta)
    body = struct.pack("<I", len(m)) + m + b"".join(bytes.fromhex(c) for c in children)
    # a chunk whose bytes are exactly what the node hashes after its tag, or the node's whole
    # preimage with its tag, is still a leaf: hashed under 0x00, never equal to the node
    assert chunk_id(body) != node
    assert chunk_id(tag + body) != node
    assert chunk_id(data) != node
    # the same metadata and children at another level are another node
    assert all(node_hash(other, meta, children) != node for other in NODE_TAGS if other != tag)


@HASHES
@given(meta=metas, children=st.lists(digests, max_size=6))
def test_a_node_hash_takes_its_children_in_any_of_its_three_forms(meta, children):
    joined = "".join(children)
    assert node_hash(PART, meta, children) == node_hash(PART, meta, joined) == node_hash(PART, meta, bytes.fromhex(joined))


def test_chunk_ids_and_node_hashes_of_a_real_checkpoint_never_meet(ckpt: Path, tmp_path: Path):
    manifest = snapshot(ckpt, LocalDirStore(tmp_path / "s"), chunk_size=SMALL_CHUNK).manifest
    leaves = set(chunk_ids(manifest))
    nodes = {manifest.root} | {f.hash for f in manifest.files} | {p.hash for f in manifest.files for p in f.parts}
    assert leaves and nodes and not leaves & nodes
    assert len(nodes) == 1 + len(manifest.files) + sum(len(f.parts) for f in manifest.files)


# --------------------------------------------------------------------------- chunk boundaries


def check_chunking(manifest: Manifest, folder: Path) -> None:
    """Every part of every safetensors file is chunked from its first byte: full chunks, then
    the tail; each chunk id is the leaf hash of exactly those bytes."""
    cs = manifest.chunk_size
    for f in manifest.files:
        data = (folder / f.path).read_bytes()
        if f.kind == "safetensors":
            with open(folder / f.path, "rb") as fh:
                header = read_header(fh, len(data), f.path)
            begins = {t.name: (t.begin, t.length) for t in header.tensors}
            for p in f.tensors:
                assert (p.offset, p.length) == begins[p.name]
        for p in f.parts:
            spans = list(p.chunk_spans(cs))
            assert len(spans) == chunk_count(p.length, cs)
            if not spans:
                continue
            assert spans[0][1] == p.offset  # the first chunk starts at the part's first byte
            assert all(n == cs for _, _, n in spans[:-1])
            assert spans[-1][2] == p.length - (len(spans) - 1) * cs  # the last chunk is the tail
            for cid, start, n in spans:
                assert cid == chunk_id(data[start : start + n])


def test_a_real_checkpoint_is_chunked_along_its_tensors(ckpt: Path, tmp_path: Path):
    check_chunking(snapshot(ckpt, LocalDirStore(tmp_path / "s"), chunk_size=SMALL_CHUNK).manifest, ckpt)


@FILES
@given(sizes=st.lists(lengths, min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1))
def test_each_tensor_is_chunked_from_its_first_byte_and_ends_in_its_tail(sizes, seed):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        write(folder, {f"t{i}": u8(random_bytes(seed + i, n)) for i, n in enumerate(sizes)})
        manifest = take(folder, Path(tmp) / "store")
        check_chunking(manifest, folder)
        assert [p.length for p in sorted(manifest.files[0].tensors, key=lambda p: p.name)] == sizes


@FILES
@given(sizes=st.lists(lengths, min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1), which=st.integers(0, 2), where=st.integers(0, CHUNK - 1))
def test_changing_a_tail_byte_changes_one_chunk_its_tensor_and_the_root(sizes, seed, which, where):
    which %= len(sizes)
    n = sizes[which]
    tail_start = (chunk_count(n, CHUNK) - 1) * CHUNK
    index = tail_start + where % (n - tail_start)  # a byte of the tensor's last chunk
    tensors = {f"t{i}": random_bytes(seed + i, size) for i, size in enumerate(sizes)}
    changed = dict(tensors)
    b = bytearray(tensors[f"t{which}"])
    b[index] ^= 0xFF
    changed[f"t{which}"] = bytes(b)
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp) / "a", {k: u8(v) for k, v in tensors.items()})
        write(Path(tmp) / "b", {k: u8(v) for k, v in changed.items()})
        before = take(Path(tmp) / "a", Path(tmp) / "store")
        after = take(Path(tmp) / "b", Path(tmp) / "store")
    old, new = chunk_ids(before), chunk_ids(after)
    assert len(old) == len(new)
    assert sum(a != b for a, b in zip(old, new)) == 1
    part_old, part_new = tensor_part(before, f"t{which}"), tensor_part(after, f"t{which}")
    assert part_old.chunk_ids()[:-1] == part_new.chunk_ids()[:-1]
    assert part_old.chunk_ids()[-1] != part_new.chunk_ids()[-1]
    assert part_old.hash != part_new.hash and before.root != after.root
    for name in tensors:
        if name != f"t{which}":
            assert tensor_part(before, name) == tensor_part(after, name)


# --------------------------------------------------------------------------- what a tensor is


@FILES
@given(words=st.integers(1, 3 * CHUNK // 4), seed=st.integers(0, 2**32 - 1), change=st.sampled_from(["dtype", "shape", "name"]))
def test_a_changed_dtype_shape_or_name_changes_the_tensor_hash_and_the_root_not_its_chunks(words, seed, change):
    data = random_bytes(seed, 4 * words)
    base = u8(data).view(torch.int32)
    other = {
        "dtype": ("w", base.view(torch.float32)),  # the same bytes read as F32
        "shape": ("w", base.reshape(1, words)),
        "name": ("v", base),
    }[change]
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp) / "a", {"w": base, "bias": u8(data[:100])})
        write(Path(tmp) / "b", {other[0]: other[1], "bias": u8(data[:100])})
        before = take(Path(tmp) / "a", Path(tmp) / "store")
        after = take(Path(tmp) / "b", Path(tmp) / "store")
    part_old, part_new = tensor_part(before, "w"), tensor_part(after, other[0])
    assert part_old.chunks == part_new.chunks  # the same bytes, the same chunks
    assert (part_old.name, part_old.dtype, part_old.shape) != (part_new.name, part_new.dtype, part_new.shape)
    assert part_old.hash != part_new.hash
    assert before.root != after.root
    kept, still = tensor_part(before, "bias"), tensor_part(after, "bias")  # moved by the header only
    assert (kept.hash, kept.chunks) == (still.hash, still.chunks)


@pytest.mark.parametrize(
    "field, value",
    [("name", "w2"), ("dtype", "I32"), ("shape", (2, 2)), ("length", 8), ("kind", "data")],
)
def test_every_field_of_a_parts_meta_is_hashed(field, value):
    from concord.snapshots.manifest import make_part

    ids = [chunk_id(b"x")]
    args = {"kind": "tensor", "name": "w", "length": 16, "dtype": "F32", "shape": (4,)}
    changed = dict(args, **{field: value})
    a = make_part(args["kind"], args["name"], 0, args["length"], ids, args["dtype"], args["shape"])
    b = make_part(changed["kind"], changed["name"], 0, changed["length"], ids, changed["dtype"], changed["shape"])
    assert a.hash != b.hash


# --------------------------------------------------------------------------- where a tensor is


@FILES
@given(size=lengths, pad=st.integers(1, CHUNK + 7), seed=st.integers(0, 2**32 - 1))
def test_a_moved_tensor_keeps_its_hash_and_its_chunks(size, pad, seed):
    data = random_bytes(seed, size)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write(tmp / "a", {"w": u8(data)})
        # another tensor sorted before it shifts it by ``pad`` bytes (and the longer header by more)
        write(tmp / "b", {"a.pad": u8(random_bytes(seed + 1, pad)), "w": u8(data)})
        # the same bytes in another file, among other tensors
        write(tmp / "c", {"z": u8(random_bytes(seed + 2, 33))}, name="model.safetensors")
        write(tmp / "c", {"b": u8(random_bytes(seed + 3, pad)), "w": u8(data)}, name="other.safetensors")
        alone = take(tmp / "a", tmp / "store")
        shifted = take(tmp / "b", tmp / "store")
        elsewhere = take(tmp / "c", tmp / "store")
    part = tensor_part(alone, "w")
    moved = tensor_part(shifted, "w")
    other_file = tensor_part(elsewhere, "w", "other.safetensors")
    assert moved.offset != part.offset and other_file.offset != part.offset
    assert moved.hash == part.hash == other_file.hash
    assert moved.chunk_ids() == part.chunk_ids() == other_file.chunk_ids()
    assert len({alone.root, shifted.root, elsewhere.root}) == 3
