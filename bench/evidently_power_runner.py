"""Evidently's DataDriftPreset verdict on many reference/current pairs; run by the drift-power benchmark in Evidently's own venv.

Evidently does not import with pandas 3, so this script runs in a separate environment (pandas<3)
and imports nothing from Concord::

    python bench/evidently_power_runner.py JOBS.json

``JOBS.json`` is a list of ``{"key", "reference", "current"}``: two parquet files whose columns are
the pairs (column ``p3`` of the reference against column ``p3`` of the current file). Each job is
one ``Report([DataDriftPreset()])`` over all its columns; Evidently tests each column on its own,
so that equals one report per pair. One JSON line per job::

    {"key", "columns", "drifted", "methods", "cpu_seconds", "seconds"}

``cpu_seconds`` is the process's CPU time over the report (loading excluded).
"""

from __future__ import annotations

import json
import sys
import time

from evidently_runner import _report_new, _report_old, read_rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        jobs = json.load(f)
    try:
        from evidently import Report  # noqa: F401

        run = _report_new
    except ImportError:
        run = _report_old
    for job in jobs:
        current = read_rows(job["current"], None)
        reference = read_rows(job["reference"], None)[list(current.columns)]
        cpu0, t0 = time.process_time(), time.perf_counter()
        _, drifted, _, methods, _ = run(reference, current)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        line = {"key": job["key"], "columns": list(reference.columns), "drifted": drifted, "methods": methods, "cpu_seconds": cpu, "seconds": wall}
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
