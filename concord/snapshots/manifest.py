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

import gc
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from concord.errors import ManifestError, UnsafePathError
from concord.hashing import DIGEST_HEX, FILE, PART, SNAPSHOT, flat_canonical_json, is_digest, node_digest_raw, node_hash
from concord.snapshots.safetensors_header import DTYPE_BITS

#: the largest integer a manifest may hold (every size, offset and length is below it)
MAX_INT = 2**63 - 1

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
    if "" in parts or "." in parts or ".." in parts:
        raise UnsafePathError(path, "empty, '.' and '..' segments are not allowed")
    # normalised now: with no leading '/' and no empty, '.' or '..' segment, posixpath.normpath
    # has nothing to change
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


_escape = json.encoder.encode_basestring_ascii


def part_meta_json(kind: str, name: str, length: int, dtype, shape) -> bytes:
    """``canonical_json(part_meta(...))``, what a part's hash covers: built from a template for
    the parts that are not tensors (most parts of a folder of many files)."""
    if kind != "tensor" and type(kind) is str and type(name) is str and type(length) is int:
        return b'{"kind":%s,"length":%d,"name":%s}' % (_escape(kind).encode(), length, _escape(name).encode())
    return flat_canonical_json(part_meta(kind, name, length, dtype, shape))


def file_meta_json(path: str, size: int, kind: str) -> bytes:
    """``canonical_json(file_meta(...))``, what a file's hash covers, from a template."""
    if type(path) is str and type(size) is int and type(kind) is str:
        return b'{"kind":%s,"path":%s,"size":%d}' % (_escape(kind).encode(), _escape(path).encode(), size)
    return flat_canonical_json(file_meta(path, size, kind))


def make_part(kind: str, name: str, offset: int, length: int, chunk_ids: list[str], dtype=None, shape=None) -> Part:
    chunks = "".join(chunk_ids)
    h = node_hash(PART, part_meta_json(kind, name, length, dtype, shape), chunks)
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

    def only_chunk(self) -> tuple[str, int, int] | None:
        """``(chunk id, offset, length)`` of a file of one part of one chunk (most small files),
        read off the part with no list or generator made; None for any other file."""
        parts = self.parts
        if len(parts) != 1 or len(parts[0].chunks) != DIGEST_HEX:
            return None
        p = parts[0]
        return p.chunks, p.offset, p.length

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
    h = node_hash(FILE, file_meta_json(path, size, kind), [p.hash for p in parts])
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
        """The manifest's JSON, the bytes ``json.dumps`` of the whole document gives, made 1,000
        files at a time (a manifest of 100,000 files never stands as one tree of dicts)."""
        head = json.dumps({"format": FORMAT, "root": self.root, "chunk_size": self.chunk_size}, separators=(",", ":"))
        files = self.files
        runs = (
            json.dumps([f.to_dict() for f in files[i : i + 1000]], separators=(",", ":"))[1:-1]
            for i in range(0, len(files), 1000)
        )
        return "".join((head[:-1], ',"files":[', ",".join(runs), "]}")).encode()

    @classmethod
    def build(cls, chunk_size: int, files: list[FileEntry]) -> Manifest:
        files = sorted(files, key=lambda f: f.path)
        root = node_hash(SNAPSHOT, snapshot_meta(chunk_size), [f.hash for f in files])
        return cls(root, chunk_size, tuple(files))

    @classmethod
    def from_json(cls, data: bytes, *, expected_root: str | None = None, verify: bool = True) -> Manifest:
        """Parse and check a manifest. With ``verify`` every node hash is recomputed."""
        where = expected_root or "(unnamed)"
        gc_was_on = gc.isenabled()
        gc.disable()  # hundreds of thousands of new objects, none of them in a cycle: no collection
        try:
            return cls._from_json(data, where, expected_root, verify)
        finally:
            if gc_was_on:
                gc.enable()

    @classmethod
    def _from_json(cls, data, where: str, expected_root: str | None, verify: bool) -> Manifest:
        from concord.documents import MAX_MANIFEST_BYTES, load_json_document

        doc = load_json_document(
            data, f"manifest {where}", max_bytes=MAX_MANIFEST_BYTES, expect=None,
            error=lambda problem: ManifestError(where, problem), max_depth=None, check_ints=False,
        )  # the parse bounds every integer it reads and walks for depth what it does not know
        return _parse_manifest(doc, where, expected_root, verify)


def _need(cond: bool, where: str, problem: str) -> None:
    if not cond:
        raise ManifestError(where, problem)


