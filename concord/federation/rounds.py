"""Federation rounds: aggregate one tenant's LoRA adapters from the clusters, replicate the result
back to every cluster, and record the round in the tenant's ledger.

A round of tenant ``t`` reads only refs ``t/<adapter>``, writes only the ref ``t/<out_name>``
and the ledger ``ledger/t/`` (head ``t/_ledger``): naming another tenant's adapter is refused
before any store is read. Chunks are shared by content, as everywhere in Concord; names are not.

The steps, in order (each safe to re-run): find each adapter's ref in the clusters (searched in
the order given) and restore its snapshot into a temporary folder; read and check the adapters;
aggregate them (:mod:`concord.federation.lora`); write the result as a PEFT adapter folder; snapshot it into
the first cluster under ``t/<out_name>``; replicate it to every other cluster (only missing
chunks move); append the round to the ledger. A failure before the ledger leaves no round
recorded; re-running the same round sends only what is still missing, and never records it
twice: a round whose record (inputs, options, result and the result ref's version) is already in
the ledger is reported as recorded there (``recorded``: ``already``), whoever wrote it. Registering the result
in MLflow comes last and never loses the round: its failure is logged and reported.

A ``fedex`` round also needs the frozen base model the adapters were trained on (``base``: a
ref in the clusters; default the tenant's folded base ``t/<out_name>-base`` of the round
before). The residual of the rank-R average is folded into it (:func:`concord.federation.lora.fold_into_base`)
and the new base is snapshotted as ``t/<out_name>-base`` beside the adapter: it shares every
untouched tensor with the old base, so replicating it moves only the folded modules' tensors.
The round records both (``result.base``), and lineage registers base → folded base → adapter.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from concord.errors import AdapterNotFoundError, InvalidNameError, TenantError
from concord.federation.ledger import HEAD_NAME, record_round, validate_tenant
from concord.progress import Progress, ensure
from concord.stores.base import Store, split_ref, validate_segment

if TYPE_CHECKING:  # pragma: no cover
    from concord.federation.seen import LedgerMemory
    from concord.lineage import Lineage
    from concord.trust import SigningKey

METHODS = ("exact", "stack", "fedavg", "fedex")
ROBUST = ("none", "krum", "trimmed")
DEFAULT_OUT = "federated"
#: the folded base of a ``fedex`` round is the ref ``TENANT/<out_name>`` + this
BASE_SUFFIX = "-base"

log = logging.getLogger("concord.federation")


def adapter_ref(tenant: str, name: str) -> str:
    """The ref ``tenant/NAME`` for ``NAME`` or ``tenant/NAME``; a ref in another tenant's
    namespace raises :class:`~concord.errors.TenantError`."""
    validate_tenant(tenant)
    if not isinstance(name, str) or not name or name.endswith("\n"):
        raise InvalidNameError(str(name), "adapter name")
    if "/" in name:
        owner, short = split_ref(name)
        if owner != tenant:
            raise TenantError(tenant, name, owner)
    else:
        short = validate_segment(name, "adapter name")
    if short == HEAD_NAME:
        raise InvalidNameError(name, "adapter name (the ledger's head is not an adapter)")
    return f"{tenant}/{short}"


def check_options(method: str, robust: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method {method!r}: choose one of {', '.join(METHODS)}")
    if robust not in ROBUST:
        raise ValueError(f"robust {robust!r}: choose one of {', '.join(ROBUST)}")


def locate(clusters: Sequence[Store], ref: str) -> tuple[Store, str]:
    """The first cluster holding ``ref`` (and the root it names there)."""
    for store in clusters:
        found = store.read_ref(ref)
        if found is not None:
            return store, found.root
    raise AdapterNotFoundError(ref, [s.uri for s in clusters])


def _client(report, adapter: dict | None = None) -> dict:
    out = {
        "index": report.index,
        "weight": report.weight,
        "norm": report.norm,
        "distance": report.distance,
        "accepted": report.accepted,
        "clipped": report.clipped,
        "reason": report.reason,
    }
    if adapter is not None:
        out.update(adapter)
    else:
        out["path"] = report.path
    return out


def client_ranks(adapters) -> list[int]:
    """Each adapter's rank (its largest, where modules differ)."""
    return [max(m.rank for m in a.modules.values()) for a in adapters]


