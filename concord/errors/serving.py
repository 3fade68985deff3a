"""Errors of serving: checking a snapshot out beside a symlink, flipping it, rolling it back."""

from __future__ import annotations

from concord.errors.base import ConcordError

__all__ = [
    "CheckoutBusyError",
    "CheckoutDiskFullError",
    "CheckoutTargetError",
    "HealthCheckFailedError",
    "NoPreviousVersionError",
]


class CheckoutTargetError(ConcordError, ValueError):
    """The link a checkout flips is something else: a real folder or file, or a link Concord did
    not make."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path} {problem}; {fix}")


class CheckoutBusyError(ConcordError, TimeoutError):
    """Another checkout, rollback or prune of the same link held it for too long."""

    exit_code = 11

    def __init__(self, path: str, waited: float) -> None:
        self.path = path
        self.waited = waited
        super().__init__(
            f"another checkout of {path} is under way and did not finish within {waited:g} s; "
            "the link was not touched. Run again once it has (or wait longer with --wait SECONDS)."
        )


class CheckoutDiskFullError(ConcordError, OSError):
    """The disk filled up while a version was written; the partial version was removed."""

    def __init__(self, path: str, needed: int, cause: str) -> None:
        self.path = path
        self.needed = needed
        super().__init__(
            f"the disk holding {path} filled up while checking out a version of {needed} bytes ({cause}); "
            "the partial version was removed and the link still serves the version it served. Free "
            "space (e.g. `concord checkout --prune --keep 2 DEST`) and run again."
        )


class NoPreviousVersionError(ConcordError, ValueError):
    """A rollback was asked for a link that has no earlier version on this node."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} has no earlier version on this node to roll back to; see "
            f"`concord checkout --status {path}`, or check out a root with `concord checkout STORE --ref ROOT {path}`."
        )


class HealthCheckFailedError(ConcordError, RuntimeError):
    """The health gate failed after a flip; the link was flipped back."""

    def __init__(self, path: str, check: str, problem: str, restored: str | None) -> None:
        self.path = path
        self.check = check
        self.problem = problem
        self.restored = restored
        back = f"flipped back to {restored[:12]}" if restored else "removed (it served nothing before)"
        super().__init__(
            f"health check {check!r} failed after switching {path} ({problem}); the link was {back}. "
            "Fix the version or the check, then check out again."
        )
