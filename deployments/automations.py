"""Concord's Prefect automations, declared as code.

    python -m concord_pipelines.deployments.automations [--dry-run | --apply] [--notify BLOCK] [--zombie-after SECONDS]

Three automations, one per event that needs a person:

    concord: P0 drift              concord.drift.detected with concord.priority P0
    concord: restore drill failed  concord.drill.failed
    concord: replication failed    concord.replica.failed

and one that cleans up after a lost machine:

    concord: crash zombie flow runs   no prefect.flow-run.heartbeat from a running flow run, nor
                                      any state change, for --zombie-after seconds (default 90,
                                      or $CONCORD_ZOMBIE_AFTER)

A flow run sends a heartbeat every ``HEARTBEAT_SECONDS`` (30; ``concord_pipelines.deployments.serve`` sets
``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` for its worker). When the process running it dies with no
chance to report (its machine lost, the worker and the run killed), the run would stay Running
forever; this automation moves it to Crashed once its heartbeats stop. After each heartbeat it
waits for the next heartbeat or any event of the run's state (``prefect.flow-run.*``): the state
is matched whatever its name, so a run ending in a state of Concord's own (checkout-node's
``Switched`` and ``Unchanged``, of type COMPLETED) stops being watched like one ending in
``Completed``, and so does one waiting for a retry (``AwaitingRetry``). Prefect can stamp a run's
last heartbeat just after its final state (its heartbeat thread races the final state), which
would open a watch no event closes; every Concord flow therefore sends ``concord.flow-run.ended``
about its run once the final state is set (``flows/_ended.py``), and that event closes it. No
firing on a healthy run. The window must be longer than the heartbeat
interval; the default, three heartbeats, also lets a run ride out a Prefect server restart of up
to a minute without being crashed by mistake.

``--notify`` names a saved notification block as ``<block type slug>/<name>`` (for example
``slack-webhook/oncall`` or ``email/sre``; default ``$CONCORD_NOTIFY_BLOCK``): each automation then
sends it a message. Without one, each automation's action is Prefect's ``do-nothing``, which is
available on every server: the automation still fires and is listed, with the event that
triggered it, in the UI's event feed (``prefect.automation.triggered``), so it is visible until a
block is set up and the automations are applied again.

``--dry-run`` (the default) prints the automations as JSON. ``--apply`` creates or updates them on
the server at ``PREFECT_API_URL``, by name: applying twice updates each automation in place and
never duplicates it (extra copies of one name, left by hand, are deleted).

The event triggers of deployments (a new checkpoint starts snapshot-and-replicate and
tier-checkpoints) are declared in ``prefect.yaml`` instead and created by ``prefect deploy``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from concord_pipelines.flows._ended import FLOW_RUN_ENDED

# the events that need a person, and the resources they are about, named where the tasks emit them
from concord_pipelines.tasks.events import (
    DRIFT_DETECTED,
    DRILL_FAILED,
    REPLICA_FAILED,
    audit_resource,
    store_resource,
    tiers_resource,
)

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.events.schemas.automations import AutomationCore

NOTIFY_ENV = "CONCORD_NOTIFY_BLOCK"
ZOMBIE_AFTER_ENV = "CONCORD_ZOMBIE_AFTER"

#: seconds between a flow run's heartbeats: Prefect's shortest (PREFECT_FLOWS_HEARTBEAT_FREQUENCY)
HEARTBEAT_SECONDS = 30
#: seconds without a heartbeat after which a running flow run is crashed: three heartbeats
DEFAULT_ZOMBIE_AFTER = 3 * HEARTBEAT_SECONDS
ZOMBIE = "concord: crash zombie flow runs"
HEARTBEAT = "prefect.flow-run.heartbeat"
#: the events that close a watch opened by a heartbeat: the next heartbeat, any state of the run
#: whatever its name (a custom-named Completed such as Switched included), and FLOW_RUN_ENDED, which
#: every Concord flow sends after its final state
FLOW_RUN_STATES = "prefect.flow-run.*"


@dataclass(frozen=True)
class Rule:
    """One automation: which events fire it, and the message a notification carries."""

    name: str
    description: str
    event: str
    match: dict[str, str]
    subject: str
    body: str


RULES: tuple[Rule, ...] = (
    Rule(
        name="concord: P0 drift",
        description=(
            "The nightly drift audit found critical (P0) drift: data, contract, replicas or model "
            "cards. Read the audit's report artifact; the run failed after writing it."
        ),
        event=DRIFT_DETECTED,
        match={"prefect.resource.id": audit_resource("*"), "concord.priority": "P0"},
        subject="P0 drift: {{ event.resource.name }}",
        body="{{ event.payload.verdict }}\n\nEvent {{ event.id }} at {{ event.occurred }}.",
    ),
    Rule(
        name="concord: restore drill failed",
        description=(
            "A restore drill missed an RTO or RPO objective, could not restore, or found damage. "
            "Read the drill's report artifact, fix the tier, and run restore-drill again."
        ),
        event=DRILL_FAILED,
        match={"prefect.resource.id": tiers_resource("*")},
        subject="Restore drill failed: {{ event.resource.name }}",
        body=(
            "{{ event.payload.finding_count }} finding(s): {{ event.payload.findings | join('; ') }}"
            "\n\nEvent {{ event.id }} at {{ event.occurred }}."
        ),
    ),
    Rule(
        name="concord: replication failed",
        description=(
            "A replication to a cluster store failed after its retries. Fix the store, then re-run "
            "replicate-snapshot: it sends only what is still missing."
        ),
        event=REPLICA_FAILED,
        match={"prefect.resource.id": store_resource("*")},
        subject="Replication to {{ event.payload.target }} failed",
        body=(
            "{{ event.payload.ref }} from {{ event.payload.source }}: {{ event.payload.error_type }}: "
            "{{ event.payload.error }}\n\nEvent {{ event.id }} at {{ event.occurred }}."
        ),
    ),
)


def build(rule: Rule, notify_block_id: UUID | None = None) -> AutomationCore:
    """The Prefect automation of a rule: notify through a block if given, else do nothing."""
    from prefect.events.actions import DoNothing, SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    trigger = EventTrigger(
        match=rule.match,
        expect={rule.event},
        posture=Posture.Reactive,
        threshold=1,
        within=timedelta(0),
    )
    if notify_block_id is not None:
        action: Any = SendNotification(block_document_id=notify_block_id, subject=rule.subject, body=rule.body)
    else:
        action = DoNothing()
    return AutomationCore(name=rule.name, description=described(rule, notify_block_id is not None), enabled=True,
                          trigger=trigger, actions=[action])


def described(rule: Rule, notifies: bool) -> str:
    """The automation's description as the UI lists it: the event it reacts to and what it does
    (the UI shows an event trigger only as "A custom trigger", and do-nothing as no action)."""
    labels = ", ".join(f"{k} {v}" for k, v in rule.match.items() if k != "prefect.resource.id")
    when = f"When: event {rule.event} about {rule.match['prefect.resource.id']}" + (f" with {labels}" if labels else "")
    then = ("Then: a notification (subject: " + rule.subject + ")." if notifies else
            f"Then: nothing but the firing in the event feed (prefect.automation.triggered); set ${NOTIFY_ENV} "
            "and apply again to be notified.")
    return f"{when}. {then} {rule.description}"


class BadZombieWindow(ValueError):
    """The --zombie-after window is not longer than the heartbeat interval."""


def zombie_window(value: str | float | None) -> float:
    """Seconds of silence after which a flow run is a zombie: ``value`` checked, or the default."""
    if value is None or value == "":
        return float(DEFAULT_ZOMBIE_AFTER)
    try:
        seconds = float(value)
    except (TypeError, ValueError) as exc:
        raise BadZombieWindow(
            f"--zombie-after (or ${ZOMBIE_AFTER_ENV}) {value!r} is not a number of seconds; "
            f"give e.g. {DEFAULT_ZOMBIE_AFTER}"
        ) from exc
    if not seconds >= HEARTBEAT_SECONDS * 1.5:
        raise BadZombieWindow(
            f"--zombie-after (or ${ZOMBIE_AFTER_ENV}) {value!r} is too short: flow runs send a heartbeat every "
            f"{HEARTBEAT_SECONDS} s, so a healthy run would be crashed; give at least {HEARTBEAT_SECONDS * 1.5:g} s "
            f"(the default, {DEFAULT_ZOMBIE_AFTER}, is three heartbeats)"
        )
    return seconds


def zombie_automation(after_seconds: float = DEFAULT_ZOMBIE_AFTER, notify_block_id: UUID | None = None) -> AutomationCore:
    """Crash each flow run whose heartbeats stop for ``after_seconds`` (and notify, if a block is given)."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState, SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    after_seconds = zombie_window(after_seconds)
    message = (
        f"No heartbeat from this flow run for {after_seconds:g} s: the process running it is gone (its worker "
        "or machine was lost). Start a worker if none runs, then run the deployment again: "
        "Concord's writes are atomic and a re-run sends only what is missing."
    )
    trigger = EventTrigger(
        after={HEARTBEAT},
        expect={HEARTBEAT, FLOW_RUN_STATES, FLOW_RUN_ENDED},
        match={"prefect.resource.id": "prefect.flow-run.*"},
        for_each={"prefect.resource.id"},
        posture=Posture.Proactive,
        threshold=1,
        within=timedelta(seconds=after_seconds),
    )
    actions: list[Any] = [ChangeFlowRunState(state=StateType.CRASHED, name="Crashed", message=message)]
    if notify_block_id is not None:
        actions.append(SendNotification(
            block_document_id=notify_block_id,
            subject="Zombie flow run crashed: {{ event.resource.name }}",
            body=message + "\n\nLast heartbeat: event {{ event.id }} at {{ event.occurred }}.",
        ))
    return AutomationCore(
        name=ZOMBIE,
        description=(
            f"When: a running flow run sent {HEARTBEAT} and then no heartbeat, no state change of any name, nor "
            f"{FLOW_RUN_ENDED} for {after_seconds:g} s. "
            "Then: the run is marked Crashed" + (" and a notification is sent" if notify_block_id is not None else "")
            + ". Flow runs that stop sending heartbeats lost their worker or machine."
        ),
        enabled=True,
        trigger=trigger,
        actions=actions,
    )


