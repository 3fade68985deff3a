"""Drift profile benchmark: the nightly audit against a reference profile vs against the raw reference.

Data (generated once with numpy, fixed seed, cached under ``data/``): parquet tables of 4 columns
(a normal and a lognormal float, a Poisson count, a 20-label category), registered as data
snapshots ``data/ref-<rows>`` and ``data/cur-<rows>`` in a folder store: references of 2.5 M and
5 M rows, current tables of 1 M, 2.5 M and 5 M rows (a fifth of that with ``--quick``); in the
current tables the normal column's mean moved by 0.1σ and 2% of the category's mass moved, the
others unchanged. Three nights are audited: a current table as large as its reference at both
sizes, and one of a fifth of the reference's rows (a night of data against a longer reference).
The profile of each reference is made once (``concord.audit.profile.profile_table``) and stored
beside it (``profiles/<id>``), as ``concord audit profile data/ref-<rows>`` does.

Measured, each audit in a child process polled from here (``probe_memory``: RSS, file pages
included): ``concord.audit.nightly.nightly_drift``, what the ``nightly-drift-audit`` flow runs,
with the reference read whole in one pass (``profile="off"``, the baseline) and against the
stored profile (``profile="use"``: only the current table is restored and read), at both sizes.

Against the profile, the current table's numeric columns (more values than the sample size) are
not sampled or sorted but counted on a grid of the profile's sample (``concord.audit.binned``), and
KS, Wasserstein and Brown–Forsythe come from the counts; the raw audit samples both sides.

Rows: wall time of each night (target: the profile audit at least 2× faster, ratio ≤ 0.5); the CPU
seconds of each (the child's, all its threads: the lowest of the runs) and, at equal sizes, where
they go (restoring the snapshots, reading the stored profile, the reference's pass, the current
table's pass, the columns' tests; and within them each pass's sampling and the sorting of its
samples, the counting on the grid and the tests from it, the tests' KS and Wasserstein and their
Welch t and Brown–Forsythe), with the CPU of the profile audit modelled from the raw audit's phases
had it sampled the current table as the raw audit does, and that less what the current side's
samples cost (sampling, sorting, the tests on them): the bound a sample-free current side could
reach if it cost nothing; peak RSS of the profile audit at the large
size against the small one (flat in the table size: ratio ≤ 1.25) and against the raw audit; the
profile's size at the large size against the small one (bounded: ratio ≤ 1.05) and as a fraction
of the reference's parquet file; the nights whose every column has the same severity against the
profile and the raw reference (target: all); and the one-off cost of making the profile.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench.common import (
    DATA_FORMAT,
    MB,
    Options,
    Row,
    Table,
    Target,
    log,
    probe_memory,
    read_json,
    remove,
    wait_for_idle,
    write_json_atomic,
)

SEED = 20_261_202
SIZES = (2_500_000, 5_000_000)
QUICK_SIZES = (500_000, 1_000_000)
#: a night's current table against the large reference: this share of its rows
SHORT_NIGHT = 0.2
GROUP_ROWS = 250_000
LABELS = [f"k{i:02d}" for i in range(20)]


def _block(side: int, index: int, rows: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng([SEED, side, index])
    weights = np.linspace(2.0, 0.5, len(LABELS))
    weights /= weights.sum()
    labels = rng.choice(len(LABELS), rows, p=weights)
    if side:  # 2% of the mass moved from the most frequent label to the rarest
        moved = (labels == 0) & (rng.random(rows) < 0.02 / weights[0])
        labels[moved] = len(LABELS) - 1
    return pa.table({
        "normal": rng.standard_normal(rows) + (0.1 if side else 0.0),
        "lognormal": np.exp(rng.standard_normal(rows) * 0.5),
        "count": rng.poisson(4, rows),
        "label": pa.DictionaryArray.from_arrays(labels.astype("int32"), LABELS),
    })


def nights(sizes: tuple[int, int]) -> list[tuple[int, int]]:
    """(reference rows, current rows) of each audited night."""
    small, large = sizes
    return [(small, small), (large, large), (large, int(large * SHORT_NIGHT))]


def ensure_store(data_dir: Path, sizes: tuple[int, int]):
    """The folder store holding, per size, the reference and current snapshots and the reference's profile."""
    import pyarrow.parquet as pq

    from concord.audit.profile import profile_table, store_profile
    from concord.lineage.data import register_data, table_batches
    from concord.stores import LocalDirStore

    folder = data_dir / "drift-profile"
    sidecar = data_dir / "drift-profile.json"
    from concord.audit.profile import VALUES_LAYOUT

    params = {
        "format": DATA_FORMAT,
        "profile_values": VALUES_LAYOUT,
        "nights": [list(night) for night in nights(sizes)],
        "seed": SEED,
        "group": GROUP_ROWS,
        "labels": len(LABELS),
    }
    found = read_json(sidecar)
    if found and found.get("params") == params and (folder / "store").is_dir():
        log(f"reusing {folder}")
        return LocalDirStore(folder / "store"), found["tables"], found["profile_seconds"]
    wanted = sorted({("ref", r) for r, _ in nights(sizes)} | {("cur", c) for _, c in nights(sizes)})
    log(f"generating {folder}: tables of {', '.join(f'{name} {n:,}' for name, n in wanted)} rows, 4 columns")
    remove(sidecar)
    remove(folder)
    folder.mkdir(parents=True)
    store = LocalDirStore(folder / "store")
    tables, profile_seconds = {}, {}
    for name, n in wanted:
        side = int(name == "cur")
        path = folder / f"{name}-{n}.parquet"
        with pq.ParquetWriter(path, _block(side, 0, 1).schema, compression="zstd") as w:
            for index, start in enumerate(range(0, n, GROUP_ROWS)):
                w.write_table(_block(side, index, min(GROUP_ROWS, n - start)), row_group_size=GROUP_ROWS)
        snap = register_data(str(path), store, name=f"{name}-{n}")
        tables[f"{name}-{n}"] = {"id": snap.id, "bytes": path.stat().st_size}
        if name == "ref":
            t0 = time.perf_counter()
            profile = profile_table(table_batches(path), source={"kind": "snapshot", "id": snap.id, "name": f"ref-{n}"})
            store_profile(store, snap.id, profile)
            profile_seconds[str(n)] = time.perf_counter() - t0
            tables[f"{name}-{n}"]["profile_bytes"] = len(profile.to_bytes())
        os.remove(path)  # the store holds it
    write_json_atomic(sidecar, {"params": params, "tables": tables, "profile_seconds": profile_seconds})
    return store, tables, profile_seconds


