"""Automations and deployment triggers on a real temporary Prefect server.

``python -m concord_pipelines.deployments.automations --apply`` run twice leaves each automation exactly once and
readable by name; a notification block given by name is resolved; the triggers of prefect.yaml
are accepted by the server as the automations ``prefect deploy`` creates (for local and S3
checkpoints); a checkpoint event about an S3 prefix starts snapshot-and-replicate, which takes
the checkpoint in, or refuses a malformed payload naming the event; lora-federation's schedule is
declared inactive; a P0 drift event fires its automation; a tier-checkpoints run with malformed
parameters fails before any task runs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
import uuid
from pathlib import Path

import pytest
import yaml

from concord_pipelines.deployments import automations as auto

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def _ours(client) -> dict[str, list]:
    return {r.name: client.read_automations_by_name(r.name) for r in auto.RULES}


def _clear(client) -> None:
    for found in [*_ours(client).values(), client.read_automations_by_name(auto.ZOMBIE)]:
        for a in found:
            client.delete_automation(a.id)


def test_apply_twice_creates_each_automation_once(prefect_client, capsys):
    _clear(prefect_client)
    assert auto.main(["--apply"]) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["name"], x["action"]) for x in first] == [(r.name, "created") for r in auto.RULES] + [(auto.ZOMBIE, "created")]

    assert auto.main(["--apply"]) == 0
    second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["name"], x["action"], x["id"]) for x in second] == [(x["name"], "updated", x["id"]) for x in first]

    for rule, found in zip(auto.RULES, _ours(prefect_client).values()):
        (a,) = found
        assert a.enabled and a.description == auto.described(rule, False)
        assert a.trigger.expect == {rule.event} and dict(a.trigger.match.root) == rule.match
        assert [x.type for x in a.actions] == ["do-nothing"]


def test_apply_removes_duplicates_and_switches_to_a_notification_block(prefect_client, capsys):
    from prefect.blocks.notifications import SlackWebhook

    _clear(prefect_client)
    rule = auto.RULES[1]
    for _ in range(2):  # two copies of one name, as a hand-made duplicate would leave
        prefect_client.create_automation(auto.build(rule))
    block_id = SlackWebhook(url="http://127.0.0.1:9/hook").save(f"concord-test-{uuid.uuid4().hex[:8]}")
    name = next(b.name for b in prefect_client.read_block_documents() if b.id == block_id)

    assert auto.main(["--apply", "--notify", f"slack-webhook/{name}"]) == 0
    capsys.readouterr()
    for found in _ours(prefect_client).values():
        (a,) = found
        (action,) = a.actions
        assert action.type == "send-notification" and action.block_document_id == block_id

    assert auto.main(["--apply", "--notify", "slack-webhook/no-such-block"]) == 2
    assert "no slack-webhook block named 'no-such-block'" in capsys.readouterr().err


def test_the_server_accepts_the_triggers_of_prefect_yaml(prefect_client):
    from prefect.cli.deploy._triggers import _create_deployment_triggers, _initialize_deployment_triggers
    from prefect.client.orchestration import get_client

    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    # the new-checkpoint triggers (publication and rollout have triggers of their own, tested with them)
    with_triggers = [d for d in doc["deployments"]
                     if any("concord.checkpoint.created" in t["expect"] for t in d.get("triggers", ()))]
    assert [d["name"] for d in with_triggers] == ["new-checkpoint", "hourly-sweep"]

    async def deploy(d: dict) -> uuid.UUID:
        flow_name = d["entrypoint"].rsplit(":", 1)[1].replace("_", "-")
        async with get_client() as client:
            flow_id = await client.create_flow_from_name(flow_name)
            deployment_id = await client.create_deployment(flow_id=flow_id, name=f"triggers-{uuid.uuid4().hex[:8]}", parameters=d["parameters"])
            triggers = _initialize_deployment_triggers(d["name"], copy.deepcopy(d["triggers"]))
            await _create_deployment_triggers(client, deployment_id, triggers)
        return deployment_id

    for d in with_triggers:
        deployment_id = asyncio.run(deploy(d))
        (a,) = [x for x in prefect_client.read_automations_by_name(d["triggers"][0]["name"])
                if x.actions[0].deployment_id == deployment_id]
        (action,) = a.actions
        assert action.type == "run-deployment" and action.deployment_id == deployment_id
        assert action.parameters == d["triggers"][0]["parameters"]
        assert a.trigger.expect == {"concord.checkpoint.created"}
        assert a.trigger.match.root["concord.store"] == ["local", "s3"]  # S3 checkpoints start work too


def test_a_p0_drift_event_fires_its_automation(prefect_client, capsys, events_about):
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    _clear(prefect_client)
    assert auto.main(["--apply"]) == 0
    ids = {x["name"]: x["id"] for x in map(json.loads, capsys.readouterr().out.splitlines())}
    resource = {"prefect.resource.id": "concord.audit.penguins-it", "prefect.resource.name": "penguins-it",
                "concord.severity": "critical", "concord.priority": "P0"}
    # an automation just applied is in the server's triggers a moment later (SQLite): a drift event
    # that beat it is missed for good, so the audit reports again until the automation fires
    deadline = time.monotonic() + 90
    while True:
        emit_event("concord.drift.detected", resource=resource, payload={"verdict": "critical drift (test)"})
        EventsWorker.drain_all()
        try:
            fired = events_about("prefect.automation.triggered", f"prefect.automation.{ids['concord: P0 drift']}", timeout=15)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    assert fired



@pytest.mark.parametrize(
    "bad, said",
    [
        ({"checkpoint_dir": "runs/llama/step-200"}, "absolute local folder path"),  # refused by the flow's check
        ({"name": "llama/step-200"}, "name: String should match pattern"),  # refused by the typed parameter
        ({"step": "two hundred"}, "step: Input should be a valid integer"),
    ],
)
def test_a_malformed_payload_fails_the_tiering_run_before_any_task(prefect_client, tmp_path, bad, said):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from concord_pipelines.flows.tiering import tier_checkpoints

    folder = tmp_path / "step-200"
    folder.mkdir()
    params = {"checkpoint_dir": str(folder), "name": "step-200", "step": 200} | bad
    state = tier_checkpoints(str(tmp_path / "policy.yaml"), **params, return_state=True)
    assert state.is_failed()
    assert said in f"{state.message} {state.result(raise_on_failure=False)}"
    run_id = state.state_details.flow_run_id
    assert prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))) == []


# ----------------------------------------------------------------------------- S3 checkpoint events


def _deploy_snapshot_and_replicate(parameters: dict) -> uuid.UUID:
    """A snapshot-and-replicate deployment with the trigger of prefect.yaml, as `prefect deploy` makes it."""
    from prefect.cli.deploy._triggers import _create_deployment_triggers, _initialize_deployment_triggers
    from prefect.client.orchestration import get_client

    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (d,) = [d for d in doc["deployments"] if d["entrypoint"] == "deployments/pipelines.py:snapshot_and_replicate"]
    trigger = copy.deepcopy(d["triggers"][0]) | {"name": f"s3-checkpoint-{uuid.uuid4().hex[:8]}"}

    async def deploy() -> uuid.UUID:
        async with get_client() as client:
            flow_id = await client.create_flow_from_name("snapshot-and-replicate")
            deployment_id = await client.create_deployment(
                flow_id=flow_id, name=f"s3-{uuid.uuid4().hex[:8]}", parameters=d["parameters"] | parameters
            )
            await _create_deployment_triggers(client, deployment_id, _initialize_deployment_triggers(d["name"], [trigger]))
        return deployment_id

    return asyncio.run(deploy())


def _run_started_by(prefect_client, deployment_id: uuid.UUID, announcement: dict):
    """Emit the watcher's event for ``announcement``, wait for the automation's flow run of the
    deployment, and run it here, as a worker would; its final state."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker
    from prefect.flow_engine import run_flow

    from concord.snapshots.watch import Announcement
    from concord_pipelines.deployments.watcher import event_of
    from concord_pipelines.flows.replicate import snapshot_and_replicate

    def announce(again: bool) -> None:
        # an event's id comes from the announcement's fingerprint, and the server drops an id it saw
        again = {"fingerprint": uuid.uuid4().hex * 2} if again else {}
        emit_event(**event_of(Announcement(**(announcement | again))))
        EventsWorker.drain_all()

    # On SQLite the server loads a new automation into its triggers a moment after it answered its
    # creation: an event that arrives first is missed, and waiting longer cannot bring it back. So the
    # checkpoint is announced again (as if it had been rewritten) until a run is started.
    flt = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
    deadline, announced, times = time.monotonic() + 90, 0.0, 0
    while not (runs := prefect_client.read_flow_runs(deployment_filter=flt)):
        assert time.monotonic() < deadline, f"the checkpoint event started no run of the deployment ({times} announcements)"
        if time.monotonic() - announced > 15:
            announce(again=times > 0)
            announced, times = time.monotonic(), times + 1
        time.sleep(0.5)
    run = min(runs, key=lambda r: r.created)  # the first announcement's, if a later one started a run too
    assert run.idempotency_key.startswith("automation ")
    return run, run_flow(snapshot_and_replicate, flow_run=run, parameters=run.parameters, return_type="state")


