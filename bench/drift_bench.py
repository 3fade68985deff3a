"""Drift benchmark: Concord's full data-drift audit against Evidently's DataDriftPreset.

Data (generated once with numpy, fixed seed, cached as parquet under ``data/``): a reference and a
current table of 10,000,000 rows × 20 float64 columns (200,000 rows with ``--quick``). Column
``fNN`` is normal with mean ``5·NN − 50`` and standard deviation ``σ = 0.5 + 0.25·NN`` in the
reference. In the current table, ``f00`` … ``f08`` have their mean shifted by 0.2σ, 0.3σ, …, 1.0σ,
``f09`` has its standard deviation doubled, and ``f10`` … ``f19`` are unchanged.

Measured:
- Concord: ``data_drift(reference, current)`` on the two DataFrames (every column, default bins,
  every statistic: PSI, KL, JS, KS and Wasserstein), with ``workers=1`` and
  ``workers=os.cpu_count()``, timed in this process on frames already loaded;
- Evidently: ``Report([DataDriftPreset()]).run(current, reference)`` (tests included) in its own
  venv (Evidently does not import with pandas 3), created on first use under
  ``evidently-venv/``; ``bench/evidently_runner.py`` loads the same parquet files there and times
  the report's computation alone;
- peak memory: ``RssAnon`` of a child process polled by ``probe_memory`` above its level with the
  two frames loaded (the audit's own working memory), for Concord at each worker count and for
  every Evidently run.

Evidently runs first on 1,000,000 rows (both tools are timed at that size too); it runs on the
full 10,000,000 rows only if that run, scaled by ``n log n``, says it would finish within
15 minutes and fit in the memory available. Otherwise the table compares Concord on 10M rows
with Evidently on 1M, and says so.

The two tools' verdicts are printed side by side: which columns each calls drifted (Concord: PSI
above 0.25 confirmed by KS; Evidently's default for numeric columns of more than 1,000 rows:
Wasserstein distance over the reference's standard deviation at 0.1 or more), and Evidently's
rule applied to Concord's own Wasserstein distances, which must give Evidently's list.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    BENCH_DIR,
    DATA_FORMAT,
    MB,
    Case,
    Options,
    Row,
    Table,
    Target,
    log,
    probe_memory,
    race,
    read_json,
    remove,
    self_anon_kb,
    times_note,
    wait_for_idle,
    write_json_atomic,
)

ROWS = 10_000_000
QUICK_ROWS = 200_000
#: Evidently's size when the full one would take too long or too much memory
SMALL_ROWS = 1_000_000
COLUMNS = 20
SEED = 20_260_606
#: rows per parquet row group, so that reading the first 1M rows reads only those
ROW_GROUP = 1_000_000
#: f00 … f08: mean shifted by this many σ in current
MEAN_SHIFTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: f09: standard deviation multiplied by this in current
SCALE_COLUMN, SCALE = len(MEAN_SHIFTS), 2.0
#: Evidently is run on the full size only if it is expected to finish within this
EVIDENTLY_MAX_SECONDS = 15 * 60
#: ... and to leave this share of the memory available untouched
MEMORY_MARGIN = 0.25
#: the speed-up the issue asks for (Evidently seconds / Concord seconds), at equal or larger size
SPEEDUP_TARGET = 10.0

RUNNER = BENCH_DIR / "evidently_runner.py"
EVIDENTLY_REQUIREMENTS = ("evidently", "pandas<3", "numpy", "pyarrow")
#: runs the Evidently runner in place of the probe's child, under the same pid, so it is polled
EXEC_CODE = "import os, sys; os.execv(sys.argv[1], sys.argv[1:])"


# --------------------------------------------------------------------------- data


def column_names() -> list[str]:
    return [f"f{j:02d}" for j in range(COLUMNS)]


def column_spec(j: int) -> dict:
    """Column ``j``'s reference mean and σ, and its change in current (mean shift in σ, σ factor)."""
    shift = MEAN_SHIFTS[j] if j < len(MEAN_SHIFTS) else 0.0
    scale = SCALE if j == SCALE_COLUMN else 1.0
    return {"mean": 5.0 * j - 50.0, "sigma": 0.5 + 0.25 * j, "shift_sigma": shift, "scale": scale}


