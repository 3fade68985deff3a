"""Diff of two manifests by content: which files and tensors changed, moved or were renamed, and
what a sync of ``b`` to a store holding ``a`` moves.

The walk descends only where hashes differ: equal roots end it at once, equal files are
skipped whole, and inside a changed file only parts whose hashes differ are opened. The tensors
left over on each side (gone from ``a``, new in ``b``) are then matched by content, across files
and names: the same bytes (dtype, shape and chunk ids) under the same name in another file is a
tensor *moved*; the same bytes under another name is one *renamed*; the same name with other bytes
in another file is one *changed* there. A file whose whole content reappears under another path is
a file *renamed*. So a re-shard, or a rename of every tensor, reads as what it is, not as every
tensor added.

The chunk and byte counts are those of ``b`` absent from ``a`` by chunk id, wherever ``a`` holds
them (in any file or tensor): exactly the chunks a sync of ``b`` to a store holding ``a`` sends.
Given the store holding ``b`` (:func:`diff_manifests`'s ``source``), the diff also says how many
bytes that sync sends as the store keeps them (compressed, encrypted, as deltas): a chunk stored
as a delta travels as the delta where its base is a chunk of ``a``, every other chunk whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from concord.snapshots.manifest import FileEntry, Manifest, Part

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from concord.stores.base import Store

#: the kinds of change a diff reports
KINDS = ("added", "removed", "changed", "moved", "renamed")


@dataclass(frozen=True)
class Change:
    """One file or tensor (``tensor`` None: the file) that differs, and where it came from: for a
    tensor moved, renamed or changed in another file, the file (``from_file``) and for one renamed
    the name (``from_tensor``) it had in ``a``; for a file renamed, its path in ``a``."""

    file: str
    tensor: str | None
    kind: str  # one of KINDS
    from_file: str | None = None
    from_tensor: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``file``, ``tensor``, ``kind``, and ``from_file`` / ``from_tensor`` where they are set."""
        d: dict[str, Any] = {"file": self.file, "tensor": self.tensor, "kind": self.kind}
        if self.from_file is not None:
            d["from_file"] = self.from_file
        if self.from_tensor is not None:
            d["from_tensor"] = self.from_tensor
        return d


@dataclass(frozen=True)
class DiffResult:
    """What differs from snapshot ``a`` to ``b``: each file and tensor added, removed, changed,
    moved or renamed, and the chunks and bytes of ``b`` that ``a`` lacks."""

    a: str
    b: str
    same: bool
    changes: tuple[Change, ...]
    #: distinct chunks of ``b`` whose id ``a`` does not hold anywhere: what a sync of ``b`` to a
    #: store holding ``a`` sends
    chunks_differing: int
    #: their raw bytes
    bytes_differing: int
    #: the bytes that sync sends as the store holding ``b`` keeps those chunks (compressed,
    #: encrypted, a delta as the delta where ``a`` holds its base); None when no store was read
    bytes_to_send: int | None = None
    #: how many of the ``chunks_differing`` that sync sends as deltas
    delta_chunks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "same": self.same,
            "changes": [c.to_dict() for c in self.changes],
            "chunks_differing": self.chunks_differing,
            "bytes_differing": self.bytes_differing,
            "bytes_to_send": self.bytes_to_send,
            "delta_chunks": self.delta_chunks,
        }


def diff_manifests(a: Manifest, b: Manifest, *, source: Store | None = None) -> DiffResult:
    """The diff from ``a`` to ``b`` (see the module's text). With ``source``, the store holding
    ``b``'s chunks, also :attr:`DiffResult.bytes_to_send` and :attr:`DiffResult.delta_chunks`:
    the size of each chunk that ``a`` lacks is read from the store's listings, and the first
    bytes of each (whether it is a delta, and of which base)."""
    if a.root == b.root:
        return DiffResult(a.root, b.root, True, (), 0, 0, 0 if source is not None else None)
    walk = _Walk(a, b)
    missing = walk.missing()
    to_send, deltas = (None, 0) if source is None else _sending(source, b, missing, walk)
    return DiffResult(a.root, b.root, False, walk.changes(), len(missing), sum(missing.values()), to_send, deltas)


