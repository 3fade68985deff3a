"""End to end on real processes: what ``make serve`` starts runs deployments from ``prefect.yaml``,
keeps their schedules, and hears new checkpoints; ``make stop`` ends all of it."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.e2e


def _checkpoint(path, seed: int = 0):
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    path.mkdir(parents=True)
    save_file({"embed.weight": torch.randn(256, 64, generator=g), "head.weight": torch.randn(64, 64, generator=g)},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    return path


def test_a_manual_run_with_parameters_snapshots_into_the_store(served, tmp_path):
    from prefect.deployments import run_deployment

    from concord.stores.local import LocalDirStore

    source = _checkpoint(tmp_path / "step-10")
    store = tmp_path / "stores" / "us-east"
    run = run_deployment(
        "snapshot-checkpoint/minilm-step-100-into-us-east",
        parameters={"source": str(source), "store": str(store), "ref": "models/tiny", "chunk_size_mib": 1},
        timeout=180,
    )
    assert run.state is not None and run.state.is_completed(), f"flow run ended {run.state}"
    ref = LocalDirStore(store).read_ref("models/tiny")
    assert ref is not None, "the run completed but the store holds no ref models/tiny"
    assert LocalDirStore(store).has_manifest(ref.root)


def test_the_nightly_audit_is_scheduled(client):
    deployment = client.read_deployment_by_name("nightly-drift-audit/penguins-and-minilm-nightly")
    crons = [getattr(s.schedule, "cron", None) for s in deployment.schedules if s.active]
    assert "0 2 * * *" in crons


def test_every_deployment_is_on_the_process_pool(client):
    from .test_defaults import AFTER, AT_ONCE

    deployments = client.read_deployments()
    assert len(deployments) >= 10
    pools = {f"{client.read_flow(d.flow_id).name}/{d.name}": d.work_pool_name for d in deployments}
    assert {pools[n] for n in AT_ONCE + AFTER} == {"concord-process"}  # the pipelines; serving nodes have a pool of their own
    assert set(pools.values()) <= {"concord-process", "concord-serving"}, pools


def test_the_automations_and_the_triggers_are_on_the_server(client):
    names = {a.name for a in client.read_automations()}
    assert {"concord: P0 drift", "concord: restore drill failed", "concord: replication failed"} <= names
    assert "snapshot-and-replicate on new checkpoint" in names  # a deployment's trigger is an automation too


def _wait_for(what: str, look, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        found = look()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def dropped(served):
    """A completed checkpoint dropped into the watched folder as data/checkpoints/<model>/<step>/,
    once its event reached the server."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter

    ckpt = _checkpoint(served.watched / "tiny" / "step-20", seed=1)
    (ckpt / "COMPLETE").write_text("")

    with get_client(sync_client=True) as client:

        def announced():
            # a filter's time window ends when it is built: build it anew on every look
            flt = EventFilter(event=EventNameFilter(name=["concord.checkpoint.created"]))
            return [e for e in client.read_events(filter=flt, limit=50).events if e.payload.get("name") == "step-20"]

        event = _wait_for("the watcher's event reached the server", announced, 60)[0]
    assert (event.payload["path"], event.payload["model"]) == (str(ckpt), "tiny")
    return ckpt


def _finished_runs(client, deployment_name: str, timeout: float, **parameters):
    """The finished runs of a deployment (those with these parameters, if any are given)."""
    from prefect.client.schemas.filters import FlowRunFilter

    deployment = client.read_deployment_by_name(deployment_name)

    def finished():
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(deployment_id={"any_": [deployment.id]}))
        return [r for r in runs if r.state is not None and r.state.is_final()
                and all(r.parameters.get(k) == v for k, v in parameters.items())]

    return _wait_for(f"a triggered {deployment_name} run finished", finished, timeout)


def test_a_completed_checkpoint_is_snapshotted_and_replicated_by_itself(served, client, dropped):
    from concord.stores.local import LocalDirStore

    runs = _finished_runs(client, "snapshot-and-replicate/new-checkpoint", 180, source=str(dropped))
    assert runs[0].state.is_completed(), f"the triggered run ended {runs[0].state}"
    assert runs[0].parameters["ref"] == "models/tiny"  # the model's folder names the ref
    stores = served.project_dir / "data" / "stores"
    roots = {name: LocalDirStore(stores / name).read_ref("models/tiny") for name in ("us-east", "eu-central", "ap-south")}
    assert all(ref is not None for ref in roots.values()), roots
    assert len({ref.root for ref in roots.values()}) == 1


