"""Sign a root, keep signatures in the store, check a signature against a root.

Signature documents live at ``signatures/<root>/<key id>.sig`` (one per key; a new signature by
the same key replaces the old one, atomically), so they are listed per root and travel with
``sync``. Each is an OMS bundle (:mod:`concord.trust.bundle`) over the SHA-256 of every file of
the snapshot (the files OMS ignores by default, ``.git`` and friends, excepted) and over the root.

Signing reads the snapshot from the store, never from a folder: every chunk is verified against
the manifest (BLAKE3) as it is read, and each file's SHA-256 is computed from the same bytes, so
what is signed is exactly what the root names. Chunks are fetched on a thread pool while one
thread feeds SHA-256, in file order.

A bundle that binds a root (``predicate.concord.root``) holds for that root only. A bundle made
by ``model_signing sign`` binds no root: it holds for a root whose files are exactly the ones it
lists (a file under its ``ignore_paths`` is unsigned) with exactly the digests it lists (checked
from the store's bytes when it is imported, and again by a restore
under a trust policy, from the bytes it writes: :class:`FileDigests`, fed in file order).
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from concord.errors import SignatureError
from concord.snapshots.manifest import Manifest
from concord.snapshots.refs import load_manifest
from concord.stores.base import Store
from concord.trust import bundle as oms
from concord.trust.keys import PublicKey, SigningKey

PREFIX = "signatures"
SUFFIX = ".sig"


def signature_key(root: str, key_id: str) -> str:
    """Store document key of the signature of ``root`` by the key ``key_id``."""
    return f"{PREFIX}/{root}/{key_id}{SUFFIX}"


def signature_ids(store: Store, root: str) -> list[str]:
    """Key ids of the signature documents a store holds for ``root`` (sorted)."""
    out = []
    for key in store.list_documents(f"{PREFIX}/{root}"):
        name = key.rsplit("/", 1)[-1]
        kid = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else ""
        if len(kid) == 64 and all(c in "0123456789abcdef" for c in kid) and key == signature_key(root, kid):
            out.append(kid)
    return sorted(out)


def read_signature(store: Store, root: str, key_id: str) -> bytes | None:
    """The bundle bytes of ``root``'s signature by ``key_id``, or None."""
    return store.get_document(signature_key(root, key_id))


def signature_documents(store: Store, root: str) -> dict[str, bytes]:
    """Every signature document of ``root``: key id → bundle bytes (as stored, not verified)."""
    out = {}
    for kid in signature_ids(store, root):
        data = read_signature(store, root, kid)
        if data is not None:
            out[kid] = data
    return out


def signed_paths(manifest: Manifest, ignore_paths: Iterable[str] = oms.GIT_PATHS) -> list[str]:
    """The manifest's file paths a signature lists (those OMS does not ignore)."""
    ignore = tuple(ignore_paths)
    return [f.path for f in manifest.files if not oms.is_ignored(f.path, ignore)]


