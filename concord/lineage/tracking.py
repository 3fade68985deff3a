"""Lineage in MLflow: model versions × data snapshots × schema contracts.

A Concord model version is an MLflow registered model version whose ``source`` is the URI of the
snapshot's manifest in a Concord store (``file:///…/manifests/<root>.json`` or
``s3://bucket/prefix/manifests/<root>.json``): an external model pointing at the store, never a copy
of the weights. Everything else is written as tags on the version, readable by MLflow's own client:

- ``concord.root``: the snapshot root (the Merkle root of the weights);
- ``concord.store``: URI of the store the ``source`` points into;
- ``concord.data_snapshot``, ``concord.data_name``, ``concord.digest``: the data snapshot it was
  trained or evaluated on (id, name, BLAKE3 of the file);
- ``concord.contract`` (``name@version``) and ``concord.contract_digest``: its schema contract;
- ``concord.parents``: comma-separated ``name/version`` of the versions it derives from;
- ``concord.held_by``: JSON list of ``{"store": …, "tier": …}``, every replica;
- ``concord.promoted.<alias>``: when the promotion gate let the version take that alias.

The data snapshot is also logged as a run input (an MLflow dataset whose digest is the start of
Concord's BLAKE3 digest: MLflow keeps at most 36 characters; the full digest and the snapshot id are
input tags), so MLflow's UI shows which data a version came from.

Tracking defaults to sqlite in ``$CONCORD_HOME`` (``./data``) unless ``MLFLOW_TRACKING_URI`` is set.
:meth:`Lineage.ensure_ready` runs before every write: it creates a sqlite schema once, under a file
lock (two processes creating it at once corrupt it), and checks that an HTTP tracking server answers,
so an unreachable server fails before any store is touched. Writes that meet sqlite's "database is
locked" are retried with backoff, so processes registering at once all succeed.

mlflow is imported inside the functions that use it.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from concord.errors import (
    ConcordError,
    LineageError,
    LineageUnreachableError,
    PromotionRefused,
)
from concord.hashing import is_digest
from concord.stores.base import Store

if TYPE_CHECKING:  # pragma: no cover
    from concord.lineage.data import DataSnapshot

EXPERIMENT_DATA = "concord-data"
EXPERIMENT_LINEAGE = "concord-lineage"

TAG_ROOT = "concord.root"
TAG_STORE = "concord.store"
TAG_DATA = "concord.data_snapshot"
TAG_DATA_NAME = "concord.data_name"
TAG_DIGEST = "concord.digest"
TAG_CONTRACT = "concord.contract"
TAG_CONTRACT_DIGEST = "concord.contract_digest"
TAG_PARENTS = "concord.parents"
TAG_HELD_BY = "concord.held_by"
TAG_MODEL = "concord.model"
TAG_MODEL_VERSION = "concord.model_version"
TAG_PROMOTED = "concord.promoted."

#: MLflow stores a dataset digest in a 36-character column
MLFLOW_DIGEST_CHARS = 36
HEALTH_TIMEOUT = 3.0
#: local stores seen by a remote tracking server: MLflow servers refuse file:// sources (a path on
#: the client's disk means nothing to the server), so the path is named with its host instead
REMOTE_LOCAL_SCHEME = "concord-file"

_LOCK_RETRIES = 12
_SQLITE_READY: set[str] = set()  # sqlite databases whose schema this process has checked
_SQLITE_READY_LOCK = threading.Lock()


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else a sqlite database in ``$CONCORD_HOME`` (default ``./data``)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri
    home = os.environ.get("CONCORD_HOME") or "data"
    return f"sqlite:///{os.path.abspath(os.path.join(home, 'mlflow.db'))}"


def manifest_uri(store: Store, root: str) -> str:
    """The URI of ``root``'s manifest in ``store``: ``file:///…`` for a folder, ``s3://…`` on S3."""
    from concord.stores.local import LocalDirStore

    if isinstance(store, LocalDirStore):
        return (Path(os.path.realpath(store.root)) / "manifests" / f"{root}.json").as_uri()
    return f"{store.uri.rstrip('/')}/manifests/{root}.json"


def _redact(uri: str) -> str:
    """``uri`` without a password it may carry (``http://user:***@host``), for messages."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _is_locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


def _retry_locked(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """Call ``fn``; on sqlite's "database is locked" (embedded or behind a server) retry with backoff."""
    attempt = 0
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            attempt += 1
            if not _is_locked(exc) or attempt >= _LOCK_RETRIES:
                raise
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))


