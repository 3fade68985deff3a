"""The demo's federation chapter: LoRA federation for tenant ``acme``.

Three PEFT LoRA adapters on MiniLM (different ranks and alphas, randomised as if each cluster had
trained its own), one per cluster under ``acme/adapter-<cluster>``; one exact federation round
aggregates them, replicates the result to every cluster and appends it to acme's hash-chained
ledger; peft loads the result, whose merged weights equal the weighted average of the clients'
merged weights; the ledger verifies, and an edited round in a copy of the store is caught.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from demo._common import CLUSTERS, quiet_training
from demo._common import human as _human
from demo.story import Story

TENANT = "acme"
#: each cluster's adapter: (LoRA rank, alpha, seed of its "training")
ADAPTERS = {"us-east": (8, 16, 11), "eu-central": (4, 8, 12), "ap-south": (8, 32, 13)}
#: the federation round's weights, one per cluster (normalised)
FED_WEIGHTS = (2.0, 1.0, 1.0)


def federation_folders(home: Path) -> tuple[Path, ...]:
    """What the federation part of the demo writes under ``home`` (besides the stores)."""
    return (home / "adapters", home / "federation")


def make_adapter(base_model, out: Path, r: int, alpha: int, seed: int) -> Path:
    """A PEFT LoRA adapter (query and value of every layer) on a copy of ``base_model``, saved to
    ``out``. Its B factors are randomised from ``seed``, a stand-in for a cluster's training."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)  # the A factors' initialisation draws from the global generator
    model = get_peft_model(copy.deepcopy(base_model), LoraConfig(target_modules=["query", "value"], r=r, lora_alpha=alpha))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    model.save_pretrained(str(out))
    return out


def merged_weights(base_model, adapter: Path) -> dict:
    """The attention weights of ``base_model`` with ``adapter`` loaded by peft and merged in (float64)."""
    import copy

    from peft import PeftModel

    merged = PeftModel.from_pretrained(copy.deepcopy(base_model), str(adapter)).merge_and_unload()
    return {k: v.detach().double() for k, v in merged.state_dict().items() if k.endswith((".query.weight", ".value.weight"))}


def federation_story(home: Path, story: Story, stores: dict[str, str], base_folder: Path) -> None:
    with quiet_training():
        _federation(home, story, stores, base_folder)


