"""The publish-oci deployment's trigger, checked with Prefect's own trigger models and matching
code on events built as the promote task emits them; no server."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime, timezone
from pathlib import Path

import yaml

from concord_pipelines.tasks import events

ROOT = Path(__file__).resolve().parents[3]


def _deployment() -> dict:
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (d,) = [d for d in doc["deployments"] if d["entrypoint"] == "flows/oci.py:publish_oci"]
    return d


def _promoted(alias: str):
    from prefect.server.events.schemas.events import ReceivedEvent

    return ReceivedEvent(
        occurred=datetime.now(timezone.utc),
        event=events.MODEL_PROMOTED,
        resource=events.promoted_model("minilm", "3", alias),
        related=[],
        payload={"name": "minilm", "version": "3", "alias": alias},
        id=uuid.uuid4(),
    )


def test_a_new_champion_and_only_a_champion_is_published(monkeypatch):
    from prefect.cli.deploy._triggers import _initialize_deployment_triggers
    from prefect.flows import load_flow_from_entrypoint
    from prefect.server.events.actions import RunDeployment
    from prefect.server.events.schemas.automations import EventTrigger
    from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

    d = _deployment()
    (t,) = _initialize_deployment_triggers(d["name"], copy.deepcopy(d["triggers"]))
    assert t.enabled and t.expect == {events.MODEL_PROMOTED}
    covers = EventTrigger.model_validate(t.trigger_type(**t.model_dump()).model_dump(mode="json")).covers
    assert covers(_promoted("champion")) and not covers(_promoted("staging"))

    params = copy.deepcopy(t.parameters)
    RunDeployment._upgrade_v1_templates(params)
    rendered = hydrate(params, HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"event": _promoted("champion")}))
    monkeypatch.chdir(ROOT)
    fl = load_flow_from_entrypoint(d["entrypoint"])
    checked = fl.validate_parameters(d["parameters"] | rendered)
    assert (checked["name"], checked["version"], checked["repository"]) == ("minilm", 3, "127.0.0.1:5000/models")


def test_a_reference_is_the_repository_the_model_and_its_version():
    from concord_pipelines.tasks.oci import oci_reference

    assert oci_reference("ghcr.io/org/models/", "MiniLM", 3) == "ghcr.io/org/models/minilm:v3"
    assert oci_reference("ghcr.io/org", "minilm", 3, "stable") == "ghcr.io/org/minilm:stable"