def _error_code(exc: BaseException) -> str | None:
    return getattr(exc, "error_code", None)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _split_version(spec: str) -> tuple[str, str]:
    name, sep, version = str(spec).strip().rpartition("/")
    if not sep or not name or not version.isdigit():
        raise LineageError(f"parent {spec!r}: name a model version as 'model-name/VERSION', e.g. 'llama-base/3'")
    return name, version


def _sqlite_path(uri: str) -> str | None:
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return os.path.abspath(path)


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _open(spec: "str | Store") -> Store:
    from concord.stores import open_store

    return open_store(spec, create=False)


class Lineage:
    """Lineage records in one MLflow tracking server (and its model registry)."""

    def __init__(self, tracking_uri: str | None = None, *, health_timeout: float = HEALTH_TIMEOUT) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.health_timeout = health_timeout
        self._client = None
        self._ready = False
        self._experiments: dict[str, str] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Lineage({_redact(self.tracking_uri)!r})"

    @property
    def remote(self) -> bool:
        return urllib.parse.urlparse(self.tracking_uri).scheme in ("http", "https")

    @property
    def client(self):
        """The MLflow client for this tracking URI (built once)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    from mlflow import MlflowClient

                    self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        return self._client

    # ------------------------------------------------------------------ readiness

    def ensure_ready(self) -> None:
        """Make sure the tracking backend can take writes: create a sqlite schema once (under a
        file lock), or check that an HTTP server answers. Raises :class:`LineageUnreachableError`."""
        if self._ready:
            return
        db = _sqlite_path(self.tracking_uri)
        if self.remote:
            self._check_server()
        elif db is not None:
            self._create_sqlite_schema(db)
        self._ready = True

    def _check_server(self) -> None:
        parts = urllib.parse.urlsplit(self.tracking_uri)
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
        url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
        try:
            with urllib.request.urlopen(url, timeout=self.health_timeout):
                return
        except urllib.error.HTTPError:
            return  # it answered (a proxy may not route /health): the API calls will tell the rest
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LineageUnreachableError(_redact(self.tracking_uri), f"GET {url} failed ({reason})") from exc

    def _create_sqlite_schema(self, db: str) -> None:
        with _SQLITE_READY_LOCK:
            if db in _SQLITE_READY:
                return
            with _file_lock(db + ".lock"):
                # building the tracking and registry stores creates (or checks) every table
                self.client.search_experiments(max_results=1)
                self.client.search_registered_models(max_results=1)
            _SQLITE_READY.add(db)

    def _experiment_id(self, name: str) -> str:
        if name in self._experiments:
            return self._experiments[name]
        client = self.client
        exp = _retry_locked(client.get_experiment_by_name, name)
        if exp is None:
            location = None
            db = _sqlite_path(self.tracking_uri)
            if db is not None:  # keep run artifacts next to the database, not in the working folder
                location = (Path(db).parent / "mlflow-artifacts" / name).as_uri()
            try:
                exp_id = _retry_locked(client.create_experiment, name, artifact_location=location)
            except Exception as exc:
                if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp_id = client.get_experiment_by_name(name).experiment_id
        else:
            exp_id = exp.experiment_id
        self._experiments[name] = exp_id
        return exp_id

    # ------------------------------------------------------------------ writing

    def _log_dataset_run(
        self,
        experiment: str,
        run_name: str,
        run_tags: dict[str, str],
        dataset_inputs: list,
    ) -> str:
        client = self.client
        run = _retry_locked(client.create_run, self._experiment_id(experiment), run_name=run_name, tags=run_tags)
        run_id = run.info.run_id
        if dataset_inputs:
            _retry_locked(client.log_inputs, run_id, datasets=dataset_inputs)
        return run_id

    def _dataset_input(self, snap: "DataSnapshot", df, context: str):
        """An MLflow dataset input for ``snap`` (its table ``df``), tagged with Concord's id and digest."""
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        import mlflow.data

        digest = snap.digest[:MLFLOW_DIGEST_CHARS]
        with warnings.catch_warnings():  # hints about model signatures and ambiguous local sources
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(df, source=_data_source_uri(snap), name=snap.name, digest=digest)
            entity = dataset._to_mlflow_entity()  # computes the schema and profile
        tags = [
            InputTag(key=MLFLOW_DATASET_CONTEXT, value=context),
            InputTag(key=TAG_DATA, value=snap.id),
            InputTag(key=TAG_DIGEST, value=snap.digest),
        ]
        return DatasetInput(dataset=entity, tags=tags)

    def log_data_snapshot(self, snap: "DataSnapshot", df=None, *, store: Store | None = None) -> str:
        """Log ``snap`` as the input of a run in experiment ``concord-data``; return the run id.

        Without ``df`` the table is loaded from ``store`` (default: the store ``snap`` names).
        """
        self.ensure_ready()
        if df is None:
            from concord.lineage.data import load_data

            df = load_data(store or _open(snap.store), snap.id)
        tags = {TAG_DATA: snap.id, TAG_DIGEST: snap.digest, TAG_DATA_NAME: snap.name, TAG_STORE: snap.store}
        run_id = self._log_dataset_run(
            EXPERIMENT_DATA, f"data {snap.name}", tags, [self._dataset_input(snap, df, "snapshot")]
        )
        _retry_locked(self.client.set_terminated, run_id)
        return run_id

    def register_model_version(
        self,
        name: str,
        root: str,
        stores: Sequence["str | Store"],
        *,
        data_snapshot: str | None = None,
        contract: "str | Any | None" = None,
        parents: Iterable[str] = (),
        tiers: dict[str, str] | None = None,
        description: str = "",
        data_store: Store | None = None,
        contracts_store: Store | None = None,
    ) -> dict:
        """Register snapshot ``root`` as a new version of model ``name``, pointing at the first store
        in ``stores`` that holds it. ``data_snapshot`` and the ``contract`` (``name@version``) are
        looked up in ``data_store`` / ``contracts_store`` when given, else in ``stores``."""
        if not isinstance(name, str) or not name.strip() or "/" in name:
            raise LineageError(f"model name {name!r}: give a non-empty name without '/'")
        if not is_digest(root):
            raise LineageError(f"root {root!r}: give the 64-hex snapshot root that `concord snapshot` printed")
        if not stores:
            raise LineageError("no stores given: name at least one store that holds the snapshot")
        self.ensure_ready()  # an unreachable server fails here, before any store is read

        opened = [_open(s) for s in stores]
        holders = [(str(spec), s) for spec, s in zip(stores, opened) if s.has_manifest(root)]
        if not holders:
            raise LineageError(
                f"no store holds snapshot {root}: looked in {', '.join(s.uri for s in opened)}. "
                "Snapshot the checkpoint into one of them (`concord snapshot`) or sync it there "
                "(`concord sync`) before registering it."
            )
        tiers = dict(tiers or {})
        held_by = [{"store": s.uri, "tier": tiers.get(s.uri) or tiers.get(spec) or "hot"} for spec, s in holders]
        source_store, source = self._source([s for _, s in holders], root)

        parent_specs = [_split_version(p) for p in parents]
        for p_name, p_version in parent_specs:
            try:
                _retry_locked(self.client.get_model_version, p_name, p_version)
            except Exception as exc:
                if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                    raise
                raise LineageError(
                    f"parent {p_name}/{p_version} is not a registered model version in "
                    f"{_redact(self.tracking_uri)}; register it first or fix the name"
                ) from exc

        tags: dict[str, str] = {
            TAG_ROOT: root,
            TAG_STORE: source_store.uri,
            TAG_HELD_BY: json.dumps(sorted(held_by, key=lambda h: h["store"])),
        }
        inputs = []
        if data_snapshot is not None:
            snap, df = _find_data(data_snapshot, [data_store] if data_store else opened)
            tags[TAG_DATA] = snap.id
            tags[TAG_DATA_NAME] = snap.name
            tags[TAG_DIGEST] = snap.digest
            inputs.append(self._dataset_input(snap, df, "training"))
        if contract is not None:
            found = _find_contract(contract, [contracts_store] if contracts_store else opened)
            tags[TAG_CONTRACT] = found.ref
            tags[TAG_CONTRACT_DIGEST] = found.digest()
        if parent_specs:
            tags[TAG_PARENTS] = ",".join(f"{n}/{v}" for n, v in parent_specs)

        client = self.client
        run_tags = {TAG_MODEL: name, **{k: v for k, v in tags.items() if k != TAG_HELD_BY}}
        run_id = self._log_dataset_run(EXPERIMENT_LINEAGE, f"register {name}", run_tags, inputs)
        try:
            try:
                _retry_locked(client.create_registered_model, name)
            except Exception as exc:
                if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                    raise
            mv = _retry_locked(
                client.create_model_version,
                name,
                source,
                run_id=run_id,
                tags=tags,
                description=description or None,
                await_creation_for=None,
            )
        except BaseException:
            with suppress(Exception):  # keep the original error, not a failure to close the run
                client.set_terminated(run_id, "FAILED")
            raise
        version = str(mv.version)
        _retry_locked(client.set_tag, run_id, TAG_MODEL_VERSION, f"{name}/{version}")
        _retry_locked(client.set_terminated, run_id)
        return {"name": name, "version": version, "root": root, "source": source, "run_id": run_id, "tags": tags}

    def _source(self, holders: list[Store], root: str) -> tuple[Store, str]:
        """The model version's source: the manifest in the first holder. A remote server refuses
        local paths, so there a store it could reach comes first, and a folder is named with its host."""
        from concord.stores.local import LocalDirStore

        if not self.remote:
            return holders[0], manifest_uri(holders[0], root)
        for s in holders:
            if not isinstance(s, LocalDirStore):
                return s, manifest_uri(s, root)
        local = urllib.parse.urlparse(manifest_uri(holders[0], root))
        return holders[0], f"{REMOTE_LOCAL_SCHEME}://{socket.gethostname()}{local.path}"

    def record_replica(self, root: str, store: "str | Store", tier: str = "hot") -> list[str]:
        """Record that ``store`` holds ``root`` on tier ``tier``, on every version with that root.

        Returns the ``name/version`` of each version updated.
        """
        if not is_digest(root):
            raise LineageError(f"root {root!r}: give a 64-hex snapshot root")
        self.ensure_ready()
        uri = store.uri if isinstance(store, Store) else _open(store).uri
        client = self.client
        updated = []
        for mv in self._search_versions(f"tags.`{TAG_ROOT}` = '{root}'"):
            held = _held_by(mv.tags)
            held = [h for h in held if h.get("store") != uri] + [{"store": uri, "tier": tier}]
            value = json.dumps(sorted(held, key=lambda h: h["store"]))
            _retry_locked(client.set_model_version_tag, mv.name, str(mv.version), TAG_HELD_BY, value)
            updated.append(f"{mv.name}/{mv.version}")
        return sorted(updated)

    # ------------------------------------------------------------------ the promotion gate

    def promote(self, name: str, version: "str | int", alias: str, *, data_store: Store, contracts: Store) -> dict:
        """Point ``alias`` at ``name``/``version`` only if the gate passes:

        * the version records a data snapshot and a contract;
        * the contract is the one recorded (same digest) and the data snapshot validates against it;
        * the contract is compatible with the contract of the version ``alias`` points at now.

        Raises :class:`PromotionRefused` listing every failed check; returns the checks done.
        """
        from concord.lineage import contracts as contract_lib
        from concord.lineage.data import load_data

        _check_alias(alias)
        self.ensure_ready()
        client = self.client
        version = str(version)
        mv = self._get_version(name, version)
        tags = dict(mv.tags)
        reasons: list[str] = []
        checks: dict[str, Any] = {}

        data_id = tags.get(TAG_DATA)
        contract_ref = tags.get(TAG_CONTRACT)
        if not data_id:
            reasons.append("no data snapshot is recorded on this version (register it with data_snapshot=…)")
        if not contract_ref:
            reasons.append("no schema contract is recorded on this version (register it with contract=…)")

        contract = None
        if contract_ref:
            try:
                contract = contract_lib.load_contract(contracts, contract_ref)
            except (ConcordError, KeyError, ValueError, OSError) as exc:
                reasons.append(f"contract {contract_ref} cannot be loaded from {contracts.uri}: {exc}")
            else:
                recorded = tags.get(TAG_CONTRACT_DIGEST)
                checks["contract"] = {"ref": contract_ref, "digest": contract.digest()}
                if recorded and recorded != contract.digest():
                    reasons.append(
                        f"contract {contract_ref} in {contracts.uri} has digest {contract.digest()}, "
                        f"but the version was registered against {recorded}"
                    )

        if data_id and contract is not None:
            try:
                df = load_data(data_store, data_id)
            except (ConcordError, KeyError, ValueError, OSError) as exc:
                reasons.append(f"data snapshot {data_id} cannot be loaded from {data_store.uri}: {exc}")
            else:
                result = contract_lib.validate(contract, df)
                failures = [_describe_failure(f) for f in getattr(result, "failures", [])]
                checks["validation"] = {"data_snapshot": data_id, "success": bool(result.success), "failures": failures}
                if not result.success:
                    listed = "; ".join(failures) or "no detail given"
                    reasons.append(f"data snapshot {data_id} violates contract {contract_ref}: {listed}")

        current = self._alias_holder(name, alias)
        checks["previous"] = f"{name}/{current.version}" if current is not None else None
        if current is not None and str(current.version) != version and contract is not None:
            old_ref = dict(current.tags).get(TAG_CONTRACT)
            if old_ref:
                try:
                    old = contract_lib.load_contract(contracts, old_ref)
                except (ConcordError, KeyError, ValueError, OSError) as exc:
                    reasons.append(
                        f"contract {old_ref} of {name}/{current.version} (now {alias!r}) cannot be "
                        f"loaded from {contracts.uri}: {exc}"
                    )
                else:
                    compat = contract_lib.compatible(old, contract)
                    breaking = [_describe_failure(b) for b in getattr(compat, "breaking", [])]
                    checks["compatibility"] = {
                        "old": old_ref,
                        "new": contract_ref,
                        "compatible": bool(compat.compatible),
                        "breaking": breaking,
                    }
                    if not compat.compatible:
                        listed = "; ".join(breaking) or "no detail given"
                        reasons.append(
                            f"contract {contract_ref} is not compatible with {old_ref} of "
                            f"{name}/{current.version}, which {alias!r} points at now: {listed}"
                        )
            else:
                checks["compatibility"] = {"old": None, "new": contract_ref, "compatible": True, "breaking": []}

        if reasons:
            raise PromotionRefused(name, version, alias, reasons)
        when = _now()
        _retry_locked(client.set_registered_model_alias, name, alias, version)
        _retry_locked(client.set_model_version_tag, name, version, f"{TAG_PROMOTED}{alias}", when)
        return {"name": name, "version": version, "alias": alias, "time": when, "checks": checks}

    # ------------------------------------------------------------------ queries

    def model_lineage(self, name: str, version: "str | int") -> dict:
        """Everything recorded about one version: its snapshot, data, contract, parents (resolved
        recursively), replicas, aliases and the digests of its run's dataset inputs."""
        self.ensure_ready()
        mv = self._get_version(name, str(version))
        tags = dict(mv.tags)
        out = _version_summary(mv)
        out["data_snapshots"] = [tags[TAG_DATA]] if tags.get(TAG_DATA) else []
        out["contract"] = (
            {"ref": tags[TAG_CONTRACT], "digest": tags.get(TAG_CONTRACT_DIGEST)} if tags.get(TAG_CONTRACT) else None
        )
        out["parents"] = self._resolve_parents(tags, {f"{mv.name}/{mv.version}"})
        out["replicas"] = _held_by(tags)
        out["promoted"] = {k[len(TAG_PROMOTED):]: v for k, v in tags.items() if k.startswith(TAG_PROMOTED)}
        out["inputs"] = []
        if mv.run_id:
            run = _retry_locked(self.client.get_run, mv.run_id)
            for di in run.inputs.dataset_inputs:
                itags = {t.key: t.value for t in di.tags}
                out["inputs"].append(
                    {
                        "name": di.dataset.name,
                        "digest": di.dataset.digest,
                        "source": di.dataset.source,
                        "context": itags.get("mlflow.data.context"),
                        "data_snapshot": itags.get(TAG_DATA),
                        "concord_digest": itags.get(TAG_DIGEST),
                    }
                )
        out["dataset_digests"] = [i["digest"] for i in out["inputs"]]
        return out

    def data_lineage(self, snapshot_id: str) -> list[dict]:
        """Every model version that records ``snapshot_id`` as its data, ordered by name and version."""
        if not is_digest(snapshot_id):
            raise LineageError(f"data snapshot id {snapshot_id!r}: give the 64-hex id register_data returned")
        self.ensure_ready()
        versions = self._search_versions(f"tags.`{TAG_DATA}` = '{snapshot_id}'")
        aliases = self._aliases({mv.name for mv in versions})
        out = []
        for mv in versions:
            d = _version_summary(mv)
            d["aliases"] = sorted(aliases.get((mv.name, str(mv.version)), []))
            out.append(d)
        return sorted(out, key=lambda d: (d["name"], int(d["version"])))

    def experiment_id(self, name: str) -> str:
        """The id of the experiment ``name``, created on first use (its artifacts beside a sqlite
        database rather than in the working folder)."""
        self.ensure_ready()
        return self._experiment_id(name)

    def promoted_roots(self) -> list[str]:
        """The snapshot roots of every model version that holds an alias (e.g. champion): the
        checkpoints tiering must keep hot and warm whatever their age."""
        self.ensure_ready()
        client = self.client
        names, token = [], None
        while True:
            page = client.search_registered_models(page_token=token)
            names += [rm.name for rm in page]
            token = page.token
            if not token:
                break
        roots: set[str] = set()
        for n in names:
            for version in (client.get_registered_model(n).aliases or {}).values():
                root = (client.get_model_version(n, str(version)).tags or {}).get(TAG_ROOT)
                if root:
                    roots.add(root)
        return sorted(roots)

    def lineage_graph(self, name: str) -> dict:
        """Nodes and edges: every version of ``name``, the versions they derive from (any model),
        their data snapshots and their contracts."""
        self.ensure_ready()
        versions = self._search_versions(f"name = '{_quote(name)}'")
        if not versions:
            raise LineageError(f"model {name!r} has no versions in {_redact(self.tracking_uri)}")
        nodes: dict[str, dict] = {}
        edges: list[dict] = []
        pending = list(versions)
        seen: set[str] = set()
        aliases = self._aliases({name})
        while pending:
            mv = pending.pop()
            key = f"{mv.name}/{mv.version}"
            if key in seen:
                continue
            seen.add(key)
            tags = dict(mv.tags)
            vid = f"version:{key}"
            nodes[vid] = {
                "id": vid,
                "kind": "version" if mv.name == name else "parent",
                "label": f"{mv.name} v{mv.version}",
                "name": mv.name,
                "version": str(mv.version),
                "root": tags.get(TAG_ROOT),
                "aliases": sorted(aliases.get((mv.name, str(mv.version)), [])),
            }
            if tags.get(TAG_DATA):
                did = f"data:{tags[TAG_DATA]}"
                label = f"data {tags.get(TAG_DATA_NAME, '')}".strip()
                nodes.setdefault(did, {"id": did, "kind": "data", "label": label, "snapshot": tags[TAG_DATA]})
                edges.append({"source": did, "target": vid, "kind": "data"})
            if tags.get(TAG_CONTRACT):
                cid = f"contract:{tags[TAG_CONTRACT]}"
                ref = tags[TAG_CONTRACT]
                nodes.setdefault(cid, {"id": cid, "kind": "contract", "label": f"contract {ref}", "ref": ref})
                edges.append({"source": cid, "target": vid, "kind": "contract"})
            for p in _parents(tags):
                edges.append({"source": f"version:{p}", "target": vid, "kind": "parent"})
                if p not in seen:
                    p_name, p_version = _split_version(p)
                    try:
                        pending.append(self._get_version(p_name, p_version))
                    except LineageError:
                        nodes.setdefault(
                            f"version:{p}",
                            {"id": f"version:{p}", "kind": "missing", "label": f"{p_name} v{p_version} (missing)",
                             "name": p_name, "version": p_version, "root": None, "aliases": []},
                        )
        ordered = sorted(nodes.values(), key=_node_order)
        return {"model": name, "nodes": ordered, "edges": sorted(edges, key=lambda e: (e["source"], e["target"]))}

    # ------------------------------------------------------------------ helpers

    def _get_version(self, name: str, version: str):
        try:
            return _retry_locked(self.client.get_model_version, name, version)
        except Exception as exc:
            if _error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise LineageError(f"model version {name}/{version} does not exist in {_redact(self.tracking_uri)}") from exc

    def _alias_holder(self, name: str, alias: str):
        try:
            return _retry_locked(self.client.get_model_version_by_alias, name, alias)
        except Exception as exc:
            # MLflow answers INVALID_PARAMETER_VALUE for an alias no version holds (the alias itself was checked)
            if _error_code(exc) not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            return None

    def _aliases(self, names: Iterable[str]) -> dict[tuple[str, str], list[str]]:
        """``(name, version)`` → aliases, from the registered models (search results omit them)."""
        out: dict[tuple[str, str], list[str]] = {}
        for n in names:
            rm = _retry_locked(self.client.get_registered_model, n)
            for alias, v in (rm.aliases or {}).items():
                out.setdefault((n, str(v)), []).append(alias)
        return out

    def _search_versions(self, filter_string: str) -> list:
        out, token = [], None
        while True:
            page = _retry_locked(self.client.search_model_versions, filter_string, page_token=token)
            out.extend(page)
            token = page.token
            if not token:
                return out

    def _resolve_parents(self, tags: dict, seen: set[str]) -> list[dict]:
        out = []
        for p in _parents(tags):
            p_name, p_version = _split_version(p)
            entry: dict[str, Any] = {"name": p_name, "version": p_version, "root": None, "parents": []}
            if p in seen:
                entry["cycle"] = True
                out.append(entry)
                continue
            try:
                pmv = self._get_version(p_name, p_version)
            except LineageError:
                entry["missing"] = True
            else:
                ptags = dict(pmv.tags)
                entry["root"] = ptags.get(TAG_ROOT)
                entry["parents"] = self._resolve_parents(ptags, seen | {p})
            out.append(entry)
        return out


_ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def _check_alias(alias: str) -> str:
    """MLflow's alias rules, checked before the gate runs rather than after it passed."""
    if not isinstance(alias, str) or not _ALIAS.match(alias) or re.fullmatch(r"[vV][0-9]+", alias) or alias.lower() == "latest":
        raise LineageError(
            f"alias {alias!r}: use letters, digits, '_' or '-' (not 'latest', and not v<number>, "
            "which MLflow reserves for versions)"
        )
    return alias


def _quote(value: str) -> str:
    return value.replace("'", "\\'")


def _parents(tags: dict) -> list[str]:
    return [p for p in (tags.get(TAG_PARENTS) or "").split(",") if p]


def _held_by(tags: dict) -> list[dict]:
    try:
        held = json.loads(tags.get(TAG_HELD_BY) or "[]")
    except ValueError:
        return []
    return [h for h in held if isinstance(h, dict)] if isinstance(held, list) else []


def _version_summary(mv) -> dict:
    tags = dict(mv.tags)
    return {
        "name": mv.name,
        "version": str(mv.version),
        "root": tags.get(TAG_ROOT),
        "source": mv.source,
        "store": tags.get(TAG_STORE),
        "run_id": mv.run_id,
        "data_snapshot": tags.get(TAG_DATA),
        "contract": tags.get(TAG_CONTRACT),
        "aliases": sorted(mv.aliases or []),
    }


