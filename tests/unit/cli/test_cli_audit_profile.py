"""``concord audit profile``: a table's profile into a file, a data snapshot's stored beside it, a
table's parts merged; ``concord audit data`` against a profile file or a stored profile, with the
raw reference's report."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from concord.cli import main
from concord.stores import LocalDirStore


def run(capsys, *argv, json_out: bool = True):
    code = main([*map(str, argv), *(["--json"] if json_out else [])])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if json_out and out.strip() else out), err


def table(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"mass": rng.normal(4000, 500, n) + shift, "kind": rng.choice(["a", "b", "c"], n)})


@pytest.fixture
def files(tmp_path):
    out = {}
    for key, (seed, shift) in {"ref": (0, 0.0), "same": (1, 0.0), "hot": (3, 900.0)}.items():
        out[key] = tmp_path / f"{key}.parquet"
        table(3000, seed, shift).to_parquet(out[key], index=False)
    whole = pd.read_parquet(out["ref"])
    for i, part in enumerate((whole.iloc[:1000], whole.iloc[1000:])):
        out[f"part{i}"] = tmp_path / f"part{i}.parquet"
        part.to_parquet(out[f"part{i}"], index=False)
    return out


def _columns(d: dict) -> list[dict]:
    return d["columns"]


def test_a_profile_file_audits_like_its_table(capsys, files, tmp_path):
    out = tmp_path / "ref.profile"
    code, d, err = run(capsys, "audit", "profile", files["ref"], "--out", out)
    assert code == 0 and err == "" and d["out"] == str(out) and d["bytes"] == out.stat().st_size
    assert d["profile"]["rows"] == 3000 and [c["column"] for c in d["profile"]["columns"]] == ["mass", "kind"]
    for current, severity, status in (("same", "ok", 0), ("hot", "critical", 3)):
        code, against, _ = run(capsys, "audit", "data", out, files[current])
        _, raw, _ = run(capsys, "audit", "data", files["ref"], files[current])
        assert code == status and against["severity"] == severity
        assert _columns(against) == _columns(raw)
        assert against["reference"]["kind"] == "profile" and against["reference"]["label"] == "ref.profile"
    # the table written in two parts, profiled part by part and merged: the same report here
    merged = tmp_path / "merged.profile"
    code, d, _ = run(capsys, "audit", "profile", files["part0"], files["part1"], "--out", merged)
    assert code == 0 and d["parts"] == 2 and d["profile"]["rows"] == 3000
    code, against, _ = run(capsys, "audit", "data", merged, files["hot"])
    assert code == 3 and {c["column"]: c["severity"] for c in _columns(against)} == {c["column"]: c["severity"] for c in _columns(raw)}
    # human output: a table of the columns
    code, text, _ = run(capsys, "audit", "profile", files["ref"], "--out", out, json_out=False)
    assert code == 0 and "profile of ref.parquet: 3000 rows, 2 columns" in text and "written to" in text


def test_a_data_snapshots_profile_is_stored_beside_it_and_used_by_audit_data(capsys, files, tmp_path):
    registry = tmp_path / "registry"
    code, _, _ = run(capsys, "data", "register", files["ref"], "--name", "ref", "--registry", registry, "--no-track")
    assert code == 0
    _, raw, _ = run(capsys, "audit", "data", "data/ref", files["hot"], "--registry", registry)
    assert raw["reference"]["profile"] is None
    code, d, err = run(capsys, "audit", "profile", "data/ref", "--registry", registry)
    assert code == 0 and err == "", err
    store = LocalDirStore(registry)
    data_id = store.read_ref("data/ref").root
    assert d["stored"]["ref"] == f"profiles/{data_id}" and store.read_ref(d["stored"]["ref"]).root == d["stored"]["root"]
    code, against, _ = run(capsys, "audit", "data", "data/ref", files["hot"], "--registry", registry)
    assert code == 3 and against["reference"]["profile"] == d["stored"]["root"] and against["reference"]["id"] == data_id
    assert _columns(against) == _columns(raw)
    _, off, _ = run(capsys, "audit", "data", "data/ref", files["hot"], "--registry", registry, "--profile", "off")
    assert off["reference"]["profile"] is None and _columns(off) == _columns(raw)


def test_bad_profile_commands_say_what_to_do(capsys, files, tmp_path):
    code, _, err = run(capsys, "audit", "profile", files["ref"])
    assert code == 1 and "--out FILE" in err and err.count("\n") == 1
    bad = tmp_path / "bad.profile"
    bad.write_bytes(b"not a profile at all")
    code, _, err = run(capsys, "audit", "data", bad, files["same"])
    assert code == 15 and "bad.profile" in err and "not a zip archive" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as usage:
        main(["audit", "data", str(files["ref"]), str(files["same"]), "--profile", "sometimes"])
    assert usage.value.code == 2 and "invalid choice: 'sometimes'" in capsys.readouterr().err
