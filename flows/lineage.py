"""Lineage pipelines: register a data snapshot, validate data against a contract, register a
model version with its data, contract and parents, and promote a version through the gate.

Lineage lives in MLflow: ``tracking_uri`` left empty means the worker's ``$MLFLOW_TRACKING_URI``,
else the embedded sqlite database in ``$CONCORD_HOME`` (default ``./data``). Store parameters take
a folder path, ``file:///path``, ``s3://bucket/prefix`` or ``block:NAME``; relative paths are
relative to the project folder deployments run in. Contracts are saved in a store of their own
(``data/registry`` on the embedded setup).
"""

from __future__ import annotations

from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import NAME_PATTERN, ModelName, RefName, StoreAddress
from concord_pipelines.flows._report import brief, cluster, human, md_facts, md_table, short
from concord_pipelines.flows.snapshot import DEFAULT_REF, DEFAULT_STORE
from concord_pipelines.tasks import (
    model_lineage_task,
    promote_task,
    record_replica_task,
    register_data_task,
    register_model_task,
    validate_contract_task,
)

DEFAULT_CONTRACTS = "data/registry"
DEFAULT_DATA = "data/penguins"
DEFAULT_CONTRACT = "penguins@1"
DEFAULT_MODEL = "minilm"

DataName = Annotated[
    str, Field(pattern=NAME_PATTERN, description="Name of the data set; its ref is data/NAME.")
]
ParentVersion = Annotated[str, Field(pattern=r"^[^/\s][^/]*/[1-9][0-9]*$", description="A model version, as name/VERSION.")]
Alias = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9_-]{1,255}$",
        description="The alias to move (letters, digits, '_' or '-'; not 'latest' or vNUMBER).",
    ),
]
Version = Annotated[int, Field(ge=1, description="The model version number.")]

#: the promotion gate, as a person reads it
GATE = (
    "the version records a data snapshot and a schema contract",
    "the contract is the one the version was registered with (same digest)",
    "the data snapshot meets the contract",
    "the contract is compatible with the contract of the version the alias points at now",
)


class ContractViolated(RuntimeError):
    """The data does not meet the contract (the failing expectations are in the run's artifacts)."""


# ----------------------------------------------------------------------------- data


@flow(name="register-data-snapshot", **ENDED_HOOKS)
def register_data_snapshot(
    source: str,
    store: StoreAddress = DEFAULT_STORE,
    name: DataName = "penguins",
    tracking_uri: str | None = None,
) -> dict:
    """Register a table as a data snapshot: snapshot it into a store and log it to MLflow.

    The snapshot's id is a hash of every byte of the table, so the same data always gets the
    same id; the ref `data/NAME` moves to it.

    Args:
        source: The table to register: a .parquet or .csv file.
        store: The store the data snapshot is written into.
        name: The data set's name; the ref `data/NAME` points at its latest snapshot.
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database).
    """
    r = register_data_task(source, store, name, tracking_uri=tracking_uri or None)
    rows = [
        ("id", f"`{r['id']}`"),
        ("rows", f"{r['rows']:,}"),
        ("columns", len(r["columns"])),
        ("format", f"{r['format']}, {human(r['bytes'])}"),
        ("digest (BLAKE3)", f"`{r['digest']}`"),
        ("ref", f"`{r['ref']}`"),
        ("MLflow run", f"`{r['run_id']}` in {r['tracking_uri']}"),
    ]
    schema = md_table(["column", "dtype"], list(r["schema"].items()))
    create_markdown_artifact(
        f"## Data snapshot `{r['name']}` in {cluster(r['store'])}\n\nfrom `{r['source']}`\n\n"
        + md_facts(rows)
        + f"\n\n### Schema\n\n{schema}",
        key="data-snapshot",
        description=f"data {r['name']}: {r['id'][:12]}, {r['rows']} rows",
    )
    return r