def _describe_failure(item: Any) -> str:
    """One line for a validation failure (column, expectation, details) or a breaking change."""
    if isinstance(item, str):
        return item
    if hasattr(item, "expectation") and hasattr(item, "details"):
        where = f"column {item.column!r}" if getattr(item, "column", None) else "table"
        return f"{where}: {item.expectation}: {item.details}"
    if hasattr(item, "to_dict"):
        item = item.to_dict()
    if isinstance(item, dict):
        return ", ".join(f"{k}={v}" for k, v in item.items())
    return str(item)


def _data_source_uri(snap: "DataSnapshot") -> str:
    """Where the data snapshot's manifest lives (MLflow records dataset sources without checking them)."""
    if snap.store.startswith(("s3://", "file://")) or "://" in snap.store:
        return f"{snap.store.rstrip('/')}/manifests/{snap.id}.json"
    return (Path(os.path.realpath(snap.store)) / "manifests" / f"{snap.id}.json").as_uri()


def _find_data(snapshot_id: str, stores: list[Store]):
    """The data snapshot's facts and table from the first store that has them."""
    from concord.lineage.data import data_info, load_data
    from concord.errors import DataSnapshotNotFoundError

    if not is_digest(snapshot_id):
        raise LineageError(f"data snapshot {snapshot_id!r}: give the 64-hex id that register_data returned")
    for store in stores:
        try:
            snap = data_info(store, snapshot_id)
        except DataSnapshotNotFoundError:
            continue
        return snap, load_data(store, snapshot_id)
    raise LineageError(
        f"data snapshot {snapshot_id} is not registered in {', '.join(s.uri for s in stores)}; "
        "register it there with concord.lineage.data.register_data, or pass data_store=… naming the store that has it"
    )


