"""A DCP checkpoint spread over three nodes' local disks, snapshotted by parts into one store: the
root of one snapshot of the whole folder, a byte-identical restore, and every way the parts can
fail to make one snapshot refused in one line with no manifest written and no ref moved."""

from __future__ import annotations

import json
import shutil

import pytest
from toy_checkpoints import files_equal, make_spread_checkpoint

from concord.errors import SourceNotFoundError, SpreadSnapshotError
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.spread import NodePart, assemble, snapshot_part
from concord.stores import LocalDirStore

CHUNK = 64 * 1024
REF = "ckpt/run"


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    """The whole checkpoint and its three node folders (read only: a test that changes a node
    folder works on a copy)."""
    return make_spread_checkpoint(tmp_path_factory.mktemp("spread"))


def _parts(store, folders, **kw) -> list[NodePart]:
    return [snapshot_part(f, store, node=f.name, chunk_size=CHUNK, **kw) for f in folders]


def _as_sent(parts: list[NodePart]) -> list[dict]:
    """The parts as a task runner hands them over: JSON."""
    return json.loads(json.dumps([p.to_dict() for p in parts]))


def test_parts_of_three_nodes_make_the_snapshot_of_the_whole_folder(spread, tmp_path):
    whole, nodes = spread
    single = snapshot(whole, LocalDirStore(tmp_path / "single"), chunk_size=CHUNK)
    store = LocalDirStore(tmp_path / "store")
    parts = _parts(store, nodes)
    assert [p.manifest.n_files for p in parts] == [4, 2, 2]  # node 0 holds the config and tokenizer too
    assert not list(store.iter_manifests())  # a part writes no manifest

    r = assemble(store, _as_sent(parts), nodes=[n.name for n in nodes], ref=REF)
    assert r.root == single.root
    assert r.manifest.to_json() == single.manifest.to_json()
    assert {f.kind for f in r.manifest.files if f.path.endswith(".distcp")} == {"dcp"}
    assert (r.files, r.chunks, r.bytes) == (single.files, single.chunks, single.bytes)
    assert r.new_chunks == single.new_chunks  # each chunk stored once, by one node
    assert store.read_ref(REF).root == r.root and r.previous is None and r.ref_version == 1
    assert list(store.iter_manifests()) == [r.root]

    out = tmp_path / "restored"
    restore(store, r.manifest, out)
    assert files_equal(whole, out)


def test_a_node_may_take_only_some_files_of_a_folder(spread, tmp_path):
    whole, nodes = spread
    store = LocalDirStore(tmp_path / "store")
    mine = ["config.json", "tokenizer.txt", "ckpt/.metadata", "ckpt/__0_0.distcp"]
    first = snapshot_part(whole, store, node="node-0", paths=mine, chunk_size=CHUNK)
    assert sorted(f.path for f in first.manifest.files) == sorted(mine)
    r = assemble(store, [first, *_parts(store, nodes[1:])])
    assert r.root == snapshot(whole, LocalDirStore(tmp_path / "single"), chunk_size=CHUNK).root
    with pytest.raises(SourceNotFoundError, match="nothere.bin"):
        snapshot_part(whole, store, node="node-0", paths=["nothere.bin"], chunk_size=CHUNK)


def _copy(nodes, tmp_path):
    out = [tmp_path / n.name for n in nodes]
    for src, dst in zip(nodes, out):
        shutil.copytree(src, dst)
    return out


def _refused(store, parts, match: str, **kw) -> None:
    before = (sorted(store.iter_manifests()), store.read_ref(REF))
    with pytest.raises(SpreadSnapshotError, match=match) as exc:
        assemble(store, parts, ref=REF, **kw)
    assert "\n" not in str(exc.value) and "No manifest was written and no ref moved" in str(exc.value)
    assert (sorted(store.iter_manifests()), store.read_ref(REF)) == before


