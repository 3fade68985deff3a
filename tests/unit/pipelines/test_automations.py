"""Event triggers of prefect.yaml and the automations of ``concord_pipelines.deployments.automations``, checked with
Prefect's own models and matching code, on sample events built the way Concord emits them; no server.

Trigger parameters are rendered from an event the way the server's run-deployment action renders
them, so what a malformed event does to tier-checkpoints is tested here too.
"""

from __future__ import annotations

import copy
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import pytest
import yaml
from servers import free_port

from concord.snapshots.watch import Announcement
from concord_pipelines.deployments import automations as auto
from concord_pipelines.deployments.watcher import event_of

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_server():
    """A unit test that reached for an API would fail at once."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        yield


def received(event: str, resource: dict, payload: dict | None = None, related: list | None = None):
    """A server-side event, as triggers see it."""
    from prefect.server.events.schemas.events import ReceivedEvent

    return ReceivedEvent(
        occurred=datetime.now(timezone.utc),
        event=event,
        resource=resource,
        related=related or [],
        payload=payload or {},
        id=uuid.uuid4(),
    )


def server_trigger(trigger):
    """The server's trigger model of a client trigger (it holds the matching code)."""
    from prefect.server.events.schemas.automations import EventTrigger

    plain = trigger.trigger_type(**trigger.model_dump()) if hasattr(trigger, "trigger_type") else trigger
    return EventTrigger.model_validate(plain.model_dump(mode="json"))


def announcement(path: str, **kw) -> Announcement:
    fields = dict(source="/runs/llama", store="local", path=path, name="step-200", step=200, model="llama",
                  bytes=1234, files=2, fingerprint="f" * 64)
    return Announcement(**(fields | kw))


def checkpoint_event(a: Announcement):
    e = event_of(a)
    return received(e["event"], e["resource"], e["payload"], e["related"])


def render(parameters: dict, event) -> dict:
    """Trigger parameters rendered from an event, as the server's run-deployment action does."""
    from prefect.server.events.actions import RunDeployment
    from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

    params = copy.deepcopy(parameters)
    RunDeployment._upgrade_v1_templates(params)
    return hydrate(params, HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"event": event}))


# ----------------------------------------------------------------------------- prefect.yaml triggers


def _deployments_with_triggers(event: str = "concord.checkpoint.created") -> dict[str, dict]:
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {d["entrypoint"]: d for d in doc["deployments"] if any(event in t.get("expect", ()) for t in d.get("triggers") or ())}


def _triggers(d: dict) -> list:
    from prefect.cli.deploy._triggers import _initialize_deployment_triggers

    return _initialize_deployment_triggers(d["name"], copy.deepcopy(d["triggers"]))


def test_new_checkpoints_trigger_snapshot_and_replicate_and_tiering():
    from prefect.events import DeploymentEventTrigger

    found = _deployments_with_triggers()
    assert set(found) == {"deployments/pipelines.py:snapshot_and_replicate", "deployments/pipelines.py:tier_checkpoints"}
    for d in found.values():
        (t,) = _triggers(d)
        assert isinstance(t, DeploymentEventTrigger) and t.enabled and t.name
        assert t.expect == {"concord.checkpoint.created"}
        assert t.posture == "Reactive" and t.threshold == 1
        t.set_deployment_id(uuid.uuid4())
        (action,) = t.as_automation().actions
        assert action.type == "run-deployment" and action.parameters == d["triggers"][0]["parameters"]


def test_the_triggers_match_local_and_s3_checkpoints(tmp_path):
    local = checkpoint_event(announcement(str(tmp_path / "step-200")))
    s3 = checkpoint_event(announcement("s3://bucket/runs/llama/step-200", store="s3", source="s3://bucket/runs/llama"))
    elsewhere = checkpoint_event(announcement("gs://bucket/runs/llama/step-200", store="gcs", source="gs://bucket/runs/llama"))
    other = received("concord.snapshot.created", {"prefect.resource.id": "concord.snapshot.abc"})
    for d in _deployments_with_triggers().values():
        (t,) = _triggers(d)
        covers = server_trigger(t).covers
        assert (covers(local), covers(s3), covers(elsewhere), covers(other)) == (True, True, False, False)


