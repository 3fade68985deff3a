"""OpenSSF Model Signing (OMS v1.0) bundles, written and read by Concord itself.

A signature is a Sigstore bundle (media type ``application/vnd.dev.sigstore.bundle.v0.3+json``)
holding a DSSE envelope whose payload is an in-toto statement (``https://in-toto.io/Statement/v1``)
with predicate type ``https://model_signing/signature/v1.0``::

    {"mediaType": ..., "verificationMaterial": {"publicKey": {"hint": <key id>}, "tlogEntries": []},
     "dsseEnvelope": {"payload": base64(statement), "payloadType": "application/vnd.in-toto+json",
                      "signatures": [{"sig": base64(DER ECDSA over PAE(payload)), "keyid": ""}]}}

    statement = {"_type": ..., "subject": [{"name": MODEL, "digest": {"sha256": H}}],
                 "predicateType": ..., "predicate": {
                     "serialization": {"method": "files", "hash_type": "sha256",
                                       "allow_symlinks": false, "ignore_paths": [...]},
                     "resources": [{"name": PATH, "algorithm": "sha256", "digest": SHA256(file)}, ...],
                     "concord": {"root": ROOT, "manifest_format": ..., "ref": REF}}}

``H`` is SHA-256 over the concatenated raw digests of the resources, in the order listed (sorted
by path, as OMS lists them). ``PAE`` is DSSE's pre-authentication encoding,
``"DSSEv1" SP len(type) SP type SP len(payload) SP payload``.

**How the Concord root is bound.** The root sits in the predicate, under ``concord``, inside the
signed payload: changing it breaks the signature. OMS v1.0 says a verifier reads only
``serialization`` and ``resources`` from the predicate and ignores any other field, so
``model_signing verify`` checks the restored folder against ``resources`` and accepts the bundle;
Concord additionally requires ``concord.root`` to equal the root it is asked about. A bundle made
by ``model_signing sign`` has no ``concord`` field: Concord then binds it to a root by comparing
its ``resources`` with the SHA-256 of the snapshot's files (see :mod:`concord.trust.signing`).

**Other serializations.** ``model_signing``'s Python API (not its command line, which always
writes ``files`` with sha256) can also hash with ``blake2b`` or ``blake3``, and cut files into
shards (``"method": "shards"``, ``shard_size``, resources named ``PATH:START:END`` with algorithm
``<hash>-sharded-<size>``; an empty file has no shard). Concord reads all of those
(:class:`Serialization`) and checks their digests against the snapshot's bytes, computed the same
way; anything else is refused in one line naming the serialization.

Everything read here comes from a store or a user's file, so parsing is bounded and strict: a
damaged, truncated or foreign document raises :class:`~concord.errors.SignatureFormatError`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field

from concord.errors import SignatureFormatError
from concord.hashing import is_digest

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
#: the paths OMS ignores by default (its ``ignore_git_paths``); never listed as resources
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
#: bundles are small: a few hundred bytes per file of the model
MAX_BUNDLE_BYTES = 64 * 1024 * 1024


#: the hash types OMS bundles use, with the length of their hex digests
HASH_TYPES = {"sha256": 64, "blake2b": 128, "blake3": 64}
_SHARD_NAME = re.compile(r"^(.+):(0|[1-9]\d*):([1-9]\d*)$")


@dataclass(frozen=True)
class Serialization:
    """How a bundle's resources were hashed: whole files (``files``) or byte ranges of
    ``shard_size`` bytes (``shards``), with ``hash_type``. Concord itself writes files/sha256."""

    method: str = "files"
    hash_type: str = "sha256"
    shard_size: int | None = None

    @property
    def whole_file_sha256(self) -> bool:
        """Whether resources are the SHA-256 of whole files (what a restore can check as it writes)."""
        return self.method == "files" and self.hash_type == "sha256"

    @property
    def algorithm(self) -> str:
        """The ``algorithm`` every resource of such a bundle names."""
        return self.hash_type if self.method == "files" else f"{self.hash_type}-sharded-{self.shard_size}"

    def describe(self) -> str:
        return f"{self.method}/{self.hash_type}" + (f" in shards of {self.shard_size} bytes" if self.shard_size else "")

    def path_of(self, name: str) -> str:
        """The file a resource name belongs to (``PATH:START:END`` → ``PATH`` for shards)."""
        if self.method == "files":
            return name
        m = _SHARD_NAME.match(name)
        return m.group(1) if m else name

    def names(self, path: str, size: int) -> list[tuple[str, int, int]]:
        """``(resource name, start, end)`` of file ``path`` of ``size`` bytes, as OMS cuts it."""
        if self.method == "files":
            return [(path, 0, size)]
        step = int(self.shard_size or 0)
        return [(f"{path}:{start}:{min(start + step, size)}", start, min(start + step, size)) for start in range(0, size, step)]

    def hasher(self):
        """A new hash object of ``hash_type`` (``update``, ``hexdigest``)."""
        if self.hash_type == "blake3":
            from blake3 import blake3

            return blake3()
        return hashlib.blake2b() if self.hash_type == "blake2b" else hashlib.sha256()


FILES_SHA256 = Serialization()


def pae(payload: bytes, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload`` (what the signature is over)."""
    return b"DSSEv1 %d %s %d " % (len(payload_type), payload_type.encode(), len(payload)) + payload


