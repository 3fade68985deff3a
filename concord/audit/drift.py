"""Data drift: how far a current table has moved from a reference table, column by column.

:func:`data_drift` compares two pandas DataFrames and returns a :class:`DriftReport`: one
:class:`ColumnDrift` per column with its statistics, a severity and a one-line ``finding``, the share
of drifted columns and the worst severity. Nothing about a column makes it raise: a column that is
missing, new, empty, all-null, constant or of another type on one side is a finding of its own.

Numeric columns (integers, floats; datetimes as seconds since the epoch in UTC, timedeltas as
seconds) are binned on the reference's quantiles (:func:`quantile_edges`): bin ``k`` ends at the
smallest reference value with at least ``k/bins`` of the reference at or below it; bins are closed
on the right, repeated edges (tied or discrete data) are merged, and the outer bins are open to
-inf and +inf so that current values outside the reference's range land in the end bins. When the
reference's minimum is itself the first edge (a point mass at the minimum, as in discrete data),
one more bin holds the values below it, so that a value under the reference's range is never
counted as the minimum; the bin above the last edge plays that role at the top. On these bins:

* PSI, the population stability index: ``sum((c - r) * ln(c / r))``;
* KL, the Kullback–Leibler divergence of current from reference: ``sum(c * ln(c / r))``;
* JS, the Jensen–Shannon *distance* (the square root of the divergence), natural logarithm,
  so it lies in ``[0, sqrt(ln 2)]``;

where ``r`` and ``c`` are the two smoothed proportions (:func:`smoothed_proportions`): each
empty bin's share is set to :data:`EPSILON` (``1e-4``), on both sides, and each side is then
divided by its sum so it adds up to 1 again. All three use the natural logarithm (nats). On the
values themselves, not the bins: the two-sample Kolmogorov–Smirnov statistic and p-value and the
Wasserstein-1 distance (in the column's units), equal to ``scipy.stats.ks_2samp`` and
``scipy.stats.wasserstein_distance``. Up to :data:`KS_EXACT_MAX_N` values per side scipy computes
them (with the exact p-value where scipy manages it); above, they are computed here from the two
sorted samples in one merge, with Smirnov's asymptotic p-value as ``ks_2samp(method="asymp")``
gives it.

Categorical columns (strings, categories, booleans, anything else) are compared over buckets of
their categories, labels taken as text: the reference's :data:`MAX_COMPARED_CATEGORIES` most
frequent ones one by one, its others pooled as "(other)", and every category the reference never had
pooled as "(new)" (so that thousands of empty categories' epsilons cannot swamp the reference: a
wholesale replacement scores the same PSI at any cardinality). On them: PSI, KL and JS over the
smoothed shares as above; Pearson's chi-squared test (``scipy.stats.chi2_contingency``, no
continuity correction) on the 2 x K table of every category, those expected fewer than
:data:`MIN_EXPECTED` times on a side pooled on both; and the categories new in current and
vanished from it, with ``new_share``, the share of current values in new categories. More than
:data:`NEW_SHARE_CRITICAL` (half) of them there makes a drifted column critical whatever PSI says.

Nulls (None, NaN, NaT, and ±inf in numeric columns) are left out of every statistic and reported as
each side's null share; a change of null share larger than ``null_share_change`` is itself a finding.

A column drifts when its change is significant and material (:class:`DriftThresholds`, see
``docs/drift.md``): its tests' combined p-value (numeric: Welch's t on the exact moments,
Brown–Forsythe and KS, Bonferroni; categorical: chi-squared on every category, the rare ones pooled
on both sides, and the new share against the reference's singleton share, Good–Turing), adjusted
over the compared columns by Benjamini–Hochberg, is below ``alpha``, and its effect (numeric:
Wasserstein-1 in reference standard deviations; categorical: the share of mass moved) is at least
its floor, or PSI above ``psi_warning``. A drifted column is ``"warning"`` (P1), ``"critical"``
(P0) when PSI is above ``psi_critical`` or more than half of current is in new categories. Each
finding states the effect in readable terms (``effect``: "mean +0.31σ, scale ×1.02, W 0.3σ, p <
1e-9"). A change of null share beyond ``null_share_change`` makes a column at least a warning. A
warning seen on ``escalate_after_nights`` consecutive nights, tonight included, becomes critical
(see :func:`data_drift`'s ``history``). Structural findings have fixed severities:
a column missing from current, of another type, or with no values left in current is critical; one
with no values in the reference is a warning; one only current has is ok and not counted as
compared.

:func:`data_drift` takes two DataFrames and uses every value. :func:`data_drift_batches` takes two
tables read batch by batch (:class:`TableBatches`; :func:`concord.lineage.data.table_batches` for files) in
memory that does not grow with them: the reference first, then the current table in one pass; counts,
categories and the current side's bin counts stay exact, and above :data:`SAMPLE_SIZE` values per
column and side, the edges, the reference's bin shares, KS and Wasserstein come from seeded uniform
samples (see ``docs/drift.md`` for the bounds). Against a reference profile, a current column above
that size is counted on a fine grid of the profile's sample instead (:mod:`concord.audit.binned`).

numpy, pandas and scipy are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from concord.audit.binned import grid_of, grid_tests
from concord.errors import DriftConfigError
from concord.lineage.data import TableBatches
from concord.lineage.data import columns_by_name as _columns_by_name

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

__all__ = [
    "DEFAULT_BINS",
    "EPSILON",
    "KS_EXACT_MAX_N",
    "SEVERITIES",
    "ColumnDrift",
    "ColumnHistogram",
    "DriftReport",
    "DriftThresholds",
    "SAMPLE_SIZE",
    "TableBatches",
    "column_histograms",
    "data_drift",
    "data_drift_batches",
    "quantile_edges",
    "smoothed_proportions",
]

#: the share given to an empty bin (or an absent category), on both sides, before renormalising
EPSILON = 1e-4
#: reference quantile bins per numeric column
DEFAULT_BINS = 10
#: up to this many values per side, scipy computes KS (exact p-value) and Wasserstein itself
KS_EXACT_MAX_N = 10_000
#: new and vanished categories listed per column at most (the most frequent first)
MAX_LISTED_CATEGORIES = 50
#: categorical columns: the reference's most frequent categories compared one by one; its other
#: categories are pooled as "(other)" and those it never had as "(new)"
MAX_COMPARED_CATEGORIES = 100
#: categorical columns: more than this share of current values in categories the reference never
#: had makes a column critical, whatever PSI says
NEW_SHARE_CRITICAL = 0.5
#: streamed tables (:func:`data_drift_batches`): numeric values kept per column and side; above,
#: a uniform sample of this many
SAMPLE_SIZE = 500_000
SEVERITIES = ("ok", "warning", "critical")
#: the paging priority of each severity that is not ok
PRIORITIES = {"warning": "P1", "critical": "P0"}


class Prioritised:
    """Anything graded by a ``severity``: its priority, P1 for a warning and P0 for critical."""

    severity: str

    @property
    def priority(self) -> str | None:
        return PRIORITIES.get(self.severity)
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


# --------------------------------------------------------------------------- thresholds


@dataclass(frozen=True)
class DriftThresholds:
    """When a column counts as drifted, and how a lasting warning escalates."""

    #: PSI above this: severity "warning" (P1). 0.25 is the usual "significant shift" mark.
    psi_warning: float = 0.25
    #: PSI above this: severity "critical" (P0). Must be above ``psi_warning``.
    psi_critical: float = 0.55
    #: significance: a column drifts only if its p-value, adjusted over the audit's columns
    #: (Benjamini–Hochberg), is below this; each column's tests share it (Bonferroni), so with
    #: no drift a column alarms at most this often.
    alpha: float = 0.005
    #: materiality, numeric columns: a column drifts only if the Wasserstein-1 distance between
    #: the two sides, in reference standard deviations, is at least this (or PSI is above
    #: ``psi_warning``). A mean shift of d σ moves it by d, a scale ×(1 + s) by about 0.8·s.
    floor: float = 0.05
    #: materiality, categorical columns: the share of the mass moved between categories (total
    #: variation distance over the pooled categories) must be at least this (or PSI above ``psi_warning``)
    share_floor: float = 0.005
    #: per-column floors, overriding ``floor`` / ``share_floor`` (in the column's own unit)
    floors: Mapping[str, float] = field(default_factory=dict)
    #: a change of null share (absolute, 0..1) larger than this makes the column at least "warning".
    null_share_change: float = 0.10
    #: consecutive nights at "warning" or worse, tonight included, after which a warning is
    #: reported as "critical". 1 makes every warning critical.
    escalate_after_nights: int = 2

    def __post_init__(self) -> None:
        problems = []
        def bad(value: Any) -> bool:
            return isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)

        for name in ("psi_warning", "psi_critical", "alpha", "null_share_change", "floor", "share_floor"):
            value = getattr(self, name)
            if bad(value):
                problems.append(f"{name} must be a finite number, got {value!r}")
        if not isinstance(self.floors, Mapping):
            problems.append(f"floors must map column names to floors, got {self.floors!r}")
        else:
            object.__setattr__(self, "floors", {str(k): v for k, v in self.floors.items()})
            problems += [f"the floor of column {k!r} must be a number >= 0, got {v!r}" for k, v in self.floors.items() if bad(v) or v < 0]
        if not problems:
            if self.psi_warning <= 0:
                problems.append(f"psi_warning must be above 0, got {self.psi_warning}")
            if self.psi_critical <= self.psi_warning:
                problems.append(
                    f"psi_warning ({self.psi_warning}) must be below psi_critical ({self.psi_critical})"
                )
            if not 0 < self.alpha < 1:
                problems.append(f"alpha must be between 0 and 1, got {self.alpha}")
            if self.floor < 0 or not 0 <= self.share_floor <= 1:
                problems.append(f"floor must be >= 0 and share_floor in [0, 1], got {self.floor} and {self.share_floor}")
            if not 0 < self.null_share_change <= 1:
                problems.append(f"null_share_change must be in (0, 1], got {self.null_share_change}")
        nights = self.escalate_after_nights
        if isinstance(nights, bool) or not isinstance(nights, int) or nights < 1:
            problems.append(f"escalate_after_nights must be a whole number of nights >= 1, got {nights!r}")
        if problems:
            raise DriftConfigError(
                "DriftThresholds",
                "; ".join(problems),
                "Pass values like the defaults (psi_warning=0.25 < psi_critical=0.55, alpha=0.005, floor=0.05, "
                "share_floor=0.005, null_share_change=0.1, escalate_after_nights=2).",
            )

    def severity(self, psi: float) -> str:
        """The severity PSI alone gives: "ok", "warning" (> psi_warning) or "critical" (> psi_critical)."""
        if psi > self.psi_critical:
            return "critical"
        if psi > self.psi_warning:
            return "warning"
        return "ok"

    def floor_for(self, column: str, kind: str) -> float:
        """The column's floor: its own in ``floors``, else ``floor`` (numeric) or ``share_floor``."""
        if column in self.floors:
            return float(self.floors[column])
        return self.floor if kind == "numeric" else self.share_floor

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["floors"] = dict(self.floors)
        return d


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ColumnHistogram:
    """What a histogram overlay of one column needs: the bins and both sides' raw shares.

    Numeric: ``edges`` are the finite inner bin edges; the bins are ``(-inf, edges[0]]``,
    ``(edges[0], edges[1]]``, ..., ``(edges[-1], +inf)``, one more than the edges; ``low`` and
    ``high`` are the smallest and largest value on either side, to draw the outer bins with.
    Categorical: ``categories`` are the labels (the reference's by count, then the new ones).
    ``reference`` and ``current`` are the shares of each bin or category (raw counts / values, each
    summing to 1, without the smoothing the statistics use).
    """

    column: str
    kind: str  # "numeric" | "categorical"
    reference: tuple[float, ...]
    current: tuple[float, ...]
    edges: tuple[float, ...] | None = None
    categories: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("reference", "current", "edges", "categories"):
            if d[k] is not None:
                d[k] = list(d[k])
        return d