class FileDigests:
    """The digests of one file as a serialization cuts it: fed the file's bytes in order."""

    def __init__(self, path: str, size: int, serialization: oms.Serialization) -> None:
        self.serialization = serialization
        self.pieces = serialization.names(path, size)  # (name, start, end); none for an empty sharded file
        self.done: dict[str, str] = {}
        self.at = 0  # bytes fed so far
        self.hasher = serialization.hasher()

    def update(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            name, start, end = self.pieces[len(self.done)]
            take = min(len(view), end - self.at)
            self.hasher.update(view[:take])
            self.at += take
            view = view[take:]
            if self.at == end:
                self._close(name)

    def _close(self, name: str) -> None:
        self.done[name] = self.hasher.hexdigest()
        self.hasher = self.serialization.hasher()

    def result(self) -> dict[str, str]:
        if len(self.done) < len(self.pieces):  # an empty file as one whole-file resource
            self._close(self.pieces[-1][0])
        return self.done


def file_digests(
    store: Store,
    manifest: Manifest,
    paths: Iterable[str] | None = None,
    *,
    progress=None,
    serialization: oms.Serialization = oms.FILES_SHA256,
) -> dict[str, str]:
    """SHA-256 (hex) of each file of ``manifest`` (or of ``paths`` only), streamed from ``store``,
    every chunk verified as it is read; with another ``serialization``, the digests it names
    (resource name → hex: per shard, ``PATH:START:END``, for shards)."""
    wanted = set(paths) if paths is not None else None
    files = [f for f in manifest.files if wanted is None or f.path in wanted]
    jobs = [(i, cid, length) for i, f in enumerate(files) for p in f.parts for cid, _, length in p.chunk_spans(manifest.chunk_size)]
    if not serialization.whole_file_sha256:
        hashers = [FileDigests(f.path, f.size, serialization) for f in files]
    else:
        hashers = [hashlib.sha256() for _ in files]

    def fetch(job) -> tuple[int, bytes]:
        i, cid, length = job
        data = store.get_chunk(cid, verify=True)
        if len(data) != length:
            from concord.errors import IntegrityError

            raise IntegrityError(f"chunk {cid} in {store.uri}", f"{length} bytes", f"{len(data)} bytes")
        return i, data

    workers = max(2, store.parallelism)
    with ThreadPoolExecutor(workers, thread_name_prefix="concord-sign") as pool:
        for i, data in _in_order(pool, fetch, jobs, window=2 * workers):
            hashers[i].update(data)
            if progress is not None:
                progress.advance(len(data))
    if not serialization.whole_file_sha256:
        return {name: digest for h in hashers for name, digest in h.result().items()}
    return {f.path: h.hexdigest() for f, h in zip(files, hashers)}


def _in_order(pool: ThreadPoolExecutor, fn, items: list, window: int) -> Iterator:
    """``fn`` over ``items`` on ``pool``, results in order, at most ``window`` in flight."""
    pending: deque = deque()
    it = iter(items)
    for item in it:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            break
    for item in it:
        yield pending.popleft().result()
        pending.append(pool.submit(fn, item))
    while pending:
        yield pending.popleft().result()


@dataclass(frozen=True)
class SignResult:
    """What :func:`sign_root` kept: the signature of ``root`` by key ``key_id``, as the store
    document ``document``, over its files and bytes."""

    root: str
    key_id: str
    document: str
    files: int
    bytes: int
    ref: str | None = None
    model_name: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def sign_root(
    store: Store,
    root: str,
    key: SigningKey,
    *,
    ref: str | None = None,
    model_name: str | None = None,
    progress=None,
) -> tuple[SignResult, bytes]:
    """Sign ``root`` with ``key`` and keep the bundle in ``store``; (result, bundle bytes)."""
    manifest = load_manifest(store, root)
    paths = signed_paths(manifest)
    if progress is not None:
        progress.start(sum(f.size for f in manifest.files if f.path in set(paths)), "sign")
    try:
        digests = file_digests(store, manifest, paths, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    name = model_name or (ref.rsplit("/", 1)[-1] if ref else root[:12])
    payload = oms.statement_bytes(
        name,
        digests,
        concord={"root": root, "manifest_format": "concord/manifest@1", **({"ref": ref} if ref else {})},
    )
    data = oms.bundle_bytes(payload, key.sign(oms.pae(payload)), key.id)
    doc = signature_key(root, key.id)
    store.put_document(doc, data, overwrite=True)
    total = sum(f.size for f in manifest.files if f.path in digests)
    return SignResult(root, key.id, doc, len(digests), total, ref, name), data


# ----------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class Checked:
    """A signature that verifies with ``key``. ``root_bound``: it names the root it was checked
    against; otherwise ``expected`` holds the SHA-256 the root's files must have."""

    key_id: str
    key_source: str
    root_bound: bool
    expected: Mapping[str, str] = field(default_factory=dict)
    #: how ``expected`` was computed (resource name → digest); files/sha256 unless ``model_signing``'s API chose otherwise
    serialization: oms.Serialization = oms.FILES_SHA256

    @property
    def files(self) -> frozenset[str]:
        """The paths of the files ``expected`` names (a root-less bundle's signed files)."""
        return frozenset(self.serialization.path_of(name) for name in self.expected)


def verifying_key(parsed: oms.Bundle, keys: Iterable[PublicKey], where: str) -> PublicKey:
    """The key among ``keys`` whose signature ``parsed`` carries; :class:`SignatureError` if none."""
    keys = list(keys)
    candidates = [k for k in keys if k.id == parsed.key_hint] if parsed.key_hint else keys
    if parsed.key_hint and not candidates:
        raise SignatureError(
            where,
            f"it was made by key {parsed.key_hint[:16]}, which is not among the keys given "
            f"({', '.join(k.id[:16] for k in keys) or 'none'})",
            "Trust that key's public half if its signer is trusted",
        )
    key = next((k for k in candidates if k.verify(parsed.signature, parsed.signed_message)), None)
    if key is None:
        tried = ", ".join(k.id[:16] for k in keys) or "(none)"
        raise SignatureError(
            where,
            f"it does not verify with the key it names ({tried}): the bundle was altered or made by another key",
            "Sign the snapshot again, or trust the key that made it",
        )
    return key


def check_names(files: Iterable[tuple[str, int]], statement: oms.Statement, where: str) -> None:
    """Refuse a statement whose files are not ``files`` (path, size): a trusted root holds no
    file its signature does not cover. A Concord bundle names its root, whose Merkle tree covers
    every byte, so the paths it leaves out of its resources for OMS verifiers (``ignore_paths``)
    are still signed; a root-less (``model_signing``) bundle covers only the files it lists, so a
    file under its ``ignore_paths`` is an unsigned file like any other. In shards an empty file
    has no resource (it has no bytes to sign) and is allowed unless its path is ignored."""
    sharded = statement.serialization.method == "shards"
    bound = statement.root is not None
    listed = set()
    for p, size in files:
        ignored = oms.is_ignored(p, statement.ignore_paths)
        if (bound and ignored) or (sharded and size == 0 and not ignored):
            continue
        listed.add(p)
    named = statement.files()
    if listed != named:
        extra, missing = sorted(listed - named), sorted(named - listed)
        what = "; ".join(
            x for x in (f"files not signed: {', '.join(extra[:3])}" if extra else "", f"signed files absent: {', '.join(missing[:3])}" if missing else "") if x
        )
        raise SignatureError(where, f"its files are not the snapshot's ({what})", "Sign this snapshot itself")


def check_bundle(
    parsed: oms.Bundle,
    root: str,
    manifest: Manifest,
    keys: Iterable[PublicKey],
    where: str,
) -> Checked:
    """Check a parsed bundle against ``root`` (its ``manifest``) and ``keys``; raise
    :class:`SignatureError` if no key verifies it, it signs another root, or its files are not
    the manifest's. A root-less (``model_signing``) bundle returns the digests still to check."""
    key = verifying_key(parsed, keys, where)
    st = parsed.statement
    if st.root is not None and st.root != root:
        raise SignatureError(where, f"it signs root {st.root}, not {root}", "A signature holds for the root it names only")
    check_names(((f.path, f.size) for f in manifest.files), st, where)
    if st.root is not None:
        return Checked(key.id, key.source, True)
    return Checked(key.id, key.source, False, dict(st.resources), st.serialization)


def compare_digests(expected: Mapping[str, str], actual: Mapping[str, str], where: str, what: str = "file(s)") -> None:
    bad = sorted(p for p in set(expected) | set(actual) if actual.get(p) != expected.get(p))
    if bad:
        raise SignatureError(
            where,
            f"{len(bad)} {what} differ from what was signed ({', '.join(bad[:3])})",
            "The signature is for other bytes: sign this snapshot itself",
        )


def verify_bundle(
    store: Store,
    root: str,
    data: bytes,
    keys: Iterable[PublicKey],
    *,
    where: str = "",
    manifest: Manifest | None = None,
) -> Checked:
    """Parse and fully check ``data`` against ``root`` in ``store``: a root-less bundle's digests
    are compared with the SHA-256 of the root's files, read from the store."""
    where = where or f"for {root[:12]} in {store.uri}"
    parsed = oms.parse_bundle(data, where)
    manifest = manifest or load_manifest(store, root)
    checked = check_bundle(parsed, root, manifest, keys, where)
    if not checked.root_bound:
        check_digests(store, manifest, checked, where)
    return checked


def check_digests(store: Store, manifest: Manifest, checked: Checked, where: str) -> None:
    """Compare a root-less bundle's digests with those of the root's bytes in ``store``, computed
    as its serialization says (every shard of every file, for shards)."""
    ser = checked.serialization
    paths = {ser.path_of(name) for name in checked.expected}
    what = "shard(s)" if ser.method == "shards" else "file(s)"
    compare_digests(checked.expected, file_digests(store, manifest, paths, serialization=ser), where, what)


def import_signature(store: Store, root: str, data: bytes, keys: Iterable[PublicKey], *, where: str = "") -> Checked:
    """Keep an OMS bundle (e.g. from ``model_signing sign key``) as a signature of ``root`` after
    it verifies with one of ``keys`` against the root's files; nothing is written otherwise."""
    checked = verify_bundle(store, root, data, keys, where=where)
    store.put_document(signature_key(root, checked.key_id), data, overwrite=True)
    return checked


def snapshot_signed(source: str | os.PathLike, store: Store, data: bytes, keys: Iterable[PublicKey], *, where: str = "", **options):
    """Snapshot the folder ``source`` (as :func:`concord.snapshots.snapshot.snapshot`, same
    ``options``) and keep ``data``, an OMS bundle made for that folder (``model_signing sign``),
    as its signature; (snapshot result, :class:`Checked`).

    The root holds the files the bundle signs and nothing else: the files under its
    ``ignore_paths`` (``.git`` and friends, the signature itself when it lies in the folder) are
    left out of the snapshot, never stored as unsigned bytes of a trusted root; any other file it
    does not list is refused. The bundle is parsed, its signature checked with ``keys`` and its
    file list compared with the folder's before a byte is written; its digests are compared with
    the stored bytes before the ref moves. A bundle that does not hold moves no ref and keeps no
    signature."""
    import shutil
    import tempfile

    from concord.snapshots.snapshot import collect_files, snapshot

    where = where or "given with --signature"
    keys = list(keys)
    parsed = oms.parse_bundle(data, where)
    verifying_key(parsed, keys, where)
    st = parsed.statement
    signed = st.files()
    files = collect_files(source)
    kept = [(rel, path) for rel, path in files if rel in signed or not oms.is_ignored(rel, st.ignore_paths)]
    check_names(((rel, os.path.getsize(path)) for rel, path in kept), st, where)
    done: list[Checked] = []

    def keep(st_: Store, root: str) -> None:
        done.append(import_signature(st_, root, data, keys, where=where))

    if len(kept) == len(files):
        return snapshot(source, store, before_ref=keep, **options), done[0]
    # a folder of links to the signed files only (followed by the snapshot), named as the source
    staging = tempfile.mkdtemp(prefix=".concord-signed-")
    try:
        folder = os.path.join(staging, os.path.basename(os.path.abspath(os.fspath(source))) or "model")
        for rel, path in kept:
            link = os.path.join(folder, *rel.split("/"))
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.abspath(path), link)
        return snapshot(folder, store, before_ref=keep, **options), done[0]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
