"""Parse and validate the header of a safetensors file, with the standard library only.

A safetensors file is an 8-byte little-endian length ``N``, then ``N`` bytes of a UTF-8 JSON
object (possibly padded with trailing spaces), then the data region. Every key but
``__metadata__`` names a tensor ``{"dtype", "shape", "data_offsets": [begin, end]}`` whose
offsets are relative to the start of the data region.

We read the header ourselves rather than through the safetensors library because the snapshot
code maps the file and cuts each tensor's bytes into chunks itself; it needs the exact byte
ranges, checked once, up front. The checks follow the library (same dtypes, same header-size
cap, tensors laid out back to back from offset 0 to the end of the file) and are stricter in
two places where the library silently guesses: duplicate keys and unknown fields are refused.

Nothing here allocates memory in proportion to a length the file merely claims: the header
length is checked against the file size and the cap before a single header byte is read.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

from concord.documents import json_type
from concord.errors import SafetensorsError

# Bits per element of every dtype the safetensors format defines (safetensors 0.8 ``Dtype``).
# Sub-byte dtypes (F4, F6_*) are packed: a tensor's element count times its bits must be a
# multiple of 8.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

# The safetensors library refuses headers longer than this (``MAX_HEADER_SIZE`` in its Rust
# core is 100_000_000 bytes, not 100 MiB); a longer header means the file is not safetensors.
MAX_HEADER_BYTES = 100_000_000

METADATA_KEY = "__metadata__"
SUFFIX = ".safetensors"

_LENGTH = struct.Struct("<Q")
_PREFIX_BYTES = _LENGTH.size
_U64_MAX = 2**64 - 1  # shapes and offsets are usize in the reference implementation
_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
_SHOW_CHARS = 80


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file; ``begin``/``end`` are absolute offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def length(self) -> int:
        """Number of bytes the tensor occupies, ``end - begin``."""
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header: the tensors cover ``[data_start, file_size)`` back to back."""

    header_length: int
    data_start: int
    file_size: int
    tensors: tuple[TensorInfo, ...]  # ordered by (begin, end, name)
    metadata: dict[str, str] | None


def looks_like_safetensors(path: str | os.PathLike) -> bool:
    """Whether ``path`` should be parsed as safetensors: its extension is ``.safetensors``."""
    name = os.path.basename(os.fsdecode(path))
    return os.path.splitext(name)[1].lower() == SUFFIX


def parse_header(prefix: bytes, file_size: int, path: str = "<bytes>") -> SafetensorsHeader:
    """Parse the header from ``prefix``, the first bytes of a file of ``file_size`` bytes.

    ``prefix`` (bytes, bytearray, memoryview or mmap) must hold at least the 8-byte length and
    the ``N`` header bytes; it may hold more. Raises :class:`SafetensorsError` for any problem
    with the file, and ``ValueError`` if ``prefix`` and ``file_size`` do not fit together.
    """
    # Copy the header out and release every view before parsing: a view still exported when
    # an error propagates would stop the caller from closing its mmap.
    with memoryview(prefix) as whole, whole.cast("B") as view:
        _check_file_size(file_size, len(view))
        if file_size < _PREFIX_BYTES:
            raise _truncated(path, file_size)
        if len(view) < _PREFIX_BYTES:
            raise ValueError(
                f"prefix holds {len(view)} bytes; pass at least the first 8 of the file"
            )
        n = _LENGTH.unpack_from(view)[0]
        _check_header_length(n, file_size, path)
        if len(view) < _PREFIX_BYTES + n:
            raise ValueError(
                f"prefix holds {len(view)} bytes but the header ends at byte "
                f"{_PREFIX_BYTES + n}; pass at least the first 8 + N bytes of the file"
            )
        body = bytes(view[_PREFIX_BYTES : _PREFIX_BYTES + n])
    return _parse_body(body, file_size, path)


def read_header(f: BinaryIO, file_size: int, path: str) -> SafetensorsHeader:
    """Read and parse the header of the open binary file ``f`` of ``file_size`` bytes.

    Seeks to the start, reads the 8-byte length, checks it against ``file_size`` and
    :data:`MAX_HEADER_BYTES`, and only then reads exactly ``N`` more bytes.
    """
    _check_file_size(file_size, 0)
    if file_size < _PREFIX_BYTES:
        raise _truncated(path, file_size)
    f.seek(0)
    raw = _read_exactly(f, _PREFIX_BYTES)
    if len(raw) < _PREFIX_BYTES:
        raise _truncated(path, len(raw))
    n = _LENGTH.unpack(raw)[0]
    _check_header_length(n, file_size, path)
    body = _read_exactly(f, n)
    if len(body) < n:
        raise SafetensorsError(
            path,
            f"truncated: the header is {n} bytes but the file ended after {len(body)} of them "
            f"(expected a file of {file_size} bytes)",
        )
    return _parse_body(body, file_size, path)


