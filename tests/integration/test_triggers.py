"""Automations and deployment triggers on a real temporary Prefect server.

``python -m deployments.automations --apply`` run twice leaves each automation exactly once and
readable by name; a notification block given by name is resolved; the triggers of prefect.yaml
are accepted by the server as the automations ``prefect deploy`` creates; a P0 drift event fires
its automation; a tier-checkpoints run with malformed parameters fails before any task runs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from pathlib import Path

import pytest
import yaml

from deployments import automations as auto

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def _ours(client) -> dict[str, list]:
    return {r.name: client.read_automations_by_name(r.name) for r in auto.RULES}


def _clear(client) -> None:
    for found in _ours(client).values():
        for a in found:
            client.delete_automation(a.id)


def test_apply_twice_creates_each_automation_once(prefect_client, capsys):
    _clear(prefect_client)
    assert auto.main(["--apply"]) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["name"], x["action"]) for x in first] == [(r.name, "created") for r in auto.RULES]

    assert auto.main(["--apply"]) == 0
    second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["name"], x["action"], x["id"]) for x in second] == [(x["name"], "updated", x["id"]) for x in first]

    for rule, found in zip(auto.RULES, _ours(prefect_client).values()):
        (a,) = found
        assert a.enabled and a.description == rule.description
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
    with_triggers = [d for d in doc["deployments"] if d.get("triggers")]
    assert len(with_triggers) == 2

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
        (a,) = prefect_client.read_automations_by_name(d["triggers"][0]["name"])
        (action,) = a.actions
        assert action.type == "run-deployment" and action.deployment_id == deployment_id
        assert action.parameters == d["triggers"][0]["parameters"]
        assert a.trigger.expect == {"concord.checkpoint.created"}


def test_a_p0_drift_event_fires_its_automation(prefect_client, capsys, events_about):
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    _clear(prefect_client)
    assert auto.main(["--apply"]) == 0
    ids = {x["name"]: x["id"] for x in map(json.loads, capsys.readouterr().out.splitlines())}
    resource = {"prefect.resource.id": "concord.audit.penguins-it", "prefect.resource.name": "penguins-it",
                "concord.severity": "critical", "concord.priority": "P0"}
    emit_event("concord.drift.detected", resource=resource, payload={"verdict": "critical drift (test)"})
    EventsWorker.drain_all()
    fired = events_about("prefect.automation.triggered", f"prefect.automation.{ids['concord: P0 drift']}", timeout=60)
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

    from flows.tiering import tier_checkpoints

    folder = tmp_path / "step-200"
    folder.mkdir()
    params = {"checkpoint_dir": str(folder), "name": "step-200", "step": 200} | bad
    state = tier_checkpoints(str(tmp_path / "policy.yaml"), **params, return_state=True)
    assert state.is_failed()
    assert said in f"{state.message} {state.result(raise_on_failure=False)}"
    run_id = state.state_details.flow_run_id
    assert prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))) == []
