"""``concord audit ...``: the JSON contract, exit codes (0 ok or warning, 3 critical, 1 error with
one line on stderr), contracts, plots, data snapshots, and the human tables."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from concord.cli import main
from concord.lineage.contracts import infer_contract, save_contract
from concord.stores import LocalDirStore

COLUMN_KEYS = {"column", "psi", "kl", "js", "ks", "wasserstein", "severity"}


def run(capsys, *argv, json_out: bool = True):
    code = main([*map(str, argv), *(["--json"] if json_out else [])])
    out, err = capsys.readouterr()
    if not json_out:
        return code, out, err
    return code, (json.loads(out) if out.strip() else None), err


def table(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "mass": rng.normal(4000, 500, n) + shift,
            "length": rng.normal(40, 5, n),
            "kind": rng.choice(["a", "b", "c"], n),
        }
    )


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    out = {}
    for key, (seed, shift) in {"ref": (0, 0.0), "same": (1, 0.0), "warm": (2, 350.0), "hot": (3, 900.0)}.items():
        path = tmp_path / f"{key}.parquet"
        table(1500, seed, shift).to_parquet(path, index=False)
        out[key] = path
    out["csv"] = tmp_path / "same.csv"
    table(1500, 1).to_csv(out["csv"], index=False)
    return out


def test_no_drift_exits_0_with_the_json_contract(capsys, files):
    code, d, err = run(capsys, "audit", "data", files["ref"], files["csv"])
    assert code == 0 and err == ""
    assert d["severity"] == "ok" and d["priority"] is None and d["drift_share"] == 0.0
    assert [c["column"] for c in d["columns"]] == ["mass", "length", "kind"]
    for c in d["columns"]:
        assert COLUMN_KEYS <= c.keys()
    kind = d["columns"][2]
    assert kind["ks"] is None and kind["wasserstein"] is None and kind["psi"] is not None
    assert d["sections"] == {"data": "ok"} and "contract" not in d
    assert d["reference"]["label"] == "ref.parquet" and d["current"]["label"] == "same.csv"


def test_a_warning_exits_0_and_critical_exits_3(capsys, files):
    code, d, err = run(capsys, "audit", "data", files["ref"], files["warm"])
    assert code == 0 and err == ""
    assert d["severity"] == "warning" and d["priority"] == "P1"
    code, d, err = run(capsys, "audit", "data", files["ref"], files["hot"])
    assert code == 3 and d["severity"] == "critical" and d["priority"] == "P0"
    assert {c["column"]: c["severity"] for c in d["columns"]}["mass"] == "critical"
    assert err.count("\n") == 1 and err.startswith("concord: critical drift: CRITICAL (P0)") and "mass" in err


def test_thresholds_columns_and_bins(capsys, files):
    # PSI no longer decides alone: a 0.7σ shift of 1,500 rows is real and above the 0.05σ floor
    code, d, _ = run(capsys, "audit", "data", files["ref"], files["warm"], "--psi-warning", "5", "--psi-critical", "9")
    assert code == 0 and d["severity"] == "warning" and d["thresholds"]["psi_warning"] == 5.0
    mass = {c["column"]: c for c in d["columns"]}["mass"]
    assert mass["effect"].startswith("mean +0.") and "p < 1e-9" in mass["effect"] and mass["floor"] == 0.05
    # a floor above the shift (W ≈ 0.7σ) for that column alone makes it ok; the others keep the default
    code, d, _ = run(capsys, "audit", "data", files["ref"], files["warm"], "--psi-warning", "5", "--psi-critical", "9", "--floor", "mass=1")
    assert code == 0 and d["severity"] == "ok" and d["thresholds"]["floors"] == {"mass": 1.0}
    assert "real but small: effect 0.66" in {c["column"]: c for c in d["columns"]}["mass"]["finding"]
    code, d, _ = run(capsys, "audit", "data", files["ref"], files["warm"], "--floor", "2", "--psi-warning", "5", "--psi-critical", "9")
    assert d["severity"] == "ok" and d["thresholds"]["floor"] == 2.0 and d["thresholds"]["floors"] == {}
    code, d, _ = run(capsys, "audit", "data", files["ref"], files["hot"], "--columns", "kind,length", "--bins", "4")
    assert code == 0 and [c["column"] for c in d["columns"]] == ["kind", "length"] and d["bins"] == 4
    code, d, err = run(capsys, "audit", "data", files["ref"], files["hot"], "--psi-warning", "0.6", "--psi-critical", "0.5")
    assert code == 1 and d is None
    assert err.count("\n") == 1 and "psi_warning (0.6) must be below psi_critical (0.5)" in err


def test_contract_validation_lists_failing_expectations(capsys, files, tmp_path):
    registry = tmp_path / "registry"
    save_contract(LocalDirStore(registry), infer_contract(pd.read_parquet(files["ref"]), "toy", 1))
    code, d, err = run(capsys, "audit", "data", files["ref"], files["same"], "--contract", "toy@1", "--registry", registry)
    assert d["contract"]["name"] == "toy" and d["contract"]["version"] == 1
    # another sample of the same process strays past the reference's min and max somewhere
    assert d["contract"]["ok"] is False and code == 3 and d["sections"] == {"data": "ok", "contract": "critical"}
    assert all({"expectation", "column", "details"} <= f.keys() for f in d["contract"]["failed"])
    assert {f["expectation"] for f in d["contract"]["failed"]} == {"expect_column_values_to_be_between"}

    loose = infer_contract(pd.concat([pd.read_parquet(files[k]) for k in ("ref", "same")]), "toy", 2)
    save_contract(LocalDirStore(registry), loose)
    code, d, err = run(capsys, "audit", "data", files["ref"], files["same"], "--contract", "toy", "--registry", registry)
    assert code == 0 and d["contract"] == d["contract"] | {"name": "toy", "version": 2, "ok": True, "failed": []}


def test_plots_are_written_for_drifted_columns(capsys, files, tmp_path):
    code, d, _ = run(capsys, "audit", "data", files["ref"], files["hot"], "--plots", tmp_path / "plots")
    assert code == 3
    assert [Path(p).name for p in d["plots"]] == ["drift-mass.png"]
    assert Path(d["plots"][0]).read_bytes().startswith(b"\x89PNG")


def test_data_snapshots_by_id_and_ref(capsys, files, tmp_path):
    from concord.lineage.data import register_data

    registry = LocalDirStore(tmp_path / "registry")
    ref = register_data(files["ref"], registry, name="toy")
    cur = register_data(files["hot"], registry, name="toy-tonight")
    code, d, _ = run(capsys, "audit", "data", ref.id, "data/toy-tonight", "--registry", tmp_path / "registry")
    assert code == 3 and d["reference"]["id"] == ref.id and d["current"]["id"] == cur.id
    assert d["current"]["name"] == "toy-tonight"


@pytest.mark.parametrize(
    "argv, message",
    [
        (lambda f, t: [f["ref"], t / "missing.parquet"], "current: .*missing.parquet: no such file"),
        (lambda f, t: [(t / "notes.txt").write_text("hi") and t / "notes.txt", f["ref"]], "reference: .*unknown data format"),
        (lambda f, t: [f["ref"], (t / "bad.csv").write_bytes(b"\x00\xff\xfe") and t / "bad.csv"], "current: .*cannot read it as csv"),
        (lambda f, t: [f["ref"], f["same"], "--contract", "nope@1", "--registry", t / "registry"], "no contract 'nope@1'"),
        (lambda f, t: ["data/toy", f["same"], "--registry", t / "registry"], "reference: no data snapshot 'data/toy'"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(capsys, files, tmp_path, argv, message):
    for json_out in (True, False):
        code, out, err = run(capsys, "audit", "data", *argv(files, tmp_path), json_out=json_out)
        assert code == (10 if "no contract" in message else 1) and not out  # 10: a contract not found
        assert err.count("\n") == 1 and err.startswith("concord: error: ")
        import re

        assert re.search(message, err), err
    assert not (tmp_path / "registry").exists()  # a read-only audit creates no store


def test_human_output_is_a_table(capsys, files):
    code, out, err = run(capsys, "audit", "data", files["ref"], files["hot"], json_out=False)
    assert code == 3
    lines = out.splitlines()
    assert lines[0].startswith("CRITICAL (P0): data drift: 1 of 3 columns drifted")
    header = next(line for line in lines if "COLUMN" in line)
    assert header.split()[:7] == ["COLUMN", "KIND", "SEVERITY", "EFFECT", "PSI", "JS", "KS"]
    mass = next(line for line in lines if line.strip().startswith("mass"))
    assert "critical (P0)" in mass and "drift (P0)" in mass and "mean +1.8" in mass


# ----------------------------------------------------------------------------- replicas, cards, model

CARD = """---
license: apache-2.0
datasets:
- penguins
---

