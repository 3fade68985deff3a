"""The demo's tiering chapter: a LoRA run's checkpoints kept hot, warm and cold.

The LoRA run of :mod:`demo.training` writes a checkpoint every 10 steps; each checkpoint is handed
to the tier-checkpoints flow as soon as it is complete, while training goes on, under the policy
in ``$CONCORD_HOME/tiering/policy.yaml``: hot is a local folder keeping the newest 2, warm is S3 in
STANDARD_IA keeping the newest 3, cold is S3 in GLACIER keeping all of them. S3 is a real
``moto_server`` on 127.0.0.1 (data in memory), started for the chapter and stopped at its end.

Checked: after every checkpoint, no checkpoint lacks a copy the rules demand, and each tier holds
exactly what the policy says; every tier stores the frozen base once, however many checkpoints
share it; the oldest checkpoint, left only in cold, comes back through GLACIER restore requests
byte for byte; the restore drill meets every tier's RTO and RPO.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from concord.localservers import MotoServer, aws_environment
from demo._common import human as _human
from demo._common import quiet_training, same_files
from demo.story import Story
from demo.training import LORA_RANK, MARKER, STEPS, TrainingRun

NAMESPACE = "minilm-lora"
TIERS = ("hot", "warm", "cold")
WARM_BUCKET = "concord-warm"
COLD_BUCKET = "concord-cold"
HOT_KEEP, WARM_KEEP = 2, 3


def tiering_folders(home: Path) -> tuple[Path, ...]:
    """What the tiering chapter writes under ``home`` (S3 lives in the server's memory)."""
    return (home / "tiering",)


def write_policy(folder: Path) -> Path:
    """The chapter's tier policy, as a YAML file the reader can open; its first line says the
    demo wrote it (:data:`~concord.tiering.policy.DEMO_POLICY_MARK`), so an error about its S3
    tiers, once the demo's moto_server is gone, says whose they were."""
    from concord.tiering.policy import DEMO_POLICY_MARK

    text = f"""\
{DEMO_POLICY_MARK} for its tiering chapter. Warm and cold are buckets on the demo's own S3,
# a moto_server on 127.0.0.1 that stops when the demo ends: `concord tier` commands on this file
# work only while the demo runs. Copy it and point warm and cold at an S3 you run to keep one.
# The demo's tier policy: the checkpoints of its LoRA run kept hot, warm and cold (docs/tiering.md).
namespace: {NAMESPACE}
hot:                                # local disk: the newest {HOT_KEEP}, restored in seconds
  store: {json.dumps(str(folder / "hot"))}
  keep: {HOT_KEEP}
  rto: 1m
warm:                               # S3 Standard-IA: the newest {WARM_KEEP}
  store: s3://{WARM_BUCKET}/ckpt
  storage_class: STANDARD_IA
  keep: {WARM_KEEP}
  rto: 10m
cold:                               # S3 Glacier: every checkpoint; reading needs a restore first
  store: s3://{COLD_BUCKET}/ckpt
  storage_class: GLACIER
  rto: 12h
rpo: 1h                             # each tier's newest checkpoint is at most this old
gc_grace: 0s                        # a demo: collect unreferenced chunks at once
ready: {{marker: {MARKER}, settle: 0s}}   # a checkpoint is taken once its marker is written
restore: {{days: 1, tier: Expedited, timeout: 5m, poll: 0.5s}}   # S3 on this machine restores at once; AWS takes 1-5 min (Expedited)
"""
    path = folder / "policy.yaml"
    path.write_text(text)
    return path


def tiering_story(home: Path, story: Story, base_folder: Path) -> None:
    folder = home / "tiering"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with quiet_training():
        # the server starts and the model loads while the policy is written
        with MotoServer(folder / "moto_server.log") as s3, TrainingRun(base_folder, folder / "run") as training:
            _tiering(folder, story, s3, training)


def _tiering(folder: Path, story: Story, s3: MotoServer, training: TrainingRun) -> None:
    from concord.snapshots.refs import load_manifest
    from concord.stores.base import ARCHIVED
    from concord.tiering import load_policy, stored_bytes
    from concord_pipelines.flows.tiering import restore_checkpoint_flow, restore_drill, tier_checkpoints

    story.step(f"Tier policy for a LoRA run's checkpoints, in {folder / 'policy.yaml'}; S3 for warm and cold is a moto_server")
    policy_path = write_policy(folder)
    endpoint = s3.wait()
    s3.create_buckets(WARM_BUCKET, COLD_BUCKET)
    with aws_environment(endpoint):
        policy = load_policy(str(policy_path))
        for spec in policy.tiers:
            shown = {k: v for k, v in spec.to_dict().items() if k != "store"}
            story.say(f"{spec.tier:<5} {spec.store}  {' '.join(f'{k}={v}' for k, v in shown.items())}")
        story.say(
            f"S3 endpoint {endpoint} (buckets {WARM_BUCKET}, {COLD_BUCKET}); rpo {policy.to_dict().get('rpo')}, "
            f"marker {policy.marker}"
        )
        story.check(
            policy.hot.keep == HOT_KEEP and policy.warm.keep == WARM_KEEP and policy.cold.archive and not policy.problems(),
            f"the policy passes the 3-2-1 rules: hot keeps {HOT_KEEP}, warm {WARM_KEEP}, cold (GLACIER) every checkpoint",
        )
        story.done()

        run_dir = training.run_dir
        written: list[str] = []
        last: dict = {}
        story.step(
            f"LoRA-train MiniLM (r={LORA_RANK} on query and value) for {STEPS} steps; the tier-checkpoints flow "
            "tiers each checkpoint once its COMPLETE marker is written, while training goes on"
        )

        def tier_one(path: Path, step: int, loss: float) -> None:
            name = path.name
            written.append(name)
            run = tier_checkpoints(str(policy_path), checkpoint_dir=str(path), name=name, step=step)
            status = last["status"] = run["status"]  # tier_status() as the flow read it after its sweep
            held = {t: sorted(c["name"] for c in status["checkpoints"] if c["tiers"][t]["present"]) for t in TIERS}
            want = {"hot": written[-HOT_KEEP:], "warm": written[-WARM_KEEP:], "cold": written}
            short = {t: " ".join(n[-2:] for n in held[t]) or "-" for t in held}
            story.say(f"{name}  loss {loss:.4f}  hot: {short['hot']:<6} warm: {short['warm']:<9} cold: {short['cold']}")
            for v in status["violations"]:
                story.say(f"  violation: {v}")
            story.check(
                not status["violations"] and held == {t: sorted(n) for t, n in want.items()},
                f"{name}: no copy-rule violation; hot holds the newest {min(HOT_KEEP, len(written))}, "
                f"warm the newest {min(WARM_KEEP, len(written))}, cold all {len(written)}",
            )

        for path, step, loss in training:
            tier_one(path, step, loss)
        story.done()

        story.step("Bytes each tier stores, against plain copies of the checkpoints it keeps")
        status = last["status"]
        stores = {spec.tier: spec.open() for spec in policy.tiers}
        roots = {r["name"]: r["root"] for r in status["checkpoints"]}
        size = {r["name"]: r["bytes"] for r in status["checkpoints"]}
        base_bytes = (training.base_folder / "model.safetensors").stat().st_size
        exact = True
        total_stored = total_plain = 0
        for t, store in stores.items():
            names = [r["name"] for r in status["checkpoints"] if r["tiers"][t]["present"]]
            chunks: dict[str, int] = {}
            for n in names:
                chunks.update(load_manifest(store, roots[n]).chunk_lengths())
            stored, plain = stored_bytes(store), sum(size[n] for n in names)
            exact &= stored == sum(chunks.values())
            total_stored, total_plain = total_stored + stored, total_plain + plain
            story.say(
                f"{t:<5} {len(names)} checkpoint(s): stores {_human(stored):>9}; plain copies {_human(plain):>9}  "
                f"({100 * (1 - stored / plain):.0f}% saved)"
            )
        story.say(
            f"all   {_human(total_stored)} against {_human(total_plain)} of plain copies "
            f"({100 * (1 - total_stored / total_plain):.0f}% saved); each checkpoint is {_human(size[written[-1]])}, "
            f"{_human(base_bytes)} of it the frozen base"
        )
        claim = "every tier stores exactly the chunks of the checkpoints it keeps, each once: the frozen base once per tier"
        story.check(exact, claim)
        story.done()

        oldest = written[0]
        story.step(f"Restore {oldest}, now only in cold (GLACIER): restore requests, wait, then read back")
        cold = stores["cold"]
        ids = list(load_manifest(cold, roots[oldest]).chunk_lengths())
        states = cold.chunk_states(ids)
        story.say(f"{len(ids)} chunks in cold; states before: {_counts(states)}")
        out = folder / "restored" / oldest
        shutil.rmtree(out, ignore_errors=True)
        r = restore_checkpoint_flow(str(policy_path), oldest, str(out), tier="cold")
        story.say(
            f"from {r['tier']} ({r['store']}): {r['restore_requests']} restore requests, waited {r['wait_seconds']:.1f} s; "
            f"{r['files']} files, {_human(r['bytes'])} in {r['seconds']:.1f} s"
        )
        story.check(
            all(s == ARCHIVED for s in states.values()) and r["tier"] == "cold" and r["restore_requests"] == len(ids),
            f"the chunks were archived, and one GLACIER restore request per chunk ({len(ids)}) brought them back",
        )
        n, differ = same_files(run_dir / oldest, out)
        claim = f"all {n} files of {oldest} are byte-identical to the checkpoint written"
        story.check(n == r["files"] and not differ, claim + (f" (differ: {differ})" if differ else ""))
        story.done()

        story.step("Restore drill: restore a checkpoint from every tier, measure RTO and RPO against the policy")
        d = restore_drill(str(policy_path), sample=1)
        rows = {t: d["tiers"].get(t) or {} for t in TIERS}
        for t, row in rows.items():
            story.say(
                f"{t:<5} RTO {_secs(row.get('rto_seconds'))} (objective {_secs(row.get('rto_objective'))})  "
                f"RPO {_secs(row.get('rpo_seconds'))} (objective {_secs(row.get('rpo_objective'))})  "
                + ("ok" if row.get("ok") else "MISSED")
            )
        for f in d.get("findings") or []:
            story.say(f"finding: {f}")
        story.check(d["ok"] and all(row.get("ok") for row in rows.values()), "the drill meets every tier's RTO and RPO")
        story.done()
        for store in stores.values():
            store.close()


def _counts(states: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 3600:
        return f"{x / 3600:g} h"
    if x >= 60:
        return f"{x / 60:g} min"
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"
