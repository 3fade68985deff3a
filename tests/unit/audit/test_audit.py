"""The audit core: one report from data drift, a contract, replicas and cards; its markdown, table
rows and PNG overlays; inputs named as people type them; the nights behind escalation."""

from __future__ import annotations

import json
import re
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from readable import MAX_WIDTH, markdown_tables, width

from concord.audit.drift import DriftThresholds, data_drift
from concord.audit.history import history_key, previous_nights, record_night
from concord.audit.inputs import audit_name, check_contract, load_table, model_holders, spec_name, store_labels
from concord.audit.render import (
    card_rows,
    column_rows,
    plot_histograms,
    plot_histograms_by_column,
    png_data_uri,
    render_markdown,
    replica_rows,
    worst_tensor_rows,
)
from concord.audit.report import AuditReport
from concord.audit.severity import worst
from concord.errors import DriftConfigError, LineageError
from concord.lineage.contracts import infer_contract
from concord.stores import LocalDirStore

PNG = b"\x89PNG\r\n\x1a\n"


def frames(n: int = 600, seed: int = 0, shift: float = 0.0, tilt: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A reference and a current table of the same process; ``shift`` moves ``mass`` in current,
    ``tilt`` makes one ``kind`` far more common there."""
    rng = np.random.default_rng(seed)

    def table(size: int, delta: float, weights) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "mass": rng.normal(4000, 500, size) + delta,
                "length": rng.normal(40, 5, size),
                "kind": rng.choice(["a", "b", "c"], size, p=weights),
            }
        )

    return table(n, 0.0, [1 / 3] * 3), table(n, shift, [0.8, 0.1, 0.1] if tilt else [1 / 3] * 3)


REPLICAS = {
    "reference": "us-east",
    "severity": "critical",
    "ok": False,
    "replicas": [
        {
            "cluster": "us-east",
            "store": "/s/us-east",
            "root": "a" * 64,
            "reference": True,
            "identical": True,
            "severity": "ok",
            "finding": "the reference replica",
        },
        {
            "cluster": "eu-central",
            "store": "/s/eu-central",
            "root": "b" * 64,
            "reference": False,
            "identical": False,
            "severity": "critical",
            "finding": "1 tensor differs: layer.0.attn.weight",
            "tensors_compared": 4,
            "tensors_identical_by_hash": 3,
            "tensors_failed": 1,
            "worst": [
                {
                    "tensor": "layer.0.attn.weight",
                    "file": "model.safetensors",
                    "dtype_reference": "F32",
                    "dtype_replica": "F32",
                    "shape": [4, 4],
                    "max_ulp": 2**31,
                    "mean_ulp": 1e9,
                    "max_abs_diff": 2.0,
                    "differing_share": 1.0,
                    "allclose": False,
                    "ok": False,
                }
            ],
        },
        {
            "cluster": "ap-south",
            "store": "/s/ap-south",
            "root": "c" * 64,
            "reference": False,
            "identical": False,
            "severity": "ok",
            "finding": "every tensor within 1 ULP of bf16",
            "tensors_compared": 4,
            "tensors_identical_by_hash": 0,
            "tensors_failed": 0,
            "worst": [
                {
                    "tensor": "embed.weight",
                    "file": "model.safetensors",
                    "dtype_reference": "F32",
                    "dtype_replica": "BF16",
                    "shape": [8, 4],
                    "max_ulp": 0,
                    "mean_ulp": 0.0,
                    "max_abs_diff": 0.001,
                    "differing_share": 0.0,
                    "allclose": True,
                    "ok": True,
                }
            ],
        },
    ],
}
CARDS = {
    "reference": "us-east",
    "required": ["license", "intended_use"],
    "severity": "warning",
    "ok": False,
    "clusters": [
        {"cluster": "us-east", "present": True, "missing_required": [], "differing": []},
        {"cluster": "ap-south", "present": True, "missing_required": ["intended_use"],
         "differing": [{"field": "license", "reference": "apache-2.0", "value": "cc-by-nc-4.0"}]},
        {"cluster": "eu-central", "present": True, "severity": "warning", "finding": "other fields differ: tags",
         "missing_required": [], "differing": [{"field": "tags", "reference": ["a"], "value": ["b"]}]},
    ],
}


# ----------------------------------------------------------------------------- assembly


def test_an_audit_is_as_severe_as_its_worst_section():
    ref, cur = frames(shift=800)
    drift = data_drift(ref, cur)
    contract = check_contract(infer_contract(ref, "toy", 1), cur)
    report = AuditReport.assemble(drift=drift, contract=contract)
    assert report.sections == {"data": "critical", "contract": "critical"}
    assert report.severity == "critical" and report.priority == "P0" and not report.ok
    d = report.to_dict()
    assert d["severity"] == "critical" and d["priority"] == "P0" and d["sections"]["data"] == "critical"
    by_name = {c["column"]: c for c in d["columns"]}
    assert set(by_name) == {"mass", "length", "kind"} and d["drift_share"] == pytest.approx(1 / 3)
    for c in d["columns"]:
        assert {"column", "psi", "kl", "js", "ks", "wasserstein", "severity"} <= c.keys()
    assert by_name["kind"]["ks"] is None and by_name["kind"]["wasserstein"] is None and by_name["mass"]["chi2"] is None
    assert by_name["mass"]["severity"] == "critical"
    assert d["contract"]["name"] == "toy" and d["contract"]["version"] == 1 and d["contract"]["ok"] is False
    assert any(f["column"] == "mass" and f["expectation"] == "expect_column_values_to_be_between" for f in d["contract"]["failed"])
    json.dumps(d)  # plain JSON all the way down
    assert report.verdict().startswith("CRITICAL (P0): data drift: 1 of 3 columns drifted")
    assert "toy@1 violated" in report.verdict()


def test_no_drift_and_a_met_contract_is_ok():
    ref, cur = frames(seed=3)
    report = AuditReport.assemble(drift=data_drift(ref, cur), contract=check_contract(infer_contract(pd.concat([ref, cur]), "toy", 1), cur))
    assert report.severity == "ok" and report.priority is None
    assert report.verdict() == "OK: data drift, contract checked, nothing drifted"
    assert report.drifted_columns() == []


def test_replicas_and_cards_bring_their_own_severities():
    report = AuditReport.assemble(replicas=REPLICAS, cards=CARDS)
    assert report.sections == {"replicas": "critical", "cards": "warning"}
    assert report.severity == "critical"
    summaries = report.summaries()
    assert summaries["replicas"] == "eu-central: 1 tensor differs: layer.0.attn.weight"
    assert summaries["cards"] == "ap-south: missing intended_use; differs in license; eu-central: other fields differ: tags"
    only_cards = AuditReport.assemble(cards=CARDS)
    assert only_cards.severity == "warning" and only_cards.priority == "P1"
    fine = AuditReport.assemble(replicas={**REPLICAS, "severity": "ok", "replicas": [REPLICAS["replicas"][0], REPLICAS["replicas"][2]]})
    assert fine.summaries()["replicas"] == "1 replica consistent with us-east (0 identical)"


def test_a_section_that_could_not_be_audited_counts_as_critical():
    report = AuditReport.assemble(cards={**CARDS, "severity": "ok", "clusters": CARDS["clusters"][:1]}, errors={"replicas": "store s3://x did not answer"})
    assert report.sections == {"replicas": "critical", "cards": "ok"}
    assert report.severity == "critical"
    assert "replicas: could not be audited: store s3://x did not answer" in report.verdict()
    with pytest.raises(ValueError, match="unknown sections"):
        AuditReport.assemble(errors={"weights": "?"})


def test_worst_and_empty_reports():
    assert worst([]) == "ok" and worst(["ok", "warning"]) == "warning" and worst(["critical", "warning"]) == "critical"
    assert AuditReport().severity == "ok" and AuditReport().verdict() == "OK: nothing audited"


# ----------------------------------------------------------------------------- rows and markdown


def test_column_rows_are_worst_first_and_empty_where_a_statistic_does_not_apply():
    ref, cur = frames(shift=800, tilt=True)
    rows = column_rows(AuditReport.assemble(drift=data_drift(ref, cur)))
    assert [r["column"] for r in rows][:2] == ["mass", "kind"] and rows[-1]["column"] == "length"
    assert rows[0]["severity"] == "critical (P0)" and rows[-1]["severity"] == "ok"
    kind = rows[1]
    assert kind["ks"] == "" and kind["wasserstein"] == "" and kind["chi2"].startswith(tuple("0123456789"))
    assert rows[0]["chi2"] == "" and "(p " in rows[0]["ks"]


def test_markdown_puts_the_verdict_first_and_names_what_drifted():
    ref, cur = frames(shift=800, tilt=True)
    report = AuditReport.assemble(
        drift=data_drift(ref, cur),
        reference={"label": "ref.parquet"},
        current={"label": "tonight.parquet"},
        contract=check_contract(infer_contract(ref, "toy", 1), cur),
        replicas=REPLICAS,
        cards=CARDS,
        model={"name": "minilm", "version": "2", "root": "a" * 64},
    )
    md = render_markdown(report, plots={"mass": "/tmp/p/drift-mass.png"}, links={"MLflow": "run `abc`"})
    lines = md.splitlines()
    assert lines[0] == "# Drift audit: **CRITICAL (P0)**"
    # the heading gives the level, the section list each finding, once
    assert lines[2].startswith("Audited: ") and md.count("2 of 3 columns drifted") == 1
    assert lines[4].startswith("- **data drift**: **critical (P0)**: 2 of 3 columns drifted")
    assert "data `ref.parquet` → `tonight.parquet`" in md and "model `minilm/2`" in md
    assert "| mass | numeric | critical (P0) |" in md and "| kind | categorical |" in md
    # every table fits the UI's artifact pane, sentences are lists below the tables
    tables = markdown_tables(md)
    assert [t[0] for t in tables][:2] == [["column", "kind", "severity", "effect", "psi"], ["column", "p", "js", "ks", "wasserstein", "chi2", "nulls"]]
    assert max(map(width, tables)) <= MAX_WIDTH and "- **data drift**: **critical (P0)**: " in md and "- `mass`: " in md
    assert "## Contract `toy@1`" in md and "expect_column_values_to_be_between" in md
    assert "### Worst tensors" in md and "layer.0.attn.weight" in md and "F32 → BF16" in md
    assert "## Model cards" in md and "cc-by-nc-4.0" in md
    assert "`/tmp/p/drift-mass.png`" in md and "- MLflow: run `abc`" in md
    assert md.index("# Drift audit") < md.index("## Data drift") < md.index("## Contract") < md.index("## Replicas") < md.index("## Model cards")


def test_markdown_of_a_quiet_night_says_ok():
    ref, cur = frames(seed=5)
    md = render_markdown(AuditReport.assemble(drift=data_drift(ref, cur)))
    assert md.startswith("# Drift audit: ok\n") and "checked, nothing drifted." in md


def test_replica_and_card_rows():
    rows = replica_rows(REPLICAS)
    assert [r["cluster"] for r in rows] == ["us-east", "eu-central", "ap-south"]
    assert rows[1]["identical"] == "no" and rows[1]["severity"] == "critical" and rows[1]["failed"] == 1
    worst_rows = worst_tensor_rows(REPLICAS)
    assert worst_rows[0]["tensor"] == "layer.0.attn.weight" and worst_rows[0]["ok"] == "✗"
    assert worst_rows[1]["dtype"] == "F32 → BF16" and worst_rows[1]["shape"] == "8×4"
    cards = card_rows(CARDS)
    assert (
        cards[1]["severity"] == "ok"
        and cards[1]["missing_required"] == "intended_use"
        and "license: cc-by-nc-4.0 (reference apache-2.0)" == cards[1]["differing"]
    )


# ----------------------------------------------------------------------------- histograms


def test_pngs_are_written_for_drifted_columns_only(tmp_path):
    ref, cur = frames(shift=800, tilt=True)
    report = AuditReport.assemble(drift=data_drift(ref, cur))
    by_column = plot_histograms_by_column(report, ref, cur, tmp_path / "plots")
    assert list(by_column) == ["mass", "kind"]  # worst first; length did not drift
    for path in by_column.values():
        data = Path(path).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["drift-kind.png", "drift-mass.png"]


def test_the_report_draws_its_histograms_inline_as_data_uris(tmp_path):
    import base64

    ref, cur = frames(shift=800, tilt=True)
    report = AuditReport.assemble(drift=data_drift(ref, cur))
    by_column = plot_histograms_by_column(report, ref, cur, tmp_path / "plots")
    gone = {**by_column, "lost": str(tmp_path / "plots" / "drift-lost.png")}  # a PNG that is not there
    md = render_markdown(report, plots=gone, embed=True, plots_where="the MLflow run's `histograms/` folder")
    images = re.findall(r"!\[([^\]]*)\]\((data:image/png;base64,[A-Za-z0-9+/=]+)\)", md)
    assert [alt.split(":")[0] for alt, _ in images] == ["mass", "kind"]  # worst first, each drawn
    for (_, uri), path in zip(images, by_column.values()):
        assert base64.b64decode(uri.split(",", 1)[1]) == Path(path).read_bytes()
    assert str(tmp_path) not in md  # no worker path in the report a person reads
    assert "Not drawn here: `lost` (`drift-lost.png`)." in md and "`histograms/` folder" in md
    assert png_data_uri(tmp_path / "plots" / "nothing.png") is None
    (tmp_path / "fake.png").write_text("not a png")
    assert png_data_uri(tmp_path / "fake.png") is None


def test_no_png_without_drift_nor_for_a_column_that_is_gone(tmp_path):
    ref, cur = frames(seed=2)
    assert plot_histograms(data_drift(ref, cur), ref, cur, tmp_path / "quiet") == []
    assert not (tmp_path / "quiet").exists()
    gone = data_drift(ref, cur.drop(columns=["mass"]))
    assert gone.column("mass").severity == "critical"
    assert plot_histograms(gone, ref, cur.drop(columns=["mass"]), tmp_path / "gone") == []


def test_a_report_rebuilt_from_its_dict_draws_from_the_tables(tmp_path):
    ref, cur = frames(shift=800)
    rebuilt = AuditReport.assemble(drift=data_drift(ref, cur).to_dict())
    assert rebuilt.drift is None
    assert plot_histograms(rebuilt, out_dir=tmp_path / "none") == []  # nothing to draw from
    (path,) = plot_histograms(rebuilt, ref, cur, tmp_path / "drawn")
    assert Path(path).name == "drift-mass.png" and Path(path).read_bytes().startswith(PNG)


def test_column_names_become_safe_distinct_file_names(tmp_path):
    rng = np.random.default_rng(1)
    ref = pd.DataFrame({"a/b": rng.normal(0, 1, 500), "a b": rng.normal(0, 1, 500), "many": rng.choice([f"c{i}" for i in range(40)], 500)})
    cur = pd.DataFrame({"a/b": rng.normal(3, 1, 500), "a b": rng.normal(3, 1, 500), "many": rng.choice([f"c{i}" for i in range(40, 80)], 500)})
    by_column = plot_histograms_by_column(data_drift(ref, cur), ref, cur, tmp_path)
    assert set(by_column) == {"a/b", "a b", "many"}
    names = sorted(Path(p).name for p in by_column.values())
    assert len(set(names)) == 3 and all(n.startswith("drift-a-b") or n == "drift-many.png" for n in names)


# ----------------------------------------------------------------------------- inputs


def test_tables_by_file_snapshot_id_and_data_ref(tmp_path):
    from concord.lineage.data import register_data

    ref, _ = frames(n=50)
    ref.to_parquet(tmp_path / "ref.parquet", index=False)
    ref.to_csv(tmp_path / "ref.csv", index=False)
    store = LocalDirStore(tmp_path / "registry")
    snap = register_data(ref, store, name="toy")

    df, src = load_table(str(tmp_path / "ref.parquet"))
    assert src.kind == "file" and src.name == "ref" and src.label == "ref.parquet" and len(df) == 50
    df, src = load_table(tmp_path / "ref.csv")
    assert src.label == "ref.csv" and list(df.columns) == ["mass", "length", "kind"]
    df, src = load_table(snap.id, store)
    assert (src.kind, src.name, src.id, src.label) == ("snapshot", "toy", snap.id, f"toy@{snap.id[:12]}") and len(df) == 50
    df, src = load_table("data/toy", store)
    assert src.id == snap.id


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: str(p / "missing.parquet"), "no such file"),
        (lambda p: str(p), "a folder, not a table"),
        (lambda p: (p / "t.txt").write_text("x") and str(p / "t.txt"), "unknown data format"),
        (lambda p: (p / "bad.parquet").write_bytes(b"not parquet") and str(p / "bad.parquet"), "cannot read it as parquet"),
        (lambda p: "   ", "is empty"),
    ],
)
def test_bad_inputs_say_what_to_give(tmp_path, make, message):
    with pytest.raises(DriftConfigError, match=message) as caught:
        load_table(make(tmp_path), which="current")
    assert str(caught.value).startswith("current: ")


def test_a_snapshot_needs_its_store(tmp_path):
    with pytest.raises(DriftConfigError, match="no data store"):
        load_table("data/toy")
    with pytest.raises(DriftConfigError, match="no data snapshot 'data/toy'"):
        load_table("data/toy", LocalDirStore(tmp_path / "empty"))
    with pytest.raises(DriftConfigError, match="no data snapshot"):
        load_table("f" * 64, LocalDirStore(tmp_path / "empty"))


def test_audit_data_reads_files_and_snapshots_in_batches_with_the_whole_tables_verdict(tmp_path):
    from concord.audit.report import audit_data
    from concord.lineage.data import register_data

    ref, cur = frames(n=3000, shift=400.0, tilt=True)
    ref.to_csv(tmp_path / "ref.csv", index=False)
    cur.to_parquet(tmp_path / "cur.parquet", index=False)
    store = LocalDirStore(tmp_path / "registry")
    snap = register_data(cur, store, name="tonight")
    contract = infer_contract(ref, "toy", 1)
    whole = data_drift(ref, cur).to_dict()
    for current in (str(tmp_path / "cur.parquet"), snap.id, "data/tonight"):
        report = audit_data(str(tmp_path / "ref.csv"), current, store, contract=contract)
        d = report.to_dict()
        assert d["columns"] == whole["columns"] and d["rows_current"] == 3000
        assert report.sections == {"data": "critical", "contract": "critical"}  # mass moved past the bounds
        assert d["current"]["kind"] == ("file" if current.endswith(".parquet") else "snapshot")
        assert set(report.drift.histograms()) == {"mass", "length", "kind"}
    assert audit_data(str(tmp_path / "ref.csv"), str(tmp_path / "cur.parquet")).contract is None


def test_a_csv_column_that_turns_to_text_midway_is_compared_as_text(tmp_path):
    """Numbers for 5,000 rows, then a word: the whole column is text, as when the file is read whole."""
    from concord.audit.report import audit_data

    ref = pd.DataFrame({"code": np.arange(6000) % 7, "mass": np.arange(6000.0)})
    cur = ref.astype({"code": object})
    cur.loc[5500, "code"] = "seven"
    ref.to_csv(tmp_path / "ref.csv", index=False)
    cur.to_csv(tmp_path / "cur.csv", index=False)
    from concord.lineage.data import table_batches

    # blocks of ~1,000 rows: the word is in the sixth
    assert len(list(table_batches(tmp_path / "cur.csv", batch_bytes=8_000).read(["code"], False))) > 5
    streamed = audit_data(str(tmp_path / "ref.csv"), str(tmp_path / "cur.csv"), batch_bytes=8_000).drift
    code = streamed.column("code")
    assert code.severity == "critical" and code.finding.startswith("type changed: numeric (int64) in reference, categorical")
    assert code.n_current == 6000
    whole = data_drift(pd.read_csv(tmp_path / "ref.csv"), pd.read_csv(tmp_path / "cur.csv")).column("code")
    assert whole.severity == "critical" and whole.finding.startswith("type changed: numeric (int64) in reference, categorical")
    assert streamed.column("mass").to_dict() == data_drift(ref, cur).column("mass").to_dict()


def test_open_table_refuses_like_load_table(tmp_path):
    from concord.audit.inputs import open_table

    with pytest.raises(DriftConfigError, match="no such file"):
        with open_table(tmp_path / "missing.csv", which="current"):
            pass
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(DriftConfigError, match="unknown data format"):
        with open_table(tmp_path / "t.txt"):
            pass
    with pytest.raises(DriftConfigError, match="no data snapshot 'data/toy'"):
        with open_table("data/toy", LocalDirStore(tmp_path / "empty")):
            pass
    from concord.audit.report import audit_data

    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    (tmp_path / "ok.csv").write_text("a\n1\n")
    with pytest.raises(DriftConfigError, match="cannot read it as parquet") as caught:
        audit_data(tmp_path / "ok.csv", tmp_path / "bad.parquet")
    assert str(caught.value).startswith("current: ")
    # a row with too many fields deep in a CSV file is refused, as when the file is read whole
    (tmp_path / "ragged.csv").write_text("a,b\n" + "1,2\n" * 5000 + "1,2,3,4\n")
    with pytest.raises(DriftConfigError, match="Expected 2 fields in line 5002, saw 4") as caught:
        audit_data(tmp_path / "ragged.csv", tmp_path / "ok.csv", columns=["a"])
    assert str(caught.value).startswith("reference: ")


def test_names_of_inputs_and_stores():
    assert spec_name("data/datasets/penguins-reference.parquet") == "penguins-reference"
    assert spec_name("data/penguins~1") == "penguins" and spec_name("ab" * 32) == "ab" * 6
    a, b = audit_name("ref", "cur"), audit_name("ref", "cur")
    assert a == b and a.startswith("ref--cur-") and audit_name("ref", "cur2") != a
    assert audit_name("a/b", "c") != audit_name("a b", "c")  # same slug, different inputs
    assert history_key(a) == f"audits/{a}/nights.json"
    assert store_labels(["data/stores/us-east", "s3://b/eu-central"]) == ["us-east", "eu-central"]
    assert store_labels(["x/us-east", "y/us-east"]) == ["x/us-east", "y/us-east"]


def test_model_holders_resolves_an_alias_and_falls_back_to_the_source_store():
    version = SimpleNamespace(version=3)
    calls = []

    class FakeLineage:
        client = SimpleNamespace(get_model_version_by_alias=lambda name, alias: version)

        def model_lineage(self, name, v):
            calls.append(v)
            return {"root": "r" * 64, "replicas": [], "store": "/s/us-east"}

    held = model_holders(FakeLineage(), "minilm", "champion")
    assert held == {"name": "minilm", "version": "3", "root": "r" * 64, "stores": ["/s/us-east"]} and calls == ["3"]

    class Empty(FakeLineage):
        def model_lineage(self, name, v):
            return {"root": None, "replicas": []}

    with pytest.raises(LineageError, match="no snapshot root"):
        model_holders(Empty(), "minilm", 1)


# ----------------------------------------------------------------------------- nights


def test_previous_nights_follow_an_unbroken_run(tmp_path):
    store = LocalDirStore(tmp_path / "registry")
    name = audit_name("ref", "cur")
    assert previous_nights(store, name, "2025-01-05") == {}
    record_night(store, name, {"mass": "warning", "kind": "ok"}, "2025-01-02")
    record_night(store, name, {"mass": "ok", "kind": "ok"}, "2025-01-03")
    record_night(store, name, {"mass": "warning", "kind": "ok"}, "2025-01-03")  # a re-run replaces the night
    record_night(store, name, {"mass": "critical"}, "2025-01-04")
    assert previous_nights(store, name, "2025-01-05") == {"mass": ["warning", "warning", "critical"]}
    assert previous_nights(store, name, date(2025, 1, 4)) == {"mass": ["warning", "warning"], "kind": ["ok", "ok"]}
    assert previous_nights(store, name, "2025-01-07") == {}  # the 6th has no record: the chain is broken
    doc = json.loads(store.get_document(history_key(name)))
    assert [n["night"] for n in doc["nights"]] == ["2025-01-02", "2025-01-03", "2025-01-04"]
    assert doc["nights"][-1]["severity"] == "critical"
    with pytest.raises(DriftConfigError, match="YYYY-MM-DD"):
        previous_nights(store, name, "tonight")


def test_an_unreadable_history_starts_afresh(tmp_path):
    store = LocalDirStore(tmp_path / "registry")
    store.put_document(history_key("x"), b"{not json")
    assert previous_nights(store, "x", "2025-01-02") == {}
    record_night(store, "x", {"a": "ok"}, "2025-01-01")
    assert previous_nights(store, "x", "2025-01-02") == {"a": ["ok"]}


def test_a_warning_on_the_second_night_escalates_through_the_history(tmp_path):
    store = LocalDirStore(tmp_path / "registry")
    ref, cur = frames(n=2000, shift=150)
    limits = DriftThresholds(psi_warning=0.05, psi_critical=5.0)
    first = data_drift(ref, cur, thresholds=limits, history=previous_nights(store, "n", "2025-02-01"))
    assert first.column("mass").severity == "warning"
    record_night(store, "n", first.severities(), "2025-02-01")
    second = data_drift(ref, cur, thresholds=limits, history=previous_nights(store, "n", "2025-02-02"))
    assert second.column("mass").severity == "critical" and second.column("mass").escalated


def test_a_night_of_drift_escalates_records_and_draws(tmp_path):
    from concord.audit.nightly import nightly_drift

    ref, cur = frames(n=2000, shift=150)
    ref.to_parquet(tmp_path / "reference.parquet")
    cur.to_parquet(tmp_path / "current.parquet")
    history = LocalDirStore(tmp_path / "registry")
    limits = {"psi_warning": 0.05, "psi_critical": 5.0}
    kw = dict(name="n", thresholds=limits, plots_dir=str(tmp_path / "plots"))
    first = nightly_drift(str(tmp_path / "reference.parquet"), str(tmp_path / "current.parquet"), None, history, night="2025-02-01", **kw)
    second = nightly_drift(str(tmp_path / "reference.parquet"), str(tmp_path / "current.parquet"), None, history, night="2025-02-02", **kw)
    mass = [{c["column"]: c for c in r["drift"]["columns"]}["mass"] for r in (first, second)]
    assert mass[0]["severity"] == "warning" and mass[1]["severity"] == "critical" and mass[1]["escalated"]
    assert (second["name"], second["night"], second["history_key"]) == ("n", "2025-02-02", history_key("n"))
    assert first["history"] == {} and second["history"]["mass"] == ["warning"]
    assert second["reference"]["label"] == "reference.parquet" and Path(second["plots"]["mass"]).read_bytes().startswith(PNG)
    assert nightly_drift(str(tmp_path / "reference.parquet"), str(tmp_path / "current.parquet"), draw_plots=False, **kw)["plots"] == {}


def test_an_audit_summary_puts_the_worst_columns_first_and_cuts_every_list():
    from concord.audit.nightly import audit_summary

    ref, cur = frames(shift=800, tilt=True)
    contract = check_contract(infer_contract(ref, "toy", 1), cur)
    report = AuditReport.assemble(drift=data_drift(ref, cur), contract=contract).to_dict()
    s = audit_summary(report, name="penguins", night="2025-03-01", run_id="r1", plots=("a.png",), items=1)
    assert (s["audit"], s["night"], s["mlflow_run_id"], s["plots"]) == ("penguins", "2025-03-01", "r1", ["a.png"])
    assert (s["severity"], s["priority"]) == ("critical", "P0")
    assert s["drifted_count"] == len([c for c in report["columns"] if c["severity"] != "ok"]) >= 2
    assert [c["column"] for c in s["drifted_columns"]] == ["mass"]  # the worst one, and only one
    assert s["contract"]["ref"] == "toy@1" and len(s["contract"]["failed"]) == 1 < s["contract"]["failed_count"]
    json.dumps(s)


def test_each_columns_p_values_and_effects_are_metrics_and_what_is_not_finite_is_left_out():
    from concord.audit.tracking import audit_run, column_metrics

    ref = pd.DataFrame({"flat": np.zeros(500), "x": np.linspace(0, 1, 500), "k": ["a", "b"] * 250})
    cur = pd.DataFrame({"flat": np.ones(500), "x": np.linspace(0, 1, 500), "k": ["a", "b"] * 200 + ["c"] * 100})
    d = data_drift(ref, cur).to_dict()
    by = {c["column"]: c for c in d["columns"]}
    flat = column_metrics(by["flat"])
    assert by["flat"]["mean_shift"] is None and "mean_shift/flat" not in flat  # a constant reference: infinitely many σ
    assert column_metrics({"column": "c", "severity": "warning", "mean_shift": float("inf"), "scale_ratio": float("nan"), "pvalue": 0.0}) == {
        "pvalue/c": 0.0, "severity_rank/c": 1.0,
    }
    assert flat["pvalue_adjusted/flat"] == by["flat"]["pvalue_adjusted"] and flat["severity_rank/flat"] == 2
    x = column_metrics(by["x"])
    assert x["mean_shift/x"] == 0 and x["scale_ratio/x"] == 1 and x["severity_rank/x"] == 0 and x["pvalue/x"] == by["x"]["pvalue"]
    k = column_metrics(by["k"])
    assert k["new_share/k"] == pytest.approx(0.2) and k["effect/k"] == by["k"]["effect_size"] and "scale_ratio/k" not in k
    metrics = audit_run(d, "# report", name="t", night="2025-01-01")["metrics"]
    assert {**flat, **x, **k}.items() <= metrics.items()
    # a column only the current table has is not compared: no severity of its own
    assert "severity_rank/new" not in column_metrics({"column": "new", "severity": "ok", "compared": False})
