"""Reading a manifest: the quick path check agrees with safe_relpath, a manifest reads back as it
was written, each part name and kind is one string object however many parts name it, and a
wrong field is one ManifestError."""

from __future__ import annotations

import itertools
import json

import pytest

from concord.errors import ManifestError, UnsafePathError
from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE, Manifest, _plain_relpath, make_file, make_part, safe_relpath

SEGMENTS = ["a", "b.txt", ".", "..", "", "...", ".x", "c:", "a b", "é", "x\\y", "n\x00", "/"]


def _accepted(path) -> bool:
    try:
        safe_relpath(path)
    except UnsafePathError:
        return False
    return True


@pytest.mark.parametrize(
    "path",
    ["", "/", "a", "/a", "a/", "a//b", "./a", "a/.", "a/./b", "../a", "a/..", "a/../b", "...", "a/.../b", "c:/x",
     "c:", "cc:", "a:b", "\\a", "a\\b", "a\x00b", ".hidden", "a/.b/c", 7, None, ["a"]],
)
def test_the_quick_path_check_accepts_what_safe_relpath_accepts(path):
    assert _plain_relpath(path) == _accepted(path)


def test_the_quick_path_check_agrees_on_every_join_of_three_segments():
    for parts in itertools.product(SEGMENTS, repeat=3):
        path = "/".join(parts)
        assert _plain_relpath(path) == _accepted(path), path


def _manifest() -> Manifest:
    files = []
    for i in range(50):
        parts = [make_part("data", "data", 0, 100 + i, [f"{i:064x}"])]
        files.append(make_file(f"shard-{i:03d}.dat", 100 + i, "blob", parts))
    header = make_part("header", "header", 0, 8, [f"{1000:064x}"])
    tensor = make_part("tensor", "w", 8, 16, [f"{1001:064x}"], dtype="F32", shape=[2, 2])
    files.append(make_file("model.safetensors", 24, "safetensors", [header, tensor]))
    return Manifest.build(DEFAULT_CHUNK_SIZE, files)


def test_a_manifest_reads_back_as_written_with_one_string_per_name_and_kind():
    m = _manifest()
    back = Manifest.from_json(m.to_json(), expected_root=m.root)
    assert back == m
    blobs = [f for f in back.files if f.kind == "blob"]
    assert len({id(f.kind) for f in blobs}) == 1
    assert len({id(f.parts[0].name) for f in blobs}) == 1
    assert len({id(f.parts[0].kind) for f in blobs}) == 1
    assert back.by_path["model.safetensors"].tensors[0].shape == (2, 2)


@pytest.mark.parametrize("field, value", [("kind", ["blob"]), ("kind", "zip"), ("path", 3), ("path", "a/../b"), ("size", -1)])
def test_a_wrong_file_field_is_one_manifest_error(field, value):
    m = _manifest()
    doc = json.loads(m.to_json())
    doc["files"][3][field] = value
    with pytest.raises((ManifestError, UnsafePathError)):
        Manifest.from_json(json.dumps(doc).encode(), expected_root=m.root)


@pytest.mark.parametrize("field, value", [("kind", {"x": 1}), ("name", 5), ("chunks", f"{0xABCDEF:064X}"), ("chunks", " " * 64)])
def test_a_wrong_part_field_is_one_manifest_error(field, value):
    m = _manifest()
    doc = json.loads(m.to_json())
    doc["files"][3]["parts"][0][field] = value
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(doc).encode(), expected_root=m.root)


@pytest.mark.parametrize("n", [0, 1, 1000, 2501])
def test_to_json_writes_the_bytes_of_the_whole_document_in_runs(n):
    files = [make_file(f"f{i:05d}", 1, "blob", [make_part("data", "data", 0, 1, [f"{i:064x}"])]) for i in range(n)]
    m = Manifest.build(DEFAULT_CHUNK_SIZE, files)
    whole = {"format": "concord/manifest@1", "root": m.root, "chunk_size": m.chunk_size, "files": [f.to_dict() for f in m.files]}
    assert m.to_json() == json.dumps(whole, separators=(",", ":")).encode()
    assert Manifest.from_json(m.to_json(), expected_root=m.root) == m
