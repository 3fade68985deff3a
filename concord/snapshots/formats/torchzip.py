"""``torch.save`` archives: each ``data/<key>`` entry is one storage, a tensor's bytes.

A ``torch.save`` file (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) is a zip archive of stored
entries under one folder: ``data.pkl`` (the pickled object, storages by persistent id), small
records (``byteorder``, ``version``, …) and ``data/<key>`` for each storage. The storages' places
come from the zip's own index (:mod:`.zipindex`); their names, dtypes and shapes from
``data.pkl`` read by :mod:`.safepickle`, which walks the opcodes and never loads the pickle.

A storage a pickle names once is a tensor part of that name (``model.layers.0.weight``, dotted
through nested dicts and lists); one several tensors share is named by them all, joined by
``", "``, with the storage's flat shape. A storage no tensor names (or a ``data.pkl`` the walk
cannot follow) becomes a ``data`` part named by its entry (``data/3``), its chunks still starting
at its first byte.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from concord.snapshots.formats.common import (
    STORAGE_DTYPES,
    TORCH_DTYPES,
    Piece,
    Unreadable,
    pread,
    tensor_piece,
)
from concord.snapshots.formats.safepickle import (
    MAX_PICKLE_BYTES,
    Call,
    Global,
    PersId,
    read,
)
from concord.snapshots.formats.zipindex import ZipEntry, is_zip, read_entries

SUFFIXES = frozenset({".pt", ".pth", ".bin", ".ckpt"})
_MAX_DEPTH = 64


def looks_like_torch(path: str) -> bool:
    """Whether ``path`` has a ``torch.save`` extension (the bytes decide the rest)."""
    return os.path.splitext(path)[1].lower() in SUFFIXES


def archive_pieces(fd: int, base: int, length: int, root: str = "") -> list[Piece]:
    """The storages of the ``torch.save`` archive in ``[base, base + length)`` as pieces.

    ``root`` names the pickled object itself (a DCP record pickles one tensor: its fqn).
    Raises :class:`Unreadable` when the region is not such an archive.
    """
    if not is_zip(fd, base, length):
        raise Unreadable("not a zip archive")
    entries = read_entries(fd, base, length)
    pkl = [e for e in entries if e.name.endswith("/data.pkl") and e.name.count("/") == 1]
    if len(pkl) != 1:
        raise Unreadable("not a torch.save archive: no single <folder>/data.pkl entry")
    folder = pkl[0].name[: -len("data.pkl")]
    storages = {e.name[len(folder) + len("data/") :]: e for e in entries if e.name.startswith(folder + "data/")}
    names = _names(pkl[0], fd, root)
    return [
        storage_piece(names.get(key) if entry.stored else None, entry.name[len(folder) :], entry.data_offset, entry.size)
        for key, entry in storages.items()
    ]


#: storage key → ([(tensor name, shape or None)], dtype), as :func:`storage_names` finds them
Names = dict[str, tuple[list[tuple[str, Any]], "str | None"]]


def storage_piece(found: tuple[list[tuple[str, Any]], str | None] | None, label: str, offset: int, length: int) -> Piece:
    """The piece of one storage's ``length`` bytes at ``offset``: a tensor named by the tensors
    that use it (:func:`storage_names`), or, when none does, a ``data`` piece named ``label``."""
    if found is None:
        return Piece("data", label, offset, length)
    tensors, dtype = found
    shapes = {t[1] for t in tensors}
    shape = shapes.pop() if len(shapes) == 1 else None  # tied weights share one shape
    return tensor_piece(", ".join(t[0] for t in tensors), offset, length, dtype, shape)


def _names(pkl: ZipEntry, fd: int, root: str) -> Names:
    """The storage names of the archive's pickle; {} when it cannot be followed."""
    if not pkl.stored or pkl.size > MAX_PICKLE_BYTES:
        return {}
    try:
        return storage_names(read(pread(fd, pkl.size, pkl.data_offset)), root)
    except Unreadable:
        return {}


def storage_names(tree: Any, root: str = "") -> Names:
    """storage key → ([(tensor name, shape or None)], dtype) of every tensor in the pickle ``tree``
    (from :func:`~.safepickle.read`), named from ``root`` down."""
    out: Names = {}
    for name, call in _tensors(tree, root):
        pid = call.args[0].pid
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[2], str)):
            continue
        key, numel = pid[2], pid[4]
        stype = pid[1]
        torch_dtype = STORAGE_DTYPES.get(stype.name) if isinstance(stype, Global) else None
        dtype = TORCH_DTYPES.get(torch_dtype, torch_dtype) if torch_dtype else None
        size = call.args[2] if len(call.args) > 2 else None
        whole = (
            isinstance(size, tuple)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in size)
            and call.args[1] == 0
            and isinstance(numel, int)
            and _prod(size) == numel
        )
        tensors, _ = out.setdefault(key, ([], dtype))
        if name not in (t[0] for t in tensors):
            tensors.append((name, size if whole else None))
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _is_tensor(obj: Call) -> bool:
    f = obj.func
    return (
        isinstance(f, Global)
        and f.module == "torch._utils"
        and f.name.startswith("_rebuild_tensor")
        and isinstance(obj.args, tuple)
        and len(obj.args) >= 2
        and isinstance(obj.args[0], PersId)
    )


def _tensors(tree: Any, root: str) -> Iterable[tuple[str, Call]]:
    """Each tensor in the tree with its dotted name, in pickle order; shared objects once."""
    seen: set[int] = set()
    todo: list[tuple[Any, str, int]] = [(tree, root, 0)]
    while todo:
        obj, path, depth = todo.pop()
        if depth > _MAX_DEPTH or not isinstance(obj, (dict, list, tuple, Call)):
            continue
        if id(obj) in seen:
            if isinstance(obj, Call) and _is_tensor(obj):
                yield path, obj  # a tensor saved under two names (tied weights)
            continue
        seen.add(id(obj))
        if isinstance(obj, Call) and _is_tensor(obj):
            yield path, obj
            continue
        children: list[tuple[Any, str]] = []
        if isinstance(obj, dict):
            children = [(v, _join(path, k)) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            children = [(v, _join(path, i)) for i, v in enumerate(obj)]
        else:  # an object: what it was built from and filled with, under its own name
            for item in obj.items:
                if isinstance(item, tuple) and len(item) == 2:
                    children.append((item[1], _join(path, item[0])))
                else:
                    children.append((item, path))
            state = obj.attrs()
            children += [(v, _join(path, k)) for k, v in state.items()]
            args = obj.args if isinstance(obj.args, tuple) else (obj.args,)
            children += [(a, path) for a in args]
        todo.extend((child, name, depth + 1) for child, name in reversed(children))


def _join(path: str, key: Any) -> str:
    k = key if isinstance(key, str) else str(key) if isinstance(key, (int, float, bool)) or key is None else "?"
    return f"{path}.{k}" if path else k
