"""Lineage tasks: register data snapshots, and validate data against contracts.

Each task is a thin wrapper over ``concord.lineage.data``, ``concord.lineage.contracts`` and
``concord.lineage.Lineage``: it opens the stores from their specs, calls the core, emits an event
and returns a plain, JSON-serialisable dict. Tasks that write lineage take ``tracking_uri``
(``None``: ``$MLFLOW_TRACKING_URI``, else the sqlite database in ``$CONCORD_HOME``) and check the
tracking backend first (:func:`checked_lineage`), so an unreachable server fails the task before
any store is touched. Model versions (register, promote, holders, lineage) are in
:mod:`concord_pipelines.tasks.models`.

Data snapshots and contracts are named the way a person types them: a data snapshot by its
64-hex id or its ref (``data/<name>``, ``data/<name>~1``), a contract as ``name@version``.

Events (a ``concord.contract.failed`` is what an automation pages on; every name is in
:mod:`concord_pipelines.tasks.events`): ``concord.data.registered``, ``concord.contract.validated``,
``concord.contract.failed``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prefect import task

from concord.lineage.client import shown_uri
from concord_pipelines.tasks import events
from concord_pipelines.tasks.common import RETRIED, open_stores
from concord_pipelines.tasks.progress import PrefectProgress, run_logger

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from concord.lineage import Lineage
    from concord.stores.base import Store


def checked_lineage(tracking_uri: str | None) -> Lineage:
    """The lineage backend, checked: :class:`~concord.errors.LineageUnreachableError` (a
    ``ConnectionError``, so retried) when the tracking server does not answer."""
    from concord.lineage import Lineage

    lineage = Lineage(tracking_uri)
    lineage.ensure_ready()
    return lineage


def data_snapshot_id(store: Store, spec: str) -> str:
    """A data snapshot's id from its id, or from its ref (``data/penguins``, ``data/penguins~1``)."""
    from concord.snapshots.refs import resolve_root

    return resolve_root(store, spec.strip())


# ----------------------------------------------------------------------------- data


@task(name="register-data", **RETRIED)
def register_data_task(
    source: str | os.PathLike | pd.DataFrame,
    store: str,
    name: str,
    tracking_uri: str | None = None,
) -> dict:
    """Snapshot the table ``source`` (a .parquet or .csv file, or a DataFrame) into ``store``
    under the ref ``data/<name>``, and log it to MLflow as a run input (experiment ``concord-data``).

    The tracking backend is checked first: an unreachable server fails before the store is
    touched. Emits ``concord.data.registered``. Safe to retry: the same bytes get the same id and
    leave the ref where it is (a retry may log a second MLflow run for them).
    """
    from concord.lineage.data import register_data

    lineage = checked_lineage(tracking_uri)
    with open_stores(store) as (s,):
        snap = register_data(source, s, name=name, progress=PrefectProgress())
        run_id = lineage.log_data_snapshot(snap, store=s)
    ref = f"data/{name}"
    shown = os.path.abspath(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else f"({type(source).__name__})"
    out = snap.to_dict() | {"ref": ref, "run_id": run_id, "source": shown, "tracking_uri": shown_uri(lineage.tracking_uri)}
    payload = {k: out[k] for k in ("id", "name", "format", "rows", "columns", "bytes", "digest", "store", "ref", "run_id")}
    out["event_id"] = events.emit(
        events.DATA_REGISTERED, events.data(snap.id, name), [events.store(s.uri, "store"), events.ref(ref)], payload
    )
    run_logger().info(
        "data %s: %s, %d rows x %d columns (%s) in %s; MLflow run %s",
        name, snap.id[:12], snap.rows, len(snap.columns), snap.format, s.uri, run_id,
    )
    return out


# ----------------------------------------------------------------------------- contracts


@task(name="validate-contract", **RETRIED)
def validate_contract_task(contract_store: str, contract_ref: str, data_store: str, data_id: str) -> dict:
    """Validate data snapshot ``data_id`` (its id or ``data/<name>``) of ``data_store`` against
    the contract ``contract_ref`` (``name@version``, or ``name`` for its latest version) saved in
    ``contract_store``, with great-expectations.

    Returns the report (``success`` is False when any expectation failed) rather than raising:
    the caller decides what a violation means. Emits ``concord.contract.validated`` or
    ``concord.contract.failed``.
    """
    from concord.lineage.contracts import load_contract, validate
    from concord.lineage.data import data_info, load_data

    with open_stores(contract_store, data_store) as (cs, ds):
        contract = load_contract(cs, contract_ref)
        snapshot_id = data_snapshot_id(ds, data_id)
        info = data_info(ds, snapshot_id)
        result = validate(contract, load_data(ds, snapshot_id))
    out = result.to_dict() | {
        "contract_digest": contract.digest(),
        "data_snapshot": snapshot_id,
        "data_name": info.name,
        "rows": info.rows,
        "contract_store": cs.uri,
        "data_store": ds.uri,
    }
    related = [events.data(snapshot_id, info.name, "data"), events.store(ds.uri, "data-store"), events.store(cs.uri, "contract-store")]
    payload = {k: out[k] for k in ("contract", "contract_digest", "success", "evaluated", "data_snapshot", "data_name", "data_store")}
    payload["failures"] = out["failures"][:events.PAYLOAD_ITEMS]
    payload["failure_count"] = len(out["failures"])
    name = events.CONTRACT_VALIDATED if result.success else events.CONTRACT_FAILED
    out["event_id"] = events.emit(name, events.contract(contract.ref), related, payload)
    log = run_logger()
    if result.success:
        log.info("data %s (%s) meets contract %s: %d expectation(s)", info.name, snapshot_id[:12], contract.ref, result.evaluated)
    else:
        log.error(
            "data %s (%s) violates contract %s: %d of %d expectation(s) failed",
            info.name, snapshot_id[:12], contract.ref, len(result.failures), result.evaluated,
        )
    return out