def aggregate_folders(
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    method: str = "exact",
    weights: Sequence[float] | None = None,
    rank: int | None = None,
    clip_norm: float | None = None,
    robust: str = "none",
) -> dict:
    """Aggregate the PEFT adapter folders ``paths`` into a new adapter folder ``out_dir``."""
    from concord.federation import lora

    check_options(method, robust)
    if method == "fedex":
        raise ValueError(
            "fedex folds a residual into the base model, which adapter folders alone do not hold: "
            "run a round with a base (federate run --method fedex --base REF)"
        )
    adapters = [lora.read_adapter(os.fspath(p)) for p in paths]
    result = lora.aggregate(adapters, method=method, weights=list(weights) if weights else None, rank=rank, clip_norm=clip_norm, robust=robust)
    out = lora.write_adapter(result, os.fspath(out_dir), like=adapters[0])
    return {
        "method": result.method,
        "rank": result.rank,
        "ranks": dict(result.ranks),
        "client_ranks": client_ranks(adapters),
        "clients": [_client(c) for c in result.clients],
        "relative_error": result.relative_error,
        "modules": len(result.modules),
        "base_model": result.base_model,
        "out": os.path.abspath(out),
    }


def run_round(
    tenant: str,
    clusters: Sequence[Store],
    adapters: Sequence[str],
    *,
    method: str = "exact",
    rank: int | None = None,
    weights: Sequence[float] | None = None,
    clip_norm: float | None = None,
    robust: str = "none",
    out_name: str = DEFAULT_OUT,
    ledger_store: Store | None = None,
    lineage: Lineage | None = None,
    progress: Progress | None = None,
    key: SigningKey | None = None,
    memory: LedgerMemory | None = None,
    cosigners: Sequence[SigningKey] = (),
    base: str | None = None,
) -> dict:
    """Run one federation round of ``tenant`` over ``adapters`` (ref names ``tenant/NAME`` or
    ``NAME``) held by ``clusters``; see the module's docstring for the steps.

    ``key`` (the first cluster's) signs the round as it is appended; ``cosigners`` are the keys
    of the other clusters, in order (``cosigners[i]`` belongs to ``clusters[i + 1]``): each
    cluster checks the aggregate it received (:func:`cosign`) and adds its signature to the round
    and the head, so a policy with a threshold can ask for a quorum of clusters.

    With ``memory`` (this machine's memory of ledgers, :mod:`concord.federation.seen`) a ledger
    behind or unlike what was seen of it before is refused before any adapter is read
    (:class:`~concord.errors.LedgerRollbackError`), and the round recorded is remembered.

    Returns the round: ``tenant, round, hash, prev, ref, root, method, rank, ranks`` (per module),
    ``client_ranks, clients, relative_error, inputs, replicas, ledger, recorded, ledger_note,
    lineage``.
    """
    validate_tenant(tenant)
    check_options(method, robust)
    if out_name == HEAD_NAME:
        raise InvalidNameError(out_name, "output name (the ledger's head is not an adapter)")
    out_ref = adapter_ref(tenant, out_name)
    refs = [adapter_ref(tenant, a) for a in adapters]  # another tenant's adapter: refused before any read
    if not refs:
        raise ValueError("name at least one adapter to aggregate")
    if len(set(refs)) != len(refs):
        raise ValueError(f"an adapter is named twice: {', '.join(refs)}")
    clusters = list(clusters)
    if not clusters:
        raise ValueError("name at least one cluster store")
    if len(cosigners) > len(clusters) - 1:
        raise ValueError(
            f"{len(cosigners) + (key is not None)} signing key(s) for {len(clusters)} cluster(s): give at most one key per cluster, in the clusters' order"
        )
    if len({s.uri for s in clusters}) != len(clusters):
        raise ValueError(f"a cluster store is named twice: {', '.join(s.uri for s in clusters)}")
    ledger_store = ledger_store or clusters[0]
    prog = ensure(progress)
    if memory is not None:  # never append onto a ledger rolled back below what this machine saw
        memory.check(ledger_store, tenant)

    found = [(ref, *locate(clusters, ref)) for ref in refs]
    inputs = [{"adapter": ref, "root": root, "cluster": store.uri} for ref, store, root in found]
    base_out = f"{out_ref}{BASE_SUFFIX}"
    if method == "fedex":
        base_ref = base or base_out
        if base is None and all(s.read_ref(base_out) is None for s in clusters):
            raise ValueError(
                f"a fedex round folds into the base model: name its ref (base=..., --base REF); after the first round "
                f"it defaults to {base_out}, the folded base of the round before"
            )
        base_store, base_root = locate(clusters, base_ref)
    elif base is not None:
        raise ValueError(f"base applies to method 'fedex' only, not {method!r}")
    from concord.federation import lora  # torch comes with it: only once there is work for it
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate

    with tempfile.TemporaryDirectory(prefix="concord-federation-") as tmp:
        paths = []
        for i, (_ref, store, root) in enumerate(found):
            path = os.path.join(tmp, f"client-{i}")
            restore(store, load_manifest(store, root), path, progress=prog)
            paths.append(path)
        read = [lora.read_adapter(p) for p in paths]
        result = lora.aggregate(
            read, method=method, weights=list(weights) if weights else None, rank=rank, clip_norm=clip_norm, robust=robust
        )
        out_dir = lora.write_adapter(result, os.path.join(tmp, "result"), like=read[0])
        folded = None
        if method == "fedex":
            base_dir = os.path.join(tmp, "base")
            restore(base_store, load_manifest(base_store, base_root), base_dir, progress=prog)
            fold = lora.fold_into_base(
                base_dir, result.residuals, os.path.join(tmp, "folded-base"), fan_in_fan_out=bool(read[0].config.get("fan_in_fan_out"))
            )
            # the new base goes in first: an adapter is never there without the base it needs
            base_snap = snapshot(
                fold.path, clusters[0], ref=base_out, message=f"base of {tenant} with the residual of a fedex round folded in", progress=prog
            )
            folded = {
                "ref": base_out, "root": base_snap.root, "version": base_snap.ref_version, "parent": base_root, "from": base_ref,
                "modules": len(fold.tensors), "folded_bytes": fold.folded_bytes, "bytes_sent": base_snap.new_bytes,
            }
        snap = snapshot(
            out_dir,
            clusters[0],
            ref=out_ref,
            message=f"federation of {len(refs)} adapter(s) of {tenant} ({result.method})",
            progress=prog,
        )
    replicas = [
        {"store": clusters[0].uri, "root": snap.root, "chunks_sent": snap.new_chunks, "bytes_sent": snap.new_bytes, "ref_version": snap.ref_version}
    ]
    base_replicas: list[dict] = []
    if len(clusters) > 1:
        from concord.trust.copying import signature_problem

        if folded is not None:
            for r in replicate(clusters[0], clusters[1:], ref=base_out, progress=prog, check_signature=signature_problem):
                base_replicas.append({"store": r.store, "root": r.root, "chunks_sent": r.chunks_sent, "bytes_sent": r.bytes_sent})
        for r in replicate(clusters[0], clusters[1:], ref=out_ref, progress=prog, check_signature=signature_problem):
            replicas.append({"store": r.store, "root": r.root, "chunks_sent": r.chunks_sent, "bytes_sent": r.bytes_sent, "ref_version": r.ref_version})
    if folded is not None:
        folded["replicas"] = base_replicas

    clients = [_client(c, {"adapter": inp["adapter"], "root": inp["root"], "cluster": inp["cluster"]}) for c, inp in zip(result.clients, inputs)]
    record = {
        "method": result.method,
        # what was asked, so the round can be re-run from its inputs
        "options": {"weights": list(weights) if weights else None, "rank": rank, "clip_norm": clip_norm, "robust": robust},
        # what it came to: the final weights (0 for a rejected client) and ranks
        "weights": [c["weight"] for c in clients],
        "rank": result.rank,
        "client_ranks": client_ranks(read),
        "inputs": inputs,
        # the ref's version tells a re-run that moved the ref (back) to a root from a plain retry
        "result": {
            "ref": out_ref, "root": snap.root, "version": snap.ref_version, "base_model": result.base_model,
            **({"base": {k: folded[k] for k in ("ref", "root", "version", "parent", "from", "modules", "folded_bytes")}} if folded else {}),
        },
        "metrics": {
            "relative_error": result.relative_error,
            **({"residual_share": result.residual_share} if folded else {}),
            "clients": [{k: c[k] for k in ("adapter", "weight", "norm", "distance", "accepted", "clipped", "reason")} for c in clients],
        },
        "replicas": [r["store"] for r in replicas],
    }
    outcome = record_round(ledger_store, tenant, record, key=key)  # key: the round is signed by this cluster
    entry = outcome.doc
    for cluster, cosigner in zip(clusters[1:], cosigners):  # each cluster checks what it received, then signs
        entry = cosign(ledger_store, tenant, cluster, cosigner, number=entry["round"], progress=prog)["doc"]
    if memory is not None:
        memory.remember(ledger_store, tenant, entry["round"], entry["hash"])
    out = {
        "tenant": tenant,
        "round": entry["round"],
        "hash": entry["hash"],
        "prev": entry["prev"],
        "time": entry["time"],
        "ref": out_ref,
        "root": snap.root,
        "method": result.method,
        "rank": result.rank,
        "ranks": dict(result.ranks),
        "client_ranks": client_ranks(read),
        "robust": robust,
        "clients": clients,
        "relative_error": result.relative_error,
        "base_model": result.base_model,
        "inputs": inputs,
        "replicas": replicas,
        "ledger": ledger_store.uri,
        # recorded (by this run), adopted (written by this run, head moved by another writer) or
        # already (the same round was in the ledger: nothing appended)
        "recorded": outcome.status,
        "ledger_note": outcome.describe(),
        "lineage": None,
        "signatures": [s["key_id"] for s in _signed(entry)],
        "base": folded,
        "residual_share": result.residual_share,
    }
    if lineage is not None:
        out["lineage"] = _register(lineage, tenant, out_name, clusters, out)
    return out


