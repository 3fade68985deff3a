"""Schema contracts on real data: the Palmer penguins (344 rows, with a few nulls).

Inference, validation through great-expectations, the backward-compatibility rules, storage, and
properties of ``compatible`` checked by hypothesis. The contract is inferred on the raw data, nulls
included, so it has required columns (species, island, year) and optional ones (the measurements
and sex, each with a few nulls) - both kinds are exercised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from palmerpenguins import load_penguins

from concord.errors import ContractConflictError, ContractError, ContractNotFoundError
from concord.lineage.contracts import (
    COLUMN_TYPES,
    ColumnSpec,
    Contract,
    compatible,
    infer_contract,
    list_contracts,
    load_contract,
    save_contract,
    validate,
)
from concord.stores import LocalDirStore

MEASUREMENTS = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]


@pytest.fixture(scope="module")
def penguins() -> pd.DataFrame:
    return load_penguins()


@pytest.fixture(scope="module")
def contract(penguins) -> Contract:
    return infer_contract(penguins, "penguins")


def failed(result) -> set[tuple[str, str | None]]:
    return {(f.expectation, f.column) for f in result.failures}


def with_column(c: Contract, name: str, **changes) -> Contract:
    """``c`` one version later, with column ``name`` changed."""
    columns = tuple(replace(col, **changes) if col.name == name else col for col in c.columns)
    return replace(c, version=c.version + 1, columns=columns)


# --------------------------------------------------------------------------- import cost


def test_importing_contracts_loads_neither_pandas_nor_great_expectations():
    code = "import sys, concord.lineage.contracts; print('pandas' in sys.modules, 'great_expectations' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# --------------------------------------------------------------------------- inference


def test_infer_on_penguins_reads_types_nulls_bounds_and_labels(penguins, contract):
    by_name = {c.name: c for c in contract.columns}
    assert [c.name for c in contract.columns] == list(penguins.columns)
    assert {n: c.type for n, c in by_name.items()} == {
        "species": "string",
        "island": "string",
        **{m: "float" for m in MEASUREMENTS},
        "sex": "string",
        "year": "integer",
    }
    # required exactly where the data has no nulls
    assert {n for n, c in by_name.items() if c.required} == {
        n for n in penguins.columns if penguins[n].notna().all()
    } == {"species", "island", "year"}
    for m in MEASUREMENTS:
        assert (by_name[m].min, by_name[m].max) == (penguins[m].min(), penguins[m].max())
        assert by_name[m].allowed is None
    assert (by_name["year"].min, by_name["year"].max) == (2007.0, 2009.0)
    assert by_name["species"].allowed == ("Adelie", "Chinstrap", "Gentoo")
    assert by_name["island"].allowed == ("Biscoe", "Dream", "Torgersen")
    assert by_name["sex"].allowed == ("female", "male")
    assert contract.ref == "penguins@1"


def test_infer_options_turn_off_bounds_and_label_sets(penguins):
    c = infer_contract(penguins, "penguins", bounds=False, categories_max=2)
    by_name = {col.name: col for col in c.columns}
    assert all(col.min is None and col.max is None for col in c.columns)
    assert by_name["sex"].allowed == ("female", "male")  # 2 distinct values
    assert by_name["species"].allowed is None  # 3 > categories_max


def test_the_inferred_contract_validates_its_own_data(penguins, contract):
    dtypes = penguins.dtypes.copy()
    result = validate(contract, penguins)
    assert penguins.dtypes.equals(dtypes)  # the frame GX sees is a view, not the caller's
    assert result.success, result.failures
    assert result.failures == ()
    assert result.evaluated == len(contract.expectations()) == 22
    assert result.to_dict() == {"contract": "penguins@1", "success": True, "evaluated": 22, "failures": []}


def test_a_contract_inferred_without_nulls_rejects_the_nulls(penguins):
    strict = infer_contract(penguins.dropna(), "penguins")
    assert all(c.required for c in strict.columns)
    result = validate(strict, penguins)
    with_nulls = {c for c in penguins.columns if penguins[c].isna().any()}
    assert failed(result) == {("expect_column_values_to_not_be_null", c) for c in with_nulls}
    sex = next(f for f in result.failures if f.column == "sex")
    assert sex.details == f"{penguins['sex'].isna().sum()} of 344 values are null"


def test_inference_covers_every_type_and_validates_them(penguins):
    df = pd.DataFrame(
        {
            "flag": [True, False, True],
            "maybe": pd.array([True, None, False], dtype="boolean"),
            "count": pd.array([1, None, 3], dtype="Int64"),
            "small": pd.Series([1, 2, 3], dtype="uint8"),
            "label": pd.Categorical(["a", "b", "a"]),
            "text": pd.array(["x", "y", None], dtype="string"),
            "when": pd.to_datetime(["2024-01-01", "2024-06-01", "2025-01-01"], utc=True),
            "plain": pd.Series(["p", "q", "r"], dtype=object),
        }
    )
    c = infer_contract(df, "mixed")
    assert {col.name: col.type for col in c.columns} == {
        "flag": "boolean",
        "maybe": "boolean",
        "count": "integer",
        "small": "integer",
        "label": "category",
        "text": "string",
        "when": "datetime",
        "plain": "string",
    }
    assert validate(c, df).success
    # each column under every other type fails its type check, and only that
    for col in c.columns:
        for other in COLUMN_TYPES:
            if other == col.type or (col.type, other) in {("integer", "float"), ("category", "string")}:
                continue
            wrong = replace(c, columns=(ColumnSpec(col.name, other, required=False),))
            result = validate(wrong, df)
            assert failed(result) == {("expect_column_values_to_be_in_type_list", col.name)}, (col, other)


def test_inference_refuses_columns_of_mixed_kinds():
    df = pd.DataFrame({"mixed": pd.Series([1, "one", 2.5], dtype=object)})
    with pytest.raises(ContractError, match="mixed"):
        infer_contract(df, "bad")


# --------------------------------------------------------------------------- validation


def _negative_mass(df):
    df.loc[10, "body_mass_g"] = -100.0
    return df


def _unknown_species(df):
    df.loc[3, "species"] = "Emperor"
    return df


def _null_species(df):
    df.loc[7, "species"] = None
    return df


def _string_in_numeric(df):
    df = df.astype({"body_mass_g": object})
    df.loc[5, "body_mass_g"] = "heavy"
    return df


def _float_years(df):
    return df.astype({"year": "float64"})


@pytest.mark.parametrize(
    "break_it, expected, says",
    [
        (_negative_mass, {("expect_column_values_to_be_between", "body_mass_g")}, "-100.0"),
        (_unknown_species, {("expect_column_values_to_be_in_set", "species")}, "'Emperor'"),
        (_null_species, {("expect_column_values_to_not_be_null", "species")}, "1 of 344 values are null"),
        (lambda df: df.drop(columns=["island"]), {("expect_column_to_exist", "island")}, "missing"),
        (
            _string_in_numeric,
            {
                ("expect_column_values_to_be_in_type_list", "body_mass_g"),
                ("expect_column_values_to_be_between", "body_mass_g"),
            },
            "'heavy'",
        ),
        (_float_years, {("expect_column_values_to_be_in_type_list", "year")}, "float64"),
    ],
    ids=[
        "negative-mass", "unknown-species", "null-in-required", "missing-column", "string-in-numeric", "float-years",
    ],
)
def test_a_violating_slice_fails_naming_the_expectations(penguins, contract, break_it, expected, says):
    result = validate(contract, break_it(penguins.copy()))
    assert not result.success
    assert failed(result) == expected
    assert any(says in f.details for f in result.failures), result.failures
    assert json.loads(json.dumps(result.to_dict()))["failures"]


def test_a_missing_column_skips_its_other_checks_and_an_optional_one_may_be_absent(penguins, contract):
    without_island = validate(contract, penguins.drop(columns=["island"]))
    # island: exists (failed) instead of exists + type + not-null + in-set
    assert without_island.evaluated == len(contract.expectations()) - 3
    without_sex = validate(contract, penguins.drop(columns=["sex"]))
    assert without_sex.success  # sex is optional: it has nulls in the data
    assert without_sex.evaluated == len(contract.expectations()) - 2


def test_validation_prints_no_progress_bars(penguins, contract, capfd):
    validate(contract, penguins)
    out, err = capfd.readouterr()
    assert "Calculating Metrics" not in out + err
    assert "%|" not in err


def test_extra_expectations_run_verbatim(penguins, contract):
    rows = {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1000}}
    mean = {
        "type": "expect_column_mean_to_be_between",
        "kwargs": {"column": "body_mass_g", "min_value": 4000, "max_value": 4500},
    }
    c = replace(contract, version=2, extra_expectations=(rows, mean))
    suite = c.suite_dict()
    assert suite["expectations"][-2:] == [rows, mean]
    result = validate(c, penguins)
    assert failed(result) == {("expect_table_row_count_to_be_between", None)}
    assert "344" in result.failures[0].details
    assert result.evaluated == 24


def test_an_expectation_great_expectations_does_not_know_is_a_contract_error(penguins, contract):
    c = replace(contract, version=2, extra_expectations=({"type": "expect_penguins_to_fly", "kwargs": {}},))
    with pytest.raises(ContractError, match="expect_penguins_to_fly"):
        validate(c, penguins)


def test_columns_that_differ_only_by_case_are_reported_not_confused():
    c = Contract("cased", 1, (ColumnSpec("Mass", "integer", min=0.0),))
    df = pd.DataFrame({"mass": [-5, -6], "Mass": [5, 6]})
    result = validate(c, df)
    assert failed(result) == {("distinct_column_names", "Mass")}
    assert validate(c, df[["Mass"]]).success
    with pytest.raises(ContractError, match="repeat"):
        Contract("cased", 1, (ColumnSpec("Mass", "integer"), ColumnSpec("mass", "float")))


def test_suite_dict_is_a_great_expectations_suite(contract):
    import great_expectations as gx

    d = contract.suite_dict()
    assert json.loads(json.dumps(d)) == d
    suite = gx.ExpectationSuite(**d)
    assert suite.name == "penguins@1"
    assert [e.expectation_type for e in suite.expectations] == [e["type"] for e in d["expectations"]]
    assert len(suite.expectations) == 22
    assert d["meta"]["concord"]["digest"] == contract.digest()
    body_mass = [e for e in d["expectations"] if e["kwargs"].get("column") == "body_mass_g"]
    assert [e["type"] for e in body_mass] == [
        "expect_column_values_to_be_in_type_list",
        "expect_column_values_to_be_between",
    ]  # optional: no existence or not-null expectation


def test_validate_needs_a_dataframe(contract):
    with pytest.raises(TypeError, match="DataFrame"):
        validate(contract, [{"species": "Adelie"}])


# --------------------------------------------------------------------------- compatibility


BASE = Contract(
    "fish",
    1,
    (
        ColumnSpec("length", "float", min=30.0, max=60.0),
        ColumnSpec("count", "integer", min=0.0),
        ColumnSpec("species", "string", allowed=("a", "b")),
        ColumnSpec("kind", "category", allowed=("x", "y")),
        ColumnSpec("flag", "boolean"),
        ColumnSpec("note", "string", required=False),
    ),
    extra_expectations=({"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},),
)
MORE_ROWS = {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 10}}

COMPATIBLE = {
    "optional column added": replace(
        BASE, columns=BASE.columns + (ColumnSpec("extra", "float", required=False),)
    ),
    "integer widened to float": with_column(BASE, "count", type="float"),
    "category widened to string": with_column(BASE, "kind", type="string"),
    "min lowered": with_column(BASE, "length", min=10.0),
    "max raised": with_column(BASE, "length", max=99.0),
    "bound removed": with_column(BASE, "length", min=None, max=None),
    "allowed value added": with_column(BASE, "species", allowed=("a", "b", "c")),
    "allowed constraint removed": with_column(BASE, "species", allowed=None),
    "required to optional": with_column(BASE, "flag", required=False),
    "identical extra expectation": replace(BASE, version=2),
    "extra expectation removed": replace(BASE, extra_expectations=()),
    "columns reordered": replace(BASE, columns=BASE.columns[::-1]),
}

BREAKING = {
    "required column added": (
        replace(BASE, columns=BASE.columns + (ColumnSpec("extra", "float"),)),
        "column 'extra': added as required (data valid under fish@1 may lack it)",
    ),
    "column removed": (
        replace(BASE, columns=BASE.columns[:-1]),
        "column 'note': removed (consumers that read it would break)",
    ),
    "float narrowed to integer": (
        with_column(BASE, "length", type="integer"),
        "column 'length': type changed from float to integer",
    ),
    "string narrowed to category": (
        with_column(BASE, "species", type="category"),
        "column 'species': type changed from string to category",
    ),
    "boolean to integer": (
        with_column(BASE, "flag", type="integer"),
        "column 'flag': type changed from boolean to integer",
    ),
    "max lowered": (with_column(BASE, "length", max=50.0), "column 'length': max lowered from 60.0 to 50.0"),
    "min raised": (with_column(BASE, "length", min=31.5), "column 'length': min raised from 30.0 to 31.5"),
    "bound added": (with_column(BASE, "count", max=100.0), "column 'count': max 100.0 added (there was none)"),
    "allowed value removed": (
        with_column(BASE, "species", allowed=("a",)),
        "column 'species': allowed values removed: 'b'",
    ),
    "allowed set added": (
        with_column(BASE, "note", allowed=("n",)),
        "column 'note': allowed values added ('n'; there were none)",
    ),
    "optional to required": (
        with_column(BASE, "note", required=True),
        "column 'note': now required (was optional)",
    ),
    "extra expectation added": (
        replace(BASE, extra_expectations=BASE.extra_expectations + (MORE_ROWS,)),
        'expectation expect_table_row_count_to_be_between {"min_value": 10}: added',
    ),
}


@pytest.mark.parametrize("new", COMPATIBLE.values(), ids=COMPATIBLE.keys())
def test_compatible_changes(new):
    result = compatible(BASE, new)
    assert result.compatible, result.breaking
    assert result.breaking == ()


@pytest.mark.parametrize("new, line", BREAKING.values(), ids=BREAKING.keys())
def test_breaking_changes_are_named_one_per_line(new, line):
    result = compatible(BASE, new)
    assert not result.compatible
    assert result.breaking == (line,)


def test_relaxations_are_listed_as_notes():
    result = compatible(BASE, with_column(BASE, "length", min=10.0, max=None))
    assert result.notes == (
        "column 'length': min lowered from 30.0 to 10.0",
        "column 'length': max 60.0 removed",
    )
    assert result.to_dict() == {
        "old": "fish@1",
        "new": "fish@2",
        "compatible": True,
        "breaking": [],
        "notes": list(result.notes),
    }


def test_several_breaking_changes_each_get_a_line():
    new = with_column(with_column(BASE, "length", max=50.0, type="integer"), "species", allowed=("c",))
    assert compatible(BASE, new).breaking == (
        "column 'length': type changed from float to integer",
        "column 'length': max lowered from 60.0 to 50.0",
        "column 'species': allowed values removed: 'a', 'b'",
    )


def test_compatibility_agrees_with_validation_on_penguins(penguins, contract):
    lowered = with_column(contract, "bill_length_mm", max=50.0)
    assert compatible(contract, lowered).breaking == ("column 'bill_length_mm': max lowered from 59.6 to 50.0",)
    assert failed(validate(lowered, penguins)) == {("expect_column_values_to_be_between", "bill_length_mm")}

    relaxed = with_column(with_column(contract, "year", type="float", min=None), "species", required=False)
    relaxed = replace(relaxed, columns=relaxed.columns + (ColumnSpec("tag_id", "string", required=False),))
    assert compatible(contract, relaxed).compatible
    assert validate(relaxed, penguins).success


# --------------------------------------------------------------------------- storage


def test_save_load_round_trip(tmp_path, contract):
    store = LocalDirStore(tmp_path / "store")
    assert save_contract(store, contract) == "contracts/penguins/1.json"
    assert save_contract(store, contract) == "contracts/penguins/1.json"  # same content: a no-op
    loaded = load_contract(store, "penguins@1")
    assert loaded == contract
    assert loaded.digest() == contract.digest()

    v2 = with_column(contract, "body_mass_g", max=7000.0)
    save_contract(store, v2)
    save_contract(store, replace(contract, name="krill", version=3))
    assert list_contracts(store) == ["krill@3", "penguins@1", "penguins@2"]
    assert load_contract(store, "penguins") == v2  # latest
    assert load_contract(store, "penguins@1") == contract

    path = tmp_path / "penguins.json"
    path.write_bytes(v2.to_json())
    assert load_contract(store, str(path)) == v2


def test_a_saved_version_is_never_overwritten(tmp_path, contract):
    store = LocalDirStore(tmp_path / "store")
    key = save_contract(store, contract)
    before = store.get_document(key)
    changed = with_column(contract, "body_mass_g", max=7000.0)
    with pytest.raises(ContractConflictError, match="bump the version") as info:
        save_contract(store, replace(changed, version=1))
    assert isinstance(info.value, ContractError)
    assert info.value.saved_digest == contract.digest()
    assert store.get_document(key) == before


def test_loading_what_is_not_there(tmp_path, contract):
    store = LocalDirStore(tmp_path / "store")
    with pytest.raises(ContractNotFoundError, match="none is saved"):
        load_contract(store, "penguins")
    save_contract(store, contract)
    with pytest.raises(ContractNotFoundError, match="penguins@1") as info:
        load_contract(store, "penguins@9")
    assert isinstance(info.value, KeyError)
    with pytest.raises(ContractNotFoundError):
        load_contract(store, str(tmp_path / "nowhere.json"))
    with pytest.raises(ContractError, match="version"):
        load_contract(store, "penguins@latest")


def test_a_document_under_the_wrong_key_is_refused(tmp_path, contract):
    store = LocalDirStore(tmp_path / "store")
    store.put_document("contracts/penguins/2.json", contract.to_json())
    with pytest.raises(ContractError, match="holds penguins@1"):
        load_contract(store, "penguins@2")


# --------------------------------------------------------------------------- the document


def _doc(contract: Contract, **changes) -> bytes:
    doc = contract.to_dict()
    doc.update(changes)
    return json.dumps(doc).encode()


def _without(contract: Contract, key: str) -> bytes:
    doc = contract.to_dict()
    del doc[key]
    return json.dumps(doc).encode()


def _column(contract: Contract, **changes) -> bytes:
    doc = contract.to_dict()
    doc["columns"][0].update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "data, says",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "expected a JSON object"),
        (lambda c: _doc(c, format="concord/contract@9"), "format"),
        (lambda c: _doc(c, owner="me"), "unknown keys"),
        (lambda c: _without(c, "name"), "missing 'name'"),
        (lambda c: _doc(c, version=0), "version"),
        (lambda c: _doc(c, version=True), "version"),
        (lambda c: _doc(c, name="a/b"), "invalid name"),
        (lambda c: _doc(c, columns={"species": "string"}), "'columns' must be a list"),
        (lambda c: _column(c, type="text"), "unknown type 'text'"),
        (lambda c: _column(c, nullable=True), "unknown keys"),
        (lambda c: _column(c, required="yes"), "required"),
        (lambda c: _column(c, min=1.0), "min/max apply"),
        (lambda c: _column(c, allowed="Adelie"), "allowed must be a list"),
        (lambda c: _column(c, allowed=[]), "allowed is empty"),
        (lambda c: _doc(c, columns=c.to_dict()["columns"][:2] + c.to_dict()["columns"][:1]), "repeat"),
        (lambda c: _doc(c, extra_expectations=[{"type": "expect_table_row_count_to_equal"}]), "kwargs"),
        (lambda c: _doc(c, extra_expectations=[{"type": "row_count", "kwargs": {}}]), "expect_"),
    ],
)
def test_malformed_documents_are_contract_errors(contract, data, says):
    with pytest.raises(ContractError, match=says):
        Contract.from_json(data(contract) if callable(data) else data)


def test_min_above_max_is_refused():
    with pytest.raises(ContractError, match="greater than max"):
        ColumnSpec("x", "float", min=2.0, max=1.0)
    with pytest.raises(ContractError, match="finite"):
        ColumnSpec("x", "float", max=float("inf"))


def test_json_round_trip_and_digest_identity(contract):
    again = Contract.from_json(contract.to_json())
    assert again == contract and again.digest() == contract.digest()
    assert len(contract.digest()) == 64
    # equal content, equal digest: allowed values are a set, bounds are floats
    a = Contract("d", 1, (ColumnSpec("s", "string", allowed=("b", "a", "a")), ColumnSpec("n", "integer", min=0)))
    b = Contract("d", 1, (ColumnSpec("s", "string", allowed=("a", "b")), ColumnSpec("n", "integer", min=0.0)))
    assert a == b and a.digest() == b.digest()
    for other in (replace(a, description="x"), replace(a, version=2), with_column(a, "n", min=-1.0)):
        assert other.digest() != a.digest()


def test_extra_expectations_are_private_copies():
    kwargs = {"min_value": 1}
    rows = {"type": "expect_table_row_count_to_be_between", "kwargs": kwargs}
    c = Contract("e", 1, (), extra_expectations=(rows,))
    before = c.digest()
    kwargs["min_value"] = 99
    assert c.digest() == before


# --------------------------------------------------------------------------- properties

_names = st.lists(st.text("abcdefghij_", min_size=1, max_size=6), min_size=0, max_size=6, unique=True)
_bound = st.none() | st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def column_specs(draw, name: str) -> ColumnSpec:
    ctype = draw(st.sampled_from(COLUMN_TYPES))
    spec = {"name": name, "type": ctype, "required": draw(st.booleans())}
    if ctype in ("integer", "float"):
        lo, hi = draw(_bound), draw(_bound)
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        spec.update(min=lo, max=hi)
    if ctype in ("string", "category"):
        spec["allowed"] = draw(st.none() | st.lists(st.text(max_size=4), min_size=1, max_size=5).map(tuple))
    return ColumnSpec(**spec)


@st.composite
def contracts(draw) -> Contract:
    names = draw(_names)
    columns = tuple(draw(column_specs(n)) for n in names)
    extra = draw(
        st.lists(
            st.builds(
                lambda n: {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": n}},
                st.integers(0, 100),
            ),
            max_size=2,
        )
    )
    return Contract("prop", draw(st.integers(1, 50)), columns, extra_expectations=tuple(extra))


@settings(max_examples=150, deadline=None)
@given(contracts())
def test_a_contract_is_compatible_with_itself(c):
    result = compatible(c, c)
    assert result.compatible and result.breaking == () and result.notes == ()
    assert Contract.from_json(c.to_json()) == c
    assert Contract.from_json(c.to_json()).digest() == c.digest()


@settings(max_examples=150, deadline=None)
@given(contracts(), st.data())
def test_relaxing_any_bound_never_breaks(c, data):
    bounded = [col for col in c.columns if col.min is not None or col.max is not None]
    if not bounded:
        return
    col = data.draw(st.sampled_from(bounded))
    slack = st.none() | st.floats(0, 1e6, allow_nan=False)
    new_min, new_max = col.min, col.max
    if col.min is not None:
        d = data.draw(slack)
        new_min = None if d is None else col.min - d
    if col.max is not None:
        d = data.draw(slack)
        new_max = None if d is None else col.max + d
    relaxed = with_column(c, col.name, min=new_min, max=new_max)
    result = compatible(c, relaxed)
    assert result.compatible, result.breaking


@settings(max_examples=100, deadline=None)
@given(contracts(), st.data())
def test_tightening_a_bound_always_breaks(c, data):
    bounded = [col for col in c.columns if col.min is not None]
    if not bounded:
        return
    col = data.draw(st.sampled_from(bounded))
    top = col.max if col.max is not None else col.min + 1e6
    new_min = data.draw(st.floats(col.min, top, allow_nan=False, exclude_min=True)) if top > col.min else None
    if new_min is None:
        return
    result = compatible(c, with_column(c, col.name, min=new_min))
    assert not result.compatible
    assert result.breaking == (f"column {col.name!r}: min raised from {col.min} to {new_min}",)