@dataclass(frozen=True)
class ColumnDrift(Prioritised):
    """One column's comparison. Statistics that do not apply to it are None."""

    column: str
    kind: str  # "numeric" | "categorical"
    severity: str  # "ok" | "warning" (P1) | "critical" (P0)
    finding: str
    psi: float | None = None
    kl: float | None = None
    js: float | None = None
    ks: float | None = None
    ks_pvalue: float | None = None
    wasserstein: float | None = None
    chi2: float | None = None
    chi2_pvalue: float | None = None
    new_categories: tuple[str, ...] | None = None
    vanished_categories: tuple[str, ...] | None = None
    #: categorical: the share of current values whose category the reference never had
    new_share: float | None = None
    #: numeric: KS and Wasserstein (and a sampled reference's bin shares) come from uniform samples
    sampled: bool = False
    null_share_reference: float | None = None
    null_share_current: float | None = None
    n_reference: int | None = None  # values compared (nulls left out); None if the column is absent
    n_current: int | None = None
    escalated: bool = False  # a warning reported as critical because it lasted
    compared: bool = True  # False for a column only the current table has
    #: the column's tests (see NUMERIC_TESTS, CATEGORICAL_TESTS) and their combined p-value
    test: str | None = None
    pvalue: float | None = None
    #: ``pvalue`` adjusted over the audit's tested columns (Benjamini–Hochberg): what ``alpha`` judges
    pvalue_adjusted: float | None = None
    #: the effect the floor judges: numeric, Wasserstein-1 in reference σ; categorical, share of mass moved
    effect_size: float | None = None
    floor: float | None = None
    #: numeric: (mean_current - mean_reference) / σ_reference, and σ_current / σ_reference (exact moments)
    mean_shift: float | None = None
    scale_ratio: float | None = None
    #: categorical: the reference's singleton share (Good–Turing: the new share expected with no
    #: drift) and the one-sided p-value of the new share's excess over it
    new_share_expected: float | None = None
    new_share_pvalue: float | None = None
    #: the effect in readable terms, e.g. "mean +0.31σ, scale ×1.02, W 0.3σ, p < 1e-9"
    effect: str | None = None
    histogram: ColumnHistogram | None = field(default=None, repr=False, compare=False)
    measured: Any = field(default=None, repr=False, compare=False)  # what re-judging it needs

    @property
    def drifted(self) -> bool:
        return self.severity != "ok"


    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            if k in ("histogram", "measured"):
                continue
            v = getattr(self, k)
            d[k] = list(v) if isinstance(v, tuple) else v
        d["priority"] = self.priority
        return d


@dataclass(frozen=True)
class DriftReport:
    """The comparison of a current table with its reference."""

    columns: tuple[ColumnDrift, ...]
    #: drifted columns (severity not ok) / compared columns (those of the reference); None if none
    drift_share: float | None
    severity: str  # the worst column's
    rows_reference: int
    rows_current: int
    thresholds: DriftThresholds
    bins: int

    @property
    def compared(self) -> int:
        return sum(1 for c in self.columns if c.compared)

    @property
    def drifted(self) -> tuple[ColumnDrift, ...]:
        return tuple(c for c in self.columns if c.drifted)

    def column(self, name: str) -> ColumnDrift:
        for c in self.columns:
            if c.column == name:
                return c
        names = ", ".join(c.column for c in self.columns)
        raise KeyError(f"no column {name!r} in this report; it has {names}")

    def severities(self) -> dict[str, str]:
        """Each column's severity tonight: what the next night's ``history`` appends."""
        return {c.column: c.severity for c in self.columns}

    def histograms(self) -> dict[str, ColumnHistogram]:
        """The histogram data of every column that has one (both sides have values of one kind)."""
        return {c.column: c.histogram for c in self.columns if c.histogram is not None}

    def to_dict(self) -> dict:
        return {
            "severity": self.severity,
            "priority": PRIORITIES.get(self.severity),
            "drift_share": self.drift_share,
            "columns_compared": self.compared,
            "columns_drifted": len(self.drifted),
            "rows_reference": self.rows_reference,
            "rows_current": self.rows_current,
            "bins": self.bins,
            "epsilon": EPSILON,
            "thresholds": self.thresholds.to_dict(),
            "columns": [c.to_dict() for c in self.columns],
        }


# --------------------------------------------------------------------------- bins and divergences


def quantile_edges(sorted_reference: np.ndarray, bins: int = DEFAULT_BINS) -> np.ndarray:
    """The inner bin edges for a sorted, finite, non-empty reference sample.

    Edge ``k`` (k = 1 .. bins-1) is the smallest value with at least ``k/bins`` of the sample at or
    below it (numpy's ``inverted_cdf`` quantile, in exact integer arithmetic); repeated edges are
    merged. If the minimum is the first edge, ``nextafter(minimum, -inf)`` is put in front, so
    values below the minimum get a bin of their own. Bins are closed on the right; the outer ones
    are open to -inf and +inf.
    """
    import numpy as np

    x = sorted_reference
    n = x.size
    k = np.arange(1, bins, dtype=np.int64)
    idx = (n * k + bins - 1) // bins - 1  # ceil(n k / bins) - 1
    edges = np.unique(x[idx])
    if edges[0] == x[0]:
        edges = np.concatenate(([np.nextafter(x[0], -np.inf)], edges))
    return edges


