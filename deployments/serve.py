"""Run Concord for real on one machine, and stop exactly what was started.

    python -m concord_pipelines.deployments.serve [--dir data/serve] start [--port 4200] [--watch DIR ...] [--interval 30]
                                                         [--project-dir .] [--seed-from CHECKPOINT_DIR]
    python -m concord_pipelines.deployments.serve [--dir data/serve] status
    python -m concord_pipelines.deployments.serve [--dir data/serve] restart NAME [NAME ...] [--timeout 15]
    python -m concord_pipelines.deployments.serve [--dir data/serve] stop [--timeout 15]

``start`` first starts the project's PostgreSQL (:mod:`concord_pipelines.deployments.postgres`: a
cluster in ``<project>/data/postgres`` on 127.0.0.1, recorded as ``postgres``; ``make serve-prereqs``
installs Debian's ``postgresql``) for the servers below whose database no variable names:
``$PREFECT_API_DATABASE_CONNECTION_URL`` (the Prefect server's) and ``$MLFLOW_BACKEND_STORE_URI``
(the MLflow server's) point them at another PostgreSQL; ``$CONCORD_SERVE_DATABASE=sqlite``, or no
PostgreSQL installed (one line says how to install it), keeps both on SQLite. Then, unless
``$MLFLOW_TRACKING_URI`` names a tracking server to use, it starts ``mlflow server`` on 127.0.0.1
(port 5000, ``$CONCORD_MLFLOW_PORT``, or a free one when 5000 is taken; its artifacts in
``<project>/data/mlflow-artifacts``) and gives every process it starts that address as
``MLFLOW_TRACKING_URI``. Then it uses the Prefect server at ``$PREFECT_API_URL`` when it is set,
otherwise starts ``prefect server start`` on 127.0.0.1 (its home under ``<dir>/prefect``, analytics
off). While that server comes up, it seeds what the deployments' default parameters name into
``<project>/data`` where it is missing (:mod:`concord_pipelines.deployments.seed`; ``--seed-from
DIR`` for another checkpoint than all-MiniLM-L6-v2), then waits until the server is healthy. Then it
creates the ``concord-process`` and ``concord-serving`` work pools if missing, registers the
project's blocks, deploys everything in ``prefect.yaml`` (their triggers included), applies the
automations (``concord_pipelines.deployments.automations``, notifying the block named by
``$CONCORD_NOTIFY_BLOCK`` if set), and starts a process worker, the checkpoint watcher and one
serving node (``node-local``: a worker of ``concord-serving`` polling its own queue; the serving
deployments' defaults check out into ``<project>/data/serving/node-local``). Each step is one line,
and a step that runs longer says so every 5 s. When CNCF distribution's ``docker-registry`` is
installed, it also starts an OCI registry on 127.0.0.1 (a free port; its config and blobs under
``<project>/data/oci-registry``) and deploys ``publish-oci/champion-to-registry`` again with that
registry as its ``repository``; when it is missing, it says how to install it, and that deployment
is given no repository, so its runs fail saying the same. It ends by printing the UI's address, the
registry's, and MLflow's runs list of Concord's lineage (or the ``mlflow ui`` command of a sqlite
``$MLFLOW_TRACKING_URI``).
Every process it starts runs in its own process group, logs to ``<dir>/logs/<name>.log``
and is recorded (pid, start time, command, folder, log) in ``<dir>/processes.json`` the moment it
starts, so ``stop`` can end it even after a failed start; the environment variables it sets for
them are recorded there too. Flow runs send a heartbeat every 30 s (Prefect's shortest;
``$PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` overrides it), which the zombie automation of
``concord_pipelines.deployments.automations`` watches.

``restart NAME`` ends the recorded process NAME (``server``, ``worker``, ``watcher``, ``node-local``,
``registry``, ``mlflow`` or ``postgres``) if it still
runs, and starts it again with its recorded command, folder and environment, in its place in the
record; for the server it then waits until the API is healthy again. The server comes back on the
same port with the same database: flow runs waiting on it carry on, since Prefect's client retries
a call that cannot connect ``$PREFECT_CLIENT_MAX_RETRIES`` times (default 5: about a minute, backing
off 2, 4, 8, 16, 32 s). A worker that died is replaced by ``restart worker``. ``start`` while only
some recorded processes run starts nothing and names the ones to restart.

``stop`` ends only the recorded processes, the last started first (their process groups: SIGTERM,
SIGINT for PostgreSQL's fast shutdown, then SIGKILL after the timeout) and removes the record. A recorded pid that is no longer the recorded process (it exited,
and the number may since belong to someone else) is left alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from concord.files import atomic_write
from concord_pipelines.deployments import postgres
from concord_pipelines.deployments.automations import HEARTBEAT_SECONDS

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DIR = PROJECT_DIR / "data" / "serve"
WORK_POOL = "concord-process"
#: the pool of serving nodes: each node's worker polls its own queue (``--work-queue NODE``); a
#: rollout's checkouts run on the nodes themselves
SERVING_POOL = "concord-serving"
#: the one serving node started here: its work queue, its worker's name and its record's name
LOCAL_NODE = "node-local"
#: CNCF distribution, as Debian packages it (``make test-prereqs`` installs it)
REGISTRY_EXE = "docker-registry"
REGISTRY_INSTALL = "sudo apt-get install -y docker-registry, or `make test-prereqs`"
#: the deployment that publishes to the registry started here, and the path its artifacts go under
PUBLISH_DEPLOYMENT = "champion-to-registry"
REGISTRY_PATH = "models"
RECORD = "processes.json"
WATCHER_STATE = "watcher-state.json"
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
#: the database of the Prefect server started here, and that of the MLflow server (both read by
#: the servers themselves); where unset, the project's PostgreSQL holds them
PREFECT_DB_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
PREFECT_DB_ENVS = (PREFECT_DB_ENV, "PREFECT_SERVER_DATABASE_CONNECTION_URL")
MLFLOW_BACKEND_ENV = "MLFLOW_BACKEND_STORE_URI"
#: ``sqlite`` keeps both servers on SQLite (the Prefect server's in its home, MLflow's data/mlflow.db)
DATABASE_ENV = "CONCORD_SERVE_DATABASE"
MLFLOW_PORT_ENV = "CONCORD_MLFLOW_PORT"


class ServeError(RuntimeError):
    """A step of ``start`` failed; the message says which and where its output is."""


# ----------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class Started:
    """One process started by ``start``: enough to find it again, and only it."""

    name: str
    pid: int
    command: list[str]
    log: str
    started_at: float | None  # the kernel's start time of the pid (None where it cannot be read)
    cwd: str | None = None  # the folder it started in (None: the folder of the command that started it)
    stop_signal: int | None = None  # what ends it first (None: SIGTERM); PostgreSQL's fast shutdown is SIGINT


def _proc_start_time(pid: int) -> float | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return float(fields[19])  # field 22 of stat(5), counted after the command name


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def is_alive(p: Started) -> bool:
    """True while the recorded process itself runs: the pid exists, is no zombie, and (where the
    start time can be read) started when the recorded one did."""
    try:
        os.kill(p.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # not ours: a pid reused by another user's process
    if _proc_state(p.pid) == "Z":
        return False
    if p.started_at is not None and _proc_start_time(p.pid) != p.started_at:
        return False  # the pid now belongs to another process
    return True


def read_record(state_dir: Path) -> dict:
    path = Path(state_dir) / RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"processes": []}
    except ValueError as exc:
        raise ServeError(f"{path} is not valid JSON ({exc}); stop the processes by hand and remove it") from exc
    data["processes"] = [Started(**p) for p in data.get("processes", [])]
    return data


def write_record(state_dir: Path, data: Mapping) -> None:
    """Write the record atomically (temp name in the same folder, then rename)."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    out = dict(data, processes=[asdict(p) for p in data.get("processes", [])])
    atomic_write(state_dir / RECORD, json.dumps(out, indent=2).encode(), mode=0o600)


