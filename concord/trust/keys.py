"""Signing and verifying keys: ECDSA on P-256 (also P-384, P-521) in PEM files.

A private key is what ``openssl ecparam -name prime256v1 -genkey`` or ``concord keys generate``
writes (PKCS#8 or SEC1 "EC PRIVATE KEY", optionally encrypted with a password); a public key is
its SubjectPublicKeyInfo PEM (``openssl ec -pubout``). A private key given where a public one is
expected stands for its public half.

A key's **id** is the SHA-256 of its public key's PEM (SubjectPublicKeyInfo) in hex: the same
value OpenSSF Model Signing writes as the bundle's ``verificationMaterial.publicKey.hint``, so the
id a signature carries names the key that can check it. Signature documents are named by it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from concord.errors import KeyFileError, KeyPasswordError, UnsupportedKeyError

#: curves OpenSSF Model Signing accepts, with the hash each signs with
CURVES = {"secp256r1": "sha256", "secp384r1": "sha384", "secp521r1": "sha512"}
#: environment variable holding a private key's password, when it has one
PASSWORD_ENV = "CONCORD_KEY_PASSWORD"
MAX_KEY_BYTES = 64 * 1024


def _hash(name: str):
    from cryptography.hazmat.primitives import hashes

    return {"sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512}[name]()


def _kind(key) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec

    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return f"ECDSA {key.curve.name}"
    name = type(key).__name__.lstrip("_")
    for suffix in ("PrivateKey", "PublicKey"):
        name = name.replace(suffix, "")
    return name or "unknown"


def _check_curve(key, where: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) or key.curve.name not in CURVES:
        raise UnsupportedKeyError(where, _kind(key))


def public_pem(public_key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id_of(public_key) -> str:
    """SHA-256 (hex) of the public key's SubjectPublicKeyInfo PEM: the OMS bundle's key hint."""
    return hashlib.sha256(public_pem(public_key)).hexdigest()


@dataclass(frozen=True)
class PublicKey:
    """A key that checks signatures. ``source`` says where it came from (a path, a block)."""

    key: object = field(repr=False, compare=False)
    id: str
    source: str = ""

    @classmethod
    def of(cls, public_key, source: str = "") -> PublicKey:
        _check_curve(public_key, source or "public key")
        return cls(public_key, key_id_of(public_key), source)

    @property
    def pem(self) -> bytes:
        return public_pem(self.key)

    def verify(self, signature: bytes, message: bytes) -> bool:
        """Whether ``signature`` (DER ECDSA) is this key's over ``message``."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            self.key.verify(signature, message, ec.ECDSA(_hash(CURVES[self.key.curve.name])))
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class SigningKey:
    """A private key that signs; ``public`` is its public half."""

    key: object = field(repr=False, compare=False)
    public: PublicKey
    source: str = ""

    @property
    def id(self) -> str:
        return self.public.id

    def sign(self, message: bytes) -> bytes:
        """A DER ECDSA signature over ``message`` with the curve's hash (as OMS signs)."""
        from cryptography.hazmat.primitives.asymmetric import ec

        return self.key.sign(message, ec.ECDSA(_hash(CURVES[self.key.curve.name])))


def _read(path: str | os.PathLike) -> bytes:
    where = os.fspath(path)
    try:
        with open(where, "rb") as fh:
            data = fh.read(MAX_KEY_BYTES + 1)
    except FileNotFoundError:
        raise KeyFileError(where, "no such file") from None
    except IsADirectoryError:
        raise KeyFileError(where, "it is a folder") from None
    except OSError as exc:
        raise KeyFileError(where, f"cannot be read ({exc.strerror or exc})") from exc
    if len(data) > MAX_KEY_BYTES:
        raise KeyFileError(where, f"larger than {MAX_KEY_BYTES // 1024} KiB, so not a key")
    return data