def _bin_counts(sorted_values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of a sorted sample in the bins (-inf, e0], (e0, e1], ..., (e_last, +inf)."""
    import numpy as np

    at_or_below = np.searchsorted(sorted_values, edges, side="right")
    return np.diff(np.concatenate(([0], at_or_below, [sorted_values.size])))


def _unsorted_bin_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of an unsorted finite sample in the bins (-inf, e0], (e0, e1], ..., (e_last, +inf)."""
    import numpy as np

    if edges.size <= 32:  # a vectorised comparison per edge beats a binary search per value
        at_or_below = np.array([np.count_nonzero(values <= e) for e in edges], dtype=np.int64)
        return np.diff(np.concatenate(([0], at_or_below, [values.size])))
    # a value's bin is the number of edges below it
    return np.bincount(np.searchsorted(edges, values, side="left"), minlength=edges.size + 1)


def smoothed_proportions(counts: Sequence[float] | np.ndarray) -> np.ndarray:
    """Shares of ``counts`` with every empty bin set to :data:`EPSILON`, renormalised to sum to 1.

    ``p = counts / sum(counts)``; ``p[p == 0] = EPSILON``; ``p / sum(p)``. Non-empty bins keep their
    relative sizes; the result has no zero, so logarithms of ratios stay finite.
    """
    import numpy as np

    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        raise ValueError("smoothed_proportions needs at least one non-zero count")
    p = counts / total
    p[p == 0] = EPSILON
    return p / p.sum()


def _divergences(r: np.ndarray, c: np.ndarray) -> tuple[float, float, float]:
    """PSI, KL(c || r) and the Jensen–Shannon distance of two smoothed proportion vectors (nats)."""
    import numpy as np
    from scipy.special import rel_entr

    psi = float(np.sum((c - r) * np.log(c / r)))
    kl = float(np.sum(rel_entr(c, r)))
    m = (r + c) / 2
    jsd = (float(np.sum(rel_entr(r, m))) + float(np.sum(rel_entr(c, m)))) / 2
    return max(psi, 0.0), max(kl, 0.0), math.sqrt(max(jsd, 0.0))


#: above this effective sample size (m·n/(m+n)) the KS p-value comes from the limiting Kolmogorov
#: distribution: scipy's finite-n ``kstwo.sf`` can take a second per call there (n = 500,000),
#: and the two agree to a fraction of a percent
KS_LIMIT_N = 100_000


def _merged_ks_wasserstein(r: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """KS statistic and Wasserstein-1 distance of two sorted samples, from their merge.

    The merged sample is never built: each value's successor in it and both empirical CDFs at it
    come from one ``searchsorted`` (reference values first among equal ones). The Wasserstein
    distance is ``sum(|F_r - F_c| * gap to the next merged value)``, as scipy computes it (gaps
    inside a run of equal values are 0); the KS statistic is the largest ``|F_r - F_c|`` at the
    last value of a run (a positive gap follows), where the CDFs are the right-continuous ones.
    """
    import numpy as np

    n_r = r.size
    r_at_or_below_c = np.searchsorted(r, c, side="right")  # per current value
    c_below_r = np.cumsum(np.bincount(r_at_or_below_c, minlength=n_r + 1)[:n_r])  # per reference value
    ks = wasserstein = 0.0
    for own, other, other_before, own_is_reference in (
        (r, c, c_below_r, True),
        (c, r, r_at_or_below_c, False),
    ):
        # counts / sizes, as float64 divisions like scipy's (exact integers below 2**53)
        own_cdf = np.arange(1, own.size + 1, dtype=np.float64)
        own_cdf /= own.size
        other_cdf = other_before.astype(np.float64)
        other_cdf /= other.size
        diff = np.subtract(own_cdf, other_cdf, out=own_cdf) if own_is_reference else np.subtract(other_cdf, own_cdf, out=other_cdf)
        del own_cdf, other_cdf
        np.abs(diff, out=diff)
        # successor in the merge: the next own value or the first other value after this one (none:
        # +inf, for the own values above every other one, at the end since ``other_before`` is sorted)
        following = other.take(other_before, mode="clip")
        following[np.searchsorted(other_before, other.size):] = np.inf
        np.minimum(following[:-1], own[1:], out=following[:-1])
        gap = np.subtract(following, own, out=following)
        if np.isinf(gap[-1]):  # the largest value of all: both CDFs are 1 there
            gap[-1] = 0.0
        wasserstein += float(np.dot(diff, gap))
        ks = max(ks, float(np.max(diff, where=gap > 0, initial=0.0)))  # at the runs' ends
    return ks, wasserstein


def _ks_wasserstein(r: np.ndarray, c: np.ndarray) -> tuple[float, float, float]:
    """KS statistic, two-sided KS p-value and Wasserstein-1 distance of two sorted samples."""
    from scipy import stats

    n_r, n_c = r.size, c.size
    if max(n_r, n_c) <= KS_EXACT_MAX_N:
        res = stats.ks_2samp(r, c)  # "auto": the exact p-value at these sizes
        return float(res.statistic), float(res.pvalue), float(stats.wasserstein_distance(r, c))
    ks, wasserstein = _merged_ks_wasserstein(r, c)
    return ks, _ks_pvalue(ks, n_r, n_c), wasserstein


def _ks_pvalue(ks: float, n_r: int, n_c: int) -> float:
    """The two-sided KS p-value of samples of ``n_r`` and ``n_c`` values, as ``ks_2samp(method="asymp")``."""
    import numpy as np
    from scipy import stats

    m, n = sorted((float(n_r), float(n_c)), reverse=True)
    en = np.round(m * n / (m + n))
    if en <= KS_LIMIT_N:  # Smirnov's distribution for this n, as ks_2samp(method="asymp") uses it
        return float(np.clip(stats.kstwo.sf(ks, en), 0, 1))
    # its limit (Kolmogorov): as accurate at these sizes, and never seconds per column
    return float(np.clip(stats.kstwobign.sf(ks * math.sqrt(en)), 0, 1))


# --------------------------------------------------------------------------- one side of a column


@dataclass
class _Side:
    dtype: str
    rows: int
    family: str | None = None  # "number" | "datetime" | "timedelta" | "label"; None: no values
    values: Any = None  # numeric: sorted finite float64 values (a uniform sample of them when sampled)
    counts: Any = None  # categorical: pandas Series, label text -> count (> 0), most frequent first
    size: int = 0  # values (non-null)
    kind: str = "categorical"  # "numeric" | "categorical": what the column is when it has no values
    sampled: bool = False  # numeric: ``values`` is a uniform sample of the ``size`` values
    low: float | None = None  # numeric: the smallest and largest value
    high: float | None = None
    edges: Any = None  # numeric, streamed: the bin edges ``bin_counts`` were counted on
    bin_counts: Any = None  # numeric, streamed: the counts of every value on ``edges``
    #: numeric, streamed against a profile (:mod:`concord.audit.binned`): when ``values`` is None,
    #: the fine grid every value was counted on, the count and the sum (less its first edge) per bin
    grid: Any = None
    grid_counts: Any = None
    grid_sums: Any = None
    #: numeric: the exact mean of all ``size`` values, and their sum of squared deviations from it
    #: (M2; variance = m2 / (size - 1)); both exact whatever the sampling, and mergeable (Chan et al.)
    mean: float | None = None
    m2: float | None = None

    @property
    def std(self) -> float | None:
        """numeric: the sample standard deviation of all ``size`` values (None below two values)."""
        if self.m2 is None or self.size < 2:
            return None
        return math.sqrt(max(self.m2, 0.0) / (self.size - 1))

    @property
    def singletons(self) -> int | None:
        """categorical: how many labels occur exactly once (Good–Turing: their share of ``size``
        estimates the share of values in labels this side has never seen)."""
        if self.counts is None:
            return None
        return int((self.counts.to_numpy() == 1).sum())

    @property
    def nulls(self) -> int:
        return self.rows - self.size

    @property
    def null_share(self) -> float | None:
        return self.nulls / self.rows if self.rows else None


def _family_of(s: pd.Series) -> str | None:
    """What kind of values a column holds, from its dtype (an object column: from its values)."""
    import pandas as pd
    from pandas.api import types as pdt

    dtype = s.dtype
    if pdt.is_bool_dtype(dtype):
        return "label"
    if isinstance(dtype, pd.CategoricalDtype):
        return "label"
    if pdt.is_datetime64_any_dtype(dtype):
        return "datetime"
    if pdt.is_timedelta64_dtype(dtype):
        return "timedelta"
    if pdt.is_numeric_dtype(dtype) and not pdt.is_complex_dtype(dtype):
        return "number"
    if pdt.is_object_dtype(dtype):
        inferred = pdt.infer_dtype(s, skipna=True)
        if inferred in ("integer", "floating", "mixed-integer-float", "decimal"):
            return "number"
        if inferred in ("datetime64", "datetime"):
            return "datetime"
        if inferred in ("timedelta64", "timedelta"):
            return "timedelta"
        if inferred == "empty":
            return None
    return "label"


def _numbers(s: pd.Series, family: str) -> np.ndarray:
    """A numeric-family column as float64 (datetimes: seconds since the epoch, UTC), nulls as NaN."""
    import numpy as np
    import pandas as pd
    from pandas.api import types as pdt

    if family == "number":
        if pdt.is_object_dtype(s.dtype):
            s = pd.to_numeric(s, errors="coerce")
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    if family == "datetime":
        if pdt.is_object_dtype(s.dtype) or isinstance(s.dtype, pd.DatetimeTZDtype):
            s = pd.to_datetime(s, errors="coerce", utc=True).dt.tz_localize(None)
        return (s.to_numpy() - np.datetime64(0, "s")) / np.timedelta64(1, "s")
    if pdt.is_object_dtype(s.dtype):
        s = pd.to_timedelta(s, errors="coerce")
    return s.to_numpy() / np.timedelta64(1, "s")


def _label_counts(s: pd.Series) -> pd.Series:
    """Each label's count in ``s`` (labels as text, nulls left out), in no particular order."""
    import numpy as np
    import pandas as pd

    counts = s.value_counts(dropna=True, sort=False)
    counts = counts[counts > 0]
    labels = counts.index.astype(str)
    counts = pd.Series(counts.to_numpy(dtype=np.int64), index=labels)
    if labels.has_duplicates:  # e.g. True and "True": one label as text
        counts = counts.groupby(level=0, sort=False).sum()
    return counts


def combine_moments(
    n_a: int, mean_a: float | None, m2_a: float | None, n_b: int, mean_b: float | None, m2_b: float | None
) -> tuple[float | None, float | None]:
    """The mean and M2 (sum of squared deviations from the mean) of two parts of a column, each
    given by its count, mean and M2: Chan, Golub and LeVeque's pairwise update, so any split of a
    column into batches or partitions gives the same moments (to rounding)."""
    if not n_a or mean_a is None:
        return mean_b, m2_b
    if not n_b or mean_b is None:
        return mean_a, m2_a
    total = n_a + n_b
    delta = mean_b - mean_a
    return mean_a + delta * n_b / total, m2_a + m2_b + delta * delta * n_a * n_b / total


def merge_moments(n: int, mean: float | None, m2: float | None, values: np.ndarray) -> tuple[float, float]:
    """:func:`combine_moments` of ``n`` values summarised by ``mean``/``m2`` and a batch of ``values``."""
    import numpy as np

    b_mean = float(values.mean())
    deviations = values - b_mean
    b_m2 = float(np.square(deviations, out=deviations).sum())
    return combine_moments(n, mean, m2, values.size, b_mean, b_m2)


class _Column:
    """One column of one table, taken in batch by batch: what :class:`_Side` needs, in bounded memory.

    Numeric values are kept exactly while there are at most ``sample_size`` of them (all of them
    when it is None); above, a uniform sample of ``sample_size`` values (Vitter's algorithm R,
    drawn from a generator seeded with ``seed``, so the same batches give the same sample), while
    the count, the smallest and largest value and, when ``edges`` are given, the counts on those
    bins stay exact. With a ``grid`` (:func:`~concord.audit.binned.grid_of`, against a reference
    profile), every value is counted on it as it is read, and above ``sample_size`` values none is
    kept: no sample is drawn or sorted (the ``edges``' counts then come from the grid's). Labels
    are counted exactly (memory grows with the distinct labels, not the rows). A column whose
    values change family between batches (numbers in one, text in another) is marked
    ``conflict`` and no longer taken in: the caller reads it again ``as_text``.
    """

    def __init__(
        self, *, sample_size: int | None = None, seed: int = 0, edges: np.ndarray | None = None, as_text: bool = False, scratch: dict | None = None,
        grid: Any = None,
    ):
        self.sample_size = sample_size
        self.seed = seed
        self.edges = edges
        self.grid = grid
        self.grid_counts = self.grid_sums = None
        self.binned = False  # numeric, with a grid: more than sample_size values, none kept
        self.as_text = as_text
        self.rows = 0
        self.dtypes: list[str] = []
        self.head: pd.Series | None = None  # the first rows, for the kind of a column without values
        self.family: str | None = None
        self.conflict = False
        self.size = 0
        self.parts: list = []  # numeric, exact: the values of each batch
        self.sample = None  # numeric, sampled: the reservoir
        self.rng = None
        self.low = self.high = None
        self.mean = self.m2 = None
        self.bin_counts = None
        self.label_parts: list = []  # labels: each batch's counts, merged from time to time
        self.label_pending = 0
        self.counts = None
        #: numeric, sampled: buffers of :meth:`_take`, which the columns of one pass may share
        self.scratch = {} if scratch is None else scratch

    def add(self, s: pd.Series) -> None:
        import numpy as np

        if self.head is None:
            self.head = s.iloc[:64]
        self.rows += len(s)
        dtype = str(s.dtype)
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)
        if self.conflict or not len(s):
            return
        if self.as_text:
            family = "label"
            s = s.dropna().astype(str)
        else:
            family = _family_of(s)
        if family is None:
            return
        if family == "label":
            counts = _label_counts(s)
            if not len(counts):
                return
            if not self._same_family(family):
                return
            self.size += int(counts.sum())
            self.label_parts.append(counts)
            self.label_pending += len(counts)
            if self.label_pending > max(100_000, 2 * (0 if self.counts is None else len(self.counts))):
                self._merge_labels()
            return
        raw = _numbers(s, family)
        finite = np.isfinite(raw)
        # a view of the batch (read-only, or the caller's) unless nulls were dropped: copied only
        # where it is kept as it is (:meth:`_take`)
        values = raw if finite.all() else raw[finite]
        del finite
        if not values.size or not self._same_family(family):
            return
        low, high = float(values.min()), float(values.max())
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)
        self.mean, self.m2 = merge_moments(self.size, self.mean, self.m2, values)
        if self.edges is not None and (self.grid is None or not self.grid.holds_edges):
            counts = _unsorted_bin_counts(values, self.edges)
            self.bin_counts = counts if self.bin_counts is None else self.bin_counts + counts
        if self.grid is not None:
            counts, sums = self.grid.count(values, self.scratch)
            if self.grid_counts is None:
                self.grid_counts, self.grid_sums = counts, sums
            else:
                self.grid_counts += counts
                self.grid_sums += sums
            if self.binned or (self.sample_size is not None and self.size + values.size > self.sample_size):
                self.binned, self.parts = True, []
                self.size += values.size
                return
        self._take(values, owned=values is not raw)

    def _same_family(self, family: str) -> bool:
        if self.family is None:
            self.family = family
        elif self.family != family:
            self.conflict = True
            self.parts, self.sample, self.label_parts, self.counts = [], None, [], None
            return False
        return True

    def _take(self, values: np.ndarray, owned: bool = True) -> None:
        """Keep ``values`` exactly, or in the uniform sample once there are more than ``sample_size``
        (``owned``: ``values`` may be kept and sorted as they are, else a copy is kept)."""
        import numpy as np

        k, seen = self.sample_size, self.size
        self.size += values.size
        if k is None or self.size <= k:
            self.parts.append(values if owned else values.copy())
            return
        if self.sample is None:  # the first k values fill the reservoir
            self.sample = np.concatenate([*self.parts, values[: k - seen]]) if seen < k else np.concatenate(self.parts)
            self.parts = []
            self.rng = np.random.default_rng([0x5EED, self.seed])
            values = values[max(0, k - seen):]
            seen = max(seen, k)
        if not values.size:
            return
        # algorithm R: the value at (0-based) position i is taken with probability k / (i + 1), into
        # a slot drawn uniformly from 0..k-1; in stream order, so the last value taken into a slot stays
        # (into buffers kept from batch to batch: fresh ones of a batch's size cost page faults)
        n = values.size
        pool = self.scratch
        if pool.get("n", 0) < n:
            pool.update(n=n, taken=np.empty(n), position=np.empty(n), steps=np.arange(n, dtype=np.float64))
        if pool.get("latest") is None or pool["latest"].size < k:
            pool["latest"] = np.empty(k, dtype=np.int64)
        taken, position, steps, latest = pool["taken"][:n], pool["position"][:n], pool["steps"][:n], pool["latest"]
        self.rng.random(out=taken)
        taken *= np.add(steps, seen + 1, out=position)  # seen + 1 .. seen + n, exactly (< 2**53)
        values = values[taken < k]
        if not values.size:
            return
        slot = self.rng.integers(0, k, size=values.size)
        order = np.arange(values.size)
        latest[slot] = -1  # only these slots are read below: the others may hold anything
        np.maximum.at(latest, slot, order)  # the last value taken into each slot
        last = latest[slot] == order
        self.sample[slot[last]] = values[last]

    def _merge_labels(self) -> None:
        import pandas as pd

        parts = ([self.counts] if self.counts is not None else []) + self.label_parts
        self.counts = parts[0] if len(parts) == 1 else pd.concat(parts).groupby(level=0, sort=False).sum()
        self.label_parts, self.label_pending = [], 0

    def finish(self) -> _Side:
        """The column as the statistics take it (call once, after the last batch)."""
        import numpy as np
        import pandas as pd

        if len(self.dtypes) == 1:
            dtype = self.dtypes[0]
        else:
            try:
                dtype = str(np.result_type(*(np.dtype(d) for d in self.dtypes)))
            except TypeError:
                dtype = "object"
        head = self.head if self.head is not None else pd.Series([], dtype=object)
        side = _Side(dtype=dtype, rows=self.rows, kind=_kind(None, head) if self.family is None else _kind(self.family, head))
        if self.family is None or self.conflict:
            return side
        if self.family == "label":
            self._merge_labels()
            counts = self.counts
            # most frequent first, ties by label: a stable order for reports
            side.counts = counts.sort_index(kind="stable").sort_values(ascending=False, kind="stable")
            side.size = int(side.counts.sum())
        else:
            side.size, side.low, side.high = self.size, self.low, self.high
            side.mean, side.m2 = self.mean, self.m2
            side.edges, side.bin_counts = self.edges, self.bin_counts
            if self.binned:  # counted on the grid, no value kept
                side.sampled = True
                side.grid, side.grid_counts, side.grid_sums = self.grid, self.grid_counts, self.grid_sums
                if self.edges is not None and self.grid.holds_edges:
                    side.bin_counts = self.grid.counts_at(self.edges, self.grid_counts)
            else:
                if self.sample is not None:
                    values, side.sampled = self.sample, True
                else:
                    values = self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)
                values.sort()
                side.values = values
            self.parts, self.sample = [], None
        side.family = self.family if side.size else None
        return side


