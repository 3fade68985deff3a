"""A trust policy: the public keys whose signatures a root needs before it is used.

A policy comes from ``--trust ENTRY[,ENTRY...]``, else from ``CONCORD_TRUSTED_KEYS`` (the same
list), else from a Prefect block (``blocks.trust.TrustBlock`` builds one with
:meth:`TrustPolicy.from_pems`). No policy means no check, as before. Each entry is a PEM path or
``SOURCE:NAME`` for a trust source (``block:NAME``: a saved ``TrustBlock``'s trusted keys); the
keys of every entry are trusted. Sources come from the ``concord.trust_sources`` entry point
group (the ``blocks`` package registers ``block``) or :func:`register_trust_source`, so the core
never imports Prefect. A signing key is named the same way (:func:`load_signing_key_spec`:
``KEY.pem`` or ``block:NAME``, through ``concord.signing_key_sources``).

Under a policy a root is *trusted* when one of its signature documents verifies with a trusted
key and holds for the root (:func:`concord.trust.signing.check_bundle`). What each caller asks:

- :meth:`TrustPolicy.require` (sync, tier restore, flows, serving, OCI): raises
  :class:`~concord.errors.UntrustedRootError` (one line: the root, the store, the keys tried)
  unless trusted; a root trusted only through a root-less ``model_signing`` bundle has its files'
  SHA-256 computed from the store and compared first.
- :meth:`TrustPolicy.restore_check` (restore): the same, except that for a root-less bundle it
  returns the digests to check (:class:`RestoreDigests`) instead of reading the store first: the
  restore feeds each file's bytes to them as it writes (whole-file or per-shard, with the bundle's
  hash) and refuses before its final rename, so every byte is read once. For a bundle that names
  the root nothing more is needed: restore verifies every chunk against the root's Merkle tree as
  it reads it.
- :meth:`TrustPolicy.report`: never raises; ``signed_by`` and ``trusted`` for verify and audits.

``require`` and ``restore_check`` match the ``check_root`` hook of
:func:`concord.snapshots.sync.replicate` and :func:`concord.snapshots.restore.restore`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Union

from concord.plugins import Plugins, split_prefix
from concord.errors import ConcordError, KeyFileError, SignatureFormatError, TrustPolicyError, UntrustedRootError
from concord.snapshots.manifest import Manifest
from concord.snapshots.refs import load_manifest
from concord.stores.base import Store
from concord.trust import bundle as oms
from concord.trust.keys import PublicKey, SigningKey, load_public_key, load_signing_key, public_key_from_pem
from concord.trust.signing import (
    Checked,
    FileDigests,
    check_bundle,
    compare_digests,
    check_digests,
    read_signature,
    signature_ids,
    signature_key,
)

#: comma-separated trusted public keys: PEM paths and ``block:NAME`` entries
ENV = "CONCORD_TRUSTED_KEYS"
#: entry-point group of trust sources: name → function of the text after ``name:`` returning a
#: :class:`TrustPolicy` or the PEM texts of the trusted keys
SOURCE_GROUP = "concord.trust_sources"
#: entry-point group of signing-key sources: name → function of the text after ``name:``
#: returning a :class:`~concord.trust.keys.SigningKey`
SIGNING_GROUP = "concord.signing_key_sources"

TrustSource = Callable[[str], Union["TrustPolicy", Iterable[Union[bytes, str]], None]]
SigningSource = Callable[[str], SigningKey]
_SOURCES = Plugins(SOURCE_GROUP)
_SIGNERS = Plugins(SIGNING_GROUP)


def register_trust_source(name: str, trusted: TrustSource | None = None, signing: SigningSource | None = None) -> None:
    """Teach ``--trust`` (``trusted``) and ``--key`` (``signing``) a ``name:REST`` entry; each
    function gets the text after ``name:``."""
    if trusted is not None:
        _SOURCES.register(name, trusted)
    if signing is not None:
        _SIGNERS.register(name, signing)


def _split_source(entry: str) -> tuple[str, str] | None:
    found = split_prefix(entry)
    return None if found is None else (found[0], found[1].strip())


def _known(sources: Plugins) -> str:
    return ", ".join(f"{n}:NAME" for n in sources.names()) or "none (pip install -e . registers block:NAME)"


@dataclass(frozen=True)
class Verdict:
    """What a store's signatures say of a root under a policy."""

    root: str
    store: str
    #: key ids of every signature document the store holds for the root
    signed_by: tuple[str, ...]
    #: whether one verifies with a trusted key and holds for the root
    trusted: bool
    #: the trusted key id that vouches for it (None if untrusted)
    trusted_by: str | None = None
    #: why each other signature does not count (key id → problem)
    problems: Mapping[str, str] = field(default_factory=dict)
    #: for a root trusted through a root-less bundle only: SHA-256 its files must have
    #: (with another serialization, the digests it names: see ``checked``)
    expected: Mapping[str, str] | None = None
    #: the root-less bundle's check, with its serialization (None otherwise)
    checked: Checked | None = None

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "store": self.store,
            "signed_by": list(self.signed_by),
            "trusted": self.trusted,
            "trusted_by": self.trusted_by,
            "problems": dict(self.problems),
        }