def _int(v, where: str, what: str) -> int:
    _need(type(v) is int and 0 <= v <= MAX_INT, where, f"{what} must be a non-negative integer (at most {MAX_INT})")
    return v


def _shallow(node: dict, known: int, where: str, depth: int) -> None:
    """A JSON object holding more than its ``known`` fields nests at most to the depth any
    Concord document does (the parse walks only the fields it knows, without recursing)."""
    if len(node) > known:
        from concord.documents import MAX_DEPTH, _depth_ok

        _need(_depth_ok(node, MAX_DEPTH - depth), where, f"nested deeper than the {MAX_DEPTH} levels any Concord document has")


def _parse_manifest(doc, where: str, expected_root: str | None, verify: bool) -> Manifest:
    """Check and build a manifest from its JSON. It runs once per file and part of manifests of
    100,000 files, so each check is one cheap test on the way (a message is built only for a
    failure), nothing is walked twice, the order of paths is checked pairwise (files sorted by
    path repeat one only side by side), each node is hashed by one call, and the frozen entries
    are made without their generated ``__init__`` (which sets each field through
    ``object.__setattr__``: twice the time of the rest of a part's parse)."""
    _need(isinstance(doc, dict), where, "top level is not an object")
    _shallow(doc, 4, where, 0)
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
    file_hashes: list[str] = []
    prev = ""
    seen: set[str] | None = None  # the paths so far, kept only once the order is broken
    hexdigest = _is_hex_digest
    # part names seen, each kept once with its JSON (most files' one part is "data"): one string
    # object for all its uses, as for the kinds, instead of one per part from the parse
    names: dict[str, tuple[str, bytes]] = {}
    new, put = object.__new__, object.__setattr__
    for i, fd in enumerate(files_doc):
        files_doc[i] = None  # the entry's dicts go as soon as it is read (the peak is the manifest, not it and its JSON)
        if type(fd) is not dict:
            raise ManifestError(where, "a file entry is not an object")
        if len(fd) > 5:
            _shallow(fd, 5, where, 2)
        path = fd.get("path")
        if not _plain_relpath(path):
            try:
                safe_relpath(path)  # says what is wrong with it
            except UnsafePathError as exc:  # name the manifest the path came from
                raise UnsafePathError(exc.path, f"{exc.reason}, in manifest {where}") from None
        if path <= prev or seen is not None:
            if seen is None:
                seen = {f.path for f in files}
            _need(path not in seen, where, f"file {path} listed twice")
            seen.add(path)
        prev = path
        size, kind, parts_doc = fd.get("size"), fd.get("kind"), fd.get("parts")
        if type(size) is not int or not 0 <= size <= MAX_INT:
            _int(size, where, f"{path}: size")
        kind = _FILE_KIND.get(kind) if type(kind) is str else None
        if kind is None:
            kind = fd.get("kind")
            raise ManifestError(where, f"{path}: unknown file kind {kind!r}")
        if type(parts_doc) is not list:
            raise ManifestError(where, f"{path}: parts is not a list")
        parts: list[Part] = []
        digests: list[bytes] = []  # the parts' raw digests, when verified
        offset = 0
        for pd in parts_doc:
            part = _parse_part(pd, path, where, chunk_size, verify, names, digests)
            if part.offset != offset:
                raise ManifestError(where, f"{path}:{part.name}: offset {part.offset} leaves a gap or overlap (expected {offset})")
            offset += part.length
            parts.append(part)
        if len(parts) > 1 and len({p.key for p in parts}) != len(parts):
            twice = next(p for i, p in enumerate(parts) if p.key in {q.key for q in parts[:i]})
            raise ManifestError(where, f"{path}: part {twice.name!r} listed twice")
        if offset != size:
            raise ManifestError(where, f"{path}: parts cover {offset} bytes, file size is {size}")
        fh = fd.get("hash")
        if not verify:
            _need(hexdigest(fh), where, f"{path}: hash is not a 64-hex digest")
        else:  # equal to the hash computed, so a digest (which one is said only on a mismatch)
            meta = b'{"kind":"%s","path":%s,"size":%d}' % (kind.encode(), _escape(path).encode(), size)
            if node_digest_raw(FILE, meta, digests[0] if len(digests) == 1 else b"".join(digests)).hex() != fh:
                _need(hexdigest(fh), where, f"{path}: hash is not a 64-hex digest")
                raise ManifestError(where, f"{path}: file hash does not match its parts")
        entry = new(FileEntry)
        put(entry, "__dict__", {"path": path, "size": size, "kind": kind, "parts": tuple(parts), "hash": fh})
        files.append(entry)
        file_hashes.append(fh)
    _need(seen is None, where, "files are not sorted by path")
    if verify:
        actual = node_hash(SNAPSHOT, snapshot_meta(chunk_size), "".join(file_hashes))
        _need(actual == root, where, f"root does not match its files (computes to {actual})")
    return Manifest(root, chunk_size, tuple(files))