class _Walk:
    """One Merkle walk of ``a`` against ``b``: the parts each side has that the other lacks at
    the same place, and the parts of ``a`` not opened (equal to ``b``'s)."""

    def __init__(self, a: Manifest, b: Manifest) -> None:
        self.a, self.b = a, b
        #: chunk id → length, of every part of ``b`` that differs from ``a``'s at its place
        self.new_spans: dict[str, int] = {}
        #: chunk ids of every part of ``a`` that differs from ``b``'s at its place
        self.old_ids: set[str] = set()
        #: the chunk lists of the parts of ``a`` equal to ``b``'s (not opened)
        self.unopened: list[str] = []
        self.listed: list[Change] = []
        self.gone: list[tuple[str, Part]] = []  # tensors of a with no equal part at their place in b
        self.came: list[tuple[str, Part]] = []  # tensors of b with no equal part at their place in a
        self.removed: list[FileEntry] = []
        self.added: list[FileEntry] = []
        self.changed: list[str] = []
        self._index: _ChunkIndex | None = None
        fa, fb = a.by_path, b.by_path
        for path in sorted(fa.keys() | fb.keys()):
            x, y = fa.get(path), fb.get(path)
            if x is not None and y is not None:
                if x.hash == y.hash:
                    self.unopened.extend(p.chunks for p in x.parts)
                else:
                    self.changed.append(path)
                    self._file(path, x, y)
            elif x is not None:
                self.removed.append(x)
                self._old(x.parts)
            elif y is not None:
                self.added.append(y)
                for part in y.parts:
                    self._new(part)

    def _old(self, parts: Iterable[Part]) -> None:
        for p in parts:
            self.old_ids.update(p.chunk_ids())

    def _new(self, part: Part) -> None:
        for cid, _, n in part.chunk_spans(self.b.chunk_size):
            self.new_spans[cid] = n

    def _file(self, path: str, x: FileEntry, y: FileEntry) -> None:
        px, py = x.by_key, y.by_key
        hx, hy = _data_start(x), _data_start(y)
        for key in sorted(px.keys() | py.keys(), key=lambda k: (k[0] != "header", k)):
            p, q = px.get(key), py.get(key)
            if p is not None and q is not None and p.hash == q.hash:
                self.unopened.append(p.chunks)
                if key[0] == "tensor" and p.offset - hx != q.offset - hy:  # the same bytes, elsewhere in the file
                    self.listed.append(Change(path, key[1], "moved", path))
                continue
            if p is not None:
                self._old([p])
            if q is not None:
                self._new(q)
            if key[0] != "tensor":
                continue
            if p is not None and q is not None:
                self.listed.append(Change(path, key[1], "changed"))
            elif p is not None:
                self.gone.append((path, p))
            elif q is not None:
                self.came.append((path, q))

    # ------------------------------------------------------------------ changes

    def changes(self) -> tuple[Change, ...]:
        out = list(self.listed)
        renamed_from = _renamed_files(self.removed, self.added)
        was = set(renamed_from.values())
        gone_files = {f.path for f in self.removed if f.path not in was}
        new_files = {f.path for f in self.added if f.path not in renamed_from}
        out += [Change(new, None, "renamed", old) for new, old in renamed_from.items()]
        out += [Change(path, None, "removed") for path in sorted(gone_files)]
        out += [Change(path, None, "added") for path in sorted(new_files)]
        gone = self.gone + [(f.path, t) for f in self.removed if f.path in gone_files for t in f.tensors]
        came = self.came + [(f.path, t) for f in self.added if f.path in new_files for t in f.tensors]
        matched, left_gone, left_came = _match(gone, came)
        out += matched
        out += [Change(path, t.name, "removed") for path, t in left_gone if path not in gone_files]
        out += [Change(path, t.name, "added") for path, t in left_came if path not in new_files]
        named = {c.file for c in out}
        out += [Change(path, None, "changed") for path in self.changed if path not in named]
        return tuple(sorted(out, key=lambda c: (c.file, c.tensor is not None, c.tensor or "")))

    # ------------------------------------------------------------------ chunks

    def missing(self) -> dict[str, int]:
        """Chunk id → length, of every chunk of ``b`` that ``a`` holds nowhere."""
        left = {cid: n for cid, n in self.new_spans.items() if cid not in self.old_ids}
        if left:
            for cid in self.index().present(left):
                del left[cid]
        return left

    def index(self) -> _ChunkIndex:
        if self._index is None:
            self._index = _ChunkIndex(self.unopened)
        return self._index

    def held_by_a(self, ids: Iterable[str]) -> set[str]:
        """The ``ids`` that are chunks of ``a``."""
        ids = set(ids)
        found = ids & self.old_ids
        return found | self.index().present(ids - found)

    def ids_of_a(self) -> Iterator[str]:
        """Every chunk id of ``a`` (some twice)."""
        yield from self.old_ids
        yield from self.index()