def automations(notify_block_id: UUID | None = None, *, zombie_after: float = DEFAULT_ZOMBIE_AFTER) -> list[AutomationCore]:
    return [*(build(rule, notify_block_id) for rule in RULES), zombie_automation(zombie_after, notify_block_id)]


class NotifyBlockNotFound(LookupError):
    """The notification block named by --notify is not saved on the server."""


def resolve_block(client: SyncPrefectClient, ref: str) -> UUID:
    """The id of a saved block named ``<block type slug>/<name>``."""
    from prefect.exceptions import ObjectNotFound

    slug, sep, name = ref.partition("/")
    if not sep or not slug or not name:
        raise NotifyBlockNotFound(
            f"--notify {ref!r} is not <block type slug>/<name>, e.g. slack-webhook/oncall "
            "(`prefect block ls` lists the saved blocks)"
        )
    try:
        return client.read_block_document_by_name(name=name, block_type_slug=slug).id
    except ObjectNotFound as exc:
        raise NotifyBlockNotFound(
            f"no {slug} block named {name!r} on the server; create it (`prefect block create {slug}`) "
            "or leave --notify out to apply the automations without notifications"
        ) from exc


def apply(client: SyncPrefectClient, wanted: list[AutomationCore]) -> list[dict[str, str]]:
    """Create or update each automation by name; one automation per name afterwards."""
    done = []
    for automation in wanted:
        existing = sorted(client.read_automations_by_name(automation.name), key=lambda a: str(a.id))
        if existing:
            keep, *extra = existing
            client.update_automation(keep.id, automation)
            for duplicate in extra:
                client.delete_automation(duplicate.id)
            done.append({"name": automation.name, "id": str(keep.id), "action": "updated"})
        else:
            new_id = client.create_automation(automation)
            done.append({"name": automation.name, "id": str(new_id), "action": "created"})
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m concord_pipelines.deployments.automations", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--apply", action="store_true", help="create or update the automations on the Prefect server")
    mode.add_argument("--dry-run", action="store_true", help="print the automations as JSON (the default)")
    p.add_argument(
        "--notify",
        default=os.environ.get(NOTIFY_ENV) or None,
        help=f"notification block as <block type slug>/<name>, e.g. slack-webhook/oncall (default: ${NOTIFY_ENV})",
    )
    p.add_argument(
        "--zombie-after",
        default=os.environ.get(ZOMBIE_AFTER_ENV) or None,
        metavar="SECONDS",
        help=f"seconds without a heartbeat before a running flow run is crashed (default {DEFAULT_ZOMBIE_AFTER}, "
        f"or ${ZOMBIE_AFTER_ENV}; at least {HEARTBEAT_SECONDS * 1.5:g})",
    )
    args = p.parse_args(argv)
    try:
        zombie_after = zombie_window(args.zombie_after)
    except BadZombieWindow as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if not args.apply:
        # a dry run needs no server: a named block shows as a placeholder id
        block = UUID(int=0) if args.notify else None
        print(json.dumps([a.model_dump(mode="json") for a in automations(block, zombie_after=zombie_after)], indent=2))
        return 0

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            block = resolve_block(client, args.notify) if args.notify else None
        except NotifyBlockNotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for line in apply(client, automations(block, zombie_after=zombie_after)):
            print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