def _signed(doc: dict) -> list[dict]:
    """The signatures a round document carries (the appender's first), as stored (unverified)."""
    extra = doc.get("signatures") if isinstance(doc.get("signatures"), list) else []
    return [s for s in (doc.get("signature"), *extra) if isinstance(s, dict) and isinstance(s.get("key_id"), str)]


def cosign(
    ledger_store: Store, tenant: str, cluster: Store, key: SigningKey, *, number: int | None = None, progress: Progress | None = None
) -> dict:
    """What one cluster does before it vouches for a round: read round ``number`` (default the
    newest) of ``tenant``'s ledger, check that ``cluster`` holds the round's aggregate, the
    root the round records, and that every chunk of it verifies there; then add ``key``'s
    signature to the round (and the head naming it): :func:`~concord.federation.ledger.cosign_round`.
    Returns ``{"round", "root", "cluster", "key_id", "doc"}``.

    Raises :class:`~concord.errors.LedgerError` when the round does not hold together or the
    cluster's copy of the aggregate is missing or damaged (nothing is signed then)."""
    from concord.errors import LedgerError
    from concord.federation.ledger import cosign_round, list_rounds
    from concord.snapshots.verify import verify

    validate_tenant(tenant)
    rounds = list_rounds(ledger_store, tenant)
    doc = rounds[-1] if number is None and rounds else next((r for r in rounds if r.get("round") == number), None)
    if doc is None:
        raise LedgerError(f"ledger of {tenant!r} in {ledger_store.uri}", f"there is no round {number or 1}", "Co-sign a round the ledger holds.")
    result = doc.get("result") if isinstance(doc.get("result"), dict) else {}
    root = result.get("root")
    where = f"round {doc['round']} of {tenant!r} in {ledger_store.uri}"
    if not isinstance(root, str) or not cluster.has_manifest(root):
        raise LedgerError(
            where, f"cluster {cluster.uri} does not hold its aggregate {str(root)[:12]}",
            "Replicate the round's result to the cluster first (concord sync); nothing was signed.",
        )
    checked = verify(cluster, root=root, progress=progress)
    if not checked.ok:
        raise LedgerError(
            where, f"the aggregate {root[:12]} in cluster {cluster.uri} does not verify",
            f"Repair it (concord verify {cluster.uri} --root {root} --repair-from ...); nothing was signed.",
        )
    signed = cosign_round(ledger_store, tenant, doc["round"], key)
    log.info("cluster %s checked %s and co-signed round %d of %s with key %s", cluster.uri, root[:12], doc["round"], tenant, key.id[:16])
    return {"round": doc["round"], "root": root, "cluster": cluster.uri, "key_id": key.id, "doc": signed}