def _find_contract(contract: Any, stores: list[Store]):
    """A Contract object as it is; a ``name@version`` string loaded from the first store that has it."""
    if not isinstance(contract, str):
        if hasattr(contract, "ref") and hasattr(contract, "digest"):
            return contract
        raise LineageError(f"contract {contract!r}: give 'name@version' or a Contract")
    from concord.lineage import contracts as contract_lib

    problems = []
    for store in stores:
        try:
            return contract_lib.load_contract(store, contract)
        except (ConcordError, KeyError, ValueError, OSError) as exc:
            problems.append(f"{store.uri}: {exc}")
    raise LineageError(
        f"contract {contract} was not found ({'; '.join(problems)}); publish it to one of these stores "
        "or pass contracts_store=… naming the store that has it"
    )


_KIND_ORDER = {"data": 0, "contract": 1, "parent": 2, "missing": 2, "version": 3}


def _node_order(node: dict):
    version = node.get("version")
    return (_KIND_ORDER.get(node["kind"], 9), node.get("name", ""), int(version) if version else 0, node["id"])


# ---------------------------------------------------------------------- pictures


def to_mermaid(graph: dict) -> str:
    """A Mermaid flowchart of a :meth:`Lineage.lineage_graph` result."""
    ids = {n["id"]: f"n{i}" for i, n in enumerate(graph["nodes"])}
    lines = ["flowchart LR"]
    for kind, style in _MERMAID_STYLES.items():
        lines.append(f"  classDef {kind} {style}")
    for n in graph["nodes"]:
        label = _node_label(n).replace('"', "#quot;").replace("\n", "<br/>")
        lines.append(f'  {ids[n["id"]]}["{label}"]:::{n["kind"]}')
    for e in graph["edges"]:
        if e["source"] in ids and e["target"] in ids:
            lines.append(f'  {ids[e["source"]]} -->|{e["kind"]}| {ids[e["target"]]}')
    return "\n".join(lines) + "\n"


