"""Trust benchmark: what signing a snapshot and restoring under a trust policy cost.

Setup (untimed): the LLaMA-shaped checkpoint (``ensure_checkpoint``; 2.1 GB by default, 0.1 GB
with ``--quick``) is snapshotted into a local store in the work folder, in 4 MiB chunks; the
checkpoint and the store's chunks are read once so both sit in the page cache. A P-256 key pair is
generated.

Timed, in interleaved rounds:
- signing: ``concord.trust.sign_root`` (every chunk read from the store and verified against its
  BLAKE3 id, each file's SHA-256 computed from the same bytes, the OMS bundle signed and kept in
  the store) against the baseline, one ``hashlib.sha256`` pass over the checkpoint's files
  (16 MiB reads). Target: at most 1.2×.
- restore (``runs`` rounds in each order): ``restore`` with the policy's ``restore_check`` (the root's signature documents read and
  checked with the trusted key before anything is written) against an unchecked ``restore`` of
  the same root into a fresh folder. Target: at most 1.05×.
- the trust check alone (``restore_check``), timed by itself: what a restore under a policy adds.
- for the record (no target): a restore trusted through a ``model_signing`` bundle, which binds no
  root: each file's SHA-256 is computed from the bytes as they are written (in file order, by the
  thread that wrote each chunk) and compared with the signed one before the final rename; the same
  for a bundle in shards of 1 GB hashed with BLAKE3 (``model_signing``'s API with
  ``use_shard_serialization(hashing_algorithm="blake3")``), each shard's digest from the bytes written.

Every restore must give the checkpoint's bytes, or the benchmark raises.
"""

from __future__ import annotations

import hashlib

from bench.common import (
    GB,
    Case,
    MiB,
    Options,
    Row,
    Table,
    Target,
    ensure_checkpoint,
    fresh_dir,
    log,
    race,
    remove,
    settle,
    times_note,
    warm,
)


def _sha256_files(paths) -> dict:
    out = {}
    for p in paths:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while block := fh.read(16 * MiB):
                h.update(block)
        out[p.name] = h.hexdigest()
    return out


#: model_signing's default shard size
SHARD = 1_000_000_000


def _blake3_shards(paths) -> dict:
    """``PATH:START:END`` → BLAKE3 of that shard, as model_signing's shard serialization names them."""
    from blake3 import blake3

    out = {}
    for p in paths:
        size = p.stat().st_size
        with open(p, "rb") as fh:
            for start in range(0, size, SHARD):
                h, left = blake3(), min(SHARD, size - start)
                while left and (block := fh.read(min(16 * MiB, left))):
                    h.update(block)
                    left -= len(block)
                out[f"{p.name}:{start}:{min(start + SHARD, size)}"] = h.hexdigest()
    return out


def _sharded_bundle(name: str, digests: dict, key) -> bytes:
    """A model_signing bundle over ``digests`` in shards of :data:`SHARD` bytes hashed with BLAKE3
    (what ``hashing.Config().use_shard_serialization(hashing_algorithm="blake3")`` writes)."""
    import json

    from concord.trust import bundle as oms

    items = list(digests.items())
    statement = {
        "_type": oms.STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": oms.subject_digest(items)}}],
        "predicateType": oms.PREDICATE_TYPE,
        "predicate": {
            "serialization": {"method": "shards", "hash_type": "blake3", "shard_size": SHARD, "allow_symlinks": False, "ignore_paths": []},
            "resources": [{"name": n, "algorithm": f"blake3-sharded-{SHARD}", "digest": d} for n, d in items],
        },
    }
    payload = json.dumps(statement).encode()
    return oms.bundle_bytes(payload, key.sign(oms.pae(payload)), key.id)


