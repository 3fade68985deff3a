"""Snapshot manifests and their Merkle tree: snapshot → file → part (tensor, header, data) → chunk.

A *part* is a run of a file's bytes with a meaning: a safetensors header, one tensor, or the whole
of an opaque file. Its bytes are cut into chunks of ``chunk_size`` starting at the part's first byte,
so one part's change never shifts another's chunks. A part lists its chunk ids as one string of
concatenated 64-hex digests (compact, and quick to parse for manifests of millions of chunks);
each chunk's length follows from the part's length and the chunk size.

Hashes (see :mod:`concord.hashing`)::

    chunk    = BLAKE3(0x00 || bytes)
    part     = BLAKE3(0x01 || meta{kind, name, dtype, shape, length} || chunk digests)
    file     = BLAKE3(0x02 || meta{path, size, kind} || part digests in file order)
    snapshot = BLAKE3(0x03 || meta{format, chunk_size} || file digests sorted by path)

Offsets are not hashed (they follow from the order and lengths of the parts), so a tensor that
moves inside a file because another grew keeps its hash and its chunks.
"""

from __future__ import annotations

import json
import math
import posixpath
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

from concord.errors import ManifestError, UnsafePathError
from concord.hashing import DIGEST_HEX, FILE, PART, SNAPSHOT, is_digest, node_hash
from concord.snapshots.safetensors_header import DTYPE_BITS

FORMAT = "concord/manifest@1"
MiB = 1024 * 1024
DEFAULT_CHUNK_SIZE = 4 * MiB
MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 64 * MiB
PART_KINDS = ("header", "tensor", "data")
#: how a file was cut (concord/snapshots/formats): safetensors, a torch.save archive, a DCP
#: .distcp file, GGUF, or one opaque part; a manifest naming only the first and last reads as ever
FILE_KINDS = ("safetensors", "blob", "torch", "dcp", "gguf")


def check_chunk_size(chunk_size: int) -> int:
    if (
        not isinstance(chunk_size, int)
        or isinstance(chunk_size, bool)
        or not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE
    ):
        raise ValueError(
            f"chunk size {chunk_size!r} is out of range: use a whole number of bytes between "
            f"{MIN_CHUNK_SIZE} (64 KiB) and {MAX_CHUNK_SIZE} (64 MiB); the default is {DEFAULT_CHUNK_SIZE}."
        )
    return chunk_size


def chunk_count(length: int, chunk_size: int) -> int:
    return (length + chunk_size - 1) // chunk_size


def safe_relpath(path: str) -> str:
    """Check that a manifest path is relative, normalised and cannot leave its folder."""
    if not isinstance(path, str) or not path:
        raise UnsafePathError(str(path), "empty path")
    if "\x00" in path or "\\" in path:
        raise UnsafePathError(path, "NUL bytes and backslashes are not allowed")
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        raise UnsafePathError(path, "absolute paths are not allowed")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(path, "empty, '.' and '..' segments are not allowed")
    if posixpath.normpath(path) != path:
        raise UnsafePathError(path, "the path is not normalised")
    return path


@dataclass(frozen=True)
class Part:
    kind: str
    name: str
    offset: int
    length: int
    chunks: str
    hash: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name)

    @property
    def n_chunks(self) -> int:
        return len(self.chunks) // DIGEST_HEX

    def meta(self) -> dict:
        return part_meta(self.kind, self.name, self.length, self.dtype, self.shape)

    def chunk_ids(self) -> list[str]:
        c = self.chunks
        return [c[i : i + DIGEST_HEX] for i in range(0, len(c), DIGEST_HEX)]

    def chunk_spans(self, chunk_size: int) -> Iterator[tuple[str, int, int]]:
        """``(chunk id, absolute file offset, length)`` for each chunk of this part."""
        for i, cid in enumerate(self.chunk_ids()):
            start = i * chunk_size
            yield cid, self.offset + start, min(chunk_size, self.length - start)

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "name": self.name, "offset": self.offset, "length": self.length}
        if self.kind == "tensor":
            d["dtype"] = self.dtype
            d["shape"] = list(self.shape or ())
        d["hash"] = self.hash
        d["chunks"] = self.chunks
        return d


