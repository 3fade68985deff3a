"""A current column counted on a grid of a profile's sample (concord.audit.binned): every value in
the bin numpy's binary search gives it, KS, Wasserstein and Brown–Forsythe from the counts within
their stated bounds, and the audit against a profile giving the raw audit's severities on drifted
and undrifted pairs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from concord.audit.binned import Cells, Grid, grid_of, grid_tests
from concord.audit.drift import (
    DEFAULT_BINS,
    TableBatches,
    _ks_wasserstein,
    data_drift,
    data_drift_batches,
    quantile_edges,
)
from concord.audit.profile import profile_drift, profile_table


def _pairs():
    """(name, sorted reference sample, current values): continuous, heavy-tailed, skewed, discrete,
    constant, timestamps, and extremes near float64's limits."""
    rng = np.random.default_rng(7)
    n, m = 40_000, 120_000
    yield "normal", rng.standard_normal(n), rng.standard_normal(m) + 0.05
    yield "t3", rng.standard_t(3, n), rng.standard_t(3, m) * 1.1
    yield "lognormal σ=2", np.exp(2 * rng.standard_normal(n)), np.exp(2 * rng.standard_normal(m))
    yield "counts", rng.poisson(4, n).astype(float), rng.poisson(4.1, m).astype(float)
    yield "constant", np.full(500, 3.0), np.concatenate([np.full(m - 10, 3.0), np.arange(10.0)])
    yield "a small reference", rng.standard_normal(300), rng.standard_normal(m)
    yield "timestamps", 1.7e9 + rng.random(n) * 86_400, 1.7e9 + rng.random(m) * 90_000
    yield "outliers", np.concatenate([rng.standard_normal(n), [-1e300, 1e300]]), np.concatenate([rng.standard_normal(m), [-1e308, 1e308]])
    yield "tiny span", np.array([0.0, 5e-324, 1e-323] * 100), np.array([-5e-324, 0.0, 5e-324, 1e-323, 2e-323] * 100)


@pytest.mark.parametrize("name,ref,cur", list(_pairs()), ids=[p[0] for p in _pairs()])
def test_every_value_lands_in_the_bin_a_binary_search_of_the_quantile_grid_gives_it(name, ref, cur):
    ref = np.sort(ref)
    grid = Grid.of(ref, quantile_edges(ref, DEFAULT_BINS))
    assert np.all(np.diff(grid.edges) > 0) and grid.edges[0] < ref[0] and ref[-1] in grid.edges
    # the edges themselves, their neighbours, and values beyond both ends
    probes = np.concatenate([cur, ref, grid.edges, np.nextafter(grid.edges, -np.inf), np.nextafter(grid.edges, np.inf)])
    probes = probes[np.isfinite(probes)]
    scratch: dict = {}
    for values in (probes, probes[::-1].copy(), probes[:17].copy()):  # buffers reused, then smaller
        at, shifted = grid.index(values, scratch)
        np.testing.assert_array_equal(at, np.searchsorted(grid.edges, values, side="left"))
        np.testing.assert_array_equal(shifted, values - grid.lo)
    counts, sums = grid.count(cur)
    assert counts.sum() == cur.size and counts.size == sums.size == grid.bins
    # the PSI bins' counts are sums of the grid's, equal to counting on them
    psi = quantile_edges(ref, DEFAULT_BINS)
    at_or_below = np.array([np.count_nonzero(cur <= e) for e in psi])
    np.testing.assert_array_equal(grid.counts_at(psi, counts), np.diff(np.concatenate(([0], at_or_below, [cur.size]))))


@pytest.mark.parametrize("name,ref,cur", list(_pairs()), ids=[p[0] for p in _pairs()])
def test_uniform_cells_put_every_value_in_its_cell_and_are_made_only_where_they_resolve_the_reference(name, ref, cur):
    ref = np.sort(ref)
    cells = Cells.fit(ref)
    if cells is None:
        assert isinstance(grid_of(ref), Grid)
        return
    assert grid_of(ref) == cells or isinstance(grid_of(ref), Cells)
    probes = np.concatenate([cur, ref, np.nextafter(ref, -np.inf), np.nextafter(ref, np.inf)])
    probes = probes[np.isfinite(probes)]
    at, shifted = cells.index(probes, {})
    with np.errstate(all="ignore"):
        expected = np.clip((probes - cells.lo) * cells.scale + 1, 0, cells.cells + 1).astype(np.intp)
    np.testing.assert_array_equal(at, expected)
    order = np.argsort(probes, kind="stable")
    assert np.all(np.diff(at[order]) >= 0)  # monotone in the value: bins of an ordered partition
    # every cell holds at most 1/2,048 of the reference, or a single value of it
    ids = cells.index(ref)[0]
    for b in np.flatnonzero(np.bincount(ids) > ref.size / 2048):
        assert np.unique(ref[ids == b]).size == 1, (name, b)