def _s3_announcement(uri: str, model: str, step: int | None = None) -> dict:
    source, _, leaf = uri.rpartition("/")
    return dict(source=source, store="s3", path=uri, name=leaf, step=step, model=model,
                bytes=0, files=0, fingerprint=uuid.uuid4().hex * 2)


def test_a_checkpoint_under_an_s3_prefix_starts_snapshot_and_replicate(prefect_client, s3_store, moto_server, tmp_path, monkeypatch):
    from toy_checkpoints import make_checkpoint

    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("CONCORD_STAGING_DIR", str(tmp_path / "staging"))
    folder = make_checkpoint(tmp_path / "step-0300", layers=2, dim=64)
    client, bucket = s3_store._client(), s3_store.bucket
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(f), bucket, f"runs/qwen/step-0300/{f.relative_to(folder).as_posix()}")
    model = f"qwen-{uuid.uuid4().hex[:6]}"
    stores = {k: str(tmp_path / "stores" / k) for k in ("us-east", "eu-central")}
    deployment_id = _deploy_snapshot_and_replicate({"store": stores["us-east"], "targets": [stores["eu-central"]], "chunk_size_mib": 1})

    run, state = _run_started_by(prefect_client, deployment_id, _s3_announcement(f"s3://{bucket}/runs/qwen/step-0300", model, 300))
    assert state.is_completed(), state
    assert run.parameters["source"] == f"s3://{bucket}/runs/qwen/step-0300" and run.parameters["ref"] == f"models/{model}"
    expected = snapshot(folder, LocalDirStore(tmp_path / "reference"), chunk_size=1024 * 1024).root
    for path in stores.values():
        assert LocalDirStore(path).read_ref(f"models/{model}").root == expected
    assert list((tmp_path / "staging").iterdir()) == []


