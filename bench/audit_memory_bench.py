"""Audit memory benchmark: ``concord audit data REFERENCE CURRENT`` on two large CSV files.

Data (generated once with numpy, fixed seed, written block by block with pyarrow, cached under
``data/``): a reference and a current CSV file of 16 float columns, each about ``--size-gb`` GB
(default 0.5 GB each, 0.1 GB with ``--quick``; ``--size-gb 2`` for the 2 GB case). Column ``cNN``
is normal with mean ``NN`` and standard deviation ``1 + NN/8``, rounded to 6 decimals; in the
current file ``c00`` … ``c03`` have their mean shifted by 0.5σ, 1σ, 1.5σ, 2σ, ``c04`` has its
standard deviation doubled, and the rest are unchanged.

Measured, each in a child process polled from here (``probe_memory``: RSS, file pages included, so
a memory-mapped or buffered read counts too):

- the whole-table audit, as ``concord audit data`` ran before streaming: both files read whole
  with ``concord.lineage.data.read_table`` (``pandas.read_csv``), then ``data_drift`` on the two frames;
- the streamed audit, as ``concord audit data`` runs now: ``concord.audit.report.audit_data`` reads the
  reference in blocks (bin edges, category counts, a bounded sample per column), then the current
  file in one pass.

Rows: peak RSS of each (the whole-table audit is the baseline; the target is a peak of at most
512 MB for the streamed audit), wall time (the streamed audit must not be slower: ratio ≤ 1), and
whether both give the same verdict.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench.common import (
    DATA_FORMAT,
    GB,
    MB,
    Options,
    Row,
    Table,
    Target,
    log,
    probe_memory,
    read_json,
    remove,
    write_json_atomic,
)

COLUMNS = 16
SEED = 20_260_707
#: each file's size in GB when neither --size-gb nor --quick is given
DEFAULT_GB = 0.5
#: the peak RSS the streamed audit must stay under, whatever the size
PEAK_TARGET_MB = 512
#: rows generated and written per block
BLOCK_ROWS = 200_000
#: c00 … c03: mean shifted by this many σ in current; c04: σ doubled
MEAN_SHIFTS = (0.5, 1.0, 1.5, 2.0)
SCALE_COLUMN, SCALE = len(MEAN_SHIFTS), 2.0


def column_names() -> list[str]:
    return [f"c{j:02d}" for j in range(COLUMNS)]


def _block(side: int, index: int, rows: int):
    import numpy as np
    import pyarrow as pa

    arrays = {}
    for j, name in enumerate(column_names()):
        sigma = 1.0 + j / 8
        shift = MEAN_SHIFTS[j] if j < len(MEAN_SHIFTS) and side else 0.0
        scale = SCALE if j == SCALE_COLUMN and side else 1.0
        x = np.random.default_rng([SEED, side, j, index]).standard_normal(rows)
        x *= sigma * scale
        x += j + shift * sigma
        arrays[name] = np.round(x, 6)
    return pa.table(arrays)


def ensure_csv(data_dir: Path, size_gb: float) -> tuple[Path, Path]:
    """The reference and current CSV files of about ``size_gb`` GB each, reused while their sidecar matches."""
    import pyarrow.csv as pcsv

    folder = data_dir / f"audit-memory-{size_gb:g}gb"
    sidecar = data_dir / f"{folder.name}.json"
    paths = (folder / "reference.csv", folder / "current.csv")
    params = {"format": DATA_FORMAT, "size_gb": size_gb, "columns": COLUMNS, "seed": SEED, "block": BLOCK_ROWS}
    found = read_json(sidecar)
    if found and found.get("params") == params and all(
        p.is_file() and p.stat().st_size == found.get("sizes", {}).get(p.name) for p in paths
    ):
        log(f"reusing {folder}")
        return paths
    log(f"generating {folder}: two CSV files of {size_gb:g} GB, {COLUMNS} float columns")
    remove(sidecar)
    remove(folder)
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    for side, path in enumerate(paths):
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            index = 0
            while f.tell() < size_gb * GB:
                pcsv.write_csv(_block(side, index, BLOCK_ROWS), f, pcsv.WriteOptions(include_header=index == 0))
                index += 1
        os.replace(tmp, path)
    write_json_atomic(sidecar, {"params": params, "sizes": {p.name: p.stat().st_size for p in paths}})
    log(f"generated in {time.perf_counter() - t0:.1f} s")
    return paths


# --------------------------------------------------------------------------- the children

#: the child: imports what the audit needs, says READY, waits, audits, prints one JSON line
CHILD = """
import json, sys, time
from bench.audit_memory_bench import child
child(sys.argv[1], sys.argv[2], sys.argv[3])
"""


def child(how: str, reference: str, current: str) -> None:
    import numpy as np  # noqa: F401  (imported before the baseline, like the CLI does before reading)
    import pandas as pd  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import scipy.stats  # noqa: F401

    from bench.common import status_kb

    print(f"READY {status_kb(os.getpid(), ('VmRSS',))['VmRSS']}", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    if how == "whole":
        from concord.audit.drift import data_drift
        from concord.lineage.data import read_table

        report = data_drift(read_table(reference), read_table(current))
    else:
        from concord.audit.report import audit_data

        report = audit_data(reference, current).drift
    seconds = time.perf_counter() - t0
    verdict = {c.column: c.severity for c in report.columns}
    print(json.dumps({"seconds": seconds, "verdict": verdict, "rows": [report.rows_reference, report.rows_current]}), flush=True)


def measure(how: str, reference: Path, current: Path) -> dict:
    peak, baseline, result, samples = probe_memory(CHILD, [how, str(reference), str(current)], ("VmRSS",))
    result.update(peak_mb=peak["VmRSS"] * 1024 / MB, baseline_mb=baseline * 1024 / MB, samples=samples)
    log(f"{how}: {result['seconds']:.1f} s, peak RSS {result['peak_mb']:.0f} MB")
    return result


def run(opts: Options) -> list[Table]:
    reference, current = ensure_csv(opts.data_dir, opts.size_gb)
    runs: dict[str, list[dict]] = {"whole": [], "streamed": []}
    for _ in range(opts.runs):
        for how in runs:  # interleaved, so a busy machine slows both alike
            runs[how].append(measure(how, reference, current))
    whole = min(runs["whole"], key=lambda r: r["seconds"])
    streamed = min(runs["streamed"], key=lambda r: r["seconds"])
    peak_whole = max(r["peak_mb"] for r in runs["whole"])
    peak_streamed = max(r["peak_mb"] for r in runs["streamed"])
    size = sum(p.stat().st_size for p in (reference, current)) / GB
    t = Table(f"audit-memory: `concord audit data` on two CSV files of {size / 2:.2f} GB, {COLUMNS} float columns")
    t.add(Row("peak RSS", peak_streamed, peak_whole, "MB", Target("value", "<=", PEAK_TARGET_MB), "whole table"))
    t.add(Row("wall time", streamed["seconds"], whole["seconds"], "s", Target("ratio", "<=", 1.0), "whole table"))
    same = whole["verdict"] == streamed["verdict"] and whole["rows"] == streamed["rows"]
    t.add(Row("same verdict per column (1 = yes)", float(same), None, "", Target("value", ">=", 1.0)))
    t.notes += [
        f"rows per file: {whole['rows'][0]:,} reference, {whole['rows'][1]:,} current; best of {opts.runs} run(s), peaks the highest",
        "peak RSS of the child process above nothing (imports included: "
        f"{whole['baseline_mb']:.0f} MB before reading); whole table = `read_table` both files, then `data_drift`",
        "streamed = `concord.audit.report.audit_data`, what `concord audit data` runs",
        "verdicts: " + ", ".join(f"{c} {s}" for c, s in streamed["verdict"].items() if s != "ok"),
    ]
    if not same:
        t.notes.append(f"whole-table verdict: {json.dumps(whole['verdict'])}")
    return [t]
