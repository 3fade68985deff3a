"""``concord info STORE``: what a plain, a compressed and an encrypted store hold, checked against
the objects on disk (their sizes) and the manifests (the raw sizes they give), with an orphan
chunk and a snapshot no ref names; and the stored bytes a snapshot line shows beside the raw."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from toy_checkpoints import fine_tune

from concord.cli import main
from concord.snapshots.refs import load_manifest
from concord.stores import LocalDirStore
from concord.stores.cipher import read_key_file

INFO_KEYS = {
    "store", "compress", "encryption", "refs", "manifests", "unreferenced_manifests", "damaged_manifests",
    "damaged_refs", "chunks", "named", "orphans", "collectable", "missing_chunks", "ratio", "frames",
}  # fmt: skip


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def info(capsys, store: Path, *extra) -> dict:
    code, out, err = run(capsys, "info", store, "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def on_disk(store: Path) -> tuple[int, int]:
    """(number, total size) of the chunk objects in a folder store, as the filesystem sees them."""
    sizes = [f.stat().st_size for f in (store / "chunks").rglob("*") if f.is_file() and not f.name.startswith(".")]
    return len(sizes), sum(sizes)


def raw_of(store: Path, roots: list[str], key: Path | None = None) -> int:
    """The raw bytes the manifests of ``roots`` stand for, each distinct chunk once."""
    s = LocalDirStore(store)
    if key is not None:
        s.unlock(read_key_file(str(key)))
    lengths: dict[str, int] = {}
    for root in roots:
        lengths.update(load_manifest(s, root).chunk_lengths())
    return sum(lengths.values())


@pytest.fixture
def stores(tmp_path, ckpt, capsys, monkeypatch):
    """A plain, a compressed and an encrypted compressed store, each holding ``ckpt`` under ref
    ``m`` (64 KiB chunks); with the snapshot's own answer for each."""
    monkeypatch.delenv("CONCORD_KEY_FILE", raising=False)
    monkeypatch.setenv("CONCORD_NO_PROGRESS", "1")
    plain, packed, sealed, key = tmp_path / "plain", tmp_path / "packed", tmp_path / "sealed", tmp_path / "s.key"
    assert run(capsys, "init", packed, "--compress", "auto")[0] == 0
    assert run(capsys, "init", sealed, "--compress", "auto", "--encrypt", "--key-file", key)[0] == 0
    snaps = {}
    for store in (plain, packed, sealed):
        extra = ["--key-file", key] if store == sealed else []
        code, out, err = run(capsys, "snapshot", ckpt, "--store", store, "--ref", "m", "--chunk-size", "64K", "--json", *extra)
        assert code == 0, err
        snaps[store.name] = json.loads(out)
    return plain, packed, sealed, key, snaps


def test_info_counts_what_each_store_really_holds(stores, capsys):
    plain, packed, sealed, key, snaps = stores
    root = snaps["plain"]["root"]
    raw = raw_of(plain, [root])
    for store in (plain, packed, sealed):
        u = info(capsys, store, *(["--key-file", key] if store == sealed else []))
        assert set(u) == INFO_KEYS
        count, size = on_disk(store)
        assert (u["refs"], u["manifests"], u["unreferenced_manifests"], u["missing_chunks"]) == (1, 1, 0, 0)
        assert u["chunks"] == u["named"] == {"count": count, "stored_bytes": size, "raw_bytes": raw}
        assert u["orphans"] == u["collectable"] == {"count": 0, "stored_bytes": 0, "raw_bytes": 0}
        assert u["ratio"] == round(size / raw, 4)
        # the first snapshot into an empty store wrote every chunk: it said what they take
        assert snaps[store.name]["new_stored_bytes"] == size and snaps[store.name]["new_bytes"] == raw
    assert info(capsys, plain)["frames"] is None and info(capsys, plain)["ratio"] == 1.0

    # compressed: smaller than raw, and each chunk's frame counted, the float tensors as byte planes
    u = info(capsys, packed)
    assert u["compress"] == "auto" and u["encryption"] is None and u["ratio"] < 0.9
    frames = u["frames"]
    assert frames["byte_planes"]["count"] > 0 and frames["raw"]["count"] > 0  # the random tokenizer stays raw
    assert sum(f["count"] for f in frames.values()) == u["chunks"]["count"]
    assert sum(f["stored_bytes"] for f in frames.values()) == u["chunks"]["stored_bytes"]
    assert sum(f["raw_bytes"] for f in frames.values()) == raw

    # encrypted: the same frames, read beside the nonce without the key doing any work
    s = info(capsys, sealed, "--key-file", key)
    key_id = LocalDirStore(sealed)
    key_id.unlock(read_key_file(str(key)))
    assert s["encryption"] == {"algorithm": "AES-256-GCM", "key_id": key_id.encoding().cipher.key_id}
    assert {k: v["count"] for k, v in s["frames"].items()} == {k: v["count"] for k, v in frames.items()}
    assert s["chunks"]["stored_bytes"] > u["chunks"]["stored_bytes"]  # a nonce and a tag each

    code, out, err = run(capsys, "info", sealed, "--key-file", key)
    assert code == 0, err
    assert key.read_text().strip() not in out and key_id.encoding().cipher.key_id in out
    assert "compress auto; encrypted (AES-256-GCM" in out and "× of raw)" in out and "byte planes" in out
    # --no-frames reads no chunk: no frame counts
    assert info(capsys, sealed, "--key-file", key, "--no-frames")["frames"] is None


