"""Every Concord flow run says it ended, after its final state: ``concord.flow-run.ended``.

Prefect's heartbeat thread checks the run's state and then sends a heartbeat; when the run's final
state is proposed between the two, its last heartbeat is stamped after that state, and a watch that
starts on a heartbeat (the zombie automation of ``deployments.automations``) would see the run
silent and crash it. The hooks here run once the final state is set, so their event is the run's
last, whatever its state's name (Completed, Failed, or one of Concord's own, such as Switched).
"""

from __future__ import annotations

from typing import Any

#: the event, about the flow run itself (``prefect.flow-run.<id>``), its state type in the payload
FLOW_RUN_ENDED = "concord.flow-run.ended"


def announce_end(flow: Any, flow_run: Any, state: Any) -> None:
    """A flow-run state hook: emit ``concord.flow-run.ended`` about ``flow_run``."""
    from prefect.events import emit_event

    emit_event(
        event=FLOW_RUN_ENDED,
        resource={"prefect.resource.id": f"prefect.flow-run.{flow_run.id}", "prefect.resource.name": flow_run.name or ""},
        payload={"flow": getattr(flow, "name", ""), "state_type": state.type.value, "state_name": state.name},
    )


#: the keyword arguments of ``@flow`` that announce every ending
ENDED_HOOKS: dict[str, Any] = {
    "on_completion": [announce_end], "on_failure": [announce_end],
    "on_cancellation": [announce_end], "on_crashed": [announce_end],
}
