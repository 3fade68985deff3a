"""How a chunk's bytes are compressed at rest: a one-byte frame, then the payload.

Frames (the first byte of a stored chunk in a compressed store)::

    0x00  raw                      the chunk's bytes as they are
    0x01  zstd                     one zstd frame of the chunk's bytes
    0x03  byte planes              width w (1 byte), then w planes, each: mode (1 byte: 0 raw,
                                   1 zstd), length (4 bytes, little-endian), bytes; then the
                                   tail (the last len % w bytes) raw
    0x02  rotated byte planes      as 0x03, each element rotated left by one bit before the split
                                   (written by earlier versions; read, never written)
    0x04  delta                    the base chunk's id (32 bytes), then a frame (0x00, 0x01 or
                                   0x03) of the XOR of the chunk's bytes with the base's: the
                                   chunk is the base chunk's bytes XOR that (:func:`encode_delta`)

Byte planes are for tensors of floating dtypes: byte ``i`` of every element (2 bytes for bf16 and
fp16, 4 for fp32, 8 for fp64) goes to plane ``i``. The top plane holds the sign and all but the
lowest exponent bit: on trained weights it is highly skewed and shrinks several times under zstd.
The other planes are close to random and are kept raw when zstd cannot shrink them, which also
makes decoding them a copy. Rotating each element first (0x02) puts the whole exponent in the top
plane and the sign in the bottom one: it stores about 1% less, but splitting and joining take
twice the passes over memory, the larger cost (architecture.md, Compression). A chunk whose
encoding is not smaller than the chunk is stored raw (frame 0x00).

A delta (0x04) is what makes a fine-tune, or the next step of a training run, cost what changed in
its bits: most bytes of a slightly moved tensor are those of the same tensor in the version before,
and the ones that differ differ in the low bits, so the XOR is mostly zero bytes, in the top planes
above all. The base is always a chunk stored whole (never a delta itself): a read decodes at most
one level (docs/deltas.md).

Chunk ids are always the hash of the raw bytes: a frame is how a store keeps a chunk, never what
the chunk is. Pure functions over bytes (``numpy`` and ``zstandard``, imported on first use).
"""

from __future__ import annotations

import struct
import threading

from concord.errors import FrameError
from concord.stores import scratch

#: the store encodings a person chooses between
COMPRESS_NONE, COMPRESS_ZSTD, COMPRESS_AUTO = "none", "zstd", "auto"
COMPRESS_MODES = (COMPRESS_NONE, COMPRESS_ZSTD, COMPRESS_AUTO)

RAW, ZSTD, ROTATED_PLANES, PLANES, DELTA = 0x00, 0x01, 0x02, 0x03, 0x04
FRAMES = {RAW: "raw", ZSTD: "zstd", ROTATED_PLANES: "rotated byte planes", PLANES: "byte planes", DELTA: "delta"}
#: the bytes of a base chunk's id at the head of a delta's payload
BASE_ID_BYTES = 32
ZSTD_LEVEL = 3
#: zstd level of the byte planes: on a skewed exponent plane level 1 is both faster and smaller than 3
PLANE_LEVEL = 1

#: element width of the safetensors dtypes whose chunks are split into byte planes
PLANE_WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}
_UINT = {2: "<u2", 4: "<u4", 8: "<u8"}
_PLANE_HEAD = struct.Struct("<BI")

#: no chunk is larger (the largest chunk size a snapshot takes): a frame that says otherwise is damaged
MAX_RAW_BYTES = 64 * 1024 * 1024

_local = threading.local()
#: a plane is compressed only if zstd shrinks a sample of it (three pieces of this many bytes) by
#: at least :data:`SAMPLE_GAIN`: a mantissa plane is close to random, and zstd spends nearly as long
#: failing on it as succeeding on the exponent plane
SAMPLE_BYTES = 16 * 1024
SAMPLE_GAIN = 0.02


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


def _zstd_decompress_into(data, out: memoryview) -> None:
    """Decompress the zstd frame ``data`` into ``out``, which it must fill exactly."""
    z = _zstd()
    try:
        with _decompressor().stream_reader(data, read_across_frames=False) as reader:
            got = 0
            while got < len(out):
                n = reader.readinto(out[got:])
                if not n:
                    break
                got += n
            extra = reader.read(1) if got == len(out) else b""
    except z.ZstdError as exc:
        raise FrameError(f"zstd payload does not decode ({exc})") from None
    if got != len(out) or extra:
        raise FrameError(f"zstd payload decodes to {'more than ' if extra else ''}{got} bytes, {len(out)} expected")