def change_text(j: int) -> str:
    s = column_spec(j)
    if s["shift_sigma"]:
        return f"mean +{s['shift_sigma']:.1f}σ"
    if s["scale"] != 1.0:
        return f"σ ×{s['scale']:g}"
    return "unchanged"


@dataclass(frozen=True)
class DriftData:
    rows: int
    reference: Path
    current: Path


def ensure_data(data_dir: Path, rows: int) -> DriftData:
    """The two parquet files of ``rows`` rows, generated once and reused while their sidecar matches."""
    folder = data_dir / f"drift-{rows}x{COLUMNS}"
    sidecar = data_dir / f"{folder.name}.json"
    ref, cur = folder / "reference.parquet", folder / "current.parquet"
    params = {
        "format": DATA_FORMAT,
        "rows": rows,
        "columns": COLUMNS,
        "seed": SEED,
        "row_group": ROW_GROUP,
        "spec": [column_spec(j) for j in range(COLUMNS)],
    }
    found = read_json(sidecar)
    if found and found.get("params") == params and all(
        p.is_file() and p.stat().st_size == found.get("sizes", {}).get(p.name) for p in (ref, cur)
    ):
        log(f"reusing {folder} ({rows:,} rows × {COLUMNS} columns)")
        return DriftData(rows, ref, cur)
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    log(f"generating {folder}: {rows:,} rows × {COLUMNS} float64 columns, reference and current")
    remove(sidecar)
    remove(folder)
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    for side, path in enumerate((ref, cur)):
        arrays = {}
        for j, name in enumerate(column_names()):
            s = column_spec(j)
            x = np.random.default_rng([SEED, side, j]).standard_normal(rows)
            sigma = s["sigma"] * (s["scale"] if side else 1.0)
            mean = s["mean"] + (s["shift_sigma"] * s["sigma"] if side else 0.0)
            x *= sigma
            x += mean
            arrays[name] = x
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(pa.table(arrays), tmp, row_group_size=ROW_GROUP, compression="none", use_dictionary=False)
        os.replace(tmp, path)
        del arrays
    write_json_atomic(sidecar, {"params": params, "sizes": {p.name: p.stat().st_size for p in (ref, cur)}})
    log(f"generated in {time.perf_counter() - t0:.1f} s")
    return DriftData(rows, ref, cur)


def load(data: DriftData, rows: int):
    """The first ``rows`` rows of both files as pandas DataFrames."""
    from bench.evidently_runner import read_rows

    return read_rows(str(data.reference), rows), read_rows(str(data.current), rows)


# --------------------------------------------------------------------------- Evidently's venv


class EvidentlyUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Evidently:
    python: Path
    version: str
    pandas: str


def ensure_evidently(out: Path) -> Evidently:
    """Evidently in its own venv under ``out``, created on first use (``python -m venv`` and pip)."""
    venv = out / "evidently-venv"
    python = venv / "bin" / "python"
    marker = venv / "concord-bench.json"
    found = read_json(marker)
    if found and found.get("requirements") == list(EVIDENTLY_REQUIREMENTS) and python.exists():
        try:
            return _check_evidently(python)
        except EvidentlyUnavailable as e:
            log(f"{venv} is unusable ({e}); recreating it")
    log(f"creating {venv} with {' '.join(EVIDENTLY_REQUIREMENTS)} (needs PyPI)")
    remove(venv)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *EVIDENTLY_REQUIREMENTS],
    ]
    for argv in steps:
        res = subprocess.run(argv, capture_output=True, text=True)
        if res.returncode != 0:
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-8:])
            raise EvidentlyUnavailable(f"`{' '.join(argv[2:] if 'pip' in argv else argv[1:])}` failed: {tail}")
    found = _check_evidently(python)
    write_json_atomic(marker, {"requirements": list(EVIDENTLY_REQUIREMENTS), "evidently": found.version})
    log(f"installed Evidently {found.version} with pandas {found.pandas}")
    return found


