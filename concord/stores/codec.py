"""How a chunk's bytes are compressed at rest: a one-byte frame, then the payload.

Frames (the first byte of a stored chunk in a compressed store)::

    0x00  raw                      the chunk's bytes as they are
    0x01  zstd                     one zstd frame of the chunk's bytes
    0x02  byte planes              width w (1 byte), then w planes, each: mode (1 byte: 0 raw,
                                   1 zstd), length (4 bytes, little-endian), bytes; then the
                                   tail (the last len % w bytes) raw

Byte planes are for tensors of floating dtypes: each element (2 bytes for bf16 and fp16, 4 for
fp32, 8 for fp64) is first rotated left by one bit, so the sign bit leaves the top byte and the top
byte holds the exponent (all 8 bits of it in bf16 and fp32); byte ``i`` of every element then goes
to plane ``i``. The exponent plane of trained weights is highly skewed and shrinks several times
under zstd; the mantissa planes are close to random and are kept raw when zstd cannot shrink them,
which also makes decoding them a copy. A chunk whose encoding is not smaller than the chunk is
stored raw (frame 0x00).

Chunk ids are always the hash of the raw bytes: a frame is how a store keeps a chunk, never what
the chunk is. Pure functions over bytes (``numpy`` and ``zstandard``, imported on first use).
"""

from __future__ import annotations

import struct
import threading

#: the store encodings a person chooses between
COMPRESS_NONE, COMPRESS_ZSTD, COMPRESS_AUTO = "none", "zstd", "auto"
COMPRESS_MODES = (COMPRESS_NONE, COMPRESS_ZSTD, COMPRESS_AUTO)

RAW, ZSTD, PLANES = 0x00, 0x01, 0x02
FRAMES = {RAW: "raw", ZSTD: "zstd", PLANES: "byte planes"}
ZSTD_LEVEL = 3
#: zstd level of the byte planes: on a skewed exponent plane level 1 is both faster and smaller than 3
PLANE_LEVEL = 1

#: element width of the safetensors dtypes whose chunks are split into byte planes
PLANE_WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}
_UINT = {2: "<u2", 4: "<u4", 8: "<u8"}
_PLANE_HEAD = struct.Struct("<BI")

_local = threading.local()


class FrameError(ValueError):
    """Encoded bytes that do not decode; the store turns it into an error naming the chunk."""


def _zstd():
    import zstandard

    return zstandard


def _compressor():
    c = getattr(_local, "cctx", None)
    if c is None:
        c = _local.cctx = _zstd().ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _decompressor():
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = _zstd().ZstdDecompressor()
    return d


def _zstd_compress(data) -> bytes:
    return _compressor().compress(data)


def _zstd_decompress(data, size: int) -> bytes:
    try:
        out = _decompressor().decompress(data, max_output_size=size)
    except _zstd().ZstdError as exc:
        raise FrameError(f"zstd payload does not decode ({exc})") from None
    if len(out) != size:
        raise FrameError(f"zstd payload decodes to {len(out)} bytes, {size} expected")
    return out


def _planes_compressor():
    c = getattr(_local, "pctx", None)
    if c is None:
        z = _zstd()
        # a byte plane has few long matches: a tiny match table (hash_log 6) and long minimum
        # matches leave zstd mostly to its entropy coder, three times faster and a little smaller
        params = z.ZstdCompressionParameters.from_level(PLANE_LEVEL, hash_log=6, min_match=7)
        c = _local.pctx = z.ZstdCompressor(compression_params=params)
    return c


def _scratch(kind, n: int, slot: int):
    """A reusable array of ``n`` elements of ``kind`` for this thread: fresh arrays of megabytes
    cost a page fault per page on every chunk, which is most of a decode's time."""
    import numpy as np

    key = (np.dtype(kind).str, slot)
    pool = getattr(_local, "scratch", None)
    if pool is None:
        pool = _local.scratch = {}
    arr = pool.get(key)
    if arr is None or len(arr) < n:
        arr = pool[key] = np.empty(n, dtype=kind)
    return arr[:n]


def _split(view, width: int) -> list:
    """The ``width`` byte planes of the elements of ``view`` (each rotated left by one bit),
    low byte first, as contiguous uint8 arrays: shifts and casts over whole arrays, no strides."""
    import numpy as np

    kind = np.dtype(_UINT[width])
    n = len(view) // width
    a = np.frombuffer(view, dtype=kind, count=n)
    r, t = _scratch(kind, n, 0), _scratch(kind, n, 1)
    np.left_shift(a, kind.type(1), out=r)
    np.right_shift(a, kind.type(width * 8 - 1), out=t)
    r |= t
    planes = []
    for i in range(width):
        plane = _scratch(np.uint8, n, 2 + i)
        if i:
            np.right_shift(r, kind.type(8 * i), out=t)
        np.copyto(plane, t if i else r, casting="unsafe")  # the low byte of each element
        planes.append(plane)
    return planes


def _join(planes: list, width: int) -> bytes:
    """The elements the byte ``planes`` of :func:`_split` came from (rotated back)."""
    import numpy as np

    kind = np.dtype(_UINT[width])
    n = len(planes[0])
    v, t = _scratch(kind, n, 0), _scratch(kind, n, 1)
    np.copyto(v, planes[-1])
    for plane in reversed(planes[:-1]):
        v <<= kind.type(8)
        np.copyto(t, plane)
        v |= t
    np.left_shift(v, kind.type(width * 8 - 1), out=t)
    v >>= kind.type(1)
    v |= t
    return v.tobytes()


