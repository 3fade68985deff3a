"""The error of a local server (:mod:`concord.localservers`) that did not start."""

from __future__ import annotations

from concord.errors.base import ConcordError

__all__ = ["LocalServerError"]


class LocalServerError(ConcordError, RuntimeError):
    """A server on 127.0.0.1 did not start: its executable is missing, it exited, or it never
    answered. The message names the server, what went wrong and its log."""

    #: the CLI's exit status of an endpoint that does not answer
    exit_code = 14

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)
