"""Publish a snapshot to an OCI registry as a CNCF ModelPack artifact.

Each file of the snapshot becomes one unarchived layer, streamed from the store chunk by chunk
(a few chunks in flight, never a whole file in memory), every chunk checked against the
manifest, itself checked against the root, as it is read. A layer's digest is SHA-256 over the
file's bytes, never taken from the registry or a manifest already there: either computed from
those checked bytes, or remembered from an earlier export on this machine that computed it so
(:mod:`concord.oci.memo`, keyed by the chunk ids, which fix every byte). The registry is asked
(``HEAD``) whether it holds a blob of that digest: a blob it holds (of the file's size) is not
sent again (it is, by its content digest, these very bytes), so a new version sends, and hashes,
only the files that changed. A blob it lacks is streamed from checked chunks; when its digest
came from the memo, its SHA-256 is computed on the way and the last block is held back until it
equals the digest announced, so a wrong memo entry never uploads bytes under a digest that is
not theirs (the entry is dropped and the file hashed afresh). A remembered digest of a blob the
registry holds is not re-checked: a poisoned memo can at worst make the manifest name a blob
that is not this file, which every consumer refuses on import (its digest check or the root).

The manifest is pushed last, after every blob it names; then the snapshot's signatures that hold
for its root (:func:`~concord.oci.signatures.check_holds`), each as a referrer whose ``subject``
is the model manifest. A signature in the store that cannot hold for the root refuses the export
before anything is pushed.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from concord.errors.oci import OciError, OciMemoContradictedError
from concord.oci import modelpack as mp
from concord.oci.memo import DigestMemo, content_key, resolve_memo
from concord.oci.reference import Reference
from concord.oci.registry import Registry
from concord.oci.signatures import check_holds, push_signatures
from concord.progress import Progress, ensure
from concord.snapshots.manifest import FileEntry, Manifest
from concord.stores.base import Store
from concord.trust import signature_documents

#: chunks read ahead of the one being sent: bounds memory to a few chunks per file
READ_AHEAD = 4
#: a config.json larger than this is not read for the model config
MAX_CONFIG_JSON = 1024 * 1024


@dataclass(frozen=True)
class ExportResult:
    """A snapshot pushed as a ModelPack artifact: where, its digest and root, what was uploaded."""

    reference: str
    digest: str
    root: str
    layers: int
    bytes: int
    bytes_uploaded: int
    layers_uploaded: int
    signatures: list[str] = field(default_factory=list)
    #: bytes read from the store only to compute a digest (files whose digest was not remembered)
    bytes_hashed: int = 0
    #: layers whose digest came from this machine's memo of an earlier export
    layers_remembered: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def file_blocks(store: Store, f: FileEntry, chunk_size: int, pool: ThreadPoolExecutor | None = None) -> Iterator[bytes]:
    """A file's bytes in order, chunk by chunk, each chunk verified as it is read; with a pool,
    ``READ_AHEAD`` chunks are fetched ahead (a network store answers while the last is sent)."""
    spans = sorted((off, cid, n) for p in f.parts for cid, off, n in p.chunk_spans(chunk_size))
    expected = 0
    for off, _, n in spans:
        if off != expected:
            raise OciError(f"{f.path}: the manifest's parts do not cover the file contiguously (gap at byte {expected})")
        expected += n
    if expected != f.size:
        raise OciError(f"{f.path}: the manifest's parts cover {expected} bytes of {f.size}")

    def get(cid: str, n: int) -> bytes:
        data = store.get_chunk(cid, verify=True)
        if len(data) != n:
            raise OciError(f"chunk {cid} of {f.path} holds {len(data)} bytes, the manifest says {n}")
        return data

    if pool is None:
        for _, cid, n in spans:
            yield get(cid, n)
        return
    pending: deque = deque()
    it = iter(spans)
    try:
        for _, cid, n in it:
            pending.append(pool.submit(get, cid, n))
            if len(pending) > READ_AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for fut in pending:
            fut.cancel()


def file_digest(store: Store, f: FileEntry, chunk_size: int, pool: ThreadPoolExecutor | None = None) -> str:
    h = hashlib.sha256()
    for block in file_blocks(store, f, chunk_size, pool):
        h.update(block)
    return "sha256:" + h.hexdigest()


def _config_json(store: Store, manifest: Manifest) -> dict | None:
    f = manifest.by_path.get("config.json")
    if f is None or f.size > MAX_CONFIG_JSON:
        return None
    try:
        doc = json.loads(b"".join(file_blocks(store, f, manifest.chunk_size)))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


#: SHA-256 of no bytes: the digest of an empty file, never looked up
EMPTY_SHA256 = "sha256:" + hashlib.sha256(b"").hexdigest()


@dataclass
class _Tally:
    uploaded: int = 0
    layers_uploaded: int = 0
    hashed: int = 0
    remembered: int = 0


class _Layers:
    """How one export puts each file's layer in the registry (see the module's text)."""

    def __init__(self, store: Store, reg: Registry, chunk_size: int, pool: ThreadPoolExecutor, prog: Progress, memo: DigestMemo | None) -> None:
        self.store, self.reg, self.chunk_size, self.pool, self.prog, self.memo = store, reg, chunk_size, pool, prog, memo
        self.tally = _Tally()

    def blocks(self, f: FileEntry) -> Iterator[bytes]:
        return file_blocks(self.store, f, self.chunk_size, self.pool)

    def upload(self, f: FileEntry, digest: str, check: bool) -> None:
        blocks = (lambda: _checked(self.blocks(f), f.path, digest)) if check else (lambda: self.blocks(f))
        self.reg.put_blob(digest, f.size, lambda: _counted(blocks(), self.prog))
        self.tally.uploaded += f.size
        self.tally.layers_uploaded += 1

    def publish(self, f: FileEntry) -> str:
        """The layer digest of ``f``, its blob in the registry once this returns."""
        if f.size == 0:
            digest = EMPTY_SHA256
        else:
            key = content_key(f) if self.memo is not None else None
            remembered = self.memo.get(key, f.size) if key is not None else None
            if remembered is not None and self._remembered(f, key, remembered):
                return remembered
            digest = file_digest(self.store, f, self.chunk_size, self.pool)  # from checked bytes
            self.tally.hashed += f.size
            if key is not None:
                self.memo.put(key, f.size, digest)
        if self.reg.has_blob(digest):
            self.prog.advance(f.size)
        else:
            self.upload(f, digest, check=False)  # the same checked bytes the digest was computed from
        return digest

    def _remembered(self, f: FileEntry, key: str, digest: str) -> bool:
        """Whether the registry now holds ``f`` under the remembered ``digest``: a blob of that
        digest and of the file's size it holds, or one uploaded here whose bytes hashed to it on
        the way. False (the entry dropped) when the registry's size or the bytes contradict it."""
        length = self.reg.blob_length(digest)
        if length is not None:
            if length in (-1, f.size):
                self.prog.advance(f.size)
                self.tally.remembered += 1
                return True
        else:
            try:
                self.upload(f, digest, check=True)
            except OciMemoContradictedError:
                pass
            else:
                self.tally.remembered += 1
                return True
        self.memo.forget(key)
        return False