def _launch(state_dir: Path, name: str, command: Sequence[str], env: Mapping[str, str] | None,
            cwd: Path | str | None, stop_signal: int | None = None) -> Started:
    """Start ``command`` in its own process group, logging to ``logs/<name>.log``."""
    logs = Path(state_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=dict(env) if env is not None else None, cwd=cwd)
    return Started(name, proc.pid, list(command), str(log_path), _proc_start_time(proc.pid),
                   str(cwd) if cwd is not None else None, stop_signal)


def spawn(state_dir: Path, name: str, command: Sequence[str], *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, stop_signal: int | None = None) -> Started:
    """Start ``command`` in its own process group, logging to ``logs/<name>.log``, and add it to
    the record before returning."""
    started = _launch(state_dir, name, command, env, cwd, stop_signal)
    data = read_record(state_dir)
    data["processes"] = [*data["processes"], started]
    write_record(state_dir, data)
    return started


def recorded(data: Mapping, name: str, *, where: Path) -> Started:
    """The last process recorded under ``name``; a ServeError naming the recorded ones if none is."""
    found = [p for p in data["processes"] if p.name == name]
    if not found:
        names = ", ".join(dict.fromkeys(p.name for p in data["processes"])) or "nothing"
        raise ServeError(f"no process named {name!r} is recorded in {Path(where) / RECORD} (recorded: {names}); "
                         "name one of those, or run `start` first")
    return found[-1]


