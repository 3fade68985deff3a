"""``concord data|contract|model|lineage``: data snapshots, schema contracts, model versions, lineage.

Data snapshots and contracts live in a *registry* store: ``--registry``, else ``$CONCORD_REGISTRY``,
else ``$CONCORD_HOME/registry`` (``./data/registry``). MLflow is ``--tracking-uri``, else
``$MLFLOW_TRACKING_URI``, else sqlite in ``$CONCORD_HOME`` (:mod:`concord.home`). Heavy libraries
(pandas, great-expectations, mlflow) are imported only by the command that needs them.
"""

from __future__ import annotations

from concord.cli._common import (
    fail,
    open_lineage,
    quiet_mlflow,
    ref_arg,
    registry_parent,
    root_arg,
    tracking_parent,
    writable_store,
)
from concord.home import default_registry


def _registry(args):
    return writable_store(args.registry or default_registry())


# ----------------------------------------------------------------------------- data


def cmd_data_register(args, out) -> int:
    from concord.api import register_data

    lineage = None if args.no_track else open_lineage(args.tracking_uri)
    if lineage is not None:
        lineage.ensure_ready()  # an unreachable tracking server fails before the store is touched
    store = _registry(args)
    snap = register_data(args.file, name=args.name, registry=store, progress=out.progress)
    result = snap.to_dict()
    if lineage is not None:
        result["run_id"] = lineage.log_data_snapshot(snap, store=store)
    lines = [
        f"data snapshot {snap.id}",
        f"  {snap.name}: {snap.rows} rows × {len(snap.columns)} columns ({snap.format}, {snap.bytes} bytes) in {snap.store}",
    ]
    if "run_id" in result:
        lines.append(f"  logged to MLflow run {result['run_id']}")
    out.emit(result, lines)
    return 0


def cmd_data_show(args, out) -> int:
    from concord.api import data_info

    snap = data_info(args.id, registry=_registry(args))
    d = snap.to_dict()
    lines = [f"{snap.id}  {snap.name}: {snap.rows} rows"] + [f"  {c}: {t}" for c, t in snap.schema.items()]
    out.emit(d, lines)
    return 0


# ----------------------------------------------------------------------------- contracts


def cmd_contract_infer(args, out) -> int:
    from concord.api import contract_infer
    from concord.lineage.contracts import contract_key

    contract = contract_infer(args.file, args.name, args.version, description=args.description or "", registry=_registry(args))
    key = contract_key(contract.name, contract.version)
    lines = [f"contract {contract.ref} saved as {key}"] + [
        f"  {c.name}: {c.type}{'' if c.required else ' (optional)'}"
        + (f" [{c.min}, {c.max}]" if c.min is not None or c.max is not None else "")
        + (f" in {list(c.allowed)}" if c.allowed else "")
        for c in contract.columns
    ]
    out.emit(contract.to_dict() | {"ref": contract.ref, "key": key, "digest": contract.digest()}, lines)
    return 0


def cmd_contract_validate(args, out) -> int:
    from concord.api import contract_validate

    res = contract_validate(
        args.contract,
        table=args.file or None,
        data=None if args.file else args.data,
        registry=_registry(args),
        data_store=writable_store(args.data_store) if args.data_store else None,
    )
    lines = [f"{res.contract}: {'pass' if res.success else 'FAIL'} ({res.evaluated} expectations)"]
    lines += [f"  ✗ {f.expectation}" + (f" [{f.column}]" if f.column else "") + f": {f.details}" for f in res.failures]
    out.emit(res.to_dict(), lines)
    if not res.success:
        return fail(f"the data violates contract {res.contract} ({len(res.failures)} failing expectation(s))")
    return 0


def cmd_contract_compatible(args, out) -> int:
    from concord.api import contract_compatible

    res = contract_compatible(args.old, args.new, registry=_registry(args))
    lines = [f"{res.old} → {res.new}: {'compatible' if res.compatible else 'BREAKING'}"]
    lines += [f"  ✗ {b}" for b in res.breaking] + [f"  · {n}" for n in res.notes]
    out.emit(res.to_dict(), lines)
    if not res.compatible:
        return fail(f"{res.new} is not backward compatible with {res.old} ({len(res.breaking)} breaking change(s))")
    return 0


def cmd_contract_list(args, out) -> int:
    from concord.api import contract_list

    refs = contract_list(registry=_registry(args))
    out.emit({"contracts": refs}, refs or ["(no contracts)"])
    return 0


# ----------------------------------------------------------------------------- models


def cmd_model_register(args, out) -> int:
    from concord.api import register_model

    quiet_mlflow()
    mv = register_model(
        args.name, args.store, ref=args.ref, root=args.root, holders=args.holder or [], data=args.data, contract=args.contract,
        parents=args.parent or [], description=args.description or "", registry=args.registry or default_registry(),
        tracking_uri=args.tracking_uri,
    )
    lines = [f"{mv['name']} version {mv['version']} → {mv['root'][:12]}", f"  source {mv['source']}"]
    out.emit(mv, lines)
    return 0


def cmd_model_promote(args, out) -> int:
    from concord.api import promote_model

    quiet_mlflow()
    res = promote_model(args.name, args.version, args.alias, registry=_registry(args), tracking_uri=args.tracking_uri)
    out.emit(res, [f"{args.name} version {args.version} is now '{args.alias}'"])
    return 0


# ----------------------------------------------------------------------------- lineage queries


