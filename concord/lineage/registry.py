"""The model registry: model versions × data snapshots × schema contracts, the promotion gate,
and what is recorded about a version.

A Concord model version is an MLflow registered model version whose ``source`` names the snapshot
and the stores holding it (``concord:///<root>?store=…``, :mod:`concord.lineage.sources`): an
external model pointing at the stores, never a copy of the weights, which MLflow clients download
through Concord's artifact repository (:mod:`concord.lineage.artifacts`). Everything else is written as tags on the version, readable by MLflow's own client
(:mod:`concord.lineage.tags` lists them). The data snapshot is also logged as the input of the run
that registered the version (:func:`concord.lineage.runs.dataset_input`).

Every function takes the :class:`~concord.lineage.client.Tracking` to talk to; callers hold a
:class:`concord.lineage.Lineage`, whose methods these are.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from concord.errors import ConcordError, LineageError, PromotionRefused
from concord.hashing import is_digest
from concord.lineage.client import Tracking, error_code, retry_locked, shown_uri
from concord.lineage.runs import dataset_input, log_dataset_run
from concord.lineage.sources import LEGACY_FOLDER_SCHEME, TIER_ORDER, snapshot_uri
from concord.lineage.tags import (
    EXPERIMENT_DATA,
    EXPERIMENT_LINEAGE,
    LEGACY,
    LINEAGE_PNG,
    TAG_CONTRACT,
    TAG_CONTRACT_DIGEST,
    TAG_DATA,
    TAG_DATA_NAME,
    TAG_DIGEST,
    TAG_HELD_BY,
    TAG_MODEL,
    TAG_MODEL_VERSION,
    TAG_PARENTS,
    TAG_PROMOTED,
    TAG_REPLICAS,
    TAG_ROOT,
    TAG_STORE,
    read_tags,
    replica_tags,
    replicas_of,
)
from concord.stores.base import Store

#: the scheme of sources registered before for local stores seen by a remote tracking server
#: (MLflow servers refuse file:// sources), still read
REMOTE_LOCAL_SCHEME = LEGACY_FOLDER_SCHEME


def manifest_uri(store: Store, root: str) -> str:
    """The URI of ``root``'s manifest in ``store``: ``file:///…`` for a folder, ``s3://…`` on S3
    (what a version's source was before ``concord://``)."""
    from concord.stores.local import LocalDirStore

    if isinstance(store, LocalDirStore):
        return (Path(os.path.realpath(store.root)) / "manifests" / f"{root}.json").as_uri()
    return f"{store.uri.rstrip('/')}/manifests/{root}.json"


# ---------------------------------------------------------------------- registering


def register_model_version(
    tracking: Tracking,
    name: str,
    root: str,
    stores: Sequence[str | Store],
    *,
    data_snapshot: str | None = None,
    contract: str | Any | None = None,
    parents: Iterable[str] = (),
    tiers: dict[str, str] | None = None,
    description: str = "",
    data_store: Store | None = None,
    contracts_store: Store | None = None,
    on_registered: Callable[[str, str, str], Any] | None = None,
) -> dict:
    """Register snapshot ``root`` as a new version of model ``name``, pointing at the first store
    in ``stores`` that holds it. ``data_snapshot`` and the ``contract`` (``name@version``) are
    looked up in ``data_store`` / ``contracts_store`` when given, else in ``stores``.

    The version's description is ``description`` followed by its lineage as links
    (:func:`version_description`). ``on_registered(name, version, run_id)`` is called once the
    version exists, before the run that registered it ends (:class:`concord.lineage.Lineage`
    logs the lineage picture there)."""
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise LineageError(f"model name {name!r}: give a non-empty name without '/'")
    if not is_digest(root):
        raise LineageError(f"root {root!r}: give the 64-hex snapshot root that `concord snapshot` printed")
    if not stores:
        raise LineageError("no stores given: name at least one store that holds the snapshot")
    tracking.ensure_ready()  # an unreachable server fails here, before any store is read

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
    source_store, source = _source(tracking, [s for _, s in holders], held_by, root)

    parent_specs = [split_version(p) for p in parents]
    for p_name, p_version in parent_specs:
        try:
            retry_locked(tracking.client.get_model_version, p_name, p_version)
        except Exception as exc:
            if error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise LineageError(
                f"parent {p_name}/{p_version} is not a registered model version in "
                f"{shown_uri(tracking.tracking_uri)}; register it first or fix the name"
            ) from exc

    tags: dict[str, str] = {
        TAG_ROOT: root,
        TAG_STORE: source_store.uri,
        **replica_tags(held_by),
    }
    inputs = []
    if data_snapshot is not None:
        snap, df = _find_data(data_snapshot, [data_store] if data_store else opened)
        tags[TAG_DATA] = snap.id
        tags[TAG_DATA_NAME] = snap.name
        tags[TAG_DIGEST] = snap.digest
        inputs.append(dataset_input(snap, df, "training"))
    if contract is not None:
        found = _find_contract(contract, [contracts_store] if contracts_store else opened)
        tags[TAG_CONTRACT] = found.ref
        tags[TAG_CONTRACT_DIGEST] = found.digest()
    if parent_specs:
        tags[TAG_PARENTS] = ",".join(f"{n}/{v}" for n, v in parent_specs)

    client = tracking.client
    run_tags = {TAG_MODEL: name, **{k: v for k, v in tags.items() if k not in (TAG_HELD_BY, TAG_REPLICAS)}}
    run_id = log_dataset_run(tracking, EXPERIMENT_LINEAGE, f"register {name}", run_tags, inputs)
    try:
        note = version_description(tracking, description, tags, run_id)
        try:
            retry_locked(client.create_registered_model, name)
        except Exception as exc:
            if error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                raise
        mv = retry_locked(
            client.create_model_version,
            name,
            source,
            run_id=run_id,
            tags=tags,
            description=note,
            await_creation_for=None,
        )
    except BaseException:
        with suppress(Exception):  # keep the original error, not a failure to close the run
            client.set_terminated(run_id, "FAILED")
        raise
    version = str(mv.version)
    retry_locked(client.set_tag, run_id, TAG_MODEL_VERSION, f"{name}/{version}")
    if on_registered is not None:
        on_registered(name, version, run_id)
    retry_locked(client.set_terminated, run_id)
    return {"name": name, "version": version, "root": root, "source": source, "run_id": run_id, "tags": tags}


# ---------------------------------------------------------------------- what MLflow's UI shows


def ui_link(*parts: str) -> str:
    """A link into MLflow's UI, relative to the page it is shown on (``#/models/<name>/versions/<n>``),
    so it works on whichever host and port the tracking server is reached at."""
    return "#/" + "/".join(urllib.parse.quote(str(p), safe="") for p in parts)


def version_description(tracking: Tracking, note: str, tags: dict[str, str], run_id: str) -> str:
    """A model version's description (markdown, which MLflow's UI renders): ``note`` first, then
    its lineage as links: the versions it derives from, its data snapshot's run (else the run
    that registered it, which has the data as its input), its contract and snapshot, and its
    lineage picture, the artifact ``lineage/lineage.png`` of the run that registered it."""
    exp_id = tracking.experiment_id(EXPERIMENT_LINEAGE)
    run = ui_link("experiments", exp_id, "runs", run_id)
    lines = ["#### Lineage", ""]
    parents = [split_version(p) for p in parents_of(tags)]
    if parents:
        shown = ", ".join(f"[{n}/{v}]({ui_link('models', n, 'versions', v)})" for n, v in parents)
        lines.append(f"- **derived from**: {shown}")
    if tags.get(TAG_DATA):
        found = _data_run(tracking, tags[TAG_DATA])
        where = ui_link("experiments", found[0], "runs", found[1]) if found else run
        name = tags.get(TAG_DATA_NAME) or "data"
        lines.append(f"- **data snapshot**: [{name} `{tags[TAG_DATA][:12]}`]({where}) (`{tags[TAG_DATA]}`)")
    if tags.get(TAG_CONTRACT):
        lines.append(f"- **schema contract**: `{tags[TAG_CONTRACT]}`")
    lines.append(f"- **weights**: snapshot `{tags[TAG_ROOT]}` in `{tags[TAG_STORE]}`")
    lines.append(
        f"- **picture**: [{LINEAGE_PNG}]({run}/artifacts/{LINEAGE_PNG}) of [the run that registered this version]({run})"
    )
    text = "\n".join(lines) + "\n"
    return f"{note.rstrip()}\n\n{text}" if note and note.strip() else text


def _data_run(tracking: Tracking, snapshot_id: str) -> tuple[str, str] | None:
    """The experiment and run id of the newest run that logged data snapshot ``snapshot_id``."""
    client = tracking.client
    exp = retry_locked(client.get_experiment_by_name, EXPERIMENT_DATA)
    if exp is None:
        return None
    for key in (TAG_DATA, LEGACY[TAG_DATA]):
        runs = retry_locked(
            client.search_runs, [exp.experiment_id], f"tags.`{key}` = '{quote(snapshot_id)}'",
            max_results=1, order_by=["attributes.start_time DESC"],
        )
        if runs:
            return exp.experiment_id, runs[0].info.run_id
    return None


def _source(tracking: Tracking, holders: list[Store], held_by: list[dict], root: str) -> tuple[Store, str]:
    """The model version's source, ``concord:///<root>?store=…`` naming every holder (hot tiers
    first), and the store it names first. A remote server is read from other machines, so there
    a store they could reach (not a folder) comes first."""
    from concord.stores.local import LocalDirStore

    tier = {h["store"]: TIER_ORDER.get(h["tier"], len(TIER_ORDER)) for h in held_by}
    ordered = sorted(holders, key=lambda s: (tracking.remote and isinstance(s, LocalDirStore), tier.get(s.uri, 0)))
    return ordered[0], snapshot_uri(root, [s.uri for s in ordered])


def record_replica(tracking: Tracking, root: str, store: str | Store, tier: str = "hot") -> list[str]:
    """Record that ``store`` holds ``root`` on tier ``tier``, on every version with that root.

    Returns the ``name/version`` of each version updated.
    """
    if not is_digest(root):
        raise LineageError(f"root {root!r}: give a 64-hex snapshot root")
    tracking.ensure_ready()
    uri = store.uri if isinstance(store, Store) else _open(store).uri
    client = tracking.client
    updated = []
    for mv in search_tagged(tracking, TAG_ROOT, root):
        held = replicas_of(read_tags(mv.tags))
        held = [h for h in held if h.get("store") != uri] + [{"store": uri, "tier": tier}]
        for key, value in replica_tags(held).items():
            retry_locked(client.set_model_version_tag, mv.name, str(mv.version), key, value)
        updated.append(f"{mv.name}/{mv.version}")
    return sorted(updated)


# ---------------------------------------------------------------------- the promotion gate


def promote(tracking: Tracking, name: str, version: str | int, alias: str, *, data_store: Store, contracts: Store) -> dict:
    """Point ``alias`` at ``name``/``version`` only if the gate passes:

    * the version records a data snapshot and a contract;
    * the contract is the one recorded (same digest) and the data snapshot validates against it;
    * the contract is compatible with the contract of the version ``alias`` points at now.

    Raises :class:`PromotionRefused` listing every failed check; returns the checks done.
    """
    from concord.lineage import contracts as contract_lib
    from concord.lineage.data import load_data

    _check_alias(alias)
    tracking.ensure_ready()
    client = tracking.client
    version = str(version)
    mv = get_version(tracking, name, version)
    tags = read_tags(mv.tags)
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

    current = _alias_holder(tracking, name, alias)
    checks["previous"] = f"{name}/{current.version}" if current is not None else None
    if current is not None and str(current.version) != version and contract is not None:
        old_ref = read_tags(current.tags).get(TAG_CONTRACT)
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
    retry_locked(client.set_registered_model_alias, name, alias, version)
    retry_locked(client.set_model_version_tag, name, version, f"{TAG_PROMOTED}{alias}", when)
    return {"name": name, "version": version, "alias": alias, "time": when, "checks": checks}


_ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def _check_alias(alias: str) -> str:
    """MLflow's alias rules, checked before the gate runs rather than after it passed."""
    if not isinstance(alias, str) or not _ALIAS.match(alias) or re.fullmatch(r"[vV][0-9]+", alias) or alias.lower() == "latest":
        raise LineageError(
            f"alias {alias!r}: use letters, digits, '_' or '-' (not 'latest', and not v<number>, "
            "which MLflow reserves for versions)"
        )
    return alias


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


# ---------------------------------------------------------------------- reading


def model_lineage(tracking: Tracking, name: str, version: str | int) -> dict:
    """Everything recorded about one version: its snapshot, data, contract, parents (resolved
    recursively), replicas, aliases and the digests of its run's dataset inputs."""
    tracking.ensure_ready()
    mv = get_version(tracking, name, str(version))
    tags = read_tags(mv.tags)
    out = _version_summary(mv)
    out["data_snapshots"] = [tags[TAG_DATA]] if tags.get(TAG_DATA) else []
    out["contract"] = (
        {"ref": tags[TAG_CONTRACT], "digest": tags.get(TAG_CONTRACT_DIGEST)} if tags.get(TAG_CONTRACT) else None
    )
    out["parents"] = _resolve_parents(tracking, tags, {f"{mv.name}/{mv.version}"})
    out["replicas"] = replicas_of(tags)
    out["promoted"] = {k[len(TAG_PROMOTED):]: v for k, v in tags.items() if k.startswith(TAG_PROMOTED)}
    out["inputs"] = []
    if mv.run_id:
        run = retry_locked(tracking.client.get_run, mv.run_id)
        for di in run.inputs.dataset_inputs:
            itags = read_tags({t.key: t.value for t in di.tags})
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


def data_lineage(tracking: Tracking, snapshot_id: str) -> list[dict]:
    """Every model version that records ``snapshot_id`` as its data, ordered by name and version."""
    if not is_digest(snapshot_id):
        raise LineageError(f"data snapshot id {snapshot_id!r}: give the 64-hex id register_data returned")
    tracking.ensure_ready()
    versions = search_tagged(tracking, TAG_DATA, snapshot_id)
    aliases = version_aliases(tracking, {mv.name for mv in versions})
    out = []
    for mv in versions:
        d = _version_summary(mv)
        d["aliases"] = sorted(aliases.get((mv.name, str(mv.version)), []))
        out.append(d)
    return sorted(out, key=lambda d: (d["name"], int(d["version"])))


def promoted_roots(tracking: Tracking) -> list[str]:
    """The snapshot roots of every model version that holds an alias (e.g. champion): the
    checkpoints tiering must keep hot and warm whatever their age."""
    tracking.ensure_ready()
    client = tracking.client
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
            root = read_tags(client.get_model_version(n, str(version)).tags).get(TAG_ROOT)
            if root:
                roots.add(root)
    return sorted(roots)


def get_version(tracking: Tracking, name: str, version: str):
    """Model version ``name``/``version``; :class:`LineageError` when it does not exist."""
    try:
        return retry_locked(tracking.client.get_model_version, name, version)
    except Exception as exc:
        if error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise LineageError(f"model version {name}/{version} does not exist in {shown_uri(tracking.tracking_uri)}") from exc


def _alias_holder(tracking: Tracking, name: str, alias: str):
    try:
        return retry_locked(tracking.client.get_model_version_by_alias, name, alias)
    except Exception as exc:
        # MLflow answers INVALID_PARAMETER_VALUE for an alias no version holds (the alias itself was checked)
        if error_code(exc) not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        return None


def version_aliases(tracking: Tracking, names: Iterable[str]) -> dict[tuple[str, str], list[str]]:
    """``(name, version)`` → aliases, from the registered models (search results omit them)."""
    out: dict[tuple[str, str], list[str]] = {}
    for n in names:
        rm = retry_locked(tracking.client.get_registered_model, n)
        for alias, v in (rm.aliases or {}).items():
            out.setdefault((n, str(v)), []).append(alias)
    return out


def search_versions(tracking: Tracking, filter_string: str) -> list:
    """Every model version matching ``filter_string``, all pages."""
    out, token = [], None
    while True:
        page = retry_locked(tracking.client.search_model_versions, filter_string, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def search_tagged(tracking: Tracking, key: str, value: str) -> list:
    """Every model version whose tag ``key`` is ``value``, under its name today or its old one
    (:data:`~concord.lineage.tags.LEGACY`), each version once."""
    found: dict[tuple[str, str], Any] = {}
    for k in (key, LEGACY.get(key)):
        if k:
            for mv in search_versions(tracking, f"tags.`{k}` = '{quote(value)}'"):
                found.setdefault((mv.name, str(mv.version)), mv)
    return list(found.values())


def _resolve_parents(tracking: Tracking, tags: dict, seen: set[str]) -> list[dict]:
    out = []
    for p in parents_of(tags):
        p_name, p_version = split_version(p)
        entry: dict[str, Any] = {"name": p_name, "version": p_version, "root": None, "parents": []}
        if p in seen:
            entry["cycle"] = True
            out.append(entry)
            continue
        try:
            pmv = get_version(tracking, p_name, p_version)
        except LineageError:
            entry["missing"] = True
        else:
            ptags = read_tags(pmv.tags)
            entry["root"] = ptags.get(TAG_ROOT)
            entry["parents"] = _resolve_parents(tracking, ptags, seen | {p})
        out.append(entry)
    return out


# ---------------------------------------------------------------------- helpers


def split_version(spec: str) -> tuple[str, str]:
    """``'name/3'`` → ``('name', '3')``; :class:`LineageError` for anything else."""
    name, sep, version = str(spec).strip().rpartition("/")
    if not sep or not name or not version.isdigit():
        raise LineageError(f"parent {spec!r}: name a model version as 'model-name/VERSION', e.g. 'llama-base/3'")
    return name, version


def quote(value: str) -> str:
    """``value`` quoted for a single-quoted string of an MLflow search filter."""
    return value.replace("'", "\\'")


def parents_of(tags: dict) -> list[str]:
    """The ``name/version`` of the parents a version's tags record."""
    return [p for p in (tags.get(TAG_PARENTS) or "").split(",") if p]


def _version_summary(mv) -> dict:
    tags = read_tags(mv.tags)
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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _open(spec: str | Store) -> Store:
    from concord.stores import open_store

    return open_store(spec, create=False)


def _find_data(snapshot_id: str, stores: list[Store]):
    """The data snapshot's facts and table from the first store that has them."""
    from concord.errors import DataSnapshotNotFoundError
    from concord.lineage.data import data_info, load_data

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