def _data_start(f: FileEntry) -> int:
    """Where the tensors' data begins (after a safetensors header): offsets measured from it stay
    equal when only the header grew."""
    return f.parts[0].length if f.parts and f.parts[0].kind == "header" else 0


def _content(f: FileEntry) -> tuple[object, ...]:
    return (f.kind, f.size, tuple((p.kind, p.name, p.dtype, p.shape, p.length, p.chunks) for p in f.parts))


def _renamed_files(removed: list[FileEntry], added: list[FileEntry]) -> dict[str, str]:
    """New path → old path, for each added file whose whole content a removed file had."""
    by_content: dict[tuple[object, ...], list[str]] = {}
    for f in removed:
        by_content.setdefault(_content(f), []).append(f.path)
    out: dict[str, str] = {}
    for f in added:
        olds = by_content.get(_content(f))
        if olds:
            out[f.path] = olds.pop(0)
    return out


def _match(
    gone: list[tuple[str, Part]], came: list[tuple[str, Part]]
) -> tuple[list[Change], list[tuple[str, Part]], list[tuple[str, Part]]]:
    """Pair the tensors new in ``b`` with those gone from ``a``: the same name and bytes (moved),
    then the same bytes (renamed), then the same name (changed, in another file). The changes,
    and the tensors left on each side."""
    out: list[Change] = []
    left_gone = list(gone)
    left_came = list(came)
    rules = (
        (lambda t: (t.name, t.dtype, t.shape, t.chunks), "moved"),
        (lambda t: (t.dtype, t.shape, t.chunks), "renamed"),
        (lambda t: t.name, "changed"),
    )
    for sig, kind in rules:
        pool: dict[Any, list[int]] = {}
        for i, (_, t) in enumerate(left_gone):
            pool.setdefault(sig(t), []).append(i)
        used: set[int] = set()
        rest = []
        for path, t in left_came:
            ids = pool.get(sig(t))
            if not ids:
                rest.append((path, t))
                continue
            i = ids.pop(0)
            used.add(i)
            old_path, old = left_gone[i]
            out.append(Change(path, t.name, kind, old_path, old.name if old.name != t.name else None))
        left_came = rest
        left_gone = [g for i, g in enumerate(left_gone) if i not in used]
    return out, left_gone, left_came