def signing_key_from_pem(data: bytes, source: str = "private key", password: str | bytes | None = None) -> SigningKey:
    """A signing key from PEM bytes (a block's secret, a file's content)."""
    from cryptography.hazmat.primitives import serialization

    if isinstance(password, str):
        password = password.encode()
    if b"PRIVATE KEY" not in data:
        if b"PUBLIC KEY" in data:
            raise KeyFileError(source, "it is a public key, and signing needs the private key", "Give the private key (KEY.pem, not KEY.pub.pem)")
        raise KeyFileError(
            source,
            "not a PEM private key",
            "Give an ECDSA private key in PEM: `concord keys generate KEY.pem` or `openssl ecparam -name prime256v1 -genkey -noout`",
        )
    try:
        key = serialization.load_pem_private_key(data, password=password or None)
    except TypeError:  # encrypted without a password, or a password for a key that has none
        if password:
            key = serialization.load_pem_private_key(data, password=None)
        else:
            raise KeyPasswordError(source, given=False) from None
    except ValueError as exc:
        if password and b"ENCRYPTED" in data:
            raise KeyPasswordError(source, given=True) from None
        raise KeyFileError(source, f"not a PEM key cryptography can read ({str(exc)[:80]})") from None
    except Exception as exc:  # unsupported algorithms surface as UnsupportedAlgorithm
        raise KeyFileError(source, f"cannot be loaded ({type(exc).__name__}: {str(exc)[:80]})") from None
    _check_curve(key, source)
    return SigningKey(key, PublicKey.of(key.public_key(), source), source)


def load_signing_key(path: str | os.PathLike, password: str | bytes | None = None) -> SigningKey:
    """The private key in the PEM file ``path``; ``password`` defaults to ``$CONCORD_KEY_PASSWORD``."""
    if password is None:
        password = os.environ.get(PASSWORD_ENV) or None
    return signing_key_from_pem(_read(path), os.fspath(path), password)


def public_key_from_pem(data: bytes, source: str = "public key") -> PublicKey:
    """A verifying key from PEM bytes: a public key, or a private key standing for its public half
    (an encrypted private key cannot be read without its password: give its public key)."""
    from cryptography.hazmat.primitives import serialization

    if b"PUBLIC KEY" in data:
        try:
            key = serialization.load_pem_public_key(data)
        except Exception as exc:
            raise KeyFileError(source, f"not a PEM public key cryptography can read ({str(exc)[:80]})") from None
        return PublicKey.of(key, source)
    if b"PRIVATE KEY" in data:
        if b"ENCRYPTED" in data:
            raise KeyFileError(source, "it is a password-protected private key", "Give its public key instead (`openssl ec -in KEY.pem -pubout`)")
        return signing_key_from_pem(data, source).public
    raise KeyFileError(source, "not a PEM key")


def load_public_key(path: str | os.PathLike) -> PublicKey:
    return public_key_from_pem(_read(path), os.fspath(path))


def generate_key(path: str | os.PathLike, *, password: str | None = None, public_path: str | os.PathLike | None = None) -> SigningKey:
    """Write a new ECDSA P-256 private key to ``path`` (mode 0600, PKCS#8, encrypted when a
    password is given) and its public key beside it (``public_path``, default ``<path>.pub``
    with ``.pem`` kept last: ``key.pem`` → ``key.pub.pem``). Refuses to overwrite either file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from concord.files import atomic_write

    where = os.fspath(path)
    pub = os.fspath(public_path) if public_path else default_public_path(where)
    for p in (where, pub):
        if os.path.exists(p):
            raise KeyFileError(p, "the file exists already", "Choose another name; a key is never overwritten")
    key = ec.generate_private_key(ec.SECP256R1())
    enc = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    parent = os.path.dirname(os.path.abspath(where))
    os.makedirs(parent, exist_ok=True)
    atomic_write(where, pem, mode=0o600)
    atomic_write(pub, public_pem(key.public_key()))
    return SigningKey(key, PublicKey.of(key.public_key(), pub), where)


def default_public_path(private_path: str) -> str:
    base, ext = os.path.splitext(private_path)
    return f"{base}.pub{ext or '.pem'}"
