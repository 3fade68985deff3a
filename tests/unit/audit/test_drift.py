"""Data drift statistics: equal to scipy's, PSI as computed by hand, quiet on no drift, loud on real
drift, and every odd column (empty, all-null, constant, retyped, missing, new) a finding, not a crash."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from palmerpenguins import load_penguins
from scipy import stats
from scipy.spatial.distance import jensenshannon

from concord.audit.drift import (
    EPSILON,
    KS_EXACT_MAX_N,
    DriftReport,
    DriftThresholds,
    _merged_ks_wasserstein,
    column_histograms,
    data_drift,
    quantile_edges,
    smoothed_proportions,
)
from concord.errors import DriftConfigError

#: scipy falls back from the exact KS p-value to the asymptotic one for some sample sizes, and says so
EXACT_KS_FALLBACK = "ignore:ks_2samp. Exact calculation unsuccessful:RuntimeWarning"
STAT_KEYS = ("psi", "kl", "js", "ks", "ks_pvalue", "wasserstein", "chi2", "chi2_pvalue")


@pytest.fixture(scope="module")
def penguins() -> pd.DataFrame:
    return load_penguins()


def _plain(value) -> None:
    """Only JSON's own types, all the way down (no numpy scalar, no NaN)."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str)
            _plain(v)
    elif isinstance(value, list):
        for v in value:
            _plain(v)
    else:
        assert value is None or type(value) in (str, int, float, bool), (value, type(value))
        if isinstance(value, float):
            assert math.isfinite(value)


def _json_safe(report: DriftReport) -> dict:
    d = report.to_dict()
    _plain(d)
    json.dumps(d, allow_nan=False)
    return d


# --------------------------------------------------------------------------- equal to scipy


@pytest.mark.parametrize(
    ("n_ref", "n_cur", "decimals"),
    [
        (800, 650, None),  # scipy's own path: exact p-value
        (30_000, 24_000, None),  # the merge path: asymptotic p-value
        (30_000, 24_000, 1),  # the merge path with many ties
    ],
)
def test_ks_and_wasserstein_equal_scipy(n_ref, n_cur, decimals):
    rng = np.random.default_rng(7)
    ref = rng.normal(10.0, 2.0, n_ref)
    cur = rng.normal(10.3, 2.2, n_cur)
    if decimals is not None:
        ref, cur = ref.round(decimals), cur.round(decimals)
    col = data_drift(pd.DataFrame({"x": ref}), pd.DataFrame({"x": cur})).column("x")

    method = "auto" if max(n_ref, n_cur) <= KS_EXACT_MAX_N else "asymp"
    expected = stats.ks_2samp(ref, cur, method=method)
    assert col.ks == pytest.approx(float(expected.statistic), rel=1e-12, abs=1e-12)
    assert col.ks_pvalue == pytest.approx(float(expected.pvalue), rel=1e-12, abs=1e-300)
    assert col.wasserstein == pytest.approx(stats.wasserstein_distance(ref, cur), rel=1e-12, abs=1e-12)
    assert col.n_reference == n_ref and col.n_current == n_cur


def test_ks_pvalue_of_large_samples_is_kolmogorovs_limit_close_to_scipy():
    rng = np.random.default_rng(3)
    ref, cur = rng.normal(0.0, 1.0, 500_000), rng.normal(0.004, 1.0, 500_000)
    col = data_drift(pd.DataFrame({"x": ref}), pd.DataFrame({"x": cur})).column("x")
    expected = stats.ks_2samp(ref, cur, method="asymp")
    assert col.ks == pytest.approx(float(expected.statistic), rel=1e-12)
    assert col.ks_pvalue == pytest.approx(float(expected.pvalue), rel=0.01)


@pytest.mark.filterwarnings(EXACT_KS_FALLBACK)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(-6, 6), min_size=1, max_size=40),
    st.lists(st.integers(-6, 9), min_size=1, max_size=40),
    st.sampled_from([1.0, 0.25, 1e-9, 3e5]),
)
def test_merged_ks_and_wasserstein_equal_scipy_with_ties(a, b, scale):
    """The merge path on small, tie-heavy samples (where mistakes with equal values would show)."""
    ref = np.sort(np.array(a, dtype=np.float64) * scale)
    cur = np.sort(np.array(b, dtype=np.float64) * scale)
    ks, wasserstein = _merged_ks_wasserstein(ref, cur)
    assert ks == pytest.approx(float(stats.ks_2samp(ref, cur).statistic), rel=1e-12, abs=1e-12)
    assert wasserstein == pytest.approx(stats.wasserstein_distance(ref, cur), rel=1e-12, abs=1e-12 * scale)


