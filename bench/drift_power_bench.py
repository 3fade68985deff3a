"""Drift power: how often Concord's drift rule and Evidently's DataDriftPreset flag a column, on generated pairs.

Each pair is a reference column and a current column of the same size, drawn independently (fixed
seeds, cached as parquet under ``data/drift-power/``, the same files for both tools):

* shapes: ``normal`` N(0, 1), ``lognormal`` exp(N(0, 1)), ``t3`` Student's t with 3 degrees of
  freedom; ``cat5``, 5 categories with shares 40/25/15/12/8 %; ``zipf1000``, 1,000 categories with
  shares proportional to 1/rank;
* shifts of the current column: none; mean +0.1σ and +0.2σ (σ the distribution's own); scale ×1.1
  and ×1.5 about the mean; for the categorical shapes, 2 % and 10 % of the rows moved from the most
  frequent category (to the least frequent one for cat5, to categories drawn uniformly from ranks
  101–1,000 for zipf1000), and 1 % of the rows replaced by a category the reference never had;
* rows: 1,000, 100,000 and 1,000,000; 20 pairs per cell at 1k and 100k, 5 at 1M, and more pairs for
  the false alarms at 1k (200), where both tools are cheap (``--quick``: 1k and 100k with fewer
  pairs, and one pair per cell of the normal shape at 1M).

A pair counts as flagged by Concord when ``data_drift`` on the one-column tables gives ``warning`` or
``critical``; by Evidently when its column's drift test fails (``Report([DataDriftPreset()])``,
defaults, in its own venv, ``bench/evidently_power_runner.py``). CPU: each tool's process CPU time
over its reports of the 1M-row pairs, loading excluded.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import BENCH_DIR, Options, Row, Table, Target, log, read_json, write_json_atomic
from bench.drift_bench import EvidentlyUnavailable, ensure_evidently

SEED = 20_261_202
NUMERIC = ("normal", "lognormal", "t3")
CATEGORICAL = ("cat5", "zipf1000")
NUMERIC_SHIFTS = ("none", "mean +0.1σ", "mean +0.2σ", "scale ×1.1", "scale ×1.5")
CATEGORICAL_SHIFTS = ("none", "2% moved", "10% moved", "new category 1%")
#: rows -> (pairs per shifted cell, pairs of the no-drift cell)
SIZES = {1_000: (20, 200), 100_000: (20, 20), 1_000_000: (5, 5)}
QUICK_SIZES = {1_000: (20, 100), 100_000: (3, 3), 1_000_000: (1, 1)}
QUICK_1M_SHAPES = ("normal",)
CAT5_SHARES = (0.40, 0.25, 0.15, 0.12, 0.08)
ZIPF_K = 1_000
#: (shape group, shift, rows) that must be flagged in at least 80 % of the pairs
DETECTION_GOALS = {
    **{(s, "mean +0.2σ", 1_000): 80 for s in NUMERIC},
    **{(s, "mean +0.1σ", n): 80 for s in NUMERIC for n in (100_000, 1_000_000)},
    **{(s, "scale ×1.5", 1_000): 80 for s in NUMERIC},
    **{(s, "scale ×1.1", n): 80 for s in NUMERIC for n in (100_000, 1_000_000)},
    ("cat5", "10% moved", 1_000): 80,
    ("cat5", "2% moved", 100_000): 80,
    ("cat5", "new category 1%", 100_000): 80,
    ("zipf1000", "new category 1%", 100_000): 80,
    ("zipf1000", "10% moved", 100_000): 80,
}
FALSE_ALARM_GOAL = 1.0  # percent of pairs, per cell
CPU_RATIO_GOAL = 0.25  # Concord CPU / Evidently CPU at 1M rows
POWER_RUNNER = BENCH_DIR / "evidently_power_runner.py"


def _rows(n: int) -> str:
    return {1_000: "1k", 100_000: "100k", 1_000_000: "1M"}.get(n, str(n))


def shifts_of(shape: str) -> tuple[str, ...]:
    return NUMERIC_SHIFTS if shape in NUMERIC else CATEGORICAL_SHIFTS


# --------------------------------------------------------------------------- data


def _draw(shape: str, n: int, rng):
    import numpy as np

    if shape == "normal":
        return rng.normal(0.0, 1.0, n)
    if shape == "lognormal":
        return rng.lognormal(0.0, 1.0, n)
    if shape == "t3":
        return rng.standard_t(3, n)
    if shape == "cat5":
        return rng.choice(len(CAT5_SHARES), n, p=np.array(CAT5_SHARES))
    weights = 1.0 / np.arange(1, ZIPF_K + 1)
    return rng.choice(ZIPF_K, n, p=weights / weights.sum())


def _moments(shape: str) -> tuple[float, float]:
    """The distribution's mean and standard deviation."""
    import math

    if shape == "lognormal":
        return math.exp(0.5), math.sqrt((math.e - 1) * math.e)
    if shape == "t3":
        return 0.0, math.sqrt(3.0)
    return 0.0, 1.0


