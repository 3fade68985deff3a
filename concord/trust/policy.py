"""A trust policy: the public keys whose signatures a root needs before it is used.

A policy comes from ``--trust ENTRY[,ENTRY...]``, else from ``CONCORD_TRUSTED_KEYS`` (the same
list), else from a Prefect block (``blocks.trust.TrustBlock`` builds one with
:meth:`TrustPolicy.from_pems`). No policy means no check, as before; a list given empty is a
:class:`~concord.errors.TrustPolicyError`, never "no policy". Each entry is a PEM path or
``SOURCE:NAME`` for a trust source (``block:NAME``: a saved ``TrustBlock``'s trusted keys); the
keys of every entry are trusted. Sources come from the ``concord.trust_sources`` entry point
group (the ``blocks`` package registers ``block``) or :func:`register_trust_source`, so the core
never imports Prefect. A signing key is named the same way (:func:`load_signing_key_spec`:
``KEY.pem`` or ``block:NAME``, through ``concord.signing_key_sources``).

Under a policy a root is *trusted* when at least ``threshold`` distinct trusted keys have a
signature document that verifies, holds for this root's bytes and leaves none of its files
unsigned. :meth:`TrustPolicy.decide` is the one function that decides it; what each caller asks
goes through it:

- :meth:`TrustPolicy.require` (sync, tier restore, flows, serving, OCI): raises
  :class:`~concord.errors.UntrustedRootError` (one line: the root, the store, the keys tried and
  why each signature does not count) unless trusted; a root-less ``model_signing`` bundle has its
  digests computed from the store and compared first.
- :meth:`TrustPolicy.restore_check` (restore): the same, except that root-less bundles come back
  as the digests to check (:class:`RestoreDigests`) instead of reading the store first: the
  restore feeds each file's bytes to them as it writes (whole-file or per-shard, with the bundle's
  hash) and refuses before its final rename, so every byte is read once. For a bundle that names
  the root nothing more is needed: restore verifies every chunk against the root's Merkle tree as
  it reads it.
- :meth:`TrustPolicy.report`: never raises; ``signed_by`` (verified signers only), ``trusted``
  and ``problems`` for verify, signatures, log and the audits.

``require`` and ``restore_check`` match the ``check_root`` hook of
:func:`concord.snapshots.sync.replicate` and :func:`concord.snapshots.restore.restore`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Union

from concord.errors import ConcordError, KeyFileError, SignatureFormatError, TrustPolicyError, UntrustedRootError
from concord.plugins import Plugins, split_prefix
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
    file_digests,
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

TrustSource = Callable[[str], Union["TrustPolicy", Iterable[bytes | str], None]]
SigningSource = Callable[[str], SigningKey]
_SOURCES = Plugins(SOURCE_GROUP)
#: the key of :attr:`Verdict.problems` that says too few distinct keys signed
THRESHOLD = "(threshold)"
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
    """What a store's signatures say of a root under a policy (:meth:`TrustPolicy.decide`)."""

    root: str
    store: str
    #: the distinct trusted keys whose signatures verify over this root and whose signed digests
    #: equal this root's files (never a key whose signature did not verify)
    signed_by: tuple[str, ...]
    #: whether at least the policy's threshold of them did
    trusted: bool
    #: the first of ``signed_by`` (None if untrusted)
    trusted_by: str | None = None
    #: why each other signature document does not count (the key id it is named by → problem)
    problems: Mapping[str, str] = field(default_factory=dict)
    #: the key ids the root's signature documents are named by (what they claim, not checked)
    documents: tuple[str, ...] = ()
    #: for a restore only: root-less bundles whose signature verified and whose file list is the
    #: root's, their digests still to compare with the bytes the restore writes
    pending: tuple[Checked, ...] = ()

    def lines(self) -> list[str]:
        """What a person reads: each key that signed, and each signature that does not count
        (named as an invalid signature, never as a signer)."""
        out = [f"signed by key {k}" for k in self.signed_by]
        for kid, problem in self.problems.items():
            if kid == THRESHOLD:
                out.append(f"not enough signatures: {problem}")
            else:
                out.append(f"invalid signature from key id {kid[:16]}: {problem}")
        return out

    def why(self) -> str:
        """Why the root is not trusted, in a few words (empty when it is)."""
        if self.trusted:
            return ""
        if not self.documents:
            return "it has no signature"
        return "; ".join(_problems(self)[:3]) or "no signature counts"

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
    """Trusted public keys, and how many distinct ones must sign a root (``threshold``, at least 1)."""

    keys: tuple[PublicKey, ...]
    source: str = ""
    threshold: int = 1

    def __post_init__(self) -> None:
        if not self.keys:
            raise TrustPolicyError(self.source or "(nowhere)", "no trusted key")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or not 1 <= self.threshold <= len(self.keys):
            raise TrustPolicyError(
                self.source or "(nowhere)",
                f"threshold {self.threshold!r} is not between 1 and the {len(self.keys)} trusted key(s)",
                "Give a threshold of at most as many keys as the policy trusts",
            )

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(k.id for k in self.keys)

    # ------------------------------------------------------------------ building

    @classmethod
    def from_paths(cls, paths: Iterable[str | os.PathLike], source: str = "") -> TrustPolicy:
        paths = [os.fspath(p) for p in paths]
        keys = _unique(load_public_key(p) for p in paths)
        return cls(keys, source or ",".join(paths))

    @classmethod
    def from_spec(cls, spec: str, source: str = "--trust") -> TrustPolicy:
        """``spec``: comma-separated PEM paths and ``SOURCE:NAME`` entries (``block:NAME``), blanks
        around commas ignored; the policy trusts the keys of every entry. Every entry is resolved
        before the policy is returned, so a bad one fails the command before it reads a store.
        A list naming nothing is an error, never "no policy"."""
        entries = [p.strip() for p in spec.split(",") if p.strip()]
        if not entries:
            raise TrustPolicyError(source, "the list of trusted keys is empty (an empty list is not \"no policy\")")
        keys: list[PublicKey] = []
        for entry in entries:
            found = _split_source(entry)
            if found is None or (os.path.exists(entry) and _SOURCES.get(found[0]) is None):
                keys.append(load_public_key(entry))
            else:
                keys.extend(_keys_of_source(entry, *found))
        return cls(_unique(keys), source)

    @classmethod
    def from_pems(cls, pems: Iterable[bytes | str], source: str = "block") -> TrustPolicy:
        keys = _unique(
            public_key_from_pem(p.encode() if isinstance(p, str) else p, f"{source} key {i + 1}") for i, p in enumerate(pems)
        )
        return cls(keys, source)

    # ------------------------------------------------------------------ checking

    def decide(
        self, store: Store, root: str, *, manifest: Manifest | None = None, defer_digests: bool = False, complete: bool = True
    ) -> Verdict:
        """THE answer to "is ``root`` in ``store`` trusted?"; every other check calls this one.

        A signature document counts for the key that verifies it when (1) its signature verifies
        with a trusted key, (2) it holds for this root: a Concord bundle names this root (whose
        Merkle tree fixes every byte of every file), a root-less ``model_signing`` bundle has its
        digests equal to this root's files, recomputed from the store (every chunk checked
        against the root as it is read), and (3) the root has no file outside what it signs (for
        a root-less bundle, the paths it ignores are unsigned files too). ``root`` is trusted when
        at least ``threshold`` distinct keys count. With ``defer_digests`` (a restore, which
        hashes the bytes it writes), root-less bundles are returned in ``pending`` instead of
        being compared here. Without ``complete`` no more digests are computed once the
        threshold is reached (``signed_by`` may then name fewer keys than could sign). Never
        raises for a bad signature: each lands in ``problems``."""
        docs = tuple(signature_ids(store, root))
        problems: dict[str, str] = {}
        if docs and manifest is None:
            manifest = load_manifest(store, root)
        bound: dict[str, Checked] = {}
        rootless: list[tuple[str, Checked]] = []
        for kid in docs:
            where = f"{store.uri}/{signature_key(root, kid)}"
            try:
                data = read_signature(store, root, kid)  # a damaged or odd document is a problem of its own
                if data is None:
                    raise SignatureFormatError(where, "it disappeared while it was read")
                checked = check_bundle(oms.parse_bundle(data, where), root, manifest, self.keys, where)
            except ConcordError as exc:
                problems[kid] = _problem(exc)
                continue
            if checked.root_bound:
                bound.setdefault(checked.key_id, checked)
            else:
                rootless.append((kid, checked))
        holds = list(bound)
        pending: list[Checked] = []
        computed: dict[oms.Serialization, Mapping[str, str]] = {}
        for kid, checked in rootless:
            if checked.key_id in holds or any(p.key_id == checked.key_id for p in pending):
                continue
            if not complete and len(holds) >= self.threshold:
                break
            if defer_digests:
                pending.append(checked)
                continue
            where = f"{store.uri}/{signature_key(root, kid)}"
            try:
                ser = checked.serialization
                if ser not in computed:
                    computed[ser] = file_digests(store, manifest, serialization=ser)
                actual = {name: d for name, d in computed[ser].items() if ser.path_of(name) in checked.files}
                compare_digests(checked.expected, actual, where, "shard(s)" if ser.method == "shards" else "file(s)")
            except ConcordError as exc:
                problems[kid] = _problem(exc)
                continue
            holds.append(checked.key_id)
        if len(holds) + len(pending) < self.threshold and (holds or pending):
            problems.setdefault(THRESHOLD, f"signed by {len(holds) + len(pending)} of the {self.threshold} trusted keys needed")
        trusted = len(holds) + len(pending) >= self.threshold
        signed = tuple(holds) + tuple(p.key_id for p in pending)
        return Verdict(root, store.uri, signed, trusted, signed[0] if trusted else None, problems, docs, tuple(pending))

    def report(self, store: Store, root: str, manifest: Manifest | None = None) -> Verdict:
        """:meth:`decide`, for verify, signatures, log and the audits (never raises for a bad signature)."""
        return self.decide(store, root, manifest=manifest)

    def require(self, store: Store, root: str) -> Verdict:
        """:meth:`decide`, raising :class:`UntrustedRootError` (one line) unless ``root`` is trusted."""
        v = self.decide(store, root, complete=False)
        if not v.trusted:
            raise UntrustedRootError(store.uri, root, self.key_ids, _problems(v))
        return v

    def restore_check(self, store: Store, root: str) -> RestoreDigests | None:
        """:meth:`decide` for a restore (the ``check_root`` hook): raise unless trusted; when
        root-less bundles are needed to reach the threshold, the digests the restored files
        must have (checked by the restore as it writes, every byte read once), else None."""
        v = self.decide(store, root, defer_digests=True, complete=False)
        if not v.trusted:
            raise UntrustedRootError(store.uri, root, self.key_ids, _problems(v))
        if not v.pending or len(v.signed_by) - len(v.pending) >= self.threshold:
            return None  # the bundles that name the root are enough: restore checks every chunk against it
        return RestoreDigests(v, self.threshold, self.key_ids)