def cmd_lineage_model(args, out) -> int:
    from concord.api import model_lineage

    info = model_lineage(args.name, args.version, tracking_uri=args.tracking_uri)
    lines = [f"{args.name} version {args.version}: root {info.get('root')}"]
    for key in ("data_snapshots", "contract", "parents", "replicas", "aliases"):
        lines.append(f"  {key}: {info.get(key)}")
    out.emit(info, lines)
    return 0


def cmd_lineage_data(args, out) -> int:
    from concord.api import data_lineage

    quiet_mlflow()
    versions = data_lineage(args.id, tracking_uri=args.tracking_uri)
    lines = [f"{v['name']} version {v['version']}  root {str(v.get('root'))[:12]}" for v in versions] or [
        f"no model version used data snapshot {args.id}"
    ]
    out.emit({"data_snapshot": args.id, "model_versions": versions}, lines)
    return 0


def cmd_lineage_graph(args, out) -> int:
    from concord.api import lineage_graph

    quiet_mlflow()
    g = lineage_graph(args.name, out=args.out, tracking_uri=args.tracking_uri)
    out.emit(g, [*g["mermaid"].splitlines(), f"picture: {g['png']}", f"mermaid: {g['mermaid_file']}"])
    return 0


# ----------------------------------------------------------------------------- parser


def register(sub, common: list) -> None:
    lin, reg = tracking_parent(), registry_parent()

    data = sub.add_parser("data", help="data snapshots: register a table, show one").add_subparsers(dest="sub", metavar="ACTION", required=True)
    s = data.add_parser("register", parents=[*common, lin, reg], help="snapshot a parquet/CSV file and log it to MLflow")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--name", required=True, help="dataset name (its ref is data/NAME)")
    s.add_argument("--no-track", action="store_true", help="store the snapshot without logging to MLflow")
    s.set_defaults(func=cmd_data_register)
    s = data.add_parser("show", parents=[*common, reg], help="rows, columns and schema of a data snapshot")
    s.add_argument("id", metavar="ID")
    s.set_defaults(func=cmd_data_show)

    con = sub.add_parser("contract", help="schema contracts: infer, validate, compatible, list").add_subparsers(
        dest="sub", metavar="ACTION", required=True
    )
    s = con.add_parser("infer", parents=[*common, reg], help="infer a contract from a table and save it")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--name", required=True)
    s.add_argument("--version", type=int, default=1)
    s.add_argument("--description")
    s.set_defaults(func=cmd_contract_infer)
    s = con.add_parser("validate", parents=[*common, reg], help="run a contract's expectations on data")
    s.add_argument("contract", metavar="CONTRACT", help="NAME@VERSION, NAME (latest) or a .json file")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--data", metavar="ID", help="a registered data snapshot")
    g.add_argument("--file", metavar="FILE", help="a parquet or CSV file")
    s.add_argument("--data-store", metavar="STORE", help="store holding --data (default: the registry)")
    s.set_defaults(func=cmd_contract_validate)
    s = con.add_parser("compatible", parents=[*common, reg], help="is NEW a backward-compatible change of OLD?")
    s.add_argument("old", metavar="OLD")
    s.add_argument("new", metavar="NEW")
    s.set_defaults(func=cmd_contract_compatible)
    s = con.add_parser("list", parents=[*common, reg], help="list saved contracts")
    s.set_defaults(func=cmd_contract_list)

    mod = sub.add_parser("model", help="model versions: register a snapshot, promote").add_subparsers(
        dest="sub", metavar="ACTION", required=True
    )
    s = mod.add_parser("register", parents=[*common, lin, reg], help="register a weight snapshot as an MLflow model version")
    s.add_argument("name", metavar="NAME")
    s.add_argument("--store", required=True, help="store holding the snapshot")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--ref", type=ref_arg)
    g.add_argument("--root", type=root_arg)
    s.add_argument("--holder", action="append", metavar="STORE", help="another store holding it (repeatable)")
    s.add_argument("--data", metavar="ID", help="data snapshot it was trained or evaluated on")
    s.add_argument("--contract", metavar="NAME@VERSION", help="schema contract of that data")
    s.add_argument("--parent", action="append", metavar="NAME/VERSION", help="version it derives from (repeatable)")
    s.add_argument("--description")
    s.set_defaults(func=cmd_model_register)
    s = mod.add_parser("promote", parents=[*common, lin, reg], help="set an alias, through the promotion gate")
    s.add_argument("name", metavar="NAME")
    s.add_argument("version", metavar="VERSION")
    s.add_argument("--alias", default="champion")
    s.set_defaults(func=cmd_model_promote)

    lq = sub.add_parser("lineage", help="lineage questions: model → data, data → models, graph").add_subparsers(
        dest="sub", metavar="QUESTION", required=True
    )
    s = lq.add_parser("model", parents=[*common, lin], help="data snapshots, contract, parents and replicas of a version")
    s.add_argument("name", metavar="NAME")
    s.add_argument("version", metavar="VERSION")
    s.set_defaults(func=cmd_lineage_model)
    s = lq.add_parser("data", parents=[*common, lin], help="every model version that used a data snapshot")
    s.add_argument("id", metavar="SNAPSHOT_ID")
    s.set_defaults(func=cmd_lineage_data)
    s = lq.add_parser("graph", parents=[*common, lin], help="a picture (PNG and Mermaid) of a model's lineage")
    s.add_argument("name", metavar="NAME")
    s.add_argument("--out", default=".", help="folder for NAME.png and NAME.mmd (default: here)")
    s.set_defaults(func=cmd_lineage_graph)
