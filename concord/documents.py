"""Reading JSON documents that come from a store: refs, manifests, ledger rounds, tier records,
leases, data snapshot and contract documents.

Whatever a store holds may have been written by someone else, damaged, or crafted. Every such
document goes through :func:`load_json_document`, which turns anything it cannot accept into one
clear error naming the document: too many bytes (refused before parsing), not UTF-8 JSON, nested
deeper than any Concord document is, a number that is not finite (``1e400``) or an integer too
large for any count or size (``10**400``), or a top level of the wrong type. The field checks
(:func:`need_int`, :func:`need_str`, :func:`need_list`...) give the same kind of error for a
field of the wrong type or out of range, so a reader never meets a ``TypeError`` or an
``OverflowError`` deep in its own code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from concord.errors import DocumentError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: size limits per kind of document (far above anything Concord writes)
MAX_REF_BYTES = 64 * MiB
MAX_MANIFEST_BYTES = 2 * GiB
MAX_ROUND_BYTES = 16 * MiB
MAX_RECORD_BYTES = 1 * MiB
MAX_LEASE_BYTES = 1 * MiB
MAX_SMALL_DOCUMENT_BYTES = 64 * MiB
#: no Concord document nests deeper than this (a manifest: 5 levels)
MAX_DEPTH = 64
#: integers in documents are counts, sizes, versions and times: all below 2**63
MAX_INT = 2**63 - 1
#: digits of an integer literal accepted at all (``10**400`` is refused before it is built)
_MAX_INT_DIGITS = 20

ErrorFactory = Callable[[str], Exception]


def _default_error(what: str) -> ErrorFactory:
    return lambda problem: DocumentError(what, problem)


def _parse_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > _MAX_INT_DIGITS:
        raise ValueError(f"the integer {text[:12]}... ({len(digits)} digits) is too large")
    value = int(text)
    if abs(value) > MAX_INT:
        raise ValueError(f"the integer {value} is too large (at most {MAX_INT})")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:24]} is not finite")
    return value


def _parse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _depth_ok(doc: Any, max_depth: int) -> bool:
    """Whether ``doc`` nests at most ``max_depth`` lists and objects deep (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return False
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def load_json_document(
    data: Any,
    what: str,
    *,
    max_bytes: int,
    expect: type | None = dict,
    max_depth: int | None = MAX_DEPTH,
    error: ErrorFactory | None = None,
    check_ints: bool = True,
) -> Any:
    """The JSON value of ``data`` (bytes or str read from a store), checked.

    ``what`` names the document in errors (e.g. ``"refs/models/x in /data/c1"``); ``error`` builds
    the exception for a problem (default :class:`~concord.errors.DocumentError` naming ``what``).
    Refused, each with one line: more than ``max_bytes`` bytes (before any parsing), bytes that
    are not UTF-8, text that is not JSON, nesting deeper than ``max_depth``, NaN or infinite
    numbers, integers beyond 2**63 - 1, and a top level that is not an ``expect`` (None: any).

    A reader of very large documents (a manifest of 100,000 files) may take both checks on itself
    to parse at the speed of :mod:`json`: with ``max_depth=None`` nothing is walked for depth
    (the reader must never recurse into what it does not know), and with ``check_ints=False``
    integers are parsed by :mod:`json` itself (at most 4,300 digits, Python's own limit) and the
    reader bounds every integer it uses.
    """
    fail = error or _default_error(what)
    if isinstance(data, memoryview):
        data = data.tobytes()
    if not isinstance(data, (bytes, bytearray, str)):
        raise fail(f"expected the bytes of a JSON document, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise fail(f"{len(data)} bytes, more than the {max_bytes} such a document may have (refused unread)")
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        ints = {"parse_int": _parse_int} if check_ints else {}
        doc = json.loads(text, parse_float=_parse_float, parse_constant=_parse_constant, **ints)
    except RecursionError:
        raise fail(f"nested deeper than the {max_depth or MAX_DEPTH} levels any Concord document has") from None
    except UnicodeDecodeError as exc:
        raise fail(f"not valid JSON (not UTF-8 text at byte {exc.start})") from None
    except ValueError as exc:
        raise fail(f"not valid JSON ({' '.join(str(exc).split())[:200]})") from None
    if max_depth is not None and not _depth_ok(doc, max_depth):
        raise fail(f"nested deeper than the {max_depth} levels any Concord document has")
    if expect is not None and not isinstance(doc, expect):
        names = {dict: "a JSON object", list: "a JSON array", str: "a JSON string"}
        raise fail(f"the top level is {json_type(doc)}, expected {names.get(expect, expect.__name__)}")
    return doc


def json_type(value: Any) -> str:
    """How a JSON value is named in an error line (\"an integer\", \"an array\", …)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# --------------------------------------------------------------------------- field checks


def need_int(value: Any, what: str, fail: ErrorFactory, *, low: int = 0, high: int = MAX_INT) -> int:
    """``value`` if it is an integer (not a boolean) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"{what} is {json_type(value)}, expected an integer")
    if not low <= value <= high:
        raise fail(f"{what} is {value}, expected {low} to {high}")
    return value


def need_optional_int(value: Any, what: str, fail: ErrorFactory, *, low: int = 0, high: int = MAX_INT) -> int | None:
    return None if value is None else need_int(value, what, fail, low=low, high=high)


def need_str(value: Any, what: str, fail: ErrorFactory, *, max_len: int = 64 * KiB) -> str:
    """``value`` if it is a string of at most ``max_len`` characters."""
    if not isinstance(value, str):
        raise fail(f"{what} is {json_type(value)}, expected a string")
    if len(value) > max_len:
        raise fail(f"{what} is {len(value)} characters long, at most {max_len} are expected")
    return value


def need_optional_str(value: Any, what: str, fail: ErrorFactory, *, max_len: int = 64 * KiB) -> str | None:
    return None if value is None else need_str(value, what, fail, max_len=max_len)


def need_list(value: Any, what: str, fail: ErrorFactory) -> list:
    if not isinstance(value, list):
        raise fail(f"{what} is {json_type(value)}, expected an array")
    return value


def need_dict(value: Any, what: str, fail: ErrorFactory) -> dict:
    if not isinstance(value, dict):
        raise fail(f"{what} is {json_type(value)}, expected an object")
    return value


__all__ = [
    "json_type",
    "MAX_DEPTH",
    "MAX_INT",
    "MAX_LEASE_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_RECORD_BYTES",
    "MAX_REF_BYTES",
    "MAX_ROUND_BYTES",
    "MAX_SMALL_DOCUMENT_BYTES",
    "load_json_document",
    "need_dict",
    "need_int",
    "need_list",
    "need_optional_int",
    "need_optional_str",
    "need_str",
]
