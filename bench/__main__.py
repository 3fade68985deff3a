"""Run the benchmarks and print one table per benchmark: ``python -m bench [BENCHMARK ...]``, each BENCHMARK
one of snapshot, sync, diff, lora, tier, drift, drift-power, verify, audit-memory, drift-profile,
oci, compress, trust, checkout, lineage, formats, s3-scale, fanout, scale, scale-memory, finetune."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from bench.common import DEFAULT_OUT, Options, Table, machine_summary, parse_size
from bench.scale_bench import OPERATIONS as SCALE_OPERATIONS

BENCHMARKS = (
    "snapshot", "sync", "diff", "lora", "tier", "drift", "drift-power", "verify", "audit-memory", "drift-profile", "oci",
    "compress", "trust", "checkout", "lineage", "formats", "s3-scale", "fanout", "scale", "scale-memory", "finetune",
)
DEFAULT_SIZE_GB = 2.1
QUICK_SIZE_GB = 0.1
#: benchmarks whose checkpoint defaults to another size (when neither --size-gb nor --quick is given)
SIZE_GB_OF = {"tier": 1.1, "audit-memory": 0.5, "formats": 0.25}


def parse_args(argv: list[str] | None) -> tuple[list[str], Options, dict[str, Options]]:
    """The benchmarks to run, the options, and the options of those whose default size differs."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("which", nargs="*", metavar="{" + ",".join(BENCHMARKS) + "}", help="benchmarks to run (default: all)")
    p.add_argument(
        "--size-gb",
        type=float,
        default=None,
        help="checkpoint size in GB of 10^9 bytes (default 2.1, tier 1.1, formats 0.25; audit-memory: each CSV file, default 0.5; 0.1 with --quick)",
    )
    p.add_argument(
        "--files", type=int, default=None, metavar="N",
        help="scale: files in the folder (default 20000; 500 with --quick); scale-memory: the larger folder (default 100000; 5000 with --quick)",
    )
    p.add_argument("--size", default=None, metavar="BYTES", help="scale: bytes of each file, e.g. 50k, 64ki, 1m (default 50k; scale-memory: 4096)")
    p.add_argument(
        "--only", default=None, metavar="OPS",
        help="scale: time only these operations, comma-separated, each with its baselines: " + ", ".join(SCALE_OPERATIONS),
    )
    p.add_argument("--quick", action="store_true", help="small sizes and one run each: a smoke run in seconds")
    p.add_argument(
        "--runs", type=int, default=None, help="timed runs per measurement, best kept (default 3; 1 with --quick)"
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where generated data and scratch stores go (default bench/out)"
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each timed round, wait up to this long for other processes to leave the CPUs idle (default 0)",
    )
    a = p.parse_args(argv)
    size = a.size_gb if a.size_gb is not None else (QUICK_SIZE_GB if a.quick else DEFAULT_SIZE_GB)
    runs = a.runs if a.runs is not None else (1 if a.quick else 3)
    unknown = [w for w in a.which if w not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark {unknown[0]!r}: choose from {', '.join(BENCHMARKS)}")
    if size <= 0 or runs < 1:
        p.error("--size-gb must be positive and --runs at least 1")
    try:
        file_size = parse_size(a.size) if a.size is not None else None
    except ValueError:
        p.error(f"--size {a.size!r} is not a size: give bytes, e.g. 50000, 50k, 64ki or 1m")
    if (a.files is not None and a.files < 1) or (file_size is not None and file_size < 1):
        p.error("--files and --size must be positive")
    only = tuple(dict.fromkeys(o.strip() for o in a.only.split(",") if o.strip())) if a.only is not None else ()
    if a.only is not None and (not only or any(o not in SCALE_OPERATIONS for o in only)):
        p.error(f"--only {a.only!r}: name operations from {', '.join(SCALE_OPERATIONS)}")
    opts = Options(a.out.resolve(), size, runs, a.quick, max(0.0, a.wait_idle), a.files, file_size, only)
    own = {} if a.size_gb is not None or a.quick else {b: replace(opts, size_gb=gb) for b, gb in SIZE_GB_OF.items()}
    return list(dict.fromkeys(a.which or BENCHMARKS)), opts, own


def main(argv: list[str] | None = None) -> int:
    which, opts, own = parse_args(argv)
    os.environ.setdefault("CONCORD_NO_PROGRESS", "1")
    opts.out.mkdir(parents=True, exist_ok=True)
    print(f"# Concord benchmarks ({', '.join(which)})\n\n{machine_summary()}; data in {opts.out}\n", flush=True)
    tables: list[Table] = []
    for name in which:
        module = __import__(f"bench.{name.replace('-', '_')}_bench", fromlist=["run"])
        print(f"running {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        for table in module.run(own.get(name, opts)):
            tables.append(table)
            print(table.render() + "\n", flush=True)
        print(f"{name} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    missed = [(t.title.split(":")[0], r.metric) for t in tables for r in t.rows if r.met is False]
    met = sum(1 for t in tables for r in t.rows if r.met)
    print(f"targets met: {met}, missed: {len(missed)}" + "".join(f"\n- missed: {b}: {m}" for b, m in missed))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    report = opts.out / "last-results.md"
    report.write_text(
        f"# Concord benchmarks, {stamp}\n\n{machine_summary()}\n\n" + "\n\n".join(t.render() for t in tables) + "\n"
    )
    print(f"(tables also written to {report})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
