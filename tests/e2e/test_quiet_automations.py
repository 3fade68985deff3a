"""No automation fires on a healthy run: on the served instance (its zombie window ZOMBIE_AFTER),
runs that complete, one of them a checkout ending in Concord's own state (``Switched``, or
``Unchanged`` when the node serves that root already, both of type COMPLETED), leave no
``prefect.automation.triggered`` nor ``prefect.automation.action.failed`` event for the zombie
automation once a whole window has passed after they ended, and every run stays as it ended."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from e2e.conftest import ZOMBIE_AFTER

pytestmark = pytest.mark.e2e

#: healthy runs of the deployments' defaults: a checkout on the serving node (a Completed named
#: Switched or Unchanged), a diff and a contract validation (plain Completed)
HEALTHY = ("checkout-node/checkout-on-node", "diff-snapshots/minilm-last-change",
           "validate-contract/penguins-against-contract-v1")
RUN_TIMEOUT = 240


def _automation_events(client, automation_id, since: datetime) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter

    flt = EventFilter(
        occurred=EventOccurredFilter(since=since),
        event=EventNameFilter(prefix=["prefect.automation."]),
        resource=EventResourceFilter(id=[f"prefect.automation.{automation_id}"]),
    )
    return list(client.read_events(filter=flt, limit=50).events)


def test_healthy_runs_leave_the_zombie_automation_quiet(client):
    from concord_pipelines.deployments.automations import ZOMBIE

    (zombie,) = client.read_automations_by_name(ZOMBIE)
    since = datetime.now(timezone.utc) - timedelta(seconds=5)
    started = {n: client.create_flow_run_from_deployment(client.read_deployment_by_name(n).id) for n in HEALTHY}
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        runs = {n: client.read_flow_run(r.id) for n, r in started.items()}
        if all(r.state is not None and r.state.is_final() for r in runs.values()):
            break
        assert time.monotonic() < deadline, f"not finished within {RUN_TIMEOUT} s: {runs}"
        time.sleep(1)
    ended = {n: (r.state.type.value, r.state.name) for n, r in runs.items()}
    assert all(t == "COMPLETED" for t, _ in ended.values()), ended
    assert ended["checkout-node/checkout-on-node"][1] in ("Switched", "Unchanged"), ended

    # a whole zombie window after the last of them ended, and the server's look at it (every second)
    time.sleep(ZOMBIE_AFTER + 20)
    fired = _automation_events(client, zombie.id, since)
    assert fired == [], [(e.event, e.occurred, e.related) for e in fired]
    after = {n: (client.read_flow_run(r.id).state.type.value, client.read_flow_run(r.id).state.name) for n, r in runs.items()}
    assert after == ended  # none crashed after it completed

    # each of them said it ended, after its final state: what closes the watch its last heartbeat opened
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter

    ours = {f"prefect.flow-run.{r.id}" for r in runs.values()}
    flt = EventFilter(occurred=EventOccurredFilter(since=since), event=EventNameFilter(name=["concord.flow-run.ended"]),
                      resource=EventResourceFilter(id=sorted(ours)))
    said = {e.resource.id: e.payload for e in client.read_events(filter=flt, limit=50).events}
    assert set(said) == ours and {p["state_type"] for p in said.values()} == {"COMPLETED"}, said
