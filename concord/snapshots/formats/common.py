"""What every checkpoint-format reader shares: pieces, the layout they make, bounded reads.

A reader finds the *pieces* of a file: tensors (``kind="tensor"``) and opaque records
(``kind="data"``), each a byte range. :func:`layout_from_pieces` turns them into the layout a
snapshot cuts, covering the whole file contiguously: the bytes before the first piece are the
``("header", "")`` part, the bytes between a piece and the next (a zip entry's data descriptor and
the next local header, GGUF alignment padding, …) the ``("header", <name of the piece before>)``
part. So a changed tensor's own bookkeeping (its CRC, say) lands in a part named after it, and
each piece's chunks start at its first byte.

A reader that meets anything it does not expect raises :class:`Unreadable`; the dispatcher then
snapshots the file as one opaque part, as before these readers existed. Nothing here executes
anything a file holds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from concord.snapshots.safetensors_header import DTYPE_BITS

#: torch dtype names (``torch.float32`` → ``float32``) → the safetensors dtype names the manifest
#: checks lengths against; a dtype not listed keeps its torch name (and its length is not checked)
TORCH_DTYPES: dict[str, str] = {
    "float32": "F32", "float": "F32", "float64": "F64", "double": "F64",
    "float16": "F16", "half": "F16", "bfloat16": "BF16", "complex64": "C64",
    "int64": "I64", "long": "I64", "int32": "I32", "int": "I32", "int16": "I16", "short": "I16",
    "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
}

#: legacy typed-storage class names (``torch.FloatStorage``) → torch dtype names
STORAGE_DTYPES: dict[str, str] = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "UInt16Storage": "uint16", "UInt32Storage": "uint32", "UInt64Storage": "uint64",
    "Float8_e4m3fnStorage": "float8_e4m3fn", "Float8_e5m2Storage": "float8_e5m2",
    "Float8_e4m3fnuzStorage": "float8_e4m3fnuz", "Float8_e5m2fnuzStorage": "float8_e5m2fnuz",
    "Float8_e8m0fnuStorage": "float8_e8m0fnu",
}

#: a layout entry: (part kind, name, offset, length, dtype, shape), as the snapshot cuts it
LayoutEntry = tuple[str, str, int, int, "str | None", "tuple[int, ...] | None"]


class Unreadable(Exception):
    """The file is not what its name says, or is damaged: snapshot it as one opaque part."""


@dataclass(frozen=True)
class Piece:
    """A tensor (or opaque record) found in a file: ``length`` bytes from ``offset``."""

    kind: str  # "tensor" or "data"
    name: str
    offset: int
    length: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


def tensor_piece(name: str, offset: int, length: int, dtype: str | None, shape) -> Piece:
    """A tensor piece whose dtype and shape agree with its length, as the manifest requires.

    A shape that does not fill the bytes (a view saved with a larger storage) becomes the flat
    shape of the bytes; bytes that no whole number of elements fills, or no dtype, become a
    ``data`` piece of the same name.
    """
    if dtype is None:
        return Piece("data", name, offset, length)
    bits = DTYPE_BITS.get(dtype)
    if bits is None:  # a dtype the manifest does not check: keep what the file says
        return Piece("tensor", name, offset, length, dtype, tuple(shape) if shape is not None else (length,))
    if shape is not None and math.prod(shape) * bits == 8 * length:
        return Piece("tensor", name, offset, length, dtype, tuple(shape))
    if (8 * length) % bits == 0:
        return Piece("tensor", name, offset, length, dtype, ((8 * length) // bits,))
    return Piece("data", name, offset, length)


def layout_from_pieces(pieces: list[Piece], size: int) -> list[LayoutEntry]:
    """The layout covering ``[0, size)``: the pieces in file order and the gaps between them.

    Pieces must lie inside the file and not overlap (else :class:`Unreadable`). Part keys are made
    unique (a second ``(kind, name)`` gets ``#2``, …), since a manifest refuses a key twice.
    """
    out: list[LayoutEntry] = []
    at = 0
    before = ""
    for p in sorted(pieces, key=lambda p: (p.offset, p.length)):
        if p.offset < at or p.length < 0 or p.offset + p.length > size:
            raise Unreadable(f"{p.name!r} at [{p.offset}, {p.offset + p.length}) overlaps or runs past the file")
        if p.length == 0:
            continue  # an empty tensor has no bytes to cut; its name stays in the file's own header
        if p.offset > at:
            out.append(("header", before, at, p.offset - at, None, None))
        out.append((p.kind, p.name, p.offset, p.length, p.dtype, p.shape))
        at = p.offset + p.length
        before = p.name
    if at < size:
        out.append(("header", before, at, size - at, None, None))
    return _unique(out)


def _unique(layout: list[LayoutEntry]) -> list[LayoutEntry]:
    seen: set[tuple[str, str]] = set()
    out = []
    for kind, name, *rest in layout:
        key, n = name, 1
        while (kind, key) in seen:
            n += 1
            key = f"{name}#{n}"
        seen.add((kind, key))
        out.append((kind, key, *rest))
    return out


def pread(fd: int, length: int, offset: int) -> bytes:
    """Exactly ``length`` bytes at ``offset`` (a short read means the file is shorter: :class:`Unreadable`)."""
    if length < 0 or offset < 0:
        raise Unreadable("negative offset or length")
    parts = []
    got = 0
    while got < length:
        b = os.pread(fd, length - got, offset + got)
        if not b:
            raise Unreadable(f"the file ends before byte {offset + length}")
        parts.append(b)
        got += len(b)
    return b"".join(parts)
