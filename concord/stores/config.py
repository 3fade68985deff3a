"""A store's configuration: its format, how it compresses and how it encrypts.

The ``config`` object at the store's root is a small JSON document::

    {"format": "concord/store-config", "version": 1, "compress": "auto",
     "encryption": {"algorithm": "AES-256-GCM", "kdf": "HKDF-SHA256", "salt": "<hex>",
                    "key_id": "<16 hex>", "key_check": "<64 hex>"}}

Absent, the store is plain and raw (every store written before configurations existed). It is
written once, by ``concord init`` (:func:`configure`) on an empty store, and never changed: the
encoding of every object in the store follows from it. A configuration from a newer Concord (a
higher ``version``) is refused, naming its version.

:class:`Encoding` is what the store layer uses: it frames and unframes chunks (compress, then
encrypt), names chunks, and seals the other objects of an encrypted store. Everything above the
store sees raw bytes: chunk ids, manifests, diffs and roots never change with the encoding.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from concord.errors import StoreConfigError, StoreKeyError, UnknownEncodingError
from concord.files import atomic_write
from concord.stores import codec
from concord.stores.cipher import ALGORITHM, KDF, SEALED, Cipher, SealError, new_key, new_salt, read_key_file

if TYPE_CHECKING:
    from concord.stores.base import Store

CONFIG_KEY = "config"
CONFIG_FORMAT = "concord/store-config"
CONFIG_VERSION = 1
#: where an encrypted store's key comes from when none was given
KEY_FILE_ENV = "CONCORD_KEY_FILE"
#: documents that stay readable in an encrypted store: signatures are public, and garbage
#: collection's leases and locks say only who writes (and must be readable to be honoured)
PLAIN_DOCUMENTS = ("signatures/", "gc/")
MAX_CONFIG_BYTES = 4096


@dataclass(frozen=True)
class StoreConfig:
    compress: str = codec.COMPRESS_NONE
    encryption: dict | None = None
    version: int = CONFIG_VERSION

    @property
    def encrypted(self) -> bool:
        return self.encryption is not None

    @property
    def framed(self) -> bool:
        """Whether each stored chunk starts with its encoding byte (raw stores keep bare bytes)."""
        return self.compress != codec.COMPRESS_NONE or self.encrypted

    def to_json(self) -> bytes:
        return json.dumps(
            {"format": CONFIG_FORMAT, "version": self.version, "compress": self.compress, "encryption": self.encryption},
            indent=1,
        ).encode()

    def describe(self) -> dict:
        """What a person is shown (the key check left out)."""
        enc = {"algorithm": self.encryption["algorithm"], "key_id": self.encryption["key_id"]} if self.encryption else None
        return {"version": self.version, "compress": self.compress, "encryption": enc}

    @classmethod
    def from_json(cls, store: str, data: bytes) -> StoreConfig:
        def bad(problem: str) -> StoreConfigError:
            return StoreConfigError(store, f"its config object {problem}", "Copy it back from a replica of this store.")

        if len(data) > MAX_CONFIG_BYTES:
            raise bad(f"is {len(data)} bytes (at most {MAX_CONFIG_BYTES})")
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise bad("is not JSON") from None
        if not isinstance(doc, dict) or doc.get("format") != CONFIG_FORMAT:
            raise bad(f"is not a {CONFIG_FORMAT} document")
        version = doc.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise bad("has no whole-number version")
        if version > CONFIG_VERSION:
            raise StoreConfigError(
                store,
                f"its configuration is version {version}, written by a newer Concord (this one reads up to version {CONFIG_VERSION})",
                "Upgrade Concord to use this store.",
            )
        compress = doc.get("compress")
        if compress not in codec.COMPRESS_MODES:
            raise bad(f"names an unknown compression {str(compress)[:20]!r} (one of {', '.join(codec.COMPRESS_MODES)})")
        enc = doc.get("encryption")
        if enc is not None:
            fields = ("algorithm", "kdf", "salt", "key_id", "key_check")
            if not isinstance(enc, dict) or not all(isinstance(enc.get(f), str) for f in fields):
                raise bad("has an encryption entry without " + ", ".join(fields))
            if enc["algorithm"] != ALGORITHM or enc["kdf"] != KDF:
                raise bad(f"names encryption {enc['algorithm'][:20]!r} with {enc['kdf'][:20]!r} ({ALGORITHM} with {KDF} expected)")
            enc = {f: enc[f] for f in fields}
        return cls(compress=compress, encryption=enc, version=version)


class Encoding:
    """How one store keeps its objects (built from its configuration and key)."""

    def __init__(self, config: StoreConfig, cipher: Cipher | None = None, store: str = "") -> None:
        self.config = config
        self.cipher = cipher
        self.store = store

    @property
    def compress(self) -> str:
        return self.config.compress

    @property
    def encrypted(self) -> bool:
        return self.cipher is not None

    @property
    def framed(self) -> bool:
        return self.config.framed

    @property
    def identity(self) -> str:
        """Equal for two stores exactly when one's stored chunks are valid in the other as they are."""
        if not self.framed:
            return "raw"
        return f"{self.compress}/{self.cipher.key_id + ':' + self.config.encryption['salt'] if self.cipher else 'plain'}"

    # ------------------------------------------------------------------ chunks

    def chunk_name(self, cid: str) -> str:
        return self.cipher.name(cid) if self.cipher else cid

    def encode_chunk(self, cid: str, data, dtype: str | None = None, *, transient: bool = False, base=None):
        """How chunk ``cid`` (raw ``data``) is stored; with ``transient``, in one of this thread's
        buffers (see :mod:`.scratch`), for a caller that writes it at once. ``base`` (``(base id,
        its raw bytes)``, as long as ``data``) stores it as a delta against that chunk where the
        delta is smaller than the chunk encoded alone (:func:`~concord.stores.codec.encode_delta`)."""
        if not self.framed:
            return data
        delta = None
        if base is not None and len(base[1]) == len(data):
            delta = codec.encode_delta(data, base[1], base[0], dtype)
        if self.compress == codec.COMPRESS_NONE:
            kind, payload = codec.RAW, data
        else:
            frame = codec.encode_view(data, self.compress, dtype)
            kind, payload = frame[0], frame[1:]
        if delta is not None and len(delta) < len(payload):
            kind, payload = codec.DELTA, delta
        if self.cipher is None:
            if kind == codec.DELTA:
                return bytes((codec.DELTA,)) + delta
            return frame if transient else bytes(frame)  # a store framed unencrypted compresses
        # a delta keeps its base's object name readable, for garbage collection (docs/deltas.md)
        clear = bytes.fromhex(self.cipher.name(base[0])) if kind == codec.DELTA else b""
        return self.cipher.seal(payload, b"chunk:" + cid.encode(), kind, transient=transient, clear=clear)

    def decode_chunk(self, cid: str, blob, size: int | None = None, *, transient: bool = False, base=None):
        """The raw bytes of stored chunk ``cid``; :class:`UnknownEncodingError` naming it if they
        do not decode. With ``transient``, a view that may lie in one of this thread's buffers or
        in ``blob`` itself (see :mod:`.scratch`), for a caller that hashes and writes it at once.
        A chunk stored as a delta needs ``base``: a function of the base chunk's id that returns
        that chunk's frame (its store's :meth:`~concord.stores.base.Store.read_base`)."""
        if not self.framed:
            return blob
        try:
            kind, payload = self.open_frame(cid, blob)
            if kind == codec.DELTA:
                if base is None:
                    raise codec.FrameError("it is a delta, and its base chunk was not given")
                payload = bytes(payload)  # the base's read reuses this thread's buffers
                base_kind, base_payload = base(codec.delta_base(payload))
                return codec.decode_delta(payload, base_kind, base_payload, size, transient=transient)
            view = codec.decode_view(kind, payload, size)
        except (codec.FrameError, SealError) as exc:
            raise UnknownEncodingError(self.store, f"chunk {cid}", str(exc)) from None
        return view if transient else bytes(view)

    def open_frame(self, cid: str, blob) -> tuple[int, memoryview]:
        """``(encoding byte, what follows it)`` of stored chunk ``cid`` in a framed store, opened
        (decrypted, into this thread's ``opened`` buffer) in an encrypted one; not decoded.
        :class:`~concord.errors.FrameError` or :class:`~concord.errors.SealError` if it is no frame."""
        if self.cipher is None:
            return codec.frame_kind(blob), memoryview(blob)[1:]
        clear = codec.BASE_ID_BYTES if len(blob) > 1 and blob[1] == codec.DELTA else 0
        kind, payload = self.cipher.open(blob, b"chunk:" + cid.encode(), framed=True, transient=True, clear=clear)
        return kind, memoryview(payload)

    #: how many bytes of a stored chunk :meth:`base_of` reads
    HEAD_BYTES = 2 + codec.BASE_ID_BYTES

    def base_of(self, name: str, head) -> str | None:
        """The object name of the base chunk that the chunk stored under ``name`` is a delta of,
        from the first :data:`HEAD_BYTES` of it (kept in clear in an encrypted store too), or None
        if it is stored whole. :class:`UnknownEncodingError` naming the object if ``head`` is no
        delta's."""
        if not self.framed or len(head) < 2:
            return None
        at = 1 if self.cipher is None else 2
        if head[at - 1] != codec.DELTA:
            return None
        if len(head) < at + codec.BASE_ID_BYTES:
            raise UnknownEncodingError(self.store, f"chunk object {name}", "delta frame cut short")
        return bytes(head[at : at + codec.BASE_ID_BYTES]).hex()

    def frame_of(self, name: str, head: bytes) -> int:
        """The encoding byte of a stored chunk (object ``name``) from its first two bytes: the
        first, or in an encrypted store the one after the seal mark (kept in clear). Nothing is
        decrypted; :class:`UnknownEncodingError` naming the object if ``head`` is no frame's."""
        try:
            if self.cipher is None:
                return codec.frame_kind(head)
            if len(head) < 2 or head[0] != SEALED:
                raise SealError("not a sealed object" if head and head[0] != SEALED else "sealed object cut short")
            return head[1]
        except (codec.FrameError, SealError) as exc:
            raise UnknownEncodingError(self.store, f"chunk object {name}", str(exc)) from None

    # ------------------------------------------------------------------ other objects

    def seals(self, key: str) -> bool:
        return self.cipher is not None and not key.startswith(PLAIN_DOCUMENTS)

    def seal(self, key: str, data: bytes) -> bytes:
        return self.cipher.seal(data, b"object:" + key.encode()) if self.seals(key) else data

    def open(self, key: str, blob: bytes | None) -> bytes | None:
        if blob is None or not self.seals(key):
            return blob
        try:
            return self.cipher.open(blob, b"object:" + key.encode())
        except SealError as exc:
            raise UnknownEncodingError(self.store, key, str(exc)) from None


