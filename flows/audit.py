"""The nightly drift audit: has anything drifted that should not have?

One run audits up to four things and gives one verdict (ok, warning = P1, critical = P0):

* the current data against its reference, column by column, with the previous nights' severities
  so that a warning lasting ``escalate_after_nights`` nights becomes critical;
* the current data against its schema contract;
* a model version's weights on every cluster (Merkle roots, then tensors in ULPs);
* its model cards across clusters.

It writes the report (markdown artifact ``drift-report``: the verdict first, each drifted column's
histogram overlay drawn in it), the per-column table (table artifact ``drift-columns``), the
overlays as PNGs, an MLflow run in the
experiment ``concord-drift-audits`` (metrics, thresholds, the PNGs, the report as JSON and
markdown), and the event ``concord.drift.detected`` (or ``concord.drift.audited`` when all is
well) for automations to notify on. Then, by default, the run fails when the verdict is critical,
so a P0 night is red in the UI. MLflow being down never loses the report: a warning, and the
artifacts are still written. A section that cannot be audited (a store that does not answer) is
reported as such and counts as critical.

Store parameters take a folder path, ``file:///path``, ``s3://bucket/prefix`` or ``block:NAME``;
relative paths are relative to the project folder deployments run in.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, ConfigDict, Field, model_validator

from concord.audit.history import night_of
from concord.audit.inputs import audit_name, spec_name
from concord.audit.render import (
    COLUMN_SUMMARY,
    REPLICA_SUMMARY,
    WORST_TENSOR_SUMMARY,
    column_rows,
    render_markdown,
    replica_rows,
    worst_tensor_rows,
)
from concord.audit.report import AuditReport
from concord.audit.tracking import audit_params, run_markdown
from concord.home import default_registry
from concord_pipelines.flows._ended import ENDED_HOOKS
from concord_pipelines.flows._params import NAME_PATTERN, ModelName, StoreAddress
from concord_pipelines.flows._report import cluster, events_line
from concord_pipelines.tasks.audit import (
    AUDIT_EXPERIMENT,
    audit_cards_task,
    audit_contract_task,
    audit_event_task,
    audit_replicas_task,
    data_drift_task,
    log_audit_task,
    model_holders_task,
)

DataSpec = Annotated[
    str,
    Field(min_length=1, description="A .parquet or .csv file, a data snapshot id (64 hex), or data/NAME in the data store."),
]
ContractRef = Annotated[
    str, Field(min_length=1, description="The schema contract: name@version, name (its latest version) or a .json file.")
]
AuditName = Annotated[
    str,
    Field(
        pattern=NAME_PATTERN,
        description="The audit's name: its nightly history, event resource and MLflow runs are keyed by it.",
    ),
]


class Thresholds(BaseModel):
    """When a column counts as drifted, and when a lasting warning escalates (frozen: the flow's
    default is one shared instance)."""

    model_config = ConfigDict(frozen=True)

    psi_warning: float = Field(0.25, gt=0, description="PSI above this: warning (P1).")
    psi_critical: float = Field(0.55, gt=0, description="PSI above this: critical (P0). Above psi_warning.")
    escalate_after_nights: int = Field(
        2, ge=1, le=60, description="A warning on this many consecutive nights, tonight included, becomes critical."
    )
    alpha: float = Field(
        0.005, gt=0, lt=1, description="A column drifts only if its p-value, adjusted over the columns (Benjamini–Hochberg), is below this."
    )
    floor: float = Field(
        0.05, ge=0, description="Numeric columns: the smallest change that matters, as Wasserstein distance in reference standard deviations."
    )
    share_floor: float = Field(
        0.005, ge=0, le=1, description="Categorical columns: the smallest share of the mass moved between categories that matters."
    )
    floors: dict[str, float] = Field(
        default_factory=dict, description="Per-column floors (column name → floor in that column's unit), overriding the two above."
    )
    null_share_change: float = Field(0.10, gt=0, le=1, description="A change of null share above this is at least a warning.")

    @model_validator(mode="after")
    def _ordered(self) -> Thresholds:
        if self.psi_critical <= self.psi_warning:
            raise ValueError(f"psi_warning ({self.psi_warning}) must be below psi_critical ({self.psi_critical})")
        return self


class AuditFailed(RuntimeError):
    """The audit's verdict reached the run's failure level. The report is in the run's artifacts,
    and in ``report`` (the dict the run would have returned)."""

    def __init__(self, message: str, report: dict | None = None) -> None:
        super().__init__(message)
        self.report = report or {}

    def __reduce__(self):
        return (type(self), (str(self), self.report))


def _outcome(task, *args, **kwargs) -> tuple[dict | None, str | None]:
    """Run a section's task: ``(result, None)``, or ``(None, why)`` when it failed for good."""
    state = task(*args, return_state=True, **kwargs)
    if state.is_completed():
        return state.result(), None
    try:
        state.result()
    except Exception as exc:  # the section is reported as not audited; the others go on
        return None, " ".join(f"{type(exc).__name__}: {exc}".split())
    return None, f"its task ended {state.type.value.lower()}"


