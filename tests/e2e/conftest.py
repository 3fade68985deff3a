"""Concord as ``make serve`` runs it, on 127.0.0.1 (one instance for the whole package): a real Prefect server (temporary home), the
work pool, blocks, every deployment of ``prefect.yaml``, a process worker and the checkpoint
watcher, all started by ``python -m deployments.serve`` and stopped by it afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import free_port, patched_environ

PROJECT_DIR = Path(__file__).resolve().parents[2]


#: what a flow run needs from the project: the code and the deployments
_LINKED = ("concord", "blocks", "tasks", "flows", "deployments", "prefect.yaml")

#: a tier policy on local folders only (relative to the policy file: <project>/data/tiers/...):
#: warm declared on a NAS and cold on off-site tape, so that 3-2-1 holds without S3
TIER_POLICY = """\
namespace: e2e
hot: {store: ../tiers/hot, keep: 2}
warm: {store: ../tiers/warm, keep: 4, media: nas}
cold: {store: ../tiers/cold, media: tape, offsite: true}
gc_grace: 0
ready: {marker: COMPLETE}
"""


#: the zombie automation's window on the served instance: the shortest it takes (a heartbeat every
#: 30 s, and half of one to spare), so that the lost-worker fault is seen soon
ZOMBIE_AFTER = 45


@dataclass(frozen=True)
class Served:
    api_url: str
    state_dir: Path
    watched: Path
    project_dir: Path  # where flow runs start: the deployments' relative store paths resolve here
    tier_policy: Path  # the tier policy the tier-checkpoints deployment reads (data/tiering/policy.yaml)


def _serve(state_dir: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_PROFILE")}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="true", CONCORD_ZOMBIE_AFTER=str(ZOMBIE_AFTER))
    return subprocess.run([sys.executable, "-m", "deployments.serve", "--dir", str(state_dir), *args],
                          cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="package")
def served(tmp_path_factory):
    base = tmp_path_factory.mktemp("served")
    state_dir, watched, project_dir = base / "serve", base / "checkpoints", base / "project"
    # the project's code seen from a folder of the test's own, so that runs started by events,
    # with the deployments' default parameters (data/stores/...), write under it
    project_dir.mkdir()
    for name in _LINKED:
        (project_dir / name).symlink_to(PROJECT_DIR / name)
    # the tier-checkpoints deployment's default policy, also taken in by a new-checkpoint event
    tier_policy = project_dir / "data" / "tiering" / "policy.yaml"
    tier_policy.parent.mkdir(parents=True)
    tier_policy.write_text(TIER_POLICY)
    port = free_port()
    try:
        started = _serve(state_dir, "start", "--port", str(port), "--watch", str(watched), "--interval", "1",
                         "--project-dir", str(project_dir), timeout=300)
        if started.returncode != 0:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted((state_dir / "logs").glob("*.log")))
            pytest.fail(f"serve start failed:\n{started.stdout}\n{started.stderr}\n{logs}")
        api_url = f"http://127.0.0.1:{port}/api"
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with patched_environ({"PREFECT_API_URL": api_url}), temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield Served(api_url, state_dir, watched, project_dir, tier_policy)
    finally:
        from deployments import serve

        recorded = serve.read_record(state_dir)["processes"]
        _serve(state_dir, "stop", "--timeout", "15", timeout=120)
        left = [p.name for p in recorded if serve.is_alive(p)]
        assert not left, f"still running after stop: {left}"


@pytest.fixture
def client(served):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        yield c
