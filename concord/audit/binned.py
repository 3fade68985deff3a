"""A numeric column counted on a fine grid of a reference's sample, and its tests taken from the counts.

Against a reference profile (:mod:`concord.audit.profile`), a current column of more values than
the audit's sample size is neither sampled nor sorted: each value is counted, as it is read, in the
bins of a :class:`Grid` made from the profile's sorted sample (about :data:`GRID_QUANTILES` of its
quantiles, its smallest and largest value, and the edges of the PSI bins), with the sum of the
values in each bin. :func:`grid_tests` then takes from those counts and sums, and from the
reference's sample, what the drift rule's numeric tests need:

* the **KS statistic**, the largest distance of the two CDFs at the grid's edges: never above the
  exact one, and below it by at most the largest share of a bin (on either side) that is not a
  single value;
* the **Wasserstein-1 distance**, from each bin's integral of each CDF (exact, from the bin's count
  and sum): exact wherever the two CDFs do not cross inside a bin, never above the exact one;
* **Brown–Forsythe** (Levene's test about the median): the current side's median is the mean of the
  values in its median bin, and its absolute deviations come from the bins' sums (exact in every
  bin but the median's, whose values lie within a bin's width of it); squared deviations come from
  the exact moments.

A value's bin is found in a few vectorised steps (:meth:`Grid.index`: a uniform cell, then at
most :data:`PASSES` comparisons with the edges inside it; a cell holding more edges is searched),
exactly where ``numpy.searchsorted(edges, value, side="left")`` puts it, at a few nanoseconds a
value instead of the ~16 of a uniform sample and its sort.

numpy and scipy are imported inside the functions that need them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["GRID_QUANTILES", "PASSES", "Cells", "Grid", "GridTests", "grid_of", "grid_tests"]

#: quantiles of the reference's sample among a grid's edges (a sample of at most this many values:
#: every distinct value is an edge)
GRID_QUANTILES = 2048
#: comparisons with the edges of a value's cell; a cell holding more edges is searched instead
PASSES = 1
#: the uniform cells tried, in edges' numbers; the first that leaves at most CROWDED_SHARE of the
#: edges in crowded cells is kept (else the last)
_CELLS_PER_EDGE = (8, 32, 128)
CROWDED_SHARE = 0.01
#: the uniform cells :class:`Cells` tries (more would not stay in a core's cache)
_FAST_CELLS = (1 << 14, 1 << 15, 1 << 16)
_MAX_CELLS = 1 << 18
#: grids within grids for crowded cells, at most; the last level's crowded cells are searched
_DEPTH = 3


@dataclass(frozen=True, eq=False)
class Grid:
    """Bins ``(-inf, e0], (e0, e1], …, (e_last, +inf)`` on sorted distinct finite ``edges``, and
    what finds a value's bin fast: ``cells`` uniform cells over ``[e0, e_last]`` (``scale`` cells
    per unit), the edges in the cells before each (``first``), the cells holding more than
    :data:`PASSES` edges (``crowded``; None when none does)."""

    edges: np.ndarray
    lo: float
    scale: float
    cells: int
    first: np.ndarray
    crowded: np.ndarray | None
    padded: np.ndarray  # the edges, then +inf
    #: the crowded cells' edges on a grid of their own (None: searched), and per cell the position
    #: among all edges of that grid's first edge in the cell's
    inner: Grid | None = None
    offset: np.ndarray | None = None

    #: the PSI bins' edges are among this grid's (their counts come from :meth:`counts_at`)
    holds_edges = True

    @property
    def bins(self) -> int:
        return int(self.edges.size) + 1

    @property
    def upper(self) -> np.ndarray:
        """Each bin's upper end but the last's, less the first edge."""
        up: np.ndarray = self.edges - self.lo
        return up

    def reference_counts(self, sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`count` of a sorted sample, from a binary search of the edges in it."""
        import numpy as np

        ends = np.concatenate(([0], np.searchsorted(sorted_values, self.edges, side="right"), [sorted_values.size]))
        sums = np.diff(np.concatenate(([0.0], np.cumsum(sorted_values - self.lo)))[ends])
        return np.diff(ends), sums

    @classmethod
    def of(cls, sorted_sample: np.ndarray, extra: np.ndarray | None = None) -> Grid:
        """The grid of a sorted, finite, non-empty sample: every distinct value of a sample of at
        most :data:`GRID_QUANTILES`, else that many of its quantiles and its smallest and largest
        value; the value just below its smallest (so the first bin holds only what lies below the
        sample); and ``extra`` edges (the PSI bins', so that their counts are sums of the grid's)."""
        import numpy as np

        x = sorted_sample
        n = int(x.size)
        if n <= GRID_QUANTILES:
            picked = x
        else:
            k = np.arange(GRID_QUANTILES + 1, dtype=np.int64)
            picked = x[np.minimum((n * k) // GRID_QUANTILES, n - 1)]
        parts = [picked, np.array([np.nextafter(x[0], -np.inf)])]
        if extra is not None:
            parts.append(np.asarray(extra, dtype=np.float64))
        return cls.on(np.unique(np.concatenate(parts)))

    @classmethod
    def on(cls, edges: np.ndarray, depth: int = 0) -> Grid:
        """The grid of sorted distinct finite ``edges``: the fewest uniform cells of
        :data:`_CELLS_PER_EDGE` that leave at most :data:`CROWDED_SHARE` of the edges in crowded
        cells (else the most); those edges on a grid of their own, down to :data:`_DEPTH` levels."""
        lo = float(edges[0])
        span = float(edges[-1]) - lo
        if not (span > 0 and math.isfinite(span) and math.isfinite(_MAX_CELLS / span)):
            return cls._make(edges, lo, 0.0, 1, depth)  # one edge, or a span beyond float64's: one cell
        for per_edge in _CELLS_PER_EDGE:
            cells = int(min(per_edge * edges.size, _MAX_CELLS))
            grid = cls._make(edges, lo, cells / span, cells, depth)
            if grid.crowded is None or grid._crowded_edges().size <= CROWDED_SHARE * edges.size:
                break
        return grid

    @classmethod
    def _make(cls, edges: np.ndarray, lo: float, scale: float, cells: int, depth: int) -> Grid:
        import numpy as np

        at = _cells(np.subtract(edges, lo), scale, cells)
        per_cell = np.bincount(at, minlength=cells)
        first = np.concatenate(([0], np.cumsum(per_cell)[:-1])).astype(np.intp)
        crowded = per_cell > PASSES
        grid = cls(
            edges=edges, lo=lo, scale=scale, cells=cells, first=first,
            crowded=crowded if crowded.any() else None, padded=np.append(edges, np.inf),
        )
        if grid.crowded is None or depth + 1 >= _DEPTH:
            return grid
        inner = cls.on(grid._crowded_edges(), depth + 1)
        # crowded edges in the cells before each cell: its inner position less them is its position
        before = np.concatenate(([0], np.cumsum(np.where(crowded, per_cell, 0))[:-1]))
        return dataclasses.replace(grid, inner=inner, offset=(first - before).astype(np.intp))

    def _crowded_edges(self) -> np.ndarray:
        import numpy as np

        if self.crowded is None:
            return self.edges[:0]
        picked: np.ndarray = self.edges[self.crowded[_cells(np.subtract(self.edges, self.lo), self.scale, self.cells)]]
        return picked

    def index(self, values: np.ndarray, scratch: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each finite value's bin (``searchsorted(edges, value, side="left")``: the edges below
        it), and the values less the first edge (what :meth:`count` sums). ``scratch``: buffers
        kept from call to call (fresh ones of a batch's size cost page faults); the arrays
        returned are views of them, valid until the next call with the same ``scratch``."""
        import numpy as np

        n = values.size
        pool = {} if scratch is None else scratch
        if pool.get("grid_n", 0) < n:
            pool.update(grid_n=n, shifted=np.empty(n), scaled=np.empty(n), cell=np.empty(n, np.intp), at=np.empty(n, np.intp), flag=np.empty(n, bool))
        shifted, scaled, cell, at, flag = (pool[k][:n] for k in ("shifted", "scaled", "cell", "at", "flag"))
        np.subtract(values, self.lo, out=shifted)
        _cells(shifted, self.scale, self.cells, scaled, cell)
        # the cell function is monotone and the edges were put in cells by the same one: an edge of
        # an earlier cell is below the value, one of a later cell above it; only the edges of the
        # value's own cell are compared
        np.take(self.first, cell, out=at)
        for _ in range(PASSES):
            np.take(self.padded, at, out=scaled)
            np.less(scaled, values, out=flag)
            np.add(at, flag, out=at)
        if self.crowded is not None:
            np.take(self.crowded, cell, out=flag)
            if flag.any():
                inside = values[flag]
                if self.inner is None:
                    at[flag] = np.searchsorted(self.edges, inside, side="left")
                else:
                    offset = self.offset if self.offset is not None else self.first
                    local = self.inner.index(inside, pool.setdefault("inner", {}))[0]
                    at[flag] = offset[cell[flag]] + local
        return at, shifted

    def count(self, values: np.ndarray, scratch: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The count of ``values`` (finite) in each bin, and the sum of their distances above the first edge."""
        import numpy as np

        at, shifted = self.index(values, scratch)
        return np.bincount(at, minlength=self.bins), np.bincount(at, weights=shifted, minlength=self.bins)

    def counts_at(self, edges: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Counts on the coarser bins of ``edges`` (every one of them an edge of this grid) from this grid's ``counts``."""
        import numpy as np

        through = np.cumsum(counts)[np.searchsorted(self.edges, edges)]
        return np.diff(np.concatenate(([0], through, [int(counts.sum())])))


@dataclass(frozen=True, eq=False)
class Cells:
    """The fast grid: ``cells`` uniform cells ``[lo + (k-1)/scale, lo + k/scale)`` (k = 1 ..
    cells), below them ``(-inf, lo)`` and above them ``[lo + cells/scale, +inf)`` (each end up
    to the rounding of ``(value - lo) * scale + 1``, the same for both sides); a value's cell is
    one multiplication away. Made only where every cell holding more than
    1/:data:`GRID_QUANTILES` of the reference holds a single value (:func:`grid_of`)."""

    lo: float
    scale: float
    cells: int

    #: the PSI bins' edges are not among the cells' (their counts are taken on their own)
    holds_edges = False

    @property
    def bins(self) -> int:
        return self.cells + 2

    @property
    def upper(self) -> np.ndarray:
        import numpy as np

        up: np.ndarray = np.arange(self.cells + 1, dtype=np.float64) / self.scale
        return up

    def index(self, values: np.ndarray, scratch: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each finite value's bin (0 below the cells, ``cells + 1`` above), and the values less ``lo``."""
        import numpy as np

        n = values.size
        pool = {} if scratch is None else scratch
        if pool.get("cells_n", 0) < n:
            pool.update(cells_n=n, cells_shifted=np.empty(n), cells_scaled=np.empty(n), cells_at=np.empty(n, np.intp))
        shifted, scaled, at = (pool[k][:n] for k in ("cells_shifted", "cells_scaled", "cells_at"))
        np.subtract(values, self.lo, out=shifted)
        np.multiply(shifted, self.scale, out=scaled)
        np.add(scaled, 1.0, out=scaled)
        np.clip(scaled, 0.0, float(self.cells + 1), out=scaled)
        np.copyto(at, scaled, casting="unsafe")  # truncation: the floor of what is >= 0
        return at, shifted

    def count(self, values: np.ndarray, scratch: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        at, shifted = self.index(values, scratch)
        return np.bincount(at, minlength=self.bins), np.bincount(at, weights=shifted, minlength=self.bins)

    def reference_counts(self, sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.count(sorted_values)

    @classmethod
    def fit(cls, sorted_sample: np.ndarray) -> Cells | None:
        """The fewest cells of :data:`_FAST_CELLS` over the sample's range in which no cell holds
        more than 1/:data:`GRID_QUANTILES` of it in more than one value; None if none does."""
        import numpy as np

        x = sorted_sample
        lo, span = float(x[0]), float(x[-1]) - float(x[0])
        if not (span > 0 and math.isfinite(span) and math.isfinite(_FAST_CELLS[-1] / span)):
            return None
        most = x.size / GRID_QUANTILES
        for cells in _FAST_CELLS:
            grid = cls(lo=lo, scale=cells / span, cells=cells)
            at = grid.index(x)[0]  # nondecreasing: x is sorted
            starts = np.flatnonzero(np.diff(at, prepend=-1))
            ends = np.append(starts[1:], x.size)
            heavy = (ends - starts > most) & (x[ends - 1] > x[starts])
            if not heavy.any():
                return grid
        return None


def grid_of(sorted_sample: np.ndarray, psi_edges: np.ndarray | None = None) -> Grid | Cells:
    """The grid a current column is counted on against this reference sample: uniform
    :class:`Cells` where they resolve it (every cell at most 1/:data:`GRID_QUANTILES` of it,
    or a single value), else the :class:`Grid` of its quantiles."""
    return Cells.fit(sorted_sample) or Grid.of(sorted_sample, psi_edges)


def _cells(shifted: np.ndarray, scale: float, cells: int, scaled: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """The uniform cell of each value less the first edge (monotone in it), into ``out`` if given."""
    import numpy as np

    c = np.multiply(shifted, scale, out=scaled)
    np.clip(c, 0.0, float(cells - 1), out=c)
    if out is None:
        cells_of: np.ndarray = c.astype(np.intp)
        return cells_of
    np.copyto(out, c, casting="unsafe")
    return out


@dataclass(frozen=True)
class GridTests:
    """What :func:`grid_tests` takes from a grid: the KS statistic, the Wasserstein-1 distance and
    Brown–Forsythe's p-value (NaN when both sides have no spread)."""

    ks: float
    wasserstein: float
    brown_forsythe: float


def _integrals(counts: np.ndarray, sums: np.ndarray, n: int, up: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Per bin, the integral of a side's CDF over it (the last bin: of 1 - CDF above the last edge).

    In the bin ``(a, b]`` holding ``k`` values summing to ``s`` (distances above the first edge),
    with ``c`` values at or below ``a``: ``(c (b - a) + k b - s) / n``; the first bin's lower end is
    -inf, where the CDF is 0; above the last edge, ``(s - k b) / n``."""
    import numpy as np

    before = np.cumsum(counts) - counts
    out = np.empty(counts.size, dtype=np.float64)
    out[:-1] = before[:-1] * width + counts[:-1] * up - sums[:-1]
    out[-1] = sums[-1] - counts[-1] * up[-1]
    return out / n


def grid_tests(reference: np.ndarray, grid: Grid | Cells, counts: np.ndarray, sums: np.ndarray, mean: float, m2: float) -> GridTests:
    """KS, Wasserstein-1 and Brown–Forsythe of the sorted ``reference`` sample against a side
    counted on ``grid`` (``counts``, ``sums`` from :meth:`Grid.count`; ``mean`` and ``m2``, its
    exact moments). See the module for what each is and how close."""
    import numpy as np

    with np.errstate(all="ignore"):  # values near float64's limits: infinities, as scipy's give
        return _grid_tests(reference, grid, counts, sums, mean, m2)


def _grid_tests(reference: np.ndarray, grid: Grid | Cells, counts: np.ndarray, sums: np.ndarray, mean: float, m2: float) -> GridTests:
    import numpy as np
    from scipy import stats

    r = reference
    n_r, n_c = int(r.size), int(counts.sum())
    r_counts, r_sums = grid.reference_counts(r)
    ks = float(np.max(np.abs(np.cumsum(r_counts)[:-1] / n_r - np.cumsum(counts)[:-1] / n_c)))

    up = grid.upper
    width = np.diff(up, prepend=up[0])
    w = float(np.abs(_integrals(r_counts, r_sums, n_r, up, width) - _integrals(counts, sums, n_c, up, width)).sum())

    # Brown–Forsythe: the reference's sample exactly, as scipy.stats.levene(center="median") takes it
    # (numpy scalars: values near float64's limits overflow to infinities, not errors)
    z = np.abs(r - (r[(n_r - 1) // 2] + r[n_r // 2]) / 2)  # about the median of the sorted sample
    z_r = z.mean()
    ss_r = np.square(z - z_r).sum()
    # the current side: its median bin's mean as its median; |x - m| summed per bin from the sums
    b = int(np.searchsorted(np.cumsum(counts), (n_c + 1) / 2, side="left"))
    median = sums[b] / counts[b]  # distance above the first edge
    abs_sum = np.abs(sums - counts * median).sum()
    sq_sum = np.float64(m2) + n_c * np.square(np.float64(mean) - grid.lo - median)
    z_c = abs_sum / n_c
    ss_c = max(sq_sum - n_c * z_c * z_c, 0.0)
    total = n_r + n_c
    z_all = (n_r * z_r + n_c * z_c) / total
    between = n_r * np.square(z_r - z_all) + n_c * np.square(z_c - z_all)
    within = ss_r + ss_c
    p_bf = float(stats.f.sf((total - 2) * between / within, 1, total - 2)) if within > 0 and total > 2 else math.nan
    return GridTests(ks=ks, wasserstein=w, brown_forsythe=p_bf)
