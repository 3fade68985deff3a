"""A restore trusted only by a root-less ``model_signing`` bundle checks the bundle's digests from
the bytes it writes (whole files or shards, sha256 or blake3): the store is read once, and a
digest that differs fails the restore before its rename, leaving nothing behind."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from blake3 import blake3

from concord.errors import ChunkNotFoundError, IntegrityError, UntrustedRootError
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore
from concord.stores.base import chunk_key
from concord.trust import bundle as oms
from concord.trust import generate_key, load_policy, signature_key

CHUNK = 64 * 1024
SHARD = 50_000  # cut elsewhere than the 64 KiB chunks


class CountingStore(LocalDirStore):
    """A folder store that counts the chunks read from it, and runs many threads."""

    parallelism = 8

    def __init__(self, root) -> None:
        super().__init__(root)
        self.reads = 0

    def _load_chunk(self, cid, verify, *, transient):
        self.reads += 1
        return super()._load_chunk(cid, verify, transient=transient)


def _digest(hash_type: str, data: bytes) -> str:
    return blake3(data).hexdigest() if hash_type == "blake3" else hashlib.sha256(data).hexdigest()


def _bundle(folder, key, method: str, hash_type: str, wrong: str | None = None) -> bytes:
    """A bundle as ``model_signing``'s API writes it, its digests computed here from the files;
    the resource named ``wrong`` gets the digest of other bytes."""
    items = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        rel, data = path.relative_to(folder).as_posix(), path.read_bytes()
        if method == "files":
            pieces = [(rel, data)]
        else:
            pieces = [(f"{rel}:{s}:{min(s + SHARD, len(data))}", data[s : s + SHARD]) for s in range(0, len(data), SHARD)]
        items += [(name, _digest(hash_type, piece + (b"!" if name == wrong else b""))) for name, piece in pieces]
    ser = {"method": method, "hash_type": hash_type, "allow_symlinks": False, "ignore_paths": list(oms.GIT_PATHS)}
    if method == "shards":
        ser["shard_size"] = SHARD
    algorithm = hash_type if method == "files" else f"{hash_type}-sharded-{SHARD}"
    statement = {
        "_type": oms.STATEMENT_TYPE,
        "subject": [{"name": "model", "digest": {"sha256": oms.subject_digest(items)}}],
        "predicateType": oms.PREDICATE_TYPE,
        "predicate": {"serialization": ser, "resources": [{"name": n, "algorithm": algorithm, "digest": d} for n, d in items]},
    }
    payload = json.dumps(statement).encode()
    return oms.bundle_bytes(payload, key.sign(oms.pae(payload)), key.id)


KINDS = [("files", "sha256"), ("files", "blake3"), ("shards", "sha256"), ("shards", "blake3")]


@pytest.fixture
def signed_store(model, keydir, tmp_path):
    """(store, manifest, policy, key) of ``model`` (with an empty file) in a counting store."""
    (model / "empty.txt").write_bytes(b"")
    (model / ".gitattributes").unlink()  # the bundles here sign every file (one they ignore would be unsigned)
    store = CountingStore(tmp_path / "s")
    root = snapshot(model, store, ref="models/m", chunk_size=CHUNK).root
    key = generate_key(tmp_path / "k" / "signer.pem")
    return store, load_manifest(store, root), load_policy(str(tmp_path / "k" / "signer.pub.pem")), key


def _sign(store, manifest, key, bundle: bytes) -> None:
    store.put_document(signature_key(manifest.root, key.id), bundle, overwrite=True)


def _left(tmp_path) -> list:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out"))


@pytest.mark.parametrize("method, hash_type", KINDS)
def test_a_bundle_trusted_restore_reads_every_chunk_once(signed_store, model, tmp_path, method, hash_type):
    store, manifest, policy, key = signed_store
    _sign(store, manifest, key, _bundle(model, key, method, hash_type))
    chunks = sum(1 for f in manifest.files for p in f.parts for _ in p.chunk_spans(manifest.chunk_size))
    assert chunks > 5  # weights.bin alone spans five chunks, hashed in order by several threads
    store.reads = 0
    restore(store, manifest, tmp_path / "out", check_root=policy.restore_check)
    assert store.reads == chunks  # the digests came from the bytes written, nothing read first
    for f in manifest.files:
        assert (tmp_path / "out" / f.path).read_bytes() == (model / f.path).read_bytes()


@pytest.mark.parametrize("method, hash_type", KINDS)
def test_a_wrong_digest_fails_the_restore_and_leaves_nothing(signed_store, model, tmp_path, method, hash_type):
    store, manifest, policy, key = signed_store
    wrong = "weights.bin" if method == "files" else f"weights.bin:{2 * SHARD}:{3 * SHARD}"
    _sign(store, manifest, key, _bundle(model, key, method, hash_type, wrong=wrong))
    if (method, hash_type) == ("files", "sha256"):
        error, text = IntegrityError, r"weights.bin of \w+ from .* \(checked against its signature; nothing restored\)"
    else:
        error, text = UntrustedRootError, rf"1 {'file' if method == 'files' else 'shard'}\(s\) differ from what was signed \({wrong}\)"
    store.reads = 0
    with pytest.raises(error, match=text):
        restore(store, manifest, tmp_path / "out", check_root=policy.restore_check)
    assert store.reads <= sum(1 for f in manifest.files for p in f.parts for _ in p.chunk_spans(manifest.chunk_size))
    assert not (tmp_path / "out").exists() and _left(tmp_path) == []
    # an empty target folder stays, empty
    (tmp_path / "out").mkdir()
    with pytest.raises(error):
        restore(store, manifest, tmp_path / "out", check_root=policy.restore_check)
    assert list((tmp_path / "out").iterdir()) == [] and _left(tmp_path) == []


@pytest.mark.timeout(60)
def test_a_missing_chunk_under_a_bundle_fails_without_waiting_forever(signed_store, model, tmp_path):
    store, manifest, policy, key = signed_store
    _sign(store, manifest, key, _bundle(model, key, "shards", "sha256"))
    weights = next(f for f in manifest.files if f.path == "weights.bin")
    cid = list(weights.parts[0].chunk_spans(manifest.chunk_size))[0][0]  # the threads behind it wait for it
    Path(store.root, chunk_key(cid)).unlink()
    with pytest.raises(ChunkNotFoundError):
        restore(store, manifest, tmp_path / "out", check_root=policy.restore_check)
    assert not (tmp_path / "out").exists() and _left(tmp_path) == []