def path_order(path: str) -> tuple[str, ...]:
    """Sort key of a resource name: by path components, as OMS sorts its manifest."""
    return tuple(path.split("/"))


def is_ignored(path: str, ignore_paths) -> bool:
    """Whether ``path`` (posix, relative) is, or lies under, one of ``ignore_paths``."""
    for p in ignore_paths:
        p = p.strip("/")
        if p and (path == p or path.startswith(p + "/")):
            return True
    return False


def subject_digest(resources: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for _, digest in resources:
        h.update(bytes.fromhex(digest))
    return h.hexdigest()


def statement_bytes(
    model_name: str,
    resources: dict[str, str],
    *,
    ignore_paths: tuple[str, ...] = GIT_PATHS,
    concord: dict | None = None,
) -> bytes:
    """The in-toto statement (JSON bytes) over ``resources`` (path → SHA-256 hex)."""
    items = sorted(resources.items(), key=lambda kv: path_order(kv[0]))
    predicate: dict = {
        "serialization": {
            "method": "files",
            "hash_type": "sha256",
            "allow_symlinks": False,
            "ignore_paths": list(ignore_paths),
        },
        "resources": [{"name": n, "algorithm": "sha256", "digest": d} for n, d in items],
    }
    if concord is not None:
        predicate["concord"] = concord
    doc = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": model_name, "digest": {"sha256": subject_digest(items)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def bundle_bytes(payload: bytes, signature: bytes, key_hint: str) -> bytes:
    """The Sigstore bundle (JSON bytes) around ``payload`` and its DER ``signature``."""
    doc = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": key_hint}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}],
        },
    }
    return json.dumps(doc, indent=1).encode() + b"\n"


@dataclass(frozen=True)
class Statement:
    """What a signature says: the model's name, its files' SHA-256, what was ignored, and (when
    Concord made it) the root it signs."""

    model_name: str
    resources: dict[str, str]
    ignore_paths: tuple[str, ...]
    root: str | None = None
    ref: str | None = None
    serialization: Serialization = field(default=FILES_SHA256)

    def files(self) -> set[str]:
        """The paths of the files the resources belong to."""
        return {self.serialization.path_of(name) for name in self.resources}


@dataclass(frozen=True)
class Bundle:
    """A parsed bundle: the signed payload, the signature over its PAE, the key hint."""

    payload: bytes
    signature: bytes
    key_hint: str
    statement: Statement

    @property
    def signed_message(self) -> bytes:
        return pae(self.payload)