@dataclass(frozen=True)
class TrustPolicy:
    keys: tuple[PublicKey, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.keys:
            raise TrustPolicyError(self.source or "(nowhere)", "no trusted key")

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(k.id for k in self.keys)

    # ------------------------------------------------------------------ building

    @classmethod
    def from_paths(cls, paths: Iterable[str | os.PathLike], source: str = "") -> "TrustPolicy":
        paths = [os.fspath(p) for p in paths]
        keys = _unique(load_public_key(p) for p in paths)
        return cls(keys, source or ",".join(paths))

    @classmethod
    def from_spec(cls, spec: str, source: str = "--trust") -> "TrustPolicy":
        """``spec``: comma-separated PEM paths and ``SOURCE:NAME`` entries (``block:NAME``), blanks
        around commas ignored; the policy trusts the keys of every entry. Every entry is resolved
        before the policy is returned, so a bad one fails the command before it reads a store."""
        entries = [p.strip() for p in spec.split(",") if p.strip()]
        if not entries:
            raise TrustPolicyError(source, "no key path given")
        keys: list[PublicKey] = []
        for entry in entries:
            found = _split_source(entry)
            if found is None or (os.path.exists(entry) and _SOURCES.get(found[0]) is None):
                keys.append(load_public_key(entry))
            else:
                keys.extend(_keys_of_source(entry, *found))
        return cls(_unique(keys), source)

    @classmethod
    def from_pems(cls, pems: Iterable[bytes | str], source: str = "block") -> "TrustPolicy":
        keys = _unique(
            public_key_from_pem(p.encode() if isinstance(p, str) else p, f"{source} key {i + 1}") for i, p in enumerate(pems)
        )
        return cls(keys, source)

    # ------------------------------------------------------------------ checking

    def report(self, store: Store, root: str, manifest: Manifest | None = None) -> Verdict:
        """What the store's signatures say of ``root`` (never raises for a bad signature)."""
        docs = signature_ids(store, root)
        problems: dict[str, str] = {}
        rootless: list[Checked] = []
        if docs and manifest is None:
            manifest = load_manifest(store, root)
        for kid in docs:
            where = f"{store.uri}/{signature_key(root, kid)}"
            try:
                data = read_signature(store, root, kid)  # a damaged or odd document is a problem of its own
                if data is None:
                    raise SignatureFormatError(where, "it disappeared while it was read")
                parsed = oms.parse_bundle(data, where)
                checked = check_bundle(parsed, root, manifest, self.keys, where)
            except ConcordError as exc:
                problems[kid] = _problem(exc)
                continue
            if checked.root_bound:
                return Verdict(root, store.uri, tuple(docs), True, checked.key_id, problems)
            rootless.append(checked)
        if rootless:
            c = rootless[0]
            return Verdict(root, store.uri, tuple(docs), True, c.key_id, problems, dict(c.expected), c)
        return Verdict(root, store.uri, tuple(docs), False, None, problems)

    def restore_check(self, store: Store, root: str) -> "RestoreDigests | None":
        """Raise unless ``root`` is trusted; when only a root-less bundle vouches for it, the
        digests its restored files must have (checked by the restore as it writes), else None."""
        v = self.report(store, root)
        if not v.trusted:
            raise UntrustedRootError(store.uri, root, self.key_ids, _problems(v))
        if v.checked is None:
            return None
        return RestoreDigests(v.checked, root, store.uri, self.key_ids, f"{store.uri}/{signature_key(root, v.trusted_by)}")

    def require(self, store: Store, root: str) -> Verdict:
        """Raise :class:`UntrustedRootError` unless ``root`` is trusted in ``store``."""
        v = self.report(store, root)
        if not v.trusted:
            raise UntrustedRootError(store.uri, root, self.key_ids, _problems(v))
        if v.checked is not None:
            self._check_digests(store, root, v)
        return v

    def _check_digests(self, store: Store, root: str, v: Verdict) -> None:
        try:
            check_digests(store, load_manifest(store, root), v.checked, f"{store.uri}/{signature_key(root, v.trusted_by)}")
        except ConcordError as exc:
            raise UntrustedRootError(store.uri, root, self.key_ids, (_problem(exc),)) from exc


class RestoreDigests:
    """The digests a root-less bundle names, checked by a restore from the bytes it writes
    (:class:`concord.snapshots.restore.DigestCheck`): each file it signs gets a
    :class:`~concord.trust.signing.FileDigests` of the bundle's serialization (whole file or
    shards; sha256, blake2b or blake3), fed the file's bytes in order. A file that differs fails
    as before the restore hashed in flight: whole-file SHA-256 with
    :class:`~concord.errors.IntegrityError` naming the file, other serializations with
    :class:`~concord.errors.UntrustedRootError` naming the files or shards that differ."""

    def __init__(self, checked: Checked, root: str, store: str, key_ids: tuple[str, ...], where: str) -> None:
        self.checked = checked
        self.root = root
        self.store = store
        self.key_ids = key_ids
        self.where = where
        ser = checked.serialization
        self.paths = {ser.path_of(name) for name in checked.expected}

    @property
    def expected(self) -> Mapping[str, str]:
        """Resource name (a path, or ``PATH:START:END`` for a shard) → digest (hex)."""
        return self.checked.expected

    def hasher(self, path: str, size: int) -> FileDigests | None:
        return FileDigests(path, size, self.checked.serialization) if path in self.paths else None

    def check(self, hashers: Mapping[str, FileDigests]) -> None:
        from concord.errors import IntegrityError

        actual = {name: digest for h in hashers.values() for name, digest in h.result().items()}
        ser = self.checked.serialization
        if ser.whole_file_sha256:
            for rel, digest in sorted(self.expected.items()):
                if actual.get(rel) != digest:
                    raise IntegrityError(
                        f"{rel} of {self.root} from {self.store} (checked against its signature; nothing restored)",
                        f"SHA-256 {digest}", str(actual.get(rel)),
                    )
            return
        try:
            compare_digests(self.expected, actual, self.where, "shard(s)" if ser.method == "shards" else "file(s)")
        except ConcordError as exc:
            raise UntrustedRootError(self.store, self.root, self.key_ids, (_problem(exc),)) from exc


def _keys_of_source(entry: str, name: str, rest: str) -> tuple[PublicKey, ...]:
    """The trusted keys a ``name:rest`` entry names (one line naming the entry when it names none)."""
    fn = _SOURCES.get(name)
    if fn is None:
        raise TrustPolicyError(
            entry, f"there is no trust source {name!r}",
            f"Give a PEM path, or one of: {_known(_SOURCES)}",
        )
    if not rest:
        raise TrustPolicyError(entry, f"no name after {name + ':'!r}", f"Write {name}:NAME")
    got = fn(rest)
    if isinstance(got, TrustPolicy):
        return got.keys
    pems = list(got or ())
    if not pems:
        raise TrustPolicyError(
            entry, "it lists no trusted key",
            f"Add the public keys (PEM) to trust to its trusted_keys, or give PEM paths instead of {entry}",
        )
    return tuple(
        public_key_from_pem(p.encode() if isinstance(p, str) else p, f"{entry} key {i + 1}") for i, p in enumerate(pems)
    )


def load_signing_key_spec(spec: str | os.PathLike, password: str | bytes | None = None) -> SigningKey:
    """The signing key ``spec`` names: a PEM path (``password`` as for
    :func:`~concord.trust.keys.load_signing_key`), or ``SOURCE:NAME`` (``block:NAME``: the
    saved ``TrustBlock``'s signing key, with the block's own password)."""
    text = os.fspath(spec).strip()
    found = _split_source(text)
    fn = None if found is None else _SIGNERS.get(found[0])
    if found is None or (fn is None and os.path.exists(text)):
        return load_signing_key(text, password)
    name, rest = found
    if fn is None:
        raise KeyFileError(text, f"there is no signing-key source {name!r}", f"Give a PEM path, or one of: {_known(_SIGNERS)}")
    if not rest:
        raise KeyFileError(text, f"no name after {name + ':'!r}", f"Write {name}:NAME")
    return fn(rest)


def _problem(exc: Exception) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("signature ") and ": " in text else text


def _problems(v: Verdict) -> tuple[str, ...]:
    return tuple(f"{kid[:16]}: {p.split('. ')[0]}" for kid, p in v.problems.items())


def _unique(keys: Iterable[PublicKey]) -> tuple[PublicKey, ...]:
    out: dict[str, PublicKey] = {}
    for k in keys:
        out.setdefault(k.id, k)
    return tuple(out.values())


def load_policy(trust: str | None = None, *, environ: Mapping[str, str] | None = None) -> TrustPolicy | None:
    """The policy from ``trust`` (comma-separated PEM paths and ``block:NAME`` entries, as
    ``--trust`` takes), else from ``$CONCORD_TRUSTED_KEYS``; None when neither is set."""
    if trust is not None and trust.strip():
        return TrustPolicy.from_spec(trust, "--trust")
    env = os.environ if environ is None else environ
    spec = env.get(ENV, "").strip()
    if spec:
        return TrustPolicy.from_spec(spec, ENV)
    return None
