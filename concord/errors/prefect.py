"""Errors of reaching the Prefect API that a saved block, a flow or a deployment needs."""

from __future__ import annotations

from concord.errors.base import ConcordError

__all__ = ["PrefectUnavailableError"]


class PrefectUnavailableError(ConcordError, ConnectionError):
    """The Prefect API a command needs did not answer in time: the configured one
    (``PREFECT_API_URL``), or Prefect's temporary server, which did not start."""

    #: the CLI's exit status of an endpoint that does not answer
    exit_code = 14

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        self.fix = fix or (
            "Set PREFECT_API_URL to a running Prefect server (`make serve` starts one), or raise "
            "CONCORD_PREFECT_START_TIMEOUT if this machine is only slow"
        )
        super().__init__(f"{where}: {problem}. {self.fix}")