def replaced(processes: Sequence[Started], old: Started, new: Started) -> list[Started]:
    """The record's processes with ``old`` replaced by ``new`` in its place (stop ends them in reverse)."""
    return [new if p == old else p for p in processes]


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def terminate(p: Started, *, timeout: float = 15.0) -> str:
    """End a recorded process and its process group; what happened, in a word."""
    if not is_alive(p):
        return "not running"
    try:
        group = os.getpgid(p.pid)
    except ProcessLookupError:
        return "not running"
    own_group = group == p.pid  # started with start_new_session: the group is the process's own
    kill = (lambda sig: os.killpg(group, sig)) if own_group else (lambda sig: os.kill(p.pid, sig))
    try:
        kill(p.stop_signal or signal.SIGTERM)
    except ProcessLookupError:
        return "not running"
    deadline = time.monotonic() + timeout
    while is_alive(p) and time.monotonic() < deadline:
        time.sleep(0.1)
    how = "stopped"
    if is_alive(p):
        how = "killed"
    if is_alive(p) or (own_group and _group_exists(group)):  # the process, or children it left
        try:
            kill(signal.SIGKILL)
        except ProcessLookupError:
            pass
    return how


def stop_all(state_dir: Path, *, timeout: float = 15.0, out=sys.stdout) -> int:
    """Stop every recorded process, the last started first, and remove the record."""
    state_dir = Path(state_dir)
    data = read_record(state_dir)
    if not data["processes"]:
        print("nothing recorded as started: nothing to stop", file=out)
    for p in reversed(data["processes"]):
        with _Ticking(f"stopping {p.name}", out):
            how = terminate(p, timeout=timeout)
        print(f"{p.name} (pid {p.pid}): {how}", file=out, flush=True)
    (state_dir / RECORD).unlink(missing_ok=True)
    return 0


def status(state_dir: Path, *, out=sys.stdout) -> int:
    """Print the recorded processes and whether each still runs; 0 when all run or nothing was
    started (that is an answer, not a fault), 3 when a recorded process died."""
    data = read_record(state_dir)
    if not data["processes"]:
        print("not running (nothing recorded): `make serve` starts it", file=out)
        return 0
    if data.get("ui_url"):
        print(f"Prefect UI: {data['ui_url']}", file=out)
    if data.get("registry"):
        print(f"OCI registry: {data['registry']} (plain HTTP)", file=out)
    if data.get("postgres"):
        print(f"PostgreSQL: {data['postgres']} (the databases of the servers started here)", file=out)
    tracking = (data.get("env") or {}).get("MLFLOW_TRACKING_URI", "")
    if tracking.startswith("http"):
        print(f"MLflow: {tracking}", file=out)
    alive = [is_alive(p) for p in data["processes"]]
    for p, up in zip(data["processes"], alive):
        print(f"{p.name:<10} pid {p.pid:<8} {'running' if up else 'dead':<8} log {p.log}", file=out)
    return 0 if all(alive) else 3


def restart(state_dir: Path, names: Sequence[str], *, timeout: float = 15.0, server_timeout: float = 120.0,
            out=sys.stdout) -> int:
    """End each named recorded process if it runs and start it again as recorded (module docstring)."""
    state_dir = Path(state_dir).resolve()
    data = read_record(state_dir)
    # every name checked before anything stops; a name given twice is restarted once
    old = [recorded(data, name, where=state_dir) for name in dict.fromkeys(names)]
    if "env" not in data:  # started again without it, the server would open another database
        raise ServeError(f"{state_dir / RECORD} does not record the environment its processes started in "
                         "(written by an older version): `stop`, then `start` again")
    env = dict(os.environ, **data["env"])
    for p in old:
        print(f"{p.name} (pid {p.pid}): {terminate(p, timeout=timeout)}", file=out)
        new = _launch(state_dir, p.name, p.command, env, p.cwd, p.stop_signal)
        data = read_record(state_dir)
        write_record(state_dir, dict(data, processes=replaced(data["processes"], p, new)))
        print(f"{p.name} started again (pid {new.pid})", file=out)
        if p.name == "server" and data.get("api_url"):
            _wait_healthy(data["api_url"], new, server_timeout)
            print(f"the Prefect API answers again at {data['api_url']}", file=out)
    return 0