def test_a_completed_checkpoint_is_tiered_hot_warm_and_cold_by_itself(served, client, dropped):
    from concord.tiering import load_policy, tier_status

    # the hourly sweep runs of the same deployment take no checkpoint_dir: look for the triggered one
    runs = _finished_runs(client, "tier-checkpoints/hourly-sweep", 180, checkpoint_dir=str(dropped))
    assert runs[0].state.is_completed(), f"the triggered run ended {runs[0].state}"
    assert runs[0].parameters["name"] == "tiny-step-20"  # <model>-<step>: two models' step-20 stay apart

    status = tier_status(load_policy(served.tier_policy))
    assert status["violations"] == [], status["violations"]
    tiers = served.project_dir / "data" / "tiers"
    assert status["stores"] == {t: str(tiers / t) for t in ("hot", "warm", "cold")}
    rows = {c["name"]: c for c in status["checkpoints"]}
    assert set(rows) >= {"tiny-step-20", "minilm-step-0", "minilm-step-100"}, rows  # the two seeded, and this one
    row = rows["tiny-step-20"]
    assert row["step"] == 20
    assert row["copies"] == 3
    for t in ("hot", "warm", "cold"):
        assert row["tiers"][t]["present"], (t, row["tiers"][t])
        assert row["tiers"][t]["verified"], (t, row["tiers"][t])


def _prefect_cli(served, *args: str) -> str:
    """Prefect's own CLI against the served API, as docs/operations.md tells a person to run it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_PROFILE"}
    env.update(PREFECT_API_URL=served.api_url, COLUMNS="250")
    prefect = str(Path(sys.executable).with_name("prefect"))
    done = subprocess.run([prefect, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_what_the_operations_guide_shows_a_person_is_there(served):
    """docs/operations.md: the UI answers, `prefect deployment ls` lists every deployment of
    prefect.yaml, `inspect` shows the schedules with their time zone, `prefect automation ls` the
    automations."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import yaml
    from prefect.flows import load_flow_from_entrypoint

    with urllib.request.urlopen(served.api_url.removesuffix("/api") + "/", timeout=30) as page:
        html = page.read().decode()
    assert page.status == 200 and "<title>Prefect" in html, html[:500]

    # the commands run at once (each pays Prefect's import), their outputs checked in turn below
    schedules = (("nightly-drift-audit/penguins-and-minilm-nightly", "0 2 * * *"), ("restore-drill/every-tier-weekly", "0 3 * * 0"),
                 ("tier-checkpoints/hourly-sweep", "0 * * * *"))
    commands = [("deployment", "ls", "-o", "json"), *(("deployment", "inspect", name) for name, _ in schedules),
                ("automation", "ls")]
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        outputs = dict(zip(commands, pool.map(lambda args: _prefect_cli(served, *args), commands)))

    declared = yaml.safe_load((served.project_dir / "prefect.yaml").read_text())["deployments"]
    listed = json.loads(outputs[commands[0]])
    missing = {d["entrypoint"] for d in declared} - {d["entrypoint"] for d in listed}
    assert not missing, f"declared in prefect.yaml, not listed by `prefect deployment ls`: {sorted(missing)}"
    assert all(d["description"] for d in listed), [d["entrypoint"] for d in listed if not d["description"]]
    assert {load_flow_from_entrypoint(d["entrypoint"]).name for d in declared} >= {"lora-federation", "promote"}

    # (not `-o json`: prefect 3.9's JSON output fails on a deployment that has triggers)
    for name, cron in schedules:
        shown = outputs[("deployment", "inspect", name)]
        assert f"'cron': '{cron}'" in shown and "'timezone': 'UTC'" in shown and "'active': True" in shown, shown

    automations = outputs[("automation", "ls")]
    for name in ("concord: P0 drift", "concord: restore drill failed", "concord: replication failed",
                 "concord: crash zombie flow runs",
                 "snapshot-and-replicate on new checkpoint", "tier-checkpoints on new checkpoint"):
        assert name in automations, f"{name!r} not in `prefect automation ls`:\n{automations}"
