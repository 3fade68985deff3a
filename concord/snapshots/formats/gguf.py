"""GGUF (llama.cpp): a header, tensor infos, then each tensor's bytes at an aligned offset.

The file is ``GGUF``, a version (2 or 3), the tensor and key-value counts (u64), the key-values
(``general.alignment`` among them, default 32), and per tensor its name, dimensions, ggml type
and offset (u64) from the start of the data section, which begins at the next multiple of the
alignment after the infos. Version 1 (llama.cpp before September 2023) is the same but for its
counts, string and array lengths and dimensions, which are u32. Every length is checked against the bytes left before it is used,
so a count or a string length the file merely claims never allocates anything.

A tensor part has the tensor's ggml type as its dtype (``F32``, ``BF16``, ``Q4_K``, …) and its
shape outermost dimension first, as gguf-py shows it; the alignment padding after it is the
header part named after it. A type this table does not know takes the bytes up to the next
tensor (dtype ``GGML_<n>``).
"""

from __future__ import annotations

import os
import struct

from concord.snapshots.formats.common import Piece, Unreadable, pread, tensor_piece

SUFFIX = ".gguf"
MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

#: ggml type id → (name, block size in elements, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# value types: fixed widths, and 8 (string) / 9 (array) read specially
_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_WINDOW = 1 << 20
_MAX_DIMS = 16


def looks_like_gguf(path: str) -> bool:
    return os.path.splitext(path)[1].lower() == SUFFIX


class _Cursor:
    """Sequential little-endian reads through a file, a window at a time, never past ``size``."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.pos = 0
        self.count = self.u64  # counts, lengths and dimensions: u32 in version 1
        self._buf, self._at = b"", 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise Unreadable(f"the header claims {n} bytes at byte {self.pos}, past the end of the file")
        rel = self.pos - self._at
        if rel + n > len(self._buf):
            self._at = self.pos
            self._buf = pread(self.fd, min(max(n, _WINDOW), self.size - self.pos), self.pos)
            rel = 0
        self.pos += n
        return self._buf[rel : rel + n]

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise Unreadable(f"the header claims {n} bytes at byte {self.pos}, past the end of the file")
        self.pos += n

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return self.take(self.count())

    def left(self) -> int:
        return self.size - self.pos


def file_pieces(fd: int, size: int) -> list[Piece]:
    c = _Cursor(fd, size)
    if c.take(4) != MAGIC:
        raise Unreadable("no GGUF magic")
    version = c.u32()
    if version not in (1, 2, 3):
        raise Unreadable(f"GGUF version {version} (1 to 3 are read)")
    if version == 1:
        c.count = c.u32
    n_tensors, n_kv = c.count(), c.count()
    width = 8 if version > 1 else 4
    # the smallest key-value (an empty key, a type, a byte) and tensor info (an empty name, no dimensions)
    if n_kv * (width + 5) > c.left() or n_tensors * (width + 16) > c.left():
        raise Unreadable("counts larger than the file")
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = c.string()
        vtype = c.u32()
        if key == b"general.alignment" and vtype == _UINT32:
            alignment = c.u32()
            if alignment == 0 or alignment & (alignment - 1):
                raise Unreadable(f"alignment {alignment} is not a power of two")
        else:
            _skip_value(c, vtype)
    infos = []
    for _ in range(n_tensors):
        name = c.string().decode("utf-8", "replace")
        n_dims = c.u32()
        if n_dims > _MAX_DIMS:
            raise Unreadable(f"tensor {name[:80]!r} has {n_dims} dimensions")
        dims = [c.count() for _ in range(n_dims)]
        infos.append((name, dims, c.u32(), c.u64()))
    data_start = -(-c.pos // alignment) * alignment
    if data_start > size:
        raise Unreadable("no data section")
    ordered = sorted(infos, key=lambda t: t[3])
    pieces = []
    for i, (name, dims, gtype, off) in enumerate(ordered):
        if off % alignment:
            raise Unreadable(f"tensor {name[:80]!r} at offset {off} is not aligned to {alignment}")
        begin = data_start + off
        nxt = data_start + ordered[i + 1][3] if i + 1 < len(ordered) else size
        numel = 1
        for d in dims:
            numel *= d
        known = GGML_TYPES.get(gtype)
        shape = tuple(reversed(dims))
        if known is None:
            pieces.append(tensor_piece(name, begin, max(0, nxt - begin), f"GGML_{gtype}", None))
            continue
        tname, block, per_block = known
        if dims and dims[0] % block:
            raise Unreadable(f"tensor {name[:80]!r}: {dims[0]} elements a row do not fill {tname} blocks")
        pieces.append(tensor_piece(name, begin, numel // block * per_block, tname, shape))
    return pieces


def _skip_value(c: _Cursor, vtype: int) -> None:
    if vtype in _WIDTH:
        c.skip(_WIDTH[vtype])
    elif vtype == _STRING:
        c.string()
    elif vtype == _ARRAY:
        item, n = c.u32(), c.count()
        if item in _WIDTH:
            c.skip(_WIDTH[item] * n)
        elif item == _STRING:
            if n * 4 > c.left():
                raise Unreadable("array longer than the file")
            for _ in range(n):
                c.string()
        else:  # arrays of arrays are allowed by the spec but never written; refuse rather than recurse
            raise Unreadable(f"array of value type {item}")
    else:
        raise Unreadable(f"unknown value type {vtype}")
