"""PyTorch Distributed Checkpoint: ``.distcp`` files cut at their records, found in ``.metadata``.

``torch.distributed.checkpoint.save`` writes one or more ``.distcp`` files and a ``.metadata``
file beside them. ``.metadata`` is a pickle of ``Metadata``; its ``storage_data`` maps each item
(a tensor's fqn and the offsets of its shard, or a non-tensor's fqn) to ``relative_path``,
``offset`` and ``length`` in a ``.distcp`` file, and ``state_dict_metadata`` gives each tensor's
dtype and each shard's sizes. It is read by :mod:`.safepickle` (an opcode walk, never a load).

A tensor record written in the ``torch_save`` serialization is a whole ``torch.save`` archive of
that one tensor: its storage entry becomes the tensor part (chunks from its first byte), the
archive's bytes before it the ``<fqn> header`` part and those after it (where the storage's CRC
is) the ``<fqn>`` header part. A record in the raw
serialization is the tensor's bytes. A non-tensor record (pickled bytes), or one written through
a transform (compression, …), is a ``data`` part of its fqn. A shard's part is named
``fqn@o1,o2`` (its offsets) when the file holds several shards of one fqn.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from concord.snapshots.formats.common import (
    TORCH_DTYPES,
    Piece,
    Unreadable,
    tensor_piece,
)
from concord.snapshots.formats.safepickle import MAX_PICKLE_BYTES, Call, Global, read
from concord.snapshots.formats.torchzip import archive_pieces
from concord.snapshots.formats.zipindex import is_zip

SUFFIX = ".distcp"
METADATA = ".metadata"


@dataclass(frozen=True)
class Record:
    """One item of a ``.distcp`` file, as ``.metadata`` places it."""

    fqn: str
    shard: tuple[int, ...] | None  # the shard's offsets in the whole tensor
    offset: int
    length: int
    transformed: bool
    dtype: str | None  # None: not a tensor
    shape: tuple[int, ...] | None


def looks_like_dcp(path: str) -> bool:
    return os.path.splitext(path)[1].lower() == SUFFIX


def file_pieces(fd: int, size: int, path: str) -> list[Piece]:
    """The pieces of the ``.distcp`` file ``path``, from the ``.metadata`` beside it."""
    folder, name = os.path.split(os.path.abspath(path))
    md = os.path.join(folder, METADATA)
    try:
        st = os.stat(md)
    except OSError:
        raise Unreadable(f"no {METADATA} beside the file") from None
    records = _metadata(md, st.st_ino, st.st_size, st.st_mtime_ns)
    if records is None:
        raise Unreadable(f"{METADATA} cannot be read")
    mine = records.get(name)
    if not mine:
        raise Unreadable(f"{METADATA} names no record of this file")
    count = Counter(r.fqn for r in mine)
    pieces: list[Piece] = []
    for r in mine:
        if r.offset + r.length > size:
            raise Unreadable(f"record {r.fqn!r} runs past the end of the file")
        label = r.fqn if count[r.fqn] == 1 or r.shard is None else f"{r.fqn}@{','.join(map(str, r.shard))}"
        pieces.extend(_record_pieces(fd, r, label))
    return pieces


def _record_pieces(fd: int, r: Record, label: str) -> list[Piece]:
    if r.dtype is None or r.transformed:
        return [Piece("data", label, r.offset, r.length)]
    if not is_zip(fd, r.offset, r.length):  # the raw serialization: the record is the tensor
        return [tensor_piece(label, r.offset, r.length, r.dtype, r.shape)]
    try:
        inner = archive_pieces(fd, r.offset, r.length, root=label)
    except Unreadable:
        inner = []
    if not inner:
        return [Piece("data", label, r.offset, r.length)]
    if len(inner) == 1:  # the one storage of the one tensor: dtype and shape from the metadata
        p = inner[0]
        inner = [tensor_piece(label, p.offset, p.length, r.dtype, r.shape)]
    # the archive's own bytes before and after its storages are parts of their own, so the next
    # record's unchanged prefix is not cut into the same chunk as this record's changed CRCs
    first = min(p.offset for p in inner)
    last = max(p.offset + p.length for p in inner)
    return [
        Piece("header", f"{label} header", r.offset, first - r.offset),
        *inner,
        Piece("header", label, last, r.offset + r.length - last),
    ]


@functools.lru_cache(maxsize=16)
def _metadata(path: str, inode: int, size: int, mtime_ns: int) -> dict[str, list[Record]] | None:
    """relative path → its records, sorted by offset; None when the file cannot be read safely.

    Cached by (path, inode, size, mtime), so the many ``.distcp`` files of one checkpoint read it once.
    """
    if size > MAX_PICKLE_BYTES:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PICKLE_BYTES + 1)
        return _records(read(data))
    except (OSError, Unreadable, TypeError, ValueError, AttributeError, KeyError, IndexError):
        return None


def storage_files(data: bytes) -> set[str]:
    """The relative paths of the storage files the ``.metadata`` pickle ``data`` names (walked,
    never loaded); :class:`Unreadable` when it is not a DCP ``Metadata``."""
    try:
        return set(_records(read(data)))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise Unreadable(f"{METADATA} cannot be followed: {type(exc).__name__}") from None


def _records(tree: Any) -> dict[str, list[Record]]:
    if not (isinstance(tree, Call) and isinstance(tree.func, Global) and tree.func.name == "Metadata"):
        raise Unreadable("not a DCP Metadata object")
    attrs = tree.attrs()
    tensors = attrs.get("state_dict_metadata")
    storage = attrs.get("storage_data")
    if not isinstance(tensors, dict) or not isinstance(storage, dict):
        raise Unreadable("Metadata without state_dict_metadata and storage_data")
    out: dict[str, list[Record]] = {}
    for index, info in storage.items():
        if not isinstance(index, Call) or not isinstance(info, Call):
            raise Unreadable("storage_data entry is not an index and a storage info")
        ia, sa = index.attrs(), info.attrs()
        fqn, rel, off, n = ia.get("fqn"), sa.get("relative_path"), sa.get("offset"), sa.get("length")
        if not isinstance(fqn, str) or not isinstance(rel, str) or not _uint(off) or not _uint(n):
            raise Unreadable("storage info without fqn, relative_path, offset and length")
        shard = _size(ia.get("offset"))
        dtype, shape = _tensor_meta(tensors.get(fqn), shard)
        out.setdefault(rel, []).append(
            Record(fqn, shard, off, n, bool(sa.get("transform_descriptors")), dtype, shape)
        )
    for records in out.values():
        records.sort(key=lambda r: (r.offset, r.length))
    return out


def _tensor_meta(meta: Any, shard: tuple[int, ...] | None) -> tuple[str | None, tuple[int, ...] | None]:
    """(dtype, shard sizes) of a TensorStorageMetadata; (None, None) for anything else."""
    if not (isinstance(meta, Call) and isinstance(meta.func, Global) and meta.func.name == "TensorStorageMetadata"):
        return None, None
    attrs = meta.attrs()
    props = attrs.get("properties")
    dtype_global = None
    if isinstance(props, Call):
        state = props.state
        if isinstance(state, tuple) and state:  # TensorProperties.__getstate__: (dtype, layout, ...)
            dtype_global = state[0]
        else:
            dtype_global = props.attrs().get("dtype")
    torch_name = dtype_global.name if isinstance(dtype_global, Global) else None
    dtype = TORCH_DTYPES.get(torch_name, torch_name) if torch_name else None
    sizes = None
    for chunk in attrs.get("chunks") or ():
        if isinstance(chunk, Call) and _size(chunk.attrs().get("offsets")) == shard:
            sizes = _size(chunk.attrs().get("sizes"))
            break
    return dtype, sizes


def _size(v: Any) -> tuple[int, ...] | None:
    """A ``torch.Size`` (pickled as ``Size((d0, d1, …))``) or a tuple of ints, as a tuple."""
    if isinstance(v, Call) and isinstance(v.func, Global) and v.func.name == "Size":
        args = v.args
        v = args[0] if isinstance(args, tuple) and len(args) == 1 else None
    if isinstance(v, (tuple, list)) and all(_uint(d) for d in v):
        return tuple(v)
    return None


def _uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
