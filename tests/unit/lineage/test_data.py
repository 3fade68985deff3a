"""Data snapshots: identity is the content, loading gives the table back, bad input is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from blake3 import blake3
from pandas.testing import assert_frame_equal

from concord.errors import DataFormatError, DataSnapshotNotFoundError, IntegrityError, InvalidNameError
from concord.lineage.data import DataSnapshot, data_info, document_key, load_data, register_data, write_parquet
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.stores import LocalDirStore


@pytest.fixture
def frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": range(1, 201),
            "species": ["Adelie", "Gentoo", "Chinstrap", "Adelie"] * 50,
            "mass_g": [3000.0 + 7.5 * i for i in range(200)],
            "flag": [i % 3 == 0 for i in range(200)],
        }
    )


@pytest.fixture
def store(tmp_path: Path) -> LocalDirStore:
    return LocalDirStore(tmp_path / "store")


def _restored_file(store, snap: DataSnapshot, tmp_path: Path) -> Path:
    out = tmp_path / f"restored-{snap.id[:8]}"
    restore(store, load_manifest(store, snap.id), out)
    return out / snap.path


def test_same_frame_same_id_in_any_store(frame, store, tmp_path):
    a = register_data(frame, store, name="penguins")
    b = register_data(frame.copy(), store, name="penguins")
    c = register_data(frame.copy(), LocalDirStore(tmp_path / "elsewhere"), name="other-name")
    assert a.id == b.id == c.id
    assert a.digest == b.digest == c.digest
    # the ref records one version: the second registration changed nothing
    assert store.read_ref("data/penguins").version == 1


def test_a_changed_row_gives_a_new_id(frame, store):
    before = register_data(frame, store, name="penguins")
    changed = frame.copy()
    changed.loc[117, "mass_g"] += 0.5
    after = register_data(changed, store, name="penguins")
    assert after.id != before.id
    assert after.digest != before.digest
    ref = store.read_ref("data/penguins")
    assert [e.root for e in ref.history] == [before.id, after.id]
    # both remain loadable, each with its own content
    assert load_data(store, before.id).loc[117, "mass_g"] == frame.loc[117, "mass_g"]
    assert load_data(store, after.id).loc[117, "mass_g"] == frame.loc[117, "mass_g"] + 0.5


def test_reordered_rows_are_other_content(frame, store):
    a = register_data(frame, store, name="t")
    b = register_data(frame.iloc[::-1].reset_index(drop=True), store, name="t")
    assert a.id != b.id


def test_dataframe_facts_and_round_trip(frame, store, tmp_path):
    snap = register_data(frame, store, name="penguins")
    assert snap.format == "parquet"
    assert snap.path == "data.parquet"
    assert snap.rows == 200
    assert snap.columns == ("id", "species", "mass_g", "flag")
    assert snap.schema["id"] == "int64" and snap.schema["mass_g"] == "float64" and snap.schema["flag"] == "bool"
    assert snap.store == store.uri
    # the digest is BLAKE3 over every byte of the stored file, the size its length
    data = _restored_file(store, snap, tmp_path).read_bytes()
    assert snap.digest == blake3(data).hexdigest()
    assert snap.bytes == len(data)
    assert_frame_equal(load_data(store, snap.id), frame)
    assert data_info(store, snap.id) == snap
    doc = json.loads(store.get_document(document_key(snap.id)))
    assert (doc["rows"], doc["columns"], doc["format"], doc["name"]) == (200, list(snap.columns), "parquet", "penguins")
    assert doc["schema"] == snap.schema


def test_the_index_is_not_part_of_the_data(frame, store):
    shifted = frame.set_axis(range(1000, 1200))
    assert register_data(shifted, store, name="t").id == register_data(frame, store, name="t").id


def test_parquet_file_source(frame, store, tmp_path):
    path = tmp_path / "in" / "penguins.parquet"
    path.parent.mkdir()
    write_parquet(frame, path)
    snap = register_data(path, store, name="from-file")
    assert snap.format == "parquet" and snap.rows == 200
    assert snap.digest == blake3(path.read_bytes()).hexdigest()
    # the file name plays no part: the same bytes registered from a frame get the same id
    assert snap.id == register_data(frame, store, name="from-frame").id
    assert_frame_equal(load_data(store, snap.id), frame)
    assert path.exists()  # the source is left as it was


def test_csv_file_source(frame, store, tmp_path):
    path = tmp_path / "penguins.csv"
    frame.to_csv(path, index=False)
    snap = register_data(str(path), store, name="csv")
    assert snap.format == "csv" and snap.path == "data.csv"
    assert snap.rows == 200 and snap.columns == tuple(frame.columns)
    assert snap.digest == blake3(path.read_bytes()).hexdigest()
    assert snap.bytes == path.stat().st_size
    assert_frame_equal(load_data(store, snap.id), pd.read_csv(path))
    # CSV bytes are other content than the Parquet of the same table
    assert snap.id != register_data(frame, store, name="csv").id


@pytest.mark.parametrize("bad", ["", "../up", "a/b", ".hidden", "sp ace", "x" * 200])
def test_a_bad_name_is_refused_before_anything_is_written(frame, store, bad):
    with pytest.raises(InvalidNameError) as info:
        register_data(frame, store, name=bad)
    assert isinstance(info.value, ValueError)
    assert "letters, digits" in str(info.value)
    assert not os.listdir(store.root)


def test_unknown_format_and_folders_are_refused(store, tmp_path):
    txt = tmp_path / "notes.txt"
    txt.write_text("a,b\n1,2\n")
    with pytest.raises(DataFormatError, match="parquet"):
        register_data(txt, store, name="notes")
    with pytest.raises(DataFormatError, match="folder"):
        register_data(tmp_path, store, name="folder")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(DataFormatError, match="cannot read"):
        register_data(broken, store, name="broken")
    assert not os.listdir(store.root)


def test_unknown_ids_are_reported(frame, store):
    snap = register_data(frame, store, name="t")
    missing = "0" * 64
    with pytest.raises(DataSnapshotNotFoundError, match="register_data") as info:
        load_data(store, missing)
    assert isinstance(info.value, KeyError) and info.value.snapshot_id == missing
    with pytest.raises(DataSnapshotNotFoundError):
        data_info(LocalDirStore(store.root + "-empty"), snap.id)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        load_data(store, snap.id[:12])


def test_loading_verifies_every_chunk(frame, store):
    snap = register_data(frame, store, name="t")
    (cid,) = load_manifest(store, snap.id).files[0].parts[0].chunk_ids()
    path = Path(store.root, "chunks", cid[:2], cid)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        load_data(store, snap.id)


def test_to_dict_is_json(frame, store):
    snap = register_data(frame, store, name="t")
    d = json.loads(json.dumps(snap.to_dict()))
    assert d["id"] == snap.id and d["columns"] == list(snap.columns) and d["schema"] == snap.schema


# --------------------------------------------------------------------------- reading in batches


def _batched(path, names, **kwargs) -> list[pd.DataFrame]:
    from concord.lineage.data import table_batches

    return list(table_batches(path, **kwargs).read(names, False))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_batches_give_the_whole_table_back_in_pieces(frame, tmp_path, suffix):
    from concord.lineage.data import read_table, table_batches

    big = pd.concat([frame] * 50, ignore_index=True)  # 10,000 rows
    path = tmp_path / f"t{suffix}"
    big.to_csv(path, index=False) if suffix == ".csv" else big.to_parquet(path, index=False)
    big.to_parquet(path, index=False, row_group_size=700) if suffix == ".parquet" else None
    table = table_batches(path, batch_bytes=20_000)
    assert table.columns == ("id", "species", "mass_g", "flag")
    pieces = list(table.read(["mass_g", "species"], False))
    # each value of each column asked for in exactly one piece, in row order (CSV: blocks of rows
    # with both columns; parquet: one column of a few row groups at a time)
    whole = read_table(path)
    for name in ("mass_g", "species"):
        having = [p[name] for p in pieces if name in p.columns]
        assert len(having) > 5 and sum(len(p) for p in having) == len(big)
        glued = pd.concat(having, ignore_index=True)
        pd.testing.assert_series_equal(glued, whole[name])
    assert all(set(p.columns) <= {"mass_g", "species"} for p in pieces)
    # read again: from the start
    assert sum(len(p) for p in table.read(["id"], False)) == len(big)


def test_csv_batches_as_text_keep_the_written_text(tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_text("x\n" + "1.50\n" * 3000 + "n/a-ish\n")
    numbers = _batched(path, ["x"], batch_bytes=4096)
    assert numbers[0]["x"].dtype.kind == "f" and numbers[-1]["x"].dtype.kind != "f"  # typed block by block
    from concord.lineage.data import table_batches

    text = list(table_batches(path, batch_bytes=4096).read(["x"], True))
    assert set(pd.concat(text)["x"]) == {"1.50", "n/a-ish"}


def test_table_batches_refuse_what_they_cannot_read(tmp_path):
    from concord.lineage.data import table_batches

    with pytest.raises(DataFormatError, match="no such file"):
        table_batches(tmp_path / "nope.csv")
    (tmp_path / "t.txt").write_text("a\n1\n")
    with pytest.raises(DataFormatError, match="unknown data format"):
        table_batches(tmp_path / "t.txt")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataFormatError, match="cannot read it as parquet"):
        table_batches(tmp_path / "bad.parquet")
    (tmp_path / "empty.csv").write_bytes(b"")
    with pytest.raises(DataFormatError, match="cannot read it as csv"):
        table_batches(tmp_path / "empty.csv")


def test_parquet_batches_keep_every_numeric_dtype(tmp_path):
    """Integer and float columns without nulls are read without pandas' conversion: their batches
    are typed as read_table types the whole file, a nullable Int64 and a float with nulls included."""
    import numpy as np

    from concord.lineage.data import read_table, table_batches

    n = 3000
    df = pd.DataFrame({
        "f8": np.linspace(0, 1, n),
        "f4": np.linspace(0, 1, n).astype("float32"),
        "i8": np.arange(n),
        "u2": (np.arange(n) % 500).astype("uint16"),
        "nullable": pd.array(np.arange(n), dtype="Int64"),
        "holes": [np.nan if i % 7 == 0 else float(i) for i in range(n)],
    })
    path = tmp_path / "numbers.parquet"
    df.to_parquet(path, index=False, row_group_size=400)
    whole = read_table(path)
    pieces = list(table_batches(path, batch_bytes=30_000).read(list(df.columns), False))
    for name in df.columns:
        having = [p[name] for p in pieces if name in p.columns]
        assert len(having) > 1
        pd.testing.assert_series_equal(pd.concat(having, ignore_index=True), whole[name])