def part_meta(kind: str, name: str, length: int, dtype: str | None, shape) -> dict:
    meta = {"kind": kind, "name": name, "length": length}
    if kind == "tensor":
        meta["dtype"] = dtype
        meta["shape"] = list(shape or ())
    return meta


def make_part(kind: str, name: str, offset: int, length: int, chunk_ids: list[str], dtype=None, shape=None) -> Part:
    chunks = "".join(chunk_ids)
    h = node_hash(PART, part_meta(kind, name, length, dtype, shape), chunks)
    return Part(kind, name, offset, length, chunks, h, dtype, tuple(shape) if shape is not None else None)


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    kind: str
    parts: tuple[Part, ...]
    hash: str

    @cached_property
    def by_key(self) -> dict[tuple[str, str], Part]:
        return {p.key: p for p in self.parts}

    @property
    def tensors(self) -> list[Part]:
        return [p for p in self.parts if p.kind == "tensor"]

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "size": self.size,
            "kind": self.kind,
            "hash": self.hash,
            "parts": [p.to_dict() for p in self.parts],
        }


def file_meta(path: str, size: int, kind: str) -> dict:
    return {"path": path, "size": size, "kind": kind}


def make_file(path: str, size: int, kind: str, parts: list[Part]) -> FileEntry:
    h = node_hash(FILE, file_meta(path, size, kind), [p.hash for p in parts])
    return FileEntry(path, size, kind, tuple(parts), h)


def snapshot_meta(chunk_size: int) -> dict:
    return {"format": FORMAT, "chunk_size": chunk_size}


@dataclass(frozen=True)
class Manifest:
    root: str
    chunk_size: int
    files: tuple[FileEntry, ...]

    # ------------------------------------------------------------------ figures

    @property
    def n_files(self) -> int:
        return len(self.files)

    @property
    def n_tensors(self) -> int:
        return sum(1 for f in self.files for p in f.parts if p.kind == "tensor")

    @property
    def n_chunks(self) -> int:
        return sum(p.n_chunks for f in self.files for p in f.parts)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @cached_property
    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def chunk_lengths(self) -> dict[str, int]:
        """Every distinct chunk id with its length."""
        out: dict[str, int] = {}
        cs = self.chunk_size
        for f in self.files:
            for p in f.parts:
                for cid, _, n in p.chunk_spans(cs):
                    out[cid] = n
        return out

    # ------------------------------------------------------------------ serialisation

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "root": self.root,
            "chunk_size": self.chunk_size,
            "files": [f.to_dict() for f in self.files],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def build(cls, chunk_size: int, files: list[FileEntry]) -> "Manifest":
        files = sorted(files, key=lambda f: f.path)
        root = node_hash(SNAPSHOT, snapshot_meta(chunk_size), [f.hash for f in files])
        return cls(root, chunk_size, tuple(files))

    @classmethod
    def from_json(cls, data: bytes, *, expected_root: str | None = None, verify: bool = True) -> "Manifest":
        """Parse and check a manifest. With ``verify`` every node hash is recomputed."""
        from concord.documents import MAX_MANIFEST_BYTES, load_json_document

        where = expected_root or "(unnamed)"
        doc = load_json_document(
            data, f"manifest {where}", max_bytes=MAX_MANIFEST_BYTES, expect=None,
            error=lambda problem: ManifestError(where, problem),
        )
        return _parse_manifest(doc, where, expected_root, verify)


def _need(cond: bool, where: str, problem: str) -> None:
    if not cond:
        raise ManifestError(where, problem)


def _int(v, where: str, what: str) -> int:
    _need(isinstance(v, int) and not isinstance(v, bool) and v >= 0, where, f"{what} must be a non-negative integer")
    return v