def _shifted(shape: str, shift: str, base, rng):
    """The current column: ``base`` (an independent draw) changed by ``shift``."""
    import numpy as np

    x = base.copy()
    if shape in NUMERIC:
        mean, sigma = _moments(shape)
        if shift.startswith("mean"):
            x += float(shift.split("+")[1].rstrip("σ")) * sigma
        elif shift.startswith("scale"):
            x = mean + float(shift.split("×")[1]) * (x - mean)
        return x
    n = x.size
    if shift == "new category 1%":
        x[rng.choice(n, int(round(0.01 * n)), replace=False)] = -1
        return x
    if shift != "none":
        moved = int(round(float(shift.split("%")[0]) / 100 * n))
        top = np.flatnonzero(x == 0)
        chosen = rng.choice(top, min(moved, top.size), replace=False)
        x[chosen] = len(CAT5_SHARES) - 1 if shape == "cat5" else rng.integers(100, ZIPF_K, chosen.size)
    return x


def _labels(shape: str, codes):
    import numpy as np

    if shape in NUMERIC:
        return codes
    prefix = "c" if shape == "cat5" else "z"
    names = np.array([f"{prefix}{i}" for i in range(len(CAT5_SHARES) if shape == "cat5" else ZIPF_K)] + ["NEW"], dtype=object)
    return names[codes]  # -1: the new category, last


@dataclass(frozen=True)
class Cell:
    shape: str
    shift: str
    rows: int
    reference: Path
    current: Path
    pairs: int


def ensure_cells(data_dir: Path, sizes: dict[int, tuple[int, int]], shapes_at: dict[int, tuple[str, ...]]) -> list[Cell]:
    """Every cell's two parquet files (columns ``p0`` … , one per pair), generated once: per shape
    and size one reference file and one current file per shift, reused while the sidecar matches."""
    import numpy as np
    import pandas as pd

    cells = []
    for rows, (pairs, null_pairs) in sizes.items():
        for shape in shapes_at[rows]:
            folder = data_dir / "drift-power" / f"{shape}-{rows}"
            params = {"seed": SEED, "shape": shape, "rows": rows, "pairs": pairs, "null_pairs": null_pairs, "shifts": list(shifts_of(shape)), "version": 1}
            sidecar = folder / "params.json"
            files = {s: folder / f"current-{i}.parquet" for i, s in enumerate(shifts_of(shape))}
            ref_path = folder / "reference.parquet"
            if read_json(sidecar) != params or not ref_path.exists() or not all(p.exists() for p in files.values()):
                t0 = time.perf_counter()
                folder.mkdir(parents=True, exist_ok=True)
                ref_cols, base_cols = {}, {}
                for j in range(max(pairs, null_pairs)):
                    rng = np.random.default_rng([SEED, rows, j, len(shape), sum(map(ord, shape))])
                    ref_cols[f"p{j}"], base_cols[f"p{j}"] = _draw(shape, rows, rng), _draw(shape, rows, rng)
                pd.DataFrame({k: _labels(shape, v) for k, v in ref_cols.items()}).to_parquet(ref_path, index=False, row_group_size=rows)
                for i, shift in enumerate(shifts_of(shape)):
                    k = null_pairs if shift == "none" else pairs
                    cur = {}
                    for j in range(k):
                        rng = np.random.default_rng([SEED, rows, j, i, 7])
                        cur[f"p{j}"] = _labels(shape, _shifted(shape, shift, base_cols[f"p{j}"], rng))
                    pd.DataFrame(cur).to_parquet(files[shift], index=False, row_group_size=rows)
                write_json_atomic(sidecar, params)
                log(f"generated {shape} × {_rows(rows)} in {time.perf_counter() - t0:.1f} s")
            for shift in shifts_of(shape):
                cells.append(Cell(shape, shift, rows, ref_path, files[shift], null_pairs if shift == "none" else pairs))
    return cells


# --------------------------------------------------------------------------- the two tools


