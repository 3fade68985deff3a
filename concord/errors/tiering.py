"""Errors of tiering: policies, checkpoints, copy rules, restores from cold storage."""

from __future__ import annotations

from concord.errors.base import ConcordError
from concord.errors.stores import StoreError

__all__ = [
    "CheckpointConflictError",
    "CheckpointNotFoundError",
    "CheckpointNotReadyError",
    "CopyRuleError",
    "PolicyError",
    "RestoreTimeoutError",
    "TierCopyNotFoundError",
    "TierStoreUnavailableError",
]


class PolicyError(ConcordError, ValueError):
    """A tier policy is malformed or cannot keep the copy rules; every problem is listed."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        listed = "; ".join(self.problems)
        super().__init__(
            f"tier policy {source} refused: {listed}. Fix the policy (see docs/tiering.md for every key) "
            "and run again; nothing was changed."
        )


class CheckpointNotReadyError(ConcordError, RuntimeError):
    """A checkpoint folder is still being written (no completion marker, or files still changing)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(
            f"checkpoint {path} is not complete: {reason}. Nothing was taken; run again once its "
            "writer has finished (write the completion marker last)."
        )


class CheckpointConflictError(ConcordError, ValueError):
    """A checkpoint name is already tiered with different contents."""

    def __init__(self, name: str, existing: str, new: str) -> None:
        self.name = name
        self.existing = existing
        self.new = new
        super().__init__(
            f"checkpoint {name!r} is already tiered as {existing[:12]}…, and this folder snapshots to "
            f"{new[:12]}…; checkpoints never change once tiered. Give the new one another name "
            "(e.g. its step)."
        )


class CheckpointNotFoundError(ConcordError, KeyError):
    """No tier holds the checkpoint asked for."""

    exit_code = 10

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        super().__init__(
            f"no tier holds checkpoint {name!r} of {namespace!r}; list what is tiered with "
            "`concord tier status --policy POLICY`."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class TierCopyNotFoundError(CheckpointNotFoundError):
    """The tier asked for holds no copy of the checkpoint (other tiers may)."""

    def __init__(self, name: str, namespace: str, tier: str, held_in: list[str]) -> None:
        self.name = name
        self.namespace = namespace
        self.tier = tier
        self.held_in = list(held_in)
        where = f"it is held in {', '.join(held_in)}" if held_in else "no tier holds it"
        ConcordError.__init__(
            self,
            f"the {tier} tier holds no copy of checkpoint {name!r} of {namespace!r} ({where}); "
            "restore from another tier, or leave the tier out to use the nearest one.",
        )


class CopyRuleError(ConcordError, RuntimeError):
    """Removing a copy would break the copy rules, or a copy it relies on failed verification."""

    def __init__(self, name: str, tier: str, problem: str) -> None:
        self.name = name
        self.tier = tier
        self.problem = problem
        super().__init__(
            f"kept checkpoint {name!r} in {tier}: {problem}. Nothing was removed; repair the other "
            "copies (`concord tier sweep` copies what is missing) and run again."
        )


class RestoreTimeoutError(ConcordError, TimeoutError):
    """An archive restore did not complete in time."""

    def __init__(self, store: str, waiting: int, total: int, seconds: float) -> None:
        self.store = store
        self.waiting = waiting
        self.seconds = seconds
        super().__init__(
            f"archive restore from {store} not complete after {seconds:.0f} s: {waiting} of {total} "
            "objects still restoring. The restore requests stay in place; run the same command again "
            "later (it waits for what is left), or raise the timeout (restore.timeout in the policy, "
            "--timeout on the command line)."
        )


class TierStoreUnavailableError(StoreError, ConnectionError):
    """A store a tier policy names does not answer, or refuses the request: the policy file, the
    tier, the store and its endpoint are named, and whether the policy is the demo's (``demo``),
    whose S3 lived only while the demo ran; ``refused``: it answered, and said no (credentials,
    permissions, a missing bucket)."""

    exit_code = 14

    def __init__(self, source: str, tier: str, store: str, endpoint: str, cause: str, *, demo: bool = False, refused: bool = False) -> None:
        self.source = source
        self.tier = tier
        self.store = store
        self.endpoint = endpoint
        self.cause = cause
        self.demo = demo
        if refused:  # it answered: not a fault that passes
            self.exit_code = 1
        if demo:
            fix = (
                "This policy was written by `make demo` for the demo's own S3 (a moto_server on 127.0.0.1), "
                "which stopped when the demo ended: run `make demo` again, or point the policy's S3 tiers "
                "at an S3 you run (docs/tiering.md)"
            )
        else:
            fix = (
                "Check the endpoint (AWS_ENDPOINT_URL, or the block's endpoint_url), the credentials "
                "and that the service is running"
            )
        super().__init__(
            f"tier policy {source}: the {tier} store {store} at {endpoint} "
            f"{'refused the request' if refused else 'did not answer'} ({cause}). "
            f"{fix}; nothing was changed."
        )