def _side(s: pd.Series) -> _Side:
    """A whole column, every value kept."""
    column = _Column()
    column.add(s)
    return column.finish()


# --------------------------------------------------------------------------- comparing one column


def _numeric_histogram(
    name: str, ref: _Side, cur: _Side, bins: int
) -> tuple[ColumnHistogram, np.ndarray, np.ndarray]:
    """The histogram of a numeric column and both sides' bin counts.

    The edges are the reference's quantiles (of its sample, when sampled). A side's counts are
    those of all its values: counted from them when every value is kept, counted as they were read
    (:class:`_Column` with the edges) when the current side was sampled; a sampled reference's
    shares are its sample's.
    """
    import numpy as np

    edges = quantile_edges(ref.values, bins)

    def counts(side: _Side) -> np.ndarray:
        if side.sampled and side.bin_counts is not None and np.array_equal(side.edges, edges):
            return side.bin_counts
        return _bin_counts(side.values, edges)

    rc, cc = counts(ref), counts(cur)
    hist = ColumnHistogram(
        column=name,
        kind="numeric",
        edges=tuple(float(e) for e in edges),
        reference=tuple(float(v) for v in rc / rc.sum()),
        current=tuple(float(v) for v in cc / cc.sum()),
        low=float(min(ref.low, cur.low)),
        high=float(max(ref.high, cur.high)),
    )
    return hist, rc, cc