def _check_evidently(python: Path) -> Evidently:
    code = "import json, evidently, pandas, pyarrow; print(json.dumps([evidently.__version__, pandas.__version__]))"
    res = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-4:])
        raise EvidentlyUnavailable(f"Evidently does not import in its venv: {tail}")
    version, pandas = json.loads(res.stdout.strip().splitlines()[-1])
    return Evidently(python, version, pandas)


# --------------------------------------------------------------------------- measurements


@dataclass
class Size:
    """Everything measured at one row count."""

    rows: int
    concord: dict[int, Case] = field(default_factory=dict)  # workers -> timed case
    concord_cpu: dict[int, list[float]] = field(default_factory=dict)  # workers -> CPU seconds of each run
    concord_memory: dict[int, dict] = field(default_factory=dict)  # workers -> probe result
    evidently: Case | None = None  # timed runs of the Evidently runner
    evidently_runs: list[dict] = field(default_factory=list)  # each run's JSON plus the probe's figures
    evidently_error: str = ""  # why Evidently failed (its later runs are skipped)
    stats: dict[str, dict] = field(default_factory=dict)  # column -> Concord's statistics

    @property
    def evidently_best(self) -> dict | None:
        runs = self.evidently_runs
        return min(runs, key=lambda r: r["seconds"]) if runs else None

    @property
    def concord_drifted(self) -> list[str]:
        return [c for c, s in self.stats.items() if s["drifted"]]


def _evidently_case(ev: Evidently, data: DriftData, size: Size) -> Case:
    """One Evidently run per call, in a fresh process of its venv polled by the memory probe. A
    failure (Evidently raising, running out of memory) is recorded and ends its runs at this size."""
    rows = size.rows

    def once() -> dict | None:
        if size.evidently_error:
            return None
        args = [str(ev.python), str(RUNNER), str(data.reference), str(data.current), "--rows", str(rows), "--handshake"]
        try:
            peak, loaded_kb, result, samples = probe_memory(EXEC_CODE, args)
        except (RuntimeError, ValueError) as e:
            size.evidently_error = f"{type(e).__name__}: {e}"
            log(f"evidently {_rows(rows)} failed ({size.evidently_error}); see its stderr above")
            return None
        result["peak_above_data_mb"] = (max(peak["RssAnon"], result["after_anon_kb"]) - loaded_kb) * 1024 / MB
        result["peak_anon_mb"] = max(peak["RssAnon"], result["after_anon_kb"]) * 1024 / MB
        result["data_mb"] = (loaded_kb - result["imported_anon_kb"]) * 1024 / MB
        result["samples"] = samples
        size.evidently_runs.append(result)
        log(f"evidently {_rows(rows)}: report {result['seconds']:.2f} s, peak {result['peak_above_data_mb']:.0f} MB above the data")
        return result

    return Case(f"evidently {_rows(rows)}", once)


def _concord_memory(data: DriftData, rows: int, workers: int) -> dict:
    code = (
        "import sys; from bench.drift_bench import memory_child; "
        "memory_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))"
    )
    peak, loaded_kb, result, samples = probe_memory(code, [str(data.reference), str(data.current), str(rows), str(workers)])
    top = max(peak["RssAnon"], result["after_anon_kb"])
    return {
        "peak_above_data_mb": (top - loaded_kb) * 1024 / MB,
        "peak_anon_mb": top * 1024 / MB,
        "data_mb": (loaded_kb - result["imported_anon_kb"]) * 1024 / MB,
        "seconds": result["seconds"],
        "drifted": result["drifted"],
        "samples": samples,
    }


