"""A trust policy: the public keys whose signatures a root needs before it is used.

A policy comes from ``--trust ENTRY[,ENTRY...]``, else from ``CONCORD_TRUSTED_KEYS`` (the same
list), else from a Prefect block (``concord_pipelines.blocks.trust.TrustBlock`` builds one with
:meth:`TrustPolicy.from_pems`). No policy means no check, as before; a list given empty is a
:class:`~concord.errors.TrustPolicyError`, never "no policy". Each entry is a PEM path or
``SOURCE:NAME`` for a trust source (``block:NAME``: a saved ``TrustBlock``'s trusted keys); the
keys of every entry are trusted. An entry ending in ``.yaml``/``.yml`` is a *policy file* (it must
be the only entry): its ``keys`` name each key (a mapping name → PEM path or ``block:NAME``,
paths relative to the file; or a list, each named by its file) and its ``threshold`` says how many
of them must sign (default 1)::

    threshold: 2
    keys:
      us-east: keys/us-east.pub.pem
      eu-central: keys/eu-central.pub.pem
      ap-south: block:ap-south

``--trust-threshold K`` (``load_policy(..., threshold=K)``, ``$CONCORD_TRUST_THRESHOLD`` beside
``$CONCORD_TRUSTED_KEYS``, a block's ``threshold``) sets it beside a plain key list. Each key has a
name for people (its policy-file name, else its file name without ``.pub.pem``), so a verdict reads
"2 of 3 (us-east, eu-central; ap-south missing)". Sources come from the ``concord.trust_sources`` entry point
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
#: how many distinct keys of ``$CONCORD_TRUSTED_KEYS`` must sign (default 1)
THRESHOLD_ENV = "CONCORD_TRUST_THRESHOLD"
#: what ends the name of a policy file given to ``--trust``
POLICY_SUFFIXES = (".yaml", ".yml")
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
    #: who signed and who did not, for a person: "2 of 3 (us-east, eu-central; ap-south missing)"
    quorum: str = ""
    #: how many distinct trusted keys the policy needs
    threshold: int = 1

    def lines(self, name_of: Callable[[str], str] | None = None) -> list[str]:
        """What a person reads: each key that signed (with its name, by ``name_of``), and each
        signature that does not count (named as an invalid signature, never as a signer)."""
        out = [f"signed by key {k}" + (f" ({name_of(k)})" if name_of else "") for k in self.signed_by]
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
            "quorum": self.quorum,
            "threshold": self.threshold,
        }


@dataclass(frozen=True)
class TrustPolicy:
    """Trusted public keys, and how many distinct ones must sign a root (``threshold``, at least 1).

    ``names`` gives keys a name for people (key id → name, e.g. the cluster holding the key); a
    key without one is shown by the start of its id."""

    keys: tuple[PublicKey, ...]
    source: str = ""
    threshold: int = 1
    names: tuple[tuple[str, str], ...] = ()

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

    def name_of(self, key_id: str) -> str:
        """The name of the trusted key ``key_id`` (the start of the id when it has none)."""
        return dict(self.names).get(key_id) or key_id[:16]

    def quorum(self, signed: Iterable[str]) -> str:
        """Who of the policy's keys is among ``signed`` (key ids) and who is missing, in the policy's order:
        ``2 of 3 (us-east, eu-central; ap-south missing), 2 needed``. Keys the policy does not
        trust, and a key named twice, count nothing."""
        signed = set(signed)
        got = [k for k in self.key_ids if k in signed]  # in the policy's order
        missing = [k for k in self.key_ids if k not in got]
        names = ", ".join(self.name_of(k) for k in got) or "none"
        if missing:
            names += f"; {', '.join(self.name_of(k) for k in missing)} missing"
        return f"{len(got)} of {len(self.keys)} ({names}), {self.threshold} needed"

    def with_threshold(self, threshold: int, source: str = "") -> TrustPolicy:
        """This policy needing ``threshold`` distinct keys (checked against its keys)."""
        return replace(self, threshold=threshold, source=source or self.source)

    # ------------------------------------------------------------------ building

    @classmethod
    def from_paths(cls, paths: Iterable[str | os.PathLike], source: str = "", threshold: int = 1) -> TrustPolicy:
        paths = [os.fspath(p) for p in paths]
        keys, names = _named((load_public_key(p), _file_name(p)) for p in paths)
        return cls(keys, source or ",".join(paths), threshold, names)

    @classmethod
    def from_spec(cls, spec: str, source: str = "--trust") -> TrustPolicy:
        """``spec``: comma-separated PEM paths and ``SOURCE:NAME`` entries (``block:NAME``), blanks
        around commas ignored; the policy trusts the keys of every entry. Every entry is resolved
        before the policy is returned, so a bad one fails the command before it reads a store.
        A list naming nothing is an error, never "no policy". A ``.yaml``/``.yml`` entry is a
        policy file (:meth:`from_file`) and must be the only entry. The threshold is 1, or the
        largest a named source's policy asks (a block's ``threshold``)."""
        entries = [p.strip() for p in spec.split(",") if p.strip()]
        if not entries:
            raise TrustPolicyError(source, "the list of trusted keys is empty (an empty list is not \"no policy\")")
        files = [e for e in entries if e.lower().endswith(POLICY_SUFFIXES) and _split_source(e) is None]
        if files:
            if len(entries) > 1:
                raise TrustPolicyError(
                    source, f"the policy file {files[0]} is given beside other entries",
                    "Give the policy file alone (--trust policy.yaml), and list every key in its keys",
                )
            return cls.from_file(files[0])
        named: list[tuple[PublicKey, str]] = []
        threshold = 1
        for entry in entries:
            got, needs = _resolve_entry(entry, None)
            named += got
            threshold = max(threshold, needs)
        keys, names = _named(named)
        return cls(keys, source, threshold, names)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> TrustPolicy:
        """The policy of the YAML file ``path``: ``threshold`` (default 1) and ``keys``, a
        mapping of names to entries (PEM paths relative to the file, or ``block:NAME``) or a
        list of entries. Anything else in it is refused, naming the file and the fix."""
        from concord import yamlsafe

        where = os.fspath(path)
        import yaml

        try:
            with open(where, "rb") as f:
                doc = yamlsafe.load(f.read())
        except FileNotFoundError:
            raise TrustPolicyError(where, "there is no such policy file", "Give the path of a YAML policy with keys: and threshold:") from None
        except OSError as exc:
            raise TrustPolicyError(where, f"it cannot be read ({exc.strerror or exc})") from exc
        except yaml.YAMLError as exc:
            raise TrustPolicyError(where, f"it is not valid YAML ({' '.join(str(exc).split())[:200]})") from None
        fix = "Write it as `threshold: 2` and `keys:` mapping each key's name to its PEM path (or block:NAME)"
        if not isinstance(doc, dict):
            raise TrustPolicyError(where, "it is not a mapping", fix)
        unknown = sorted(str(k) for k in doc if k not in ("keys", "threshold"))
        if unknown:
            raise TrustPolicyError(where, f"unknown field(s) {', '.join(unknown)}", fix)
        raw = doc.get("keys")
        if isinstance(raw, list):
            items = [(None, e) for e in raw]
        elif isinstance(raw, dict):
            items = list(raw.items())
        else:
            raise TrustPolicyError(where, "it has no keys (a mapping of names to PEM paths, or a list)", fix)
        if not items:
            raise TrustPolicyError(where, "its keys are empty (an empty list is not \"no policy\")", fix)
        threshold = doc.get("threshold", 1)
        if isinstance(threshold, bool) or not isinstance(threshold, int):
            raise TrustPolicyError(where, f"threshold {threshold!r} is not a whole number", fix)
        base = os.path.dirname(os.path.abspath(where))
        named: list[tuple[PublicKey, str]] = []
        for name, entry in items:
            if not isinstance(entry, str) or not entry.strip() or (name is not None and not isinstance(name, str)):
                raise TrustPolicyError(where, f"key {name or entry!r} is not a name with a PEM path or block:NAME", fix)
            try:
                got, _ = _resolve_entry(entry.strip(), base)
            except (KeyFileError, TrustPolicyError) as exc:
                raise TrustPolicyError(f"{where} (key {name or entry})", str(exc).rstrip("."), fix) from None
            named += [(k, name if len(got) == 1 else f"{name}#{i + 1}") if name else (k, n) for i, (k, n) in enumerate(got)]
        keys, names = _named(named)
        return cls(keys, where, threshold, names)

    @classmethod
    def from_pems(
        cls, pems: Iterable[bytes | str], source: str = "block", threshold: int = 1, names: Sequence[str] | None = None
    ) -> TrustPolicy:
        pems = list(pems)
        labels = list(names) if names else [f"{source} key {i + 1}" for i in range(len(pems))]
        if len(labels) != len(pems):
            raise TrustPolicyError(source, f"{len(labels)} key name(s) for {len(pems)} trusted key(s)", "Give one name per trusted key, or none")
        keys, named = _named(
            (public_key_from_pem(p.encode() if isinstance(p, str) else p, f"{source} key {i + 1}"), labels[i]) for i, p in enumerate(pems)
        )
        return cls(keys, source, threshold, named)

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
        return Verdict(
            root, store.uri, signed, trusted, signed[0] if trusted else None, problems, docs, tuple(pending), self.quorum(signed), self.threshold
        )

    def count_records(self, signatures: Iterable[object], payload_type: str, digest: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """The rule of :meth:`decide` for signed records (a ledger round, its head): the
        distinct trusted keys whose signature over ``digest`` verifies, and why each other
        signature does not count. One key signing twice counts once; a forged signature, or one
        over another digest, never counts."""
        from concord.trust.records import check_record

        holds: list[str] = []
        problems: dict[str, str] = {}
        for i, sig in enumerate(signatures):
            kid, problem = check_record(sig, payload_type, digest, self.keys)
            if kid is None:
                claimed = sig.get("key_id") if isinstance(sig, dict) and isinstance(sig.get("key_id"), str) else f"#{i + 1}"
                problems.setdefault(str(claimed), str(problem))
            elif kid not in holds:
                holds.append(kid)
        return tuple(holds), problems

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


def _file_name(path: str) -> str:
    """A key's name from its file: ``keys/us-east.pub.pem`` → ``us-east``."""
    name = os.path.basename(os.fspath(path))
    for suffix in (".pem", ".pub"):
        name = name.removesuffix(suffix)
    return name or os.fspath(path)