#: the child: imports what the audit needs, says READY, waits, audits, prints one JSON line
CHILD = """
import sys
from bench.drift_profile_bench import child
child(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
"""


def child(store_path: str, night: str, mode: str, plots: str) -> None:
    import numpy as np  # noqa: F401  (imported before the baseline, as the flow's worker has them)
    import pandas as pd  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import scipy.stats  # noqa: F401

    from bench.common import status_kb
    from concord.audit.nightly import nightly_drift
    from concord.stores import LocalDirStore

    store = LocalDirStore(store_path)
    phases = _time_phases()
    print(f"READY {status_kb(os.getpid(), ('VmRSS',))['VmRSS']}", flush=True)
    sys.stdin.readline()
    t0, c0 = time.perf_counter(), time.process_time()
    ref_rows, cur_rows = night.split(":")
    r = nightly_drift(f"data/ref-{ref_rows}", f"data/cur-{cur_rows}", store, None, profile=mode, draw_plots=False, plots_dir=plots, name="bench")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    verdict = {c["column"]: c["severity"] for c in r["drift"]["columns"]}
    print(json.dumps({"seconds": seconds, "cpu": cpu, "phases": phases, "verdict": verdict, "profile": r["reference"]["profile"]}), flush=True)


#: where an audit's CPU goes, in the order of a night
PHASES = ("restoring snapshots", "reading the profile", "reading the reference", "reading the current table", "the tests")
#: parts of those phases: each pass's uniform sample (drawing it, then sorting it with the rest of a
#: column's finish), and the tests' two parts (KS and Wasserstein from the sorted samples; Welch's t
#: and Brown–Forsythe); the last four are what the current side's samples cost an audit
PARTS = (
    "restoring the reference",  # of the raw audit's two restores
    "sampling the reference",
    "sorting the reference's samples",
    "sampling the current table",
    "sorting the current table's samples",
    "KS and Wasserstein",
    "Welch t and Brown–Forsythe",
    "counting on the grid",  # the current table's values, and the profile's sample for the tests
    "the tests from the grid",
)
#: the parts that exist only because the current table is sampled like the reference
CURRENT_SAMPLE_PARTS = (
    "sampling the current table",
    "sorting the current table's samples",
    "KS and Wasserstein",
    "Welch t and Brown–Forsythe",
)