def memory_child(reference: str, current: str, rows: int, workers: int) -> None:
    """Entry point of Concord's memory probe: load both frames, report, run the audit, report."""
    import gc

    import numpy as np
    import pandas as pd

    from bench.evidently_runner import read_rows
    from concord.audit.drift import data_drift

    # load the modules the audit imports before the baseline is taken
    tiny = pd.DataFrame({"x": np.arange(20_000, dtype=np.float64)})
    data_drift(tiny, tiny + 1.0)
    del tiny
    gc.collect()
    imported = self_anon_kb()
    ref, cur = read_rows(reference, rows), read_rows(current, rows)
    gc.collect()
    print(f"READY {self_anon_kb()}", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    report = data_drift(ref, cur, workers=workers)
    seconds = time.perf_counter() - t0
    after = self_anon_kb()
    drifted = [c.column for c in report.columns if c.drifted]
    print(json.dumps({"seconds": seconds, "imported_anon_kb": imported, "after_anon_kb": after, "drifted": drifted}), flush=True)


def _measure(
    opts: Options, data: DriftData, rows: int, worker_counts: list[int], ev: Evidently | None, evidently_too: bool
) -> Size:
    """Concord timed at ``rows`` for each worker count, interleaved with Evidently's runs if asked;
    then Concord's memory probes."""
    import numpy as np

    from concord.audit.drift import data_drift

    size = Size(rows)
    log(f"loading {rows:,} rows × {COLUMNS} columns of both tables")
    ref, cur = load(data, rows)

    def audit(workers: int):
        c0 = time.process_time()
        report = data_drift(ref, cur, workers=workers)
        size.concord_cpu.setdefault(workers, []).append(time.process_time() - c0)
        return report

    for w in worker_counts:
        size.concord[w] = Case(f"concord {_rows(rows)} {_workers(w)}", lambda w=w: audit(w))
    cases = list(size.concord.values())
    for c in cases:  # untimed warm-up of Concord; a fresh Evidently process has nothing to warm
        log(f"{c.label}: warm-up {c.once()[0]:.3f} s")
    size.concord_cpu.clear()
    if evidently_too and ev is not None:
        size.evidently = _evidently_case(ev, data, size)
        cases.append(size.evidently)
    race(opts.runs, *cases, warmup=False, wait_idle=opts.wait_idle)

    verdicts = {w: [c.column for c in case.result.columns if c.drifted] for w, case in size.concord.items()}
    first = verdicts[worker_counts[0]]
    if any(v != first for v in verdicts.values()):
        raise RuntimeError(f"data_drift's verdict depends on the worker count: {verdicts}")
    report = size.concord[worker_counts[0]].result
    for c in report.columns:
        sigma = float(np.std(ref[c.column].to_numpy()))
        size.stats[c.column] = {
            "psi": c.psi,
            "ks": c.ks,
            "wasserstein": c.wasserstein,
            "w_normed": c.wasserstein / max(sigma, 0.001),
            "severity": c.severity,
            "drifted": c.drifted,
        }
    _check_verdict(size)
    ref = cur = report = None  # the tables are freed before the memory probes
    for case in size.concord.values():
        case.result = None
    for w in worker_counts:
        wait_for_idle(opts.wait_idle)
        m = _concord_memory(data, rows, w)
        if m["drifted"] != first:
            raise RuntimeError(f"the memory probe's audit found {m['drifted']}, the timed one {first}")
        size.concord_memory[w] = m
        log(f"concord {_rows(rows)} {_workers(w)}: peak {m['peak_above_data_mb']:.0f} MB above the data")
    return size


def _check_verdict(size: Size) -> None:
    """Concord must leave the unchanged columns alone and flag the clear shifts (≥ 0.7σ, σ ×2)."""
    names = column_names()
    wrong = [n for j, n in enumerate(names) if change_text(j) == "unchanged" and size.stats[n]["drifted"]]
    clear = [n for j, n in enumerate(names) if (column_spec(j)["shift_sigma"] >= 0.7 or column_spec(j)["scale"] != 1.0)]
    missed = [n for n in clear if not size.stats[n]["drifted"]]
    if wrong or missed:
        raise RuntimeError(f"data_drift is wrong: drift in unchanged columns {wrong}, clear shifts missed {missed}")


# --------------------------------------------------------------------------- the benchmark


def run(opts: Options) -> list[Table]:
    rows = QUICK_ROWS if opts.quick else ROWS
    cpus = os.cpu_count() or 1
    worker_counts = sorted({1, cpus})
    data = ensure_data(opts.data_dir, rows)
    ev: Evidently | None = None
    ev_error = ""
    try:
        ev = ensure_evidently(opts.out)
    except EvidentlyUnavailable as e:
        ev_error = str(e)
        log(f"Evidently unavailable, its baseline is n/a: {ev_error}")

    sizes: list[Size] = []
    full_reason, estimate = "", None
    if rows > SMALL_ROWS:
        small = _measure(opts, data, SMALL_ROWS, worker_counts, ev, ev is not None)
        sizes.append(small)
        run_full, full_reason, estimate = _evidently_fits(small, rows) if ev is not None else (False, "", None)
        sizes.insert(0, _measure(opts, data, rows, worker_counts, ev, run_full))
    else:
        sizes.append(_measure(opts, data, rows, worker_counts, ev, ev is not None))
    return [_table(opts, sizes, worker_counts, ev, ev_error, full_reason, estimate)]


def _evidently_fits(small: Size, rows: int) -> tuple[bool, str, float | None]:
    """Whether Evidently can run on ``rows``, from its best run on the small size; why (not); and
    the report's estimated seconds there."""
    best = small.evidently_best
    if best is None:
        return False, "Evidently did not run", None
    factor = rows / small.rows * math.log(rows) / math.log(small.rows)
    seconds = (best["seconds"] + best["load_seconds"]) * factor
    memory = (best["data_mb"] + best["peak_above_data_mb"]) * rows / small.rows
    # this process holds its own copy of the frames meanwhile
    ours = best["data_mb"] * rows / small.rows
    available = _available_mb()
    why = (
        f"its {_rows(small.rows)} run ({best['seconds']:.1f} s, {best['data_mb'] + best['peak_above_data_mb']:,.0f} MB "
        f"with the data), scaled by n log n, puts {_rows(rows)} rows at ~{seconds / 60:.0f} min a run and "
        f"~{memory / 1000:.1f} GB, plus {ours / 1000:.1f} GB for Concord's copy of the data (limits: "
        f"{EVIDENTLY_MAX_SECONDS / 60:.0f} min, {(1 - MEMORY_MARGIN):.0%} of the {available / 1000:.1f} GB available)"
    )
    fits = seconds <= EVIDENTLY_MAX_SECONDS and memory + ours <= (1 - MEMORY_MARGIN) * available
    log(("running" if fits else "not running") + f" Evidently on {_rows(rows)}: {why}")
    return fits, why, best["seconds"] * factor


def _available_mb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / MB
    except (OSError, ValueError):
        pass
    return float("inf")


def _table(
    opts: Options,
    sizes: list[Size],
    worker_counts: list[int],
    ev: Evidently | None,
    ev_error: str,
    full_reason: str,
    estimate: float | None,
) -> Table:
    full = sizes[0]
    # Evidently's figures: at the full size if it ran there, else the largest size it ran at
    ev_size = next((s for s in sizes if s.evidently_best is not None), None)
    ev_best = ev_size.evidently_best if ev_size else None
    ev_name = f"Evidently {ev.version}" if ev else "Evidently"
    table = Table(
        f"drift: full audit of {_rows(full.rows)} rows × {COLUMNS} float64 columns, reference vs shifted current, "
        f"best of {opts.runs}"
        + (f" (Evidently on {_rows(ev_size.rows)} rows)" if ev_size and ev_size.rows != full.rows else "")
    )
    for size in sizes:
        # compare each Concord size with Evidently at the same size, or at the size it ran at
        base = size if size.evidently_best is not None else ev_size
        best = base.evidently_best if base else None
        bname = f"{ev_name}, {_rows(base.rows)} rows" if base else ev_name
        for w in worker_counts:
            t = size.concord[w].best
            table.add(Row(f"audit time, {_rows(size.rows)} rows, {_workers(w)}", t, best and best["seconds"], "s", None, bname))
        for w in worker_counts:
            t = size.concord[w].best
            speedup = best["seconds"] / t if best else None
            label = f"speed-up (Evidently s ÷ Concord s), Concord {_rows(size.rows)} {_workers(w)}"
            if base:
                label += f" vs Evidently {_rows(base.rows)}"
            table.add(Row(label, speedup, None, "×", Target("value", ">=", SPEEDUP_TARGET)))
        ev_cpu = min(r["cpu_seconds"] for r in base.evidently_runs) if best else None
        for w in worker_counts:
            cpu = min(size.concord_cpu[w])
            table.add(Row(f"CPU time (all threads), {_rows(size.rows)} rows, {_workers(w)}", cpu, ev_cpu, "s", None, bname))
        for w in worker_counts:
            m = size.concord_memory[w]
            table.add(
                Row(
                    f"peak memory above the loaded data, {_rows(size.rows)} rows, {_workers(w)}",
                    m["peak_above_data_mb"],
                    best and best["peak_above_data_mb"],
                    "MB",
                    None,
                    bname,
                )
            )
        m = size.concord_memory[worker_counts[-1]]
        table.add(
            Row(
                f"peak memory of the whole process (RssAnon), {_rows(size.rows)} rows, {_workers(worker_counts[-1])}",
                m["peak_anon_mb"],
                best and best["peak_anon_mb"],
                "MB",
                None,
                bname,
            )
        )

    # notes: what ran where, the verdicts, every run
    if ev_error:
        table.notes.append(f"Evidently could not be set up, so its baseline is n/a: {ev_error}")
    for size in sizes:
        if size.evidently_error:
            table.notes.append(f"Evidently failed on {_rows(size.rows)} rows: {size.evidently_error}")
    if ev and ev_size and ev_size.rows != full.rows:
        table.notes.append(
            f"Evidently was timed on {_rows(ev_size.rows)} rows, not {_rows(full.rows)}: {full_reason}. "
            f"The {_rows(full.rows)}-row rows compare Concord on {full.rows // ev_size.rows}× the data with it; "
            f"the {_rows(ev_size.rows)}-row rows compare equal sizes"
        )
        if estimate:
            speedups = ", ".join(f"~{estimate / full.concord[w].best:.0f}× with {_workers(w)}" for w in worker_counts)
            table.notes.append(
                f"on that estimate (~{estimate / 60:.0f} min for Evidently's report on {_rows(full.rows)} rows), Concord "
                f"would be {speedups} faster at equal size: an extrapolation, not a measurement"
            )
    if ev_best:
        table.notes.append(
            f"Evidently {ev_best['evidently_version']} (pandas {ev_best['pandas_version']}, {ev_best['api']}), "
            f"`Report([DataDriftPreset()], include_tests=True).run(current, reference)` timed alone (loading the "
            f"parquet excluded); method {_one(ev_best['methods'])}, threshold {_one(ev_best['thresholds'])}; "
            f"peak RSS (ru_maxrss) {ev_best['peak_rss_mb']:,.0f} MB"
        )
    table.notes.append(
        "Concord: `data_drift(reference, current, workers=W)` on the loaded DataFrames: every column, "
        "10 quantile bins, PSI, KL, JS, KS and Wasserstein each; memory is the polled RssAnon of a child "
        "process above its level with both frames loaded (and the audit's modules imported); the same for Evidently"
    )
    for size in sizes:
        table.notes += _verdict_notes(size, ev_size if ev_size is size else None)
    for size in sizes:
        cases = list(size.concord.values())
        table.notes.append(f"{_rows(size.rows)} rows, Concord: " + times_note(cases))
        if size.evidently is not None:
            runs = "; ".join(
                f"{r['seconds']:.2f} s (load {r['load_seconds']:.1f} s; other processes {o:.0%} of the CPUs)"
                for r, o in zip(size.evidently_runs, size.evidently.others)
            )
            table.notes.append(f"{_rows(size.rows)} rows, Evidently's report, every run: {runs}")
    for size in sizes:
        m = size.concord_memory[worker_counts[0]]
        table.notes.append(
            f"{_rows(size.rows)} rows: the two loaded frames take {m['data_mb']:,.0f} MB in Concord's process "
            f"({size.rows * COLUMNS * 8 * 2 / MB:,.0f} MB of float64 values)"
            + (f", {size.evidently_best['data_mb']:,.0f} MB in Evidently's" if size.evidently_best else "")
        )
    if opts.quick:
        table.notes.append("--quick: 200,000 rows; the issue's target is set for 10,000,000")
    return table


def _verdict_notes(size: Size, ev_size: Size | None) -> list[str]:
    names = column_names()
    notes = []
    per = []
    for j, n in enumerate(names):
        s = size.stats[n]
        if change_text(j) == "unchanged":
            continue
        per.append(f"{n} ({change_text(j)}): PSI {s['psi']:.3f}, W/σ {s['w_normed']:.3f}")
    quiet = [size.stats[n] for j, n in enumerate(names) if change_text(j) == "unchanged"]
    per.append(
        f"unchanged f{len(MEAN_SHIFTS) + 1:02d}–f{COLUMNS - 1:02d}: PSI ≤ {max(s['psi'] for s in quiet):.2g}, "
        f"W/σ ≤ {max(s['w_normed'] for s in quiet):.2g}"
    )
    notes.append(f"{_rows(size.rows)} rows, Concord's statistics: " + "; ".join(per))
    notes.append(f"{_rows(size.rows)} rows, Concord drifted (PSI > 0.25, KS confirms): {_list(size.concord_drifted)}")
    best = size.evidently_best
    if best is None:
        return notes
    ev = best["drifted_columns"]
    notes.append(f"{_rows(size.rows)} rows, Evidently drifted: {_list(ev)}")
    threshold = _one(best["thresholds"])
    rule = [n for n in names if size.stats[n]["w_normed"] >= float(threshold)] if threshold != "mixed" else []
    gap = max(abs(size.stats[n]["w_normed"] - best["scores"][n]) for n in names)
    agree = "the same list" if rule == ev else f"a different list: {_list(rule)}"
    notes.append(
        f"{_rows(size.rows)} rows: Evidently's rule (W/σ ≥ {threshold}) on Concord's Wasserstein distances gives "
        f"{agree}; largest difference between the two tools' W/σ: {gap:.2g}"
    )
    only_ev = [n for n in ev if n not in size.concord_drifted]
    only_c = [n for n in size.concord_drifted if n not in ev]
    if only_ev or only_c:
        notes.append(
            f"{_rows(size.rows)} rows: the verdicts differ on {_list(only_ev + only_c)} "
            "(thresholds, not measurements: a mean shift of δσ gives W/σ ≈ δ but PSI ≈ δ² on 10 quantile bins, "
            "so Evidently's 0.1 flags shifts from 0.1σ, Concord's PSI 0.25 from about 0.5σ)"
        )
    else:
        notes.append(f"{_rows(size.rows)} rows: both tools call the same columns drifted")
    return notes


def _one(values: dict) -> str:
    distinct = {str(v) for v in values.values()}
    return distinct.pop() if len(distinct) == 1 else "mixed"


def _list(names: list[str]) -> str:
    return ", ".join(names) if names else "(none)"


def _rows(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return f"{n:,}"


def _workers(w: int) -> str:
    return f"{w} worker" + ("s" if w > 1 else "")