# toy

## Intended uses

Tests only.
"""


def variant(src: Path, dst: Path, change=None, card: str | None = None) -> Path:
    """A copy of checkpoint ``src``; ``change`` edits its state dict in place, ``card`` its README."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if change is not None:
        sd = load_file(str(dst / "model.safetensors"))
        change(sd)
        (dst / "model.safetensors").unlink()
        save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if card is not None:
        (dst / "README.md").write_text(card)
    return dst


@pytest.fixture
def clusters(tmp_path) -> dict[str, str]:
    """Four cluster stores holding models/toy: the original, a copy, a bf16 copy, and a copy
    with one tensor negated and the card's license changed."""
    import torch
    from toy_checkpoints import make_checkpoint

    from concord.snapshots.snapshot import snapshot

    base = make_checkpoint(tmp_path / "base")
    (base / "README.md").write_text(CARD)

    def to_bf16(sd):
        for k, t in list(sd.items()):
            sd[k] = t.to(torch.bfloat16) if t.dtype == torch.float32 else t

    def flip(sd):
        sd["layers.1.attn.q.weight"] = -sd["layers.1.attn.q.weight"]

    folders = {
        "us-east": base,
        "eu-central": base,
        "ap-south": variant(base, tmp_path / "bf16", to_bf16),
        "sa-east": variant(base, tmp_path / "bad", flip, CARD.replace("apache-2.0", "cc-by-nc-4.0")),
    }
    out = {}
    for cluster, folder in folders.items():
        out[cluster] = str(tmp_path / "stores" / cluster)
        snapshot(folder, LocalDirStore(out[cluster]), ref="models/toy")
    return out