def _planes_compressor():
    c = getattr(_local, "pctx", None)
    if c is None:
        z = _zstd()
        # a byte plane has few long matches: a tiny match table (hash_log 6) and long minimum
        # matches leave zstd mostly to its entropy coder, three times faster and a little smaller
        params = z.ZstdCompressionParameters.from_level(PLANE_LEVEL, hash_log=6, min_match=7)
        c = _local.pctx = z.ZstdCompressor(compression_params=params)
    return c


def _split(view, width: int) -> list:
    """The ``width`` byte planes of the elements of ``view``, low byte first, as contiguous uint8
    arrays (transient: this thread's scratch buffers). One pass over memory per plane."""
    import numpy as np

    kind = np.dtype(_UINT[width])
    n = len(view) // width
    a = np.frombuffer(view, dtype=kind, count=n)
    planes = []
    for i in range(width):
        plane = scratch.array(f"plane{i}", np.uint8, n)
        if i:
            np.right_shift(a, kind.type(8 * i), out=plane, dtype=kind, casting="unsafe")
        else:
            np.copyto(plane, a, casting="unsafe")  # the low byte of each element
        planes.append(plane)
    return planes


def _join_into(planes: list, width: int, out: memoryview) -> None:
    """Write into ``out`` the elements the byte ``planes`` of :func:`_split` came from
    (two passes over memory for 2-byte elements)."""
    import numpy as np

    kind = np.dtype(_UINT[width])
    n = len(planes[0])
    v = np.frombuffer(out, dtype=kind, count=n)
    np.left_shift(planes[-1], kind.type(8 * (width - 1)), out=v, dtype=kind)
    if width > 2:
        t = scratch.array("join.t", kind, n)
        for i in range(width - 2, 0, -1):
            np.left_shift(planes[i], kind.type(8 * i), out=t, dtype=kind)
            v |= t
    np.bitwise_or(v, planes[0], out=v, dtype=kind)


def _unrotate(width: int, out: memoryview) -> None:
    """Rotate each element of ``out`` right by one bit: undoes the rotation of a 0x02 frame."""
    import numpy as np

    kind = np.dtype(_UINT[width])
    n = len(out) // width
    v = np.frombuffer(out, dtype=kind, count=n)
    t = scratch.array("join.t", kind, n)
    np.left_shift(v, kind.type(width * 8 - 1), out=t)
    v >>= kind.type(1)
    v |= t


