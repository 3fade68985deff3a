"""Fixtures for running flows against a real (temporary) Prefect server, on small checkpoints."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from servers import patched_environ


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """A temporary Prefect server (SQLite in a temp folder) for the whole session.

    Results go to a temp folder and analytics are off, both in the environment (read by the
    server subprocess) and in the settings of this process.
    """
    results = tmp_path_factory.mktemp("prefect-results")
    from prefect.settings import (
        PREFECT_RESULTS_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    env = {"PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(results), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    settings = {PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(results), PREFECT_SERVER_ANALYTICS_ENABLED: False}
    with patched_environ(env), temporary_settings(updates=settings):
        with prefect_test_harness(server_startup_timeout=120):
            yield


@pytest.fixture
def prefect_client(prefect_harness):
    """A synchronous client of the harness server."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield client


# ----------------------------------------------------------------------------- checkpoints


def build_checkpoint(path: Path, tensors: dict, config: dict | None = None) -> Path:
    """A checkpoint folder: ``model.safetensors`` holding ``tensors`` and a ``config.json``."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config or {"model_type": "tiny", "hidden_size": 64}))
    return path


@pytest.fixture
def base_tensors() -> dict:
    """A few tensors, one of them larger than a 1 MiB chunk."""
    import torch

    g = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(512, 64, generator=g),
        "layer.0.attn.weight": torch.randn(64, 64, generator=g),
        "layer.0.mlp.weight": torch.randn(300_000, generator=g),  # 1.1 MiB: two chunks at 1 MiB
        "layer.1.attn.weight": torch.randn(64, 64, generator=g),
    }


@pytest.fixture
def checkpoints(tmp_path, base_tensors) -> Callable[..., Path]:
    """``checkpoints(name, changed={tensor: delta})``: a checkpoint folder in ``tmp_path``."""

    def make(name: str, changed: dict | None = None) -> Path:
        tensors = {k: v.clone() for k, v in base_tensors.items()}
        for key, delta in (changed or {}).items():
            tensors[key] = tensors[key] + delta
        return build_checkpoint(tmp_path / "checkpoints" / name, tensors)

    return make


@pytest.fixture
def store_dirs(tmp_path) -> dict[str, str]:
    """Store paths for three clusters (created by the first write)."""
    return {name: str(tmp_path / "stores" / name) for name in ("us-east", "eu-central", "ap-south")}


# ----------------------------------------------------------------------------- reading back


@pytest.fixture
def artifacts_of(prefect_client) -> Callable:
    """``artifacts_of(flow_run_id)``: every artifact a flow run created (its tasks' included)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    def read(flow_run_id) -> list:
        flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        return prefect_client.read_artifacts(artifact_filter=flt)

    return read


@pytest.fixture
def events_about(prefect_client) -> Callable:
    """``events_about(name, resource_id, where=..., minimum=1)``: the server's events named
    ``name`` about ``resource_id`` that satisfy ``where``, waited for (events reach the server
    asynchronously) until at least ``minimum`` have arrived."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    def read(name: str, resource_id: str, *, where: Callable = lambda e: True, minimum: int = 1, timeout: float = 30.0) -> list:
        deadline = time.monotonic() + timeout
        while True:
            flt = EventFilter(event=EventNameFilter(name=[name]), resource=EventResourceFilter(id=[resource_id]))
            events = [e for e in prefect_client.read_events(filter=flt, limit=50).events if where(e)]
            if len(events) >= minimum:
                return events
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the server holds {len(events)} matching {name!r} event(s) about {resource_id} "
                    f"after {timeout} s; expected {minimum}"
                )
            time.sleep(0.25)

    return read