def _flow_and_parameters(entrypoint: str, event, monkeypatch) -> tuple:
    from prefect.flows import load_flow_from_entrypoint

    monkeypatch.chdir(ROOT)
    d = _deployments_with_triggers()[entrypoint]
    (t,) = _triggers(d)
    return load_flow_from_entrypoint(entrypoint), d["parameters"] | render(t.parameters, event)


def test_a_watcher_event_renders_valid_parameters(tmp_path, monkeypatch):
    folder = tmp_path / "step-200"
    folder.mkdir()
    event = checkpoint_event(announcement(str(folder)))

    fl, params = _flow_and_parameters("deployments/pipelines.py:tier_checkpoints", event, monkeypatch)
    assert (params["checkpoint_dir"], params["name"], params["step"]) == (str(folder), "llama-step-200", 200)  # <model>-<name>
    fl.validate_parameters(params)
    from concord_pipelines.flows.tiering import check_checkpoint_arguments

    check_checkpoint_arguments(params["checkpoint_dir"], params["name"], params["step"])

    fl, params = _flow_and_parameters("deployments/pipelines.py:snapshot_and_replicate", event, monkeypatch)
    assert (params["source"], params["ref"]) == (str(folder), "models/llama")
    assert str(event.id) in params["message"] and params["targets"]
    fl.validate_parameters(params)


def test_every_trigger_renders_parameters_the_server_accepts_from_the_event_concord_sends(tmp_path, monkeypatch):
    """The server checks a run-deployment action's rendered parameters against the flow's schema
    strictly (JSON Schema: the string "1" is no integer), and a refusal is an "action failed"
    event in the UI. So each trigger of prefect.yaml is rendered from the event as Concord emits
    it, types and all (the promote task names a version as MLflow does: the string "1"), and
    checked the server's way."""
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import validate

    folder = tmp_path / "step-200"
    folder.mkdir()
    sent = {
        "concord.checkpoint.created": checkpoint_event(announcement(str(folder))),
        "concord.model.promoted": received(
            "concord.model.promoted",
            {"prefect.resource.id": "concord.model.minilm/1", "concord.alias": "champion"},
            {"name": "minilm", "version": "1", "alias": "champion", "time": "2026-01-01T00:00:00Z", "previous": None},
        ),
        "concord.replica.updated": received(
            "concord.replica.updated",
            {"prefect.resource.id": "concord.store./data/stores/eu-central", "prefect.resource.name": "/data/stores/eu-central"},
            {"ref": "models/minilm", "root": "a" * 64},
        ),
    }
    monkeypatch.chdir(ROOT)
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    checked = []
    for d in doc["deployments"]:
        for t in _triggers(d) if d.get("triggers") else ():
            (expect,) = t.expect
            params = d.get("parameters", {}) | render(t.parameters, sent[expect])
            schema = parameter_schema(load_flow_from_entrypoint(d["entrypoint"])).model_dump_for_openapi()
            assert validate(params, schema) == [], f"{d['name']}: {t.name} renders {params}"
            checked.append(d["name"])
    assert len(checked) == sum(len(d.get("triggers") or ()) for d in doc["deployments"]) >= 4


def test_a_checkpoint_without_a_step_renders_none(tmp_path, monkeypatch):
    folder = tmp_path / "final"
    folder.mkdir()
    event = checkpoint_event(announcement(str(folder), name="final", step=None))
    fl, params = _flow_and_parameters("deployments/pipelines.py:tier_checkpoints", event, monkeypatch)
    assert params["step"] is None
    fl.validate_parameters(params)


# ----------------------------------------------------------------------------- malformed payloads