def test_an_orphan_and_a_snapshot_no_ref_names_are_counted_apart(stores, ckpt, tmp_path, capsys):
    plain, packed, sealed, key, snaps = stores
    other = fine_tune(ckpt, tmp_path / "ft", ["layers.0.attn.q.weight"])
    for store in (plain, packed):
        code, out, err = run(capsys, "snapshot", other, "--store", store, "--chunk-size", "64K", "--json")  # no ref
        assert code == 0, err
        ft = json.loads(out)
        before = on_disk(store)
        orphan = os.urandom(3000)
        from concord.hashing import chunk_id

        s = LocalDirStore(store)
        assert s.put_chunk(chunk_id(orphan), orphan)
        count, size = on_disk(store)
        orphan_size = size - before[1]

        u = info(capsys, store)
        assert (u["manifests"], u["unreferenced_manifests"]) == (2, 1)
        assert u["chunks"]["count"] == count and u["chunks"]["stored_bytes"] == size
        assert u["named"]["raw_bytes"] == raw_of(store, [snaps["plain"]["root"], ft["root"]])
        bare = store == plain  # a plain store keeps raw bytes: the orphan's raw size is its size
        assert u["orphans"] == {"count": 1, "stored_bytes": orphan_size, "raw_bytes": orphan_size if bare else None}
        # GC takes the orphan and the chunks only the unreferenced snapshot holds
        assert u["collectable"]["count"] == 1 + ft["new_chunks"]
        assert u["collectable"]["stored_bytes"] == orphan_size + ft["new_stored_bytes"]

        code, out, err = run(capsys, "info", store)
        assert code == 0, err
        assert "snapshots    2 (1 no ref names)" in out
        assert "orphans    1 no manifest names" in out
        assert ("raw size unknown" in out) != bare
        assert f"collectable  {1 + ft['new_chunks']} chunk(s)" in out


def test_a_wrong_or_missing_key_is_one_line(stores, tmp_path, capsys):
    plain, packed, sealed, key, snaps = stores
    wrong = tmp_path / "wrong.key"
    wrong.write_text("11" * 32)
    code, out, err = run(capsys, "info", sealed, "--key-file", wrong)
    assert (code, out) == (12, "") and len(err.strip().splitlines()) == 1
    assert f"store {sealed} is encrypted: the key given" in err and "is not this store's key" in err
    code, out, err = run(capsys, "info", sealed)
    assert code == 12 and len(err.strip().splitlines()) == 1 and "no key was given" in err
    code, out, err = run(capsys, "info", tmp_path / "nothing-here")
    assert code == 10 and len(err.strip().splitlines()) == 1 and "nothing-here" in err


def test_snapshot_lines_show_stored_bytes_beside_raw_where_the_store_encodes(stores, ckpt, tmp_path, capsys):
    plain, packed, sealed, key, snaps = stores
    other = fine_tune(ckpt, tmp_path / "ft", ["layers.1.attn.q.weight"])
    code, out, _ = run(capsys, "snapshot", other, "--store", packed, "--chunk-size", "64K")
    assert code == 0 and "KiB stored)" in out
    code, out, _ = run(capsys, "snapshot", other, "--store", plain, "--chunk-size", "64K")
    assert code == 0 and "new in" in out and "stored" not in out