# --------------------------------------------------------------------------- reading


def _check_file_size(file_size: int, prefix_len: int) -> None:
    if isinstance(file_size, bool) or not isinstance(file_size, int) or file_size < 0:
        raise ValueError(f"file_size must be a non-negative int, got {file_size!r}")
    if prefix_len > file_size:
        raise ValueError(f"prefix holds {prefix_len} bytes, more than file_size {file_size}")


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    """Read ``n`` bytes, fewer only at end of file (raw files may return short reads)."""
    first = f.read(n)
    if first is None or len(first) == n:
        return first or b""
    parts = [first]
    got = len(first)
    while got < n:
        part = f.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _truncated(path: str, size: int) -> SafetensorsError:
    return SafetensorsError(
        path,
        f"truncated: the file is {size} bytes, shorter than the 8-byte header length "
        "every safetensors file starts with",
    )


def _check_header_length(n: int, file_size: int, path: str) -> None:
    if n == 0:
        raise SafetensorsError(path, "header length is 0; even an empty header is '{}'")
    if n > file_size - _PREFIX_BYTES:
        raise SafetensorsError(
            path,
            f"header length {n} larger than the file (size {file_size}); "
            "the file looks truncated or is not safetensors",
        )
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(
            path,
            f"header length {n} is over the {MAX_HEADER_BYTES}-byte limit of the safetensors "
            "library; the file is probably not safetensors",
        )


# --------------------------------------------------------------------------- parsing


