"""The retry policy of deployed runs.

The pipelines that are safe to run again (every write is content-addressed, every ref moves by
compare-and-swap, a re-run sends only what is missing) are deployed with one retry, 30 s later:
a run that failed because the Prefect API, a store or the network went away for a moment (a
server restart, a dropped connection) is run again by the server and converges. Prefect's client
retries calls on a connection it has used before, but a call on a fresh connection made while the
server is away fails the run at once: the retry covers that.

A failure that is the run's answer (bad parameters, copy-rule violations) would be the same on a
second try, so the flow marks its run :func:`final` before raising it, and the server does not
retry it. The deployed pipelines also mark final every error of :data:`FINAL_ERRORS` that escapes
them: the input is wrong (a source or policy file that is not there, a malformed policy, a bad name
or store address, a ref or snapshot that does not exist) and nothing was changed, so a second try
30 s later could only fail the same way. Python callers of the flows (tests, the demo) get the
flows without retries.
"""

from __future__ import annotations

import copy
import functools
import logging
import types

RETRIES = 1
RETRY_DELAY_SECONDS = 30

log = logging.getLogger("concord.flows")


def final_errors() -> tuple[type[BaseException], ...]:
    """The errors that are a run's answer whatever the moment: the input is wrong and nothing was
    changed (a store or server that does not answer is not among them)."""
    from concord.errors import (
        InvalidNameError,
        InvalidStoreURIError,
        ManifestError,
        ManifestNotFoundError,
        PolicyError,
        RefNotFoundError,
        SourceNotFoundError,
        StoreNotFoundError,
        TrustError,
    )

    # TrustError: a root no trusted key signed, a bad key or signature: refused, nothing written
    return (SourceNotFoundError, PolicyError, InvalidNameError, InvalidStoreURIError, ManifestError,
            ManifestNotFoundError, RefNotFoundError, StoreNotFoundError, TrustError)


def as_deployed(flow):
    """``flow`` with the retry policy of deployed runs: retried once on a passing fault, never on an
    error of :func:`final_errors` (marked :func:`final` as it leaves the flow)."""

    fn, answers, mark = flow.fn, final_errors(), final

    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except answers as exc:
            mark(exc)  # the same exception, its retry cancelled
            raise

    # the flow's module as globals, so that its annotations (strings) resolve as the flow's own do
    run = functools.update_wrapper(types.FunctionType(run.__code__, fn.__globals__, fn.__name__, None, run.__closure__), fn)
    answering = copy.copy(flow)
    answering.fn = run
    return answering.with_options(retries=RETRIES, retry_delay_seconds=RETRY_DELAY_SECONDS)


def final(exc: BaseException) -> BaseException:
    """``exc``, once the server has been told not to retry the current flow run (no flow run, or
    one without retries: nothing to tell). If the server cannot be told, the run is retried once
    and fails the same way."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    run = getattr(FlowRunContext.get(), "flow_run", None)
    if run is None or not run.empirical_policy.retries:
        return exc
    policy = run.empirical_policy.model_copy(update={"retries": 0})
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, empirical_policy=policy)
        run.empirical_policy = policy
    except Exception as why:  # the failure itself matters more than saving its retry
        log.warning("could not mark flow run %s as not to be retried (%s): it will be retried once", run.id, why)
    return exc