def _base_versions(lineage: Lineage, name: str, clusters: list[Store], base: dict, r: dict) -> list[str]:
    """Register the folded base of a fedex round as a version of ``name`` whose parent is the
    base it was folded from (that root's version of ``name``, registered first when it has none,
    as the first round's base is): the parents of the adapter's version."""
    from concord.lineage.registry import search_versions
    from concord.lineage.tags import TAG_ROOT, read_tags

    def version_of(root: str) -> str | None:
        try:
            held = [v for v in search_versions(lineage, f"name = '{name}'") if read_tags(v.tags).get(TAG_ROOT) == root]
        except Exception:  # a model not registered yet
            return None
        return f"{name}/{max(int(v.version) for v in held)}" if held else None

    parent = version_of(base["parent"])
    if parent is None:
        mv = lineage.register_model_version(name, base["parent"], clusters, description=f"base model {base['from']} of tenant {r['tenant']}")
        parent = f"{mv['name']}/{mv['version']}"
    mv = lineage.register_model_version(
        name, base["root"], clusters, parents=[parent],
        description=f"{base['from']} with the residual of fedex round {r['round']} folded into {base['modules']} module(s)",
    )
    return [f"{mv['name']}/{mv['version']}"]


def _register(lineage: Lineage, tenant: str, out_name: str, clusters: list[Store], r: dict) -> dict:
    """Register the round's result as a model version (with a fedex round, after its folded base,
    its parent); a failure is logged and returned, never raised."""
    name = f"{tenant}-{out_name}"
    description = (
        f"federation round {r['round']} of tenant {tenant}: {r['method']} aggregation of "
        f"{len(r['clients'])} adapter(s) ({', '.join(i['adapter'] for i in r['inputs'])}); "
        f"ledger hash {r['hash']}"
    )
    try:
        parents = _base_versions(lineage, f"{name}{BASE_SUFFIX}", clusters, r["base"], r) if r.get("base") else []
        mv = lineage.register_model_version(name, r["root"], clusters, description=description, parents=parents)
    except Exception as exc:  # lineage records the round; it must never lose it
        log.warning("federation round %d of %s is recorded in the ledger but not in lineage: %s", r["round"], tenant, exc)
        return {"name": name, "error": f"{type(exc).__name__}: {exc}"}
    return {"name": mv["name"], "version": mv["version"], **({"parents": parents} if parents else {})}
