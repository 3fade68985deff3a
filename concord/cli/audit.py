"""``concord audit data|profile|replicas|cards|model``: drift audits from the terminal.

``data`` compares a current table with its reference (parquet or CSV files, or data snapshots
from the registry) column by column, optionally validates it against its schema contract, and
can draw the drifted columns' histograms; its reference may be a profile (a ``.profile`` file, or
the one stored beside a data snapshot), which ``profile`` makes once, of a table or of its parts
merged. ``replicas`` compares one snapshot's weights across
cluster stores (by Merkle root, then tensor by tensor in ULPs), ``cards`` its model cards, and
``model`` does both for a registered model version, finding its stores through lineage.

Exit status: 0 when the audit's severity is ok or warning (P1), 3 when it is critical (P0), 1
when the audit could not be made (one line on stderr), and 2, as for every command, when the
command line itself is wrong; so a script tells drift from a failure to audit. A warning is in the
output (``severity``, ``priority``), not in the status. With ``--json`` the report is exactly one
JSON object on stdout, whatever the severity; a critical audit also prints one line on stderr.

With ``--track`` the audit is also logged to MLflow (``--tracking-uri``, else
``$MLFLOW_TRACKING_URI``, else sqlite in ``$CONCORD_HOME``) as one run of the experiment
``concord-drift-audits``, exactly as the nightly flow logs it (metrics, parameters, the drifted
columns' PNGs, ``report.json`` and ``report.md``), and the run's id is in the output
(``mlflow_run_id``). The tracking server is checked before the audit starts.
"""

from __future__ import annotations

import argparse
import sys

from concord.cli._common import (
    STORE_HELP,
    TRUST_HELP,
    keyed_store,
    name_arg,
    open_lineage,
    peek_store,
    positive_int,
    readable_store,
    ref_arg,
    registry_parent,
    track_parent,
    tracking_parent,
    whole_number,
)

#: the exit status of a critical (P0) audit; errors exit 1, usage errors 2 (argparse), ok and warning 0
EXIT_CRITICAL = 3


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _floor(text: str) -> tuple[str | None, float]:
    """``--floor X`` (every numeric column) or ``--floor COLUMN=X`` (that column, in its own unit)."""
    column, _, value = text.rpartition("=")
    number = _float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"the floor {value!r} must be a number >= 0")
    return (column or None), number


def _thresholds(args):
    """The drift thresholds of ``concord audit data``'s options, the defaults where not given."""
    from concord.audit.drift import DriftThresholds

    defaults = DriftThresholds()
    floors = dict(args.floor or ())
    return DriftThresholds(
        psi_warning=defaults.psi_warning if args.psi_warning is None else args.psi_warning,
        psi_critical=defaults.psi_critical if args.psi_critical is None else args.psi_critical,
        alpha=defaults.alpha if args.alpha is None else args.alpha,
        floor=floors.pop(None, defaults.floor),
        share_floor=defaults.share_floor if args.share_floor is None else args.share_floor,
        floors=floors,
    )


def _names(example: str):
    def parse(text: str) -> list[str]:
        names = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
        if not names:
            raise argparse.ArgumentTypeError(f"give names separated by commas, e.g. {example}")
        return names

    return parse