# ----------------------------------------------------------------------------- start


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_healthy(api_url: str, p: Started | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _healthy(api_url):
        if p is not None and not is_alive(p):
            raise ServeError(f"the Prefect server exited; see {p.log}")
        if time.monotonic() > deadline:
            raise ServeError(f"no healthy Prefect API at {api_url} after {timeout:.0f} s" + (f"; see {p.log}" if p else ""))
        time.sleep(0.5)


def _run(state_dir: Path, name: str, command: Sequence[str], env: Mapping[str, str], *, cwd: Path = PROJECT_DIR,
         check: bool = True) -> int:
    """Run a one-off command to completion, its output appended to ``logs/<name>.log``."""
    log_path = Path(state_dir) / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        rc = subprocess.run(list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(env), cwd=cwd).returncode
    if check and rc != 0:
        raise ServeError(f"`{' '.join(command)}` failed with exit code {rc}; see {log_path}")
    return rc


def _concurrently(steps: Sequence) -> None:
    """Run each of ``steps`` (callables) in a thread of its own, all at once; the first error raised
    by any of them is raised once every step has ended."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(steps)) as pool:
        futures = [pool.submit(step) for step in steps]
    for future in futures:
        future.result()


class _Ticking:
    """Prints ``... still WHAT (N s)`` every ``every`` seconds while its ``with`` block runs, so a
    long step is never silent; ``done`` (the step's time) is printed at the end when asked."""

    def __init__(self, what: str, out, *, every: float = 5.0, done: bool = False) -> None:
        import threading

        self.what, self.out, self.every, self.done = what, out, every, done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._t0 = time.monotonic()

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            print(f"  ... still {self.what} ({time.monotonic() - self._t0:.0f} s)", file=self.out, flush=True)

    def __enter__(self) -> _Ticking:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, kind, *_) -> None:
        self._stop.set()
        self._thread.join()
        if self.done and kind is None:
            print(f"  {self.what}: done in {time.monotonic() - self._t0:.0f} s", file=self.out, flush=True)


def _prefect() -> str:
    exe = Path(sys.executable).parent / "prefect"
    return str(exe) if exe.exists() else "prefect"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def registry_exe() -> str | None:
    """CNCF distribution's ``docker-registry`` on the PATH, None when it is not installed."""
    return shutil.which(REGISTRY_EXE)


def registry_command(exe: str, data_dir: Path, port: int) -> list[str]:
    """Write the config of a registry on 127.0.0.1:``port`` speaking plain HTTP, its blobs under
    ``data_dir/storage``, into ``data_dir/config.yml``; the command that serves it."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "config.yml"
    # JSON strings are YAML strings: any folder name is written safely
    atomic_write(config, ("version: 0.1\nlog:\n  level: warn\n"
                          f"storage:\n  filesystem:\n    rootdirectory: {json.dumps(str(data_dir / 'storage'))}\n"
                          "  delete:\n    enabled: true\n"
                          f"http:\n  addr: {json.dumps(f'127.0.0.1:{port}')}\n").encode())
    return [exe, "serve", str(config)]


def start_registry(state_dir: Path, data_dir: Path, env: Mapping[str, str], exe: str | None, out) -> str | None:
    """Start (and record) a registry keeping its blobs in ``data_dir`` on a free port of 127.0.0.1
    (5000 stays free for the MLflow server): its ``host:port``. Without ``exe``, one line says how to
    install it, and None."""
    if exe is None:
        print(f"no OCI registry: {REGISTRY_EXE} is not installed; install it ({REGISTRY_INSTALL}), then `make stop` "
              f"and `make serve`; until then publish-oci/{PUBLISH_DEPLOYMENT} fails saying so", file=out)
        return None
    port = _free_port()
    address = f"127.0.0.1:{port}"
    print(f"starting an OCI registry on {address} (its blobs in {data_dir})", file=out)
    spawn(state_dir, "registry", registry_command(exe, data_dir, port), env=env, cwd=state_dir)
    write_record(state_dir, dict(read_record(state_dir), registry=address))
    return address


def _wait_registry(address: str, p: Started, timeout: float) -> None:
    _wait_answers(f"http://{address}/v2/", p, "OCI registry", timeout, every=0.2)


def _declares(project_dir: Path, deployment: str) -> bool:
    """True when the project's ``prefect.yaml`` declares a deployment named ``deployment``."""
    import yaml

    try:
        doc = yaml.safe_load((Path(project_dir) / "prefect.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    return any(isinstance(d, dict) and d.get("name") == deployment for d in doc.get("deployments") or [])


def tracking_uri(project_dir: Path = PROJECT_DIR) -> str:
    """The MLflow database of served runs (and of ``make demo``): ``$MLFLOW_TRACKING_URI``, else
    ``<project>/data/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI", "").strip() or f"sqlite:///{Path(project_dir).resolve() / 'data' / 'mlflow.db'}"


def mlflow_ui_command(uri: str) -> str:
    """What opens the MLflow UI on ``uri``: a server's address (its lineage runs list where there
    is one), or, for a sqlite database, the ``mlflow ui`` command of this project's virtual
    environment (as the README writes it)."""
    from concord.lineage.client import shown_uri

    if uri.startswith(("http://", "https://")):
        runs = mlflow_runs_url(uri)
        return f"open {shown_uri(runs or uri)}" + ("  (the runs list of Concord's lineage; every experiment is "
                                                    "on the runs view, not the GenAI one)" if runs else "")
    exe = Path(sys.executable).parent / "mlflow"
    try:
        shown = str(exe.relative_to(Path.cwd()))
    except ValueError:
        shown = str(exe)
    return f"{shown} ui --backend-store-uri {uri} --port 5000   # then open http://127.0.0.1:5000"


def _shown_db(url: str) -> str:
    """A database URL without its password; SQLite where it is empty (Prefect's default)."""
    if not url:
        return "SQLite"
    from concord.lineage.client import shown_uri

    return shown_uri(url)


def _venv_exe(name: str) -> str:
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else name


def _mlflow_port(out) -> int:
    """``$CONCORD_MLFLOW_PORT``, else 5000 when it is free, else a free port (said in one line)."""
    configured = os.environ.get(MLFLOW_PORT_ENV, "").strip()
    if configured:
        return int(configured)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", 5000))
            return 5000
        except OSError:
            pass
    port = _free_port()
    print(f"port 5000 is taken: the MLflow server gets {port} (set {MLFLOW_PORT_ENV} to choose)", file=out)
    return port


def _wait_answers(url: str, p: Started, what: str, timeout: float, *, every: float = 0.5) -> None:
    """Wait until ``url`` answers 200; a ServeError when ``p`` exits first or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if not is_alive(p):
            raise ServeError(f"the {what} exited; see {p.log}")
        if time.monotonic() > deadline:
            raise ServeError(f"no {what} answers at {url} after {timeout:.0f} s; see {p.log}")
        time.sleep(every)


def start_databases(state_dir: Path, project_dir: Path, env: Mapping[str, str], *, own_server: bool, own_mlflow: bool,
                    out, timeout: float = 60.0) -> dict[str, str]:
    """The database variables of the servers started here: for the Prefect server (when started
    here and ``$PREFECT_API_DATABASE_CONNECTION_URL`` is unset) and the MLflow server (when started
    here and ``$MLFLOW_BACKEND_STORE_URI`` is unset), a database of the project's PostgreSQL,
    started (and recorded, as ``postgres``) first. With ``$CONCORD_SERVE_DATABASE=sqlite``, or
    where PostgreSQL is not installed (one line says how to install it), both stay on SQLite."""
    wanted: dict[str, tuple[str, str]] = {}  # variable -> (database, SQLAlchemy driver)
    if own_server and not any(env.get(v) for v in PREFECT_DB_ENVS):
        wanted[PREFECT_DB_ENV] = ("prefect", "asyncpg")
    if own_mlflow and not env.get(MLFLOW_BACKEND_ENV):
        wanted[MLFLOW_BACKEND_ENV] = ("mlflow", "psycopg")
    sqlite = {MLFLOW_BACKEND_ENV: tracking_uri(project_dir)} if MLFLOW_BACKEND_ENV in wanted else {}
    if not wanted:
        return {}
    if env.get(DATABASE_ENV, "").strip().lower() == "sqlite":
        print(f"{DATABASE_ENV}=sqlite: the Prefect and MLflow servers keep their data in SQLite", file=out)
        return sqlite
    cluster = postgres.cluster(project_dir)
    if cluster is None:
        print(f"no PostgreSQL: it is not installed; the servers keep their data in SQLite, which locks under "
              f"concurrent runs: install it ({postgres.INSTALL}), then `make stop` and `make serve`", file=out)
        return sqlite
    try:
        with _Ticking("creating the PostgreSQL cluster", out):
            cluster.init(lambda line: print(line, file=out, flush=True))
        port = int(env.get(postgres.PORT_ENV, "").strip() or _free_port())
        print(f"starting PostgreSQL on 127.0.0.1:{port} (its cluster in {cluster.root})", file=out, flush=True)
        p = spawn(state_dir, "postgres", cluster.command(port), env=env, cwd=cluster.root,
                  stop_signal=signal.SIGINT)  # a fast shutdown: it is stopped last, when nothing uses it any more
        with _Ticking("waiting for PostgreSQL", out):
            cluster.wait_ready(port, lambda: is_alive(p), timeout, p.log)
        made = [db for db, _ in wanted.values() if cluster.ensure_database(port, db)]
        if made:
            print(f"  created the database{'s' if len(made) > 1 else ''} {', '.join(made)}", file=out)
        write_record(state_dir, dict(read_record(state_dir), postgres=f"127.0.0.1:{port}"))
        return {var: cluster.url(port, db, driver=driver) for var, (db, driver) in wanted.items()}
    except postgres.PostgresError as exc:
        raise ServeError(str(exc)) from exc


def start(state_dir: Path, *, port: int = 4200, watch: Sequence[str] = (), interval: float = 30.0,
          project_dir: Path = PROJECT_DIR, server_timeout: float = 120.0, seed_from: Path | None = None,
          out=sys.stdout) -> int:
    """Start everything (see the module's docstring). ``project_dir`` holds the ``prefect.yaml``
    deployed and is where flow runs start, so the relative store paths of the deployments'
    parameters resolve under it; the code is imported from this project whatever it is. First,
    what the deployments' defaults name is seeded into ``<project_dir>/data`` where missing
    (:mod:`concord_pipelines.deployments.seed`; ``seed_from`` is the checkpoint seeded, default all-MiniLM-L6-v2)."""
    state_dir, project_dir = Path(state_dir).resolve(), Path(project_dir).resolve()
    data = read_record(state_dir)
    running = [p for p in data["processes"] if is_alive(p)]
    if running:
        dead = [p.name for p in data["processes"] if not is_alive(p)]
        print(f"already running ({', '.join(p.name for p in running)}); UI at {data.get('ui_url')}. "
              + (f"Not running: {', '.join(dead)}: `python -m concord_pipelines.deployments.serve --dir {state_dir} restart "
                 f"{' '.join(dead)}` starts them again." if dead else "`make stop` first to start again."), file=out)
        return 0
    if data["processes"]:  # a stale record: everything in it has exited
        print("removing the record of processes that are no longer running", file=out)
    write_record(state_dir, {"processes": []})

    ours = {"CONCORD_PROJECT_DIR": str(project_dir), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_DIR), os.environ.get("PYTHONPATH")])),
            HEARTBEAT_ENV: os.environ.get(HEARTBEAT_ENV) or str(HEARTBEAT_SECONDS)}
    prefect = _prefect()
    try:
        server = mlflow_server = None
        own_server = not os.environ.get("PREFECT_API_URL")
        own_mlflow = not os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        if own_server:
            api_url, ui_url = f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}"
            if _healthy(api_url):
                raise ServeError(f"a Prefect server already answers on port {port} and was not started here: "
                                 f"set PREFECT_API_URL={api_url} to use it, or pass --port")
            ours["PREFECT_HOME"] = str(state_dir / "prefect")
        else:
            api_url = os.environ["PREFECT_API_URL"].rstrip("/")
            ui_url = api_url[: -len("/api")] if api_url.endswith("/api") else api_url
            print(f"using the Prefect server at {api_url}", file=out)
        ours["PREFECT_API_URL"] = api_url
        # recorded, so that `restart` starts a process again in the environment it had
        write_record(state_dir, dict(read_record(state_dir), api_url=api_url, ui_url=ui_url, env=ours))
        env = dict(os.environ, **ours)
        # started first: it is ready long before the deployments are
        registry = start_registry(state_dir, project_dir / "data" / "oci-registry", env, registry_exe(), out)
        # the databases: the project's PostgreSQL for what no variable points elsewhere
        ours.update(start_databases(state_dir, project_dir, env, own_server=own_server, own_mlflow=own_mlflow, out=out))
        if own_mlflow:
            mlflow_port = _mlflow_port(out)
            ours.update(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{mlflow_port}", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        else:
            ours["MLFLOW_TRACKING_URI"] = tracking_uri(project_dir)
        write_record(state_dir, dict(read_record(state_dir), env=ours))
        env = dict(os.environ, **ours)
        if own_mlflow:
            artifacts = project_dir / "data" / "mlflow-artifacts"
            print(f"starting an MLflow server on 127.0.0.1:{mlflow_port} (on {_shown_db(env.get(MLFLOW_BACKEND_ENV, ''))}, "
                  f"its artifacts in {artifacts})", file=out, flush=True)
            mlflow_server = spawn(state_dir, "mlflow", [_venv_exe("mlflow"), "server", "--host", "127.0.0.1",
                                                        "--port", str(mlflow_port), "--workers", "2",
                                                        "--artifacts-destination", str(artifacts)],
                                  env=env, cwd=state_dir)
        if own_server:
            print(f"starting a Prefect server on 127.0.0.1:{port} (on {_shown_db(next((env[v] for v in PREFECT_DB_ENVS if env.get(v)), ''))})",
                  file=out, flush=True)
            server = spawn(state_dir, "server", [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                           env=env, cwd=state_dir)
        if mlflow_server is not None:
            with _Ticking("waiting for the MLflow server", out, done=True):
                _wait_answers(f"{ours['MLFLOW_TRACKING_URI']}/health", mlflow_server, "MLflow server", server_timeout)
        # seeded while the Prefect server starts: neither needs the other
        print(f"seeding what the deployments' defaults name into {project_dir / 'data'} (only what is missing)",
              file=out, flush=True)
        _seed(project_dir, seed_from, ours["MLFLOW_TRACKING_URI"], state_dir / WATCHER_STATE, out)
        with _Ticking("waiting for the Prefect server", out, done=True):
            _wait_healthy(api_url, server, server_timeout)

        # the work pools and the blocks at once, each step's output in a log of its own
        def pool_step(pool: str) -> None:
            log = f"setup-{pool}"
            if _run(state_dir, log, [prefect, "work-pool", "inspect", pool], env, check=False) != 0:
                print(f"creating the work pool {pool}", file=out, flush=True)
                _run(state_dir, log, [prefect, "work-pool", "create", pool, "--type", "process"], env)

        print(f"registering blocks and the work pools {WORK_POOL} and {SERVING_POOL}", file=out, flush=True)
        with _Ticking("registering blocks and work pools", out, done=True):
            _concurrently([lambda pool=pool: pool_step(pool) for pool in (WORK_POOL, SERVING_POOL)]
                          + [lambda: _run(state_dir, "setup-blocks", [prefect, "block", "register", "-m", "concord_pipelines.blocks"], env)])
        print("deploying everything in prefect.yaml", file=out, flush=True)
        with _Ticking("deploying", out, done=True):
            _run(state_dir, "setup", [prefect, "--no-prompt", "deploy", "--all"], env, cwd=project_dir)

        # the publishing deployment given its repository and the automations applied, at once
        steps = []
        if _declares(project_dir, PUBLISH_DEPLOYMENT):
            repository = f"{registry}/{REGISTRY_PATH}" if registry else None
            print(f"deploying {PUBLISH_DEPLOYMENT} again with " + (f"repository {repository}" if repository else "no repository"),
                  file=out, flush=True)
            steps.append(lambda: _run(state_dir, "setup", [prefect, "--no-prompt", "deploy", "--name", PUBLISH_DEPLOYMENT,
                                                           "--param", f"repository={json.dumps(repository)}"],
                                      env, cwd=project_dir))
        print("applying the automations", file=out, flush=True)
        steps.append(lambda: _run(state_dir, "setup-automations", [sys.executable, "-m", "concord_pipelines.deployments.automations", "--apply"],
                                  env))
        with _Ticking("applying the automations" + (f" and deploying {PUBLISH_DEPLOYMENT}" if len(steps) > 1 else ""),
                      out, done=True):
            _concurrently(steps)

        print(f"starting a worker on {WORK_POOL}", file=out)
        spawn(state_dir, "worker", [prefect, "worker", "start", "--pool", WORK_POOL], env=env, cwd=PROJECT_DIR)
        print(f"starting the serving node {LOCAL_NODE} (a worker on its queue of {SERVING_POOL}; its link under "
              f"{project_dir / 'data' / 'serving' / LOCAL_NODE})", file=out)
        spawn(state_dir, LOCAL_NODE, [prefect, "worker", "start", "--pool", SERVING_POOL, "--work-queue", LOCAL_NODE,
                                      "--name", LOCAL_NODE], env=env, cwd=PROJECT_DIR)
        watched = [w if "://" in w else str(Path(w).resolve()) for w in watch] or [str(project_dir / "data" / "checkpoints")]
        for w in watched:
            if "://" not in w:
                Path(w).mkdir(parents=True, exist_ok=True)
        print(f"starting the checkpoint watcher on {', '.join(watched)}", file=out)
        spawn(state_dir, "watcher",
              [sys.executable, "-m", "concord_pipelines.deployments.watcher", *(a for w in watched for a in ("--watch", w)),
               "--state", str(state_dir / WATCHER_STATE), "--interval", str(interval)],
              env=env, cwd=project_dir)
        if registry:
            _wait_registry(registry, recorded(read_record(state_dir), "registry", where=state_dir), 30.0)
        time.sleep(1.0)
        dead = [p.name for p in read_record(state_dir)["processes"] if not is_alive(p)]
        if dead:
            raise ServeError(f"{', '.join(dead)} exited right after starting; see {state_dir / 'logs'}")
    except (ServeError, KeyboardInterrupt) as exc:
        print(f"start failed: {exc}; stopping what was started", file=out)
        stop_all(state_dir, out=out)
        return 1
    print(f"Concord is running. Prefect UI: {ui_url}  (logs in {state_dir / 'logs'}; `make stop` ends it)", file=out)
    if registry:
        print(f"OCI registry: {registry} (plain HTTP); publish-oci pushes to {registry}/{REGISTRY_PATH}", file=out)
    print(f"Lineage, drills and audits are in MLflow: {mlflow_ui_command(ours['MLFLOW_TRACKING_URI'])}", file=out)
    return 0


def mlflow_runs_url(uri: str) -> str | None:
    """The MLflow UI's runs list of Concord's lineage experiment on the server ``uri``
    (``/#/experiments/ID/runs``: the classic runs view, not the GenAI one), None when the
    experiment is not there yet or the server does not answer."""
    from concord.lineage.tags import EXPERIMENT_LINEAGE

    try:
        from mlflow import MlflowClient

        exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(EXPERIMENT_LINEAGE)
    except Exception:  # the UI's address is printed anyway
        return None
    return f"{uri.rstrip('/')}/#/experiments/{exp.experiment_id}/runs" if exp is not None else None


def _seed(project_dir: Path, source: Path | None, uri: str, watcher_state: Path, out) -> None:
    from concord.home import patched_environ

    # MLflow's own lines (its INFO logs, "View run ... at" of each run against a server) stay out of
    # this output: the seeding says what it made
    with _Ticking("seeding", out), patched_environ({"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}):
        import mlflow  # noqa: F401  (imported first: importing it sets its loggers' levels)

        from concord.errors import ConcordError
        from concord_pipelines.deployments.seed import Seeder

        quiet = logging.getLogger("mlflow")
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            Seeder(project_dir, source=source, tracking_uri=uri, watcher_state=watcher_state,
                   say=lambda line: print(f"  {line}", file=out, flush=True)).run()
        except (ConcordError, OSError, ImportError) as exc:
            raise ServeError(f"seeding {project_dir / 'data'} failed: {exc}") from exc
        finally:
            quiet.setLevel(level)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m concord_pipelines.deployments.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                   help="where the record, the logs, the watcher state and the server's home go (default data/serve)")
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("start", help="start PostgreSQL, an MLflow and a Prefect server on it (or reuse yours), deploy, "
                                     "start a worker, the watcher, a serving node and an OCI registry")
    s.add_argument("--port", type=int, default=int(os.environ.get("CONCORD_SERVE_PORT", "4200")),
                   help="port of the Prefect server started here (default 4200, or $CONCORD_SERVE_PORT)")
    s.add_argument("--watch", action="append", default=[], metavar="PATH_OR_S3_PREFIX",
                   help="what the watcher watches (repeatable; default data/checkpoints)")
    s.add_argument("--interval", type=float, default=30.0, help="seconds between the watcher's scans (default 30)")
    s.add_argument("--project-dir", type=Path, default=PROJECT_DIR,
                   help="the folder with the prefect.yaml to deploy, where flow runs start (default: this project)")
    s.add_argument("--server-timeout", type=float, default=120.0, help="seconds to wait for the server (default 120)")
    s.add_argument("--seed-from", type=Path, default=None, metavar="CHECKPOINT_DIR",
                   help="the checkpoint seeded as data/checkpoints/minilm/step-0 when missing (default: all-MiniLM-L6-v2)")
    t = sub.add_parser("stop", help="stop every process start started, and only those")
    t.add_argument("--timeout", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL (default 15)")
    r = sub.add_parser("restart", help="end recorded processes (if they run) and start them again as recorded")
    r.add_argument("names", nargs="+", metavar="NAME",
                   help=f"server, worker, watcher, {LOCAL_NODE}, registry, mlflow or postgres (as `status` lists them)")
    r.add_argument("--timeout", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL (default 15)")
    r.add_argument("--server-timeout", type=float, default=120.0, help="seconds to wait for the server (default 120)")
    sub.add_parser("status", help="list the processes start started and whether each runs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.action == "start":
            return start(args.dir, port=args.port, watch=args.watch, interval=args.interval,
                         project_dir=args.project_dir, server_timeout=args.server_timeout, seed_from=args.seed_from)
        if args.action == "stop":
            return stop_all(args.dir, timeout=args.timeout)
        if args.action == "restart":
            return restart(args.dir, args.names, timeout=args.timeout, server_timeout=args.server_timeout)
        return status(args.dir)
    except ServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    code = main()
    # what the seeding imported (MLflow, PyTorch) is millions of objects: the interpreter's last
    # collections on the way out would spend seconds on them, with nothing left to free
    gc.freeze()
    sys.exit(code)