def _time_phases() -> dict[str, float]:
    """The child's CPU seconds per phase of the audit (:data:`PHASES`), filled in as it runs: the
    functions of each phase wrapped (a snapshot's restore, the stored profile's read, each table's
    pass, each column's comparison); the rest (the report, opening the inputs) is what is left."""
    from contextlib import contextmanager

    import concord.audit.binned as binned
    import concord.audit.drift as drift
    import concord.audit.profile as profile
    import concord.lineage.data as data

    spent = dict.fromkeys(PHASES + PARTS, 0.0)

    def timed(phase_of, f):
        def wrapper(*args, **kwargs):
            c0 = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[phase_of(*args)] += time.process_time() - c0

        return wrapper

    restore = data.data_file

    @contextmanager
    def data_file(store, snapshot_id, *args, **kwargs):
        c0 = time.process_time()
        with restore(store, snapshot_id, *args, **kwargs) as opened:
            seconds = time.process_time() - c0
            spent["restoring snapshots"] += seconds
            if opened[1].name.startswith("ref-"):  # the bench's references: data/ref-<rows>
                spent["restoring the reference"] += seconds
            yield opened

    data.data_file = data_file
    profile.stored_profile = timed(lambda *a: "reading the profile", profile.stored_profile)
    # the current table's pass counts on the reference's bins; the reference's has none
    drift._read_sides = timed(lambda table, names, size, edges: "reading the current table" if edges else "reading the reference", drift._read_sides)
    drift._compare = timed(lambda *a: "the tests", drift._compare)
    # the parts (counted in their phase too): a column with bin edges is the current table's
    def part(current: str, reference: str):
        return lambda column, *a: current if column.edges is not None else reference

    drift._Column._take = timed(part("sampling the current table", "sampling the reference"), drift._Column._take)
    drift._Column.finish = timed(
        part("sorting the current table's samples", "sorting the reference's samples"), drift._Column.finish
    )
    drift._ks_wasserstein = timed(lambda *a: "KS and Wasserstein", drift._ks_wasserstein)
    drift._numeric_tests = timed(lambda *a: "Welch t and Brown–Forsythe", drift._numeric_tests)
    for grid in (binned.Cells, binned.Grid):
        grid.count = timed(lambda *a: "counting on the grid", grid.count)
    drift.grid_tests = timed(lambda *a: "the tests from the grid", drift.grid_tests)
    return spent


def measure(store, night: tuple[int, int], mode: str, plots: Path) -> dict:
    peak, baseline, result, _ = probe_memory(CHILD, [str(store.root), f"{night[0]}:{night[1]}", mode, str(plots)], ("VmRSS",))
    result.update(peak_mb=peak["VmRSS"] * 1024 / MB, baseline_mb=baseline * 1024 / MB)
    log(f"{mode} {_night(night)}: {result['seconds']:.1f} s, peak RSS {result['peak_mb']:.0f} MB")
    return result


def _night(night: tuple[int, int]) -> str:
    return f"{night[0]:,} reference / {night[1]:,} current rows"