PLAIN = Encoding(StoreConfig())


def read_config(store: Store) -> StoreConfig | None:
    """The store's configuration, or None if it has none (plain and raw)."""
    data = store._get_object(CONFIG_KEY)
    return None if data is None else StoreConfig.from_json(store.uri, data)


def store_key(store: Store) -> bytes:
    """The key given to ``store`` (:attr:`Store.key`), else the one in ``CONCORD_KEY_FILE``."""
    if store.key is not None:
        return store.key
    path = os.environ.get(KEY_FILE_ENV)
    if not path:
        raise StoreKeyError(store.uri, "no key was given")
    try:
        return read_key_file(path)
    except ValueError as exc:
        raise StoreKeyError(store.uri, f"{exc} (from {KEY_FILE_ENV})") from None


def load_encoding(store: Store) -> Encoding:
    config = read_config(store)
    if config is None:
        return PLAIN
    if not config.encrypted:
        return Encoding(config, None, store.uri)
    cipher = Cipher(store_key(store), bytes.fromhex(config.encryption["salt"]))
    if cipher.key_check != config.encryption["key_check"]:
        raise StoreKeyError(
            store.uri, f"the key given (id {cipher.key_id}) is not this store's key (id {config.encryption['key_id']})"
        )
    return Encoding(config, cipher, store.uri)


