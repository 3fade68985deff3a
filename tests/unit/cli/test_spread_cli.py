"""``concord snapshot-part`` on each node, then ``concord snapshot-assemble`` once: a checkpoint
spread over three nodes' disks snapshotted through the CLI, with the root ``concord snapshot`` of
the whole folder gives; a part left out, a damaged part file or a wrong node list refused in one
line, nothing written."""

from __future__ import annotations

import json

import pytest
from toy_checkpoints import files_equal, make_spread_checkpoint

from concord.cli import main
from concord.errors import SpreadSnapshotError
from concord.stores import LocalDirStore


def run(capsys, *argv, as_json: bool = True):
    code = main([*argv, "--json"] if as_json else list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if as_json and out.strip() else out), err


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    return make_spread_checkpoint(tmp_path_factory.mktemp("spread"))


def _parts(capsys, nodes, store: str, out) -> list[str]:
    files = []
    for folder in nodes:
        part = str(out / f"{folder.name}.json")
        code, d, err = run(capsys, "snapshot-part", str(folder), "--store", store, "--node", folder.name, "--out", part, "--chunk-size", "64K")
        assert code == 0, err
        assert d["node"] == folder.name and d["part_file"] == part and "manifest" not in d
        files.append(part)
    return files


def test_parts_taken_on_each_node_assemble_into_the_whole_folders_snapshot(spread, tmp_path, capsys):
    whole, nodes = spread
    code, single, _ = run(capsys, "snapshot", str(whole), "--store", str(tmp_path / "single"), "--chunk-size", "64K")
    assert code == 0
    store = str(tmp_path / "store")
    parts = _parts(capsys, nodes, store, tmp_path / "parts")
    assert not list(LocalDirStore(store).iter_manifests())  # a part writes no manifest

    names = ",".join(n.name for n in nodes)
    code, r, err = run(capsys, "snapshot-assemble", *parts, "--store", store, "--nodes", names, "--ref", "ckpt/run", "--message", "step 1")
    assert code == 0, err
    assert r["root"] == single["root"] and r["nodes"] == [n.name for n in nodes]
    assert (r["files"], r["chunks"], r["new_chunks"]) == (single["files"], single["chunks"], single["new_chunks"])
    assert r["ref"] == "ckpt/run" and r["ref_version"] == 1
    assert LocalDirStore(store).read_ref("ckpt/run").history[-1].message == "step 1"

    code, shown, _ = run(capsys, "snapshot-assemble", *parts, "--store", store, "--ref", "ckpt/run", as_json=False)
    assert code == 0 and f"snapshot {single['root']}" in shown and "assembled from 3 part(s): node-0, node-1, node-2" in shown
    assert run(capsys, "restore", store, "--ref", "ckpt/run", str(tmp_path / "out"))[0] == 0
    assert files_equal(whole, tmp_path / "out")


def _refused(capsys, store: str, *argv, match: str) -> None:
    before = sorted(LocalDirStore(store).iter_manifests()), LocalDirStore(store).read_ref("ckpt/run")
    code, _, err = run(capsys, "snapshot-assemble", *argv, "--store", store, "--ref", "ckpt/run")
    assert code == SpreadSnapshotError.exit_code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("concord: error: spread snapshot refused: "), err
    assert match in lines[0], lines[0]
    assert (sorted(LocalDirStore(store).iter_manifests()), LocalDirStore(store).read_ref("ckpt/run")) == before


def test_a_part_left_out_a_damaged_part_file_or_a_wrong_node_list_is_refused(spread, tmp_path, capsys):
    _, nodes = spread
    store = str(tmp_path / "store")
    parts = _parts(capsys, nodes, store, tmp_path / "parts")
    _refused(capsys, store, *parts[:2], match="ckpt/.metadata names 1 storage file(s) no node reported (ckpt/__0_2.distcp (rank 0))")
    _refused(capsys, store, *parts[:2], "--nodes", "node-0,node-1,node-2", match="node(s) node-2 never reported a part")
    bad = tmp_path / "bad.json"
    bad.write_text('{"node": "node-1", "manifest": ')
    _refused(capsys, store, parts[0], str(bad), parts[2], match=f"part file {bad} is not JSON")
    doc = json.loads((tmp_path / "parts" / "node-1.json").read_text())
    doc["manifest"] = doc["manifest"].replace('"size":', '"size":1', 1)
    bad.write_text(json.dumps(doc))
    _refused(capsys, store, parts[0], str(bad), parts[2], match="node node-1's part is not a valid manifest")

    code, r, err = run(capsys, "snapshot-assemble", *parts[:2], "--store", store, "--ref", "ckpt/run", "--allow-incomplete")
    assert code == 0, err
    assert r["files"] == 5 and LocalDirStore(store).read_ref("ckpt/run").root == r["root"]


def test_snapshot_part_takes_only_the_paths_named(spread, tmp_path, capsys):
    whole, _ = spread
    code, d, _ = run(
        capsys, "snapshot-part", str(whole), "--store", str(tmp_path / "s"), "--node", "n0", "--out", str(tmp_path / "p.json"),
        "--path", "config.json", "--path", "ckpt/.metadata",
    )
    assert code == 0 and d["files"] == 2
    part = json.loads((tmp_path / "p.json").read_text())
    assert sorted(f["path"] for f in json.loads(part["manifest"])["files"]) == ["ckpt/.metadata", "config.json"]
    code, _, err = run(
        capsys,
        "snapshot-part",
        str(whole),
        "--store",
        str(tmp_path / "s"),
        "--node",
        "n0",
        "--out",
        str(tmp_path / "q.json"),
        "--path",
        "nothere.bin",
    )
    assert code != 0 and "nothere.bin" in err and not (tmp_path / "q.json").exists()
