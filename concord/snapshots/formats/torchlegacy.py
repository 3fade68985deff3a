"""Legacy ``torch.save`` files (``_use_new_zipfile_serialization=False``): pickles, then storages.

Such a file is, in a row (torch's ``_legacy_save``): a pickle of the magic number
``0x1950A86A20F9469CFC6C``, one of the protocol version ``1001``, one of a dict of system
information (byte order, type sizes), the pickle of the saved object itself (each storage a
persistent id ``("storage", <storage type>, key, location, numel, view)``), a pickle of the list of
storage keys, then for each key in that order the storage: an 8-byte little-endian element
count, then that many elements' bytes.

Every pickle is read by :mod:`.safepickle` (an opcode walk: nothing is imported or called). The
storages' places follow from the keys, the counts and each storage type's element size; a count
that disagrees with the numel its persistent id gives, a key no persistent id names, a storage
type of unknown size or a storage past the end of the file makes the file unreadable (one opaque
part). Storages are named from the tensors that use them as in a zip archive
(:mod:`.torchzip`); one no tensor names is a ``data`` part named ``data/<key>``. The 8-byte count
before a storage lands in the header part named after the piece before it.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any

from concord.snapshots.formats.common import STORAGE_DTYPES, TORCH_DTYPES, Piece, Unreadable, pread
from concord.snapshots.formats.safepickle import MAX_PICKLE_BYTES, Call, Global, PersId, read_next
from concord.snapshots.formats.torchzip import storage_names, storage_piece
from concord.snapshots.safetensors_header import DTYPE_BITS

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001

#: the first window of the file the pickles are looked for in; grown (×8) while they run past it
_WINDOW = 4 << 20
#: how deep the walk for persistent ids goes (a checkpoint's objects nest a few levels)
_MAX_DEPTH = 64
_COUNT = struct.Struct("<Q")


def looks_legacy(fd: int, size: int) -> bool:
    """Whether the file starts with a pickle (the ``PROTO`` opcode of protocol 2 or later)."""
    return size >= 2 and pread(fd, 2, 0)[0] == 0x80


def file_pieces(fd: int, size: int) -> list[Piece]:
    """The storages of the legacy ``torch.save`` file as pieces (:class:`Unreadable` if it is not one)."""
    tree, keys, at = _pickles(fd, size)
    sizes = _storage_sizes(tree)
    names = storage_names(tree)
    pieces = []
    for key in keys:
        if key not in sizes:
            raise Unreadable(f"storage {key[:40]!r} is listed but no persistent id names it")
        element, numel = sizes[key]
        count = _COUNT.unpack(pread(fd, _COUNT.size, at))[0] if at + _COUNT.size <= size else None
        if count is None or count != numel:
            raise Unreadable(f"storage {key[:40]!r} at byte {at}: its count is not the {numel} elements its id says")
        at += _COUNT.size
        length = count * element
        if at + length > size:
            raise Unreadable(f"storage {key[:40]!r} of {length} bytes runs past the end of the file")
        pieces.append(storage_piece(names.get(key), f"data/{key}", at, length))
        at += length
    return pieces


def _pickles(fd: int, size: int) -> tuple[Any, list[str], int]:
    """(the saved object's tree, the storage keys, the offset of the first storage)."""
    window = min(size, _WINDOW)
    cap = min(size, MAX_PICKLE_BYTES)
    while True:
        buf = io.BytesIO(pread(fd, window, 0))
        try:
            return _read_pickles(buf)
        except Unreadable:
            if buf.tell() < window or window >= cap:  # it failed inside what it had: not for want of bytes
                raise
        window = min(cap, window * 8)


def _read_pickles(buf: io.BytesIO) -> tuple[Any, list[str], int]:
    if read_next(buf) != MAGIC_NUMBER:
        raise Unreadable("no legacy torch.save magic number")
    if read_next(buf) != PROTOCOL_VERSION:
        raise Unreadable("not protocol version 1001")
    info = read_next(buf)
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise Unreadable("system information missing or not little-endian")
    tree = read_next(buf)
    keys = read_next(buf)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise Unreadable("the storage keys are not a list of distinct names")
    return tree, keys, buf.tell()


def _storage_sizes(tree: Any) -> dict[str, tuple[int, int]]:
    """storage key → (element size in bytes, numel), from every storage persistent id in ``tree``."""
    out: dict[str, tuple[int, int]] = {}
    for pid in _persistent_ids(tree):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[2], str)):
            raise Unreadable("a persistent id that is not a storage")
        stype, key, numel = pid[1], pid[2], pid[4]
        element = _element_size(stype)
        if not (isinstance(numel, int) and not isinstance(numel, bool) and numel >= 0):
            raise Unreadable(f"storage {key[:40]!r} has no element count")
        if out.setdefault(key, (element, numel)) != (element, numel):
            raise Unreadable(f"storage {key[:40]!r} is named with two types or sizes")
    return out


def _element_size(stype: Any) -> int:
    name = stype.name if isinstance(stype, Global) else None
    if name == "UntypedStorage":
        return 1
    torch_dtype = STORAGE_DTYPES.get(name or "")
    bits = DTYPE_BITS.get(TORCH_DTYPES.get(torch_dtype or "", ""))
    if torch_dtype == "complex128":
        bits = 128
    if bits is None or bits % 8:
        raise Unreadable(f"storage type {name!r} of unknown element size")
    return bits // 8


def _persistent_ids(tree: Any) -> Iterator[Any]:
    """Every persistent id in the tree, each shared object visited once."""
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = [(tree, 0)]
    while todo:
        obj, depth = todo.pop()
        if isinstance(obj, PersId):
            yield obj.pid
            continue
        if depth > _MAX_DEPTH or id(obj) in seen or not isinstance(obj, (dict, list, tuple, set, frozenset, Call)):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            children = [*obj.keys(), *obj.values()]
        elif isinstance(obj, Call):
            children = [obj.func, obj.args, obj.state, *obj.items]
        else:
            children = list(obj)
        todo.extend((c, depth + 1) for c in children)