@flow(name="nightly-drift-audit", **ENDED_HOOKS)
def nightly_drift_audit(
    reference: DataSpec | None = None,
    current: DataSpec | None = None,
    data_store: StoreAddress | None = None,
    contract: ContractRef | None = None,
    model: ModelName | None = None,
    version: Annotated[str, Field(min_length=1, description="The model version: a number, or an alias such as champion.")] = "champion",
    ref: str | None = None,
    stores: list[StoreAddress] | None = None,
    max_ulps: Annotated[int, Field(ge=0, le=1_000_000)] = 1,
    card_fields: list[str] | None = None,
    thresholds: Thresholds = Thresholds(),
    bins: Annotated[int, Field(ge=2, le=1000)] = 10,
    columns: list[str] | None = None,
    name: AuditName | None = None,
    night: date | None = None,
    registry: str | None = None,
    plots_dir: str | None = None,
    reference_profile: Literal["create", "use", "off"] = "create",
    fail_on: Literal["critical", "warning", "never"] = "critical",
    tracking_uri: str | None = None,
    trust_block: str | None = None,
) -> dict:
    """Audit tonight's data, its contract, a model version's replicas and model cards; one verdict.

    Give reference and current for the data sections, model (with version) or ref and stores for
    the weights and cards; any of them alone is an audit too.

    Args:
        reference: The reference data: a .parquet or .csv file, a data snapshot id, or data/NAME
            in the data store.
        current: Tonight's data, the same kinds as reference.
        data_store: The store holding data snapshots named by id or data/NAME; empty for the registry.
        contract: Validate the current data against this schema contract of the registry
            (name@version, name for its latest version, or a .json file); empty to skip.
        model: A registered model whose version is audited: its snapshot root and the stores
            holding it come from lineage in MLflow.
        version: The model version: a number, or an alias such as champion.
        ref: Without a model: the snapshot (a ref or 64-hex root) whose replicas are audited on stores.
        stores: The cluster stores holding the model's replicas, the reference replica first; empty
            for those lineage records (with a model).
        max_ulps: A replica stored in another dtype passes within this many ULPs of the lower precision.
        card_fields: Model-card fields every cluster must have; empty for the default list.
        thresholds: The significance level and effect floors that decide drift, the PSI tiers,
            null-share change, and the nights before a warning escalates.
        bins: Reference quantile bins per numeric column.
        columns: Only these columns; empty for all.
        name: The audit's name (history, event resource, MLflow run); empty: from the inputs' names.
        night: The night this audit stands for (UTC date); empty for today. Running the same
            night again replaces its record in the history.
        registry: The store of contracts and of the audits' nightly history; empty for
            $CONCORD_REGISTRY, else $CONCORD_HOME/registry.
        plots_dir: Folder for the PNG histograms; empty for $CONCORD_HOME/audits/NAME/NIGHT.
        reference_profile: A reference data snapshot's stored profile: use it when there is one,
            without reading the table, and create and store it the first night (create); only
            use one (use); or read the whole reference every night (off). A .profile file as
            reference is always its profile.
        fail_on: Fail the run (after writing every report) when the verdict is critical (P0), at
            least a warning, or never.
        tracking_uri: MLflow tracking URI; empty for the worker's MLFLOW_TRACKING_URI (else the
            embedded sqlite database). MLflow being down leaves a warning, never loses the report.
        trust_block: A saved Concord Trust block; with trusted keys, a replica whose root none of
            them signed (on any cluster) is critical (empty: the worker's CONCORD_TRUSTED_KEYS, if set).
    """
    if (reference is None) != (current is None):
        raise ValueError("give both reference and current (the data to compare), or neither")
    if reference is None and not model and not ref:
        raise ValueError("nothing to audit: give reference and current, a model, or a ref and its stores")
    if contract and current is None:
        raise ValueError(f"contract {contract!r} given without current: name the data to validate")
    if ref and not model and not stores:
        raise ValueError(f"ref {ref!r} given without stores: list the cluster stores that hold it")
    registry = registry or default_registry()
    tonight = night_of(night).isoformat()
    parts = [spec_name(reference), spec_name(current)] if reference is not None else []
    if model or ref:
        parts.append(model or spec_name(ref))
    name = name or audit_name(*parts)

    errors: dict[str, str] = {}
    data = contract_section = replicas = cards = held = None
    if reference is not None:
        data, why = _outcome(
            data_drift_task,
            reference, current, data_store or registry, registry, name, tonight,
            thresholds.model_dump(), bins, columns or None, plots_dir or None, profile=reference_profile,
        )
        if why:
            errors["data"] = why
    if contract:
        contract_section, why = _outcome(audit_contract_task, contract, registry, current, data_store or registry)
        if why:
            errors["contract"] = why
    if model or ref:
        snapshot, holders = ref, list(stores or [])
        if model:
            held, why = _outcome(model_holders_task, model, version, tracking_uri or None)
            if held is not None:
                snapshot, holders = held["root"], holders or held["stores"]
            else:
                errors["replicas"] = errors["cards"] = f"lineage of {model}/{version}: {why}"
        if snapshot:
            replicas, why = _outcome(audit_replicas_task, snapshot, holders, max_ulps=max_ulps, trust_block=trust_block or None)
            if why:
                errors["replicas"] = why
            cards, why = _outcome(audit_cards_task, snapshot, holders, card_fields or None)
            if why:
                errors["cards"] = why

    plots = (data or {}).get("plots", {})
    report = AuditReport.assemble(
        drift=(data or {}).get("drift"),
        reference=(data or {}).get("reference"),
        current=(data or {}).get("current"),
        contract=contract_section,
        replicas=replicas,
        cards=cards,
        errors=errors,
        model=held or ({"ref": ref, "stores": list(stores or [])} if ref else None),
    )
    rd = report.to_dict()
    params = audit_params(
        reference=reference, current=current, contract=contract, model=model, version=version, ref=ref,
        max_ulps=max_ulps, bins=bins, thresholds=thresholds,
    )
    run_id = log_audit_task(
        rd, run_markdown(report, name=name, night=tonight, plots=plots), name, tonight, list(plots.values()), params, tracking_uri or None,
    )
    links = {"night": tonight, "audit": f"`{name}`"}
    links["MLflow"] = (
        f"run `{run_id}` in experiment {AUDIT_EXPERIMENT} (metrics, PNGs, report.json, report.md)" if run_id else "not logged to MLflow (see the run's warning)"
    )
    if data and data.get("history_key"):
        links["history"] = f"`{data['history_key']}` in {cluster(registry)}"
    links["events"] = events_line()
    # the histograms drawn in the report itself (Prefect's UI shows a data: URI image inline), not
    # as paths on the worker
    where = f"the MLflow run's `histograms/` folder (run `{run_id}`)" if run_id else None
    create_markdown_artifact(
        render_markdown(report, plots=plots, links=links, embed=True, plots_where=where),
        key="drift-report", description=report.verdict()[:500],
    )
    if report.data is not None:
        rows = [{k: r[k] for k in COLUMN_SUMMARY} for r in column_rows(report)]
        create_table_artifact(
            rows, key="drift-columns",
            description=f"{rd.get('columns_drifted', 0)} of {rd.get('columns_compared', 0)} column(s) drifted; worst first",
        )
    if report.replicas is not None:
        worst = [{k: r[k] for k in WORST_TENSOR_SUMMARY} for r in worst_tensor_rows(report.replicas)]
        create_table_artifact(
            worst or [{k: r[k] for k in REPLICA_SUMMARY} for r in replica_rows(report.replicas)], key="drift-replicas",
            description=f"replicas: {report.sections.get('replicas')}",
        )
    event_id = audit_event_task(rd, name, tonight, run_id, list(plots.values()))
    result = rd | {
        "name": name,
        "night": tonight,
        "plots": plots,
        "mlflow_run_id": run_id,
        "event_id": event_id,
        "history_key": (data or {}).get("history_key"),
    }
    levels = {"critical": ("critical",), "warning": ("warning", "critical"), "never": ()}
    if report.severity in levels[fail_on]:
        raise AuditFailed(f"drift audit {name} ({tonight}): {report.verdict()}", result)
    return result