@pytest.fixture
def touched(monkeypatch):
    """The tasks of tier-checkpoints replaced by recorders: what a run would have touched."""
    import concord_pipelines.flows.tiering as tiering

    calls: list[str] = []
    for name in ("promoted_roots_task", "add_checkpoint_task", "sweep_task", "tier_status_task"):
        monkeypatch.setattr(tiering, name, lambda *a, _n=name, **k: calls.append(_n))
    return calls


@pytest.mark.parametrize(
    "payload, problem",
    [
        ({"path": "runs/llama/step-200"}, "absolute local folder"),
        ({"path": "s3://bucket"}, "whole bucket"),
        ({"path": "{{ event.payload.path }}"}, "did not fill in"),
        ({"path": "/no/such/folder/step-200"}, "not a folder"),
        ({"name": "../../etc"}, "checkpoint name"),
        ({"name": ""}, None),  # empty: the folder's name
        ({"step": "two hundred"}, "non-negative integer"),
        ({"step": -1}, "non-negative integer"),
        ({"step": True}, "non-negative integer"),
        ({"path": ""}, "only apply with a checkpoint_dir"),
    ],
)
def test_a_malformed_payload_fails_tiering_before_any_store_is_touched(tmp_path, monkeypatch, touched, payload, problem):
    from concord_pipelines.flows.tiering import BadCheckpointArguments, tier_checkpoints

    folder = tmp_path / "step-200"
    folder.mkdir()
    good = {"source": "/runs/llama", "store": "local", "path": str(folder), "name": "step-200", "step": 200}
    event = received("concord.checkpoint.created", {"prefect.resource.id": "concord.checkpoint.llama/step-200"}, good | payload)
    _, params = _flow_and_parameters("deployments/pipelines.py:tier_checkpoints", event, monkeypatch)
    if problem is None:  # accepted: the check passes (the rest of the run is tested with real stores)
        from concord_pipelines.flows.tiering import check_checkpoint_arguments

        check_checkpoint_arguments(params["checkpoint_dir"], params["name"], params["step"])
        return
    with pytest.raises(BadCheckpointArguments, match=problem) as err:
        tier_checkpoints.fn(**params)
    assert touched == []
    assert "before touching any store" in str(err.value) and err.value.problems


def test_every_problem_is_named_at_once(touched):
    from concord_pipelines.flows.tiering import BadCheckpointArguments, tier_checkpoints

    with pytest.raises(BadCheckpointArguments) as err:
        tier_checkpoints.fn("policy.yaml", checkpoint_dir="rel/dir", name="a b", step="7")
    assert len(err.value.problems) == 3 and touched == []


def test_typed_parameters_refuse_a_bad_name_or_step_before_the_run_starts():
    from prefect.exceptions import ParameterTypeError

    from concord_pipelines.flows.tiering import tier_checkpoints

    for bad in ({"name": "../x"}, {"step": "two hundred"}, {"step": -3}):
        with pytest.raises(ParameterTypeError):
            tier_checkpoints.validate_parameters({"policy": "p.yaml", "checkpoint_dir": "/x"} | bad)


# ----------------------------------------------------------------------------- automations


def test_event_names_are_the_ones_concord_emits():
    from concord_pipelines.tasks import events

    assert (auto.DRIFT_DETECTED, auto.DRILL_FAILED, auto.REPLICA_FAILED) == (
        events.DRIFT_DETECTED, events.DRILL_FAILED, events.REPLICA_FAILED,
    ) == ("concord.drift.detected", "concord.drill.failed", "concord.replica.failed")


def test_every_event_name_is_spelled_once_in_tasks_events():
    from concord_pipelines.tasks import events

    names = {v for k, v in vars(events).items() if k.isupper() and isinstance(v, str) and v.startswith("concord.")}
    assert len(names) == 27
    spelled = {
        path.relative_to(ROOT).as_posix(): sorted(n for n in names if f'"{n}"' in path.read_text())
        for path in [*(ROOT / "tasks").glob("*.py"), *(ROOT / "deployments").glob("*.py")]
        if path.name != "events.py"
    }
    assert {p: n for p, n in spelled.items() if n} == {}


