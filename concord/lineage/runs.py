"""MLflow runs: the one function that logs a run, and the runs of data snapshots.

:func:`log_run` writes one finished run: tags, parameters, metrics, text artifacts, files and a
description, in the experiment named (created on first use). The wings above log through it: an
audit (:mod:`concord.audit.tracking`), a restore drill (:mod:`concord.tiering.tracking`).

A data snapshot is logged as the input of a run (experiment ``concord-data``): an MLflow dataset
whose digest is the start of Concord's BLAKE3 digest (MLflow keeps at most 36 characters; the full
digest and the snapshot id are input tags), so MLflow's UI shows which data a version came from
(:func:`log_data_snapshot`; registration logs its run with :func:`log_dataset_run`).

mlflow is imported inside the functions that use it.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from concord.lineage.client import Tracking, retry_locked
from concord.lineage.tags import EXPERIMENT_DATA, TAG_DATA, TAG_DATA_NAME, TAG_DIGEST, TAG_NOTE, TAG_STORE

if TYPE_CHECKING:  # pragma: no cover
    from concord.lineage.data import DataSnapshot
    from concord.stores.base import Store

#: MLflow stores a dataset digest in a 36-character column
MLFLOW_DIGEST_CHARS = 36


# ---------------------------------------------------------------------- any run


def log_run(
    tracking: Tracking,
    *,
    experiment: str,
    run_name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    texts: Mapping[str, str] | None = None,
    files: Mapping[str, Iterable[str | os.PathLike]] | None = None,
    description: str | None = None,
) -> str:
    """Log one run in the experiment ``experiment`` (created on first use) and return its id.

    ``tags`` and ``params`` are logged as ``str(value)``; ``metrics`` as floats, at step 0 and one
    timestamp; ``texts`` maps an artifact's file name (``report.json``) to its text; ``files``
    maps an artifact folder (``"histograms"``; ``""`` for the run's top level) to the local files
    copied into it; ``description`` is the run's description (the ``mlflow.note.content`` tag),
    logged as given (MLflow refuses a tag value over 5000 characters: cut it to fit).

    The run ends FINISHED; when logging fails after it was created, it ends FAILED and the error
    is raised. An unreachable tracking server raises
    :class:`~concord.errors.LineageUnreachableError` before anything is written.
    """
    from mlflow.entities import Metric, Param

    experiment_id = tracking.experiment_id(experiment)
    client = tracking.client
    run_tags = {k: str(v) for k, v in (tags or {}).items()}
    if description is not None:
        run_tags[TAG_NOTE] = description
    run = retry_locked(client.create_run, experiment_id, run_name=run_name, tags=run_tags)
    run_id = run.info.run_id
    try:
        now = int(time.time() * 1000)
        logged_metrics = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items()]
        logged_params = [Param(k, str(v)) for k, v in (params or {}).items()]
        if logged_metrics or logged_params:
            retry_locked(client.log_batch, run_id, metrics=logged_metrics, params=logged_params)
        for folder, paths in (files or {}).items():
            for path in paths:
                client.log_artifact(run_id, os.fspath(path), folder or None)
        for name, text in (texts or {}).items():
            client.log_text(run_id, text, name)
    except Exception:
        with suppress(Exception):  # keep the original error, not a failure to close the run
            client.set_terminated(run_id, "FAILED")
        raise
    retry_locked(client.set_terminated, run_id, "FINISHED")
    return run_id


# ---------------------------------------------------------------------- data snapshots


def log_dataset_run(tracking: Tracking, experiment: str, run_name: str, run_tags: dict[str, str], dataset_inputs: list) -> str:
    """Create a run with ``dataset_inputs`` (left open: the caller ends it); return its id."""
    client = tracking.client
    run = retry_locked(client.create_run, tracking.experiment_id(experiment), run_name=run_name, tags=run_tags)
    run_id = run.info.run_id
    if dataset_inputs:
        retry_locked(client.log_inputs, run_id, datasets=dataset_inputs)
    return run_id


def dataset_input(snap: DataSnapshot, df, context: str):
    """An MLflow dataset input for ``snap`` (its table ``df``), tagged with Concord's id and digest."""
    import mlflow.data
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    digest = snap.digest[:MLFLOW_DIGEST_CHARS]
    with warnings.catch_warnings():  # hints about model signatures and ambiguous local sources
        warnings.simplefilter("ignore", UserWarning)
        dataset = mlflow.data.from_pandas(df, source=_data_source_uri(snap), name=snap.name, digest=digest)
        entity = dataset._to_mlflow_entity()  # computes the schema and profile
    tags = [
        InputTag(key=MLFLOW_DATASET_CONTEXT, value=context),
        InputTag(key=TAG_DATA, value=snap.id),
        InputTag(key=TAG_DIGEST, value=snap.digest),
    ]
    return DatasetInput(dataset=entity, tags=tags)


def log_data_snapshot(tracking: Tracking, snap: DataSnapshot, df=None, *, store: Store | None = None) -> str:
    """Log ``snap`` as the input of a run in experiment ``concord-data``; return the run id.

    Without ``df`` the table is loaded from ``store`` (default: the store ``snap`` names).
    """
    tracking.ensure_ready()
    if df is None:
        from concord.lineage.data import load_data
        from concord.stores import open_store

        df = load_data(store or open_store(snap.store, create=False), snap.id)
    tags = {TAG_DATA: snap.id, TAG_DIGEST: snap.digest, TAG_DATA_NAME: snap.name, TAG_STORE: snap.store}
    run_id = log_dataset_run(tracking, EXPERIMENT_DATA, f"data {snap.name}", tags, [dataset_input(snap, df, "snapshot")])
    retry_locked(tracking.client.set_terminated, run_id)
    return run_id


def _data_source_uri(snap: DataSnapshot) -> str:
    """Where the data snapshot's manifest lives (MLflow records dataset sources without checking them)."""
    from concord.stores.address import FOLDER, StoreAddress

    address = StoreAddress.parse(snap.store, check=False)
    if address.kind == FOLDER and not address.scheme:  # a folder's path: as a file:// URI
        return (Path(os.path.realpath(address.path)) / "manifests" / f"{snap.id}.json").as_uri()
    return f"{snap.store.rstrip('/')}/manifests/{snap.id}.json"