def test_a_malformed_s3_payload_fails_the_started_run_naming_the_event(prefect_client, s3_store, moto_server, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    stores = {k: str(tmp_path / "stores" / k) for k in ("us-east", "eu-central")}
    deployment_id = _deploy_snapshot_and_replicate({"store": stores["us-east"], "targets": [stores["eu-central"]]})
    model = f"bad-{uuid.uuid4().hex[:6]}"

    run, state = _run_started_by(prefect_client, deployment_id, _s3_announcement(f"s3://{s3_store.bucket}", model))
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert "names a whole bucket" in message and "An event started this run" in message
    assert not any(os.path.exists(p) for p in stores.values())
    assert [k for k in s3_store._client().list_objects_v2(Bucket=s3_store.bucket).get("Contents", ())] == []


def test_the_federation_schedule_is_declared_but_inactive(prefect_client):
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule

    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (d,) = [d for d in doc["deployments"] if d["entrypoint"] == "flows/federation.py:lora_federation"]
    (config,) = d["schedules"]
    schedule = DeploymentScheduleCreate(**_schedule_config_to_deployment_schedule(config))
    assert schedule.active is False and isinstance(schedule.schedule, CronSchedule)

    flow_id = prefect_client.create_flow_from_name("lora-federation")
    deployment_id = prefect_client.create_deployment(
        flow_id=flow_id, name=f"schedule-{uuid.uuid4().hex[:8]}", parameters=d["parameters"], schedules=[schedule]
    )
    (created,) = prefect_client.read_deployment(deployment_id).schedules
    assert created.active is False and created.schedule.cron == config["cron"]