def _parse_manifest(doc, where: str, expected_root: str | None, verify: bool) -> Manifest:
    _need(isinstance(doc, dict), where, "top level is not an object")
    _need(doc.get("format") == FORMAT, where, f"unknown format {doc.get('format')!r} (expected {FORMAT})")
    root = doc.get("root")
    _need(is_digest(root), where, "root is not a 64-hex digest")
    if expected_root is not None:
        _need(root == expected_root, where, f"names root {root} but is stored as {expected_root}")
    chunk_size = doc.get("chunk_size")
    try:
        check_chunk_size(chunk_size)
    except ValueError as exc:
        raise ManifestError(where, str(exc)) from exc
    files_doc = doc.get("files")
    _need(isinstance(files_doc, list), where, "files is not a list")
    files: list[FileEntry] = []
    seen: set[str] = set()
    for fd in files_doc:
        _need(isinstance(fd, dict), where, "a file entry is not an object")
        try:
            path = safe_relpath(fd.get("path"))
        except UnsafePathError as exc:  # name the manifest the path came from
            raise UnsafePathError(exc.path, f"{exc.reason}, in manifest {where}") from None
        _need(path not in seen, where, f"file {path} listed twice")
        seen.add(path)
        size = _int(fd.get("size"), where, f"{path}: size")
        kind = fd.get("kind")
        _need(kind in FILE_KINDS, where, f"{path}: unknown file kind {kind!r}")
        parts_doc = fd.get("parts")
        _need(isinstance(parts_doc, list), where, f"{path}: parts is not a list")
        parts: list[Part] = []
        offset = 0
        keys: set[tuple[str, str]] = set()
        for pd in parts_doc:
            _need(isinstance(pd, dict), where, f"{path}: a part is not an object")
            pkind, name = pd.get("kind"), pd.get("name")
            _need(pkind in PART_KINDS and isinstance(name, str), where, f"{path}: bad part kind or name")
            _need((pkind, name) not in keys, where, f"{path}: part {name!r} listed twice")
            keys.add((pkind, name))
            poff = _int(pd.get("offset"), where, f"{path}:{name}: offset")
            plen = _int(pd.get("length"), where, f"{path}:{name}: length")
            _need(poff == offset, where, f"{path}:{name}: offset {poff} leaves a gap or overlap (expected {offset})")
            offset += plen
            chunks = pd.get("chunks")
            _need(
                isinstance(chunks, str) and len(chunks) == DIGEST_HEX * chunk_count(plen, chunk_size),
                where,
                f"{path}:{name}: chunk list does not match length {plen}",
            )
            dtype = shape = None
            if pkind == "tensor":
                dtype, shape = pd.get("dtype"), pd.get("shape")
                _need(isinstance(dtype, str), where, f"{path}:{name}: dtype missing")
                _need(
                    isinstance(shape, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape),
                    where,
                    f"{path}:{name}: shape must be a list of non-negative integers",
                )
                shape = tuple(shape)
                _need(
                    dtype not in DTYPE_BITS or math.prod(shape) * DTYPE_BITS[dtype] == 8 * plen,
                    where,
                    f"{path}:{name}: length {plen} does not hold a {dtype} tensor of shape {list(shape)}",
                )
            h = pd.get("hash")
            _need(is_digest(h), where, f"{path}:{name}: hash is not a 64-hex digest")
            if verify:
                try:
                    raw = bytes.fromhex(chunks)  # decoded once: checked, then hashed
                except ValueError:
                    raise ManifestError(where, f"{path}:{name}: chunk list is not hex") from None
                _need(raw.hex() == chunks, where, f"{path}:{name}: chunk list is not lowercase hex")
                actual = node_hash(PART, part_meta(pkind, name, plen, dtype, shape), raw)
                _need(actual == h, where, f"{path}:{name}: part hash does not match its chunks")
            parts.append(Part(pkind, name, poff, plen, chunks, h, dtype, shape))
        _need(offset == size, where, f"{path}: parts cover {offset} bytes, file size is {size}")
        fh = fd.get("hash")
        _need(is_digest(fh), where, f"{path}: hash is not a 64-hex digest")
        if verify:
            actual = node_hash(FILE, file_meta(path, size, kind), [p.hash for p in parts])
            _need(actual == fh, where, f"{path}: file hash does not match its parts")
        files.append(FileEntry(path, size, kind, tuple(parts), fh))
    _need([f.path for f in files] == sorted(seen), where, "files are not sorted by path")
    if verify:
        actual = node_hash(SNAPSHOT, snapshot_meta(chunk_size), [f.hash for f in files])
        _need(actual == root, where, f"root does not match its files (computes to {actual})")
    return Manifest(root, chunk_size, tuple(files))
