"""What this machine computed when it exported: each file's SHA-256, by the file's content, so
the next export of a barely changed model hashes only the files that changed.

An OCI layer is named by the SHA-256 of the file; Concord names the file's bytes by BLAKE3 (its
chunk ids, in a manifest re-hashed to its root). :func:`content_key` is a hash over the file's
size and its chunk ids in file order: since a chunk id fixes its chunk's bytes, the key fixes
every byte of the file and nothing else (not its path, which the file's node hash covers, so a
renamed or copied file is found too). An entry is written only with a SHA-256 this machine
computed itself from bytes read from a store, every chunk checked against its id on the way::

    <$CONCORD_HOME>/oci-sha256/<2 hex>      256 shard files, the first two hex digits of the key
        concord/oci-sha256@1
        <key> <size> <sha256 hex> <day last used> <check>

Read tolerantly: a shard file that is too large or does not start with the format line is
ignored whole; a line that is not exactly five fields of the right form for its shard, with its
check (a BLAKE2b of the rest of the line), is ignored; nothing is ever used in part, and the
size must also equal the file's. Written atomically (a temp name, then a rename, re-reading the
shard and merging first), not flushed: a lost or torn entry costs one re-hash, no more, and of two
exports merging into one shard at the same moment one's new entries may be lost the same way.
Bounded: a shard keeps :data:`MAX_PER_SHARD` entries at most, the least recently used dropped
first (a hit refreshes its day), so 262,144 entries, about 45 MB, in all.

The memo is a cache, never a source of truth: what it can do wrong is bounded in
:mod:`concord.oci.export` (and docs/oci.md, "the digest memo"). ``CONCORD_NO_OCI_MEMO=1`` (or
``concord export oci --no-memo``) turns it off. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import time

from concord.files import atomic_write
from concord.home import concord_home
from concord.snapshots.manifest import FileEntry

FORMAT = "concord/oci-sha256@1"
#: the memo's folder in the home folder
MEMO_DIR = "oci-sha256"
#: set (to anything but ``0`` or empty) to export without the memo
NO_MEMO_ENV = "CONCORD_NO_OCI_MEMO"
#: entries one shard file keeps at most (256 shards)
MAX_PER_SHARD = 1024
#: a shard file larger than this is ignored whole
MAX_SHARD_BYTES = 4 * MAX_PER_SHARD * 256
_LINE = re.compile(r"([0-9a-f]{64}) (0|[1-9][0-9]{0,18}) ([0-9a-f]{64}) (0|[1-9][0-9]{0,9}) ([0-9a-f]{16})")
_DAY = 86400


def content_key(f: FileEntry) -> str:
    """The memo's key for ``f``: BLAKE2b over the format, the size and the chunk ids in file
    order, which together fix every byte of the file (and nothing else: not its path)."""
    h = hashlib.blake2b(digest_size=32, person=b"concord-oci-key")
    h.update(FORMAT.encode() + b"\x00" + f.size.to_bytes(8, "big"))
    for p in f.parts:  # the parts are in file order, their chunks in part order
        h.update(bytes.fromhex(p.chunks))
    return h.hexdigest()


def _check(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8, person=b"concord-oci-memo").hexdigest()


def memo_disabled() -> bool:
    """Whether ``$CONCORD_NO_OCI_MEMO`` turns the memo off."""
    return os.environ.get(NO_MEMO_ENV, "").strip() not in ("", "0")


class DigestMemo:
    """The SHA-256 of files by :func:`content_key`, kept in ``folder`` (see the module's text).
    Changes are kept in memory until :meth:`save`; one instance is used by one export at a time."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = os.path.abspath(os.fspath(folder))
        self._shards: dict[str, dict[str, tuple[int, str, int]]] = {}
        self._changed: dict[str, dict[str, tuple[int, str, int] | None]] = {}  # None: forgotten

    @classmethod
    def default(cls) -> DigestMemo:
        """The memo in ``<$CONCORD_HOME>/oci-sha256``."""
        return cls(os.path.join(concord_home(), MEMO_DIR))

    def _path(self, shard: str) -> str:
        return os.path.join(self.folder, shard)

    def _read(self, shard: str) -> dict[str, tuple[int, str, int]]:
        """The shard's well-formed entries on disk (none when it is missing, too large or not ours)."""
        try:
            with open(self._path(shard), "rb") as fh:
                data = fh.read(MAX_SHARD_BYTES + 1)
        except OSError:
            return {}
        if len(data) > MAX_SHARD_BYTES:
            return {}
        try:
            lines = data.decode("ascii").split("\n")
        except UnicodeDecodeError:
            return {}
        if lines[0] != FORMAT:
            return {}
        entries: dict[str, tuple[int, str, int]] = {}
        for line in lines[1:]:
            m = _LINE.fullmatch(line)
            if m is None or not m.group(1).startswith(shard) or _check(line[:-17]) != m.group(5):
                continue
            entries[m.group(1)] = (int(m.group(2)), m.group(3), int(m.group(4)))
        return entries

    def _shard(self, shard: str) -> dict[str, tuple[int, str, int]]:
        if shard not in self._shards:
            self._shards[shard] = self._read(shard)
        return self._shards[shard]

    def get(self, key: str, size: int) -> str | None:
        """``sha256:<hex>`` remembered for ``key`` when the entry is whole and of ``size`` bytes."""
        entries = self._shard(key[:2])
        entry = entries.get(key)
        if entry is None or entry[0] != size:
            return None
        today = int(time.time()) // _DAY
        if entry[2] != today:  # used today: kept longer (rewritten at most once a day)
            self._set(key, (size, entry[1], today))
        return "sha256:" + entry[1]

    def put(self, key: str, size: int, digest: str) -> None:
        """Remember ``digest`` (``sha256:<hex>``, computed here from checked bytes) for ``key``."""
        self._set(key, (size, digest.split(":", 1)[1], int(time.time()) // _DAY))

    def forget(self, key: str) -> None:
        """Drop ``key`` (an entry the bytes contradicted)."""
        self._set(key, None)

    def _set(self, key: str, entry: tuple[int, str, int] | None) -> None:
        shard = self._shard(key[:2])
        if entry is None:
            shard.pop(key, None)
        else:
            shard[key] = entry
        self._changed.setdefault(key[:2], {})[key] = entry

    def save(self) -> None:
        """Write the changed shards: each re-read, merged with the changes, trimmed to
        :data:`MAX_PER_SHARD` (least recently used first), renamed into place. A shard that
        cannot be written is left as it was (the memo only saves work)."""
        changed, self._changed = self._changed, {}
        for shard, changes in changed.items():
            entries = self._read(shard)
            for key, entry in changes.items():
                if entry is None:
                    entries.pop(key, None)
                else:
                    entries[key] = entry
            kept = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:MAX_PER_SHARD]
            self._shards[shard] = dict(kept)
            lines = [FORMAT]
            for key, (size, sha, day) in sorted(kept):
                text = f"{key} {size} {sha} {day}"
                lines.append(f"{text} {_check(text)}")
            try:
                atomic_write(self._path(shard), ("\n".join(lines) + "\n").encode("ascii"), fsync=False)
            except OSError:
                continue


def resolve_memo(memo: DigestMemo | bool) -> DigestMemo | None:
    """The memo an export uses: the one given, the default one for ``True`` (unless
    ``$CONCORD_NO_OCI_MEMO`` is set), none for ``False``."""
    if isinstance(memo, DigestMemo):
        return memo
    return DigestMemo.default() if memo and not memo_disabled() else None
