"""Credentials kept out of what Concord shows.

An S3 endpoint or a tracking URI may carry credentials in its user-info
(``http://user:secret@minio.internal:9000``). Wherever such an address can reach a person —
an error message, a CLI line, a log record, a ``repr`` — it is shown with the password replaced
by ``***`` (``http://user:***@minio.internal:9000``), or the whole user-info when it is a single
token (``http://***@host``). Host, port and path stay, so the message still says where.
"""

from __future__ import annotations

import re

#: ``scheme://`` then the user-info up to the last ``@`` before the host (no '/', '?', '#',
#: whitespace or quote in between, so an ``@`` in a path or in the text after a URL is left alone)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/?#'\"<>]*)@")


def _hide(match: re.Match[str]) -> str:
    user, sep, _ = match.group(2).partition(":")
    return f"{match.group(1)}{user}:***@" if sep and user else f"{match.group(1)}***@"


def redact(text: object) -> str:
    """``text`` with the user-info of every URL in it hidden (see the module's docstring)."""
    s = str(text)
    return _USERINFO.sub(_hide, s) if "@" in s else s


def redact_url(url: str | None) -> str | None:
    """One URL (or None) with its user-info hidden."""
    return None if url is None else redact(url)


def scrub_exception(exc: BaseException) -> BaseException:
    """Hide URL user-info in the message of ``exc`` (a library's exception about to be chained
    under a Concord error, whose traceback would show it), in place; returns ``exc``."""
    args = tuple(redact(a) if isinstance(a, str) else a for a in exc.args)
    if args != exc.args:
        exc.args = args
    kwargs = getattr(exc, "kwargs", None)  # botocore keeps its message's fields here
    if isinstance(kwargs, dict):
        for key, value in list(kwargs.items()):
            if isinstance(value, str) and "@" in value:
                kwargs[key] = redact(value)
    return exc


__all__ = ["redact", "redact_url", "scrub_exception"]
