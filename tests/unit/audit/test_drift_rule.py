"""The drift rule: significant (tests whose null holds both samples' noise, Benjamini–Hochberg over
the columns) and material (the effect at least the column's floor), quiet on undrifted data at any
size, loud on the shifts that matter, the long-tailed and new-category cases, and the effect in
readable terms."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control

from concord.audit.drift import DriftThresholds, data_drift

ZIPF_LABELS = np.array([f"z{i}" for i in range(1_000)], dtype=object)
ZIPF_P = (1 / np.arange(1, 1_001)) / (1 / np.arange(1, 1_001)).sum()
CAT5 = np.array(["c0", "c1", "c2", "c3", "c4"], dtype=object)
CAT5_P = np.array([0.40, 0.25, 0.15, 0.12, 0.08])
SIGMA = {"normal": 1.0, "lognormal": float(np.sqrt((np.e - 1) * np.e)), "t3": float(np.sqrt(3.0))}


def draw(shape: str, n: int, rng: np.random.Generator):
    if shape == "normal":
        return rng.normal(0, 1, n)
    if shape == "lognormal":
        return rng.lognormal(0, 1, n)
    if shape == "t3":
        return rng.standard_t(3, n)
    if shape == "cat5":
        return rng.choice(CAT5, n, p=CAT5_P)
    return rng.choice(ZIPF_LABELS, n, p=ZIPF_P)


def one(ref, cur, **kwargs):
    return data_drift(pd.DataFrame({"x": ref}), pd.DataFrame({"x": cur}), **kwargs).column("x")


def moved(values: np.ndarray, share: float, to, rng: np.random.Generator) -> np.ndarray:
    """``share`` of the rows moved from the most frequent label to ``to`` (a label, or labels drawn)."""
    out = values.copy()
    top = np.flatnonzero(out == pd.Series(out).value_counts().index[0])
    chosen = rng.choice(top, int(round(share * out.size)), replace=False)
    out[chosen] = to if isinstance(to, str) else rng.choice(to, chosen.size)
    return out


@pytest.mark.parametrize("n", [200, 1_000, 100_000])
def test_undrifted_tables_are_quiet_at_every_size(n):
    rng = np.random.default_rng(n)
    shapes = ("normal", "lognormal", "t3", "cat5", "zipf")
    ref = pd.DataFrame({f"{s}{j}": draw(s, n, rng) for s in shapes for j in range(4)})
    cur = pd.DataFrame({f"{s}{j}": draw(s, n, rng) for s in shapes for j in range(4)})
    report = data_drift(ref, cur)
    assert report.severity == "ok", [c.finding for c in report.drifted]
    assert all(c.pvalue_adjusted >= c.pvalue for c in report.columns)


def test_a_long_tailed_column_at_1000_rows_is_quiet_though_most_of_its_categories_are_unseen():
    """1,000 Zipf categories at 1,000 rows: a fifth of current lands in categories the reference
    never saw, PSI is far above 0.55, and it is only the reference's own singletons' share."""
    for seed in range(10):
        rng = np.random.default_rng(seed)
        col = one(draw("zipf", 1_000, rng), draw("zipf", 1_000, rng))
        assert col.severity == "ok", col.finding
        assert col.psi > 0.55 and col.new_share > 0.1
        assert col.new_share_expected == pytest.approx(col.new_share, abs=0.06)
        assert "new " in col.effect and "expected " in col.effect


def test_unique_ids_are_not_new_categories_drifting():
    ids = np.array([f"id{i}" for i in range(100_000)], dtype=object)
    col = one(ids[:50_000], ids[50_000:])
    assert col.new_share == 1.0 and col.new_share_expected == 1.0
    assert col.severity == "ok", col.finding


@pytest.mark.parametrize(
    ("shape", "n", "shift"),
    [
        ("normal", 1_000, 0.2), ("lognormal", 1_000, 0.2), ("t3", 1_000, 0.2),
        ("normal", 100_000, 0.1), ("lognormal", 100_000, 0.1), ("t3", 100_000, 0.1),
    ],
)
def test_a_mean_shift_that_matters_is_flagged(shape, n, shift):
    rng = np.random.default_rng(7)
    col = one(draw(shape, n, rng), draw(shape, n, rng) + shift * SIGMA[shape])
    assert col.drifted, col.finding  # critical where PSI says so: a lognormal's +0.2σ is PSI 1.6
    assert col.finding.startswith(f"drift ({col.priority}): mean +0.")
    assert col.pvalue_adjusted < 0.005 and col.effect_size >= 0.05


@pytest.mark.parametrize(("shape", "n", "scale"), [("normal", 1_000, 1.5), ("t3", 1_000, 1.5), ("lognormal", 100_000, 1.1), ("t3", 100_000, 1.1)])
def test_a_change_of_scale_is_flagged(shape, n, scale):
    rng = np.random.default_rng(8)
    mean = float(np.exp(0.5)) if shape == "lognormal" else 0.0
    col = one(draw(shape, n, rng), mean + scale * (draw(shape, n, rng) - mean))
    assert col.drifted, col.finding
    assert col.scale_ratio == pytest.approx(scale, rel=0.15)


@pytest.mark.parametrize(("n", "share"), [(1_000, 0.10), (100_000, 0.02)])
def test_mass_moved_between_five_categories_is_flagged(n, share):
    rng = np.random.default_rng(9)
    col = one(draw("cat5", n, rng), moved(draw("cat5", n, rng), share, "c4", rng))
    assert col.drifted, col.finding
    assert col.effect_size == pytest.approx(share, abs=0.04) and "of mass moved" in col.effect


def test_a_tenth_of_a_long_tailed_column_moved_is_flagged():
    rng = np.random.default_rng(10)
    col = one(draw("zipf", 100_000, rng), moved(draw("zipf", 100_000, rng), 0.10, ZIPF_LABELS[100:], rng))
    assert col.drifted, col.finding


@pytest.mark.parametrize("shape", ["cat5", "zipf"])
def test_a_new_category_at_one_percent_is_flagged(shape):
    rng = np.random.default_rng(11)
    cur = draw(shape, 100_000, rng)
    cur[rng.choice(cur.size, 1_000, replace=False)] = "NEW"
    col = one(draw(shape, 100_000, rng), cur)
    assert col.drifted, col.finding
    assert "NEW" in col.new_categories and col.new_share_pvalue < 1e-9
    assert col.new_share_expected < 0.002 and "new 1" in col.effect


def test_a_real_but_tiny_change_is_below_the_floor_and_a_column_floor_tunes_it():
    rng = np.random.default_rng(12)
    ref, cur = rng.normal(0, 1, 400_000), rng.normal(0.03, 1, 400_000)
    col = one(ref, cur)
    assert col.pvalue < 1e-9 and col.effect_size < 0.05
    assert col.severity == "ok" and "real but small" in col.finding and col.floor == 0.05
    tuned = one(ref, cur, thresholds=DriftThresholds(floors={"x": 0.01}))
    assert tuned.severity == "warning" and tuned.floor == 0.01
    assert "effect 0.03" in tuned.finding and ">= floor 0.01σ" in tuned.finding


def test_the_effect_is_stated_in_readable_terms_in_the_finding_and_the_json():
    rng = np.random.default_rng(13)
    col = one(rng.normal(10, 2, 50_000), rng.normal(10.62, 2, 50_000))
    assert col.mean_shift == pytest.approx(0.31, abs=0.03)
    assert col.effect.startswith("mean +0.3") and col.effect.endswith("p < 1e-9") and "scale ×1.0" in col.effect
    assert col.effect in col.finding
    d = col.to_dict()
    assert d["effect"] == col.effect and d["test"] == "Welch t, Brown–Forsythe, KS"
    assert {"pvalue", "pvalue_adjusted", "effect_size", "floor", "mean_shift", "scale_ratio"} <= d.keys()
    assert "measured" not in d


def test_p_values_are_adjusted_over_the_columns_with_benjamini_hochberg():
    rng = np.random.default_rng(14)
    n = 1_000
    ref = pd.DataFrame({f"c{j}": rng.normal(0, 1, n) for j in range(10)})
    cur = pd.DataFrame({f"c{j}": rng.normal(0.3 if j == 0 else 0, 1, n) for j in range(10)})
    report = data_drift(ref, cur)
    raw = [c.pvalue for c in report.columns]
    np.testing.assert_allclose([c.pvalue_adjusted for c in report.columns], np.minimum(false_discovery_control(raw), 1))
    assert [c.column for c in report.drifted] == ["c0"]
    assert "over 10 columns (Benjamini–Hochberg)" in report.column("c0").finding


def test_psi_tiers_still_grade_a_drifted_column():
    rng = np.random.default_rng(15)
    ref = rng.normal(0, 1, 5_000)
    assert one(ref, rng.normal(0.3, 1, 5_000)).severity == "warning"
    big = one(ref, rng.normal(1.5, 1, 5_000))
    assert big.severity == "critical" and big.psi > 0.55 and "PSI" in big.finding