def run(opts: Options) -> list[Table]:
    sizes = QUICK_SIZES if opts.quick else SIZES
    store, tables, profile_seconds = ensure_store(opts.data_dir, sizes)
    plots = opts.work_dir / "drift-profile"
    plots.mkdir(parents=True, exist_ok=True)
    audited = nights(sizes)
    results: dict[tuple[tuple[int, int], str], list[dict]] = {}
    loads: list[float] = []  # other processes' share of the CPUs before each night's pair
    for i in range(opts.runs):
        for night in audited:
            # interleaved, so a busy machine slows both alike, and each first every other run
            busy = wait_for_idle(opts.wait_idle)
            loads.append(busy)
            for mode in ("off", "use") if i % 2 == 0 else ("use", "off"):
                results.setdefault((night, mode), []).append(measure(store, night, mode, plots))
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in results.items()}
    peak = {k: max(r["peak_mb"] for r in v) for k, v in results.items()}
    small, large = sizes
    t = Table(
        f"drift-profile: the nightly audit against a stored reference profile vs the raw reference (4 columns, references of {small:,} and {large:,} rows)"
    )
    for night in audited:
        t.add(
            Row(
                f"wall time, {_night(night)}",
                best[(night, "use")]["seconds"],
                best[(night, "off")]["seconds"],
                "s",
                Target("ratio", "<=", 0.5),
                "raw reference",
            )
        )
    cpu = {k: min(r["cpu"] for r in v) for k, v in results.items()}
    for night in audited:  # the audit's own CPU seconds (all its threads): less at the mercy of the machine's load
        t.add(Row(f"CPU time, {_night(night)}", cpu[(night, "use")], cpu[(night, "off")], "s", None, "raw reference"))
    for night in audited[:2]:  # where it goes, in the run of least CPU of each
        lean = {mode: min(results[(night, mode)], key=lambda r: r["cpu"])["phases"] for mode in ("use", "off")}
        for phase in PHASES:
            if lean["use"][phase] or lean["off"][phase]:
                t.add(Row(f"CPU, {phase}, {_night(night)}", lean["use"][phase], lean["off"][phase], "s", None, "raw reference"))
        for part in PARTS:
            if lean["use"][part] or lean["off"][part]:
                use, off = lean["use"][part], lean["off"][part]
                t.add(Row(f"CPU, of which {part}, {_night(night)}", use, off, "s", None, "raw reference"))
        # the two audits run the same code on the current table, so the profile audit's CPU is the
        # raw audit's less the reference's restore and pass, plus reading the profile: taken from
        # one raw run, this is free of the machine's load between two runs
        off = min(results[(night, "off")], key=lambda r: r["cpu"])
        modelled = off["cpu"] - off["phases"]["restoring the reference"] - off["phases"]["reading the reference"]
        modelled += lean["use"]["reading the profile"]
        t.add(
            Row(
                f"CPU of the profile audit, from the raw audit's phases, {_night(night)}",
                modelled,
                off["cpu"],
                "s",
                None,
                "raw reference",
            )
        )
        # what the ratio could be at best if the current side cost nothing beyond reading it
        cut = sum(off["phases"][part] for part in CURRENT_SAMPLE_PARTS)
        t.add(
            Row(
                f"the same, both less the current side's samples and tests (a bound), {_night(night)}",
                modelled - cut,
                off["cpu"] - cut,
                "s",
                None,
                "raw reference",
            )
        )
    s_night, l_night = audited[0], audited[1]
    t.add(
        Row(
            f"peak RSS against the profile, {large:,} vs {small:,} rows",
            peak[(l_night, "use")],
            peak[(s_night, "use")],
            "MB",
            Target("ratio", "<=", 1.25),
            f"{small:,} rows",
        )
    )
    for night in audited[:2]:
        t.add(Row(f"peak RSS, {_night(night)}", peak[(night, "use")], peak[(night, "off")], "MB", None, "raw reference"))
    ref_s, ref_l = tables[f"ref-{small}"], tables[f"ref-{large}"]
    t.add(
        Row(
            f"profile size, {large:,} vs {small:,} rows",
            ref_l["profile_bytes"] / MB,
            ref_s["profile_bytes"] / MB,
            "MB",
            Target("ratio", "<=", 1.05),
            f"{small:,} rows",
        )
    )
    for n, ref in ((small, ref_s), (large, ref_l)):
        t.add(Row(f"profile size / reference parquet, {n:,} rows", ref["profile_bytes"] / MB, ref["bytes"] / MB, "MB", None, "parquet file"))
    agree = sum(best[(night, "use")]["verdict"] == best[(night, "off")]["verdict"] for night in audited) / len(audited)
    t.add(Row("nights with every column's severity the same against the profile (share)", agree, None, "", Target("value", ">=", 1.0)))
    t.add(Row(f"making the profile once, {large:,} rows", profile_seconds[str(large)], best[(l_night, "off")]["seconds"], "s", None, "one raw audit"))
    t.notes += [
        f"best of {opts.runs} run(s) (the two audits interleaved, each first every other run), peaks the highest; "
        f"peak RSS of the child above nothing (imports included: {best[(s_night, 'off')]['baseline_mb']:.0f} MB "
        "before the audit)",
        f"other processes' share of the CPUs before each pair: {', '.join(f'{x:.0%}' for x in loads)}",
        "raw = `nightly_drift(..., profile='off')`: both snapshots restored and read in one pass each; "
        "profile = `profile='use'`: the stored profile read from its verified chunks, then the current table",
        "each run's own ratio (the two audits of a night side by side): " + "; ".join(
            f"{_night(night)}: " + ", ".join(f"{u['seconds'] / o['seconds']:.2f}" for u, o in zip(results[(night, "use")], results[(night, "off")]))
            for night in audited
        ),
        "severities against the profile: " + ", ".join(f"{c} {s}" for c, s in best[(l_night, "use")]["verdict"].items()),
    ]
    for night in audited:
        if best[(night, "use")]["verdict"] != best[(night, "off")]["verdict"]:
            t.notes.append(f"{_night(night)}, raw reference: {json.dumps(best[(night, 'off')]['verdict'])}")
    return [t]