class _BadJSON(Exception):
    """Raised from inside the JSON decoder's hooks; turned into a SafetensorsError."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _BadJSON(
                f"duplicate key {_show(key)} in the header (the safetensors library would "
                "silently keep the last one)"
            )
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise _BadJSON(f"header is not valid JSON: {name} is not a JSON value")


def _parse_body(body: bytes, file_size: int, path: str) -> SafetensorsHeader:
    n = len(body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError(
            path, f"header is not valid UTF-8 ({exc.reason} at byte {_PREFIX_BYTES + exc.start})"
        ) from exc
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except _BadJSON as exc:
        raise SafetensorsError(path, str(exc)) from None
    except json.JSONDecodeError as exc:
        raise SafetensorsError(
            path,
            f"header is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
        ) from exc
    except RecursionError:
        raise SafetensorsError(path, "header JSON is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python will convert
        raise SafetensorsError(path, f"header is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise SafetensorsError(path, f"header must be a JSON object, got {json_type(doc)}")

    data_start = _PREFIX_BYTES + n
    data_len = file_size - data_start
    metadata: dict[str, str] | None = None
    tensors: list[TensorInfo] = []
    for name, entry in doc.items():
        _check_text(name, "a key", path)
        if name == METADATA_KEY:
            metadata = _metadata(entry, path)
        else:
            tensors.append(_tensor(name, entry, data_start, data_len, file_size, path))
    tensors.sort(key=lambda t: (t.begin, t.end, t.name))
    _check_layout(tensors, data_start, data_len, path)
    return SafetensorsHeader(
        header_length=n,
        data_start=data_start,
        file_size=file_size,
        tensors=tuple(tensors),
        metadata=metadata,
    )


def _metadata(entry: Any, path: str) -> dict[str, str] | None:
    if entry is None:  # the safetensors library reads a null __metadata__ as "no metadata"
        return None
    if not isinstance(entry, dict):
        raise SafetensorsError(
            path,
            f"{METADATA_KEY} must be an object mapping strings to strings, "
            f"got {json_type(entry)}",
        )
    for key, value in entry.items():
        _check_text(key, f"a {METADATA_KEY} key", path)
        if not isinstance(value, str):
            raise SafetensorsError(
                path,
                f"{METADATA_KEY} value for key {_show(key)} must be a string, "
                f"got {json_type(value)}",
            )
        _check_text(value, f"the {METADATA_KEY} value for key {_show(key)}", path)
    return dict(entry)


def _tensor(
    name: str, entry: Any, data_start: int, data_len: int, file_size: int, path: str
) -> TensorInfo:
    where = f"tensor {_show(name)}"
    if not isinstance(entry, dict):
        raise SafetensorsError(
            path,
            f"{where}: entry must be an object with dtype, shape and data_offsets, "
            f"got {json_type(entry)}",
        )
    missing = _FIELDS - entry.keys()
    if missing:
        raise SafetensorsError(path, f"{where}: missing field(s) {', '.join(sorted(missing))}")
    extra = entry.keys() - _FIELDS
    if extra:
        shown = ", ".join(_show(k) for k in sorted(extra)[:5])
        raise SafetensorsError(
            path, f"{where}: unexpected field(s) {shown} (allowed: dtype, shape, data_offsets)"
        )

    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise SafetensorsError(
            path,
            f"{where}: unknown dtype {_show(dtype)}; known dtypes: {', '.join(DTYPE_BITS)}",
        )
    bits = DTYPE_BITS[dtype]

    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise SafetensorsError(
            path, f"{where}: shape must be a list of non-negative integers, got {_show(shape)}"
        )
    numel = 1
    for dim in shape:  # checked at every step, as the reference does with usize::checked_mul
        numel *= dim
        if numel > _U64_MAX:
            raise SafetensorsError(
                path, f"{where}: shape {_show(shape)} has more than 2**64-1 elements"
            )

    offsets = entry["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_uint, offsets)):
        raise SafetensorsError(
            path,
            f"{where}: data_offsets must be two non-negative integers [begin, end], "
            f"got {_show(offsets)}",
        )
    begin, end = offsets
    if begin > end:
        raise SafetensorsError(
            path, f"{where}: data_offsets [{begin}, {end}] end before they begin"
        )
    if end > data_len:
        raise SafetensorsError(
            path,
            f"{where}: data_offsets [{begin}, {end}] run past the end of the file (the data "
            f"region holds {data_len} bytes, from byte {data_start} to {file_size})",
        )

    nbits = numel * bits
    if nbits % 8:
        raise SafetensorsError(
            path,
            f"{where}: {numel} elements of {dtype} ({bits} bits each) do not fill a whole "
            "number of bytes",
        )
    if end - begin != nbits // 8:
        raise SafetensorsError(
            path,
            f"{where}: data_offsets [{begin}, {end}] span {end - begin} bytes, but shape "
            f"{_show(shape)} of {dtype} needs {nbits // 8} bytes",
        )
    return TensorInfo(
        name=name, dtype=dtype, shape=tuple(shape), begin=data_start + begin, end=data_start + end
    )


def _check_layout(tensors: list[TensorInfo], data_start: int, data_len: int, path: str) -> None:
    """Tensors sorted by (begin, end) must tile the data region exactly, like the library asks."""
    covered = 0  # relative to data_start
    previous: TensorInfo | None = None
    for t in tensors:
        begin, end = t.begin - data_start, t.end - data_start
        if begin < covered and previous is not None:
            raise SafetensorsError(
                path,
                f"tensor {_show(t.name)} at data_offsets [{begin}, {end}] overlaps tensor "
                f"{_show(previous.name)} at data_offsets "
                f"[{previous.begin - data_start}, {previous.end - data_start}]",
            )
        if begin > covered:
            raise SafetensorsError(
                path,
                f"gap in the data region: bytes [{covered}, {begin}) belong to no tensor "
                f"(before tensor {_show(t.name)})",
            )
        covered = end
        previous = t
    if covered != data_len:
        raise SafetensorsError(
            path,
            f"{data_len - covered} trailing byte(s) after the last tensor: data region bytes "
            f"[{covered}, {data_len}) belong to no tensor",
        )


# --------------------------------------------------------------------------- helpers


def _is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _U64_MAX  # bool is an int subclass: excluded


def _check_text(text: str, what: str, path: str) -> None:
    """JSON escapes can spell lone surrogates, which are not Unicode; refuse them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SafetensorsError(
            path, f"{what} in the header ({_show(text)}) is not valid Unicode"
        ) from None


def _show(value: Any) -> str:
    """A short repr for error messages: names and shapes come from untrusted input."""
    text = repr(value)
    if len(text) > _SHOW_CHARS:
        text = text[: _SHOW_CHARS - 3] + "..."
    return text
