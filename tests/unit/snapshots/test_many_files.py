"""Snapshots of many small files: bounded open files, local errors named as local, and manifests
of 100,000 files read back with the roots they always had."""

from __future__ import annotations

import json
import struct

from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from concord.hashing import FILE, PART, SNAPSHOT, canonical_json, flat_canonical_json
from concord.snapshots.manifest import (
    FORMAT,
    PART_KINDS,
    Manifest,
    file_meta,
    file_meta_json,
    make_file,
    make_part,
    part_meta,
    part_meta_json,
)

CHUNK = 64 * 1024


# --------------------------------------------------------------------------- an independent Merkle root


def _node(tag: bytes, meta: dict, children: list[str]) -> str:
    """The node hash as the format defines it, written out from its definition here."""
    m = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return blake3(tag + struct.pack("<I", len(m)) + m + b"".join(bytes.fromhex(c) for c in children)).hexdigest()


def _independent_root(chunk_size: int, files: list[dict]) -> str:
    """The root of a manifest document, computed from its definition (never Concord's code)."""
    file_hashes = []
    for f in sorted(files, key=lambda f: f["path"]):
        part_hashes = []
        for p in f["parts"]:
            meta = {"kind": p["kind"], "name": p["name"], "length": p["length"]}
            if p["kind"] == "tensor":
                meta |= {"dtype": p["dtype"], "shape": p["shape"]}
            cids = [p["chunks"][i : i + 64] for i in range(0, len(p["chunks"]), 64)]
            part_hashes.append(_node(PART, meta, cids))
        file_hashes.append(_node(FILE, {"path": f["path"], "size": f["size"], "kind": f["kind"]}, part_hashes))
    return _node(SNAPSHOT, {"format": FORMAT, "chunk_size": chunk_size}, file_hashes)


def _cid(i: int) -> str:
    return blake3(i.to_bytes(8, "little", signed=True)).hexdigest()


def _many_files(n: int) -> list:
    """``n`` file entries of every shape a snapshot makes: one-chunk blobs, empty files,
    multi-chunk blobs, safetensors files with a header and tensors, names with quotes, spaces,
    non-ASCII letters and emoji."""
    names = ["plain", 'quo"te', "sp ace", "ünïcødé", "emoji-\U0001f600", "br[a]ce{s}"]
    out = []
    for i in range(n):
        folder = f"shard-{i // 1000:03d}"
        name = f"{folder}/{names[i % len(names)]}-{i:06d}"
        if i % 97 == 0:  # a safetensors file: header + two tensors
            h, t1, t2 = 24, 2 * 3 * 4, CHUNK * 2 + 10
            parts = [
                make_part("header", "", 0, h, [_cid(i)]),
                make_part("tensor", f"layer.{i}.weight", h, t1, [_cid(i + 1)], "F32", (2, 3)),
                make_part("tensor", f"layer.{i}.bias \u00e9", h + t1, t2, [_cid(i + 2), _cid(i + 3), _cid(i + 4)], "U8", (t2,)),
            ]
            out.append(make_file(name + ".safetensors", h + t1 + t2, "safetensors", parts))
        elif i % 31 == 0:
            out.append(make_file(name + ".empty", 0, "blob", [make_part("data", "", 0, 0, [])]))
        elif i % 13 == 0:
            size = 3 * CHUNK + 1 + i % 1000
            out.append(make_file(name, size, "blob", [make_part("data", "", 0, size, [_cid(i), _cid(-i), _cid(i + n), _cid(i + 2 * n)])]))
        else:
            size = 50_000 + i % 1000
            out.append(make_file(name, size, "blob", [make_part("data", "", 0, size, [_cid(i)])]))
    return out


def test_a_manifest_of_100000_files_keeps_the_root_its_definition_gives_and_reads_back():
    manifest = Manifest.build(CHUNK, _many_files(100_000))
    data = manifest.to_json()
    doc = json.loads(data)
    assert manifest.root == _independent_root(CHUNK, doc["files"])
    back = Manifest.from_json(data, expected_root=manifest.root)
    assert back == manifest and back.root == manifest.root
    assert back.n_files == 100_000 and back.n_tensors == 2 * len(range(0, 100_000, 97))
    # read without verifying: the same objects
    assert Manifest.from_json(data, expected_root=manifest.root, verify=False) == manifest


def test_a_manifest_written_by_hand_as_earlier_versions_wrote_it_still_reads():
    # keys in another order, spaces after separators, indented: JSON as any writer may have left it
    files = [{"path": "a/b.bin", "size": 3, "kind": "blob", "hash": None,
              "parts": [{"kind": "data", "name": "", "offset": 0, "length": 3, "chunks": _cid(1), "hash": None}]}]
    p = files[0]["parts"][0]
    p["hash"] = _node(PART, {"kind": "data", "name": "", "length": 3}, [p["chunks"]])
    files[0]["hash"] = _node(FILE, {"path": "a/b.bin", "size": 3, "kind": "blob"}, [p["hash"]])
    root = _independent_root(CHUNK, files)
    doc = {"files": files, "chunk_size": CHUNK, "root": root, "format": FORMAT}
    m = Manifest.from_json(json.dumps(doc, indent=2).encode(), expected_root=root)
    assert m.root == root and m.files[0].parts[0].chunk_ids() == [_cid(1)]


_meta_values = st.one_of(
    st.text(max_size=8), st.integers(-(2**70), 2**70), st.none(), st.booleans(), st.floats(allow_nan=False),
    st.lists(st.integers(-5, 2**40), max_size=4), st.lists(st.text(max_size=3), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(meta=st.dictionaries(st.text(max_size=6), _meta_values, max_size=6))
def test_the_quick_node_metadata_is_the_canonical_json_byte_for_byte(meta):
    assert flat_canonical_json(meta) == canonical_json(meta)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(PART_KINDS), name=st.text(max_size=10), length=st.integers(0, 2**63 - 1),
    dtype=st.sampled_from(["F32", "BF16", "U8"]), shape=st.lists(st.integers(0, 2**20), max_size=4),
    path=st.text(min_size=1, max_size=12), fkind=st.sampled_from(["blob", "safetensors", "dcp"]),
)
def test_part_and_file_metadata_templates_are_their_canonical_json(kind, name, length, dtype, shape, path, fkind):
    shape = tuple(shape) if kind == "tensor" else None
    dtype = dtype if kind == "tensor" else None
    assert part_meta_json(kind, name, length, dtype, shape) == canonical_json(part_meta(kind, name, length, dtype, shape))
    assert file_meta_json(path, length, fkind) == canonical_json(file_meta(path, length, fkind))
