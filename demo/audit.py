"""The demo's audit chapter: the nightly drift audit on the penguins and on MiniLM's replicas.

The data: the Palmer penguins split at random into two halves. The halves, audited against each
other, do not drift. Then "tonight's" data is the second half with the Gentoo penguins 20 %
heavier: the nightly-drift-audit flow flags body_mass_g as a P1 warning (and draws its histogram
overlay); the same data on the next night is a warning two nights running, escalated to P0, and
the data now breaks the contract penguins@1 (Gentoo heavier than its 6300 g maximum): the run
fails, after writing its report, its MLflow run and its event.

The weights: MiniLM is served from the three clusters as ``models/minilm-serving``: us-east in
fp32 (the reference), eu-central converted to bf16, ap-south a copy where a bad write negated one
attention weight; and eu-central's model card was edited to another license. One audit of the
replicas and the cards finds the negated tensor by name, passes the bf16 replica within 1 ULP of
bf16, and flags eu-central's license.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

from demo._common import CLUSTERS
from demo.story import Story

SERVING = "models/minilm-serving"
#: the tensor a bad write negates on ap-south
NEGATED = "encoder.layer.0.attention.self.query.weight"
#: the species whose body mass drifts, and by how much
HEAVIER, FACTOR = "Gentoo", 1.2
#: model-card fields every cluster's card must have (MiniLM's README has these three)
CARD_FIELDS = ["license", "datasets", "intended_use"]
EDITED_LICENSE = "cc-by-nc-4.0"


def audit_folders(home: Path) -> tuple[Path, ...]:
    """What the audit chapter writes under ``home`` (besides the stores, the registry and MLflow)."""
    return (home / "audit",)


def penguin_tables(folder: Path, seed: int = 0) -> dict[str, Path]:
    """The reference half, the other half, and the other half with the drifted slice, as parquet."""
    import numpy as np
    from palmerpenguins import load_penguins

    from concord.lineage.data import write_parquet

    df = load_penguins()
    idx = np.random.default_rng(seed).permutation(len(df))
    reference, other = df.iloc[idx[: len(df) // 2]], df.iloc[idx[len(df) // 2 :]]
    drifted = other.copy()
    drifted.loc[drifted.species == HEAVIER, "body_mass_g"] *= FACTOR
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, table in (("reference", reference), ("other-half", other), ("tonight", drifted)):
        out[name] = folder / f"penguins-{name}.parquet"
        write_parquet(table, out[name])
    return out


def negated_copy(base: Path, out: Path) -> Path:
    """A copy of the checkpoint ``base`` with :data:`NEGATED` negated (a bad write)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(str(base / "model.safetensors"))
    tensors[NEGATED] = -tensors[NEGATED]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def bf16_copy(base: Path, out: Path) -> Path:
    """A copy of the checkpoint ``base`` with every fp32 tensor converted to bf16."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(str(base / "model.safetensors"))
    tensors = {k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def audit_story(home: Path, story: Story, stores: dict[str, str], base_folder: Path) -> None:
    from palmerpenguins import load_penguins

    from concord.audit.drift import data_drift
    from concord.audit.report import AuditReport
    from concord.lineage.contracts import infer_contract, save_contract
    from concord.lineage.data import read_table
    from concord.snapshots.snapshot import snapshot
    from concord.stores import open_store
    from concord_pipelines.flows.audit import nightly_drift_audit

    folder = home / "audit"
    for path in audit_folders(home):  # a re-run starts afresh (the registry and MLflow are the lineage chapter's)
        shutil.rmtree(path, ignore_errors=True)
    registry = str(home / "registry")
    plots = folder / "plots"
    today = datetime.now(timezone.utc).date()
    yesterday = today - timedelta(days=1)
    tables = penguin_tables(folder / "data")
    # the lineage chapter's contract (saving the same content again changes nothing)
    contract = infer_contract(load_penguins(), "penguins", 1, description="Palmer penguins, as first registered")
    save_contract(open_store(registry), contract)

    story.step("Audit two random halves of the penguins against each other")
    halves = AuditReport.assemble(drift=data_drift(read_table(tables["reference"]), read_table(tables["other-half"])))
    top = max(halves.data["columns"], key=lambda c: c["psi"] or 0.0)
    story.say(f"{halves.data['rows_reference']} vs {halves.data['rows_current']} rows; largest PSI {top['psi']:.3f} ({top['column']})")
    story.check(halves.severity == "ok" and halves.data["drift_share"] == 0.0, "no column drifts between two halves of one data set")
    story.done()

    common = dict(name="penguins-nightly", registry=registry, plots_dir=str(plots))
    story.step(f"Night of {yesterday}: tonight's penguins are the other half, with the {HEAVIER} penguins {FACTOR - 1:.0%} heavier")
    night1 = nightly_drift_audit(str(tables["reference"]), str(tables["tonight"]), night=yesterday, **common)
    by_col = {c["column"]: c for c in night1["columns"]}
    story.say(night1["verdict"])
    for col, png in night1["plots"].items():
        story.say(f"{col}: {Path(png).relative_to(home)} ({Path(png).stat().st_size // 1024} KiB)")
    story.say(f"MLflow run {night1['mlflow_run_id']}; event concord.drift.detected ({night1['priority']})")
    drifted = [c for c, v in by_col.items() if v["severity"] != "ok"]
    story.check(drifted == ["body_mass_g"] and night1["severity"] == "warning", "the audit flags body_mass_g, and only it, as a P1 warning")
    story.check(
        list(night1["plots"]) == ["body_mass_g"] and Path(night1["plots"]["body_mass_g"]).read_bytes()[:4] == b"\x89PNG",
        "a PNG overlay of body_mass_g was drawn (and logged to MLflow with the report)",
    )
    story.done()

    story.step(f"Night of {today}: the same data again, now checked against the contract {contract.ref} too")
    story.say("(Prefect logs the failing audit run as an ERROR on stderr: that red run is the point)")
    state = nightly_drift_audit(str(tables["reference"]), str(tables["tonight"]), night=today, contract=contract.ref, return_state=True, **common)
    night2 = _report(state)
    story.say(night2.get("verdict", "(no report)"))
    mass = {c["column"]: c for c in night2.get("columns", [])}.get("body_mass_g", {})
    failed = (night2.get("contract") or {}).get("failed", [])
    for f in failed:
        story.say(f"contract: {f['expectation']} [{f['column']}]: {f['details']}")
    story.check(state.is_failed() and night2.get("priority") == "P0", "the run fails: P0")
    story.check(mass.get("severity") == "critical" and mass.get("escalated") is True, "body_mass_g, a warning two nights running, is escalated to P0")
    story.check(
        [(f["column"], f["expectation"]) for f in failed] == [("body_mass_g", "expect_column_values_to_be_between")],
        f"the heavier {HEAVIER} penguins break {contract.ref}: body_mass_g over its maximum",
    )
    story.done()

    us, eu, ap = (stores[c] for c in CLUSTERS)
    story.step(
        f"Serve MiniLM as {SERVING}: us-east in fp32; eu-central converted to bf16, and someone edited its card's "
        f"license to {EDITED_LICENSE}; ap-south a copy where a bad write negated {NEGATED}"
    )
    bf16 = bf16_copy(base_folder, folder / "minilm-bf16")
    readme = bf16 / "README.md"
    readme.write_text(readme.read_text().replace("license: apache-2.0", f"license: {EDITED_LICENSE}", 1))
    served = {us: base_folder, eu: bf16, ap: negated_copy(base_folder, folder / "minilm-bad-write")}
    roots = {}
    for store, src in served.items():
        snap = snapshot(str(src), open_store(store), ref=SERVING, message="serving copy")
        roots[store] = snap.root
        story.say(f"{Path(store).name:<11} {snap.root[:12]}  {snap.bytes / 2**20:.1f} MiB")
    story.check(len(set(roots.values())) == 3, "three different snapshots: the Merkle roots differ")
    story.done()

    story.step("Audit the replicas and the model cards across the clusters (the flow, as every night)")
    story.say(f"(the same from a terminal: concord audit replicas --ref {SERVING} STORE...; concord audit cards ...)")
    story.say("(Prefect logs this failing audit run as an ERROR on stderr too)")
    state = nightly_drift_audit(ref=SERVING, stores=[us, eu, ap], card_fields=CARD_FIELDS, name="minilm-serving", registry=registry, return_state=True)
    audited = _report(state)
    replicas, cards = audited.get("replicas"), audited.get("cards")
    by = {r["cluster"]: r for r in (replicas or {}).get("replicas", [])}
    for cluster, r in by.items():
        worst = r["worst"][0] if r.get("worst") else None
        extra = f"; worst {worst['tensor']}: max {worst['max_ulp']} ULP" if worst else ""
        story.say(f"{cluster:<11} {r['severity']:<8} {r['finding']}{extra}")
    for c in (cards or {}).get("clusters", []):
        story.say(f"card {c['cluster']:<11} {c['severity']:<8} {c['finding']}")
    bad = by.get("ap-south", {})
    story.check(
        bad.get("severity") == "critical" and bad.get("tensors_failed") == 1 and bad["worst"][0]["tensor"] == NEGATED,
        f"ap-south's negated tensor is found by name: {NEGATED}",
    )
    bf16 = by.get("eu-central", {})
    story.check(
        bf16.get("tensors_failed") == 0 and bf16.get("tensors_compared", 0) > 0
        and all(t["ok"] and t["max_ulp"] is not None and t["max_ulp"] <= 1 for t in bf16.get("worst", [])),
        f"eu-central's bf16 replica passes: all {bf16.get('tensors_compared')} tensors within 1 ULP of bf16 "
        "(only its edited README differs: a P1 warning)",
    )
    flagged = {c["cluster"]: c for c in (cards or {}).get("clusters", [])}
    story.check(
        [d["field"] for d in flagged.get("eu-central", {}).get("differing", [])] == ["license"]
        and flagged["eu-central"]["severity"] == "critical"
        and all(flagged[c]["severity"] == "ok" for c in ("us-east", "ap-south")),
        f"eu-central's card is flagged for its license ({EDITED_LICENSE}); the others agree with us-east",
    )
    story.check(state.is_failed(), "the audit run fails: P0")
    story.done()


def _report(state) -> dict:
    """What an audit run returned, or, for a failed run, the report its failure carries."""
    from concord_pipelines.flows.audit import AuditFailed

    try:
        return state.result()
    except AuditFailed as exc:
        return exc.report