def encode_planes(data, width: int) -> bytes:
    """The byte-plane frame of ``data`` (elements of ``width`` bytes; see the module)."""
    view = memoryview(data).cast("B")
    n = len(view) // width
    out = [bytes((PLANES, width))]
    for plane in _split(view, width):
        packed = _planes_compressor().compress(plane.data)
        if len(packed) < n:
            out += [_PLANE_HEAD.pack(1, len(packed)), packed]
        else:
            out += [_PLANE_HEAD.pack(0, n), plane.tobytes()]
    out.append(bytes(view[n * width :]))
    return b"".join(out)


def decode_planes(payload, size: int) -> bytes:
    """The ``size`` raw bytes of a byte-plane frame's payload (what follows its ``0x02``)."""
    import numpy as np

    view = memoryview(payload)
    if len(view) < 1 or view[0] not in _UINT:
        raise FrameError("byte-plane frame with an unknown element width")
    width = view[0]
    n = size // width
    planes = []
    pos = 1
    for i in range(width):
        if pos + _PLANE_HEAD.size > len(view):
            raise FrameError("byte-plane frame cut short")
        mode, length = _PLANE_HEAD.unpack_from(view, pos)
        pos += _PLANE_HEAD.size
        payload = view[pos : pos + length]
        if len(payload) != length:
            raise FrameError("byte-plane frame cut short")
        pos += length
        if mode == 1:
            plane = _zstd_decompress(payload, n)
        elif mode == 0 and length == n:
            plane = payload
        else:
            raise FrameError(f"byte plane {i} has mode {mode} and {length} bytes for {n} elements")
        planes.append(np.frombuffer(plane, dtype=np.uint8))
    tail = view[pos:]
    if n * width + len(tail) != size:
        raise FrameError(f"byte-plane frame holds {n * width + len(tail)} bytes, {size} expected")
    body = _join(planes, width)
    return body + bytes(tail) if len(tail) else body


def encode(data, mode: str, dtype: str | None = None) -> bytes:
    """The frame that stores ``data`` under compress ``mode`` (``dtype``: the safetensors dtype
    of the tensor the chunk belongs to, if it is part of one). Never larger than ``data`` + 1."""
    view = memoryview(data).cast("B")
    if mode == COMPRESS_NONE or len(view) == 0:
        return bytes((RAW,)) + view
    width = PLANE_WIDTH.get(dtype or "") if mode == COMPRESS_AUTO else None
    if width and len(view) >= 4 * width:
        frame = encode_planes(view, width)
    else:
        frame = bytes((ZSTD,)) + _zstd_compress(view)
    if len(frame) >= len(view) + 1:
        return bytes((RAW,)) + view
    return frame


def frame_kind(frame) -> int:
    """The encoding byte a frame starts with (:class:`FrameError` if empty)."""
    if len(frame) == 0:
        raise FrameError("empty object: no encoding byte")
    return frame[0]


def decode(frame, size: int | None = None) -> bytes:
    """The raw bytes of ``frame``. ``size`` (when known) bounds what zstd may produce; without it
    a zstd frame must state its content size. :class:`FrameError` for anything else."""
    kind = frame_kind(frame)
    return decode_payload(kind, memoryview(frame)[1:], size)


def decode_payload(kind: int, payload, size: int | None = None) -> bytes:
    """The raw bytes of a frame's ``payload`` (what follows its encoding byte ``kind``)."""
    view = memoryview(payload)
    if kind == RAW:
        return payload if isinstance(payload, bytes) else bytes(view)
    if kind == ZSTD:
        if size is None:
            try:
                size = _zstd().frame_content_size(view)
            except _zstd().ZstdError as exc:
                raise FrameError(f"zstd payload does not decode ({exc})") from None
            if size < 0:
                raise FrameError("zstd frame does not state its size")
        return _zstd_decompress(view, size)
    if kind == PLANES:
        return decode_planes(view, planes_size(view) if size is None else size)
    raise FrameError(f"unknown encoding byte 0x{kind:02x}")


def planes_size(payload) -> int:
    """The raw size a byte-plane frame's payload stands for (read from its planes' headers)."""
    view = memoryview(payload)
    if len(view) < 1 or view[0] not in _UINT:
        raise FrameError("byte-plane frame with an unknown element width")
    width, pos, n = view[0], 1, None
    for i in range(width):
        if pos + _PLANE_HEAD.size > len(view):
            raise FrameError("byte-plane frame cut short")
        mode, length = _PLANE_HEAD.unpack_from(view, pos)
        pos += _PLANE_HEAD.size
        if mode == 0:
            n = length
        elif n is None:
            try:
                n = _zstd().frame_content_size(view[pos : pos + length])
            except _zstd().ZstdError as exc:
                raise FrameError(f"zstd payload does not decode ({exc})") from None
        pos += length
    if n is None or n < 0:
        raise FrameError("byte-plane frame does not state its size")
    return n * width + (len(view) - pos)


__all__ = [
    "COMPRESS_AUTO",
    "COMPRESS_MODES",
    "COMPRESS_NONE",
    "COMPRESS_ZSTD",
    "FRAMES",
    "FrameError",
    "PLANE_WIDTH",
    "decode",
    "encode",
]