@dataclass(frozen=True)
class _Categories:
    """A categorical column's comparison: the buckets the statistics use and what the overlay shows."""

    hist: ColumnHistogram
    rc: np.ndarray  # counts per compared bucket: the reference's top categories, (other), (new)
    cc: np.ndarray
    new: list[str]  # labels only current has, most frequent first
    vanished: list[str]  # labels only the reference has, most frequent first
    new_share: float  # the share of current values whose label the reference never had


def _categorical_histogram(name: str, ref: _Side, cur: _Side) -> _Categories:
    """Both sides' counts on the compared buckets, the overlay, the new and the vanished labels.

    Compared buckets: the reference's :data:`MAX_COMPARED_CATEGORIES` most frequent categories one
    by one, the rest of the reference's categories pooled as "(other)", and every category the
    reference never had pooled as "(new)". However many categories either side has, there are at
    most ``MAX_COMPARED_CATEGORIES + 2`` buckets, so the smoothing's empty-bucket shares add up to
    at most ~1 % and a mass that moved to unseen categories is one bucket PSI sees whole.
    """
    import numpy as np

    ref_labels, cur_labels = list(ref.counts.index), list(cur.counts.index)
    in_ref, in_cur = set(ref_labels), set(cur_labels)
    new = [label for label in cur_labels if label not in in_ref]  # most frequent first
    vanished = [label for label in ref_labels if label not in in_cur]
    top, rest = ref_labels[:MAX_COMPARED_CATEGORIES], ref_labels[MAX_COMPARED_CATEGORIES:]
    cur_in_top = cur.counts.reindex(top, fill_value=0).to_numpy(dtype=np.int64)
    new_count = int(cur.counts[new].sum()) if new else 0
    rc = ref.counts.iloc[: len(top)].to_numpy(dtype=np.int64)
    cc = cur_in_top
    if rest:
        rc = np.append(rc, int(ref.counts.iloc[len(top):].sum()))
        cc = np.append(cc, int(cur.size - cur_in_top.sum() - new_count))
    if new:
        rc = np.append(rc, 0)
        cc = np.append(cc, new_count)

    # the overlay: the compared buckets, with the new categories one by one when they are few
    labels = top + ([f"(other: {len(rest)} categories)"] if rest else [])
    ref_shown, cur_shown = list(rc[: len(labels)]), list(cc[: len(labels)])
    if new and len(new) <= MAX_LISTED_CATEGORIES:
        labels += new
        ref_shown += [0] * len(new)
        cur_shown += list(cur.counts[new].to_numpy(dtype=np.int64))
    elif new:
        labels.append(f"(new: {len(new)} categories)")
        ref_shown.append(0)
        cur_shown.append(new_count)
    ref_shown, cur_shown = np.asarray(ref_shown, dtype=np.float64), np.asarray(cur_shown, dtype=np.float64)
    hist = ColumnHistogram(
        column=name,
        kind="categorical",
        categories=tuple(labels),
        reference=tuple(float(v) for v in ref_shown / ref_shown.sum()),
        current=tuple(float(v) for v in cur_shown / cur_shown.sum()),
    )
    return _Categories(hist, rc, cc, new, vanished, new_count / cur.size)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _percent(share: float) -> str:
    return f"{100 * share:.3g}%"


def _listed(labels: list[str]) -> str:
    shown = ", ".join(repr(label) for label in labels[:5])
    return shown + (f" (+{len(labels) - 5} more)" if len(labels) > 5 else "")


def _compare(name: str, ref: _Side | None, cur: _Side | None, bins: int, t: DriftThresholds) -> ColumnDrift:
    """One column's result, before escalation (None: the column is absent from that table)."""

    if cur is None:
        return ColumnDrift(
            column=name,
            kind=ref.kind,
            severity="critical",
            finding="missing in current: the reference has this column, the current table does not",
            null_share_reference=ref.null_share,
            n_reference=ref.size,
        )
    if ref is None:
        return ColumnDrift(
            column=name,
            kind=cur.kind,
            severity="ok",
            finding="new in current: the reference has no such column, so it is not compared",
            null_share_current=cur.null_share,
            n_current=cur.size,
            compared=False,
        )

    common = dict(
        column=name,
        null_share_reference=ref.null_share,
        null_share_current=cur.null_share,
        n_reference=ref.size,
        n_current=cur.size,
    )
    if ref.family and cur.family and ref.family != cur.family:
        return ColumnDrift(
            kind=ref.kind,
            severity="critical",
            finding=(
                f"type changed: {_described(ref)} in reference, {_described(cur)} in current; "
                "nothing compared"
            ),
            **common,
        )
    kind = ref.kind if ref.family or not cur.family else cur.kind
    if not ref.size and not cur.size:
        finding = f"no values on either side ({_why_empty(ref)} in reference, {_why_empty(cur)} in current)"
        return ColumnDrift(kind=kind, severity="ok", finding=finding, **common)
    if not cur.size:
        finding = f"no values in current ({_why_empty(cur)}); the reference has {ref.size}"
        return ColumnDrift(kind=kind, severity="critical", finding=finding, **common)
    if not ref.size:
        return ColumnDrift(
            kind=kind,
            severity="warning",
            finding=f"no values in reference ({_why_empty(ref)}) to compare with; current has {cur.size}",
            **common,
        )

    notes: list[str] = []
    stats: dict[str, Any] = {}
    if kind == "numeric":
        hist, rc, cc = _numeric_histogram(name, ref, cur, bins)
        p_bf = None
        if cur.values is None:  # counted on a grid of the reference's sample (concord.audit.binned)
            from_grid = grid_tests(ref.values, cur.grid, cur.grid_counts, cur.grid_sums, cur.mean, cur.m2)
            ks, wasserstein, p_bf = from_grid.ks, from_grid.wasserstein, from_grid.brown_forsythe
            ks_p = _ks_pvalue(ks, ref.values.size, cur.size)
        else:
            ks, ks_p, wasserstein = _ks_wasserstein(ref.values, cur.values)
        stats.update(ks=ks, ks_pvalue=ks_p, wasserstein=wasserstein)
        stats.update(_numeric_tests(ref, cur, ks_p, wasserstein, p_bf=p_bf))
        for label, side in (("reference", ref), ("current", cur)):
            if side.low == side.high:
                notes.append(f"constant in {label} ({_fmt(side.low)})")
        if cur.values is None:
            kept = f"{ref.values.size:,} of the {ref.size:,} reference values" if ref.sampled else f"the {ref.size:,} reference values"
            notes.append(
                f"KS, Brown–Forsythe and Wasserstein from {kept} and the {cur.size:,} current values "
                f"counted on {cur.grid.bins:,} bins of them"
            )
            stats.update(sampled=True)
        elif ref.sampled or cur.sampled:
            sizes = " and ".join(
                f"{side.values.size:,} of the {side.size:,} {label} values"
                for label, side in (("reference", ref), ("current", cur))
                if side.sampled
            )
            notes.append(f"KS, Brown–Forsythe and Wasserstein from uniform samples ({sizes})")
            stats.update(sampled=True)
    else:
        cats = _categorical_histogram(name, ref, cur)
        hist, rc, cc, new, vanished = cats.hist, cats.rc, cats.cc, cats.new, cats.vanished
        stats.update(
            new_categories=tuple(new[:MAX_LISTED_CATEGORIES]),
            new_share=cats.new_share,
            vanished_categories=tuple(vanished[:MAX_LISTED_CATEGORIES]),
        )
        stats.update(_categorical_tests(ref, cur, cats.new_share))
        for label, side in (("reference", ref), ("current", cur)):
            if len(side.counts) == 1:
                notes.append(f"constant in {label} ({side.counts.index[0]!r})")
        if new:
            notes.append(
                f"{len(new)} new categor{'y' if len(new) == 1 else 'ies'}: {_listed(new)} "
                f"({_percent(cats.new_share)} of current values)"
            )
        if vanished:
            notes.append(f"{len(vanished)} vanished: {_listed(vanished)}")
    psi, kl, js = _divergences(smoothed_proportions(rc), smoothed_proportions(cc))
    stats.update(psi=psi, kl=kl, js=js)
    change = abs(cur.null_share - ref.null_share)
    if change > t.null_share_change:
        notes.append(
            f"null share {_fmt(ref.null_share)} -> {_fmt(cur.null_share)} "
            f"(change {_fmt(change)} > {t.null_share_change})"
        )
    measured = _Measured(kind=kind, stats=stats, notes=tuple(notes), null_change=change > t.null_share_change, hist=hist, common=common)
    return _judge(measured, stats["pvalue"], t, tested=1)