class RestoreDigests:
    """The digests root-less bundles name, checked by a restore from the bytes it writes
    (:class:`concord.snapshots.restore.DigestCheck`): each file they sign gets a
    :class:`~concord.trust.signing.FileDigests` per bundle (whole file or shards; sha256, blake2b
    or blake3), fed the file's bytes in order. The restore succeeds only when, with the keys
    that already hold, at least the threshold of distinct keys have every digest equal; a file
    that differs fails it: whole-file SHA-256 with :class:`~concord.errors.IntegrityError`
    naming the file, other serializations with :class:`~concord.errors.UntrustedRootError`
    naming the files or shards that differ."""

    def __init__(self, verdict: Verdict, threshold: int, key_ids: tuple[str, ...]) -> None:
        self.root = verdict.root
        self.store = verdict.store
        self.key_ids = key_ids
        self.pending = verdict.pending
        self.needed = threshold - (len(verdict.signed_by) - len(verdict.pending))
        self.where = {c.key_id: f"{verdict.store}/{signature_key(verdict.root, c.key_id)}" for c in verdict.pending}

    @property
    def expected(self) -> Mapping[str, str]:
        """Resource name (a path, or ``PATH:START:END`` for a shard) → digest (hex), of the first bundle."""
        return self.pending[0].expected

    def hasher(self, path: str, size: int) -> _Fanout | None:
        hs = [FileDigests(path, size, c.serialization) if path in c.files else None for c in self.pending]
        return _Fanout(hs) if any(h is not None for h in hs) else None

    def check(self, hashers: Mapping[str, _Fanout]) -> None:
        failures: list[Exception] = []
        for i, checked in enumerate(self.pending):
            actual = {name: d for h in hashers.values() if h.parts[i] is not None for name, d in h.parts[i].result().items()}
            try:
                self._compare(checked, actual)
            except ConcordError as exc:
                failures.append(exc)
        if len(self.pending) - len(failures) < self.needed:
            raise failures[0]

    def _compare(self, checked: Checked, actual: Mapping[str, str]) -> None:
        from concord.errors import IntegrityError

        ser = checked.serialization
        if ser.whole_file_sha256:
            for rel, digest in sorted(checked.expected.items()):
                if actual.get(rel) != digest:
                    raise IntegrityError(
                        f"{rel} of {self.root} from {self.store} (checked against its signature; nothing restored)",
                        f"SHA-256 {digest}", str(actual.get(rel)),
                    )
            return
        try:
            compare_digests(checked.expected, actual, self.where[checked.key_id], "shard(s)" if ser.method == "shards" else "file(s)")
        except ConcordError as exc:
            raise UntrustedRootError(self.store, self.root, self.key_ids, (_problem(exc),)) from exc


class _Fanout:
    """One file's bytes fed to the digests of each pending bundle that signs it."""

    def __init__(self, parts: list[FileDigests | None]) -> None:
        self.parts = parts

    def update(self, data: bytes) -> None:
        for h in self.parts:
            if h is not None:
                h.update(data)


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
    ``--trust`` takes), else from ``$CONCORD_TRUSTED_KEYS``; None only when neither is given.
    A list given but empty (``--trust ""``, ``CONCORD_TRUSTED_KEYS=`` set to nothing) is a
    :class:`~concord.errors.TrustPolicyError`, never "no policy"."""
    if trust is not None:
        return TrustPolicy.from_spec(trust, "--trust")
    env = os.environ if environ is None else environ
    spec = env.get(ENV)
    if spec is not None:
        return TrustPolicy.from_spec(spec, ENV)
    return None
