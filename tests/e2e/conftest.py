"""Concord as ``make serve`` runs it, on 127.0.0.1 (one instance for the whole package), in a fresh
copy of the project (its code linked, no data): the seeding of what the deployments' defaults name,
a real Prefect server (temporary home), the work pools, blocks, every deployment of ``prefect.yaml``,
a process worker, the checkpoint watcher on the copy's ``data/checkpoints``, the serving node
``node-local`` (its link under the copy's ``data/serving``) and an OCI registry (``docker-registry``,
its blobs under the copy's ``data/oci-registry``), all started by ``python -m concord_pipelines.deployments.serve`` and
stopped by it afterwards. As ``make serve`` does, it runs the Prefect server and an MLflow server on
a PostgreSQL cluster of its own (in a folder of /tmp the ``postgres`` user can reach when the tests
run as root), on free ports. The checkpoint seeded is a small one
(``--seed-from``), standing in for all-MiniLM-L6-v2 to keep the tests light."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import free_port, patched_environ

PROJECT_DIR = Path(__file__).resolve().parents[2]


#: what a flow run needs from the project: the code and the deployments
_LINKED = ("concord", "blocks", "tasks", "flows", "deployments", "prefect.yaml")

#: the model card of the seeded checkpoint: the fields the nightly audit requires by default
MODEL_CARD = """\
---
license: apache-2.0
datasets: [penguins]
---
# A tiny stand-in for all-MiniLM-L6-v2

## Intended uses

End-to-end tests of Concord.
"""


def seed_checkpoint(folder: Path) -> Path:
    """A small BERT-like checkpoint (fp32, 40 KiB) with a model card, seeded as minilm/step-0."""
    import numpy as np
    from safetensors.numpy import save_file

    g = np.random.default_rng(7)
    folder.mkdir(parents=True)
    tensors = {"embeddings.word_embeddings.weight": g.standard_normal((256, 32)).astype(np.float32),
               "encoder.layer.0.attention.self.query.weight": g.standard_normal((32, 32)).astype(np.float32),
               "encoder.layer.0.attention.self.value.weight": g.standard_normal((32, 32)).astype(np.float32)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1}')
    (folder / "README.md").write_text(MODEL_CARD)
    return folder


#: the zombie automation's window on the served instance: the shortest it takes (a heartbeat every
#: 30 s, and half of one to spare), so that the lost-worker fault is seen soon
ZOMBIE_AFTER = 45
#: how long `start` may take: on a loaded machine the three servers' start and the seeding take minutes
START_TIMEOUT = 600


@dataclass(frozen=True)
class Served:
    api_url: str
    state_dir: Path
    watched: Path
    project_dir: Path  # where flow runs start: the deployments' relative store paths resolve here
    tier_policy: Path  # the tier policy the tier-checkpoints deployment reads (data/tiering/policy.yaml)
    tracking_uri: str  # the MLflow server of the served runs (on the PostgreSQL started with it)
    start_output: str = ""  # what `start` printed


def _serve(state_dir: Path, *args: str, timeout: float, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_PROFILE", "MLFLOW_TRACKING_URI", "CONCORD_HOME",
                        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    # the served workers (the pool's and the serving node's) ask for work every second instead of
    # every 10 s: a rollout waits on two of them in turn; and the server looks at the zombie
    # automation's window every second instead of every 5 s (the window itself is unchanged)
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="true", CONCORD_ZOMBIE_AFTER=str(ZOMBIE_AFTER),
               PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY="PT1S", **(extra or {}))
    for name in ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL", "MLFLOW_BACKEND_STORE_URI",
                 "CONCORD_SERVE_DATABASE", "CONCORD_POSTGRES_PORT"):
        env.pop(name, None)  # the databases are the served instance's own
    return subprocess.run([sys.executable, "-m", "concord_pipelines.deployments.serve", "--dir", str(state_dir), *args],
                          cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=timeout)


@contextmanager
def serving(base: Path) -> Iterator[Served]:
    """A fresh copy of the project under ``base`` served as ``make serve`` serves it (module
    docstring), with a PostgreSQL cluster of its own; everything started is stopped afterwards."""
    state_dir, project_dir = base / "serve", base / "project"
    # a fresh copy: the project's code seen from a folder of the test's own with no data/, so that
    # the seeding, the runs with the deployments' default parameters (data/stores/...) and those
    # started by events write under it
    project_dir.mkdir()
    for name in _LINKED:
        (project_dir / name).symlink_to(PROJECT_DIR / name)
    watched = project_dir / "data" / "checkpoints"  # the watcher's default
    tier_policy = project_dir / "data" / "tiering" / "policy.yaml"  # seeded
    seed = seed_checkpoint(base / "seed-checkpoint")
    # run as root, the cluster belongs to the postgres user, who cannot enter pytest's folders (0700)
    pg_dir = Path(tempfile.mkdtemp(prefix="concord-e2e-pg-"))
    pg_dir.chmod(0o755)
    extra = {"CONCORD_POSTGRES_DIR": str(pg_dir / "cluster"), "CONCORD_MLFLOW_PORT": str(free_port())}
    port = free_port()
    try:
        try:
            started = _serve(state_dir, "start", "--port", str(port), "--interval", "1", "--seed-from", str(seed),
                             "--project-dir", str(project_dir), timeout=START_TIMEOUT, extra=extra)
        except subprocess.TimeoutExpired as exc:  # what it had said names the step it was at
            said = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            started = subprocess.CompletedProcess(exc.cmd, -9, f"{said}\n(timed out after {START_TIMEOUT} s)", "")
        if started.returncode != 0:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted((state_dir / "logs").glob("*.log")))
            pytest.fail(f"serve start failed:\n{started.stdout}\n{started.stderr}\n{logs}")
        api_url = f"http://127.0.0.1:{port}/api"
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from concord_pipelines.deployments import serve

        tracking_uri = serve.read_record(state_dir)["env"]["MLFLOW_TRACKING_URI"]
        with patched_environ({"PREFECT_API_URL": api_url}), temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield Served(api_url, state_dir, watched, project_dir, tier_policy, tracking_uri, started.stdout)
    finally:
        from concord_pipelines.deployments import serve

        recorded = serve.read_record(state_dir)["processes"]
        stopped = _serve(state_dir, "stop", "--timeout", "15", timeout=120)
        (base / "stop.log").write_text(stopped.stdout + stopped.stderr)  # which process needed a SIGKILL
        left = [p.name for p in recorded if serve.is_alive(p)]
        if not left:
            shutil.rmtree(pg_dir, ignore_errors=True)
        assert not left, f"still running after stop: {left}"


@pytest.fixture(scope="package")
def served(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("served")) as instance:
        yield instance


@pytest.fixture
def client(served):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        yield c