@pytest.mark.parametrize("block", [None, uuid.UUID(int=7)])
def test_the_automations_validate_with_prefects_models(block):
    from prefect.events.schemas.automations import AutomationCore

    built = auto.automations(block)
    assert [a.name for a in built] == [*(r.name for r in auto.RULES), auto.ZOMBIE] and len({a.name for a in built}) == 4
    for a in built:
        again = AutomationCore.model_validate(json.loads(a.model_dump_json()))
        assert again == a and a.enabled
    for a in built[:-1]:
        (action,) = a.actions
        assert action.type == ("do-nothing" if block is None else "send-notification")
        if block is not None:
            assert action.block_document_id == block


def _drift(priority: str, severity: str):
    return received(
        "concord.drift.detected",
        {"prefect.resource.id": "concord.audit.penguins", "prefect.resource.name": "penguins",
         "concord.severity": severity, "concord.priority": priority},
        {"verdict": "critical: bill_length_mm PSI 0.9"},
    )


def _drill(ok: bool):
    from concord_pipelines.tasks import events

    return received(
        events.DRILL_FAILED if not ok else events.DRILL_COMPLETED,
        events.tiers("llama"),
        {"namespace": "llama", "ok": ok, "findings": ["cold: RTO 7200 s over 3600 s"], "finding_count": 1},
    )


def _replica_failed():
    from concord_pipelines.tasks import events

    return received(
        events.REPLICA_FAILED,
        events.store("s3://eu/store"),
        {"source": "/s/us", "target": "s3://eu/store", "ref": "models/llama", "root": None,
         "error_type": "StoreUnreachableError", "error": "connection refused"},
        [events.store("/s/us", "source")],
    )


def test_each_automation_fires_on_its_event_only():
    samples = {
        "P0 drift": _drift("P0", "critical"),
        "P1 drift": _drift("P1", "warning"),
        "drill failed": _drill(False),
        "drill passed": _drill(True),
        "replica failed": _replica_failed(),
    }
    fired = {
        a.name: {k for k, e in samples.items() if server_trigger(a.trigger).covers(e)}
        for a in auto.automations()
    }
    assert fired == {
        "concord: P0 drift": {"P0 drift"},
        "concord: restore drill failed": {"drill failed"},
        "concord: replication failed": {"replica failed"},
        auto.ZOMBIE: set(),
    }


def test_notification_templates_render_from_sample_events():
    samples = {
        "concord: P0 drift": _drift("P0", "critical"),
        "concord: restore drill failed": _drill(False),
        "concord: replication failed": _replica_failed(),
    }
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for a in auto.automations(uuid.UUID(int=1))[:-1]:
        (action,) = a.actions
        event = samples[a.name]
        subject = env.from_string(action.subject).render(event=event)
        body = env.from_string(action.body).render(event=event)
        assert str(event.id) in body and "{{" not in subject + body
    assert "penguins" in env.from_string(auto.RULES[0].subject).render(event=samples["concord: P0 drift"])