def new_key_file(path: str, store: str) -> bytes:
    """A new store key for ``store`` (its address, for the error), written first: to the new file
    ``path`` in a folder that exists, only its owner can read it, whole (temporary name, flushed,
    renamed, folder flushed) before anything of the store is, so a store never names a key that is
    not on disk. :class:`~concord.errors.StoreConfigError` if it cannot be written (an existing
    file is refused, never overwritten)."""
    folder = os.path.dirname(os.path.abspath(path))
    fix = "Give --key-file a new file in a folder you can write; nothing of the store was written."
    if not os.path.isdir(folder):
        what = "does not exist" if not os.path.lexists(folder) else "is not a folder"
        raise StoreConfigError(store, f"cannot write the new key file {path}: its folder {folder} {what}", fix)
    key = new_key()
    try:
        written = atomic_write(path, (key.hex() + "\n").encode(), mode=0o600, exclusive=True)
    except OSError as exc:
        raise StoreConfigError(store, f"cannot write the new key file {path} ({exc.strerror or exc})", fix) from None
    if not written:
        raise StoreConfigError(store, f"the key file {path} appeared while a new key was written to it", fix)
    return key


def configure(store: Store, *, compress: str = codec.COMPRESS_NONE, encrypt: bool = False, key: bytes | None = None) -> StoreConfig:
    """Write ``store``'s configuration (``concord init``). An empty store takes any; a store that
    already holds objects only the configuration it already has (asking again changes nothing).
    With ``encrypt``, ``key`` is the store key (else :attr:`Store.key` or ``CONCORD_KEY_FILE``)."""
    if compress not in codec.COMPRESS_MODES:
        raise ValueError(f"compress must be one of {', '.join(codec.COMPRESS_MODES)}, got {compress!r}")
    current = read_config(store)
    if encrypt:
        if key is not None:
            store.unlock(key)
        key = store_key(store)
    if current is not None:
        same = current.compress == compress and current.encrypted == encrypt
        if same and encrypt:
            store.encoding()  # the key must be this store's own
        if not same:
            raise StoreConfigError(
                store.uri,
                f"it is already configured (compress {current.compress}, {'encrypted' if current.encrypted else 'not encrypted'})",
                "A store's encoding is chosen once, when it is made: init a new store and sync into it.",
            )
        return current
    wanted = StoreConfig(compress=compress)
    if encrypt:
        salt = new_salt()
        cipher = Cipher(key, salt)
        wanted = StoreConfig(
            compress=compress,
            encryption={"algorithm": ALGORITHM, "kdf": KDF, "salt": salt.hex(), "key_id": cipher.key_id, "key_check": cipher.key_check},
        )
    if any(next(iter(store._list_keys(p)), None) is not None for p in ("refs/", "manifests/", "chunks/")):
        raise StoreConfigError(
            store.uri,
            "it already holds snapshots stored raw, so its encoding cannot change",
            "Init a new store with these settings and sync into it.",
        )
    if not store._put_object(CONFIG_KEY, wanted.to_json(), overwrite=False):
        raise StoreConfigError(store.uri, "another process configured it at the same moment", "Run init again to see its settings.")
    store.forget_encoding()
    if wanted.framed:  # empty: every delta it will hold is indexed as it is written (docs/deltas.md)
        store.mark_delta_index()
    return wanted


__all__ = [
    "CONFIG_KEY",
    "CONFIG_VERSION",
    "Encoding",
    "KEY_FILE_ENV",
    "PLAIN",
    "StoreConfig",
    "configure",
    "load_encoding",
    "new_key_file",
    "read_config",
]