def test_kl_and_js_equal_scipy_on_the_smoothed_bins(penguins):
    ref = penguins[penguins.species == "Adelie"]
    cur = penguins[penguins.species == "Chinstrap"]
    col = data_drift(ref, cur, columns=["bill_length_mm"]).column("bill_length_mm")
    hist = col.histogram
    n_ref, n_cur = col.n_reference, col.n_current
    r = smoothed_proportions(np.round(np.array(hist.reference) * n_ref))
    c = smoothed_proportions(np.round(np.array(hist.current) * n_cur))
    assert col.kl == pytest.approx(stats.entropy(c, r), rel=1e-12)  # KL(current || reference), nats
    assert col.js == pytest.approx(jensenshannon(c, r), rel=1e-12)  # JS distance, natural log
    assert col.psi == pytest.approx(float(np.sum((c - r) * np.log(c / r))), rel=1e-12)


# --------------------------------------------------------------------------- PSI by hand


def test_psi_hand_computed_numeric():
    # reference 1 2 3 4, two bins: the median edge is 2 (half the reference at or below it), so
    # the bins are (-inf, 2] and (2, +inf) and the reference's shares are 0.5 and 0.5.
    # current 1 1 1 3 puts 3 values in the first bin, 1 in the second: shares 0.75 and 0.25.
    # PSI = (0.75 - 0.5) ln(0.75 / 0.5) + (0.25 - 0.5) ln(0.25 / 0.5) = 0.25 ln 1.5 + 0.25 ln 2
    #     = 0.25 ln 3 = 0.27465307216702745
    # KL  = 0.75 ln(0.75 / 0.5) + 0.25 ln(0.25 / 0.5) = 0.13081203594113697
    ref = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0]})
    cur = pd.DataFrame({"x": [1.0, 1.0, 1.0, 3.0]})
    col = data_drift(ref, cur, bins=2).column("x")
    assert col.histogram.edges == (2.0,)
    assert col.histogram.reference == (0.5, 0.5)
    assert col.histogram.current == (0.75, 0.25)
    assert col.psi == pytest.approx(0.27465307216702745, rel=1e-12)
    assert col.kl == pytest.approx(0.13081203594113697, rel=1e-12)
    assert col.severity == "ok"  # PSI > 0.25, but 4 values against 4 cannot be significant
    assert "not significant at 0.005" in col.finding


def test_psi_hand_computed_with_an_empty_bin():
    # current 5 6 7 8: nothing in (-inf, 2], everything in (2, +inf): raw shares 0 and 1.
    # The empty bin gets EPSILON = 1e-4, then the shares are renormalised by their sum 1.0001:
    #   c = (0.0001 / 1.0001, 1 / 1.0001) = (9.999000099990002e-05, 0.9999000099990001)
    # the reference (0.5, 0.5) has no empty bin and is unchanged.
    # PSI = (c0 - 0.5) ln(c0 / 0.5) + (c1 - 0.5) ln(c1 / 0.5)
    #     = (-0.49990001) (-8.517293...) + (0.49990001) (0.693047...) = 4.6042492440450875
    assert EPSILON == 1e-4
    ref = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0]})
    cur = pd.DataFrame({"x": [5.0, 6.0, 7.0, 8.0]})
    col = data_drift(ref, cur, bins=2).column("x")
    assert col.histogram.current == (0.0, 1.0)  # the overlay shows raw shares
    c0, c1 = 0.0001 / 1.0001, 1 / 1.0001
    by_hand = (c0 - 0.5) * math.log(c0 / 0.5) + (c1 - 0.5) * math.log(c1 / 0.5)
    assert by_hand == pytest.approx(4.6042492440450875, rel=1e-12)
    assert col.psi == pytest.approx(by_hand, rel=1e-12)
    np.testing.assert_allclose(smoothed_proportions([0, 4]), [c0, c1], rtol=1e-15)


def test_psi_hand_computed_categorical():
    # a a b b against a a a b: shares (0.5, 0.5) and (0.75, 0.25): the same PSI as above, 0.25 ln 3
    ref = pd.DataFrame({"label": ["a", "a", "b", "b"]})
    cur = pd.DataFrame({"label": ["a", "a", "a", "b"]})
    col = data_drift(ref, cur).column("label")
    assert col.kind == "categorical"
    assert col.psi == pytest.approx(0.25 * math.log(3), rel=1e-12)
    # every category is expected fewer than 5 times per side: all pooled, nothing left to test
    assert col.chi2 == 0 and col.chi2_pvalue == 1
    assert col.severity == "ok"  # PSI 0.2747 > 0.25, but 4 values against 4 cannot be significant
    assert col.ks is None and col.wasserstein is None and col.ks_pvalue is None


@pytest.mark.filterwarnings(EXACT_KS_FALLBACK)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
)
def test_psi_is_never_negative_and_zero_on_identical_samples(a, b):
    cross = data_drift(pd.DataFrame({"x": a}), pd.DataFrame({"x": b})).column("x")
    assert cross.psi >= 0 and cross.kl >= 0 and cross.js >= 0
    same = data_drift(pd.DataFrame({"x": a}), pd.DataFrame({"x": list(reversed(a))})).column("x")
    assert same.psi == 0 and same.kl == 0 and same.js == 0 and same.ks == 0 and same.wasserstein == 0
    assert same.severity == "ok"


