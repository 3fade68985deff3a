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

Categorical columns (strings, categories, booleans, anything else) are compared over their
categories, labels taken as text: PSI, KL and JS over the smoothed shares as above, Pearson's
chi-squared test on the 2 x K table of counts (``scipy.stats.chi2_contingency``, no continuity
correction), and the categories new in current and vanished from it.

Nulls (None, NaN, NaT, and ±inf in numeric columns) are left out of every statistic and reported as
each side's null share; a change of null share larger than ``null_share_change`` is itself a finding.

Severity comes from PSI (:class:`DriftThresholds`): above ``psi_warning`` a column is ``"warning"``
(P1), above ``psi_critical`` ``"critical"`` (P0). For numeric columns the KS test is a second opinion:
PSI's verdict stands only if KS also rejects equal distributions (p-value below ``ks_pvalue``), which
it always does for a real shift in a large sample, and which keeps the sampling noise of PSI in a
small one from raising alarms. A change of null share beyond ``null_share_change`` makes a column at
least a warning. A warning seen on ``escalate_after_nights`` consecutive nights, tonight included,
becomes critical (see :func:`data_drift`'s ``history``). Structural findings have fixed severities:
a column missing from current, of another type, or with no values left in current is critical; one
with no values in the reference is a warning; one only current has is ok and not counted as
compared.

numpy, pandas and scipy are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from concord.errors import DriftConfigError

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
    "column_histograms",
    "data_drift",
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
    #: numeric columns only, a second opinion: PSI above ``psi_warning`` counts as drift only if
    #: the two-sample KS test also rejects "same distribution" at this p-value. With large samples
    #: KS rejects for any real shift and PSI decides alone; with small ones PSI on quantile bins is
    #: noisy (about ``(bins - 1) * (1/n_reference + 1/n_current)`` with no drift at all), and KS
    #: keeps that noise from paging anyone. The finding says when KS overruled PSI.
    ks_pvalue: float = 0.01
    #: a change of null share (absolute, 0..1) larger than this makes the column at least "warning".
    null_share_change: float = 0.10
    #: consecutive nights at "warning" or worse, tonight included, after which a warning is
    #: reported as "critical". 1 makes every warning critical.
    escalate_after_nights: int = 2

    def __post_init__(self) -> None:
        problems = []
        for name in ("psi_warning", "psi_critical", "ks_pvalue", "null_share_change"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"{name} must be a finite number, got {value!r}")
        if not problems:
            if self.psi_warning <= 0:
                problems.append(f"psi_warning must be above 0, got {self.psi_warning}")
            if self.psi_critical <= self.psi_warning:
                problems.append(
                    f"psi_warning ({self.psi_warning}) must be below psi_critical ({self.psi_critical})"
                )
            if not 0 < self.ks_pvalue < 1:
                problems.append(f"ks_pvalue must be between 0 and 1, got {self.ks_pvalue}")
            if not 0 < self.null_share_change <= 1:
                problems.append(f"null_share_change must be in (0, 1], got {self.null_share_change}")
        nights = self.escalate_after_nights
        if isinstance(nights, bool) or not isinstance(nights, int) or nights < 1:
            problems.append(f"escalate_after_nights must be a whole number of nights >= 1, got {nights!r}")
        if problems:
            raise DriftConfigError(
                "DriftThresholds",
                "; ".join(problems),
                "Pass values like the defaults (psi_warning=0.25 < psi_critical=0.55, ks_pvalue=0.01, "
                "null_share_change=0.1, escalate_after_nights=2).",
            )

    def severity(self, psi: float) -> str:
        """The severity PSI alone gives: "ok", "warning" (> psi_warning) or "critical" (> psi_critical)."""
        if psi > self.psi_critical:
            return "critical"
        if psi > self.psi_warning:
            return "warning"
        return "ok"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


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
    null_share_reference: float | None = None
    null_share_current: float | None = None
    n_reference: int | None = None  # values compared (nulls left out); None if the column is absent
    n_current: int | None = None
    escalated: bool = False  # a warning reported as critical because it lasted
    compared: bool = True  # False for a column only the current table has
    histogram: ColumnHistogram | None = field(default=None, repr=False, compare=False)

    @property
    def drifted(self) -> bool:
        return self.severity != "ok"


    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            if k == "histogram":
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


def quantile_edges(sorted_reference: "np.ndarray", bins: int = DEFAULT_BINS) -> "np.ndarray":
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


def _bin_counts(sorted_values: "np.ndarray", edges: "np.ndarray") -> "np.ndarray":
    """Counts of a sorted sample in the bins (-inf, e0], (e0, e1], ..., (e_last, +inf)."""
    import numpy as np

    at_or_below = np.searchsorted(sorted_values, edges, side="right")
    return np.diff(np.concatenate(([0], at_or_below, [sorted_values.size])))


def smoothed_proportions(counts: "Sequence[float] | np.ndarray") -> "np.ndarray":
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


def _divergences(r: "np.ndarray", c: "np.ndarray") -> tuple[float, float, float]:
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


def _merged_ks_wasserstein(r: "np.ndarray", c: "np.ndarray") -> tuple[float, float]:
    """KS statistic and Wasserstein-1 distance of two sorted samples, from their merge.

    The merged sample is never built: each value's successor in it and both empirical CDFs at it
    come from one ``searchsorted`` (reference values first among equal ones). The Wasserstein
    distance is ``sum(|F_r - F_c| * gap to the next merged value)``, as scipy computes it (gaps
    inside a run of equal values are 0); the KS statistic is the largest ``|F_r - F_c|`` at the
    last value of a run (a positive gap follows), where the CDFs are the right-continuous ones.
    """
    import numpy as np

    n_r, n_c = r.size, c.size
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
        diff = own_cdf - other_cdf if own_is_reference else other_cdf - own_cdf
        del own_cdf, other_cdf
        np.abs(diff, out=diff)
        # successor in the merge: the next own value or the first other value after this one
        following = np.append(other, np.inf)[other_before]
        np.minimum(following[:-1], own[1:], out=following[:-1])
        gap = np.subtract(following, own, out=following)
        if np.isinf(gap[-1]):  # the largest value of all: both CDFs are 1 there
            gap[-1] = 0.0
        wasserstein += float(np.dot(diff, gap))
        run_ends = diff[gap > 0]
        if run_ends.size:
            ks = max(ks, float(run_ends.max()))
    return ks, wasserstein


def _ks_wasserstein(r: "np.ndarray", c: "np.ndarray") -> tuple[float, float, float]:
    """KS statistic, two-sided KS p-value and Wasserstein-1 distance of two sorted samples."""
    import numpy as np
    from scipy import stats

    n_r, n_c = r.size, c.size
    if max(n_r, n_c) <= KS_EXACT_MAX_N:
        res = stats.ks_2samp(r, c)  # "auto": the exact p-value at these sizes
        return float(res.statistic), float(res.pvalue), float(stats.wasserstein_distance(r, c))
    ks, wasserstein = _merged_ks_wasserstein(r, c)
    m, n = sorted((float(n_r), float(n_c)), reverse=True)
    en = np.round(m * n / (m + n))
    if en <= KS_LIMIT_N:  # Smirnov's distribution for this n, as ks_2samp(method="asymp") uses it
        pvalue = float(np.clip(stats.kstwo.sf(ks, en), 0, 1))
    else:  # its limit (Kolmogorov): as accurate at these sizes, and never seconds per column
        pvalue = float(np.clip(stats.kstwobign.sf(ks * math.sqrt(en)), 0, 1))
    return ks, pvalue, wasserstein


# --------------------------------------------------------------------------- one side of a column


@dataclass
class _Side:
    dtype: str
    rows: int
    family: str | None = None  # "number" | "datetime" | "timedelta" | "label"; None: no values
    values: Any = None  # numeric: sorted finite float64 values
    counts: Any = None  # categorical: pandas Series, label text -> count (> 0), most frequent first
    size: int = 0  # values (non-null)

    @property
    def nulls(self) -> int:
        return self.rows - self.size

    @property
    def null_share(self) -> float | None:
        return self.nulls / self.rows if self.rows else None


def _family_of(s: "pd.Series") -> str | None:
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


def _numbers(s: "pd.Series", family: str) -> "np.ndarray":
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


def _side(s: "pd.Series") -> _Side:
    import numpy as np
    import pandas as pd

    side = _Side(dtype=str(s.dtype), rows=len(s))
    if side.rows == 0:
        return side
    family = _family_of(s)
    if family is None:
        return side
    if family == "label":
        counts = s.value_counts(dropna=True, sort=False)
        counts = counts[counts > 0]
        labels = counts.index.astype(str)
        counts = pd.Series(counts.to_numpy(dtype=np.int64), index=labels)
        if labels.has_duplicates:  # e.g. True and "True": one label as text
            counts = counts.groupby(level=0, sort=False).sum()
        # most frequent first, ties by label: a stable order for reports
        counts = counts.sort_index(kind="stable").sort_values(ascending=False, kind="stable")
        side.counts = counts
        side.size = int(counts.sum())
    else:
        raw = _numbers(s, family)
        finite = np.isfinite(raw)
        values = raw.copy() if finite.all() else raw[finite]
        del finite
        values.sort()
        side.values = values
        side.size = int(values.size)
    side.family = family if side.size else None
    return side


# --------------------------------------------------------------------------- comparing one column


def _numeric_histogram(
    name: str, ref: _Side, cur: _Side, bins: int
) -> tuple[ColumnHistogram, "np.ndarray", "np.ndarray"]:
    """The histogram of a numeric column and both sides' bin counts."""
    edges = quantile_edges(ref.values, bins)
    rc = _bin_counts(ref.values, edges)
    cc = _bin_counts(cur.values, edges)
    hist = ColumnHistogram(
        column=name,
        kind="numeric",
        edges=tuple(float(e) for e in edges),
        reference=tuple(float(v) for v in rc / rc.sum()),
        current=tuple(float(v) for v in cc / cc.sum()),
        low=float(min(ref.values[0], cur.values[0])),
        high=float(max(ref.values[-1], cur.values[-1])),
    )
    return hist, rc, cc


def _categorical_histogram(
    name: str, ref: _Side, cur: _Side
) -> tuple[ColumnHistogram, "np.ndarray", "np.ndarray", list[str], list[str]]:
    """The histogram of a categorical column, both sides' counts, the new and the vanished labels."""
    import numpy as np

    ref_labels, cur_labels = list(ref.counts.index), list(cur.counts.index)
    in_ref, in_cur = set(ref_labels), set(cur_labels)
    new = [label for label in cur_labels if label not in in_ref]  # most frequent first
    vanished = [label for label in ref_labels if label not in in_cur]
    labels = ref_labels + new
    rc = ref.counts.reindex(labels, fill_value=0).to_numpy(dtype=np.int64)
    cc = cur.counts.reindex(labels, fill_value=0).to_numpy(dtype=np.int64)
    hist = ColumnHistogram(
        column=name,
        kind="categorical",
        categories=tuple(labels),
        reference=tuple(float(v) for v in rc / rc.sum()),
        current=tuple(float(v) for v in cc / cc.sum()),
    )
    return hist, rc, cc, new, vanished


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _listed(labels: list[str]) -> str:
    shown = ", ".join(repr(label) for label in labels[:5])
    return shown + (f" (+{len(labels) - 5} more)" if len(labels) > 5 else "")


def _compare(
    name: str, ref_s: "pd.Series | None", cur_s: "pd.Series | None", bins: int, t: DriftThresholds
) -> ColumnDrift:
    """One column's result, before escalation (None: the column is absent from that table)."""
    import numpy as np
    from scipy.stats import chi2_contingency

    if cur_s is None:
        ref = _side(ref_s)
        return ColumnDrift(
            column=name,
            kind=_kind(ref.family, ref_s),
            severity="critical",
            finding="missing in current: the reference has this column, the current table does not",
            null_share_reference=ref.null_share,
            n_reference=ref.size,
        )
    if ref_s is None:
        cur = _side(cur_s)
        return ColumnDrift(
            column=name,
            kind=_kind(cur.family, cur_s),
            severity="ok",
            finding="new in current: the reference has no such column, so it is not compared",
            null_share_current=cur.null_share,
            n_current=cur.size,
            compared=False,
        )

    ref, cur = _side(ref_s), _side(cur_s)
    common = dict(
        column=name,
        null_share_reference=ref.null_share,
        null_share_current=cur.null_share,
        n_reference=ref.size,
        n_current=cur.size,
    )
    if ref.family and cur.family and ref.family != cur.family:
        return ColumnDrift(
            kind=_kind(ref.family, ref_s),
            severity="critical",
            finding=(
                f"type changed: {_described(ref)} in reference, {_described(cur)} in current; "
                "nothing compared"
            ),
            **common,
        )
    kind = _kind(ref.family or cur.family, ref_s)
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
        ks, ks_p, wasserstein = _ks_wasserstein(ref.values, cur.values)
        stats.update(ks=ks, ks_pvalue=ks_p, wasserstein=wasserstein)
        for label, side in (("reference", ref), ("current", cur)):
            if side.values[0] == side.values[-1]:
                notes.append(f"constant in {label} ({_fmt(float(side.values[0]))})")
    else:
        hist, rc, cc, new, vanished = _categorical_histogram(name, ref, cur)
        res = chi2_contingency(np.vstack((rc, cc)), correction=False)
        stats.update(
            chi2=float(res.statistic),
            chi2_pvalue=float(res.pvalue),
            new_categories=tuple(new[:MAX_LISTED_CATEGORIES]),
            vanished_categories=tuple(vanished[:MAX_LISTED_CATEGORIES]),
        )
        for label, side in (("reference", ref), ("current", cur)):
            if len(side.counts) == 1:
                notes.append(f"constant in {label} ({side.counts.index[0]!r})")
        if new:
            notes.append(f"{len(new)} new categor{'y' if len(new) == 1 else 'ies'}: {_listed(new)}")
        if vanished:
            notes.append(f"{len(vanished)} vanished: {_listed(vanished)}")
    psi, kl, js = _divergences(smoothed_proportions(rc), smoothed_proportions(cc))
    stats.update(psi=psi, kl=kl, js=js)

    severity = t.severity(psi)
    ks_p = stats.get("ks_pvalue")
    if severity == "ok":
        head = f"no drift: PSI {_fmt(psi)} <= {t.psi_warning}"
        if ks_p is not None and ks_p < t.ks_pvalue:
            notes.append(
                f"KS p-value {_fmt(ks_p)} < {t.ks_pvalue}: the samples differ, by less than PSI counts as drift"
            )
    elif ks_p is not None and ks_p >= t.ks_pvalue:
        severity = "ok"
        head = (
            f"no drift: PSI {_fmt(psi)} > {t.psi_warning} but the KS test does not confirm it "
            f"(p-value {_fmt(ks_p)} >= {t.ks_pvalue}): within sampling noise at this size"
        )
    else:
        limit = t.psi_critical if severity == "critical" else t.psi_warning
        head = f"drift ({PRIORITIES[severity]}): PSI {_fmt(psi)} > {limit}"
        if ks_p is not None:
            notes.append(f"KS p-value {_fmt(ks_p)} < {t.ks_pvalue} confirms it")
    change = abs(cur.null_share - ref.null_share)
    if change > t.null_share_change:
        notes.append(
            f"null share {_fmt(ref.null_share)} -> {_fmt(cur.null_share)} "
            f"(change {_fmt(change)} > {t.null_share_change})"
        )
        if severity == "ok":
            severity = "warning"
            head = f"drift (P1) in null share; PSI {_fmt(psi)} <= {t.psi_warning}"
    return ColumnDrift(
        kind=kind,
        severity=severity,
        finding="; ".join([head, *notes]),
        histogram=hist,
        **common,
        **stats,
    )


def _kind(family: str | None, s: "pd.Series") -> str:
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


def _columns_by_name(df: Any, which: str) -> dict[str, "pd.Series"]:
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise DriftConfigError(
            which,
            f"is a {type(df).__name__}, not a pandas DataFrame",
            "Pass a DataFrame (read a parquet or CSV file with concord.data.read_table).",
        )
    by_name: dict[str, pd.Series] = {}
    for i, label in enumerate(df.columns):
        name = str(label)
        if name in by_name:
            raise DriftConfigError(which, f"two columns are named {name!r}", "Rename one of them.")
        by_name[name] = df.iloc[:, i]
    return by_name


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


def data_drift(
    reference: "pd.DataFrame",
    current: "pd.DataFrame",
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
    """
    thresholds = DriftThresholds() if thresholds is None else thresholds
    if not isinstance(thresholds, DriftThresholds):
        raise DriftConfigError(
            "thresholds", f"is a {type(thresholds).__name__}", "Pass a concord.drift.DriftThresholds."
        )
    bins = _check_bins(bins)
    past = _check_history(history)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DriftConfigError(
            "workers", f"must be a whole number >= 1, got {workers!r}", "Use 1 (the default) or the cores to use."
        )
    ref_cols = _columns_by_name(reference, "reference")
    cur_cols = _columns_by_name(current, "current")

    if columns is None:
        names = list(ref_cols) + [n for n in cur_cols if n not in ref_cols]
    else:
        if isinstance(columns, str) or not isinstance(columns, Sequence):
            raise DriftConfigError(
                "columns", f"{columns!r} is not a list of column names", f"Pass a list, e.g. [{columns!r}]."
            )
        names = list(dict.fromkeys(str(c) for c in columns))
        unknown = [n for n in names if n not in ref_cols and n not in cur_cols]
        if unknown:
            raise DriftConfigError(
                "columns",
                f"{', '.join(map(repr, unknown))} is in neither table",
                f"Choose among the reference's columns: {', '.join(ref_cols) or '(none)'}.",
            )

    def compare(name: str) -> ColumnDrift:
        return _compare(name, ref_cols.get(name), cur_cols.get(name), bins, thresholds)

    if workers == 1 or len(names) < 2:
        compared_columns = [compare(name) for name in names]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, len(names))) as pool:
            compared_columns = list(pool.map(compare, names))

    results = []
    for name, result in zip(names, compared_columns):
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
        rows_reference=len(reference),
        rows_current=len(current),
        thresholds=thresholds,
        bins=bins,
    )


def column_histograms(
    reference: "pd.DataFrame", current: "pd.DataFrame", column: str, bins: int = DEFAULT_BINS
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
        return _categorical_histogram(name, ref, cur)[0]
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
