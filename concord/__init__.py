"""Concord: keep model assets consistent across cluster stores, from Python.

::

    import concord

    r = concord.snapshot("ckpt/step-1000", "s3://models/us-east", ref="models/llama")
    concord.sync("s3://models/us-east", ["s3://models/eu-west"], ref="models/llama")
    concord.checkout("s3://models/eu-west", "/srv/models/current", ref="models/llama")

Every name is loaded on first use, so ``import concord`` costs no more than the ``concord``
command's start-up. The verbs are in :mod:`concord.api` (see docs/python.md); the result types
come from their wings and the errors from :mod:`concord.errors`.
"""

#: the verbs, in the order docs/python.md gives them (each is in :mod:`concord.api`)
VERBS = (
    "open_store",
    "init_store",
    "store_info",
    "snapshot",
    "snapshot_part",
    "snapshot_assemble",
    "sync",
    "diff",
    "restore",
    "verify",
    "rollback",
    "refs",
    "log",
    "sign",
    "signatures",
    "generate_signing_key",
    "checkout",
    "rollback_checkout",
    "tier_add",
    "tier_sweep",
    "tier_status",
    "tier_restore",
    "tier_drill",
    "tier_gc",
    "tier_check",
    "federate_round",
    "federate_cosign",
    "federate_verify",
    "federate_log",
    "federate_aggregate",
    "audit_replicas",
    "audit_cards",
    "audit_data",
    "audit_profile",
    "export_oci",
    "import_oci",
    "open_lineage",
    "register_data",
    "register_model",
    "model_lineage",
    "promote_model",
    "data_info",
    "data_lineage",
    "lineage_graph",
    "contract_infer",
    "contract_validate",
    "contract_compatible",
    "contract_list",
)

#: each exported name → (module, name there); imported on first use
_LAZY = {
    # the verbs
    **{name: ("concord.api", name) for name in VERBS},
    # what they take and return
    "Store": ("concord.stores.base", "Store"),
    "StoreAddress": ("concord.stores.address", "StoreAddress"),
    "SnapshotResult": ("concord.snapshots.snapshot", "SnapshotResult"),
    "TargetResult": ("concord.snapshots.sync", "TargetResult"),
    "DiffResult": ("concord.snapshots.diff", "DiffResult"),
    "RestoreResult": ("concord.snapshots.restore", "RestoreResult"),
    "VerifyResult": ("concord.snapshots.verify", "VerifyResult"),
    "RollbackResult": ("concord.snapshots.refs", "RollbackResult"),
    "CheckoutResult": ("concord.serving.checkout", "CheckoutResult"),
    "CheckoutRollbackResult": ("concord.serving.versions", "RollbackResult"),
    "HealthCheck": ("concord.serving.health", "HealthCheck"),
    "SignResult": ("concord.trust.signing", "SignResult"),
    "SigningKey": ("concord.trust.keys", "SigningKey"),
    "TrustPolicy": ("concord.trust.policy", "TrustPolicy"),
    "Verdict": ("concord.trust.policy", "Verdict"),
    "TierPolicy": ("concord.tiering.policy", "TierPolicy"),
    "AddResult": ("concord.tiering.engine", "AddResult"),
    "SweepResult": ("concord.tiering.engine", "SweepResult"),
    "TierRestoreResult": ("concord.tiering.restore", "TierRestoreResult"),
    "DrillResult": ("concord.tiering.drill", "DrillResult"),
    "GcResult": ("concord.snapshots.gc", "GcResult"),
    "RememberedReport": ("concord.federation.seen", "RememberedReport"),
    "AuditReport": ("concord.audit.report", "AuditReport"),
    "Lineage": ("concord.lineage", "Lineage"),
    "DataSnapshot": ("concord.lineage.data", "DataSnapshot"),
    "StoreUsage": ("concord.snapshots.usage", "StoreUsage"),
    "NodePart": ("concord.snapshots.spread", "NodePart"),
    "ExportResult": ("concord.oci.export", "ExportResult"),
    "ImportResult": ("concord.oci.importer", "ImportResult"),
    "Contract": ("concord.lineage.contracts", "Contract"),
    "ValidationResult": ("concord.lineage.contracts", "ValidationResult"),
    "CompatResult": ("concord.lineage.contracts", "CompatResult"),
    # the typed dicts some verbs return (their keys are what --json prints)
    **{name: ("concord.api", name) for name in ("StoreInit", "RefSummary", "LogEntry", "LedgerLog", "ProfileResult")},
    # the errors a caller most often catches (every one is in concord.errors)
    **{
        name: ("concord.errors", name)
        for name in (
            "ConcordError",
            "ApiArgumentError",
            "StoreError",
            "InvalidStoreURIError",
            "StoreNotFoundError",
            "StoreUnreachableError",
            "StoreAccessError",
            "StoreKeyError",
            "RefNotFoundError",
            "RefConflictError",
            "HistoryError",
            "IntegrityError",
            "RestoreTargetError",
            "TrustError",
            "TrustPolicyError",
            "UntrustedRootError",
            "CheckoutBusyError",
            "HealthCheckFailedError",
            "NoPreviousVersionError",
            "PolicyError",
            "LedgerRollbackError",
            "LineageUnreachableError",
        )
    },
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> object:
    """Import an exported name on first use (PEP 562); it is kept in the module from then on."""
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'concord' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The exported names beside the module's own."""
    return sorted(set(globals()) | set(__all__))
