"""Garbage collection on an S3 store (a real moto_server): ages come from the listing, leases
are documents in the bucket, and what no ref needs is deleted."""

from __future__ import annotations

import time

import pytest
from toy_checkpoints import SMALL_CHUNK, fine_tune, make_checkpoint

from concord.snapshots.gc import collect_garbage
from concord.snapshots.snapshot import snapshot
from concord.snapshots.verify import verify
from concord.stores.leases import LEASE_PREFIX, write_lease

pytestmark = pytest.mark.integration

HOUR = 3600.0


def test_gc_on_s3_deletes_only_what_no_ref_needs(s3_store, tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", layers=2, dim=64)
    keep = snapshot(ckpt, s3_store, ref="models/keep", chunk_size=SMALL_CHUNK)
    tuned = fine_tune(ckpt, tmp_path / "tuned", ["embed.weight"])
    gone = snapshot(tuned, s3_store, ref="models/gone", chunk_size=SMALL_CHUNK)
    assert s3_store.delete_ref("models/gone", gone.root)
    only_gone = set(gone.manifest.chunk_lengths()) - set(keep.manifest.chunk_lengths())
    assert only_gone
    later = time.time() + 2 * HOUR

    young = collect_garbage(s3_store, grace_seconds=HOUR)
    assert (young.deleted_manifests, young.deleted_chunks) == (0, 0)
    with write_lease(s3_store, "a sync into this bucket"):
        held = collect_garbage(s3_store, grace_seconds=HOUR, now=later)
    assert held.postponed_by == ["a sync into this bucket"] and held.deleted_chunks == 0
    dry = collect_garbage(s3_store, grace_seconds=HOUR, now=later, dry_run=True)
    assert (dry.deleted_manifests, dry.deleted_chunks) == (1, len(only_gone))
    assert set(s3_store.iter_manifests()) == {keep.root, gone.root}

    done = collect_garbage(s3_store, grace_seconds=HOUR, now=later)
    assert (done.deleted_manifests, done.deleted_chunks, done.postponed_by) == (1, len(only_gone), [])
    assert done.deleted_bytes == sum(gone.manifest.chunk_lengths()[c] for c in only_gone)
    assert set(s3_store.iter_manifests()) == {keep.root}
    assert set(s3_store.iter_chunks()) == set(keep.manifest.chunk_lengths())
    assert s3_store.list_documents(LEASE_PREFIX) == []
    assert verify(s3_store, ref="models/keep").ok
