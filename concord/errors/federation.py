"""Errors of federation: the ledger, tenants, adapters and rounds."""

from __future__ import annotations

from concord.errors.base import ConcordError
from concord.errors.stores import RefConflictError, StoreError

__all__ = [
    "AdapterError",
    "AdapterNotFoundError",
    "AdapterOutputExistsError",
    "AggregationError",
    "LedgerConflictError",
    "LedgerError",
    "LedgerRollbackError",
    "RoundMismatchError",
    "TenantError",
]


class LedgerError(ConcordError, ValueError):
    """A federation ledger cannot be read or extended as asked (bad record, inconsistent ledger)."""

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        fix = fix or "Inspect it with `concord federate verify TENANT --store STORE`."
        super().__init__(f"{where}: {problem}. {fix}")


class LedgerRollbackError(ConcordError, ValueError):
    """A tenant's ledger is behind, or unlike, what this machine saw of it before (its memory of
    verified ledgers): rolled back to an older copy, or its history rewritten. ``message`` is the
    whole line, naming tenant, store, the round remembered, the round found and the fix."""

    def __init__(self, tenant: str, store: str, remembered: int, found: int, message: str) -> None:
        self.tenant = tenant
        self.store = store
        self.remembered = remembered
        self.found = found
        super().__init__(message)


class LedgerConflictError(RefConflictError):
    """A different round of the same tenant took this round's number first; nothing of this one
    was kept. ``winner`` is the hash of the round that holds the number."""

    def __init__(
        self, store: str, tenant: str, number: int, expected: str | None, actual: str | None, *, winner: str | None = None
    ) -> None:
        self.store = store
        self.ref = f"{tenant}/_ledger"
        self.tenant = tenant
        self.round = number
        self.expected = expected
        self.actual = actual
        self.winner = winner
        StoreError.__init__(
            self,
            f"round {number} of tenant {tenant!r} in {store} went to a different round "
            f"({'hash ' + winner[:12] if winner else 'head ' + (actual or '(none)')}) appended concurrently "
            f"by another run; this round was not recorded. Run it again to record it as a later round "
            f"(a round already in the ledger is never recorded twice); see `concord federate log {tenant} --store {store}`.",
        )


class TenantError(ConcordError, ValueError):
    """A federation round named something that belongs to another tenant."""

    def __init__(self, tenant: str, name: str, owner: str) -> None:
        self.tenant = tenant
        self.name = name
        self.owner = owner
        super().__init__(
            f"{name!r} belongs to tenant {owner!r}, not {tenant!r}: a round of one tenant never reads "
            f"or writes another's refs or ledger. Name the adapter as '{tenant}/NAME' or just 'NAME'."
        )


class AdapterNotFoundError(StoreError, KeyError):
    """No cluster store holds the adapter ref a federation round names."""

    exit_code = 10

    def __init__(self, ref: str, stores: list[str]) -> None:
        self.ref = ref
        self.stores = list(stores)
        super().__init__(
            f"no cluster holds adapter ref {ref!r} (looked in {', '.join(self.stores) or 'no store'}); "
            f"snapshot the adapter there first (`concord snapshot DIR --store STORE --ref {ref}`), "
            "or list what a store holds with `concord refs STORE`."
        )

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class AdapterError(ConcordError, ValueError):
    """A folder is not a LoRA adapter Concord can aggregate."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(
            f"{path}: not a usable LoRA adapter: {problem}. Save the adapter with peft's "
            "save_pretrained (adapter_config.json + adapter_model.safetensors; plain LoRA without "
            "DoRA, LoRA biases or modules_to_save)."
        )


class RoundMismatchError(ConcordError, ValueError):
    """The adapters of one federation round do not fit together (base model, modules, shapes)."""

    def __init__(self, path: str, problem: str, index: int | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        self.index = index
        which = f"adapter {index} ({path})" if index is not None else str(path)
        super().__init__(
            f"{which} does not belong in this round: {problem}. Every adapter of a round must be "
            "trained on the same base model (base_model_name_or_path) with LoRA on the same "
            "modules; leave it out or retrain it on the round's base."
        )


class AggregationError(ConcordError, ValueError):
    """The options of an aggregation are invalid, or no client is left to aggregate."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        super().__init__(f"cannot aggregate: {problem}. {fix or 'Fix the arguments and run it again.'}")


class AdapterOutputExistsError(ConcordError, FileExistsError):
    """The folder an aggregated adapter is to be written to already holds files."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        super().__init__(
            f"{path} already exists and is not empty; write the aggregate into a new folder "
            "(Concord never overwrites an adapter)."
        )