# --------------------------------------------------------------------------- bins


def test_quantile_edges_are_inverted_cdf_quantiles():
    rng = np.random.default_rng(3)
    x = np.sort(rng.normal(size=997))
    edges = quantile_edges(x, 10)
    assert len(edges) == 9
    for k, edge in enumerate(edges, 1):  # the smallest value with >= k/10 of the sample at or below it
        assert np.count_nonzero(x <= edge) / x.size >= k / 10
        assert np.count_nonzero(x < edge) / x.size < k / 10
    np.testing.assert_array_equal(edges, np.quantile(x, np.arange(1, 10) / 10, method="inverted_cdf"))


def test_discrete_data_gets_a_bin_below_and_above_its_range():
    ref = np.sort(np.repeat([2007.0, 2008.0, 2009.0], 100))
    edges = quantile_edges(ref, 10)
    # repeated edges merged; the minimum is an edge, so a bin below it is added
    np.testing.assert_array_equal(edges, [np.nextafter(2007.0, -np.inf), 2007.0, 2008.0, 2009.0])
    cur = pd.DataFrame({"year": [2006.0] * 10 + [2007.0] * 100 + [2010.0] * 10})
    hist = column_histograms(pd.DataFrame({"year": ref}), cur, "year")
    # bins: below 2007 | 2007 | 2008 | 2009 | above 2009
    assert hist.reference == pytest.approx((0, 1 / 3, 1 / 3, 1 / 3, 0))
    assert hist.current == pytest.approx((10 / 120, 100 / 120, 0, 0, 10 / 120))
    assert (hist.low, hist.high) == (2006.0, 2010.0)


def test_values_outside_the_reference_range_land_in_the_end_bins():
    rng = np.random.default_rng(5)
    ref = pd.DataFrame({"x": rng.uniform(0, 1, 5000)})
    cur = pd.DataFrame({"x": np.r_[rng.uniform(-50, -10, 100), rng.uniform(0, 1, 800), rng.uniform(10, 50, 100)]})
    hist = column_histograms(ref, cur, "x")
    assert len(hist.reference) == len(hist.edges) + 1 == 10
    assert sum(hist.reference) == pytest.approx(1) and sum(hist.current) == pytest.approx(1)
    assert hist.current[0] > hist.reference[0] and hist.current[-1] > hist.reference[-1]
    assert hist.low < -10 and hist.high > 10


# --------------------------------------------------------------------------- real data


def test_no_drift_between_two_random_halves_of_penguins(penguins):
    rng = np.random.default_rng(0)
    order = rng.permutation(len(penguins))
    half = len(penguins) // 2
    report = data_drift(penguins.iloc[order[:half]], penguins.iloc[order[half:]])
    assert [c.severity for c in report.columns] == ["ok"] * penguins.shape[1], [c.finding for c in report.columns]
    assert report.severity == "ok" and report.drift_share == 0.0
    assert report.rows_reference + report.rows_current == len(penguins)
    # nulls are counted, not compared
    mass = report.column("body_mass_g")
    assert mass.n_reference + mass.n_current == penguins.body_mass_g.notna().sum()
    _json_safe(report)


def test_drift_between_species_of_penguins(penguins):
    adelie = penguins[penguins.species == "Adelie"]
    gentoo = penguins[penguins.species == "Gentoo"]
    report = data_drift(adelie, gentoo)
    for name in ("body_mass_g", "flipper_length_mm"):
        col = report.column(name)
        assert col.kind == "numeric"
        assert col.severity in ("warning", "critical"), col.finding
        assert col.ks_pvalue < 0.01 and col.wasserstein > 0
        assert col.finding.startswith("drift (P")
    assert report.severity == "critical"
    assert report.drift_share > 0
    assert report.column("species").new_categories == ("Gentoo",)
    assert report.column("species").vanished_categories == ("Adelie",)
    assert set(report.histograms()) >= {"body_mass_g", "flipper_length_mm"}
    d = _json_safe(report)
    assert d["priority"] == "P0"
    for col in d["columns"]:
        assert {"column", "kind", "psi", "kl", "js", "ks", "wasserstein", "severity", "finding"} <= set(col)


# --------------------------------------------------------------------------- categories


def test_new_and_vanished_categories():
    ref = pd.DataFrame({"island": ["Biscoe"] * 50 + ["Dream"] * 30 + ["Torgersen"] * 20})
    cur = pd.DataFrame({"island": ["Biscoe"] * 50 + ["Dream"] * 30 + ["Anvers"] * 15 + ["Palmer"] * 5})
    col = data_drift(ref, cur).column("island")
    assert col.new_categories == ("Anvers", "Palmer")  # most frequent first
    assert col.vanished_categories == ("Torgersen",)
    assert col.severity == "critical"
    assert "2 new categories: 'Anvers', 'Palmer'" in col.finding and "1 vanished: 'Torgersen'" in col.finding
    assert col.histogram.categories == ("Biscoe", "Dream", "Torgersen", "Anvers", "Palmer")
    same = data_drift(ref, ref.sample(frac=1, random_state=1)).column("island")
    assert same.new_categories == () and same.vanished_categories == () and same.psi == 0