def _resolve_entry(entry: str, base: str | None) -> tuple[list[tuple[PublicKey, str]], int]:
    """The keys (with names) of one entry, a PEM path (relative to ``base``, else to the working
    folder) or ``SOURCE:NAME``, and the threshold its source asks (1 for a file)."""
    found = _split_source(entry)
    path = entry if base is None or os.path.isabs(entry) else os.path.join(base, entry)
    if found is None or (os.path.exists(path) and _SOURCES.get(found[0]) is None):
        return [(load_public_key(path), _file_name(entry))], 1
    got, threshold, names = _keys_of_source(entry, *found)
    return [(k, names.get(k.id) or (entry if len(got) == 1 else f"{entry}#{i + 1}")) for i, k in enumerate(got)], threshold


def _keys_of_source(entry: str, name: str, rest: str) -> tuple[tuple[PublicKey, ...], int, dict[str, str]]:
    """The trusted keys a ``name:rest`` entry names, the threshold and names its policy gives
    (one line naming the entry when it names no key)."""
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
        return got.keys, got.threshold, dict(got.names)
    pems = list(got or ())
    if not pems:
        raise TrustPolicyError(
            entry, "it lists no trusted key",
            f"Add the public keys (PEM) to trust to its trusted_keys, or give PEM paths instead of {entry}",
        )
    keys = tuple(public_key_from_pem(p.encode() if isinstance(p, str) else p, f"{entry} key {i + 1}") for i, p in enumerate(pems))
    return keys, 1, {}


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