def _federation(home: Path, story: Story, stores: dict[str, str], base_folder: Path) -> None:
    from transformers import AutoModel

    from concord.federation.ledger import round_key, verify_ledger
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore
    from concord.stores import open_store
    from concord_pipelines.flows.federation import lora_federation
    from concord_pipelines.flows.snapshot import snapshot_checkpoint

    story.step(f"Each cluster trains a LoRA adapter on MiniLM for tenant {TENANT} and snapshots it as {TENANT}/adapter-<cluster>")
    base_model = AutoModel.from_pretrained(str(base_folder)).eval()
    folders = {}
    for cluster, (r, alpha, seed) in ADAPTERS.items():
        folders[cluster] = make_adapter(base_model, home / "adapters" / cluster, r, alpha, seed)
        snap = snapshot_checkpoint(str(folders[cluster]), stores[cluster], f"{TENANT}/adapter-{cluster}", message=f"LoRA r={r} trained on {cluster}")
        story.say(f"{cluster:<11} rank {r:>2}, alpha {alpha:>2}: {snap['tensors']} tensors, {_human(snap['bytes'])}, root {snap['root'][:12]}")
    only_own = all(
        (open_store(stores[c]).read_ref(f"{TENANT}/adapter-{other}") is not None) == (c == other) for c in CLUSTERS for other in CLUSTERS
    )
    story.check(only_own, "each cluster holds its own adapter and no other")
    story.done()

    weights = [w / sum(FED_WEIGHTS) for w in FED_WEIGHTS]
    shown = ", ".join(f"{c} {w:.2f}" for c, w in zip(CLUSTERS, weights))
    story.step(f"Federation round for {TENANT}: exact aggregation ({shown}), replicated to every cluster, recorded in the ledger")
    r = lora_federation(TENANT, [stores[c] for c in CLUSTERS], [f"adapter-{c}" for c in CLUSTERS], method="exact", weights=list(FED_WEIGHTS))
    for c in r["clients"]:
        story.say(
            f"{c['adapter']:<20} weight {c['weight']:.2f}  update norm {c['norm']:.3f}  distance {c['distance']:.3f}  "
            f"{'accepted' if c['accepted'] else 'REJECTED'}"
        )
    story.say(f"result {r['ref']} {r['root'][:12]}: rank {r['rank']} from client ranks {r['client_ranks']}, relative error {r['relative_error']:.1e}")
    for p in r["replicas"]:
        story.say(
            f"{Path(p['store']).name:<11} {'snapshot' if p is r['replicas'][0] else 'replica '}: {p['chunks_sent']} chunks, {_human(p['bytes_sent'])} written"
        )
    lin = r["lineage"] or {}
    story.say(
        f"ledger round {r['round']}, hash {r['hash'][:16]}…; lineage: "
        + (f"{lin['name']} version {lin['version']}" if "version" in lin else str(lin.get("error")))
    )
    story.check(
        all(open_store(s).read_ref(f"{TENANT}/federated").root == r["root"] for s in stores.values()),
        f"every cluster's {TENANT}/federated points at {r['root'][:12]}",
    )
    story.check(r["round"] == 1 and r["ledger_report"]["ok"], f"the round is the first of {TENANT}'s ledger, which verifies")
    story.done()

    story.step("Restore the result from ap-south, load it with peft and merge it into MiniLM")
    result_dir = home / "federation" / f"{TENANT}-federated-from-ap-south"
    ap = open_store(stores["ap-south"])
    restore(ap, load_manifest(ap, r["root"]), result_dir)
    fed = merged_weights(base_model, result_dir)
    clients = [merged_weights(base_model, folders[c]) for c in CLUSTERS]
    base = {k: v.detach().double() for k, v in base_model.state_dict().items() if k in fed}
    worst_abs = worst_rel = 0.0
    for k in fed:
        average = sum(w * c[k] for w, c in zip(weights, clients))
        update = average - base[k]
        worst_abs = max(worst_abs, float((fed[k] - average).abs().max()))
        worst_rel = max(worst_rel, float((fed[k] - average).norm() / update.norm()))
    story.say(f"{len(fed)} attention weights merged; largest difference from the clients' weighted average {worst_abs:.1e}")
    story.say(
        f"(the updates themselves are of order {max(float((c[k] - base[k]).abs().max()) for c in clients for k in fed):.1e}; "
        f"relative deviation {worst_rel:.1e})"
    )
    story.check(
        set(fed) == set(clients[0]) and worst_abs < 1e-6 and worst_rel < 1e-4,
        "the merged result equals the weighted average of the clients' merged weights (to float32 rounding)",
    )
    story.done()

    story.step(f"Verify {TENANT}'s ledger; then edit round 1 in a copy of us-east's ledger and verify the copy")
    us = stores["us-east"]
    report = verify_ledger(open_store(us), TENANT)
    story.say(f"us-east: {report.rounds} round(s), head {report.head[:16] if report.head else '(none)'}…: {'ok' if report.ok else 'TAMPERED'}")
    copy_dir = home / "federation" / "us-east-ledger-copy"
    for part in ("ledger", "refs"):
        shutil.copytree(Path(us) / part, copy_dir / part)
    tampered = copy_dir / round_key(TENANT, 1)
    doc = json.loads(tampered.read_text())
    doc["weights"] = [0.1, 0.8, 0.1]  # someone rewrites history in eu-central's favour
    tampered.write_text(json.dumps(doc, indent=1))
    caught = verify_ledger(open_store(str(copy_dir)), TENANT)
    for problem in caught.problems:
        story.say(f"copy: {problem}")
    story.check(report.ok and report.rounds == 1 and report.head == r["hash"], f"{TENANT}'s ledger in us-east verifies")
    story.check(not caught.ok and any("round 1: edited" in p for p in caught.problems), "the edited round is caught in the copy")
    story.check(verify_ledger(open_store(us), TENANT).ok, "the real ledger is untouched")
    story.done()