THREE = pd.DataFrame({"c": ["a"] * 10_000 + ["b"] * 10_000 + ["c"] * 10_000})
#: PSI of a total replacement of THREE, by hand: the buckets are a, b, c and "(new)"; the
#: reference is (1/3, 1/3, 1/3, 0) and current (0, 0, 0, 1), each empty bucket smoothed to 1e-4:
#: r = (1/3, 1/3, 1/3, 1e-4) / 1.0001, c = (1e-4, 1e-4, 1e-4, 1) / 1.0003
_R = np.array([1 / 3, 1 / 3, 1 / 3, 1e-4]) / 1.0001
_C = np.array([1e-4, 1e-4, 1e-4, 1.0]) / 1.0003
REPLACED_PSI = float(np.sum((_C - _R) * np.log(_C / _R)))


@pytest.mark.parametrize("new_labels", [1, 3, 200_000])
def test_a_category_replaced_wholesale_is_critical_whatever_the_cardinality(new_labels):
    """3 categories in the reference, then only categories it never had: the unseen ones are one
    "(new)" bucket, so PSI is the same for 1, 3 or 200,000 of them (once it was 0.24 at 200,000,
    each empty category's epsilon swamping the reference)."""
    per_label = max(1, 30_000 // new_labels)
    cur = pd.DataFrame({"c": [f"n{i}" for i in range(new_labels) for _ in range(per_label)]})
    col = data_drift(THREE, cur).column("c")
    assert col.severity == "critical" and col.finding.startswith("drift (P0): 100% of mass moved")
    assert "PSI 17.3 > 0.55" in col.finding
    assert REPLACED_PSI == pytest.approx(17.3, abs=0.05)
    assert col.psi == pytest.approx(REPLACED_PSI, rel=1e-12)
    assert col.js > 0.83  # the JS distance is at its ceiling, sqrt(ln 2) = 0.8326
    assert col.new_share == 1.0 and col.vanished_categories == ("a", "b", "c")
    assert col.chi2_pvalue < 1e-12
    assert f"{new_labels} new categor" in col.finding and "(100% of current values)" in col.finding
    assert len(col.new_categories) == min(new_labels, 50)


@pytest.mark.parametrize(("new_share", "psi_at_least"), [(0.3, 2.4), (0.6, 5.7), (0.9, 10.2)])
def test_a_partly_replaced_category_is_critical(new_share, psi_at_least):
    """The three reference categories keep their proportions in the rest of current; 200,000 new
    categories take ``new_share`` of it. At 90 % it used to be "no drift" (PSI 0.04)."""
    old = int(round(200_000 * (1 - new_share) / new_share))
    cur = pd.DataFrame({"c": ["a", "b", "c"] * (old // 3) + [f"n{i}" for i in range(200_000)]})
    col = data_drift(THREE, cur).column("c")
    assert col.new_share == pytest.approx(new_share, abs=1e-4)
    assert col.severity == "critical" and col.psi > psi_at_least
    # the bins compared: a, b, c and the pooled new ones; the overlay pools them too (too many to list)
    assert col.histogram.categories == ("a", "b", "c", "(new: 200000 categories)")
    assert col.histogram.current[-1] == pytest.approx(new_share, abs=1e-4)


def test_most_current_values_in_unseen_categories_is_critical_whatever_psi_says():
    lenient = DriftThresholds(psi_warning=50.0, psi_critical=100.0)
    cur = pd.DataFrame({"c": ["a"] * 4_000 + ["z"] * 6_000})
    col = data_drift(THREE, cur, thresholds=lenient).column("c")
    assert col.psi < 50 and col.new_share == 0.6
    assert col.severity == "critical"
    assert "60% of current values in new categories (more than 50%)" in col.finding
    minority = data_drift(THREE, pd.DataFrame({"c": ["a"] * 6_000 + ["z"] * 4_000}), thresholds=lenient).column("c")
    # a real 40 % of new values is drift, but not the P0 share
    assert minority.new_share == 0.4 and minority.severity == "warning"


def test_many_reference_categories_are_compared_top_k_plus_other():
    from concord.audit.drift import MAX_COMPARED_CATEGORIES

    rng = np.random.default_rng(4)
    labels = np.array([f"id{i}" for i in range(5_000)])
    weights = 1 / np.arange(1, 5_001)
    weights /= weights.sum()
    ref = pd.DataFrame({"c": rng.choice(labels, 200_000, p=weights)})
    same = ref.sample(frac=1.0, replace=True, random_state=5)  # no category the reference lacks
    col = data_drift(ref, same).column("c")
    assert col.severity == "ok" and col.psi < 0.01
    assert len(col.histogram.categories) == MAX_COMPARED_CATEGORIES + 1
    assert col.histogram.categories[-1].startswith("(other: ")
    # the rare categories' mass moving to the most frequent one is still seen, through "(other)"
    moved = ref["c"].where(ref["c"].isin(labels[:MAX_COMPARED_CATEGORIES]), labels[0])
    shifted = data_drift(ref, pd.DataFrame({"c": moved})).column("c")
    assert shifted.severity == "critical" and shifted.new_share == 0.0


def test_booleans_and_categories_compare_as_labels():
    ref = pd.DataFrame(
        {"flag": [True, False] * 50, "cat": pd.Categorical(["x", "y"] * 50, categories=["x", "y", "z"])}
    )
    cur = pd.DataFrame({"flag": [True] * 90 + [False] * 10, "cat": pd.Categorical(["x", "y"] * 50)})
    report = data_drift(ref, cur)
    assert report.column("flag").kind == "categorical"
    assert report.column("flag").severity == "critical"
    assert report.column("cat").psi == 0  # an unused category is not a category seen
    assert report.column("cat").vanished_categories == ()


# --------------------------------------------------------------------------- findings, not crashes


def test_odd_columns_are_findings_not_exceptions():
    ref = pd.DataFrame(
        {
            "all_null": [np.nan] * 6,
            "goes_null": [1.0, 2, 3, 4, 5, 6],
            "constant": [7.0] * 6,
            "retyped": [1.0, 2, 3, 4, 5, 6],
            "gone": [1, 2, 3, 4, 5, 6],
            "never_set": [None] * 6,
            "one_label": ["x"] * 6,
        }
    )
    cur = pd.DataFrame(
        {
            "all_null": [None] * 6,
            "goes_null": [np.nan] * 6,
            "constant": [7.0] * 6,
            "retyped": ["a", "b", "c", "d", "e", "f"],
            "never_set": [1.0, 2, 3, 4, 5, 6],
            "one_label": ["x"] * 6,
            "added": ["x"] * 6,
        }
    )
    report = data_drift(ref, cur)
    by = {c.column: c for c in report.columns}
    assert [c["compared"] for c in report.to_dict()["columns"]] == [True] * 7 + [False]
    assert list(by) == ["all_null", "goes_null", "constant", "retyped", "gone", "never_set", "one_label", "added"]

    assert by["all_null"].severity == "ok" and "no values on either side" in by["all_null"].finding
    assert by["goes_null"].severity == "critical" and "no values in current (all null)" in by["goes_null"].finding
    assert by["goes_null"].null_share_reference == 0.0 and by["goes_null"].null_share_current == 1.0
    assert by["constant"].severity == "ok" and by["constant"].psi == 0
    assert "constant in reference (7)" in by["constant"].finding
    assert "constant in current (7)" in by["constant"].finding
    assert by["one_label"].severity == "ok" and by["one_label"].psi == 0
    assert (by["one_label"].chi2, by["one_label"].chi2_pvalue) == (0.0, 1.0)
    assert "constant in reference ('x')" in by["one_label"].finding
    assert by["retyped"].severity == "critical"
    assert by["retyped"].finding.startswith("type changed: numeric (float64) in reference, categorical")
    assert by["gone"].severity == "critical" and by["gone"].finding.startswith("missing in current")
    assert by["gone"].n_current is None and by["gone"].null_share_current is None
    assert by["never_set"].severity == "warning" and "no values in reference (all null)" in by["never_set"].finding
    assert by["added"].severity == "ok" and not by["added"].compared
    assert by["added"].finding.startswith("new in current")
    for name in ("all_null", "goes_null", "retyped", "gone", "never_set", "added"):
        assert all(getattr(by[name], k) is None for k in STAT_KEYS), name
        assert by[name].histogram is None
    # drifted: goes_null, retyped, gone, never_set, out of the 7 columns the reference has
    assert report.compared == 7 and report.drift_share == pytest.approx(4 / 7)
    assert report.severity == "critical"
    _json_safe(report)


def test_empty_tables_are_findings():
    ref = pd.DataFrame({"x": [1.0, 2.0, 3.0], "s": ["a", "b", "c"]})
    empty = ref.iloc[0:0]
    report = data_drift(ref, empty)
    for col in report.columns:
        assert col.severity == "critical" and "no values in current (no rows)" in col.finding
        assert col.null_share_current is None and col.n_current == 0
    report = data_drift(empty, ref)
    assert all(c.severity == "warning" and "no values in reference (no rows)" in c.finding for c in report.columns)
    report = data_drift(empty, empty)
    assert report.severity == "ok" and report.rows_reference == report.rows_current == 0
    _json_safe(report)
    assert data_drift(pd.DataFrame(), pd.DataFrame()).drift_share is None


def test_constant_reference_still_sees_values_on_either_side():
    ref = pd.DataFrame({"x": [5.0] * 200})
    lower = data_drift(ref, pd.DataFrame({"x": [4.0] * 200})).column("x")
    higher = data_drift(ref, pd.DataFrame({"x": [6.0] * 200})).column("x")
    assert lower.severity == higher.severity == "critical"
    assert lower.psi == pytest.approx(higher.psi) and lower.psi > 1


def test_nulls_are_left_out_and_a_change_of_null_share_is_a_finding():
    rng = np.random.default_rng(11)
    values = rng.normal(size=2000)
    ref = pd.DataFrame({"x": values})
    holed = values.copy()
    holed[: 800] = np.nan  # 40 % null now; the rest is the same distribution
    holed[800:810] = np.inf  # infinities count as nulls too
    col = data_drift(ref, pd.DataFrame({"x": holed})).column("x")
    assert col.n_current == 1190
    assert col.null_share_reference == 0.0 and col.null_share_current == pytest.approx(810 / 2000)
    assert col.severity == "warning" and "null share 0 -> 0.405" in col.finding
    lenient = data_drift(ref, pd.DataFrame({"x": holed}), thresholds=DriftThresholds(null_share_change=0.5))
    assert lenient.column("x").severity == "ok"


def test_nullable_and_datetime_columns():
    ref = pd.DataFrame(
        {
            "n": pd.array([1, 2, None, 4] * 50, dtype="Int64"),
            "when": pd.date_range("2024-01-01", periods=200, freq="h", tz="UTC"),
            "lag": pd.to_timedelta(np.arange(200), unit="s"),
        }
    )
    cur = ref.copy()
    cur["when"] = cur["when"] + pd.Timedelta(days=30)
    report = data_drift(ref, cur)
    assert report.column("n").kind == "numeric" and report.column("n").null_share_reference == 0.25
    assert report.column("n").psi == 0
    when = report.column("when")
    assert when.kind == "numeric" and when.severity == "critical"
    assert when.wasserstein == pytest.approx(30 * 86400)  # in seconds
    assert report.column("lag").psi == 0
    retyped = data_drift(ref, cur.assign(when=np.arange(200.0))).column("when")
    assert retyped.severity == "critical" and retyped.finding.startswith("type changed: datetimes")


# --------------------------------------------------------------------------- escalation


def _warning_column():
    ref = pd.DataFrame({"label": ["a"] * 500 + ["b"] * 500})
    cur = pd.DataFrame({"label": ["a"] * 600 + ["b"] * 400})  # 10 % moved, chi-squared p 7e-6, PSI 0.04: a warning
    return ref, cur


@pytest.mark.parametrize(
    ("previous", "nights", "expected"),
    [
        ([], 2, "warning"),
        (["ok"], 2, "warning"),
        (["warning"], 2, "critical"),
        (["critical"], 2, "critical"),  # a night already escalated keeps the run going
        (["warning", "ok"], 2, "warning"),  # most recent last: last night was fine
        (["ok", "warning"], 2, "critical"),
        (["warning"], 3, "warning"),
        (["warning", "warning"], 3, "critical"),
        ([], 1, "critical"),
    ],
)
def test_a_lasting_warning_escalates(previous, nights, expected):
    ref, cur = _warning_column()
    report = data_drift(
        ref, cur, history={"label": previous}, thresholds=DriftThresholds(escalate_after_nights=nights)
    )
    col = report.column("label")
    assert col.severity == expected
    assert col.escalated is (expected == "critical")
    if col.escalated:
        assert col.finding.startswith(f"escalated to P0: warning or worse for {nights} consecutive night")
        assert report.severity == "critical"


def test_escalation_only_raises_warnings_and_history_is_per_column():
    ref, cur = _warning_column()
    ok = data_drift(ref, ref, history={"label": ["warning", "warning"]}).column("label")
    assert ok.severity == "ok" and not ok.escalated
    other = data_drift(ref, cur, history={"another": ["warning"]}).column("label")
    assert other.severity == "warning"
    # tonight's severities are the next night's history
    night1 = data_drift(ref, cur)
    night2 = data_drift(ref, cur, history={k: [v] for k, v in night1.severities().items()})
    assert night2.column("label").escalated


# --------------------------------------------------------------------------- bad options


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"psi_warning": 0.6}, "psi_warning (0.6) must be below psi_critical (0.55)"),
        ({"psi_warning": 0.0}, "psi_warning must be above 0"),
        ({"psi_critical": float("nan")}, "psi_critical must be a finite number"),
        ({"alpha": 1.5}, "alpha must be between 0 and 1"),
        ({"floor": -0.1}, "floor must be >= 0"),
        ({"floors": {"x": -1}}, "the floor of column 'x' must be a number >= 0"),
        ({"null_share_change": 0}, "null_share_change must be in (0, 1]"),
        ({"escalate_after_nights": 0}, "escalate_after_nights must be a whole number of nights >= 1"),
        ({"escalate_after_nights": 2.5}, "escalate_after_nights must be a whole number"),
        ({"escalate_after_nights": True}, "escalate_after_nights must be a whole number"),
    ],
)
def test_thresholds_are_validated(kwargs, message):
    with pytest.raises(DriftConfigError, match="DriftThresholds") as info:
        DriftThresholds(**kwargs)
    assert message in str(info.value)
    assert "Pass values like the defaults" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_default_thresholds():
    t = DriftThresholds()
    assert (t.psi_warning, t.psi_critical, t.alpha, t.null_share_change, t.escalate_after_nights) == (
        0.25, 0.55, 0.005, 0.10, 2,
    )
    assert (t.floor, t.share_floor, t.floors) == (0.05, 0.005, {})
    assert [t.severity(p) for p in (0.25, 0.2501, 0.55, 0.5501)] == ["ok", "warning", "warning", "critical"]


