"""Time Evidently's DataDriftPreset on two parquet files; run by the drift benchmark in Evidently's own venv.

Evidently does not import with pandas 3, so this script runs in a separate environment (pandas<3)
and imports nothing from Concord::

    python bench/evidently_runner.py REFERENCE.parquet CURRENT.parquet [--rows N] [--handshake]

It reads the first ``N`` rows (default: all) of both files into pandas DataFrames, then times one
``Report([DataDriftPreset()]).run(...)`` on them: the report's computation alone, loading
excluded. It prints one JSON line::

    {"seconds", "cpu_seconds", "peak_rss_mb", "rows", "columns", "evidently_version", "pandas_version",
     "drifted_columns", "scores", "methods", "thresholds", "api", "load_seconds",
     "imported_anon_kb", "loaded_anon_kb", "after_anon_kb"}

``seconds`` is the wall time of ``run``; ``cpu_seconds`` the process's CPU time over ``run`` and
the reading of its result. ``drifted_columns`` are those whose per-column drift test fails;
``scores`` each column's drift score with the ``methods`` and ``thresholds`` Evidently picked (for
numeric columns of more than 1,000 rows, the Wasserstein distance normed by the reference's
standard deviation, drift at 0.1 or more). ``peak_rss_mb`` is the process's peak resident memory
(``ru_maxrss``, imports and data included).

With ``--handshake`` the script follows the memory probe's protocol: once the data is loaded it
prints ``READY <RssAnon kB>`` and waits for a line on stdin before timing, so a parent process
polling its memory sees the report's own peak above the loaded data.

Both Evidently APIs are supported: 0.7 and later (``evidently.Report``, ``evidently.presets``,
``run(current, reference)``) and the older one (``evidently.report.Report``,
``evidently.metric_preset``, ``run(reference_data=, current_data=)``).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time


def _anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def read_rows(path: str, rows: int | None):
    """The first ``rows`` rows of a parquet file of numeric columns (all rows if None) as a pandas
    DataFrame, reading only the row groups needed.

    Column by column into arrays numpy owns, with Arrow's buffers freed and handed back after each:
    the process then holds the DataFrame and little else (``Table.to_pandas`` keeps as much again
    in Arrow's memory pool)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    groups, have = [], 0
    for i in range(f.num_row_groups):
        if rows is not None and have >= rows:
            break
        groups.append(i)
        have += f.metadata.row_group(i).num_rows
    if rows is not None and have < rows:
        raise SystemExit(f"{path} has {have} rows, fewer than the {rows} asked for")
    columns = {}
    for name in f.schema_arrow.names:
        column = f.read_row_groups(groups, columns=[name], use_threads=False).column(0)
        if rows is not None:
            column = column.slice(0, rows)
        columns[name] = np.concatenate([chunk.to_numpy(zero_copy_only=False) for chunk in column.chunks])
        del column
        pa.default_memory_pool().release_unused()
    return pd.DataFrame(columns, copy=False)


def _report_new(reference, current):
    """Evidently 0.7 and later: returns (seconds, drifted, scores, methods, thresholds)."""
    from evidently import Report
    from evidently.presets import DataDriftPreset

    report = Report([DataDriftPreset()], include_tests=True)
    t0 = time.perf_counter()
    snapshot = report.run(current, reference)
    seconds = time.perf_counter() - t0
    doc = snapshot.dict()
    scores, methods, thresholds = {}, {}, {}
    for m in doc.get("metrics", []):
        params = m.get("config", {})
        if params.get("type", "").endswith(":ValueDrift"):
            col = params["column"]
            scores[col] = float(m["value"])
            methods[col] = params.get("method")
            thresholds[col] = params.get("threshold")
    failed = set()
    tested = set()
    for t in doc.get("tests", []):
        params = t.get("metric_config", {}).get("params", {})
        if params.get("type", "").endswith(":ValueDrift"):
            tested.add(params["column"])
            if t.get("status") == "FAIL":
                failed.add(params["column"])
    if tested != set(scores):
        raise SystemExit(f"the report tested columns {sorted(tested)} but scored {sorted(scores)}")
    drifted = [c for c in reference.columns if c in failed]
    counts = [m["value"] for m in doc["metrics"] if m.get("config", {}).get("type", "").endswith(":DriftedColumnsCount")]
    if counts and int(round(counts[0]["count"])) != len(drifted):
        raise SystemExit(f"the report counts {counts[0]['count']} drifted columns but its tests fail {len(drifted)}")
    return seconds, drifted, scores, methods, thresholds


def _report_old(reference, current):
    """Evidently before 0.7: returns (seconds, drifted, scores, methods, thresholds)."""
    from evidently.metric_preset import DataDriftPreset
    from evidently.report import Report

    report = Report(metrics=[DataDriftPreset()])
    t0 = time.perf_counter()
    report.run(reference_data=reference, current_data=current)
    seconds = time.perf_counter() - t0
    by_column = None
    for m in report.as_dict()["metrics"]:
        result = m.get("result", {})
        if "drift_by_columns" in result:
            by_column = result["drift_by_columns"]
            break
    if by_column is None:
        raise SystemExit("the report has no per-column drift results (drift_by_columns)")
    drifted = [c for c in reference.columns if by_column[c]["drift_detected"]]
    scores = {c: float(v["drift_score"]) for c, v in by_column.items()}
    methods = {c: v.get("stattest_name") for c, v in by_column.items()}
    thresholds = {c: v.get("stattest_threshold") for c, v in by_column.items()}
    return seconds, drifted, scores, methods, thresholds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference")
    p.add_argument("current")
    p.add_argument("--rows", type=int, default=None, help="read only the first N rows of each file")
    p.add_argument("--handshake", action="store_true", help="print READY <RssAnon kB> once loaded, wait for stdin")
    a = p.parse_args(argv)

    import evidently
    import pandas as pd

    try:
        from evidently import Report  # noqa: F401
        from evidently.presets import DataDriftPreset  # noqa: F401

        run, api = _report_new, "evidently.Report + evidently.presets.DataDriftPreset"
    except ImportError:
        run, api = _report_old, "evidently.report.Report + evidently.metric_preset.DataDriftPreset"

    gc.collect()
    imported = _anon_kb()
    t0 = time.perf_counter()
    reference = read_rows(a.reference, a.rows)
    current = read_rows(a.current, a.rows)
    load_seconds = time.perf_counter() - t0
    gc.collect()
    loaded = _anon_kb()
    if a.handshake:
        print(f"READY {loaded}", flush=True)
        sys.stdin.readline()

    cpu0 = time.process_time()
    seconds, drifted, scores, methods, thresholds = run(reference, current)
    cpu_seconds = time.process_time() - cpu0
    after_anon = _anon_kb()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
                "rows": len(reference),
                "columns": reference.shape[1],
                "evidently_version": evidently.__version__,
                "pandas_version": pd.__version__,
                "api": api,
                "drifted_columns": drifted,
                "scores": scores,
                "methods": methods,
                "thresholds": thresholds,
                "load_seconds": load_seconds,
                "imported_anon_kb": imported,
                "loaded_anon_kb": loaded,
                "after_anon_kb": after_anon,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