@flow(name="validate-contract", **ENDED_HOOKS)
def validate_contract(
    contract: str = DEFAULT_CONTRACT,
    contracts_store: StoreAddress = DEFAULT_CONTRACTS,
    data_snapshot: str = DEFAULT_DATA,
    data_store: StoreAddress = DEFAULT_STORE,
) -> dict:
    """Validate a data snapshot against a schema contract with great-expectations.

    The run fails when the data violates the contract, after listing every failing expectation
    in a table artifact.

    Args:
        contract: The contract, as name@VERSION (e.g. penguins@1), or a name for its latest version.
        contracts_store: The store the contracts are saved in.
        data_snapshot: The data snapshot: its 64-hex id, or its ref (data/NAME, data/NAME~1).
        data_store: The store holding the data snapshot.
    """
    r = validate_contract_task(contracts_store, contract, data_store, data_snapshot)
    if r["failures"]:  # no table of nothing: an empty one shows as a bare header in the UI
        create_table_artifact(
            # a table cell never wraps in the UI: the details in full are in the summary's list
            [{"expectation": f["expectation"], "column": f["column"] or "", "details": brief(f["details"])} for f in r["failures"]],
            key="contract-failures",
            description=f"{r['data_name']} {r['data_snapshot'][:12]} vs {r['contract']}: failing expectations",
        )
    verdict = "meets" if r["success"] else "**violates**"
    create_markdown_artifact(
        f"## Data `{r['data_name']}` {short(r['data_snapshot'])} {verdict} contract `{r['contract']}`\n\n"
        + md_table(
            ["expectations evaluated", "failed", "rows", "contract digest", "contracts store", "data store"],
            [(r["evaluated"], len(r["failures"]), f"{r['rows']:,}", short(r["contract_digest"]), cluster(r["contract_store"]), cluster(r["data_store"]))],
        )
        + "".join(f"\n- `{f['expectation']}`" + (f" on `{f['column']}`" if f["column"] else "") + f": {f['details']}" for f in r["failures"]),
        key="contract-validation",
        description=f"{r['contract']}: {'passed' if r['success'] else 'failed'}",
    )
    if not r["success"]:
        listed = "; ".join(
            f"{f['column'] or 'table'}: {f['expectation']}: {f['details']}" for f in r["failures"][:10]
        ) + (" ..." if len(r["failures"]) > 10 else "")
        raise ContractViolated(
            f"data {r['data_name']} ({r['data_snapshot']}) violates contract {r['contract']}: "
            f"{len(r['failures'])} of {r['evaluated']} expectation(s) failed ({listed}). "
            "Fix the data, or publish a new contract version that describes it."
        )
    return r


# ----------------------------------------------------------------------------- model versions


@flow(name="register-model-version", **ENDED_HOOKS)
def register_model_version(
    name: ModelName = DEFAULT_MODEL,
    store: StoreAddress = DEFAULT_STORE,
    ref: RefName = DEFAULT_REF,
    data_snapshot: str | None = DEFAULT_DATA,
    contract: str | None = DEFAULT_CONTRACT,
    parents: list[ParentVersion] | None = None,
    holders: list[StoreAddress] | None = None,
    data_store: StoreAddress | None = None,
    contracts_store: StoreAddress = DEFAULT_CONTRACTS,
    description: str = "",
    tracking_uri: str | None = None,
) -> dict:
    """Register a snapshot as a new model version in MLflow, with the data it was trained on,
    its schema contract and the versions it derives from. Nothing is copied: the version points
    at the snapshot's manifest in the store.

    Args:
        name: The registered model's name.
        store: The store holding the snapshot.
        ref: The snapshot: a ref, `ref~N` (N versions back) or a 64-hex root.
        data_snapshot: The data snapshot it was trained on: a 64-hex id or its ref (data/NAME);
            empty for none.
        contract: The data's schema contract as name@VERSION; empty for none.
        parents: The versions it derives from, as name/VERSION (e.g. minilm/1).
        holders: Other stores that hold the snapshot (other clusters, other tiers).
        data_store: The store holding the data snapshot; empty for `store`.
        contracts_store: The store the contracts are saved in.
        description: A note kept on the model version.
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database).
    """
    r = register_model_task(
        name,
        [store, *(holders or [])],
        ref,
        data_snapshot=data_snapshot or None,
        contract=contract or None,
        parents=list(parents or []),
        description=description,
        data_store=data_store or None,
        contracts_store=contracts_store,
        tracking_uri=tracking_uri or None,
    )
    summary = model_lineage_task(name, r["version"], tracking_uri=tracking_uri or None)
    rows = [
        ("snapshot", f"{short(r['root'])} in {cluster(r['store'])}"),
        ("source", f"`{r['source']}`"),
        ("held by", ", ".join(f"{cluster(h['store'])} ({h['tier']})" for h in r["held_by"])),
        ("data", f"{r['data_name']} {short(r['data_snapshot'])}" if r["data_snapshot"] else "(none)"),
        ("contract", f"`{r['contract']}` (digest {short(r['contract_digest'])})" if r["contract"] else "(none)"),
        ("parents", ", ".join(f"`{p}`" for p in r["parents"]) or "(none)"),
        ("dataset inputs", ", ".join(f"{i['name']} ({i['context']}, digest `{i['digest']}`)" for i in summary["inputs"]) or "(none)"),
        ("MLflow run", f"`{r['run_id']}` in {r['tracking_uri']}; its picture: `lineage/lineage.png`"),
    ]
    from concord.lineage.graph import to_table

    headers, versions = to_table(summary["graph"])
    create_markdown_artifact(
        f"## `{name}` version {r['version']}\n\n"
        + md_facts(rows)
        + f"\n\n### Lineage of `{name}`\n\n"
        + md_table(headers, [[f"`{row[0]}`", *row[1:]] for row in versions])
        + "\n",
        key="model-lineage",
        description=f"{name}/{r['version']}: {r['root'][:12]}",
    )
    return r


