"""Tensor-aware layouts for the files training jobs write, read from their headers and indexes.

:func:`file_layout` decides how a snapshot cuts a file:

=====================  ===========  ===========================================================
file                   kind         parts
=====================  ===========  ===========================================================
``*.safetensors``      safetensors  the header, then each tensor (:mod:`..safetensors_header`)
``*.distcp``           dcp          each record ``.metadata`` places in it (:mod:`.dcp`)
``*.pt`` ``*.pth``     torch        each storage of the ``torch.save`` zip archive (:mod:`.torchzip`),
``*.bin`` ``*.ckpt``                or of a legacy (non-zip) ``torch.save`` file (:mod:`.torchlegacy`)
``*.gguf``             gguf         the header and tensor infos, then each tensor (:mod:`.gguf`, v1 to v3)
anything else          blob         one ``data`` part
=====================  ===========  ===========================================================

Tensors are ``tensor`` parts named as the checkpoint names them, so a diff names them, and each
part's chunks start at its first byte. The bytes between them are ``header`` parts.

**Nothing a checkpoint provides is executed.** ``data.pkl`` and ``.metadata`` are pickles, and a
pickle is code; they are read by :mod:`.safepickle`, an opcode walk that imports and calls
nothing, and so are the pickles of a legacy ``torch.save`` file. A file of these kinds that does
not parse (not the format its extension says, damaged, truncated, offsets past the end or
overlapping, a pickle the walk cannot follow, a ``.distcp``
without a readable ``.metadata``) is snapshotted as a ``blob``, exactly as before these readers
existed, and restores byte for byte all the same. Only ``.safetensors`` keeps its strict check
(a bad header is a :class:`~concord.errors.SafetensorsError`), since that format is one Concord
asks for by name.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from concord.snapshots import safetensors_header
from concord.snapshots.formats import dcp, gguf, torchlegacy, torchzip
from concord.snapshots.formats.common import (
    LayoutEntry,
    Piece,
    Unreadable,
    layout_from_pieces,
)
from concord.snapshots.safetensors_header import looks_like_safetensors, read_header

__all__ = ["claims", "file_layout"]


def file_layout(f: BinaryIO, size: int, path: str, rel: str) -> tuple[str, list[LayoutEntry]]:
    """``(file kind, layout)`` for the open file ``f`` of ``size`` bytes at ``path``.

    The kinds are those :data:`concord.snapshots.manifest.FILE_KINDS` accepts.

    The layout is a list of ``(part kind, name, offset, length, dtype, shape)`` covering
    ``[0, size)`` in order. ``rel`` names the file in errors (only a bad safetensors header raises).
    """
    if looks_like_safetensors(path):
        header = read_header(f, size, rel)
        return "safetensors", [("header", "", 0, header.data_start, None, None)] + [
            ("tensor", t.name, t.begin, t.length, t.dtype, t.shape) for t in header.tensors
        ]
    kind = _kind(path)
    if kind is not None and size > 0:
        try:
            return kind, layout_from_pieces(_pieces(kind, f.fileno(), size, path), size)
        except (Unreadable, OSError, OverflowError):
            pass  # not what its name says, or damaged: one opaque part, as any other file
    return "blob", [("data", "", 0, size, None, None)]


#: the extensions a reader here claims (each ``looks_like_*`` decides by one of them)
_CLAIMED = frozenset({safetensors_header.SUFFIX, dcp.SUFFIX, gguf.SUFFIX, *torchzip.SUFFIXES})


def claims(path: str) -> bool:
    """Whether a reader here may cut ``path`` (its extension decides, as in :func:`file_layout`):
    otherwise that makes it one ``blob`` part whatever its bytes. One test, for folders of many
    small files."""
    return os.path.splitext(path)[1].lower() in _CLAIMED


def _kind(path: str) -> str | None:
    if dcp.looks_like_dcp(path):
        return "dcp"
    if gguf.looks_like_gguf(path):
        return "gguf"
    if torchzip.looks_like_torch(path):
        return "torch"
    return None


def _pieces(kind: str, fd: int, size: int, path: str) -> list[Piece]:
    if kind == "dcp":
        pieces = dcp.file_pieces(fd, size, path)
    elif kind == "gguf":
        pieces = gguf.file_pieces(fd, size)
    elif torchlegacy.looks_legacy(fd, size):
        pieces = torchlegacy.file_pieces(fd, size)
    else:
        pieces = torchzip.archive_pieces(fd, 0, size)
    if not pieces:
        raise Unreadable("nothing to cut at")
    return pieces