#: the numeric tests, each at a third of the level (Bonferroni): mean (Welch's t), scale
#: (Brown–Forsythe) and shape (Kolmogorov–Smirnov)
NUMERIC_TESTS = ("Welch t", "Brown–Forsythe", "KS")
#: the categorical tests, each at half the level: chi-squared on the pooled categories, and the
#: share of new categories against the reference's singleton share (Good–Turing)
CATEGORICAL_TESTS = ("chi-squared", "new share vs Good–Turing")
#: categorical columns: a category whose expected count on either side is below this is pooled
#: with the other rare ones, on both sides, before the chi-squared test
MIN_EXPECTED = 5.0


def _numeric_tests(ref: _Side, cur: _Side, ks_p: float, wasserstein: float, *, p_bf: float | None = None) -> dict[str, Any]:
    """The numeric column's effect in reference standard deviations and its combined p-value.

    Welch's t-test runs on the exact means and variances of all values (so its n is each side's
    ``size``), Brown–Forsythe (Levene's test about the median) and KS on the values compared (the
    samples, when sampled; ``p_bf`` given: Brown–Forsythe's p-value from a grid). The column's
    p-value is the smallest of the three times three.
    """
    import numpy as np
    from scipy import stats

    sd_r, sd_c = _std(ref), _std(cur)
    mean_r, mean_c = _mean(ref), _mean(cur)
    with np.errstate(all="ignore"):
        p_t = (
            float(stats.ttest_ind_from_stats(mean_r, sd_r, ref.size, mean_c, sd_c, cur.size, equal_var=False).pvalue)
            if ref.size > 1 and cur.size > 1
            else math.nan
        )
        if p_bf is None:
            p_bf = float(stats.levene(ref.values, cur.values, center="median").pvalue) if ref.values.size > 1 and cur.values.size > 1 else math.nan
    ps = [p for p in (p_t, p_bf, ks_p) if p is not None and math.isfinite(p)]
    pvalue = min(1.0, len(NUMERIC_TESTS) * min(ps)) if ps else 1.0
    if sd_r > 0:
        mean_shift, w_sigma = (mean_c - mean_r) / sd_r, wasserstein / sd_r
        scale_ratio = sd_c / sd_r
    else:  # a constant reference: any change is infinitely many of its (zero) deviations
        mean_shift = 0.0 if mean_c == mean_r else math.copysign(math.inf, mean_c - mean_r)
        w_sigma = 0.0 if wasserstein == 0 else math.inf
        scale_ratio = 1.0 if sd_c == 0 else math.inf
    return dict(
        pvalue=pvalue,
        test=", ".join(NUMERIC_TESTS),
        effect_size=w_sigma,
        mean_shift=mean_shift,
        scale_ratio=scale_ratio,
    )


def _mean(side: _Side) -> float:
    """All values' mean: from the (sorted) values when every one is kept, so that any batching
    gives the same bits, else the streamed exact moment."""
    if side.mean is None or (not side.sampled and side.values is not None):
        return float(side.values.mean())
    return float(side.mean)


def _std(side: _Side) -> float:
    if side.std is None or (not side.sampled and side.values is not None):
        return float(side.values.std(ddof=1)) if side.values.size > 1 else 0.0
    return float(side.std)


