"""The demo's lineage chapter, in the MLflow database it shares with ``make serve`` (``data/mlflow.db``,
or ``MLFLOW_TRACKING_URI``), under a model name of its own (``minilm-demo``: the served
deployments' ``minilm`` stays theirs).

Register the Palmer penguins as a data snapshot, infer and save the schema contract ``penguins@1``
and validate the data against it; register the base model and the fine-tune as two versions
of ``minilm-demo`` (the second derives from the first) with that data and contract; see a replication record the
clusters holding version 2; promote version 1 to ``champion`` and download ``models:/minilm-demo@champion``
with MLflow's own client (the weights, byte for byte); watch the gate refuse a version
whose contract ``penguins@2`` tightens a bound; read the lineage back and draw it (PNG and
Mermaid under ``$CONCORD_HOME/lineage``).
"""

from __future__ import annotations

from pathlib import Path

from demo._common import CLUSTERS, REF, model_folder
from demo._common import human as _human
from demo.story import Story

#: the demo's registered model; a re-run adds versions to it
MODEL = "minilm-demo"
DATA = "penguins"


def lineage_folders(home: Path) -> tuple[Path, ...]:
    """What the lineage part of the demo writes under ``home`` (besides the database)."""
    return (home / "datasets", home / "registry", home / "lineage", home / "mlflow-artifacts", home / "downloads")


def lineage_story(home: Path, story: Story, stores: dict[str, str], base_root: str, tuned_root: str) -> None:
    import dataclasses

    from palmerpenguins import load_penguins

    from concord.errors import PromotionRefused
    from concord.lineage import Lineage
    from concord.lineage.contracts import compatible, infer_contract, save_contract
    from concord.lineage.data import write_parquet
    from concord.lineage.graph import render_png, to_mermaid
    from concord.stores import open_store
    from concord_pipelines.flows.lineage import (
        describe_checks,
        promote_model,
        register_data_snapshot,
        register_model_version,
        validate_contract,
    )
    from concord_pipelines.flows.replicate import replicate_snapshot

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

    story.step(f"Register the base model as a version of {MODEL}, with the data snapshot and {v1.ref}")
    common = dict(store=us, data_snapshot=f"data/{DATA}", contract=v1.ref, contracts_store=registry)
    base = register_model_version(MODEL, ref=base_root, holders=[eu, ap], description="all-MiniLM-L6-v2 from PyPI", **common)
    story.say(f"{MODEL}/{base['version']}: source {base['source']}")
    story.say("held by " + ", ".join(Path(h["store"]).name for h in base["held_by"]))
    story.check(base["root"] == base_root and len(base["held_by"]) == 3, f"{MODEL}/{base['version']} points at the base snapshot, held by all 3 clusters")
    story.done()

    story.step(f"Register the fine-tune as the next version, derived from {MODEL}/{base['version']}")
    tuned = register_model_version(
        MODEL, ref=tuned_root, parents=[f"{MODEL}/{base['version']}"], description="layer-5 attention fine-tune", **common
    )
    story.say(f"{MODEL}/{tuned['version']}: root {tuned['root'][:16]}…, parents {', '.join(tuned['parents'])}")
    story.say("held by " + ", ".join(Path(h["store"]).name for h in tuned["held_by"]) + " (registered from us-east only)")
    story.check(
        int(tuned["version"]) == int(base["version"]) + 1 and tuned["parents"] == [f"{MODEL}/{base['version']}"],
        "the fine-tune's version records its parent",
    )
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

    story.step(f"Download {MODEL}@champion with MLflow's own client: models:/ gives the weights, checked")
    downloaded = download_champion(lineage.tracking_uri, home / "downloads" / f"{MODEL}-champion")
    story.say(f"$ python -c 'import mlflow; mlflow.artifacts.download_artifacts(\"models:/{MODEL}@champion\", dst_path=\"D\")'")
    story.say(f"{len(downloaded)} files, {_human(sum(len(b) for b in downloaded.values()))}, into {home / 'downloads' / f'{MODEL}-champion'}")
    story.check(
        downloaded == files_of(model_folder()),
        "the files are the base checkpoint's, byte for byte (restored from the nearest cluster, every chunk verified)",
    )
    story.done()

    story.step(f"Tighten the contract: {DATA}@2 lowers body_mass_g's max to 6000 g; a version under it is refused")
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


def download_champion(tracking_uri: str, dst: Path) -> dict[str, bytes]:
    """``models:/minilm-demo@champion`` downloaded into ``dst`` by MLflow's own client (through
    Concord's artifact repository for the version's ``concord://`` source): path → bytes."""
    import os

    import mlflow

    before = os.environ.get("MLFLOW_REGISTRY_URI")
    mlflow.set_registry_uri(tracking_uri)  # the registry models:/ is resolved in (also set in the environment)
    try:
        got = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}@champion", dst_path=str(dst)))
    finally:
        mlflow.set_registry_uri(before)
        if before is None:
            os.environ.pop("MLFLOW_REGISTRY_URI", None)
    return files_of(got)


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path there."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
