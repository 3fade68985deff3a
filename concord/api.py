"""The verbs of Concord for a Python caller, with the defaults of the ``concord`` CLI.

``import concord`` gives every name here lazily (``concord.snapshot``, ``concord.checkout``, …);
the CLI's commands call these same functions. Each verb:

- takes stores as a :class:`~concord.stores.Store`, a :class:`~concord.stores.StoreAddress` or the
  text a person types (a folder, ``file:///path``, ``s3://bucket/prefix?connections=N``,
  ``block:NAME`` when the pipelines (``concord_pipelines.blocks``) are installed);
- names what to act on with ``ref=`` (``models/x``, or ``models/x~1`` for the version before) or
  ``root=`` (64 hex);
- reads the trust policy as the CLI does: ``trust=`` (a :class:`~concord.trust.TrustPolicy`, or
  comma-separated PEM paths and ``block:NAME`` entries), else ``$CONCORD_TRUSTED_KEYS``; with
  neither, nothing is checked;
- reads an encrypted store's key from ``key_file=``, else ``$CONCORD_KEY_FILE``;
- shows progress bars on a terminal's stderr (``progress=False``: none; or a
  :class:`~concord.progress.Progress` of the caller's);
- returns the typed result whose ``to_dict()`` is what the CLI's ``--json`` prints.

Errors are :class:`~concord.errors.ConcordError` subclasses, each one line naming the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Union, cast

from concord import VERBS

if TYPE_CHECKING:  # pragma: no cover
    from concord.audit.report import AuditReport
    from concord.federation.seen import RememberedReport
    from concord.lineage import Lineage
    from concord.lineage.contracts import CompatResult, Contract, ValidationResult
    from concord.lineage.data import DataSnapshot
    from concord.oci.export import ExportResult
    from concord.oci.importer import ImportResult
    from concord.progress import Progress
    from concord.serving.checkout import CheckoutResult
    from concord.serving.health import HealthCheck
    from concord.serving.versions import RollbackResult as CheckoutRollbackResult
    from concord.snapshots.diff import DiffResult
    from concord.snapshots.gc import GcResult
    from concord.snapshots.refs import RollbackResult
    from concord.snapshots.restore import RestoreResult
    from concord.snapshots.snapshot import SnapshotResult
    from concord.snapshots.spread import NodePart
    from concord.snapshots.sync import TargetResult
    from concord.snapshots.usage import StoreUsage
    from concord.snapshots.verify import VerifyResult
    from concord.stores import Store, StoreAddress
    from concord.tiering import AddResult, DrillResult, SweepResult, TierPolicy, TierRestoreResult
    from concord.trust import SigningKey, TrustPolicy, Verdict
    from concord.trust.signing import SignResult

#: what a verb takes as a store: the store itself, its parsed address, or the text a person types
StoreLike = Union["Store", "StoreAddress", str, "os.PathLike[str]"]
#: a trust policy, or the text ``--trust`` takes; None: ``$CONCORD_TRUSTED_KEYS``, else no check
TrustLike = Union["TrustPolicy", str, None]
#: None or True: bars on a terminal's stderr (as the CLI); False: none; or a Progress of one's own
ProgressLike = Union["Progress", bool, None]
#: a tier policy: the object, a YAML file, or ``block:NAME``
PolicyLike = Union["TierPolicy", str, "os.PathLike[str]"]

# ----------------------------------------------------------------------------- shared defaults


def open_store(
    store: StoreLike, *, key_file: str | os.PathLike[str] | None = None, create: bool = True, must_exist: bool = False
) -> Store:
    """The store ``store`` names, as the CLI opens it (a :class:`~concord.stores.Store` is returned
    as it is).

    Args:
        store: a Store, a StoreAddress, or the text a person types (folder, ``file:///path``,
            ``s3://bucket/prefix?connections=N``, ``block:NAME``).
        key_file: the key of an encrypted store (default: ``$CONCORD_KEY_FILE`` when needed).
        create: make a folder store that is not there yet (False: it reads as empty).
        must_exist: refuse a folder that is not there.

    Raises:
        InvalidStoreURIError: the text names no store. StoreKeyFileError: the key file does not read.
    """
    from concord.stores import open_store as open_spec

    return _unlocked(open_spec(store, create=create, must_exist=must_exist), key_file)


def _unlocked(store: Store, key_file: str | os.PathLike[str] | None) -> Store:
    """``store`` given the key in ``key_file`` (None: it reads ``$CONCORD_KEY_FILE`` when needed)."""
    if key_file is not None:
        from concord.stores.cipher import read_key_file

        store.unlock(read_key_file(os.fspath(key_file)))
    return store


def _to_read(store: StoreLike, key_file: str | os.PathLike[str] | None) -> Store:
    """The store for a verb that only reads: never created; a path holding no store is an error."""
    from concord.stores import open_store_to_read

    return _unlocked(open_store_to_read(store), key_file)


def _policy(trust: TrustLike) -> TrustPolicy | None:
    """``trust`` as a policy; None reads ``$CONCORD_TRUSTED_KEYS`` (an empty list is an error)."""
    from concord.trust import TrustPolicy, load_policy

    return trust if isinstance(trust, TrustPolicy) else load_policy(trust)


def _progress(progress: ProgressLike) -> Progress:
    """The progress reporter a verb hands the core (bars only on a terminal, as the CLI)."""
    from concord.progress import NullProgress, TqdmProgress

    if progress is None or progress is True:
        return TqdmProgress()
    if progress is False:
        return NullProgress()
    return progress


def _root(function: str, store: Store, ref: str | None, root: str | None) -> str:
    """The 64-hex root ``ref`` (``NAME`` or ``NAME~N``) or ``root`` names in ``store``."""
    from concord.errors import ApiArgumentError
    from concord.snapshots.refs import resolve_root

    named = ref if root is None else root if ref is None else None
    if named is None:
        raise ApiArgumentError(
            function, "give exactly one of ref= (e.g. 'models/x' or 'models/x~1') and root= (64 hex)"
        )
    return resolve_root(store, named)


# ----------------------------------------------------------------------------- stores


class StoreInit(TypedDict):
    """What :func:`init_store` did, as ``concord init --json`` prints it."""

    #: the store's address
    store: str
    #: the configuration's format version
    version: int
    #: how chunks are kept: none, zstd or auto
    compress: str
    #: ``{"algorithm", "key_id"}`` of an encrypted store (never the key), else None
    encryption: dict[str, str] | None
    #: whether a new key was written to ``key_file``
    key_file_created: bool
    #: the key file of an encrypted store (absolute), else None
    key_file: str | None


def init_store(
    store: StoreLike, *, compress: str = "none", encrypt: bool = False, key_file: str | os.PathLike[str] | None = None
) -> StoreInit:
    """Configure a new store: how chunks are kept (``compress``: none, zstd, or auto, which splits
    floating-point tensors into byte planes before zstd) and, with ``encrypt``, encryption at rest
    (AES-256-GCM) with the key in ``key_file`` (default ``$CONCORD_KEY_FILE``; a file that is not
    there gets a new key, written before anything of the store): ``concord init``. A store that
    already has this configuration is left as it is.

    Raises:
        StoreConfigError: the store holds objects already, or is configured otherwise; the new key
            file cannot be written. ApiArgumentError: ``encrypt`` without a key file, or a key file
            without ``encrypt``.
    """
    from concord.errors import ApiArgumentError, ConcordError
    from concord.stores.cipher import read_key_file
    from concord.stores.config import KEY_FILE_ENV, configure, new_key_file

    key, created, path = None, False, None
    if encrypt:
        path = os.fspath(key_file) if key_file is not None else os.environ.get(KEY_FILE_ENV)
        if not path:
            raise ApiArgumentError(
                "init_store", f"encrypt=True needs the store's key: give key_file= (a new file gets a new key) or set {KEY_FILE_ENV}"
            )
        if os.path.exists(path):
            key = read_key_file(path)
        else:  # the key is on disk before anything of the store is
            key = new_key_file(path, str(store))
            created = True
    elif key_file is not None:
        raise ApiArgumentError("init_store", "key_file= goes with encrypt=True (or with any verb on an encrypted store)")
    try:
        opened = open_store(store)
        try:
            config = configure(opened, compress=compress, encrypt=encrypt, key=key)
        finally:
            opened.close()
    except (ConcordError, ValueError):  # refused before the configuration was written
        if created and path is not None:  # a refused init leaves no key file behind: no store names it
            os.unlink(path)
        raise
    described = config.describe()
    return StoreInit(
        store=opened.uri,
        version=described["version"],
        compress=described["compress"],
        encryption=described["encryption"],
        key_file_created=created,
        key_file=os.path.abspath(path) if path else None,
    )


def store_info(
    store: StoreLike, *, frames: bool = True, key_file: str | os.PathLike[str] | None = None, progress: ProgressLike = None
) -> StoreUsage:
    """What ``store`` holds and what its encoding saves: its configuration, refs, snapshots, the
    chunks' stored and raw bytes, the chunks no manifest names and what garbage collection would
    delete: ``concord info``. ``frames`` also counts how the chunks of a compressed or encrypted
    store are kept (one small read per chunk; nothing decoded).

    Raises:
        StoreNotFoundError: nothing is there. StoreKeyError: an encrypted store without its key.
    """
    from concord.snapshots.usage import store_usage

    opened = _to_read(store, key_file)
    try:
        return store_usage(opened, frames=frames, progress=_progress(progress))
    finally:
        opened.close()


# ----------------------------------------------------------------------------- snapshots


def snapshot(
    source: str | os.PathLike[str],
    store: StoreLike,
    *,
    ref: str | None = None,
    chunk_size: int | None = None,
    message: str = "",
    key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
    base: str | None = None,
    delta: bool = True,
) -> SnapshotResult:
    """Snapshot the checkpoint folder (or file) ``source`` into ``store``: ``concord snapshot``.

    Args:
        source: the folder or file to take; safetensors, DCP, torch.save and GGUF files are cut at
            their tensors.
        store: where the chunks and the manifest go (a folder that is not there is created).
        ref: point this ref (``[namespace/]name``) at the new root, by compare-and-swap.
        chunk_size: bytes per chunk (default 4 MiB; 64 KiB to 64 MiB).
        message: a note kept in the ref's history.
        base: in a compressed or encrypted store, store each new chunk as a delta against the
            same region's chunk of this version (a ref, ``REF~N`` or a root) where that is
            smaller; by default the ref's current version, when it has one (docs/deltas.md).
        delta: False stores every chunk whole. The root is the same either way.

    Returns the :class:`SnapshotResult` (``root``, counts, what was new in the store).

    Raises:
        SourceNotFoundError, SourceChangedError, RefConflictError, StoreKeyError, StoreAccessError.
    """
    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
    from concord.snapshots.snapshot import snapshot as take

    target = open_store(store, key_file=key_file)
    return take(
        source,
        target,
        ref=ref,
        chunk_size=chunk_size or DEFAULT_CHUNK_SIZE,
        message=message,
        progress=_progress(progress),
        base=base,
        delta=delta,
    )


#: the largest part file :func:`snapshot_assemble` reads (a part of 100,000 files is about 40 MB)
MAX_PART_BYTES = 1 << 30


def snapshot_part(
    source: str | os.PathLike[str],
    store: StoreLike,
    *,
    node: str,
    paths: Sequence[str] | None = None,
    chunk_size: int | None = None,
    out: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> NodePart:
    """Store the chunks of this node's files of a checkpoint spread over several nodes' disks
    (``source``: the folder here; ``paths``: the files this node takes, default all) and return
    this node's part for :func:`snapshot_assemble`, written to the part file ``out`` too when
    given: ``concord snapshot-part``. ``node`` names the node (each node of one snapshot its own).

    Raises:
        SourceNotFoundError, StoreError, ValueError (an unusable node name or chunk size).
    """
    import json

    from concord.files import atomic_write
    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
    from concord.snapshots.spread import snapshot_part as take

    part = take(
        source,
        _unlocked(open_store(store), key_file),
        node=node,
        paths=paths,
        chunk_size=chunk_size or DEFAULT_CHUNK_SIZE,
        progress=_progress(progress),
    )
    if out is not None:
        atomic_write(os.fspath(out), json.dumps(part.to_dict(), sort_keys=True).encode())
    return part


def _read_part(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A part file :func:`snapshot_part` wrote, as a dict (its manifest is checked on assembly).

    Raises:
        SpreadSnapshotError: the file is too large, not JSON, or not a JSON object.
    """
    import json

    from concord.errors import SpreadSnapshotError

    with open(path, "rb") as fh:
        data = fh.read(MAX_PART_BYTES + 1)
    problem = None
    if len(data) > MAX_PART_BYTES:
        problem = f"is over {MAX_PART_BYTES} bytes"
    else:
        try:
            doc = json.loads(data)
        except ValueError as exc:
            problem = f"is not JSON ({exc})"
        else:
            if isinstance(doc, dict):
                return doc
            problem = "is not a JSON object"
    raise SpreadSnapshotError(f"part file {os.fspath(path)} {problem}; write it again with concord snapshot-part")


def snapshot_assemble(
    store: StoreLike,
    parts: Sequence[NodePart | Mapping[str, Any] | str | os.PathLike[str]],
    *,
    nodes: Sequence[str] | None = None,
    ref: str | None = None,
    message: str = "",
    allow_incomplete: bool = False,
    key_file: str | os.PathLike[str] | None = None,
) -> SnapshotResult:
    """One snapshot out of every node's part (each a :class:`~concord.snapshots.spread.NodePart`,
    its dict, or the part file :func:`snapshot_part` wrote), with the root one snapshot of all the
    files in one folder would have; ``ref`` is pointed at it by compare-and-swap: ``concord
    snapshot-assemble``. ``nodes`` names the nodes expected (default: those given).

    Raises:
        SpreadSnapshotError: a node is missing or twice, the parts disagree, the store lacks a
            chunk, or a DCP checkpoint is incomplete (``allow_incomplete=True`` writes it anyway).
        RefConflictError: the ref moved meanwhile.
    """
    from concord.snapshots.spread import NodePart, assemble

    got = [p if isinstance(p, (NodePart, Mapping)) else _read_part(p) for p in parts]
    return assemble(
        _unlocked(open_store(store), key_file),
        got,
        nodes=nodes,
        ref=ref,
        message=message,
        allow_incomplete=allow_incomplete,
    )


def sync(
    source: StoreLike,
    targets: StoreLike | Sequence[StoreLike],
    *,
    ref: str | None = None,
    root: str | None = None,
    trust: TrustLike = None,
    key_file: str | os.PathLike[str] | None = None,
    target_key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> list[TargetResult]:
    """Replicate the snapshot ``ref`` (or ``root``) of ``source`` to every target: ``concord sync``.
    Only the chunks a target lacks move; a ref moves on each target by compare-and-swap, last.

    Args:
        targets: one store or several (folders that are not there are created).
        trust: under a policy an untrusted root is refused before anything is sent; signatures
            travel only when they verify.
        key_file / target_key_file: the keys of an encrypted source / of every encrypted target.

    Returns one :class:`TargetResult` per target, in order.

    Raises:
        UntrustedRootError, RefNotFoundError, HistoryError, ReplicationError, StoreKeyError.
    """
    from concord.snapshots.sync import replicate
    from concord.trust.copying import signature_problem

    if (ref is None) == (root is None):
        from concord.errors import ApiArgumentError

        raise ApiArgumentError("sync", "give exactly one of ref= and root=")
    policy = _policy(trust)  # an empty list fails before any store is opened (or made)
    src = open_store(source, key_file=key_file)
    many = [targets] if isinstance(targets, (str, os.PathLike)) or not isinstance(targets, Sequence) else list(targets)
    dsts = [open_store(t, key_file=target_key_file) for t in many]
    check = policy.require if policy is not None else None
    return replicate(
        src, dsts, ref=ref, root=root, progress=_progress(progress), check_root=check, check_signature=signature_problem
    )


def diff(
    store: StoreLike,
    a: str,
    b: str,
    *,
    against: StoreLike | None = None,
    key_file: str | os.PathLike[str] | None = None,
    against_key_file: str | os.PathLike[str] | None = None,
) -> DiffResult:
    """Which files and tensors differ from snapshot ``a`` to ``b``, by content, and what a sync of
    ``b`` to a store holding ``a`` would move: ``concord diff``.

    A tensor whose bytes moved to another file or offset is reported ``moved``, one whose bytes
    got a new name ``renamed`` (``from_file``, ``from_tensor``: where it was in ``a``), so a
    re-shard or a rename moves no bytes. The chunk and byte counts are those of ``b`` that ``a``
    holds nowhere, by chunk id; ``bytes_to_send`` is what the sync sends as the store holding
    ``b`` keeps them (compressed, encrypted, a delta as the delta where ``a`` holds its base).

    Args:
        a, b: each a ref, ``ref~N`` or a 64-hex root; ``b`` is looked up in ``against`` when given.

    Returns the :class:`DiffResult` (``same``; ``changes`` by file and tensor; ``chunks_differing``,
    ``bytes_differing``, ``bytes_to_send``, ``delta_chunks``).

    Raises:
        StoreNotFoundError, RefNotFoundError, HistoryError, ManifestNotFoundError.
    """
    from concord.snapshots.diff import diff_manifests
    from concord.snapshots.refs import load_manifest, resolve_root

    sa = _to_read(store, key_file)
    sb = _to_read(against, against_key_file) if against is not None else sa
    return diff_manifests(load_manifest(sa, resolve_root(sa, a)), load_manifest(sb, resolve_root(sb, b)), source=sb)


def restore(
    store: StoreLike,
    out_dir: str | os.PathLike[str],
    *,
    ref: str | None = None,
    root: str | None = None,
    trust: TrustLike = None,
    key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> RestoreResult:
    """Write the snapshot ``ref`` (or ``root``) of ``store`` into the new folder ``out_dir``:
    ``concord restore``. Every byte is checked against the root as it is written; under a trust
    policy an untrusted root is refused before anything is written.

    Returns the :class:`RestoreResult` (``root``, ``files``, ``bytes``, ``path``).

    Raises:
        UntrustedRootError, RestoreTargetError (``out_dir`` holds something), RefNotFoundError,
        IntegrityError, StoreNotFoundError.
    """
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore as write

    policy = _policy(trust)
    source = _to_read(store, key_file)
    found = _root("restore", source, ref, root)
    check = policy.restore_check if policy is not None else None
    return write(source, load_manifest(source, found), out_dir, progress=_progress(progress), check_root=check)


def verify(
    store: StoreLike,
    *,
    ref: str | None = None,
    root: str | None = None,
    repair_from: StoreLike | None = None,
    key_file: str | os.PathLike[str] | None = None,
    repair_key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> VerifyResult:
    """Re-hash the chunks the snapshot ``ref``/``root`` needs (with neither: every ref's), and with
    ``repair_from`` fetch good copies of bad ones from that replica: ``concord verify``.

    Returns the :class:`VerifyResult`: ``ok``, ``missing``, ``corrupt``, ``repaired``, broken refs.
    Damage is reported there, not raised; who signed a root is :func:`concord.signatures`'s answer.

    Raises:
        StoreNotFoundError, RefNotFoundError, HistoryError, StoreKeyError.
    """
    from concord.snapshots.verify import verify as check

    if ref is not None and root is not None:
        from concord.errors import ApiArgumentError

        raise ApiArgumentError("verify", "give ref= or root= (or neither, for the whole store), not both")
    target = _to_read(store, key_file)
    repair = _to_read(repair_from, repair_key_file) if repair_from is not None else None
    return check(target, ref=ref, root=root, repair_from=repair, progress=_progress(progress))


def rollback(
    store: StoreLike, ref: str, *, to: str | None = None, key_file: str | os.PathLike[str] | None = None
) -> RollbackResult:
    """Move ``ref`` back to ``to`` (a root, or 8+ hex of one, from its history; default: the
    previous root), by compare-and-swap: ``concord rollback``.

    Raises:
        RefNotFoundError, HistoryError (no such root in the history), RefConflictError.
    """
    from concord.snapshots.refs import rollback as move

    return move(open_store(store, key_file=key_file), ref, to)


class RefSummary(TypedDict):
    """One ref of a store, as ``concord refs --json`` lists it: its name, the root it names, its
    version and when it last moved."""

    ref: str
    root: str
    version: int
    time: str


class LogEntry(TypedDict, total=False):
    """One move of a ref, as ``concord log --json`` lists it: the root it named and who signed
    that root. Without a trust policy ``signed_by`` is None and ``unchecked`` lists the key ids
    the signature documents claim; under one, ``signed_by`` lists the verified signers,
    ``invalid`` each signature that did not hold (key id → why), ``trusted`` whether at least the
    policy's threshold of distinct trusted keys signed the root, and ``quorum`` who signed and who
    is missing ("1 of 3 (us-east; eu-central, ap-south missing), 2 needed")."""

    root: str
    version: int
    time: str
    message: str
    signed_by: list[str] | None
    unchecked: list[str]
    invalid: dict[str, str]
    trusted: bool
    quorum: str


def refs(store: StoreLike, *, key_file: str | os.PathLike[str] | None = None) -> list[RefSummary]:
    """Every ref of ``store``, with the root it names: ``concord refs``.

    Raises:
        StoreNotFoundError: ``store`` holds no store.
    """
    target = _to_read(store, key_file)
    found: list[RefSummary] = []
    for name in target.list_refs():
        ref = target.read_ref(name)
        if ref is not None:
            found.append({"ref": name, "root": ref.root, "version": ref.version, "time": ref.history[-1].time})
    return found


def log(
    store: StoreLike, ref: str, *, trust: TrustLike = None, key_file: str | os.PathLike[str] | None = None
) -> list[LogEntry]:
    """The history of ``ref`` in ``store``, newest first, each root with who signed it (checked
    against the trust policy, default ``$CONCORD_TRUSTED_KEYS``; with none, nothing is checked):
    ``concord log``. Under a policy each root's ``trusted`` is the one check every consumer
    applies (:meth:`~concord.trust.TrustPolicy.decide`: the threshold of distinct trusted keys
    signed this root), so a version one cluster signed reads untrusted under a threshold of two.

    Raises:
        RefNotFoundError: ``store`` has no such ref. TrustPolicyError: the policy does not read.
    """
    from concord.errors import RefNotFoundError
    from concord.stores import canonical_ref
    from concord.trust import signature_ids
    from concord.trust.policy import THRESHOLD

    policy = _policy(trust)  # an empty list fails before the store is read
    target = _to_read(store, key_file)
    found = target.read_ref(ref)
    if found is None:
        raise RefNotFoundError(target.uri, canonical_ref(ref))
    signers: dict[str, dict[str, Any]] = {}
    history: list[LogEntry] = []
    for e in reversed(found.history):
        if e.root not in signers:
            if policy is None:
                signers[e.root] = {"signed_by": None, "unchecked": signature_ids(target, e.root)}
            elif not target.has_manifest(e.root):
                signers[e.root] = {"signed_by": [], "invalid": {}, "trusted": False, "quorum": policy.quorum(())}
            else:
                v = policy.report(target, e.root)
                # too few signers is the verdict's, not a signature's problem
                invalid = {k: why for k, why in v.problems.items() if k != THRESHOLD}
                signers[e.root] = {
                    "signed_by": list(v.signed_by), "invalid": invalid, "trusted": v.trusted, "quorum": v.quorum,
                }
        entry = {"root": e.root, "version": e.version, "time": e.time, "message": e.message, **signers[e.root]}
        history.append(cast(LogEntry, entry))
    return history


# ----------------------------------------------------------------------------- trust


def sign(
    store: StoreLike,
    key: SigningKey | str | os.PathLike[str],
    *,
    ref: str | None = None,
    root: str | None = None,
    name: str | None = None,
    out: str | os.PathLike[str] | None = None,
    password: str | None = None,
    key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> SignResult:
    """Sign the snapshot ``ref`` (or ``root``) with an ECDSA key, as an OpenSSF Model Signing bundle
    kept in the store (``signatures/<root>/<key id>.sig``): ``concord sign``.

    Args:
        key: a SigningKey, a PEM file, or ``block:NAME`` (a saved Concord Trust block's key).
        name: the model name in the signed statement (default: the ref's name).
        out: also write the bundle to this file (``model_signing verify`` accepts it).
        password: the PEM's password (default: ``$CONCORD_KEY_PASSWORD``).

    Raises:
        KeyFileError, KeyPasswordError, RefNotFoundError, StoreKeyError.
    """
    from concord.stores import canonical_ref
    from concord.trust import SigningKey, load_signing_key_spec, sign_root

    if not isinstance(key, SigningKey):  # a bad key fails before the store is read
        key = load_signing_key_spec(
            key, password if password is not None else os.environ.get("CONCORD_KEY_PASSWORD") or None
        )
    target = open_store(store, key_file=key_file)
    found = _root("sign", target, ref, root)
    result, data = sign_root(
        target,
        found,
        key,
        ref=canonical_ref(ref.partition("~")[0]) if ref else None,
        model_name=name,
        progress=_progress(progress),
    )
    if out is not None:
        from concord.files import atomic_write

        atomic_write(os.path.abspath(os.fspath(out)), data)
    return result


def generate_signing_key(
    path: str | os.PathLike[str], *, password: str | None = None, public: str | os.PathLike[str] | None = None
) -> SigningKey:
    """Write a new ECDSA P-256 key pair: the private key to the new file ``path`` (never
    overwritten; encrypted with ``password`` when given) and the public key to ``public`` (default
    ``KEY.pub.pem`` beside it), the one ``trust=`` takes: ``concord keys generate``. Returns the
    key (``.id``, ``.public.source``).

    Raises:
        TrustError: a file is there already or cannot be written.
    """
    from concord.trust import generate_key

    return generate_key(path, password=password, public_path=public)


def signatures(
    store: StoreLike,
    *,
    ref: str | None = None,
    root: str | None = None,
    trust: TrustLike = None,
    key_file: str | os.PathLike[str] | None = None,
) -> Verdict:
    """Who signed the snapshot ``ref`` (or ``root``), checked against the trust policy:
    ``concord signatures --trust``. Never raises for an untrusted root: read ``trusted``,
    ``signed_by`` (verified signers only) and ``problems``.

    Raises:
        TrustPolicyError: no policy is given and ``$CONCORD_TRUSTED_KEYS`` is unset (nothing could be checked).
    """
    from concord.errors import TrustPolicyError

    policy = _policy(trust)
    if policy is None:
        raise TrustPolicyError(
            "concord.signatures", "nothing is checked without keys: pass trust='PUB.pem' or set CONCORD_TRUSTED_KEYS"
        )
    target = _to_read(store, key_file)
    return policy.report(target, _root("signatures", target, ref, root))


# ----------------------------------------------------------------------------- serving


def checkout(
    store: StoreLike,
    dest: str | os.PathLike[str],
    *,
    ref: str | None = None,
    root: str | None = None,
    trust: TrustLike = None,
    cache: StoreLike | None = None,
    keep: int | None = None,
    health: HealthCheck | None = None,
    wait: float = 600.0,
    fsync: bool = True,
    rehash: bool = False,
    key_file: str | os.PathLike[str] | None = None,
    cache_key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> CheckoutResult:
    """Write the snapshot ``ref`` (or ``root``) beside the link ``dest``, verify every byte, and flip
    the link atomically: ``concord checkout``. Bytes of the version served now are reused.

    Args:
        trust: under a policy (default ``$CONCORD_TRUSTED_KEYS``) a root no trusted key signed is
            refused before its manifest is read, and nothing is written to the node.
        cache: a local store several nodes of a host share (chunks read from it, kept in it).
        keep: after the flip keep this many versions (never the current one or the one before).
        health: a gate run after the flip; a failed gate flips back.
        wait: seconds to wait for another checkout of ``dest`` to finish.

    Returns the :class:`CheckoutResult` (``switched``, ``root``, ``previous``, bytes fetched and reused).

    Raises:
        UntrustedRootError, CheckoutBusyError, HealthCheckFailedError, CheckoutTargetError, RefNotFoundError.
    """
    from concord.serving.checkout import checkout as write
    from concord.snapshots.manifest import Manifest
    from concord.trust import check_root

    policy = _policy(trust)
    source = _to_read(store, key_file)
    shared = open_store(cache, key_file=cache_key_file) if cache is not None else None
    found = _root("checkout", source, ref, root)
    check_root(source, found, policy)  # an untrusted root: refused before its manifest is even read
    data = source.get_manifest_bytes(found)
    result: CheckoutResult = write(
        source,
        Manifest.from_json(data, expected_root=found),
        dest,
        cache=shared,
        keep=keep,
        health=health,
        trust=policy,
        wait=wait,
        fsync=fsync,
        rehash=rehash,
        progress=_progress(progress),
        manifest_json=data,  # checked against the root as it was parsed: kept on the node as it is
    )
    return result


def rollback_checkout(dest: str | os.PathLike[str], *, wait: float = 600.0) -> CheckoutRollbackResult:
    """Flip the link ``dest`` back to the version it served before, at once (no byte is fetched):
    ``concord checkout --rollback``.

    Raises:
        NoPreviousVersionError, CheckoutBusyError, CheckoutTargetError.
    """
    from concord.serving.versions import rollback as flip

    return flip(dest, wait=wait)


# ----------------------------------------------------------------------------- tiering


def _tier_policy(policy: PolicyLike) -> TierPolicy:
    """A checked tier policy from the object, a YAML file or ``block:NAME``."""
    from concord.tiering.policy import load_policy

    return load_policy(policy)


def tier_add(
    policy: PolicyLike,
    checkpoint: str | os.PathLike[str],
    name: str | None = None,
    *,
    step: int | None = None,
    progress: ProgressLike = None,
) -> AddResult:
    """Take a finished checkpoint folder into hot, copy it to warm and cold, then sweep:
    ``concord tier add``. ``name`` defaults to the folder's name, ``step`` to the number it ends with.
    The result's ``sweep`` lists any error or copy-rule violation left.

    Raises:
        PolicyError, CheckpointNotReadyError, CheckpointConflictError, TierStoreUnavailableError.
    """
    from concord.tiering.engine import add_checkpoint

    return add_checkpoint(_tier_policy(policy), checkpoint, name, step=step, progress=_progress(progress))


def tier_sweep(policy: PolicyLike, *, dry_run: bool = False, progress: ProgressLike = None) -> SweepResult:
    """Copy what is missing from each tier and demote what the policy no longer keeps (after
    verifying the copies that stay): ``concord tier sweep``. Problems are in the result's
    ``errors`` and ``violations``.

    Raises:
        PolicyError, TierStoreUnavailableError.
    """
    from concord.tiering.engine import sweep

    return sweep(_tier_policy(policy), dry_run=dry_run, progress=_progress(progress))


def tier_status(policy: PolicyLike) -> dict[str, Any]:
    """Each checkpoint × tier: present, verified when and how, bytes, plus the copy-rule
    violations: ``concord tier status --json``. Only reads: a tier folder not there yet holds nothing.

    Raises:
        PolicyError, TierStoreUnavailableError (naming the policy, the tier and its endpoint).
    """
    from concord.errors import StoreAccessError, StoreUnreachableError
    from concord.stores import open_store as open_spec
    from concord.tiering.engine import tier_status as read
    from concord.tiering.policy import unavailable_store

    checked = _tier_policy(policy)
    stores = {t: open_spec(checked.tier(t).store, create=False) for t in ("hot", "warm", "cold")}
    try:
        return read(checked, stores=stores)
    except (StoreUnreachableError, StoreAccessError) as exc:
        named = unavailable_store(checked, stores, exc)
        if named is exc:
            raise
        raise named from exc


def tier_restore(
    policy: PolicyLike,
    name: str,
    out_dir: str | os.PathLike[str],
    *,
    tier: str | None = None,
    timeout: float | None = None,
    trust: TrustLike = None,
    progress: ProgressLike = None,
) -> TierRestoreResult:
    """Restore checkpoint ``name`` into ``out_dir`` from the nearest tier holding it (or ``tier``),
    waiting up to ``timeout`` seconds for an archive restore: ``concord tier restore``. Under a
    trust policy (default ``$CONCORD_TRUSTED_KEYS``) an untrusted root is refused.

    Raises:
        TierCopyNotFoundError, RestoreTimeoutError, UntrustedRootError, RestoreTargetError.
    """
    from concord.tiering.restore import restore_checkpoint

    checked = _policy(trust)
    return restore_checkpoint(
        _tier_policy(policy),
        name,
        out_dir,
        tier=tier,
        timeout=timeout,
        progress=_progress(progress),
        check_root=checked.restore_check if checked is not None else None,
    )


def tier_drill(policy: PolicyLike, *, sample: int = 1, progress: ProgressLike = None) -> DrillResult:
    """Restore up to ``sample`` checkpoints from each tier, verify them, and measure RTO and RPO
    against the policy's objectives: ``concord tier drill``. A missed objective is in the
    result's ``ok`` and ``findings``, not raised.

    Raises:
        PolicyError.
    """
    from concord.tiering.drill import run_drill

    return run_drill(_tier_policy(policy), sample=sample, progress=_progress(progress))



def tier_gc(policy: PolicyLike, *, tier: str | None = None, dry_run: bool = False) -> dict[str, GcResult]:
    """Delete, in every tier (or only ``tier``), the manifests and chunks no ref reaches any more
    and older than the policy's ``gc_grace_seconds``: ``concord tier gc``. Returns each tier's
    result by tier; a tier a writer holds is postponed (its ``postponed_by``), not raised.

    Raises:
        PolicyError. GcRefusedError: a ref names a manifest that is missing or damaged.
    """
    from concord.snapshots.gc import collect_garbage
    from concord.tiering.policy import TIERS

    checked = _tier_policy(policy)
    found: dict[str, GcResult] = {}
    for name in [tier] if tier else list(TIERS):
        store = checked.tier(name).open()
        try:
            found[name] = collect_garbage(store, grace_seconds=checked.gc_grace_seconds, dry_run=dry_run)
        finally:
            store.close()
    return found


def tier_check(policy: str | os.PathLike[str]) -> TierPolicy:
    """Read and check the tier policy ``policy`` (a YAML file, or ``block:NAME``) and return it
    normalised (``.to_dict()`` is what ``concord tier check --json`` prints): ``concord tier check``.

    Raises:
        PolicyError: every problem of the policy, in ``.problems``.
    """
    from concord.tiering.policy import load_policy

    return load_policy(policy)


# ----------------------------------------------------------------------------- federation


def federate_round(
    tenant: str,
    clusters: Sequence[StoreLike],
    adapters: Sequence[str],
    *,
    method: str = "exact",
    rank: int | None = None,
    weights: Sequence[float] | None = None,
    clip_norm: float | None = None,
    robust: str = "none",
    out_name: str = "federated",
    ledger: StoreLike | None = None,
    key: SigningKey | str | os.PathLike[str] | None = None,
    password: str | None = None,
    tracking_uri: str | None = None,
    track: bool = False,
    remember: bool = True,
    progress: ProgressLike = None,
    cosigners: Sequence[SigningKey | str | os.PathLike[str]] = (),
    base: str | None = None,
) -> dict[str, Any]:
    """One LoRA federation round: find each adapter ref of ``tenant`` in ``clusters``, aggregate
    (``method``: exact, stack, fedavg or fedex), snapshot the result into the first cluster as
    ``TENANT/OUT_NAME``, replicate it to the others and append the round to the ledger (in
    ``ledger``, default the first cluster; signed with ``key`` when given): ``concord federate run``.
    With ``track`` the result is registered in MLflow; ``remember`` checks the ledger against, and
    adds the round to, this machine's memory of ledgers. ``cosigners`` are the keys of the other
    clusters, in the clusters' order: each cluster checks the aggregate it received, then signs the
    round and the head beside ``key`` (a quorum for ``federate_verify`` under a threshold).
    ``method="fedex"`` folds the rest of the exact mean into the base model ``base`` (a ref; by
    default the tenant's folded base ``TENANT/OUT_NAME-base`` of the round before), snapshotted and
    replicated as ``TENANT/OUT_NAME-base`` beside the adapter (docs/federation.md).

    Returns the round's record (what ``--json`` prints).

    Raises:
        AdapterNotFoundError, AggregationError, LedgerRollbackError, LedgerConflictError, TenantError.
    """
    from concord.federation.rounds import run_round
    from concord.federation.seen import LedgerMemory
    from concord.trust import SigningKey, load_signing_key_spec

    secret = password if password is not None else os.environ.get("CONCORD_KEY_PASSWORD") or None
    if key is not None and not isinstance(key, SigningKey):  # a bad key fails before any store is opened
        key = load_signing_key_spec(key, secret)
    keys = [k if isinstance(k, SigningKey) else load_signing_key_spec(k, secret) for k in cosigners]
    stores = [open_store(c) for c in clusters]
    return run_round(
        tenant,
        stores,
        adapters,
        method=method,
        rank=rank,
        weights=weights,
        clip_norm=clip_norm,
        robust=robust,
        out_name=out_name,
        ledger_store=open_store(ledger) if ledger is not None else None,
        lineage=open_lineage(tracking_uri) if track else None,
        progress=_progress(progress),
        key=key,
        memory=LedgerMemory() if remember else None,
        cosigners=keys,
        base=base,
    )


def federate_cosign(
    ledger: StoreLike,
    tenant: str,
    cluster: StoreLike,
    key: SigningKey | str | os.PathLike[str],
    *,
    round: int | None = None,
    password: str | None = None,
    progress: ProgressLike = None,
) -> dict[str, Any]:
    """One cluster vouches for a federation round: check that ``cluster`` holds the aggregate
    root round ``round`` (default the newest) of ``tenant``'s ledger in ``ledger`` records, and
    that it verifies there, then add ``key``'s signature to the round and the head:
    ``concord federate cosign``. Returns ``round``, ``root``, ``cluster``, ``key_id`` and the
    round's document (``doc``).

    Raises:
        LedgerError: no such round, or the cluster's copy of the aggregate missing or damaged
        (nothing signed). KeyFileError: a bad key.
    """
    from concord.federation.rounds import cosign
    from concord.trust import SigningKey, load_signing_key_spec

    if not isinstance(key, SigningKey):  # a bad key fails before any store is opened
        key = load_signing_key_spec(key, password if password is not None else os.environ.get("CONCORD_KEY_PASSWORD") or None)
    return cosign(open_store(ledger, must_exist=True), tenant, _to_read(cluster, None), key, number=round, progress=_progress(progress))


def federate_verify(
    store: StoreLike,
    tenant: str,
    *,
    trust: TrustLike = None,
    min_round: int | None = None,
    remember: bool = True,
    forget: bool = False,
    fix: str = "",
) -> RememberedReport:
    """Check ``tenant``'s ledger in ``store``: hashes, chain, head, and under a trust policy
    (default ``$CONCORD_TRUSTED_KEYS``) every round's signature: ``concord federate verify``.
    ``min_round`` and this machine's memory (``remember``) catch a ledger rolled back; ``forget``
    accepts one. A tampered ledger is reported (``report.ok``), and a rollback is in ``error``.

    Raises:
        TenantError, StoreNotFoundError, TrustPolicyError.
    """
    from concord.federation.ledger import validate_tenant
    from concord.federation.seen import LedgerMemory, verify_remembered

    validate_tenant(tenant)
    source = _to_read(store, None)
    return verify_remembered(
        source,
        tenant,
        trust=_policy(trust),
        min_round=min_round,
        memory=LedgerMemory() if remember else None,
        forget=forget,
        fix=fix,
    )



def federate_aggregate(
    adapters: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    method: str = "exact",
    weights: Sequence[float] | None = None,
    rank: int | None = None,
    clip_norm: float | None = None,
    robust: str = "none",
) -> dict[str, Any]:
    """Aggregate the PEFT LoRA adapter folders ``adapters`` into the new adapter folder
    ``out_dir``, with no store and no ledger (``method``, ``weights``, ``rank``, ``clip_norm`` and
    ``robust`` as in :func:`federate_round`): ``concord federate aggregate``. Returns what
    ``--json`` prints: the method, the ranks, each client's weight and verdict, the relative error.

    Raises:
        AdapterNotFoundError, AggregationError.
    """
    from concord.federation.rounds import aggregate_folders

    return aggregate_folders(
        adapters, out_dir, method=method, weights=weights, rank=rank, clip_norm=clip_norm, robust=robust
    )


class LedgerLog(TypedDict):
    """A tenant's federation ledger as ``concord federate log --json`` prints it: the head (the
    last round's hash, None before the first round) and every round document by round number, as
    stored (:func:`federate_verify` checks them)."""

    tenant: str
    store: str
    head: str | None
    rounds: list[dict[str, Any]]


def federate_log(store: StoreLike, tenant: str) -> LedgerLog:
    """The rounds of ``tenant``'s ledger in ``store``, oldest first, unverified: ``concord federate
    log``.

    Raises:
        InvalidNameError: ``tenant`` cannot name a tenant. StoreNotFoundError: ``store`` holds no store.
    """
    from concord.federation.ledger import list_rounds, read_head, validate_tenant

    validate_tenant(tenant)
    target = _to_read(store, None)
    return {"tenant": tenant, "store": target.uri, "head": read_head(target, tenant), "rounds": list_rounds(target, tenant)}

# ----------------------------------------------------------------------------- audits


def _labelled(stores: Sequence[StoreLike] | Mapping[str, StoreLike]) -> dict[str, Store]:
    """Each store under its cluster label: the mapping's keys, else its short name when unique,
    else its address."""
    from concord.audit.inputs import store_labels

    if isinstance(stores, Mapping):
        return {label: _to_read(s, None) for label, s in stores.items()}
    opened = [_to_read(s, None) for s in stores]
    return dict(zip(store_labels([s.uri for s in opened]), opened))


def audit_replicas(
    stores: Sequence[StoreLike] | Mapping[str, StoreLike],
    ref: str,
    *,
    reference: str | None = None,
    max_ulps: int = 1,
    top: int = 10,
    trust: TrustLike = None,
    progress: ProgressLike = None,
) -> AuditReport:
    """Compare the snapshot ``ref`` (a ref or root) across cluster ``stores``, tensor by tensor,
    with the one of cluster ``reference`` (default the first): ``concord audit replicas``. Under
    a trust policy (default ``$CONCORD_TRUSTED_KEYS``) an unsigned replica is critical. A mapping
    of ``stores`` names each cluster by its key; a list, by its store's short name.

    Returns the :class:`AuditReport` (``severity``, findings; ``to_dict()`` is the CLI's ``--json``).

    Raises:
        ReplicaConfigError, StoreNotFoundError.
    """
    from concord.audit.replicas import compare_replicas
    from concord.audit.report import AuditReport

    replicas = {label: (s, ref) for label, s in _labelled(stores).items()}
    found = compare_replicas(
        replicas, reference=reference, max_ulps=max_ulps, top=top, progress=_progress(progress), trust=_policy(trust)
    )
    return AuditReport.assemble(replicas=found)


def audit_cards(
    stores: Sequence[StoreLike] | Mapping[str, StoreLike], ref: str, *, reference: str | None = None, required: Sequence[str] | None = None
) -> AuditReport:
    """Compare the model cards of the snapshot ``ref`` across cluster ``stores``: ``concord audit
    cards``; ``required`` fields must be present on every card. ``stores`` as in :func:`audit_replicas`.

    Raises:
        ReplicaConfigError, StoreNotFoundError.
    """
    from concord.audit.model_cards import compare_cards
    from concord.audit.report import AuditReport

    cards = {label: (s, ref) for label, s in _labelled(stores).items()}
    kwargs = {"required": tuple(required)} if required else {}
    return AuditReport.assemble(cards=compare_cards(cards, reference=reference, **kwargs))


def audit_data(
    reference: str | os.PathLike[str],
    current: str | os.PathLike[str],
    *,
    registry: StoreLike | None = None,
    data_store: StoreLike | None = None,
    contract: str | os.PathLike[str] | None = None,
    profile: str = "use",
    **options: Any,
) -> AuditReport:
    """The drift of table ``current`` from ``reference`` (each a file, a data snapshot id or a
    ``data/<name>`` ref in ``data_store``, default the registry: ``registry``, else
    ``$CONCORD_REGISTRY``; ``reference`` may be a ``.profile`` file), and with ``contract``
    (``name@version`` in the registry, or a ``.json`` file) the current table validated against
    it: ``concord audit data``. ``options`` are the drift rule's keywords (``columns``,
    ``thresholds``: a :class:`~concord.audit.drift.DriftThresholds`, ``bins``). ``profile``: "use"
    a data snapshot's stored profile, "off", or "create" one where it has none.

    Raises:
        DataSnapshotNotFoundError, DataFormatError, DriftConfigError, ProfileError,
        ContractNotFoundError (checked before any data is read).
    """
    from concord.audit.report import audit_data as audit
    from concord.home import default_registry

    reg = open_store(registry if registry is not None else default_registry(), create=False)
    store = open_store(data_store, create=False) if data_store is not None else reg
    checked = None
    if contract is not None:  # an unknown contract fails before any data is read
        from concord.lineage.contracts import load_contract

        checked = load_contract(reg, contract)
    return audit(reference, current, store, contract=checked, profile=profile, **options)


class ProfileResult(TypedDict, total=False):
    """What :func:`audit_profile` made, as ``concord audit profile --json`` prints it."""

    #: the profile's summary: rows, sample size, where it came from, each column's counts
    profile: dict[str, Any]
    #: how many tables (or profiles) were merged into it
    parts: int
    #: the profile file written (absolute), with ``out=``
    out: str
    #: that file's size
    bytes: int
    #: where it is stored beside its data snapshot: ``{"ref", "root", "store"}``
    stored: dict[str, str]


def audit_profile(
    tables: Sequence[str | os.PathLike[str]],
    *,
    out: str | os.PathLike[str] | None = None,
    store_beside: bool = True,
    registry: StoreLike | None = None,
    data_store: StoreLike | None = None,
    sample_size: int = 500_000,
    max_labels: int = 100_000,
) -> ProfileResult:
    """Profile a reference table once (bounded samples and counts per column), to audit against
    many times: ``concord audit profile``. ``tables`` are the parts of one table (files, data
    snapshots of ``data_store``, default the registry, or ``.profile`` files), merged. The profile
    is written to ``out``, and a single data snapshot's is stored beside it too (``store_beside``).

    Raises:
        ApiArgumentError: no ``out`` and nothing to store it beside. DataFormatError,
        DataSnapshotNotFoundError, ProfileError.
    """
    from concord.audit.inputs import names_snapshot, open_table
    from concord.audit.profile import TableProfile, is_profile_file, merge, profile_ref, profile_table, store_profile
    from concord.errors import ApiArgumentError
    from concord.home import default_registry

    specs = [os.fspath(t) for t in tables]
    named = [t for t in specs if names_snapshot(t)]
    beside = len(specs) == 1 and bool(named) and store_beside
    if out is None and not beside:
        raise ApiArgumentError(
            "audit_profile", "give out= (a file for the profile): only a single data snapshot's is stored beside it"
        )
    store = None
    if named:
        store = open_store(data_store if data_store is not None else registry if registry is not None else default_registry())
    parts = []
    for spec in specs:
        if is_profile_file(spec):
            parts.append(TableProfile.load(spec))
            continue
        with open_table(spec, store, which="table") as table:
            src = table.source
            source = {"kind": src.kind, "name": src.name, "label": src.label, **({"id": src.id} if src.id else {})}
            parts.append(profile_table(table.batches(), sample_size=sample_size, max_labels=max_labels, source=source))
    made = parts[0] if len(parts) == 1 else merge(*parts)
    result = ProfileResult(profile=made.summary(), parts=len(parts))
    if out is not None:
        result["out"] = os.path.abspath(out)
        result["bytes"] = made.save(os.fspath(out))
    if beside and store is not None:
        data_id = made.source["id"]
        result["stored"] = {"ref": profile_ref(data_id), "root": store_profile(store, data_id, made), "store": store.uri}
    return result


# ----------------------------------------------------------------------------- OCI registries


def export_oci(
    store: StoreLike,
    reference: str,
    *,
    ref: str | None = None,
    root: str | None = None,
    name: str | None = None,
    plain_http: bool = False,
    memo: bool = True,
    key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> ExportResult:
    """Push the snapshot ``ref`` (or ``root``) of ``store`` to the OCI registry at ``reference``
    (``REGISTRY/REPOSITORY:TAG``) as a CNCF ModelPack artifact, its signatures attached as
    referrers: ``concord export oci``. ``name`` is the model's name in the artifact (default the
    ref's last part); ``memo`` reuses the SHA-256 this machine computed before. Credentials come
    from ``CONCORD_REGISTRY_USERNAME``/``CONCORD_REGISTRY_PASSWORD`` or the Docker config.

    Raises:
        OciReferenceError, OciRegistryError, RefNotFoundError.
    """
    from concord.oci.export import export_oci as push
    from concord.oci.reference import parse_reference
    from concord.snapshots.refs import load_manifest

    target = parse_reference(reference)
    source = _to_read(store, key_file)
    named = _root("export_oci", source, ref, root)
    if name is None and ref is not None:
        name = ref.split("~")[0].rsplit("/", 1)[-1]
        name = None if len(name) == 64 else name  # a root names no model
    return push(
        source, load_manifest(source, named), target, name=name, plain_http=plain_http, progress=_progress(progress), memo=memo
    )


def import_oci(
    reference: str,
    store: StoreLike,
    *,
    ref: str | None = None,
    plain_http: bool = False,
    trust: TrustLike = None,
    key_file: str | os.PathLike[str] | None = None,
    progress: ProgressLike = None,
) -> ImportResult:
    """Pull the ModelPack artifact at ``reference`` into ``store`` as a snapshot with the same
    root it was exported from, and point ``ref`` at it: ``concord import oci``. Under a trust
    policy (``trust=``, else ``$CONCORD_TRUSTED_KEYS``) the root must be signed by a trusted key.
    The store is opened only once the artifact passed every check.

    Raises:
        OciReferenceError, OciRegistryError, SignatureError, UntrustedRootError.
    """
    from concord.oci.importer import import_oci as pull
    from concord.oci.reference import parse_reference

    source = parse_reference(reference)
    policy = _policy(trust)
    return pull(
        source,
        lambda: _unlocked(open_store(store), key_file),
        store_ref=ref,
        plain_http=plain_http,
        progress=_progress(progress),
        trust=policy,
    )


# ----------------------------------------------------------------------------- lineage


def open_lineage(tracking_uri: str | None = None) -> Lineage:
    """Lineage in the MLflow tracking server ``tracking_uri`` (default ``$MLFLOW_TRACKING_URI``,
    else sqlite in ``$CONCORD_HOME``): every lineage operation is a method of the answer."""
    from concord.lineage import Lineage

    return Lineage(tracking_uri)


def register_data(
    source: Any, *, name: str, registry: StoreLike | None = None, progress: ProgressLike = None
) -> DataSnapshot:
    """Snapshot a table (a CSV or Parquet file, or a pandas DataFrame) into the registry store
    (default ``$CONCORD_REGISTRY``, else ``$CONCORD_HOME/registry``) and point ``data/<name>`` at
    it: ``concord data register``.

    Raises:
        DataFormatError, InvalidNameError.
    """
    from concord.home import default_registry
    from concord.lineage.data import register_data as take

    store = open_store(registry if registry is not None else default_registry())
    return take(source, store, name=name, progress=_progress(progress))


def register_model(
    name: str,
    store: StoreLike,
    *,
    ref: str | None = None,
    root: str | None = None,
    holders: Sequence[StoreLike] = (),
    data: str | None = None,
    contract: str | None = None,
    parents: Sequence[str] = (),
    description: str = "",
    registry: StoreLike | None = None,
    tracking_uri: str | None = None,
) -> dict[str, Any]:
    """Register the snapshot ``ref`` (or ``root``) of ``store`` as a new version of model ``name``
    in MLflow, with the data snapshot and contract it was trained on and the other stores holding
    it: ``concord model register``. Returns the version's record.

    Raises:
        LineageUnreachableError, DataSnapshotNotFoundError, ContractNotFoundError, RefNotFoundError.
    """
    from concord.home import default_registry

    lineage = open_lineage(tracking_uri)
    lineage.ensure_ready()  # an unreachable server fails before any store is touched
    source = open_store(store)
    named = _root("register_model", source, ref, root)
    reg = open_store(registry if registry is not None else default_registry())
    return lineage.register_model_version(
        name,
        named,
        [source, *(open_store(h) for h in holders)],
        data_snapshot=data,
        contract=contract,
        parents=list(parents),
        description=description,
        data_store=reg,
        contracts_store=reg,
    )


def model_lineage(name: str, version: str | int, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """Everything recorded about version ``version`` of model ``name``: its root, data snapshots,
    contract, parents, replicas and aliases: ``concord lineage model``.

    Raises:
        LineageUnreachableError, LineageError (no such version).
    """
    return open_lineage(tracking_uri).model_lineage(name, version)


def data_info(snapshot: str, *, registry: StoreLike | None = None) -> DataSnapshot:
    """What the registry (default ``$CONCORD_REGISTRY``) records about the data snapshot whose id
    (64 hex, what :func:`register_data` returned) is ``snapshot``: rows, columns, schema, digest,
    without reading its data: ``concord data show``.

    Raises:
        DataSnapshotNotFoundError. ValueError: ``snapshot`` is not an id.
    """
    from concord.lineage.data import data_info as info

    return info(_registry(registry), snapshot)


def promote_model(
    name: str, version: str | int, alias: str, *, registry: StoreLike | None = None, tracking_uri: str | None = None
) -> dict[str, Any]:
    """Point ``alias`` (e.g. ``champion``) at version ``version`` of model ``name`` once the
    promotion gate passes (its data snapshot still meets its contract; both read from the
    registry, default ``$CONCORD_REGISTRY``): ``concord model promote``. Returns what ``--json`` prints.

    Raises:
        PromotionRefused: the gate failed, with why. LineageUnreachableError, LineageError.
    """
    reg = _registry(registry)
    return open_lineage(tracking_uri).promote(name, version, alias, data_store=reg, contracts=reg)


def data_lineage(snapshot: str, *, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """Every model version that records the data snapshot ``snapshot`` as its data, by name and
    version: ``concord lineage data``.

    Raises:
        LineageUnreachableError.
    """
    return open_lineage(tracking_uri).data_lineage(snapshot)


def lineage_graph(
    name: str, *, out: str | os.PathLike[str] | None = None, tracking_uri: str | None = None
) -> dict[str, Any]:
    """The lineage of model ``name`` as a graph (``nodes``, ``edges``: versions, data snapshots,
    contracts, parents) and its Mermaid text (``mermaid``); with ``out``, also drawn into that
    folder as ``NAME.mmd`` and ``NAME.png`` (``mermaid_file``, ``png``): ``concord lineage graph``.

    Raises:
        LineageUnreachableError.
    """
    from concord.lineage.graph import render_png, to_mermaid

    graph = open_lineage(tracking_uri).lineage_graph(name)
    mermaid = to_mermaid(graph)
    found: dict[str, Any] = {"name": name, "nodes": graph["nodes"], "edges": graph["edges"], "mermaid": mermaid}
    if out is not None:
        folder = os.path.abspath(out)
        os.makedirs(folder, exist_ok=True)
        found["mermaid_file"] = os.path.join(folder, f"{name}.mmd")
        with open(found["mermaid_file"], "w") as f:
            f.write(mermaid + "\n")
        found["png"] = render_png(graph, os.path.join(folder, f"{name}.png"))
    return found


# ----------------------------------------------------------------------------- contracts


def _registry(registry: StoreLike | None) -> Store:
    """The registry store: ``registry``, else ``$CONCORD_REGISTRY``, else ``$CONCORD_HOME/registry``."""
    from concord.home import default_registry

    return open_store(registry if registry is not None else default_registry())


def contract_infer(
    table: Any, name: str, version: int, *, description: str = "", registry: StoreLike | None = None
) -> Contract:
    """Infer the schema contract ``name@version`` of ``table`` (a CSV or Parquet file, or a
    pandas DataFrame: each column's type, nullability, range and allowed labels) and save it in
    the registry (default ``$CONCORD_REGISTRY``): ``concord contract infer``.

    Raises:
        DataFormatError, ContractConflictError (that version is saved with other content).
    """
    from concord.lineage.contracts import infer_contract, save_contract
    from concord.lineage.data import read_table

    frame = table if hasattr(table, "columns") else read_table(table)
    contract = infer_contract(frame, name, version, description=description)
    save_contract(_registry(registry), contract)
    return contract


def contract_validate(
    contract: str | os.PathLike[str],
    *,
    table: Any = None,
    data: str | None = None,
    registry: StoreLike | None = None,
    data_store: StoreLike | None = None,
) -> ValidationResult:
    """Validate a table against the contract ``contract`` (``name@version`` in the registry, or a
    ``.json`` file): ``table`` (a file or a DataFrame), or the data snapshot ``data`` (an id or
    ``data/<name>``) of ``data_store`` (default the registry): ``concord contract validate``. A
    violation is in the answer (``.success``, ``.failures``), not raised.

    Raises:
        ContractNotFoundError, DataSnapshotNotFoundError, ApiArgumentError (neither or both of
            ``table`` and ``data``).
    """
    from concord.errors import ApiArgumentError
    from concord.lineage.contracts import load_contract, validate
    from concord.lineage.data import load_data, read_table

    if (table is None) == (data is None):
        raise ApiArgumentError("contract_validate", "give exactly one of table= (a file or DataFrame) and data= (a data snapshot)")
    reg = _registry(registry)
    loaded = load_contract(reg, contract)
    if table is not None:
        frame = table if hasattr(table, "columns") else read_table(table)
    else:
        frame = load_data(open_store(data_store) if data_store is not None else reg, cast(str, data))
    return validate(loaded, frame)


def contract_compatible(old: str, new: str, *, registry: StoreLike | None = None) -> CompatResult:
    """Whether contract ``new`` is backward compatible with ``old`` (each ``name@version`` in the
    registry, or a ``.json`` file): ``concord contract compatible``; ``.breaking`` lists what breaks.

    Raises:
        ContractNotFoundError.
    """
    from concord.lineage.contracts import compatible, load_contract

    reg = _registry(registry)
    return compatible(load_contract(reg, old), load_contract(reg, new))


def contract_list(*, registry: StoreLike | None = None) -> list[str]:
    """Every contract saved in the registry (default ``$CONCORD_REGISTRY``) as ``name@version``, by
    name then version: ``concord contract list``."""
    from concord.lineage.contracts import list_contracts

    return list_contracts(_registry(registry))


#: the verbs (listed once, in :mod:`concord`), then the types of their arguments
__all__ = [
    *VERBS,
    "LedgerLog",
    "LogEntry",
    "PolicyLike",
    "ProfileResult",
    "ProgressLike",
    "RefSummary",
    "StoreInit",
    "StoreLike",
    "TrustLike",
]
