"""The base of every Concord error."""

from __future__ import annotations


class ConcordError(Exception):
    """Base of every error raised by Concord. A credential in a URL of its message
    (``http://user:secret@host``) is hidden (:func:`concord.redact.redact`)."""

    def __init__(self, *args: object) -> None:
        from concord.redact import redact

        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))
