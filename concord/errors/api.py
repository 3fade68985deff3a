"""Errors of the Python API's own checks (what ``concord.restore(...)`` and its kin were given)."""

from __future__ import annotations

from concord.errors.base import ConcordError


class ApiArgumentError(ConcordError, ValueError):
    """A verb of the Python API was called with arguments that name nothing to act on, or two
    things at once (``ref=`` and ``root=``). ``function`` is the verb, ``problem`` what is wrong."""

    def __init__(self, function: str, problem: str) -> None:
        self.function = function
        self.problem = problem
        super().__init__(f"concord.{function}: {problem}")