def concord_rates(cells: list[Cell]) -> tuple[dict, dict]:
    """Per cell: the share of pairs Concord flags (warning or critical), and CPU seconds per size."""
    import time as _time

    from bench.evidently_runner import read_rows
    from concord.audit.drift import data_drift

    rates, cpu = {}, {}
    for cell in cells:
        cur = read_rows(str(cell.current), None)
        ref = read_rows(str(cell.reference), None)
        flagged = 0
        t0 = _time.process_time()
        for col in cur.columns:
            report = data_drift(ref[[col]], cur[[col]])
            flagged += report.severity != "ok"
        cpu[cell.rows] = cpu.get(cell.rows, 0.0) + _time.process_time() - t0
        rates[(cell.shape, cell.shift, cell.rows)] = 100.0 * flagged / len(cur.columns)
    return rates, cpu


def evidently_rates(cells: list[Cell], out: Path) -> tuple[dict, dict, str, list[str]]:
    """The same for Evidently, all cells in one process of its venv; and its methods."""
    ev = ensure_evidently(out)
    jobs = [{"key": i, "reference": str(c.reference), "current": str(c.current)} for i, c in enumerate(cells)]
    jobs_file = out / "work" / "drift-power-jobs.json"
    jobs_file.parent.mkdir(parents=True, exist_ok=True)
    jobs_file.write_text(json.dumps(jobs))
    res = subprocess.run([str(ev.python), str(POWER_RUNNER), str(jobs_file)], capture_output=True, text=True)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-6:])
        raise EvidentlyUnavailable(f"the Evidently runner failed: {tail}")
    rates, cpu, methods = {}, {}, set()
    for line in res.stdout.splitlines():
        doc = json.loads(line)
        cell = cells[doc["key"]]
        rates[(cell.shape, cell.shift, cell.rows)] = 100.0 * len(doc["drifted"]) / len(doc["columns"])
        cpu[cell.rows] = cpu.get(cell.rows, 0.0) + doc["cpu_seconds"]
        methods |= {f"{_rows(cell.rows)} {cell.shape}: {m}" for m in set(doc["methods"].values())}
    return rates, cpu, f"Evidently {ev.version} (pandas {ev.pandas})", sorted(methods)


# --------------------------------------------------------------------------- the table


def run(opts: Options) -> list[Table]:
    sizes = QUICK_SIZES if opts.quick else SIZES
    shapes_at = {n: NUMERIC + CATEGORICAL for n in sizes}
    if opts.quick:
        shapes_at[1_000_000] = QUICK_1M_SHAPES
    t0 = time.perf_counter()
    cells = ensure_cells(opts.data_dir, sizes, shapes_at)
    log(f"concord: {sum(c.pairs for c in cells)} pairs in {len(cells)} cells")
    ours, our_cpu = concord_rates(cells)
    log(f"concord done in {time.perf_counter() - t0:.0f} s; evidently ...")
    try:
        theirs, their_cpu, who, methods = evidently_rates(cells, opts.out)
    except EvidentlyUnavailable as e:
        log(f"evidently unavailable: {e}")
        theirs, their_cpu, who, methods = {}, {}, f"Evidently unavailable ({e})", []
    table = Table(f"drift-power: share of pairs flagged, Concord's rule vs {who} DataDriftPreset defaults")
    for cell in cells:
        key = (cell.shape, cell.shift, cell.rows)
        goal = DETECTION_GOALS.get(key)
        target = Target("value", "<=", FALSE_ALARM_GOAL) if cell.shift == "none" else (Target("value", ">=", goal) if goal else None)
        what = "false alarms" if cell.shift == "none" else "detected"
        table.add(
            Row(
                f"{cell.shape} · {cell.shift} · {_rows(cell.rows)} ({cell.pairs} pairs): {what}",
                ours[key], theirs.get(key), "%", target, "evidently",
            )
        )
    top = max(sizes)
    if top in our_cpu:
        table.add(
            Row(
                f"CPU over the {_rows(top)}-row pairs' reports",
                our_cpu[top], their_cpu.get(top), "s", Target("ratio", "<=", CPU_RATIO_GOAL), "evidently",
            )
        )
    table.notes += [
        "flagged: Concord's severity warning or critical (data_drift, default thresholds); Evidently's column drift test failed. "
        "The ratio column of a share is Concord's over Evidently's; the CPU ratio is the goal (at most 0.25, i.e. 4× less).",
        "Evidently's methods: " + "; ".join(methods) if methods else "Evidently not run",
        f"whole run {time.perf_counter() - t0:.0f} s (data generation included when not cached)",
    ]
    return [table]