def export_oci(
    store: Store,
    manifest: Manifest,
    ref: Reference,
    *,
    name: str | None = None,
    plain_http: bool = False,
    progress: Progress | None = None,
    signatures: bool = True,
    memo: DigestMemo | bool = True,
) -> ExportResult:
    """Push snapshot ``manifest`` (whose chunks ``store`` holds) to ``ref`` as a ModelPack artifact.

    ``memo``: where this machine remembers the SHA-256 of files it hashed (``True``: the one in
    ``$CONCORD_HOME``, unless ``$CONCORD_NO_OCI_MEMO`` is set; ``False``: hash every file)."""
    if ref.tag is None:
        from concord.errors.oci import OciReferenceError

        raise OciReferenceError(str(ref), "an export needs a tag to push to, not a digest (the digest is what the push answers)")
    manifest = Manifest.from_json(manifest.to_json(), expected_root=manifest.root, verify=True)  # every node re-hashed up to the root
    prog = ensure(progress)
    digests = resolve_memo(memo)
    with Registry(ref, plain_http=plain_http) as reg, ThreadPoolExecutor(READ_AHEAD + 1, thread_name_prefix="concord-oci") as pool:
        layers = _Layers(store, reg, manifest.chunk_size, pool, prog, digests)
        descriptors: list[dict] = []
        sha256: dict[str, str] = {}
        prog.start(manifest.total_bytes, "export")
        try:
            for f in manifest.files:
                digest = layers.publish(f)
                sha256[f.path] = digest.split(":", 1)[1]
                descriptors.append(mp.layer_descriptor(f, digest))
        finally:
            prog.close()
            if digests is not None:
                digests.save()
        uploaded = layers.tally.uploaded
        documents = signature_documents(store, manifest.root) if signatures else {}
        for key_id, bundle in documents.items():
            check_holds(store, manifest.root, manifest, key_id, bundle, f"{key_id[:16]} of {manifest.root[:12]} in {store.uri}", sha256)
        config = mp.model_config(manifest, _config_json(store, manifest), name=name, layer_digests=[d["digest"] for d in descriptors])
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
        if not reg.has_blob(config_digest):
            reg.put_blob(config_digest, len(config_bytes), lambda: [config_bytes])
            uploaded += len(config_bytes)
        doc = {
            "schemaVersion": 2,
            "mediaType": mp.MANIFEST_TYPE,
            "artifactType": mp.ARTIFACT_TYPE,
            "config": {"mediaType": mp.CONFIG_TYPE, "digest": config_digest, "size": len(config_bytes)},
            "layers": descriptors,
            "annotations": {mp.ROOT: manifest.root, mp.CHUNK_SIZE: str(manifest.chunk_size)},
        }
        body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        reg.put_manifest(body, ref.target)
        signed = push_signatures(reg, documents, {"mediaType": mp.MANIFEST_TYPE, "digest": digest, "size": len(body)})
    return ExportResult(
        reference=str(ref),
        digest=digest,
        root=manifest.root,
        layers=len(descriptors),
        bytes=manifest.total_bytes,
        bytes_uploaded=uploaded,
        layers_uploaded=layers.tally.layers_uploaded,
        signatures=signed,
        bytes_hashed=layers.tally.hashed,
        layers_remembered=layers.tally.remembered,
    )


def _checked(blocks: Iterator[bytes], path: str, digest: str) -> Iterator[bytes]:
    """``blocks`` with their SHA-256 computed on the way; the last block is held back until the
    whole equals ``digest`` (else :class:`OciMemoContradictedError`, the body left short)."""
    h = hashlib.sha256()
    held = None
    for block in blocks:
        if held is not None:
            yield held
        h.update(block)
        held = block
    actual = "sha256:" + h.hexdigest()
    if actual != digest:
        raise OciMemoContradictedError(path, digest, actual)
    if held is not None:
        yield held


def _counted(blocks: Iterator[bytes], prog: Progress) -> Iterator[bytes]:
    for block in blocks:
        yield block
        prog.advance(len(block))