def test_dry_run_prints_the_automations_without_a_server(capsys):
    assert auto.main(["--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [a["name"] for a in printed] == [*(r.name for r in auto.RULES), auto.ZOMBIE]
    assert auto.main(["--notify", "slack-webhook/oncall"]) == 0
    assert {a["actions"][-1]["type"] for a in json.loads(capsys.readouterr().out)} == {"send-notification"}


# ----------------------------------------------------------------------------- zombie flow runs


def _flow_run_event(event: str, run_id: uuid.UUID):
    return received(event, {"prefect.resource.id": f"prefect.flow-run.{run_id}", "prefect.resource.name": "quick-fox"})


def test_the_zombie_automation_waits_for_the_silence_after_a_heartbeat_and_crashes_the_run():
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import Posture

    a = auto.zombie_automation(60)
    t = a.trigger
    assert t.posture == Posture.Proactive and t.threshold == 1 and t.within.total_seconds() == 60
    assert t.after == {auto.HEARTBEAT} and t.for_each == {"prefect.resource.id"}
    # any state of the run, whatever its name, and Concord's own end event close the watch
    assert t.expect == {auto.HEARTBEAT, "prefect.flow-run.*", "concord.flow-run.ended"}
    server = server_trigger(t)
    for ending in ("Completed", "Switched", "Unchanged", "Failed", "Cancelled", "Crashed", "AwaitingRetry", auto.HEARTBEAT):
        assert server.expects(f"prefect.flow-run.{ending}" if "." not in ending else ending), ending
    assert server.expects("concord.flow-run.ended") and not server.starts_after("concord.flow-run.ended")
    assert not server.expects("prefect.task-run.Completed")
    (action,) = a.actions
    assert isinstance(action, ChangeFlowRunState) and action.state.value == "CRASHED" and not action.force
    assert "60 s" in action.message and "run the deployment again" in action.message


def test_the_zombie_automation_watches_flow_runs_only():
    covers = server_trigger(auto.zombie_automation().trigger).covers
    run = uuid.uuid4()
    assert covers(_flow_run_event(auto.HEARTBEAT, run))
    assert covers(_flow_run_event("prefect.flow-run.Completed", run))
    assert covers(_flow_run_event("prefect.flow-run.Switched", run))  # checkout-node's own Completed
    assert covers(_flow_run_event("concord.flow-run.ended", run))
    assert not covers(received(auto.HEARTBEAT, {"prefect.resource.id": f"prefect.task-run.{run}"}))
    assert not covers(_drift("P0", "critical"))


def test_the_zombie_automation_notifies_a_block_when_one_is_given():
    crash, notify = auto.zombie_automation(90, uuid.UUID(int=3)).actions
    assert crash.type == "change-flow-run-state" and notify.type == "send-notification"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    beat = _flow_run_event(auto.HEARTBEAT, uuid.uuid4())
    assert env.from_string(notify.subject).render(event=beat).endswith("quick-fox")
    assert str(beat.id) in env.from_string(notify.body).render(event=beat)


@pytest.mark.parametrize("value, seconds", [(None, 90.0), ("", 90.0), ("45", 45.0), (120, 120.0)])
def test_the_zombie_window_defaults_to_three_heartbeats(value, seconds):
    assert auto.zombie_window(value) == seconds


@pytest.mark.parametrize("value, says", [("44", "too short"), ("0", "too short"), ("nan", "too short"),
                                         ("-90", "too short"), ("soon", "not a number")])
def test_a_zombie_window_a_healthy_run_would_miss_is_refused(value, says):
    with pytest.raises(auto.BadZombieWindow, match=says) as info:
        auto.zombie_window(value)
    assert auto.ZOMBIE_AFTER_ENV in str(info.value) and "90" in str(info.value)


def test_a_bad_zombie_window_is_refused_before_any_server_is_reached(capsys, monkeypatch):
    monkeypatch.setenv(auto.ZOMBIE_AFTER_ENV, "10")
    assert auto.main(["--apply"]) == 2
    assert "too short" in capsys.readouterr().err
    assert auto.main(["--dry-run", "--zombie-after", "75"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed[-1]["name"] == auto.ZOMBIE and printed[-1]["trigger"]["within"] == 75.0


def test_every_automation_and_trigger_names_the_event_it_reacts_to_in_its_description():
    """The UI lists an event trigger as "A custom trigger" and do-nothing as no action: the
    description is where a person reads what fires it and what it does."""
    for a in auto.automations():
        assert a.description.startswith("When: ") and "Then: " in a.description, a.description
        assert all(event in a.description for event in a.trigger.expect if event.startswith("concord.")), a.name
    assert auto.HEARTBEAT in auto.zombie_automation().description
    with_block = auto.automations(uuid.uuid4())[0].description
    assert "notification" in with_block and "CONCORD_NOTIFY_BLOCK" not in with_block
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for d in doc["deployments"]:
        for t in d.get("triggers", []):
            assert any(e in t["description"] for e in t["expect"]), (d["name"], t["name"])
