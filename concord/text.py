"""Text that reaches a terminal: names escaped, error lines kept to one bounded line.

A file name, a ref message or a column name comes from whoever wrote the checkpoint, the
manifest or the table, and a terminal obeys the control characters in what it prints (an
``ESC [`` sequence can rewrite the screen, a newline can forge a line of output). Every human
line Concord prints goes through :func:`printable`, which shows such characters as Python
escapes (``\\n``, ``\\x1b``) and leaves every printable character, accents and arrows included,
as it is. JSON output needs nothing of this: ``json.dumps`` escapes control characters itself.
"""

from __future__ import annotations

#: the characters a file name may not hold: C0 controls and DEL
CONTROL_CHARS = frozenset(chr(c) for c in range(0x20)) | {"\x7f"}

#: longest error line the CLI prints; longer ones keep their beginning and end (the fix)
MAX_ERROR_LINE = 1000


def printable(text: object) -> str:
    """``text`` with every non-printable character (controls, DEL, line and paragraph
    separators, unassigned code points, lone surrogates) written as its Python escape."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in s)


def control_char(name: str) -> str | None:
    """The first control character (``\\x00``-``\\x1f``, ``\\x7f``) in ``name``, or None."""
    if name.isascii() and name.isprintable():  # ASCII is printable exactly where it holds none of them
        return None
    return next((ch for ch in name if ch in CONTROL_CHARS), None)


def one_line(message: object, limit: int = MAX_ERROR_LINE) -> str:
    """``message`` as one printable line of at most about ``limit`` characters.

    Whitespace runs (newlines included) become one space, anything else non-printable is
    escaped, and a longer message keeps its first and last parts around a note of how much was
    left out: the end of a Concord message says what to do, so it is never the part cut.
    """
    text = printable(" ".join(str(message).split()))
    if len(text) <= limit:
        return text
    tail = min(200, limit // 2)
    head = limit - tail
    return f"{text[:head]} … [{len(text) - head - tail} of {len(text)} characters left out] … {text[-tail:]}"