class _ChunkIndex:
    """Which of some chunk ids occur in a set of chunk lists (each a part's concatenated 64-hex
    ids), without one Python object per listed chunk: the lists are read 256 KB at a time as
    arrays of 64-byte rows, each row's bucket (a hash of its first 8 hex digits) is looked up in a
    table marking the buckets of the ids asked for, and each hit is confirmed on the full id."""

    #: characters of chunk lists read at once (a block stays in the cache)
    BLOCK = 256 * 1024

    def __init__(self, chunk_lists: list[str]) -> None:
        self.lists = chunk_lists

    def __iter__(self) -> Iterator[str]:
        for chunks in self.lists:
            for i in range(0, len(chunks), 64):
                yield chunks[i : i + 64]

    def _blocks(self) -> Iterator[str]:
        run: list[str] = []
        size = 0
        for chunks in self.lists:
            run.append(chunks)
            size += len(chunks)
            if size >= self.BLOCK:
                yield "".join(run)
                run, size = [], 0
        if run:
            yield "".join(run)

    def present(self, ids: Iterable[str]) -> set[str]:
        import numpy as np

        asked = set(ids)
        if not asked or not self.lists:
            return set()
        # about 64 buckets per id asked: one row in 64 of those read is a false hit, checked and dropped
        bits = max(16, min(26, (64 * len(asked)).bit_length()))
        table = np.zeros(1 << bits, dtype=bool)
        table[_buckets("".join(asked), bits)] = True
        found: set[str] = set()
        for block in self._blocks():
            if not block:
                continue
            for row in np.flatnonzero(table[_buckets(block, bits)]).tolist():
                cid = block[row * 64 : row * 64 + 64]
                if cid in asked:
                    found.add(cid)
        return found


def _buckets(chunk_list: str, bits: int) -> NDArray[np.uint64]:
    """The bucket, one of ``2**bits``, of each 64-hex id in ``chunk_list``: the top bits of its
    first 8 digits (8 bytes of ASCII) times an odd constant."""
    import numpy as np

    rows = np.frombuffer(chunk_list.encode("ascii"), dtype=np.uint64).reshape(-1, 8)
    out: NDArray[np.uint64] = (rows[:, 0] * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)
    return out


def _sending(source: Store, b: Manifest, missing: dict[str, int], walk: _Walk) -> tuple[int, int]:
    """(bytes, chunks as deltas) that a sync of ``missing`` from ``source`` sends: each chunk as
    the store keeps it, a delta whose base ``a`` lacks whole (encoded as the store would)."""
    enc = source.encoding()
    if not enc.framed or not missing:  # bare bytes travel as they are
        return sum(missing.values()), 0
    names = {enc.chunk_name(cid): cid for cid in missing}
    sizes = source.chunk_stored_sizes(names)
    bases = _bases(source, list(names))
    delta_names = {name: base for name, base in bases.items() if base is not None}
    held: set[str] = set()
    if delta_names:
        if enc.cipher is None:  # a base's object name is its id
            held = walk.held_by_a(set(delta_names.values()))
        else:  # a's chunks by object name (a keyed hash of each id)
            wanted = set(delta_names.values())
            held = {n for n in map(enc.chunk_name, walk.ids_of_a()) if n in wanted}
    total, deltas = 0, 0
    dtypes: dict[str, str] | None = None
    for name, cid in names.items():
        base = delta_names.get(name)
        if base is None or base in held:
            total += sizes.get(name, missing[cid])
            deltas += base is not None
            continue
        if dtypes is None:
            from concord.snapshots.sync import chunk_dtypes

            dtypes = chunk_dtypes(b)
        total += len(
            enc.encode_chunk(cid, source.get_chunk(cid), dtypes.get(cid))
        )  # the base is not there: it goes whole
    return total, deltas


def _bases(store: Store, names: list[str]) -> dict[str, str | None]:
    """Object name → the object name of its base (None: stored whole): from the store's delta
    index where it is whole (one listing), else from each chunk's first bytes."""
    index = store.delta_index()
    if index is not None:
        listed = {name: base for name, base, _ in index.values()}
        return {n: listed.get(n) for n in names}
    if store.parallelism <= 1 or len(names) < 2:
        return {n: store.chunk_base(n) for n in names}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(store.parallelism, len(names)), thread_name_prefix="concord-diff") as pool:
        return dict(zip(names, pool.map(store.chunk_base, names)))