def _pooled_counts(ref: _Side, cur: _Side) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' counts on every label either side has, the rare ones pooled.

    A label whose expected count on either side (its total split by the sides' sizes) is below
    :data:`MIN_EXPECTED` joins one "(rare)" bucket, on both sides; if that bucket is itself too
    small it joins the smallest other bucket.
    """
    import numpy as np
    import pandas as pd

    both = pd.concat([ref.counts.rename("r"), cur.counts.rename("c")], axis=1).fillna(0)
    r = both["r"].to_numpy(dtype=np.float64)
    c = both["c"].to_numpy(dtype=np.float64)
    share_r = ref.size / (ref.size + cur.size)
    total = r + c
    rare = np.minimum(total * share_r, total * (1 - share_r)) < MIN_EXPECTED
    rr, cc = r[~rare], c[~rare]
    if rare.any():
        pooled_r, pooled_c = r[rare].sum(), c[rare].sum()
        pt = pooled_r + pooled_c
        if min(pt * share_r, pt * (1 - share_r)) >= MIN_EXPECTED or not rr.size:
            rr, cc = np.append(rr, pooled_r), np.append(cc, pooled_c)
        else:
            smallest = int(np.argmin(rr + cc))
            rr[smallest] += pooled_r
            cc[smallest] += pooled_c
    return rr, cc


def _categorical_tests(ref: _Side, cur: _Side, new_share: float) -> dict[str, Any]:
    """The categorical column's chi-squared test on pooled categories, its new-share test against
    Good–Turing, the share of mass moved and the combined p-value (the smaller p times two).

    New share: under no drift, the share of current values in labels the reference never had is
    about the reference's singleton share (Good–Turing's estimate of its unseen mass), with
    variance ``(N1 + 2·N2) / n_ref²`` for the estimate (N1, N2: labels seen once, twice) plus the
    current side's binomial one; the one-sided p-value is the normal tail of the excess.
    """
    import numpy as np
    from scipy import stats

    r, c = _pooled_counts(ref, cur)
    if r.size >= 2 and (r > 0).any() and (c > 0).any():
        res = stats.chi2_contingency(np.vstack((r, c)), correction=False)
        chi2, p_chi2 = float(res.statistic), float(res.pvalue)
    else:
        chi2, p_chi2 = 0.0, 1.0
    moved = float(0.5 * np.abs(c / cur.size - r / ref.size).sum())
    counts = ref.counts.to_numpy()
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    expected = n1 / ref.size
    excess = new_share - expected
    var = new_share * (1 - new_share) / cur.size + (n1 + 2 * n2) / ref.size**2
    if var > 0:
        p_new = float(stats.norm.sf(excess / math.sqrt(var)))
    else:
        p_new = 0.0 if excess > 0 else 1.0
    pvalue = min(1.0, len(CATEGORICAL_TESTS) * min(p_chi2, p_new))
    return dict(
        chi2=chi2,
        chi2_pvalue=p_chi2,
        pvalue=pvalue,
        test=", ".join(CATEGORICAL_TESTS),
        effect_size=moved,
        new_share_expected=expected,
        new_share_pvalue=p_new,
    )


@dataclass(frozen=True)
class _Measured:
    """A compared column before its verdict: what :func:`_judge` needs to give it one."""

    kind: str
    stats: dict
    notes: tuple[str, ...]
    null_change: bool
    hist: ColumnHistogram
    common: dict


def _fmt_p(p: float) -> str:
    return "p < 1e-9" if p < 1e-9 else f"p = {p:.2g}"


def _effect_text(kind: str, s: Mapping[str, Any], p: float) -> str:
    """The effect in readable units, e.g. "mean +0.31σ, scale ×1.02, W 0.30σ, p < 1e-9"."""
    if kind == "numeric":
        parts = [f"mean {s['mean_shift']:+.2f}σ", f"scale ×{s['scale_ratio']:.2f}", f"W {s['effect_size']:.3g}σ"]
    else:
        parts = [f"{_percent(s['effect_size'])} of mass moved"]
        if s.get("new_share"):
            parts.append(f"new {_percent(s['new_share'])} (expected {_percent(s['new_share_expected'])})")
    return ", ".join([*parts, _fmt_p(p)])


def _judge(m: _Measured, p_adjusted: float, t: DriftThresholds, tested: int) -> ColumnDrift:
    """The verdict: drift when the change is significant (``p_adjusted`` below ``alpha``) and
    material (the effect at least the column's floor, or PSI above ``psi_warning``); then
    critical when PSI is above ``psi_critical`` or more than half of current is in new
    categories, else warning. A change of null share is at least a warning on its own."""
    s = m.stats
    name = m.common["column"]
    floor = t.floor_for(name, m.kind)
    psi, effect = s["psi"], s["effect_size"]
    effect_text = _effect_text(m.kind, s, p_adjusted)
    unit = "σ" if m.kind == "numeric" else ""
    floor_text = f"{_fmt(floor)}{unit}" if m.kind == "numeric" else _percent(floor)
    effect_fmt = f"{_fmt(effect)}{unit}" if m.kind == "numeric" else _percent(effect)
    significant = p_adjusted < t.alpha
    material = effect >= floor or psi > t.psi_warning
    over = f" over {tested} columns (Benjamini–Hochberg)" if tested > 1 else ""
    notes = list(m.notes)
    if significant and material:
        new_share = s.get("new_share") or 0.0
        if psi > t.psi_critical:
            severity, why = "critical", f"PSI {_fmt(psi)} > {t.psi_critical}"
        elif new_share > NEW_SHARE_CRITICAL:
            severity, why = "critical", f"{_percent(new_share)} of current values in new categories (more than {_percent(NEW_SHARE_CRITICAL)})"
        else:
            severity, why = "warning", f"PSI {_fmt(psi)}"
        size = f"effect {effect_fmt} >= floor {floor_text}" if effect >= floor else f"PSI {_fmt(psi)} > {t.psi_warning}"
        head = f"drift ({PRIORITIES[severity]}): {effect_text}; {size}, significant at {t.alpha}{over}; {why}"
    elif significant:
        severity = "ok"
        head = (
            f"no drift: {effect_text}; real but small: effect {effect_fmt} < floor {floor_text} "
            f"and PSI {_fmt(psi)} <= {t.psi_warning}"
        )
    else:
        severity = "ok"
        head = f"no drift: {effect_text}; not significant at {t.alpha}{over}: within sampling noise at this size; PSI {_fmt(psi)}"
    if m.null_change and severity == "ok":
        severity = "warning"
        head = f"drift (P1) in null share; {head}"
    return ColumnDrift(
        kind=m.kind,
        severity=severity,
        finding="; ".join([head, *notes]),
        histogram=m.hist,
        effect=effect_text,
        pvalue_adjusted=p_adjusted,
        floor=floor,
        measured=m,
        **m.common,
        **s,
    )


def _adjusted(results: Sequence[ColumnDrift], t: DriftThresholds) -> list[ColumnDrift]:
    """Each compared column judged again on its p-value adjusted over all tested columns
    (Benjamini–Hochberg, ``scipy.stats.false_discovery_control``)."""
    from scipy.stats import false_discovery_control

    tested = [i for i, r in enumerate(results) if r.measured is not None]
    if len(tested) < 2:
        return list(results)
    adjusted = false_discovery_control([results[i].pvalue for i in tested], method="bh")
    out = list(results)
    for i, p in zip(tested, adjusted):
        out[i] = _judge(results[i].measured, float(min(1.0, p)), t, len(tested))
    return out


def _kind(family: str | None, s: pd.Series) -> str:
    if family is None:
        family = _family_of(s) if len(s) else None
        if family is None:
            from pandas.api import types as pdt

            numeric = pdt.is_numeric_dtype(s.dtype) and not pdt.is_bool_dtype(s.dtype)
            return "numeric" if numeric else "categorical"
    return "categorical" if family == "label" else "numeric"


def _described(side: _Side) -> str:
    what = {"number": "numeric", "datetime": "datetimes", "timedelta": "durations", "label": "categorical"}
    return f"{what[side.family]} ({side.dtype})"


def _why_empty(side: _Side) -> str:
    return "no rows" if side.rows == 0 else "all null"


def _escalated(severity: str, previous: Sequence[str], nights: int) -> bool:
    """True if tonight's warning is the ``nights``-th consecutive night at warning or worse."""
    if severity != "warning":
        return False
    needed = nights - 1
    if needed == 0:
        return True
    recent = list(previous)[-needed:]
    return len(recent) == needed and all(s in ("warning", "critical") for s in recent)


# --------------------------------------------------------------------------- entry points


def _check_bins(bins: Any) -> int:
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise DriftConfigError(
            "bins", f"must be a whole number >= 2, got {bins!r}", f"Use the default, {DEFAULT_BINS}."
        )
    return bins


def _check_history(history: Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    if history is None:
        return {}
    if not isinstance(history, Mapping):
        raise DriftConfigError(
            "history",
            f"is a {type(history).__name__}",
            "Pass a mapping of column name to its previous nights' severities, most recent last.",
        )
    checked = {}
    for column, nights in history.items():
        if isinstance(nights, str) or not isinstance(nights, Sequence):
            raise DriftConfigError(
                "history",
                f"column {column!r} maps to {nights!r}, not a list of severities",
                'Give each column a list like ["ok", "warning"], most recent last.',
            )
        bad = [s for s in nights if s not in SEVERITIES]
        if bad:
            raise DriftConfigError(
                "history",
                f"column {column!r} has unknown severities {bad!r}",
                f"Use only {', '.join(SEVERITIES)} (DriftReport.severities() gives them).",
            )
        checked[str(column)] = list(nights)
    return checked


def _check_options(thresholds: Any, bins: Any, history: Any) -> tuple[DriftThresholds, int, dict[str, list[str]]]:
    thresholds = DriftThresholds() if thresholds is None else thresholds
    if not isinstance(thresholds, DriftThresholds):
        raise DriftConfigError(
            "thresholds", f"is a {type(thresholds).__name__}", "Pass a concord.audit.drift.DriftThresholds."
        )
    return thresholds, _check_bins(bins), _check_history(history)


def _column_names(columns: Sequence[str] | None, ref_names: Sequence[str], cur_names: Sequence[str]) -> list[str]:
    """The columns to compare: ``columns``, or the reference's then those only current has."""
    if columns is None:
        in_ref = set(ref_names)
        return list(ref_names) + [n for n in cur_names if n not in in_ref]
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise DriftConfigError(
            "columns", f"{columns!r} is not a list of column names", f"Pass a list, e.g. [{columns!r}]."
        )
    names = list(dict.fromkeys(str(c) for c in columns))
    known = set(ref_names) | set(cur_names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DriftConfigError(
            "columns",
            f"{', '.join(map(repr, unknown))} is in neither table",
            f"Choose among the reference's columns: {', '.join(ref_names) or '(none)'}.",
        )
    return names


def _report(
    names: list[str],
    compared_columns: list[ColumnDrift],
    past: dict[str, list[str]],
    thresholds: DriftThresholds,
    bins: int,
    rows_reference: int,
    rows_current: int,
) -> DriftReport:
    """The report of the compared columns, judged on p-values adjusted over them, lasting warnings escalated."""
    results = []
    for name, result in zip(names, _adjusted(compared_columns, thresholds)):
        if _escalated(result.severity, past.get(name, ()), thresholds.escalate_after_nights):
            nights = thresholds.escalate_after_nights
            lasted = f"{nights} consecutive night{'s' if nights > 1 else ''}"
            result = _replace(
                result,
                severity="critical",
                escalated=True,
                finding=f"escalated to P0: warning or worse for {lasted}; {result.finding}",
            )
        results.append(result)

    compared = [r for r in results if r.compared]
    drifted = sum(1 for r in compared if r.drifted)
    worst = max((r.severity for r in results), key=_RANK.__getitem__, default="ok")
    return DriftReport(
        columns=tuple(_json_safe(r) for r in results),
        drift_share=drifted / len(compared) if compared else None,
        severity=worst,
        rows_reference=rows_reference,
        rows_current=rows_current,
        thresholds=thresholds,
        bins=bins,
    )


def data_drift(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    *,
    columns: Sequence[str] | None = None,
    thresholds: DriftThresholds | None = None,
    bins: int = DEFAULT_BINS,
    history: Mapping[str, Sequence[str]] | None = None,
    workers: int = 1,
) -> DriftReport:
    """Compare ``current`` with ``reference`` column by column (see the module's documentation).

    ``columns`` limits the comparison (default: the reference's columns, then those only the current
    table has); naming a column neither table has is an error. ``bins``: reference quantile bins per
    numeric column. ``history`` maps a column to its severities on the previous nights, most recent
    last (``DriftReport.severities()`` of each night); a column at "warning" tonight whose last
    ``escalate_after_nights - 1`` nights were all "warning" or "critical" is reported "critical",
    with ``escalated`` set. A column missing from ``history`` has no previous nights.
    ``workers``: columns compared at once, in threads (numpy's sorts and searches run outside the
    GIL); each holds about ten times a column's values in memory.

    Every value is used: the statistics are exact. Tables too large to hold go through
    :func:`data_drift_batches` instead. A reference profile (:mod:`concord.audit.profile`) can
    stand for ``reference``: every current value is then compared with what the profile kept.
    """
    if hasattr(reference, "reference_sides"):
        return data_drift_batches(
            reference, TableBatches.of_frame(current, which="current"), columns=columns, thresholds=thresholds,
            bins=bins, history=history, sample_size=None,
        )
    thresholds, bins, past = _check_options(thresholds, bins, history)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DriftConfigError(
            "workers", f"must be a whole number >= 1, got {workers!r}", "Use 1 (the default) or the cores to use."
        )
    ref_cols = _columns_by_name(reference, "reference")
    cur_cols = _columns_by_name(current, "current")
    names = _column_names(columns, list(ref_cols), list(cur_cols))

    def compare(name: str) -> ColumnDrift:
        ref_s, cur_s = ref_cols.get(name), cur_cols.get(name)
        return _compare(
            name, None if ref_s is None else _side(ref_s), None if cur_s is None else _side(cur_s), bins, thresholds
        )

    if workers == 1 or len(names) < 2:
        compared_columns = [compare(name) for name in names]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, len(names))) as pool:
            compared_columns = list(pool.map(compare, names))
    return _report(names, compared_columns, past, thresholds, bins, len(reference), len(current))


# --------------------------------------------------------------------------- tables read in batches


def _seed(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode("utf-8", "surrogatepass"))


def _read_sides(
    table: TableBatches, names: list[str], sample_size: int | None, edges: Mapping[str, np.ndarray], *, grids: Mapping[str, Any] | None = None
) -> tuple[int, dict[str, _Side]]:
    """One pass over ``table``: its rows, and each column of ``names`` as :class:`_Side` (a
    numeric column with one of ``grids`` counted on it: see :class:`_Column`).

    A column whose values change family from one batch to another (numbers, then text, in a CSV
    file) is read again as text, alone, in a second pass.
    """
    def taken(names: list[str], as_text: bool) -> tuple[int, dict[str, _Column]]:
        scratch: dict = {}  # one set of sampling buffers for the pass: a batch is taken in at a time
        cols = {
            n: _Column(sample_size=sample_size, seed=_seed(n), edges=edges.get(n), as_text=as_text, scratch=scratch, grid=(grids or {}).get(n))
            for n in names
        }
        asked = names or list(table.columns[:1])
        rows = 0
        for batch in table.read(asked, as_text):
            by_name = _columns_by_name(batch, "a batch")
            if asked[0] in by_name:  # each row is in exactly one batch holding the first column
                rows += len(batch)
            for n, s in by_name.items():
                if n in cols:
                    cols[n].add(s)
        return rows, cols

    rows, cols = taken(names, False)
    conflicting = [n for n, c in cols.items() if c.conflict]
    if conflicting:
        cols.update(taken(conflicting, True)[1])
    return rows, {n: c.finish() for n, c in cols.items()}


def data_drift_batches(
    reference: TableBatches,
    current: TableBatches,
    *,
    columns: Sequence[str] | None = None,
    thresholds: DriftThresholds | None = None,
    bins: int = DEFAULT_BINS,
    history: Mapping[str, Sequence[str]] | None = None,
    sample_size: int | None = SAMPLE_SIZE,
) -> DriftReport:
    """:func:`data_drift` of two tables read batch by batch, in memory that does not grow with them.

    The reference is read first: each numeric column's count, smallest and largest value, and its
    values, all of them while there are at most ``sample_size``, else a uniform sample of
    ``sample_size`` (the bin edges are the sample's quantiles); each categorical column's counts.
    Then the current table in one pass: the same, plus each numeric value counted on the
    reference's bins as it is read. PSI, KL, JS and chi-squared use every value's bin or category
    (a sampled reference's bin shares are its sample's); KS and Wasserstein use the two samples
    (the KS p-value is the samples' own, so it is conservative). Tables of at most ``sample_size``
    values per column give exactly :func:`data_drift`'s report. ``sample_size=None`` keeps every
    value (exact, memory grows with the tables). The samples are drawn from generators seeded by
    the column's name: the same tables give the same report.

    A reference profile (:mod:`concord.audit.profile`) can stand for ``reference``; a current
    numeric column of more than ``sample_size`` values is then counted on a fine grid of the
    profile's sample (:mod:`concord.audit.binned`) instead of sampled, and KS, Wasserstein and
    Brown–Forsythe come from the grid.
    """
    thresholds, bins, past = _check_options(thresholds, bins, history)
    if sample_size is not None and (isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 2):
        raise DriftConfigError(
            "sample_size", f"must be a whole number >= 2 or None, got {sample_size!r}", f"Use the default, {SAMPLE_SIZE}."
        )
    # a reference profile (concord.audit.profile.TableProfile) stands for its table: the reference's
    # sides come from it, and the current side's labels are pooled as the profile pooled its own
    profiled = not isinstance(reference, TableBatches) and hasattr(reference, "reference_sides")
    for which, table in (("reference", reference), ("current", current))[1 if profiled else 0:]:
        if not isinstance(table, TableBatches):
            raise DriftConfigError(
                which, f"is a {type(table).__name__}, not TableBatches", "Read files with concord.lineage.data.table_batches."
            )
        seen: set[str] = set()
        for name in table.columns:
            if name in seen:
                raise DriftConfigError(which, f"two columns are named {name!r}", "Rename one of them.")
            seen.add(name)
    names = _column_names(columns, list(reference.columns), list(current.columns))
    in_ref, in_cur = set(reference.columns), set(current.columns)

    if profiled:
        rows_ref, ref_sides = reference.reference_sides([n for n in names if n in in_ref])
    else:
        rows_ref, ref_sides = _read_sides(reference, [n for n in names if n in in_ref], sample_size, {})
    edges = {
        n: quantile_edges(side.values, bins)
        for n, side in ref_sides.items()
        if side.family not in (None, "label")
    }
    # against a profile, a current column of more values than the sample size is counted on a fine
    # grid of the profile's sample instead of sampled (concord.audit.binned)
    grids = {n: grid_of(ref_sides[n].values, e) for n, e in edges.items()} if profiled and sample_size is not None else None
    rows_cur, cur_sides = _read_sides(current, [n for n in names if n in in_cur], sample_size, edges, grids=grids)
    if profiled:
        cur_sides = reference.fold_current(cur_sides)
    compared_columns = [_compare(n, ref_sides.get(n), cur_sides.get(n), bins, thresholds) for n in names]
    return _report(names, compared_columns, past, thresholds, bins, rows_ref, rows_cur)


def column_histograms(
    reference: pd.DataFrame, current: pd.DataFrame, column: str, bins: int = DEFAULT_BINS
) -> ColumnHistogram | None:
    """The histogram data of one column, on the bins :func:`data_drift` uses.

    None when there is nothing to overlay: the column is absent from one table, its type changed,
    or one side has no values. A column neither table has is an error.
    """
    bins = _check_bins(bins)
    ref_cols = _columns_by_name(reference, "reference")
    cur_cols = _columns_by_name(current, "current")
    name = str(column)
    if name not in ref_cols and name not in cur_cols:
        raise DriftConfigError(
            "column", f"{name!r} is in neither table", f"Choose among: {', '.join(ref_cols) or '(none)'}."
        )
    if name not in ref_cols or name not in cur_cols:
        return None
    ref, cur = _side(ref_cols[name]), _side(cur_cols[name])
    if not ref.size or not cur.size or ref.family != cur.family:
        return None
    if ref.family == "label":
        return _categorical_histogram(name, ref, cur).hist
    return _numeric_histogram(name, ref, cur, bins)[0]


def _replace(result: ColumnDrift, **changes: Any) -> ColumnDrift:
    from dataclasses import replace

    return replace(result, **changes)


def _clean(value: Any) -> Any:
    """A plain Python value: numpy scalars unwrapped, NaN and infinities as None."""
    if value is None or isinstance(value, (bool, str, tuple, ColumnHistogram)):
        return value
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json_safe(result: ColumnDrift) -> ColumnDrift:
    changes = {}
    for k in result.__dataclass_fields__:
        v = getattr(result, k)
        cleaned = _clean(v)
        if cleaned is not v:
            changes[k] = cleaned
    return _replace(result, **changes) if changes else result
