from __future__ import annotations

import dataclasses
import json
import os

import pytest
from safetensors import safe_open
from toy_checkpoints import SMALL_CHUNK, fine_tune, make_checkpoint

from concord.errors import ManifestError, SafetensorsError, SourceChangedError, SourceNotFoundError, UnsafePathError
from concord.hashing import chunk_id
from concord.snapshots.diff import diff_manifests
from concord.snapshots.manifest import Manifest, make_file, make_part
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore


def test_snapshot_counts_and_is_deterministic(ckpt, stores):
    a = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    b = snapshot(ckpt, stores[1], chunk_size=SMALL_CHUNK)
    assert a.root == b.root
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        n_tensors = len(list(f.keys()))
    assert a.tensors == n_tensors
    assert a.files == 4
    assert a.bytes == sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    assert a.new_chunks == len(set(a.manifest.chunk_lengths())) > 0
    assert a.new_bytes == sum(a.manifest.chunk_lengths().values())
    again = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    assert (again.root, again.new_chunks, again.new_bytes) == (a.root, 0, 0)


def test_chunks_start_at_each_tensors_first_byte(ckpt, stores):
    r = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    raw = (ckpt / "model.safetensors").read_bytes()
    entry = r.manifest.by_path["model.safetensors"]
    assert entry.parts[0].kind == "header"
    for part in entry.parts:
        spans = list(part.chunk_spans(SMALL_CHUNK))
        assert sum(n for _, _, n in spans) == part.length
        for cid, off, n in spans:
            assert chunk_id(raw[off : off + n]) == cid
            assert stores[0].get_chunk(cid) == raw[off : off + n]
        if spans:
            assert spans[0][1] == part.offset


def test_fine_tune_changes_only_its_tensors(ckpt, tmp_path, stores):
    base = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK, ref="m/x")
    names = ["layers.1.attn.q.weight", "layers.2.attn.k.weight"]
    ft = fine_tune(ckpt, tmp_path / "ft", names)
    new = snapshot(ft, stores[0], chunk_size=SMALL_CHUNK, ref="m/x")
    changed_parts = [p for p in new.manifest.by_path["model.safetensors"].parts if p.kind == "tensor" and p.name in names]
    assert new.new_chunks == sum(p.n_chunks for p in changed_parts)
    old_header = base.manifest.by_path["model.safetensors"].parts[0]
    assert new.manifest.by_path["model.safetensors"].parts[0].hash == old_header.hash
    d = diff_manifests(base.manifest, new.manifest)
    assert not d.same
    assert {(c.file, c.tensor, c.kind) for c in d.changes} == {("model.safetensors", n, "changed") for n in names}
    assert d.chunks_differing == new.new_chunks
    assert d.bytes_differing == sum(p.length for p in changed_parts)
    assert new.previous == base.root and new.ref_version == 2


def test_diff_files_added_removed_and_same(ckpt, tmp_path, stores):
    a = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    (ckpt / "config.json").unlink()
    (ckpt / "extra.txt").write_text("hello")
    b = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    d = diff_manifests(a.manifest, b.manifest)
    assert {(c.file, c.kind) for c in d.changes} == {("config.json", "removed"), ("extra.txt", "added")}
    assert d.chunks_differing == 1 and d.bytes_differing == 5
    assert diff_manifests(b.manifest, b.manifest).same


def test_diff_descends_only_where_hashes_differ(ckpt, stores):
    a = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK).manifest
    f = a.by_path["model.safetensors"]
    # same file hash but different parts: a walk that opened equal subtrees would see a change
    tampered = dataclasses.replace(f, parts=f.parts[:1])
    other = Manifest("f" * 64, a.chunk_size, tuple(tampered if x.path == f.path else x for x in a.files))
    assert diff_manifests(a, other).changes == ()