_FILE_KIND = {k: k for k in FILE_KINDS}  # each kind's one string object
_PART_KIND = {k: k for k in PART_KINDS}


def _plain_relpath(path) -> bool:
    """Whether :func:`safe_relpath` accepts ``path``, decided by a few substring tests."""
    if type(path) is not str or not path or "\x00" in path or "\\" in path or path[0] == "/":
        return False
    if len(path) > 1 and path[1] == ":":
        return False
    s = "/" + path + "/"
    return "//" not in s and "/./" not in s and "/../" not in s


def _parse_part(pd, path: str, where: str, chunk_size: int, verify: bool, names: dict[str, tuple[str, bytes]], digests: list[bytes]) -> Part:
    """One part of file ``path``, checked on its own (its offset is checked by the caller); with
    ``verify`` its hash is recomputed and its raw digest appended to ``digests``. ``names``
    keeps each part name (not a tensor's) once, with its JSON."""
    if type(pd) is not dict:
        raise ManifestError(where, f"{path}: a part is not an object")
    pkind, name = pd.get("kind"), pd.get("name")
    pkind = _PART_KIND.get(pkind) if type(pkind) is str else None
    if pkind is None or type(name) is not str:
        raise ManifestError(where, f"{path}: bad part kind or name")
    if len(pd) > (8 if pkind == "tensor" else 6):
        _shallow(pd, 8 if pkind == "tensor" else 6, where, 4)
    poff, plen, chunks = pd.get("offset"), pd.get("length"), pd.get("chunks")
    if type(poff) is not int or type(plen) is not int or not 0 <= poff <= MAX_INT or not 0 <= plen <= MAX_INT:
        _int(poff, where, f"{path}:{name}: offset")
        _int(plen, where, f"{path}:{name}: length")
    if type(chunks) is not str or len(chunks) != DIGEST_HEX * ((plen + chunk_size - 1) // chunk_size):
        raise ManifestError(where, f"{path}:{name}: chunk list does not match length {plen}")
    dtype = shape = None
    if pkind == "tensor":
        dtype, shape = pd.get("dtype"), pd.get("shape")
        _need(isinstance(dtype, str), where, f"{path}:{name}: dtype missing")
        _need(
            isinstance(shape, list) and all(type(s) is int and 0 <= s <= MAX_INT for s in shape),
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
    if not verify:
        _need(_is_hex_digest(h), where, f"{path}:{name}: hash is not a 64-hex digest")
    else:  # equal to the hash computed, so a digest (which one is said only on a mismatch)
        try:
            raw = bytes.fromhex(chunks)  # decoded once: checked, then hashed
        except ValueError:
            raw = None
        if pkind == "tensor":
            meta = part_meta_json(pkind, name, plen, dtype, shape)
        else:
            known = names.get(name)
            if known is None:
                known = names[name] = (name, _escape(name).encode())
            name = known[0]
            meta = b'{"kind":"%s","length":%d,"name":%s}' % (pkind.encode(), plen, known[1])
        d = node_digest_raw(PART, meta, raw) if raw is not None else b""
        if d.hex() != h or raw.hex() != chunks:
            _need(_is_hex_digest(h), where, f"{path}:{name}: hash is not a 64-hex digest")
            _need(raw is not None, where, f"{path}:{name}: chunk list is not hex")
            _need(raw.hex() == chunks, where, f"{path}:{name}: chunk list is not lowercase hex")
            raise ManifestError(where, f"{path}:{name}: part hash does not match its chunks")
        digests.append(d)
    part = object.__new__(Part)
    object.__setattr__(part, "__dict__", {
        "kind": pkind, "name": name, "offset": poff, "length": plen, "chunks": chunks, "hash": h, "dtype": dtype, "shape": shape,
    })
    return part


_HEX = frozenset("0123456789abcdef")


def _is_hex_digest(s) -> bool:
    """:func:`is_digest`, quicker on the way: 64 lowercase hex digits."""
    return type(s) is str and len(s) == DIGEST_HEX and _HEX.issuperset(s)