def test_crowded_cells_get_grids_of_their_own():
    """A skewed column crowds its edges into a few uniform cells: those cells' edges are gridded
    again, and the values in them still land where a binary search puts them."""
    rng = np.random.default_rng(3)
    ref = np.sort(np.exp(3 * rng.standard_normal(50_000)))
    grid = Grid.of(ref)
    assert grid.inner is not None and grid.crowded is not None
    cur = np.exp(3 * rng.standard_normal(100_000))
    np.testing.assert_array_equal(grid.index(cur)[0], np.searchsorted(grid.edges, cur, side="left"))


@pytest.mark.parametrize("make", ["grid_of", "Grid.of"])
@pytest.mark.parametrize("name,ref,cur", list(_pairs())[:7], ids=[p[0] for p in _pairs()][:7])
def test_the_tests_from_the_grid_are_within_their_bounds(name, ref, cur, make):
    """KS: never above the exact statistic, below it by at most the largest share of a bin;
    Wasserstein-1: never above the exact distance, within 2 % of it or 1e-3 of a reference σ;
    Brown–Forsythe: scipy's p-value on every value, to within 0.02 (or both below 1e-6)."""
    ref = np.sort(ref)
    grid = (grid_of if make == "grid_of" else Grid.of)(ref, quantile_edges(ref, DEFAULT_BINS))
    counts, sums = grid.count(cur)
    got = grid_tests(ref, grid, counts, sums, float(cur.mean()), float(np.square(cur - cur.mean()).sum()))
    ks, _, w = _ks_wasserstein(ref, np.sort(cur))
    share = max((grid.count(ref)[0] / ref.size).max(), (counts / cur.size).max())
    assert ks - share - 1e-12 <= got.ks <= ks + 1e-12
    sigma = float(ref.std()) or 1.0
    assert got.wasserstein <= w * (1 + 1e-9) + 1e-12
    assert got.wasserstein >= min(w * 0.98, w - 1e-3 * sigma)
    with np.errstate(all="ignore"):
        p = float(stats.levene(ref, cur, center="median").pvalue)
    if math.isnan(p):
        assert math.isnan(got.brown_forsythe)
    else:
        assert abs(got.brown_forsythe - p) <= 0.02 or max(got.brown_forsythe, p) < 1e-6, (got.brown_forsythe, p)


def _table(n: int, seed: int, *, shift: float = 0.0, scale: float = 1.0, moved: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    labels = rng.choice(np.array(list("abcde"), dtype=object), n, p=[0.4, 0.25, 0.15, 0.1, 0.1])
    labels = np.where((labels == "a") & (rng.random(n) < moved / 0.4), "e", labels)
    logn = np.exp(rng.standard_normal(n) * 0.5)
    return pd.DataFrame({
        "normal": rng.standard_normal(n) * scale + shift,
        "lognormal": (logn - 1.13) * scale + 1.13 + shift * 0.6,
        "t3": rng.standard_t(3, n) * scale + shift * math.sqrt(3),
        "count": rng.poisson(4, n) + (rng.random(n) < 2 * shift),  # mean + 2·shift: shift σ
        "label": labels,
    })


PAIRS = {
    "none": {},
    "mean +0.1σ": {"shift": 0.1},
    "mean +0.3σ": {"shift": 0.3},
    "scale ×1.2": {"scale": 1.2},
    "5% of the labels moved": {"moved": 0.05},
}


@pytest.mark.parametrize("case", list(PAIRS))
def test_against_a_profile_the_grid_gives_the_raw_audits_severities(case):
    """Drifted and undrifted pairs, three seeds each: the audit against a profile (the current
    columns counted on its grid) gives every column the severity of the raw streamed audit (the
    current table sampled like the reference) and of the exact audit of both whole tables."""
    n, k = 60_000, 10_000
    for seed in range(3):
        ref, cur = _table(n, 100 + seed), _table(n, 200 + seed, **PAIRS[case])
        batches = lambda df: TableBatches.of_frame(df, rows=9_000)  # noqa: E731
        against = profile_drift(profile_table(batches(ref), sample_size=k), batches(cur), sample_size=k)
        assert all("counted on" in against.column(c).finding for c in ("normal", "lognormal", "t3", "count"))
        raw = data_drift_batches(batches(ref), batches(cur), sample_size=k)
        exact = data_drift(ref, cur)
        assert against.severities() == raw.severities() == exact.severities(), (case, seed, against.severities(), raw.severities())
        drifted = {c for c, s in against.severities().items() if s != "ok"}
        if case == "none":
            assert not drifted
        elif "labels" in case:
            assert drifted == {"label"}
        else:
            assert {"normal", "lognormal", "t3"} <= drifted, (case, seed, drifted)