def test_replicas_find_the_flipped_tensor_and_pass_bf16(capsys, clusters):
    code, d, err = run(capsys, "audit", "replicas", "--ref", "models/toy", *clusters.values())
    assert code == 3 and d["severity"] == "critical" and d["sections"] == {"replicas": "critical"}
    by = {r["cluster"]: r for r in d["replicas"]["replicas"]}
    assert set(by) == set(clusters) and d["replicas"]["reference"] == "us-east"
    assert by["eu-central"]["identical"] and by["ap-south"]["severity"] == "ok" and not by["ap-south"]["identical"]
    assert by["sa-east"]["severity"] == "critical"
    assert by["sa-east"]["worst"][0]["tensor"] == "layers.1.attn.q.weight" and not by["sa-east"]["worst"][0]["ok"]
    assert "sa-east" in err and "critical" in err.lower()

    fine = [clusters[c] for c in ("us-east", "eu-central", "ap-south")]
    code, d, err = run(capsys, "audit", "replicas", "--ref", "models/toy", *fine)
    assert code == 0 and d["severity"] == "ok" and err == ""
    code, d, err = run(capsys, "audit", "replicas", "--ref", "models/toy", *fine, "--max-ulps", "0")
    # a bf16 copy rounds each value to nearest: 0 ULPs from the reference cast to bf16
    assert code == 0 and d["replicas"]["max_ulps"] == 0 and d["severity"] == "ok"


def test_replicas_human_output_names_the_worst_tensor(capsys, clusters):
    code, out, _ = run(capsys, "audit", "replicas", "--ref", "models/toy", clusters["us-east"], clusters["sa-east"], json_out=False)
    assert code == 3
    assert out.startswith("CRITICAL (P0): replicas: sa-east:")
    assert "worst tensors:" in out and "layers.1.attn.q.weight" in out
    assert any(line.split()[:2] == ["CLUSTER", "STORE"] for line in out.splitlines())


def test_cards_flag_the_changed_license(capsys, clusters):
    code, d, err = run(capsys, "audit", "cards", "--ref", "models/toy", *clusters.values(), "--require", "license,datasets,intended_use")
    assert code == 3 and d["sections"] == {"cards": "critical"}
    by = {c["cluster"]: c for c in d["cards"]["clusters"]}
    assert [x["field"] for x in by["sa-east"]["differing"]] == ["license"]
    assert by["sa-east"]["differing"][0]["value"] == "cc-by-nc-4.0" and by["sa-east"]["severity"] == "critical"
    assert all(by[c]["severity"] == "ok" for c in ("us-east", "eu-central", "ap-south"))
    code, d, _ = run(capsys, "audit", "cards", "--ref", "models/toy", clusters["us-east"], clusters["ap-south"])
    # the default required fields include retention, which this card lacks: a warning, exit 0
    assert code == 0 and d["severity"] == "warning" and "retention" in d["cards"]["clusters"][0]["missing_required"]


def test_replicas_and_cards_bad_input_is_one_line(capsys, clusters, tmp_path):
    code, d, err = run(capsys, "audit", "replicas", "--ref", "models/toy", clusters["us-east"], "--reference", "nowhere")
    assert code == 1 and d is None and err.count("\n") == 1 and "reference 'nowhere'" in err
    with pytest.raises(SystemExit) as usage:  # a wrong command line is argparse's exit 2, never a verdict
        main(["audit", "cards", "--ref", "models/toy", clusters["us-east"], "--require", ",", "--json"])
    assert usage.value.code == 2
    assert "give names separated by commas, e.g. license,retention" in capsys.readouterr().err


def test_model_audits_the_stores_lineage_records(capsys, clusters, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    from concord.lineage import Lineage
    from concord.snapshots.refs import resolve_root

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lineage = Lineage(tracking)
    us = LocalDirStore(clusters["us-east"])
    root = resolve_root(us, "models/toy")
    held = [clusters[c] for c in ("us-east", "eu-central")]
    mv = lineage.register_model_version("toy", root, held)
    lineage.client.set_registered_model_alias("toy", "champion", mv["version"])

    code, d, err = run(capsys, "audit", "model", "toy", "champion", "--tracking-uri", tracking, "--require", "license")
    assert code == 0, err
    assert d["model"]["root"] == root and d["model"]["version"] == str(mv["version"])
    assert sorted(d["model"]["stores"]) == sorted(os.path.abspath(h) for h in held)
    assert d["sections"] == {"replicas": "ok", "cards": "ok"}
    code, d, err = run(capsys, "audit", "model", "toy", "9", "--tracking-uri", tracking)
    assert code == 1 and err.count("\n") == 1 and "toy/9" in err