def test_manifest_round_trip_and_tamper_detection(ckpt, stores):
    r = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    data = stores[0].get_manifest_bytes(r.root)
    assert Manifest.from_json(data, expected_root=r.root) == r.manifest
    doc = json.loads(data)
    doc["files"][0]["size"] += 1
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(doc).encode(), expected_root=r.root)
    doc = json.loads(data)
    part = next(p for p in doc["files"][1]["parts"] if p["kind"] == "tensor" and p["chunks"])
    part["chunks"] = "0" * 64 + part["chunks"][64:]
    with pytest.raises(ManifestError, match="part hash"):
        Manifest.from_json(json.dumps(doc).encode())
    with pytest.raises(ManifestError, match="stored as"):
        Manifest.from_json(data, expected_root="a" * 64)


def test_manifest_paths_that_escape_are_refused():
    part = make_part("data", "", 0, 0, [])
    for bad in ("../evil", "/etc/passwd", "a/../../b", "a//b", "a\\b", "./a"):
        m = Manifest.build(1 << 20, [make_file(bad, 0, "blob", [part])])
        with pytest.raises(UnsafePathError):
            Manifest.from_json(m.to_json())


def test_missing_source(tmp_path, stores):
    with pytest.raises(SourceNotFoundError, match="no such file"):
        snapshot(tmp_path / "nope", stores[0])


@pytest.mark.parametrize(
    "payload, problem",
    [
        (b"\x01\x02", "truncated"),
        ((10**6).to_bytes(8, "little") + b"{}", "larger than the file"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{x", "JSON"),
        (b"PK\x03\x04 this is a zip" * 4, "header length"),
    ],
)
def test_bad_safetensors_write_nothing(tmp_path, payload, problem):
    src = tmp_path / "bad"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(payload)
    store = LocalDirStore(tmp_path / "store")
    with pytest.raises(SafetensorsError, match=problem):
        snapshot(src, store)
    assert list(store.iter_manifests()) == [] and store.list_refs() == []


def test_overlapping_offsets_refused(tmp_path):
    import struct

    header = json.dumps(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    ).encode()
    src = tmp_path / "x.safetensors"
    src.write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    with pytest.raises(SafetensorsError, match="overlap"):
        snapshot(src, LocalDirStore(tmp_path / "s"))


def test_bad_chunk_size(ckpt, stores):
    with pytest.raises(ValueError, match="chunk size"):
        snapshot(ckpt, stores[0], chunk_size=100)


def test_snapshot_of_one_file_and_load_manifest(tmp_path, stores):
    ck = make_checkpoint(tmp_path / "one", layers=1)
    r = snapshot(ck / "model.safetensors", stores[0], chunk_size=SMALL_CHUNK, ref="solo")
    assert r.files == 1
    assert load_manifest(stores[0], r.root).files[0].path == "model.safetensors"
    assert stores[0].read_ref("default/solo").root == r.root


class _WriterRacingStore(LocalDirStore):
    """A real store; while the snapshot writes its first chunk, another writer appends to the file."""

    target: str = ""

    def put_chunk_from_file(self, cid, fd, offset, length, data, **kw):
        wrote = super().put_chunk_from_file(cid, fd, offset, length, data, **kw)
        if self.target:
            with open(self.target, "ab") as f:
                f.write(b"more bytes from a writer that has not finished")
            self.target = ""
        return wrote


def test_file_changing_during_snapshot_keeps_nothing(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    big = src / "optimizer.bin"
    big.write_bytes(os.urandom(5 * SMALL_CHUNK))
    store = _WriterRacingStore(tmp_path / "s")
    store.target = str(big)
    with pytest.raises(SourceChangedError, match="changed while"):
        snapshot(src, store, chunk_size=SMALL_CHUNK, ref="x")
    assert list(store.iter_chunks()) == [] and list(store.iter_manifests()) == [] and store.read_ref("x") is None


def test_local_store_copies_chunks_from_the_file(ckpt, stores):
    r = snapshot(ckpt, stores[0], chunk_size=SMALL_CHUNK)
    for cid in r.manifest.chunk_lengths():
        assert stores[0].get_chunk(cid, verify=True)


@pytest.mark.parametrize("bad", ["t\n", "a/b/c", "../x", "", ".hidden", "a b", "x" * 129])
def test_ref_names_are_validated_exactly(bad, stores):
    from concord.errors import InvalidNameError

    with pytest.raises(InvalidNameError):
        stores[0].read_ref(bad)