def test_bad_options_are_refused_before_any_work():
    df = pd.DataFrame({"x": [1.0, 2.0]})
    with pytest.raises(DriftConfigError, match="bins: must be a whole number >= 2"):
        data_drift(df, df, bins=1)
    with pytest.raises(DriftConfigError, match="is a list, not a pandas DataFrame"):
        data_drift([1, 2], df)
    with pytest.raises(DriftConfigError, match="'nope' is in neither table"):
        data_drift(df, df, columns=["x", "nope"])
    with pytest.raises(DriftConfigError, match="not a list of column names"):
        data_drift(df, df, columns="x")
    with pytest.raises(DriftConfigError, match="unknown severities"):
        data_drift(df, df, history={"x": ["fine"]})
    with pytest.raises(DriftConfigError, match="not a list of severities"):
        data_drift(df, df, history={"x": "warning"})
    with pytest.raises(DriftConfigError, match="thresholds"):
        data_drift(df, df, thresholds={"psi_warning": 0.1})
    with pytest.raises(DriftConfigError, match="workers"):
        data_drift(df, df, workers=0)
    with pytest.raises(DriftConfigError, match="two columns are named 'x'"):
        data_drift(pd.concat([df, df], axis=1), df)
    with pytest.raises(DriftConfigError, match="in neither table"):
        column_histograms(df, df, "nope")