def _text_table(rows: list[dict], keys: list[str] | None = None) -> list[str]:
    if not rows:
        return ["  (none)"]
    keys = keys or list(rows[0])
    cells = [[k.replace("_", " ").upper() for k in keys]] + [["" if r.get(k) is None else str(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(keys))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]


def report_lines(report) -> list[str]:
    """The human form of an audit: the verdict, then a table per section."""
    from concord.audit.render import card_rows, column_rows, replica_rows, worst_tensor_rows

    lines = [report.verdict()]
    if report.data is not None:
        d = report.data
        ref, cur = (d.get("reference") or {}).get("label"), (d.get("current") or {}).get("label")
        lines += ["", f"data drift {ref} → {cur}: {d.get('rows_reference')} → {d.get('rows_current')} rows, drift share {d.get('drift_share')}"]
        lines += _text_table(column_rows(d), ["column", "kind", "severity", "effect", "psi", "js", "ks", "wasserstein", "chi2", "p", "finding"])
    if report.contract is not None:
        c = report.contract
        lines += ["", f"contract {c['ref']}: {'met' if c['ok'] else 'VIOLATED'} ({c['evaluated']} expectations, {len(c['failed'])} failed)"]
        lines += [f"  ✗ {f['expectation']}" + (f" [{f['column']}]" if f.get("column") else "") + f": {f['details']}" for f in c["failed"]]
    if report.replicas is not None:
        lines += ["", f"replicas (reference {report.replicas.get('reference')}):"]
        lines += _text_table(replica_rows(report.replicas, stores=True))
        worst = worst_tensor_rows(report.replicas)
        if worst:
            lines += ["", "worst tensors:"] + _text_table(worst)
    if report.cards is not None:
        lines += ["", f"model cards (reference {report.cards.get('reference')}):"]
        lines += _text_table(card_rows(report.cards))
    for section, why in report.errors.items():
        lines += ["", f"{section}: could not be audited: {why}"]
    return lines


def _finish(report, out, extra: dict | None = None) -> int:
    lines = report_lines(report) + [f"plot: {p}" for p in (extra or {}).get("plots", [])]
    if (extra or {}).get("mlflow_run_id"):
        lines.append(f"logged to MLflow run {extra['mlflow_run_id']}")
    out.emit(report.to_dict() | (extra or {}), lines)
    if report.severity == "critical":
        from concord.text import one_line

        print(f"concord: critical drift: {one_line(report.verdict())}", file=sys.stderr)
        return EXIT_CRITICAL
    return 0


def _tracker(args):
    """With ``--track``, the lineage the audit is logged to, checked now (an unreachable tracking
    server fails before anything is read); else None."""
    if not args.track:
        return None
    lineage = open_lineage(args.tracking_uri)
    lineage.ensure_ready()
    return lineage


def _track(lineage, report, *, name: str, params: dict, plots: dict[str, str] | None = None) -> dict:
    """Log the audit as the nightly flow does (tonight's run of the audit ``name``); ``{"mlflow_run_id": …}``."""
    from concord.audit.history import night_of
    from concord.audit.tracking import log_audit, run_markdown

    night = night_of(None).isoformat()
    plots = plots or {}
    markdown = run_markdown(report, name=name, night=night, plots=plots)
    run_id = log_audit(lineage, report.to_dict(), markdown, name=name, night=night, plots=list(plots.values()), params=params)
    return {"mlflow_run_id": run_id}


# ----------------------------------------------------------------------------- commands


def cmd_audit_data(args, out) -> int:
    from concord.api import audit_data
    from concord.audit.render import plot_histograms_by_column

    lineage = _tracker(args)
    thresholds = _thresholds(args)
    # both tables are read in batches (memory does not grow with them); a contract reads current whole
    report = audit_data(
        args.reference, args.current, registry=args.registry, data_store=args.data_store, contract=args.contract,
        columns=args.columns, thresholds=thresholds, bins=args.bins, profile=args.profile,
    )
    extra, plots = {}, {}
    if args.plots:
        plots = plot_histograms_by_column(report, out_dir=args.plots)
        extra["plots"] = list(plots.values())
    if lineage is not None:
        import tempfile

        from concord.audit.inputs import audit_name, spec_name
        from concord.audit.tracking import audit_params

        params = audit_params(reference=args.reference, current=args.current, contract=args.contract, bins=args.bins, thresholds=thresholds)
        with tempfile.TemporaryDirectory() as drawn:  # the flow's run has the PNGs, asked for or not
            extra |= _track(
                lineage, report, name=audit_name(spec_name(args.reference), spec_name(args.current)), params=params,
                plots=plots if args.plots else plot_histograms_by_column(report, out_dir=drawn),
            )
    return _finish(report, out, extra)


def cmd_audit_profile(args, out) -> int:
    """Profile a reference table (or a table's parts, merged) once: into a file, and beside its data snapshot."""
    from concord.api import audit_profile
    from concord.audit.inputs import names_snapshot

    if not args.out and (len(args.tables) != 1 or not names_snapshot(args.tables[0]) or args.no_store):
        raise ValueError("--out FILE: say where to write the profile (only a single data snapshot's is stored beside it)")
    result = audit_profile(
        args.tables, out=args.out, store_beside=not args.no_store, registry=args.registry, data_store=args.data_store,
        sample_size=args.sample_size, max_labels=args.max_labels,
    )
    summary = result["profile"]
    what = summary["source"].get("label") or ", ".join(args.tables)
    lines = [f"profile of {what}: {summary['rows']} rows, {len(summary['columns'])} columns"]
    lines += _text_table(summary["columns"], ["column", "kind", "values", "nulls", "kept", "sampled", "other_labels"])
    if "out" in result:
        lines.append(f"written to {result['out']} ({result['bytes']:,} bytes)")
    if "stored" in result:
        stored = result["stored"]
        data_id = summary["source"]["id"]
        lines.append(f"stored beside data snapshot {data_id[:12]} as {stored['ref']} in {stored['store']}")
    out.emit(dict(result), lines)
    return 0


def _store_keys(pairs: list[str] | None, specs: list[str]) -> dict[str, str]:
    """``--store-key STORE=FILE`` pairs as ``{STORE: FILE}``; STORE as the command names it."""
    keys: dict[str, str] = {}
    for pair in pairs or ():
        store, sep, path = pair.rpartition("=")
        if not sep or not store or not path:
            raise ValueError(f"--store-key {pair}: give STORE=FILE, e.g. --store-key s3://bucket/eu=eu.key")
        if store not in specs:
            raise ValueError(f"--store-key {pair}: {store} is not one of the stores compared ({', '.join(specs)})")
        if store in keys:
            raise ValueError(f"--store-key names {store} twice")
        keys[store] = path
    return keys


def _open_all(specs: list[str], pairs: list[str] | None = None, open_one=readable_store) -> list:
    """The stores whose snapshots are compared: each must exist (a mistyped path is an error), and
    an encrypted one opens with its own key (``--store-key STORE=FILE``, else ``--key-file``)."""
    keys = _store_keys(pairs, specs)
    out = []
    for spec in specs:
        store = open_one(spec)
        out.append(keyed_store(store, keys[spec], f"--store-key {spec}=FILE") if spec in keys else store)
    return out


def store_labels(specs):
    from concord.audit.inputs import store_labels as labels

    return labels(specs)


def _compare_replicas(labels, stores, snapshot, args, out):
    from concord.api import audit_replicas

    return audit_replicas(
        dict(zip(labels, stores)), snapshot, reference=args.reference or None, max_ulps=args.max_ulps, top=args.top,
        trust=getattr(args, "trust", None), progress=out.progress,
    ).replicas


def _compare_cards(labels, stores, snapshot, args):
    from concord.api import audit_cards

    return audit_cards(dict(zip(labels, stores)), snapshot, reference=args.reference or None, required=args.require).cards


def _track_ref(lineage, report, args) -> dict:
    """``--track`` of an audit of a snapshot's replicas or cards: the run the flow makes for ``ref``."""
    if lineage is None:
        return {}
    from concord.audit.inputs import audit_name, spec_name
    from concord.audit.tracking import audit_params

    params = audit_params(ref=args.ref, max_ulps=getattr(args, "max_ulps", 1))
    return _track(lineage, report, name=audit_name(spec_name(args.ref)), params=params)


def cmd_audit_replicas(args, out) -> int:
    from concord.audit.report import AuditReport

    lineage = _tracker(args)
    stores = _open_all(args.stores, args.store_key)
    report = AuditReport.assemble(replicas=_compare_replicas(store_labels(args.stores), stores, args.ref, args, out))
    return _finish(report, out, _track_ref(lineage, report, args))


def cmd_audit_cards(args, out) -> int:
    from concord.audit.report import AuditReport

    lineage = _tracker(args)
    stores = _open_all(args.stores, args.store_key)
    report = AuditReport.assemble(cards=_compare_cards(store_labels(args.stores), stores, args.ref, args))
    return _finish(report, out, _track_ref(lineage, report, args))


def cmd_audit_model(args, out) -> int:
    from concord.audit.inputs import model_holders
    from concord.audit.report import AuditReport

    lineage = open_lineage(args.tracking_uri)
    lineage.ensure_ready()
    held = model_holders(lineage, args.name, args.version)
    labels = store_labels(held["stores"])
    # a cluster that is gone is a finding of the report
    stores = _open_all(held["stores"], args.store_key, open_one=peek_store)
    report = AuditReport.assemble(
        replicas=_compare_replicas(labels, stores, held["root"], args, out),
        cards=_compare_cards(labels, stores, held["root"], args),
        model=held,
    )
    extra = {}
    if args.track:
        from concord.audit.inputs import audit_name
        from concord.audit.tracking import audit_params

        params = audit_params(model=args.name, version=args.version, max_ulps=args.max_ulps)
        extra = _track(lineage, report, name=audit_name(args.name), params=params)
    return _finish(report, out, extra)


# ----------------------------------------------------------------------------- parser


def register(sub, common: list) -> None:
    lin, reg, trk = tracking_parent(), registry_parent(), track_parent("audit", "the nightly drift audit flow")
    weights = argparse.ArgumentParser(add_help=False)
    weights.add_argument(
        "--max-ulps",
        type=whole_number,
        default=1,
        metavar="N",
        help="a tensor in another dtype passes within N ULPs of the lower precision (default 1)",
    )
    weights.add_argument("--top", type=positive_int, default=10, metavar="N", help="worst tensors listed per replica (default 10)")
    weights.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; a root no trusted key signed, on any store, is critical")
    refp = argparse.ArgumentParser(add_help=False)
    refp.add_argument(
        "--reference",
        metavar="CLUSTER",
        type=name_arg("cluster label or store"),
        help="the cluster the others are compared with (default: the first store)",
    )
    keys = argparse.ArgumentParser(add_help=False)
    keys.add_argument(
        "--store-key", action="append", metavar="STORE=FILE",
        help="the key of one encrypted STORE, as the command names it (repeat for each); the others take --key-file, else $CONCORD_KEY_FILE; never printed",
    )
    cards = argparse.ArgumentParser(add_help=False)
    cards.add_argument(
        "--require",
        type=_names("license,retention"),
        metavar="FIELD,...",
        help="card fields every cluster must have (default: the module's list)",
    )

    audit = sub.add_parser(
        "audit", help="drift audits: data against its reference, replicas' weights, model cards (exit 3 when critical)"
    ).add_subparsers(dest="sub", metavar="WHAT", required=True)

    s = audit.add_parser(
        "data", parents=[*common, reg, lin, trk],
        help="per-column drift of CURRENT from REFERENCE (PSI, KL, JS, KS, Wasserstein, chi-squared); exit 3 when critical",
    )
    s.add_argument("reference", metavar="REFERENCE", help="a .parquet or .csv file, a data snapshot id, or data/NAME in the data store")
    s.add_argument("current", metavar="CURRENT", help="the same kinds as REFERENCE")
    s.add_argument("--contract", metavar="NAME[@VERSION]", help="also validate CURRENT against this contract of the registry (or a .json file)")
    s.add_argument("--columns", type=_names("body_mass_g,species"), metavar="A,B", help="only these columns (default: all)")
    s.add_argument("--bins", type=positive_int, default=10, metavar="N", help="reference quantile bins per numeric column (default 10)")
    s.add_argument("--psi-warning", type=_float, metavar="X", help="PSI above this is a warning, P1 (default 0.25)")
    s.add_argument("--psi-critical", type=_float, metavar="Y", help="PSI above this is critical, P0 (default 0.55)")
    s.add_argument(
        "--floor", type=_floor, action="append", metavar="[COLUMN=]X",
        help="the smallest change that matters: numeric columns' Wasserstein distance in reference σ (default 0.05); "
        "COLUMN=X sets one column's, in its unit (categorical: share of mass moved); repeatable",
    )
    s.add_argument("--share-floor", type=_float, metavar="X", help="categorical columns: the smallest share of mass moved that matters (default 0.005)")
    s.add_argument("--alpha", type=_float, metavar="P", help="significance level, adjusted over the columns (default 0.005)")
    s.add_argument("--plots", metavar="DIR", help="write a PNG histogram overlay per drifted column into DIR")
    s.add_argument("--data-store", metavar="STORE", help="store holding data snapshots named by id or data/NAME (default: the registry)")
    s.add_argument(
        "--profile", choices=("use", "create", "off"), default="use",
        help="a REFERENCE data snapshot's stored profile: use it when there is one (default), also create and store it, or read the table (off); "
        "REFERENCE may also be a .profile file",
    )
    s.set_defaults(func=cmd_audit_data)

    s = audit.add_parser(
        "profile", parents=[*common, reg],
        help="profile a reference table once (bounded samples and counts per column) to audit against many times",
    )
    s.add_argument(
        "tables", metavar="TABLE", nargs="+",
        help="a .parquet or .csv file, a data snapshot id or data/NAME in the data store; several (or .profile files): the parts of one table, merged",
    )
    s.add_argument("--out", metavar="FILE", help="write the profile here (conventionally NAME.profile); needed unless one data snapshot is profiled")
    s.add_argument(
        "--data-store",
        metavar="STORE",
        help="store holding data snapshots named by id or data/NAME, where their profile is stored (default: the registry)",
    )
    s.add_argument("--no-store", action="store_true", help="do not store a data snapshot's profile beside it (write --out only)")
    s.add_argument(
        "--sample-size", type=positive_int, default=500_000, metavar="N",
        help="numeric values kept per column, a uniform sample above (default 500000, as the audit keeps)",
    )
    s.add_argument(
        "--max-labels",
        type=positive_int,
        default=100_000,
        metavar="K",
        help="labels kept per categorical column, the most frequent; the rest pooled (default 100000)",
    )
    s.set_defaults(func=cmd_audit_profile)

    s = audit.add_parser(
        "replicas", parents=[*common, weights, keys, refp, lin, trk],
        help="compare a snapshot's weights across stores: Merkle roots, then tensors in ULPs; exit 3 when critical",
    )
    s.add_argument("--ref", required=True, metavar="REF", type=ref_arg, help="ref (or 64-hex root) of the snapshot, in every store")
    s.add_argument("stores", metavar="STORE", nargs="+", help=STORE_HELP)
    s.set_defaults(func=cmd_audit_replicas)

    s = audit.add_parser(
        "cards", parents=[*common, cards, keys, refp, lin, trk], help="compare a snapshot's model card (README, metadata) across stores; exit 3 when critical"
    )
    s.add_argument("--ref", required=True, metavar="REF", type=ref_arg, help="ref (or 64-hex root) of the snapshot, in every store")
    s.add_argument("stores", metavar="STORE", nargs="+", help=STORE_HELP)
    s.set_defaults(func=cmd_audit_cards)

    s = audit.add_parser(
        "model", parents=[*common, lin, weights, cards, keys, refp, trk],
        help="audit a registered model version: its replicas and model cards on every store lineage records",
    )
    s.add_argument("name", metavar="NAME")
    s.add_argument("version", metavar="VERSION")
    s.set_defaults(func=cmd_audit_model)