_COLORS = {
    "version": "#4C78A8",
    "parent": "#72B7B2",
    "missing": "#BAB0AC",
    "data": "#F58518",
    "contract": "#54A24B",
}
_EDGE_COLORS = {"parent": "#333", "data": "#B35806", "contract": "#2E7D32"}
_MERMAID_STYLES = {k: f"fill:{c},color:#fff,stroke:#333" for k, c in _COLORS.items()}


def _node_label(n: dict) -> str:
    lines = [n["label"]]
    if n.get("root"):
        lines.append(f"root {n['root'][:12]}")
    if n.get("snapshot"):
        lines.append(n["snapshot"][:12])
    if n.get("aliases"):
        lines.append(" ".join(f"@{a}" for a in n["aliases"]))
    return "\n".join(lines)


def render_png(graph: dict, path: "str | os.PathLike") -> str:
    """Draw the graph as a PNG (left to right: data and contracts, then versions by generation)."""
    import networkx as nx
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    g = nx.DiGraph()
    for n in graph["nodes"]:
        g.add_node(n["id"], **n)
    for e in graph["edges"]:
        if e["source"] in g and e["target"] in g:
            g.add_edge(e["source"], e["target"], kind=e["kind"])
    if nx.is_directed_acyclic_graph(g):
        for layer, generation in enumerate(nx.topological_generations(g)):
            for node in generation:
                g.nodes[node]["layer"] = layer
    else:
        for node in g:
            g.nodes[node]["layer"] = 0 if g.nodes[node]["kind"] in ("data", "contract") else 1
    layers: dict[int, list[str]] = {}
    for node, data in g.nodes(data=True):
        layers.setdefault(data["layer"], []).append(node)
    pos = {}
    for layer, members in layers.items():
        members.sort(key=lambda m: _node_order(g.nodes[m]))
        for i, node in enumerate(members):
            pos[node] = (layer * 3.0, -(i - (len(members) - 1) / 2) * 1.4)
    width = max(6.0, 3.0 * len(layers) + 1.5)
    height = max(3.5, 1.1 * max((len(m) for m in layers.values()), default=1) + 1.5)

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    ax.set_axis_off()
    boxes = {}
    for node, (x, y) in pos.items():
        data = g.nodes[node]
        boxes[node] = ax.text(
            x, y, _node_label(data), ha="center", va="center", fontsize=8, color="white", zorder=3,
            bbox={"boxstyle": "round,pad=0.45", "facecolor": _COLORS.get(data["kind"], "#888"), "edgecolor": "#333"},
        )
    for u, v, data in g.edges(data=True):
        span = abs(g.nodes[v]["layer"] - g.nodes[u]["layer"])
        ax.annotate(
            "", xy=pos[v], xytext=pos[u], zorder=2,
            arrowprops={
                "arrowstyle": "-|>", "color": _EDGE_COLORS.get(data["kind"], "#555"), "lw": 1.2,
                "patchA": boxes[u].get_bbox_patch(), "patchB": boxes[v].get_bbox_patch(),
                "shrinkA": 2, "shrinkB": 2,
                # an edge that skips a layer bends, so it does not run behind the boxes in between
                "connectionstyle": f"arc3,rad={0.25 if span > 1 else 0.0}",
            },
        )
    xs = [p[0] for p in pos.values()] or [0]
    ys = [p[1] for p in pos.values()] or [0]
    ax.set_xlim(min(xs) - 1.6, max(xs) + 1.6)
    ax.set_ylim(min(ys) - 1.0, max(ys) + 1.0)
    kinds = sorted({g.nodes[n]["kind"] for n in g}, key=lambda k: _KIND_ORDER.get(k, 9))
    ax.legend(
        handles=[Patch(color=_COLORS.get(k, "#888"), label=k) for k in kinds],
        loc="upper left", fontsize=8, frameon=False,
    )
    ax.set_title(f"lineage of {graph['model']}", fontsize=10)
    fig.tight_layout()
    out = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format="png")
    return out
