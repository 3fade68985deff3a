"""The flow's ledger check remembers, as ``concord federate verify`` does: ``verify_ledger_task``
(called as a plain function) on a ledger put back to an older copy of itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prefect.events.clients import AssertingEventsClient
from prefect.testing.fixtures import asserting_events_worker  # noqa: F401 (a fixture)
from servers import free_port

from concord.federation.ledger import record_round
from concord.federation.seen import LedgerMemory
from concord.stores import LocalDirStore
from concord_pipelines.tasks import verify_ledger_task
from concord_pipelines.tasks.events import LEDGER_TAMPERED, LEDGER_VERIFIED


@pytest.fixture(autouse=True)
def no_server():
    """Prefect pointed where nothing listens: reaching for an API fails at once."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        yield


def test_verify_ledger_task_reports_a_rollback_below_what_the_worker_saw(tmp_path, monkeypatch, asserting_events_worker):  # noqa: F811
    monkeypatch.setenv("CONCORD_HOME", str(tmp_path / "worker-home"))
    store = LocalDirStore(tmp_path / "s")
    parts = [Path("ledger", "t"), Path("refs", "t")]
    for i in (1, 2):
        record_round(store, "t", {"method": "exact", "inputs": [{"adapter": f"t/a{i}"}]})
    for part in parts:
        shutil.copytree(Path(store.root, part), tmp_path / "copy" / part)
    record_round(store, "t", {"method": "exact", "inputs": [{"adapter": "t/a3"}]})

    first = verify_ledger_task.fn(store.uri, "t")
    assert first["ok"] and first["remembered"]["round"] == 3 and first["seen"] is None and first["error"] is None
    for part in parts:  # the store's ledger put back to the copy taken at round 2
        shutil.rmtree(Path(store.root, part))
        shutil.copytree(tmp_path / "copy" / part, Path(store.root, part))

    after = verify_ledger_task.fn(store.uri, "t")
    assert not after["ok"] and after["seen"]["round"] == 3 and after["remembered"]["round"] == 3
    assert f"the ledger of t in {store.uri} ends at round 2, but this machine saw it at round 3" in after["error"]
    assert "--forget" in after["error"]
    assert verify_ledger_task.fn(store.uri, "t", remember=False)["ok"]  # without the memory nothing tells
    assert LedgerMemory().recall(store, "t").round == 3
    asserting_events_worker.wait_until_empty()
    assert [e.event for e in AssertingEventsClient.last.events] == [LEDGER_VERIFIED, LEDGER_TAMPERED, LEDGER_VERIFIED]
