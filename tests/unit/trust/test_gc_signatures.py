"""Garbage collection takes a root's signature documents with it, under the manifest's rules."""

from __future__ import annotations

import time

from concord.snapshots.gc import collect_garbage
from concord.snapshots.snapshot import snapshot
from concord.trust import load_signing_key, sign_root, signature_ids, signature_key

HOUR = 3600.0


def _later() -> float:
    return time.time() + 48 * HOUR


def _two_signed(snap, model, keydir):
    """``models/m`` (live) and a second root, unreferenced, each signed by alice and mallory."""
    store, live = snap
    (model / "config.json").write_text('{"hidden": 16}')
    dead = snapshot(model, store, chunk_size=64 * 1024).root
    for pem in ("alice.pem", "mallory.pem"):
        key = load_signing_key(keydir / pem)
        sign_root(store, live, key, ref="models/m")
        sign_root(store, dead, key)
    return store, live, dead


def test_signatures_of_a_collected_root_go_with_it_and_a_live_roots_stay(snap, model, keydir):
    store, live, dead = _two_signed(snap, model, keydir)
    dry = collect_garbage(store, grace_seconds=HOUR, now=_later(), dry_run=True)
    assert (dry.deleted_manifests, dry.deleted_signatures) == (1, 2)
    assert len(signature_ids(store, dead)) == 2  # a dry run deletes nothing

    result = collect_garbage(store, grace_seconds=HOUR, now=_later())
    assert (result.deleted_manifests, result.deleted_signatures) == (1, 2)
    assert result.to_dict()["deleted_signatures"] == 2
    assert signature_ids(store, dead) == []
    assert len(signature_ids(store, live)) == 2
    assert collect_garbage(store, grace_seconds=HOUR, now=_later()).deleted_signatures == 0


def test_a_young_unreferenced_root_keeps_its_signatures(snap, model, keydir):
    store, live, dead = _two_signed(snap, model, keydir)
    result = collect_garbage(store, grace_seconds=HOUR)
    assert (result.deleted_manifests, result.deleted_signatures) == (0, 0)
    assert len(signature_ids(store, dead)) == 2


def test_a_live_lease_postpones_the_signatures_too(snap, model, keydir):
    from concord.stores.leases import write_lease

    store, live, dead = _two_signed(snap, model, keydir)
    with write_lease(store, "a writer at work"):
        result = collect_garbage(store, grace_seconds=HOUR, now=_later())
    assert result.postponed_by == ["a writer at work"] and result.deleted_signatures == 0
    assert len(signature_ids(store, dead)) == 2


def test_signatures_left_without_a_manifest_go_once_past_the_grace(snap, model, keydir):
    store, live, dead = _two_signed(snap, model, keydir)
    store.delete_manifest(dead)  # what a collection from before signatures were collected left
    young = collect_garbage(store, grace_seconds=HOUR)
    assert young.deleted_signatures == 0 and len(signature_ids(store, dead)) == 2
    old = collect_garbage(store, grace_seconds=HOUR, now=_later())
    assert old.deleted_signatures == 2 and signature_ids(store, dead) == []
    # what is not a signature document of a root is not touched
    assert store.get_document(signature_key(live, load_signing_key(keydir / "alice.pem").id)) is not None


def test_a_signature_whose_root_came_back_meanwhile_stays(snap, model, keydir):
    """A root synced back by root alone (manifest young again) keeps its signatures."""
    store, live, dead = _two_signed(snap, model, keydir)
    data = store.get_manifest_bytes(dead)
    store.delete_manifest(dead)
    store.put_manifest(dead, data)  # written now: younger than the grace
    result = collect_garbage(store, grace_seconds=HOUR, now=time.time() + 60)
    assert result.deleted_signatures == 0 and len(signature_ids(store, dead)) == 2
