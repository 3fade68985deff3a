"""BLAKE3 hashing with domain separation.

A chunk's id is ``BLAKE3(0x00 || bytes)`` (the Merkle *leaf*). Inner nodes of the snapshot tree
are ``BLAKE3(tag || len(meta) || meta || child digests)`` with a tag byte per level, so no leaf can
ever collide with a node and no level with another.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable

LEAF = b"\x00"
PART = b"\x01"  # a tensor, a safetensors header, or an opaque file's bytes
FILE = b"\x02"
SNAPSHOT = b"\x03"

DIGEST_HEX = 64


_BLAKE3 = None


def _blake3():
    global _BLAKE3
    if _BLAKE3 is None:
        from blake3 import blake3  # imported on first use: keeps `concord --help` fast

        _BLAKE3 = blake3
    return _BLAKE3


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


_escape = json.encoder.encode_basestring_ascii


def flat_canonical_json(meta: dict) -> bytes:
    """:func:`canonical_json` of ``meta``, built directly when its values are strings, integers,
    None or lists of integers (a node's metadata: a manifest of 100,000 files hashes 200,000 of
    them), and by :func:`canonical_json` otherwise. The bytes are the same either way."""
    items = []
    for k in sorted(meta):
        v = meta[k]
        t = type(v)
        if t is str:
            s = _escape(v)
        elif t is int:
            s = int.__repr__(v)
        elif v is None:
            s = "null"
        elif t is list and all(type(x) is int for x in v):
            s = "[" + ",".join(map(int.__repr__, v)) + "]"
        else:
            return canonical_json(meta)
        if type(k) is not str:
            return canonical_json(meta)
        items.append(_escape(k) + ":" + s)
    return ("{" + ",".join(items) + "}").encode()


def node_hash(tag: bytes, meta: dict | bytes, children_hex: Iterable[str] | str | bytes) -> str:
    """Hash an inner node: its level tag, its metadata, then its children's digests in order.

    ``meta`` is a dict, or its :func:`canonical_json` bytes already made. ``children_hex`` is an
    iterable of 64-hex digests, one string of them concatenated, or the raw concatenated digests
    as bytes.
    """
    m = meta if isinstance(meta, bytes) else flat_canonical_json(meta)
    if isinstance(children_hex, str):
        children = bytes.fromhex(children_hex)
    elif isinstance(children_hex, bytes):
        children = children_hex
    else:
        children = bytes.fromhex("".join(children_hex))
    return node_digest(tag, m, children)


_length = struct.Struct("<I").pack


def node_digest(tag: bytes, meta_json: bytes, children: bytes) -> str:
    """:func:`node_hash` of metadata already in canonical JSON and children already raw digests
    (the quick path of a reader checking 200,000 nodes)."""
    return _blake3()(tag + _length(len(meta_json)) + meta_json + children).digest().hex()  # quicker than hexdigest()


def node_digest_raw(tag: bytes, meta_json: bytes, children: bytes) -> bytes:
    """:func:`node_digest` as its 32 raw bytes (what a parent node hashes)."""
    return _blake3()(tag + _length(len(meta_json)) + meta_json + children).digest()


def is_digest(s: str) -> bool:
    if not isinstance(s, str) or len(s) != DIGEST_HEX:
        return False
    try:
        int(s, 16)
    except ValueError:
        return False
    return s == s.lower()
