"""Encryption at rest: AES-256-GCM over every object of an encrypted store, and keyed names.

A store key is 32 random bytes (a key file holds them raw, or as 64 hex characters). Three keys
are derived from it with HKDF-SHA256 and the store's random salt: one encrypts objects, one names
chunks, one makes the key check that tells a wrong key from a damaged store. Each object is sealed
with a fresh random 96-bit nonce (never a deterministic one), and with associated data that binds
it to its place (``chunk:<id>``, ``object:<key>``), so an object moved to another name does not
open; a sealed chunk keeps its encoding byte (raw, zstd, byte planes) beside the nonce, bound
into the associated data too, so the chunk's bytes are encrypted without being copied into a frame
first. A chunk's object name is the HMAC-SHA256 of its id under the naming key: identical chunks
still land on one name (and are stored once), yet the name does not reveal the plaintext hash.

``cryptography`` is imported on first use.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from concord.errors import SealError, StoreKeyFileError
from concord.stores import scratch

#: the first byte of a sealed object
SEALED = 0x80
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32
SALT_BYTES = 16
ALGORITHM = "AES-256-GCM"
KDF = "HKDF-SHA256"
_CHECK_TEXT = b"concord store key check"


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def new_salt() -> bytes:
    return secrets.token_bytes(SALT_BYTES)


def parse_key(data: bytes, where: str) -> bytes:
    """The 32-byte key a key file holds (raw, or 64 hex characters with optional whitespace);
    ``ValueError`` naming ``where`` for anything else."""
    if len(data) == KEY_BYTES:
        return bytes(data)
    text = data.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise StoreKeyFileError(where, f"key file {where} holds {len(data)} bytes")


def read_key_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(4 * KEY_BYTES + 1)
    except OSError as exc:
        raise StoreKeyFileError(path, f"cannot read key file {path} ({exc.strerror})") from None
    return parse_key(data, path)


def write_key_file(path: str, key: bytes) -> None:
    """Write ``key`` as hex to a new file only its owner can read (an existing file is refused)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")


def _hkdf(key: bytes, salt: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(key)


class Cipher:
    """The keys of one encrypted store (derived once), sealing and opening its objects."""

    def __init__(self, key: bytes, salt: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(key) != KEY_BYTES:
            raise ValueError("a store key is 32 bytes")
        self._aead = AESGCM(_hkdf(key, salt, b"concord/objects"))
        self._names = _hkdf(key, salt, b"concord/names")
        check = _hkdf(key, salt, b"concord/key-check")
        self.key_check = hmac.new(check, _CHECK_TEXT, hashlib.sha256).hexdigest()
        #: a short public id of the key (a hash of the key check): tells keys apart in messages
        self.key_id = hashlib.sha256(self.key_check.encode()).hexdigest()[:16]

    def __reduce__(self):  # never pickled: a store travels with its key and derives again
        raise TypeError("a Cipher is not pickled; the store derives it again from its key")

    def name(self, cid: str) -> str:
        """The object name of chunk ``cid``: a keyed hash, 64 hex characters like an id."""
        return hmac.new(self._names, cid.encode("ascii"), hashlib.sha256).hexdigest()

    def seal(self, data, aad: bytes, kind: int | None = None, *, transient: bool = False, clear: bytes = b""):
        """``0x80``, then ``kind`` (a chunk's encoding byte, also bound into the associated data)
        if given, and ``clear`` (bytes kept readable beside it, bound too: a delta's base object
        name), a fresh nonce, and ``data`` encrypted with its tag, written in one buffer: a new
        ``bytearray``, or with ``transient`` this thread's ``sealed`` buffer (see :mod:`.scratch`)."""
        head = bytes((SEALED,)) if kind is None else bytes((SEALED, kind)) + clear
        if kind is not None:
            aad += bytes((kind,)) + clear
        nonce = secrets.token_bytes(NONCE_BYTES)
        start = len(head) + NONCE_BYTES
        size = start + len(data) + TAG_BYTES
        out = scratch.buffer("sealed", size) if transient else memoryview(bytearray(size))
        out[: len(head)] = head
        out[len(head) : start] = nonce
        self._aead.encrypt_into(nonce, data, aad, out[start:])
        return out if transient else out.obj

    def open(self, blob, aad: bytes, *, framed: bool = False, transient: bool = False, clear: int = 0):
        """The plaintext of a sealed object (with ``framed``: ``(kind, plaintext)``); with
        ``transient``, in this thread's ``opened`` buffer (see :mod:`.scratch`). ``clear``: how
        many bytes the seal kept readable after the kind (see :meth:`seal`)."""
        from cryptography.exceptions import InvalidTag

        view = memoryview(blob)
        skip = 2 + clear if framed else 1
        if len(view) < skip + NONCE_BYTES + TAG_BYTES or view[0] != SEALED:
            raise SealError("not a sealed object" if len(view) and view[0] != SEALED else "sealed object cut short")
        kind = view[1] if framed else None
        if framed:
            aad += bytes(view[1:skip])
        nonce, sealed = view[skip : skip + NONCE_BYTES], view[skip + NONCE_BYTES :]
        try:
            if transient:
                data = scratch.buffer("opened", len(sealed) - TAG_BYTES)
                self._aead.decrypt_into(nonce, sealed, aad, data)
            else:
                data = self._aead.decrypt(nonce, sealed, aad)
        except InvalidTag:
            raise SealError("it does not decrypt (damaged, or moved from another name)") from None
        return (kind, data) if framed else data