def _worth_compressing(plane) -> bool:
    """Whether zstd shrinks samples of ``plane`` (start, middle, end) by :data:`SAMPLE_GAIN`."""
    n = len(plane)
    if n < 8 * SAMPLE_BYTES:
        return True
    pc = _planes_compressor()
    starts = (0, (n // 2) & ~15, n - SAMPLE_BYTES)
    packed = sum(len(pc.compress(plane[s : s + SAMPLE_BYTES].data)) for s in starts)
    return packed < (1 - SAMPLE_GAIN) * 3 * SAMPLE_BYTES


def _encode_planes_view(view: memoryview, width: int) -> memoryview:
    """The byte-plane frame of ``view`` in this thread's ``frame`` buffer (transient)."""
    n = len(view) // width
    planes = _split(view, width)
    out = scratch.buffer("frame", 2 + width * (_PLANE_HEAD.size + n) + len(view) - n * width)
    out[0], out[1] = PLANES, width
    pos = 2
    for plane in planes:
        packed = _planes_compressor().compress(plane.data) if _worth_compressing(plane) else None
        if packed is not None and len(packed) < n:
            _PLANE_HEAD.pack_into(out, pos, 1, len(packed))
            body = packed
        else:
            _PLANE_HEAD.pack_into(out, pos, 0, n)
            body = plane.data
        pos += _PLANE_HEAD.size
        out[pos : pos + len(body)] = body
        pos += len(body)
    tail = view[n * width :]
    out[pos : pos + len(tail)] = tail
    return out[: pos + len(tail)]


def _read_planes(payload: memoryview, size: int, prefix: str = "plane") -> tuple[int, int, list, memoryview]:
    """``(width, elements, planes, tail)`` of a byte-plane frame's ``payload`` standing for
    ``size`` bytes: each plane a uint8 array, decompressed into this thread's ``<prefix><i>``
    buffer or a read-only view of ``payload`` for a plane kept raw."""
    import numpy as np

    view = payload
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
        body = view[pos : pos + length]
        if len(body) != length:
            raise FrameError("byte-plane frame cut short")
        pos += length
        if mode == 1:
            plane = scratch.array(f"{prefix}{i}", np.uint8, n)
            _zstd_decompress_into(body, memoryview(plane))
        elif mode == 0 and length == n:
            plane = np.frombuffer(body, dtype=np.uint8)
        else:
            raise FrameError(f"byte plane {i} has mode {mode} and {length} bytes for {n} elements")
        planes.append(plane)
    tail = view[pos:]
    if n * width + len(tail) != size:
        raise FrameError(f"byte-plane frame holds {n * width + len(tail)} bytes, {size} expected")
    return width, n, planes, tail


def _decode_planes_into(payload: memoryview, out: memoryview, *, rotated: bool = False) -> None:
    """Write into ``out`` the raw bytes of a byte-plane frame's ``payload`` (what follows 0x03,
    or 0x02 with ``rotated``)."""
    width, n, planes, tail = _read_planes(payload, len(out))
    _join_into(planes, width, out)
    if rotated:
        _unrotate(width, out[: n * width])
    out[n * width :] = tail


def _raw_frame(view: memoryview) -> memoryview:
    out = scratch.buffer("frame", len(view) + 1)
    out[0] = RAW
    out[1:] = view
    return out


def encode_view(data, mode: str, dtype: str | None = None) -> memoryview:
    """:func:`encode`, in this thread's ``frame`` buffer: transient (see :mod:`.scratch`), valid
    until this thread encodes again; for a caller that writes or seals it at once."""
    view = memoryview(data).cast("B")
    if mode == COMPRESS_NONE or len(view) == 0:
        return _raw_frame(view)
    width = PLANE_WIDTH.get(dtype or "") if mode == COMPRESS_AUTO else None
    if width and len(view) >= 4 * width:
        frame = _encode_planes_view(view, width)
    else:
        packed = _compressor().compress(view)
        frame = scratch.buffer("frame", len(packed) + 1)
        frame[0] = ZSTD
        frame[1:] = packed
    if len(frame) >= len(view) + 1:
        return _raw_frame(view)
    return frame


def encode(data, mode: str, dtype: str | None = None) -> bytes:
    """The frame that stores ``data`` under compress ``mode`` (``dtype``: the safetensors dtype
    of the tensor the chunk belongs to, if it is part of one). Never larger than ``data`` + 1."""
    return bytes(encode_view(data, mode, dtype))


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
    if kind == RAW:
        return payload if isinstance(payload, bytes) else bytes(payload)
    return bytes(decode_view(kind, payload, size))


def decode_view(kind: int, payload, size: int | None = None, *, slot: str = "decoded") -> memoryview:
    """:func:`decode_payload` without a copy: a raw payload is returned as a view of itself,
    anything else is decoded into this thread's ``slot`` buffer (transient, see :mod:`.scratch`)."""
    view = memoryview(payload)
    if kind == DELTA:
        raise FrameError("a delta chunk is decoded against its base chunk, which only its store can read")
    if kind == RAW:
        return view
    if kind == ZSTD:
        if size is None:
            try:
                size = _zstd().frame_content_size(view)
            except _zstd().ZstdError as exc:
                raise FrameError(f"zstd payload does not decode ({exc})") from None
            if size < 0:
                raise FrameError("zstd frame does not state its size")
        if size > MAX_RAW_BYTES:
            raise FrameError(f"zstd frame says it holds {size} bytes, more than any chunk ({MAX_RAW_BYTES})")
        out = scratch.buffer(slot, size)
        _zstd_decompress_into(view, out)
        return out
    if kind in (PLANES, ROTATED_PLANES):
        size = planes_size(view) if size is None else size
        if size > MAX_RAW_BYTES:
            raise FrameError(f"byte-plane frame says it holds {size} bytes, more than any chunk ({MAX_RAW_BYTES})")
        out = scratch.buffer(slot, size)
        _decode_planes_into(view, out, rotated=kind == ROTATED_PLANES)
        return out
    raise FrameError(f"unknown encoding byte 0x{kind:02x}")


def _raw_size(kind: int, payload) -> int:
    """The raw size the frame ``payload`` (after its encoding byte ``kind``) stands for."""
    if kind == RAW:
        return len(payload)
    if kind in (PLANES, ROTATED_PLANES):
        return planes_size(payload)
    if kind == ZSTD:
        try:
            n = _zstd().frame_content_size(memoryview(payload))
        except _zstd().ZstdError as exc:
            raise FrameError(f"zstd payload does not decode ({exc})") from None
        if n >= 0:
            return n
        raise FrameError("zstd frame does not state its size")
    raise FrameError(f"unknown encoding byte 0x{kind:02x}")


def planes_size(payload) -> int:
    """The raw size a byte-plane frame's payload stands for (read from its planes' headers)."""
    view = memoryview(payload)
    if len(view) < 1 or view[0] not in _UINT:
        raise FrameError("byte-plane frame with an unknown element width")
    width, pos, n = view[0], 1, None
    for _ in range(width):
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


def _xor_into(out, a, b) -> None:
    """``out = a XOR b`` (three buffers of one length), eight bytes at a time where it can."""
    import numpy as np

    n = len(out)
    words = n // 8
    if words:
        np.bitwise_xor(
            np.frombuffer(a, dtype=np.uint64, count=words),
            np.frombuffer(b, dtype=np.uint64, count=words),
            out=np.frombuffer(out, dtype=np.uint64, count=words),
        )
    if n % 8:
        start = words * 8
        np.bitwise_xor(
            np.frombuffer(a, dtype=np.uint8, offset=start),
            np.frombuffer(b, dtype=np.uint8, offset=start),
            out=np.frombuffer(out, dtype=np.uint8, offset=start),
        )


def encode_delta(data, base, base_id: str, dtype: str | None = None) -> bytes:
    """The payload of a delta frame (what follows 0x04) that stores ``data`` against ``base``
    (the raw bytes of the chunk ``base_id``, as long as ``data``): the base's id, then the frame
    of their XOR, split into byte planes for a floating ``dtype`` and compressed."""
    view, bview = memoryview(data).cast("B"), memoryview(base).cast("B")
    if len(view) != len(bview):
        raise ValueError(f"a delta needs a base of the chunk's length ({len(view)} bytes), got {len(bview)}")
    xor = scratch.buffer("xor", len(view))
    _xor_into(xor, view, bview)
    return bytes.fromhex(base_id) + bytes(encode_view(xor, COMPRESS_AUTO, dtype))


def delta_base(payload) -> str:
    """The id of the base chunk a delta frame's ``payload`` needs."""
    if len(payload) < BASE_ID_BYTES + 1:
        raise FrameError("delta frame cut short")
    return bytes(payload[:BASE_ID_BYTES]).hex()


def decode_delta(payload, base_kind: int, base_payload, size: int | None = None, *, transient: bool = False):
    """The ``size`` raw bytes a delta frame's ``payload`` stands for, given the frame of the chunk
    :func:`delta_base` names (its encoding byte ``base_kind`` and what follows it, ``base_payload``,
    which may lie in any of this thread's buffers but ``delta`` and the planes'). When both are
    byte planes of one width, each plane of the XOR is applied to the base's plane and the planes
    joined once (a read of a delta then costs little more than two plane decodes). With
    ``transient``, this thread's ``delta`` buffer (see :mod:`.scratch`); else a new buffer."""
    import numpy as np

    body = memoryview(payload)[BASE_ID_BYTES:]
    kind = frame_kind(body)
    if kind == DELTA or base_kind == DELTA:
        raise FrameError("a delta of a delta (a delta's base is always a chunk stored whole)")
    if size is None:
        size = _raw_size(base_kind, base_payload)
    if size > MAX_RAW_BYTES:
        raise FrameError(f"delta says it holds {size} bytes, more than any chunk ({MAX_RAW_BYTES})")
    out = scratch.buffer("delta", size) if transient else memoryview(bytearray(size))
    bview = memoryview(base_payload)
    if kind == PLANES and base_kind == PLANES and len(bview) and body[1] == bview[0]:
        width, n, xs, xtail = _read_planes(body[1:], size)
        bwidth, bn, bs, btail = _read_planes(bview, size, "bplane")
        planes = []
        for i, (x, b) in enumerate(zip(xs, bs)):
            dst = x if x.flags.writeable else scratch.array(f"xplane{i}", np.uint8, n)
            np.bitwise_xor(x, b, out=dst)
            planes.append(dst)
        _join_into(planes, width, out)
        if len(xtail):
            _xor_into(out[n * width :], xtail, btail)
        return out if transient else out.obj
    base = decode_view(base_kind, bview, size)  # in the ``decoded`` buffer, or a view of the frame
    if len(base) != size:
        raise FrameError(f"delta's base holds {len(base)} bytes, {size} expected")
    xor = body[1:] if kind == RAW else decode_view(kind, body[1:], size, slot="delta")
    if len(xor) != size:
        raise FrameError(f"delta holds {len(xor)} bytes, its base {size}")
    _xor_into(out, xor, base)
    return out if transient else out.obj


__all__ = [
    "COMPRESS_AUTO",
    "COMPRESS_MODES",
    "COMPRESS_NONE",
    "COMPRESS_ZSTD",
    "DELTA",
    "FRAMES",
    "FrameError",
    "PLANE_WIDTH",
    "decode",
    "decode_delta",
    "decode_view",
    "delta_base",
    "encode",
    "encode_delta",
    "encode_view",
]
