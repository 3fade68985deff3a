"""The retry policy of deployed runs: a passing fault is retried by the server, a failure that is
the run's answer is not (flows/_policy.py), on the Prefect test server."""

from __future__ import annotations

import pytest
from prefect import flow

from concord_pipelines.flows._policy import RETRIES, RETRY_DELAY_SECONDS, final

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]

attempts: list[str] = []


@flow(name="policy-probe", retries=1, retry_delay_seconds=0)
def probe(kind: str) -> str:
    attempts.append(kind)
    if kind == "passing" and attempts.count(kind) == 1:
        raise ConnectionError("the API went away for a moment")
    if kind == "answer":
        raise final(ValueError("bad parameters: the same on every try"))
    return "done"


def _run(prefect_client, kind: str):
    attempts.clear()
    state = probe(kind, return_state=True)
    run = prefect_client.read_flow_run(state.state_details.flow_run_id)
    return state, run


def test_a_passing_fault_is_retried_and_the_run_completes(prefect_client):
    state, run = _run(prefect_client, "passing")
    assert state.is_completed() and run.run_count == 2 and attempts == ["passing", "passing"]


def test_a_failure_that_is_the_answer_is_not_retried(prefect_client):
    state, run = _run(prefect_client, "answer")
    assert state.is_failed() and "same on every try" in state.message
    assert run.run_count == 1 and attempts == ["answer"] and run.empirical_policy.retries == 0


def test_outside_a_flow_run_final_only_returns_the_error():
    exc = ValueError("x")
    assert final(exc) is exc


def test_the_deployed_pipelines_carry_the_policy_and_the_flows_do_not():
    from concord_pipelines.deployments import pipelines
    from concord_pipelines.flows.replicate import snapshot_and_replicate

    for name in pipelines.__all__:
        deployed = getattr(pipelines, name)
        assert (deployed.retries, deployed.retry_delay_seconds) == (RETRIES, RETRY_DELAY_SECONDS), name
    assert pipelines.snapshot_and_replicate.name == snapshot_and_replicate.name == "snapshot-and-replicate"
    assert not snapshot_and_replicate.retries


def test_a_deployed_pipeline_given_a_missing_source_fails_once_and_is_not_retried(prefect_client, tmp_path):
    """SourceNotFoundError says nothing was changed: the deployed pipeline's run is not retried."""
    from concord_pipelines.deployments import pipelines

    state = pipelines.snapshot_checkpoint(source=str(tmp_path / "no-such-checkpoint"), store=str(tmp_path / "store"),
                                          return_state=True)
    run = prefect_client.read_flow_run(state.state_details.flow_run_id)
    assert state.is_failed() and "no such file or folder to snapshot" in state.message, state.message
    assert run.run_count == 1 and run.empirical_policy.retries == 0


def test_a_deployed_tier_run_given_no_policy_file_fails_once_and_is_not_retried(prefect_client, tmp_path):
    from concord_pipelines.deployments import pipelines

    state = pipelines.tier_checkpoints(policy=str(tmp_path / "policy.yaml"), return_state=True)
    run = prefect_client.read_flow_run(state.state_details.flow_run_id)
    assert state.is_failed() and "policy" in state.message, state.message
    assert run.run_count == 1 and run.empirical_policy.retries == 0


def test_the_deployed_pipelines_keep_their_run_forms():
    """Wrapped to mark final errors, a deployed pipeline still shows the flow's own form."""
    from concord_pipelines.deployments import pipelines
    from concord_pipelines.flows.replicate import snapshot_and_replicate

    assert pipelines.snapshot_and_replicate.parameters == snapshot_and_replicate.parameters
    assert pipelines.snapshot_and_replicate.description == snapshot_and_replicate.description