def _named(pairs: Iterable[tuple[PublicKey, str]]) -> tuple[tuple[PublicKey, ...], tuple[tuple[str, str], ...]]:
    """Each key once (the first name it is given wins), and its name."""
    out: dict[str, tuple[PublicKey, str]] = {}
    for k, name in pairs:
        out.setdefault(k.id, (k, name))
    return tuple(k for k, _ in out.values()), tuple((kid, name) for kid, (_, name) in out.items())


def load_policy(
    trust: str | TrustPolicy | None = None, *, threshold: int | None = None, environ: Mapping[str, str] | None = None
) -> TrustPolicy | None:
    """The policy from ``trust`` (comma-separated PEM paths and ``block:NAME`` entries, or one
    policy file, as ``--trust`` takes; or a policy already built), else from
    ``$CONCORD_TRUSTED_KEYS`` (its threshold from ``$CONCORD_TRUST_THRESHOLD``); None only when
    neither is given. ``threshold`` (``--trust-threshold``) replaces the policy's own. A list
    given but empty (``--trust ""``, ``CONCORD_TRUSTED_KEYS=`` set to nothing) is a
    :class:`~concord.errors.TrustPolicyError`, never "no policy"; so is a threshold with no
    policy to apply it to."""
    env = os.environ if environ is None else environ
    if isinstance(trust, TrustPolicy):
        policy: TrustPolicy | None = trust
    elif trust is not None:
        policy = TrustPolicy.from_spec(trust, "--trust")
    elif env.get(ENV) is not None:
        policy = TrustPolicy.from_spec(env[ENV], ENV)
        if threshold is None and env.get(THRESHOLD_ENV, "").strip():
            text = env[THRESHOLD_ENV].strip()
            if not text.isdigit():
                raise TrustPolicyError(THRESHOLD_ENV, f"{text!r} is not a whole number", f"Set {THRESHOLD_ENV} to how many keys must sign, e.g. 2")
            policy = policy.with_threshold(int(text), f"{ENV} (threshold from {THRESHOLD_ENV})")
    else:
        policy = None
    if threshold is not None:
        if policy is None:
            raise TrustPolicyError(
                "--trust-threshold", "a threshold was given but no trusted key", f"Give the keys with --trust (or {ENV}) beside it"
            )
        policy = policy.with_threshold(threshold, f"{policy.source} (threshold {threshold})")
    return policy