@pytest.fixture
def moved(spread, tmp_path):
    """A store whose ref already names a snapshot, and the parts of the three nodes in it."""
    nodes = spread[1]
    store = LocalDirStore(tmp_path / "store")
    snapshot(nodes[1], store, ref=REF, chunk_size=CHUNK)
    return store, _parts(store, nodes), [n.name for n in nodes]


def test_a_node_that_never_reported_is_refused(moved):
    store, parts, names = moved
    _refused(store, _as_sent(parts[:2]), "node-2 never reported a part", nodes=names)
    _refused(store, parts, "node-9 never reported a part", nodes=[*names, "node-9"])
    _refused(store, parts, "node-2 reported a part but are not among", nodes=names[:2])
    _refused(store, [parts[0], parts[1], parts[1]], "node-1 reported two parts")
    _refused(store, [], "no node reported a part")


def test_a_path_two_nodes_report_differently_is_refused(spread, moved, tmp_path):
    store, parts, _ = moved
    node1 = _copy(spread[1][1:2], tmp_path)[0]
    (node1 / "config.json").write_text('{"ranks": 2}')  # node 0's says 3
    other = snapshot_part(node1, store, node="node-1", chunk_size=CHUNK)
    _refused(store, [parts[0], other, parts[2]], "config.json was reported by node node-0 and by node node-1 with different contents")


def test_a_part_whose_chunks_the_store_lacks_is_refused(spread, tmp_path):
    nodes = spread[1]
    store = LocalDirStore(tmp_path / "store")
    snapshot(nodes[1], store, ref=REF, chunk_size=CHUNK)
    elsewhere = snapshot_part(nodes[2], LocalDirStore(tmp_path / "elsewhere"), node="node-2", chunk_size=CHUNK)
    _refused(store, [*_parts(store, nodes[:2]), elsewhere], r"lacks 6 chunk\(s\) of node node-2's part")


def test_parts_cut_differently_are_refused(spread, moved, tmp_path):
    store, parts, _ = moved
    coarse = snapshot_part(spread[1][2], store, node="node-2", chunk_size=2 * CHUNK)
    _refused(store, [parts[0], parts[1], coarse], "different chunk sizes")
    node1 = _copy(spread[1][1:2], tmp_path)[0]
    (node1 / "ckpt" / ".metadata").unlink()  # its .distcp is cut as one blob without it
    blob = snapshot_part(node1, store, node="node-1", chunk_size=CHUNK)
    assert blob.manifest.files[0].kind == "blob"
    _refused(store, [parts[0], blob, parts[2]], r"node node-1 cut ckpt/__0_1.distcp as one blob .* copy ckpt/.metadata beside it")


def test_a_part_sent_with_a_forged_entry_is_refused(moved):
    store, parts, _ = moved
    sent = _as_sent(parts)
    doc = json.loads(sent[1]["manifest"])
    doc["files"][0]["size"] += 1
    sent[1]["manifest"] = json.dumps(doc)
    _refused(store, sent, "node node-1's part is not a valid manifest .*parts cover")
    sent[1] = {"folder": "x"}
    _refused(store, sent, "a part names no node")


def test_parts_that_do_not_cover_the_metadata_are_refused_unless_allowed(spread, moved):
    store, parts, names = moved
    # node-2 left out of the job's list as well: only the .metadata knows its shard is missing
    _refused(store, _as_sent(parts[:2]), r"ckpt/.metadata names 1 storage file\(s\) no node reported \(ckpt/__0_2.distcp \(rank 0\)\); run snapshot_part")
    _refused(store, parts[:1], r"names 2 storage file\(s\) .*ckpt/__0_1.distcp \(rank 0\), ckpt/__0_2.distcp .*--allow-incomplete", nodes=names[:1])
    r = assemble(store, parts[:2], nodes=names[:2], ref=REF, allow_incomplete=True)
    assert store.read_ref(REF).root == r.root
    assert sorted(f.path for f in r.manifest.files if f.path.endswith(".distcp")) == ["ckpt/__0_0.distcp", "ckpt/__0_1.distcp"]