@flow(name="promote", **ENDED_HOOKS)
def promote_model(
    name: ModelName,
    version: Version,
    alias: Alias = "champion",
    data_store: StoreAddress = DEFAULT_STORE,
    contracts_store: StoreAddress = DEFAULT_CONTRACTS,
    tracking_uri: str | None = None,
) -> dict:
    """Move a model alias (champion, staging, ...) to a version, only if the promotion gate passes:
    the version records its data and contract, the data meets the contract, and the contract is
    compatible with that of the version the alias points at now.

    A refused promotion fails the run with every reason; the alias does not move.

    Args:
        name: The registered model's name.
        version: The version to promote.
        alias: The alias to point at it.
        data_store: The store holding the version's data snapshot.
        contracts_store: The store the contracts are saved in.
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database).
    """
    from concord.errors import PromotionRefused

    gate = "\n".join(f"{i}. {check}" for i, check in enumerate(GATE, 1))
    try:
        r = promote_task(name, version, alias, data_store, contracts_store, tracking_uri=tracking_uri or None)
    except PromotionRefused as exc:
        create_markdown_artifact(
            f"## Promotion of `{name}` version {version} to `{alias}` refused\n\nThe failed checks:\n\n"
            + "\n".join(f"{i}. {' '.join(str(reason).split())}" for i, reason in enumerate(exc.reasons, 1))
            + f"\n\nThe alias did not move.\n\n### The gate\n\n{gate}\n",
            key="promotion",
            description=f"{name}/{version} → {alias}: refused ({len(exc.reasons)} reason(s))",
        )
        raise
    previous = r["checks"].get("previous")
    create_markdown_artifact(
        f"## `{name}` version {r['version']} is now `{alias}`\n\n"
        f"Previously: {f'`{previous}`' if previous else '(no version)'}; promoted at {r['time']}.\n\n"
        "### Checks\n\n"
        + md_table(["check", "result", "details"], describe_checks(r["checks"]))
        + f"\n\n### The gate\n\n{gate}\n",
        key="promotion",
        description=f"{name}/{r['version']} → {alias}",
    )
    return r


def describe_checks(checks: dict) -> list[tuple[str, str, str]]:
    """``(check, result, details)`` rows for the checks a passed promotion gate reports."""
    contract, validation = checks.get("contract") or {}, checks.get("validation") or {}
    rows = [
        (
            "data snapshot and contract recorded",
            "passed",
            f"data {short(validation.get('data_snapshot'))}, contract `{contract.get('ref')}`",
        ),
        ("contract is the one registered", "passed", f"digest {short(contract.get('digest'))}"),
        ("data meets the contract", "passed", "; ".join(validation.get("failures") or []) or "every expectation met"),
    ]
    compat, previous = checks.get("compatibility"), checks.get("previous")
    if compat is not None:
        detail = f"`{compat['old'] or '(no contract)'}` → `{compat['new']}` (contract of {previous})"
        rows.append(("contract compatible with the current holder's", "passed", detail))
    elif previous:
        rows.append(("contract compatible with the current holder's", "not needed", f"{previous} already holds the alias"))
    else:
        rows.append(("contract compatible with the current holder's", "not needed", "no version holds the alias yet"))
    return rows


# ----------------------------------------------------------------------------- replicas


def record_holders(replicas: list[dict], tier: str = "hot") -> dict[str, list[str]]:
    """Inside a flow: record each replica (a ``replicate_task`` result) as a holder of the model
    versions registered with its root. Returns store → the ``name/version`` updated.

    Lineage is a record of the replication, never a condition for it: when the tracking server
    does not answer, or a record cannot be written, this logs a warning and goes on (no retry,
    so an unreachable server costs one health check).
    """
    from concord.errors import LineageUnreachableError

    log = get_run_logger()
    record = record_replica_task.with_options(retries=0)
    out: dict[str, list[str]] = {}
    for r in replicas:
        try:
            out[r["store"]] = record(r["root"], r["store"], tier)["updated"]
        except LineageUnreachableError as exc:
            log.warning("replicas not recorded in lineage: %s", exc)
            break
        except Exception as exc:  # a lineage problem must not fail the replication it describes
            log.warning("could not record %s as a holder of %s in lineage: %s", r["store"], r["root"][:12], exc)
    return out
