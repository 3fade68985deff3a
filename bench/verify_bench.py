"""Verify benchmark: verify-store's hashing fanned out in batches, on Prefect's thread pool and
on Dask, against one in-process verify.

Setup (untimed): the LLaMA-shaped checkpoint (``ensure_checkpoint``; 2.1 GB by default, 0.1 GB
with ``--quick``) is snapshotted into a local store in the work folder, in 4 MiB chunks, and read
once so the store's chunks sit in the page cache.

Timed, in interleaved rounds, each a whole-store verify of that store:
- the baseline: ``concord.snapshots.verify.verify`` called once (one pass on the store's threads, no
  orchestration): what verify-store did in a single task before the fan-out;
- verify-store on threads (``CONCORD_TASK_RUNNER=threads``): batches of 256 MiB, two in flight;
- verify-store on a Dask cluster started for each run (``CONCORD_TASK_RUNNER=dask``, one worker
  process per core), the cluster's start and stop included;
- verify-store on a Dask scheduler already running (``CONCORD_TASK_RUNNER=tcp://…``, a local
  cluster of one worker process per core started once by the benchmark), as machines sharing a
  scheduler would use it.

The flows run against a temporary Prefect server (Prefect's test harness: SQLite in a temporary
folder), whose address the Dask worker processes inherit. Every run must check every chunk and
find nothing wrong, or the benchmark raises.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from bench.common import (
    GB,
    Case,
    Options,
    Row,
    Table,
    ensure_checkpoint,
    fresh_dir,
    log,
    race,
    remove,
    times_note,
    warm,
)

BATCH_MIB = 256


@contextmanager
def _prefect_server() -> Iterator[None]:
    """A temporary Prefect server, its address also in ``os.environ`` for the processes started
    meanwhile (Dask workers), so that every task run reports to it."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    saved = os.environ.get("PREFECT_API_URL")
    with prefect_test_harness(server_startup_timeout=120):
        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = saved


def run(opts: Options) -> list[Table]:
    from distributed import LocalCluster

    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.verify import verify
    from concord.stores import LocalDirStore
    from concord_pipelines.flows._runner import task_runner
    from concord_pipelines.flows.verify import verify_store

    ckpt = ensure_checkpoint(opts.data_dir, opts.size_gb)
    work = fresh_dir(opts.work_dir / "verify")
    store_dir = work / "store"
    snap = snapshot(ckpt.file, LocalDirStore(store_dir), chunk_size=DEFAULT_CHUNK_SIZE)
    secs = sum(warm(p) for p in (store_dir / "chunks").rglob("*") if p.is_file())
    log(f"store of {snap.chunks} chunks read into the page cache in {secs:.2f} s")
    cores = os.cpu_count() or 1

    def flow_on(env: dict[str, str]):
        flow = verify_store.with_options(task_runner=task_runner(env))
        return lambda: flow(str(store_dir), batch_mib=BATCH_MIB)

    try:
        with _prefect_server(), LocalCluster(n_workers=cores, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as scheduler:
            cases = race(
                opts.runs,
                Case("one verify call", lambda: verify(LocalDirStore(store_dir)).to_dict()),
                Case("verify-store, threads", flow_on({"CONCORD_TASK_RUNNER": "threads"})),
                Case("verify-store, Dask per run", flow_on({"CONCORD_TASK_RUNNER": "dask", "CONCORD_DASK_WORKERS": str(cores)})),
                Case("verify-store, Dask scheduler", flow_on({"CONCORD_TASK_RUNNER": scheduler.scheduler_address})),
                wait_idle=opts.wait_idle,
            )
    finally:
        remove(work)
    one, threads, per_run, shared = cases
    expected = one.result["chunks_checked"]
    for c in cases:
        r = c.result
        if not r["ok"] or r["missing"] or r["corrupt"] or r["chunks_checked"] != expected:
            raise RuntimeError(f"{c.label} checked {r['chunks_checked']} of {expected} distinct chunks and found {r}")

    size = snap.bytes / GB
    table = Table(
        f"verify: the store of a {size:.2f} GB checkpoint ({expected} distinct chunks of 4 MiB), batches of {BATCH_MIB} MiB, "
        f"{cores} core(s), best of {opts.runs}"
    )
    table.add(Row("verify-store on threads", threads.best, one.best, "s", None, "one verify call"))
    table.add(Row("verify-store on a Dask cluster started per run", per_run.best, one.best, "s", None, "one verify call"))
    table.add(Row("verify-store on a running Dask scheduler", shared.best, one.best, "s", None, "one verify call"))
    table.notes += [
        f"throughput: one call {size / one.best:.2f} GB/s, threads {size / threads.best:.2f} GB/s, "
        f"Dask per run {size / per_run.best:.2f} GB/s, Dask scheduler {size / shared.best:.2f} GB/s",
        "the flows' times include the flow run itself (API calls, artifacts, the event); the Dask rows "
        "add pickling each batch to a worker process, and the per-run row the cluster's start and stop. "
        "On one machine Dask has no more cores to give: its gain is the cores of other machines. The "
        "Dask workers' CPU time counts as other processes' in the shares below",
        times_note(cases),
    ]
    return [table]