def test_columns_limits_the_comparison(penguins):
    report = data_drift(penguins, penguins, columns=["body_mass_g", "island"])
    assert [c.column for c in report.columns] == ["body_mass_g", "island"]
    assert column_histograms(penguins, penguins.drop(columns="island"), "island") is None


# --------------------------------------------------------------------------- scale and imports


def test_a_million_rows_smoke():
    rng = np.random.default_rng(1)
    n = 1_000_000
    ref = pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.exponential(size=n).round(2),
            "c": rng.choice(list("xyz"), n),
            "d": rng.normal(size=n),
        }
    )
    cur = pd.DataFrame(
        {
            "a": rng.normal(0.1, 1, size=n),
            "b": rng.exponential(size=n).round(2),
            "c": rng.choice(list("xyzw"), n),
            "d": rng.normal(2, 1, size=n),
        }
    )
    report = data_drift(ref, cur, workers=2)
    assert [c.column for c in report.columns] == ["a", "b", "c", "d"]
    a = report.column("a")  # a tenth of a sigma: PSI ~0.01, but real (p < 1e-9) and above the 0.05σ floor
    assert a.severity == "warning" and a.ks_pvalue < 1e-10 and "mean +0.1" in a.finding and "p < 1e-9" in a.finding
    assert report.column("d").severity == "critical"
    assert report.column("b").severity == "ok"
    assert report.column("c").new_categories == ("w",) and report.column("c").severity == "critical"
    _json_safe(report)


