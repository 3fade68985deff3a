"""How a chunk's bytes are compressed at rest: a one-byte frame, then the payload.

Frames (the first byte of a stored chunk in a compressed store)::

    0x00  raw                      the chunk's bytes as they are
    0x01  zstd                     one zstd frame of the chunk's bytes
    0x03  byte planes              width w (1 byte), then w planes, each: mode (1 byte: 0 raw,
                                   1 zstd, 2 sparse), length (4 bytes, little-endian), bytes;
                                   then the tail (the last len % w bytes) raw
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

A sparse plane (mode 2, written only in the XOR of a delta, where at most :data:`SPARSE_SHARE` of
its bytes are not zero) keeps the plane's non-zero bytes and where they are: its length in elements
(4 bytes), how many entries it has (4 bytes), the length of the first zstd frame (4 bytes), then a
zstd frame of the steps (1 byte each, 1 to 255: entry ``j`` is at element ``steps[0] + … +
steps[j] - 1``; a gap longer than 255 takes entries of value 0 on the way) and a zstd frame of
the entries' values; every other byte is zero. The XOR's low plane of a small update is mostly zero
bytes between scattered ones: zstd decodes such a plane as short runs of zeros between literals
(sequences, one every few bytes), three times slower than a plane of literals, while the steps
and values are nearly all literals, so the sparse plane decodes (steps, values, a cumulative sum
and one scatter) in 0.6x to 0.8x the time, and stores about 0.7x the bytes, close to the plane's
entropy (docs/deltas.md, figures).

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
from typing import Any, NamedTuple

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
#: plane modes
PLANE_RAW, PLANE_ZSTD, PLANE_SPARSE = 0, 1, 2
#: head of a sparse plane: its elements, its entries, the bytes of its steps' zstd frame
_SPARSE_HEAD = struct.Struct("<III")
#: a plane of a delta's XOR is kept sparse when at most this share of its bytes are not zero
#: (measured on fine-tunes in bf16, fp16 and fp32: the sparse plane is the smaller of the two
#: below this share, by up to 30%, and at most as slow to decode)
SPARSE_SHARE = 0.5
#: the longest step between two entries of a sparse plane (one byte)
MAX_STEP = 255

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


def _encode_sparse(plane) -> bytes:
    """The body of a sparse plane (mode 2) of ``plane``, a uint8 array (see the module's doc)."""
    import numpy as np

    at = np.flatnonzero(plane)
    values = plane[at]
    steps = np.diff(at, prepend=-1)
    if len(steps) and int(steps.max()) > MAX_STEP:  # entries of value 0 on the way of each long gap
        fill = (steps - 1) // MAX_STEP
        ends = np.cumsum(fill + 1) - 1
        long_steps = np.full(int(ends[-1]) + 1, MAX_STEP, dtype=steps.dtype)
        long_steps[ends] = steps - MAX_STEP * fill
        long_values = np.zeros(len(long_steps), dtype=np.uint8)
        long_values[ends] = values
        steps, values = long_steps, long_values
    if not len(steps):
        return _SPARSE_HEAD.pack(len(plane), 0, 0)
    pc = _planes_compressor()
    packed_steps = pc.compress(steps.astype(np.uint8).data)
    return _SPARSE_HEAD.pack(len(plane), len(steps), len(packed_steps)) + packed_steps + pc.compress(values.data)


class SparsePlane(NamedTuple):
    """A sparse plane's entries: the elements ``at`` (numpy's index type) hold ``values``, every
    other element is zero (transient arrays, in this thread's buffers)."""

    at: Any
    values: Any


def _sparse_entries(body: memoryview, n: int, slot: str = "sparse") -> SparsePlane:
    """The entries of a sparse plane's ``body`` standing for ``n`` elements, decoded into this
    thread's ``<slot>.*`` buffers."""
    import numpy as np

    if len(body) < _SPARSE_HEAD.size:
        raise FrameError("sparse byte plane cut short")
    count, k, steps_len = _SPARSE_HEAD.unpack_from(body)
    if count != n or k > n or _SPARSE_HEAD.size + steps_len > len(body):
        raise FrameError(f"sparse byte plane of {count} elements and {k} entries where {n} elements are expected")
    if not k:
        if len(body) != _SPARSE_HEAD.size:
            raise FrameError("sparse byte plane without entries holds bytes")
        return SparsePlane(np.empty(0, dtype=np.intp), np.empty(0, dtype=np.uint8))
    steps = scratch.array(f"{slot}.steps", np.uint8, k)
    _zstd_decompress_into(body[_SPARSE_HEAD.size : _SPARSE_HEAD.size + steps_len], memoryview(steps))
    values = scratch.array(f"{slot}.values", np.uint8, k)
    _zstd_decompress_into(body[_SPARSE_HEAD.size + steps_len :], memoryview(values))
    at = scratch.array(f"{slot}.at", np.intp, k)  # intp: numpy would convert any other index type first
    np.cumsum(steps, dtype=np.intp, out=at)
    at -= 1
    if at[0] < 0 or at[-1] >= n:
        raise FrameError(f"sparse byte plane has entries outside its {n} elements")
    return SparsePlane(at, values)


def _all_sparse(payload: memoryview) -> bool:
    """Whether every plane of a byte-plane frame's ``payload`` is sparse (read from their heads)."""
    if len(payload) < 1 or payload[0] not in _UINT:
        return False
    pos = 1
    for _ in range(payload[0]):
        if pos + _PLANE_HEAD.size > len(payload):
            return False
        mode, length = _PLANE_HEAD.unpack_from(payload, pos)
        if mode != PLANE_SPARSE:
            return False
        pos += _PLANE_HEAD.size + length
    return True


def _decode_sparse_into(body: memoryview, out) -> None:
    """Write into ``out`` (a uint8 array of the plane's length) the plane a sparse body stands for."""
    entries = _sparse_entries(body, len(out))
    out.fill(0)
    out[entries.at] = entries.values


def _encode_planes_view(view: memoryview, width: int, *, sparse: bool = False) -> memoryview:
    """The byte-plane frame of ``view`` in this thread's ``frame`` buffer (transient). With
    ``sparse`` (a delta's XOR), a plane of mostly zero bytes is kept sparse (mode 2)."""
    import numpy as np

    n = len(view) // width
    planes = _split(view, width)
    out = scratch.buffer("frame", 2 + width * (_PLANE_HEAD.size + n) + len(view) - n * width)
    out[0], out[1] = PLANES, width
    pos = 2
    for plane in planes:
        packed = None
        mode = PLANE_ZSTD
        if sparse and np.count_nonzero(plane) <= SPARSE_SHARE * n:
            packed, mode = _encode_sparse(plane), PLANE_SPARSE
            if n < 8 * SAMPLE_BYTES:  # a small plane: its two zstd frames may cost more than they save
                dense = _planes_compressor().compress(plane.data)
                if len(dense) <= len(packed):
                    packed, mode = dense, PLANE_ZSTD
        elif _worth_compressing(plane):
            packed = _planes_compressor().compress(plane.data)
        if packed is not None and len(packed) < n:
            _PLANE_HEAD.pack_into(out, pos, mode, len(packed))
            body = packed
        else:
            _PLANE_HEAD.pack_into(out, pos, PLANE_RAW, n)
            body = plane.data
        pos += _PLANE_HEAD.size
        out[pos : pos + len(body)] = body
        pos += len(body)
    tail = view[n * width :]
    out[pos : pos + len(tail)] = tail
    return out[: pos + len(tail)]


def _read_planes(
    payload: memoryview, size: int, prefix: str = "plane", *, entries: bool = False
) -> tuple[int, int, list, memoryview]:
    """``(width, elements, planes, tail)`` of a byte-plane frame's ``payload`` standing for
    ``size`` bytes: each plane a uint8 array, decompressed into this thread's ``<prefix><i>``
    buffer or a read-only view of ``payload`` for a plane kept raw. With ``entries``, a sparse
    plane is given as its :class:`SparsePlane` instead of being spread into an array."""
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
        if mode == PLANE_ZSTD:
            plane = scratch.array(f"{prefix}{i}", np.uint8, n)
            _zstd_decompress_into(body, memoryview(plane))
        elif mode == PLANE_SPARSE and entries:
            plane = _sparse_entries(body, n, f"{prefix}{i}")
        elif mode == PLANE_SPARSE:
            plane = scratch.array(f"{prefix}{i}", np.uint8, n)
            _decode_sparse_into(body, plane)
        elif mode == PLANE_RAW and length == n:
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


def encode_view(data, mode: str, dtype: str | None = None, *, sparse: bool = False) -> memoryview:
    """:func:`encode`, in this thread's ``frame`` buffer: transient (see :mod:`.scratch`), valid
    until this thread encodes again; for a caller that writes or seals it at once. ``sparse``: the
    XOR of a delta, whose planes of mostly zero bytes are kept sparse (mode 2)."""
    view = memoryview(data).cast("B")
    if mode == COMPRESS_NONE or len(view) == 0:
        return _raw_frame(view)
    width = PLANE_WIDTH.get(dtype or "") if mode == COMPRESS_AUTO else None
    if width and len(view) >= 4 * width:
        frame = _encode_planes_view(view, width, sparse=sparse)
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
        if mode == PLANE_RAW:
            n = length
        elif mode == PLANE_SPARSE:
            if length < _SPARSE_HEAD.size or pos + _SPARSE_HEAD.size > len(view):
                raise FrameError("sparse byte plane cut short")
            n = _SPARSE_HEAD.unpack_from(view, pos)[0]
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
    return bytes.fromhex(base_id) + bytes(encode_view(xor, COMPRESS_AUTO, dtype, sparse=True))


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
    if kind == PLANES and base_kind == RAW and len(body) > 1 and len(bview) == size and _all_sparse(body[1:]):
        # the base's bare bytes (a node's own copy) and an XOR of sparse planes only (a small
        # update): the XOR is applied to a copy of the base where its entries are, nothing joined
        width, n, xs, xtail = _read_planes(body[1:], size, entries=True)
        out[:] = bview
        elements = np.frombuffer(out, dtype=np.uint8)
        for i, x in enumerate(xs):
            elements[i : n * width : width][x.at] ^= x.values
        if len(xtail):
            _xor_into(out[n * width :], xtail, bview[n * width :])
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