def run(opts: Options) -> list[Table]:
    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore
    from concord.trust import TrustPolicy, generate_key, sign_root, signature_ids
    from concord.trust import bundle as oms

    ckpt = ensure_checkpoint(opts.data_dir, opts.size_gb)
    work = fresh_dir(opts.work_dir / "trust")
    try:
        store = LocalDirStore(work / "store")
        snap = snapshot(ckpt.folder, store, ref="bench/model", chunk_size=DEFAULT_CHUNK_SIZE)
        secs = warm(ckpt.file) + sum(warm(p) for p in (work / "store" / "chunks").rglob("*") if p.is_file())
        log(f"checkpoint and store of {snap.chunks} chunks read into the page cache in {secs:.2f} s")
        key = generate_key(work / "keys" / "bench.pem")
        policy = TrustPolicy.from_paths([work / "keys" / "bench.pub.pem"])
        files = sorted(p for p in ckpt.folder.iterdir() if p.is_file())
        manifest = load_manifest(store, snap.root)

        signing = race(
            opts.runs,
            Case("concord sign", lambda: sign_root(store, snap.root, key, ref="bench/model")[0]),
            Case("hashlib.sha256 over the files", lambda: _sha256_files(files)),
            wait_idle=opts.wait_idle,
        )
        signed, plain = signing
        if signed.result.files != len(files) or signature_ids(store, snap.root) != [key.id]:
            raise RuntimeError(f"signing left {signature_ids(store, snap.root)} for {signed.result}")

        out = work / "out"

        def clear() -> None:
            remove(out)
            settle()  # the previous restore's dirty pages written back before this one is timed

        def restored(r) -> None:
            got = _sha256_files(sorted(p for p in out.iterdir() if p.is_file()))
            if got != plain.result:
                raise RuntimeError(f"a restore gave other bytes: {got} != {plain.result}")
            remove(out)

        trusted = Case("restore under a trust policy", lambda: restore(store, manifest, out, check_root=policy.restore_check),
                       before=clear, after=lambda: restored(None))
        unchecked = Case("unchecked restore", lambda: restore(store, manifest, out), before=clear, after=lambda: restored(None))
        # each order in turn, so that neither case always runs right after the other's clean-up
        race(opts.runs, trusted, unchecked, wait_idle=opts.wait_idle)
        race(opts.runs, unchecked, trusted, warmup=False, wait_idle=opts.wait_idle)
        restores = (trusted, unchecked)
        # the check itself, alone: what a restore under a policy adds to an unchecked one
        (check,) = race(max(opts.runs, 5), Case("trust check alone", lambda: policy.restore_check(store, snap.root)), wait_idle=0.0)
        if check.result is not None:
            raise RuntimeError(f"a root Concord signed needs no file digests, got {check.result}")

        # a root trusted through a model_signing bundle (no root in it): its files' SHA-256 are checked
        rootless = oms.statement_bytes(ckpt.folder.name, plain.result)
        bundle = oms.bundle_bytes(rootless, key.sign(oms.pae(rootless)), key.id)
        other = LocalDirStore(work / "other")
        snapshot(ckpt.folder, other, chunk_size=DEFAULT_CHUNK_SIZE)
        from concord.trust import import_signature

        import_signature(other, snap.root, bundle, policy.keys)
        # and one in shards hashed with BLAKE3, by a second key (its own policy) on the same root
        key2 = generate_key(work / "keys" / "shards.pem")
        policy2 = TrustPolicy.from_paths([work / "keys" / "shards.pub.pem"])
        import_signature(other, snap.root, _sharded_bundle(ckpt.folder.name, _blake3_shards(files), key2), policy2.keys)
        by_digest = race(
            opts.runs,
            Case("restore trusted by a model_signing bundle", lambda: restore(other, manifest, out, check_root=policy.restore_check),
                 before=clear, after=lambda: restored(None)),
            Case("restore trusted by a sharded blake3 bundle", lambda: restore(other, manifest, out, check_root=policy2.restore_check),
                 before=clear, after=lambda: restored(None)),
            Case("unchecked restore (same store)", lambda: restore(other, manifest, out), before=clear, after=lambda: restored(None)),
            warmup=False,
            wait_idle=opts.wait_idle,
        )
    finally:
        remove(work)

    size = snap.bytes / GB
    table = Table(f"trust: a {size:.2f} GB checkpoint ({snap.chunks} chunks of 4 MiB), best of {opts.runs} (restores: of {2 * opts.runs}, both orders)")
    table.add(Row("sign (verified read + SHA-256 per file + OMS bundle)", signed.best, plain.best, "s", Target("ratio", "<=", 1.2), "one hashlib.sha256 pass"))
    table.add(Row("restore under a trust policy", trusted.best, unchecked.best, "s", Target("ratio", "<=", 1.05), "unchecked restore"))
    table.add(Row("the trust check alone (restore_check: read and verify the signature)", check.best, unchecked.best, "s", None, "unchecked restore"))
    table.add(Row("restore trusted by a model_signing bundle (SHA-256 as written)", by_digest[0].best, by_digest[2].best, "s", None, "unchecked restore"))
    table.add(
        Row(
            f"restore trusted by a bundle in shards of {SHARD / 1e9:g} GB hashed with BLAKE3",
            by_digest[1].best,
            by_digest[2].best,
            "s",
            None,
            "unchecked restore",
        )
    )
    table.notes += [
        f"throughput: sign {size / signed.best:.2f} GB/s, sha256 {size / plain.best:.2f} GB/s, "
        f"restore under policy {size / trusted.best:.2f} GB/s, unchecked {size / unchecked.best:.2f} GB/s",
        "a Concord signature binds the root, so a restore under a policy checks one small document and "
        "relies on the per-chunk BLAKE3 checks restore makes anyway; a model_signing bundle binds file "
        "digests only, so the restore also feeds each file's bytes to SHA-256 as it writes them (no second read), "
        "and compares before its final rename",
        "the restore rows are dominated by writing the files (page cache and writeback); the check-alone row "
        "is what the policy adds to any restore, measured without the restore around it",
        times_note([*signing, *restores, check, *by_digest]),
    ]
    return [table]