def _b64(text, where: str, what: str) -> bytes:
    if not isinstance(text, str) or not text:
        raise SignatureFormatError(where, f"{what} is missing or not a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureFormatError(where, f"{what} is not valid base64 (the bundle is truncated or altered)") from None


def _obj(value, where: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise SignatureFormatError(where, f"{what} is missing or not an object")
    return value


def parse_bundle(data: bytes, where: str) -> Bundle:
    """Parse (never verify) an OMS bundle; :class:`SignatureFormatError` for anything else."""
    from concord.documents import load_json_document

    def fail(problem: str) -> SignatureFormatError:
        return SignatureFormatError(where, problem)

    doc = load_json_document(data, where, max_bytes=MAX_BUNDLE_BYTES, error=fail)
    if doc.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise fail(f"media type {str(doc.get('mediaType'))[:60]!r} (expected {BUNDLE_MEDIA_TYPE})")
    material = _obj(doc.get("verificationMaterial"), where, "verificationMaterial")
    hint = _obj(material.get("publicKey", {}), where, "verificationMaterial.publicKey").get("hint") or ""
    if hint and not (isinstance(hint, str) and len(hint) == 64 and all(c in "0123456789abcdef" for c in hint)):
        raise fail("verificationMaterial.publicKey.hint is not a SHA-256 key id")
    env = _obj(doc.get("dsseEnvelope"), where, "dsseEnvelope (only DSSE bundles are model signatures)")
    if env.get("payloadType") != PAYLOAD_TYPE:
        raise fail(f"payload type {str(env.get('payloadType'))[:60]!r} (expected {PAYLOAD_TYPE})")
    sigs = env.get("signatures")
    if not isinstance(sigs, list) or len(sigs) != 1:
        raise fail("the envelope must hold exactly one signature")
    signature = _b64(_obj(sigs[0], where, "signature").get("sig"), where, "the signature")
    payload = _b64(env.get("payload"), where, "the payload")
    return Bundle(payload, signature, hint, parse_statement(payload, where))


def parse_statement(payload: bytes, where: str) -> Statement:
    from concord.documents import load_json_document

    def fail(problem: str) -> SignatureFormatError:
        return SignatureFormatError(where, f"statement: {problem}")

    doc = load_json_document(payload, where, max_bytes=MAX_BUNDLE_BYTES, error=fail)
    if doc.get("_type") != STATEMENT_TYPE:
        raise fail(f"type {str(doc.get('_type'))[:60]!r} (expected {STATEMENT_TYPE})")
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise fail(f"predicate type {str(doc.get('predicateType'))[:60]!r} (expected {PREDICATE_TYPE})")
    subjects = doc.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise fail("it must have exactly one subject")
    name = subjects[0].get("name")
    digest = _obj(subjects[0].get("digest"), where, "subject digest").get("sha256")
    pred = _obj(doc.get("predicate"), where, "predicate")
    ser = _obj(pred.get("serialization"), where, "predicate.serialization")
    serialization = _serialization(ser, fail)
    ignore = ser.get("ignore_paths", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise fail("serialization.ignore_paths is not a list of paths")
    res = pred.get("resources")
    if not isinstance(res, list):
        raise fail("predicate.resources is missing")
    items: list[tuple[str, str]] = []
    width = HASH_TYPES[serialization.hash_type]
    for i, r in enumerate(res):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str) or r.get("algorithm") != serialization.algorithm:
            raise fail(f"resource {i} is not a {serialization.algorithm} digest, as its serialization says")
        if serialization.method == "shards" and not _SHARD_NAME.match(r["name"]):
            raise fail(f"resource {i} ({r['name'][:80]}) does not name a shard (PATH:START:END)")
        d = r.get("digest")
        if not (isinstance(d, str) and len(d) == width and all(c in "0123456789abcdef" for c in d)):
            raise fail(f"resource {i} ({r['name'][:80]}) has no {serialization.hash_type} digest")
        items.append((r["name"], d))
    if digest != subject_digest(items):
        raise fail("the subject's digest does not match its resources (the statement was altered)")
    resources = dict(items)
    if len(resources) != len(items):
        raise fail("a resource is listed twice")
    root = ref = None
    extra = pred.get("concord")
    if extra is not None:
        extra = _obj(extra, where, "predicate.concord")
        root = extra.get("root")
        if not is_digest(root):
            raise fail("predicate.concord.root is not a 64-hex root")
        ref = extra.get("ref") if isinstance(extra.get("ref"), str) else None
    return Statement(str(name) if name is not None else "", resources, tuple(ignore), root, ref, serialization)


def _serialization(ser: dict, fail) -> Serialization:
    """The serialization a predicate names, or one line saying it cannot be read and what to use."""
    method, hash_type = ser.get("method"), ser.get("hash_type")
    shard_size = ser.get("shard_size")
    what = f"serialization {str(method)[:20]}/{str(hash_type)[:20]}"
    instead = (
        "Concord reads model_signing's `files` and `shards` serializations hashed with sha256, blake2b "
        "or blake3; sign with `model_signing sign key` (files, sha256)"
    )
    if method not in ("files", "shards") or hash_type not in HASH_TYPES:
        raise fail(f"{what}: {instead}")
    if method == "files":
        return Serialization("files", hash_type)
    # model_signing writes the shard size as a JSON number that may read back as a float
    if isinstance(shard_size, bool) or not isinstance(shard_size, (int, float)) or not 0 < shard_size < 2**53 or shard_size != int(shard_size):
        raise fail(f"{what}: shard_size {str(shard_size)[:30]} is not a whole number of bytes above 0")
    return Serialization("shards", hash_type, int(shard_size))