def test_importing_drift_imports_no_heavy_library():
    code = (
        "import sys, concord.audit.drift; "
        "print(sorted(m for m in ('numpy', 'pandas', 'scipy', 'torch', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- tables read in batches


def test_batches_give_data_drifts_report_while_every_value_is_kept(penguins):
    from concord.audit.drift import TableBatches, data_drift_batches

    adelie = penguins[penguins.species == "Adelie"]
    gentoo = penguins[penguins.species == "Gentoo"]
    for ref, cur in ((adelie, gentoo), (penguins.iloc[::2], penguins.iloc[1::2])):
        whole = data_drift(ref, cur, history={"body_mass_g": ["warning"]})
        batched = data_drift_batches(
            TableBatches.of_frame(ref, rows=17), TableBatches.of_frame(cur, rows=23), history={"body_mass_g": ["warning"]}
        )
        assert batched.to_dict() == whole.to_dict()
        assert batched.histograms() == whole.histograms()
    odd = pd.DataFrame({"x": [1.0, 2.0, np.nan, 4.0], "s": ["a", None, "b", "a"], "gone": [1, 2, 3, 4]})
    cur = pd.DataFrame({"x": [np.nan] * 4, "s": ["a", "a", "c", "c"], "added": [1, 2, 3, 4]})
    batched = data_drift_batches(TableBatches.of_frame(odd, rows=1), TableBatches.of_frame(cur, rows=3), columns=None)
    assert batched.to_dict() == data_drift(odd, cur).to_dict()


def _sorted_by_time(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    """Rows in time order (a column sorted from first to last row), a normal column, a label."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "t": np.arange(n, dtype=np.float64) + shift * n,
            "x": rng.normal(4 * shift, 1.0, n),
            "c": rng.choice(list("abc"), n),
        }
    )


def test_large_tables_are_compared_on_uniform_samples_with_exact_counts():
    from concord.audit.drift import TableBatches, data_drift_batches

    n, k = 400_000, 20_000
    ref, cur = _sorted_by_time(n, 1), _sorted_by_time(n, 2, shift=0.25)
    exact = data_drift(ref, cur)
    sampled = data_drift_batches(TableBatches.of_frame(ref, rows=30_000), TableBatches.of_frame(cur, rows=30_000), sample_size=k)
    assert sampled.severities() == exact.severities() == {"t": "critical", "x": "critical", "c": "ok"}
    assert sampled.rows_reference == sampled.rows_current == n
    for name in ("t", "x"):
        s, e = sampled.column(name), exact.column(name)
        assert s.sampled and not e.sampled
        assert (s.n_reference, s.n_current) == (n, n)
        assert f"KS, Brown–Forsythe and Wasserstein from uniform samples ({k:,} of the {n:,} reference values" in s.finding
        # the current side's bins hold every value: its shares are exact on the sample's edges
        edges = np.array(s.histogram.edges)
        counts = np.bincount(np.searchsorted(edges, cur[name].to_numpy(), side="left"), minlength=edges.size + 1)
        assert s.histogram.current == tuple(counts / n)
        assert (s.histogram.low, s.histogram.high) == (e.histogram.low, e.histogram.high)
        # the edges are the sample's deciles: within a few sampling errors of the reference's own,
        # also for the time-ordered column (a sample of the first rows would miss the last ones)
        ref_counts = np.bincount(np.searchsorted(edges, ref[name].to_numpy(), side="left"), minlength=edges.size + 1)
        np.testing.assert_allclose(ref_counts / n, 0.1, atol=6 * math.sqrt(0.09 / k))
        # KS of two uniform samples: within the DKW bound of the exact statistic (alpha = 1e-9 per side)
        assert abs(s.ks - e.ks) <= 2 * math.sqrt(math.log(2 / 1e-9) / (2 * k))
        assert s.wasserstein == pytest.approx(e.wasserstein, rel=0.1)
        assert s.psi == pytest.approx(e.psi, rel=0.1, abs=0.005)
    assert sampled.column("c").to_dict() == exact.column("c").to_dict()  # categories: exact counts
    again = data_drift_batches(TableBatches.of_frame(ref, rows=30_000), TableBatches.of_frame(cur, rows=30_000), sample_size=k)
    assert again.to_dict() == sampled.to_dict()  # the samples are seeded: the same tables, the same report


def test_batches_refuse_bad_options():
    from concord.audit.drift import TableBatches, data_drift_batches

    df = pd.DataFrame({"x": [1.0, 2.0]})
    t = TableBatches.of_frame(df)
    with pytest.raises(DriftConfigError, match="sample_size: must be a whole number >= 2"):
        data_drift_batches(t, t, sample_size=1)
    with pytest.raises(DriftConfigError, match="not TableBatches"):
        data_drift_batches(df, t)
    with pytest.raises(DriftConfigError, match="'nope' is in neither table"):
        data_drift_batches(t, t, columns=["nope"])
    with pytest.raises(DriftConfigError, match="two columns are named 'x'"):
        data_drift_batches(TableBatches(("x", "x"), t.read), t)


def test_the_streamed_sample_is_algorithm_r_and_the_tables_stay_as_they_were():
    """The reservoir (kept in buffers from batch to batch, batches of any size) holds exactly what
    algorithm R, value by value, keeps from the same seeded draws; reading never changes the table."""
    from concord.audit.drift import _Column, _seed

    rng = np.random.default_rng(3)
    sizes = [30, 100, 7, 250, 40, 0, 600, 90]
    batches = [rng.standard_normal(n) for n in sizes]
    k = 50
    column = _Column(sample_size=k, seed=_seed("x"))
    kept = [b.copy() for b in batches]
    for b in batches:
        column.add(pd.Series(b))
    side = column.finish()
    for b, before in zip(batches, kept):
        assert np.array_equal(b, before)
    # algorithm R by hand: the first k values, then each value at position i taken with
    # probability k / (i + 1) into a uniformly drawn slot, in stream order
    draws = np.random.default_rng([0x5EED, _seed("x")])
    values = np.concatenate(batches)
    sample, seen, start = values[:k].copy(), k, 0
    for b in batches:
        rest = b[max(0, k - start):]
        start += b.size
        if not rest.size:
            continue
        taken = rest[draws.random(rest.size) * np.arange(seen + 1, seen + rest.size + 1) < k]
        for value, slot in zip(taken, draws.integers(0, k, size=taken.size)):
            sample[slot] = value
        seen += rest.size
    assert side.sampled and side.size == values.size
    assert np.array_equal(side.values, np.sort(sample))
    frame = pd.DataFrame({"x": values, "y": values[::-1].copy()})
    before = frame.copy()
    data_drift(frame, frame.iloc[::-1].reset_index(drop=True))
    pd.testing.assert_frame_equal(frame, before)
