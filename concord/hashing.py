"""BLAKE3 hashing with domain separation.

A chunk's id is ``BLAKE3(0x00 || bytes)`` (the Merkle *leaf*). Inner nodes of the snapshot tree
are ``BLAKE3(tag || len(meta) || meta || child digests)`` with a tag byte per level, so no leaf can
ever collide with a node and no level with another.
"""

from __future__ import annotations

import json
import struct
from typing import Iterable

LEAF = b"\x00"
PART = b"\x01"  # a tensor, a safetensors header, or an opaque file's bytes
FILE = b"\x02"
SNAPSHOT = b"\x03"

DIGEST_HEX = 64


def _blake3():
    from blake3 import blake3  # imported on first use: keeps `concord --help` fast

    return blake3


def chunk_id(data) -> str:
    """The leaf hash naming ``data`` (bytes, bytearray or memoryview)."""
    h = _blake3()(LEAF)
    h.update(data)
    return h.hexdigest()


class ChunkHasher:
    """Incremental leaf hash, for bytes that arrive in pieces."""

    def __init__(self) -> None:
        self._h = _blake3()(LEAF)
        self.size = 0

    def update(self, data) -> None:
        self._h.update(data)
        self.size += len(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def node_hash(tag: bytes, meta: dict, children_hex: Iterable[str] | str | bytes) -> str:
    """Hash an inner node: its level tag, its metadata, then its children's digests in order.

    ``children_hex`` is an iterable of 64-hex digests, one string of them concatenated, or the
    raw concatenated digests as bytes.
    """
    m = canonical_json(meta)
    h = _blake3()(tag)
    h.update(struct.pack("<I", len(m)))
    h.update(m)
    if isinstance(children_hex, bytes):
        h.update(children_hex)
    elif isinstance(children_hex, str):
        h.update(bytes.fromhex(children_hex))
    else:
        for c in children_hex:
            h.update(bytes.fromhex(c))
    return h.hexdigest()


def is_digest(s: str) -> bool:
    if not isinstance(s, str) or len(s) != DIGEST_HEX:
        return False
    try:
        int(s, 16)
    except ValueError:
        return False
    return s == s.lower()
