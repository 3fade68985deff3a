"""``concord federate aggregate|run|verify|log``: LoRA federation rounds and their ledger.

``aggregate`` works on adapter folders and touches no store. ``run`` is one whole round: find
each adapter ref in the cluster stores, aggregate, snapshot the result into the first cluster,
replicate it to the others and append the round to the tenant's ledger. ``verify`` and ``log``
read a tenant's ledger. ``run`` and ``verify`` keep this machine's memory of how far each ledger
went (:mod:`concord.federation.seen`), so a ledger rolled back below it fails. torch is imported only by the commands that aggregate.
"""

from __future__ import annotations

import argparse

from concord.cli._common import (
    STORE_HELP,
    TRACKING_URI_HELP,
    TRUST_HELP,
    fail,
    key_file_options,
    keyed_store,
    positive_float,
    positive_int,
    quiet_mlflow,
    writable_store,
)

METHOD_HELP = (
    "exact: the weighted mean of the clients' updates, refactored to its true rank (default); "
    "stack: the clients' factors side by side (rank = sum of ranks); fedavg: the mean of the A and "
    "B factors (needs equal ranks; not exact); fedex: the mean of the factors at the clients' rank, with the rest of "
    "the exact mean folded into the base model (federate run --base; exact at a fixed rank)"
)


def _weights(text: str) -> list[float]:
    """``0.5,0.3,0.2`` → floats: each finite and not negative, their sum finite too."""
    import math

    try:
        values = [float(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give numbers separated by commas, e.g. 0.5,0.3,0.2") from None
    if not values:
        raise argparse.ArgumentTypeError("give at least one weight")
    bad = next((w for w in values if not math.isfinite(w) or w < 0), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"weight {bad!r} in {text!r}: each weight must be a finite number of 0 or more")
    try:
        total = math.fsum(values)
    except OverflowError:
        total = math.inf
    if not math.isfinite(total):
        raise argparse.ArgumentTypeError(f"the weights {text!r} sum to more than the largest float; scale them down (only their ratios matter)")
    return values


def _client_lines(clients: list[dict]) -> list[str]:
    lines = []
    for c in clients:
        who = c.get("adapter") or c.get("path")
        verdict = "accepted" + (" (clipped)" if c.get("clipped") else "") if c.get("accepted") else f"REJECTED: {c.get('reason')}"
        lines.append(f"  client {c['index']}: {who}  weight {c['weight']:.4g}  norm {c['norm']:.4g}  distance {c['distance']:.4g}  {verdict}")
    return lines


def _error(value) -> str:
    return "n/a" if value is None else f"{value:.3g}"


# ----------------------------------------------------------------------------- commands


def cmd_aggregate(args, out) -> int:
    from concord.api import federate_aggregate

    r = federate_aggregate(
        args.adapters,
        args.out,
        method=args.method,
        weights=args.weights,
        rank=args.rank,
        clip_norm=args.clip_norm,
        robust=args.robust,
    )
    lines = [
        f"{r['method']} aggregation of {len(r['clients'])} adapter(s) (ranks {r['client_ranks']}) → rank {r['rank']} in {r['out']}",
        f"  relative error {_error(r['relative_error'])}, {r['modules']} module(s), base model {r['base_model']}",
        *_client_lines(r["clients"]),
    ]
    out.emit(r, lines)
    return 0


def _signing_keys(args) -> list:
    """The clusters' signing keys of ``--key`` (repeatable; their password from
    ``--key-password-env`` or ``$CONCORD_KEY_PASSWORD``), in the clusters' order; none: rounds
    are then appended unsigned."""
    import os

    from concord.trust import load_signing_key_spec

    keys = args.key if isinstance(args.key, list) else [args.key] if args.key else []
    password = os.environ.get(args.key_password_env or "CONCORD_KEY_PASSWORD") or None
    return [load_signing_key_spec(k, password) for k in keys]


def cmd_run(args, out) -> int:
    from concord.api import federate_round

    keys = _signing_keys(args)  # a bad key fails before any store is opened
    if len(keys) > len(args.cluster):
        raise ValueError(f"{len(keys)} --key for {len(args.cluster)} --cluster: give at most one key per cluster, in the clusters' order")
    if args.track:
        quiet_mlflow()
    r = federate_round(
        args.tenant,
        args.cluster,
        args.adapter,
        method=args.method,
        rank=args.rank,
        weights=args.weights,
        clip_norm=args.clip_norm,
        robust=args.robust,
        out_name=args.out_name,
        ledger=keyed_store(writable_store(args.ledger), args.ledger_key_file, "--ledger-key-file") if args.ledger else None,
        key=keys[0] if keys else None,
        cosigners=keys[1:],
        base=args.base,
        tracking_uri=args.tracking_uri,
        track=args.track,
        remember=not args.no_remember,
        progress=out.progress,
    )
    lines = [
        f"round {r['round']} of {r['tenant']}: {r['method']} over {len(r['clients'])} adapter(s) → {r['ref']} {r['root'][:12]} (rank {r['rank']})",
        f"  relative error {_error(r['relative_error'])}; ledger: {r['ledger_note']}",
        *([f"  signed by {len(r['signatures'])} cluster key(s): {', '.join(k[:16] for k in r['signatures'])}"] if r["signatures"] else []),
        *([f"  base {r['base']['from']} {r['base']['parent'][:12]} → {r['base']['ref']} {r['base']['root'][:12]}: residual folded into "
           f"{r['base']['modules']} module(s), {r['base']['folded_bytes']} bytes (share {_error(r['residual_share'])} of the update)"]
          if r.get("base") else []),
        *_client_lines(r["clients"]),
        *(f"  replica {p['store']}: sent {p['chunks_sent']} chunk(s), {p['bytes_sent']} bytes" for p in r["replicas"]),
    ]
    if r["lineage"]:
        lin = r["lineage"]
        lines.append(f"  lineage: {lin['name']} version {lin['version']}" if "version" in lin else f"  lineage NOT recorded: {lin['error']}")
    out.emit(r, lines)
    return 0


def cmd_cosign(args, out) -> int:
    from concord.api import federate_cosign

    (key,) = _signing_keys(args)  # a bad key fails before any store is opened
    r = federate_cosign(args.store, args.tenant, args.cluster, key, round=args.round, progress=out.progress)
    doc = r.pop("doc")
    signers = [s.get("key_id", "?") for s in [doc.get("signature"), *(doc.get("signatures") or [])] if isinstance(s, dict)]
    r.update(store=args.store, signatures=signers)
    out.emit(r, [
        f"round {r['round']} of {args.tenant}: cluster {r['cluster']} holds {r['root'][:12]} and it verifies; signed with key {r['key_id'][:16]}",
        f"  the round now carries {len(signers)} signature(s) (check them with concord federate verify {args.tenant} --store {args.store} --trust ...)",
    ])
    return 0


def cmd_verify(args, out) -> int:
    import shlex

    from concord.api import federate_verify

    again = [
        "concord", "federate", "verify", args.tenant, "--store", args.store,
        *(["--trust", args.trust_spec] if args.trust_spec else []),
        *(["--trust-threshold", str(args.trust_threshold)] if args.trust_threshold else []),
        "--forget",
    ]
    result = federate_verify(
        args.store,
        args.tenant,
        trust=args.trust,
        min_round=args.min_round,
        remember=not args.no_remember,
        forget=args.forget,
        fix=f"Restore the ledger from a good copy of the store; if the rollback was intended, accept it with `{shlex.join(again)}`",
    )
    report = result.report
    head = report.head[:12] if report.head else "(none)"
    lines = [f"ledger of {report.tenant} in {report.store}: {report.rounds} round(s), head {head}: {'ok' if report.ok else 'TAMPERED'}"]
    lines += [f"  round {n}: signed by {', '.join(names) or 'no trusted key'}" for n, names in report.signed_by.items()]
    lines += [f"  ✗ {p}" for p in report.problems]
    if result.kept is not None and report.ok:
        how = "first seen here (trusted on first use)" if result.seen is None else f"seen before at round {result.seen.round}"
        lines.append(f"  remembered at round {result.kept.round} in {result.memory}; {how}")
    out.emit(result.to_dict(), lines)
    if result.error is not None:
        return fail(result.error)
    if not report.ok:
        return fail(
            f"the ledger of {report.tenant} in {report.store} does not verify "
            f"({len(report.problems)} problem(s)); restore it from a good copy of the store"
        )
    return 0


def cmd_log(args, out) -> int:
    from concord.api import federate_log

    ledger = federate_log(args.store, args.tenant)
    lines = []
    for r in reversed(ledger["rounds"]):
        # the record's own fields are the writer's: shown as far as they have the expected shape
        listed = r.get("inputs") if isinstance(r.get("inputs"), list) else []
        inputs = ", ".join(str(i.get("adapter", "?")) if isinstance(i, dict) else "?" for i in listed)
        result = r.get("result").get("root") if isinstance(r.get("result"), dict) else None
        result = result if isinstance(result, str) and result else "?"
        lines.append(
            f"round {r.get('round')}  {str(r.get('hash'))[:12]}  {r.get('time')}  {r.get('method')}  "
            f"[{inputs}] → {result[:12]}"
        )
    out.emit(ledger, lines or ["(no rounds)"])
    return 0


# ----------------------------------------------------------------------------- parser


def register(sub, common: list) -> None:
    agg = argparse.ArgumentParser(add_help=False)
    agg.add_argument("--method", choices=("exact", "stack", "fedavg", "fedex"), default="exact", help=METHOD_HELP)
    agg.add_argument("--weights", type=_weights, metavar="W1,W2,...", help="one weight per adapter (normalised; default: equal)")
    agg.add_argument("--rank", type=positive_int, metavar="R", help="exact only: keep each module's R largest singular values (default: the exact rank)")
    agg.add_argument("--clip-norm", type=positive_float, metavar="C", help="scale down client updates whose norm exceeds C")
    agg.add_argument("--robust", choices=("none", "krum", "trimmed"), default="none", help="reject outlying clients (after clients over 10x the median norm)")

    fed = sub.add_parser("federate", help="LoRA federation: aggregate adapters, run a round, verify the ledger").add_subparsers(
        dest="sub", metavar="ACTION", required=True
    )
    s = fed.add_parser("aggregate", parents=[*common, agg], help="aggregate PEFT LoRA adapter folders into a new one")
    s.add_argument("adapters", metavar="ADAPTER_DIR", nargs="+")
    s.add_argument("--out", required=True, metavar="DIR", help="folder for the aggregated adapter")
    s.set_defaults(func=cmd_aggregate)

    s = fed.add_parser(
        "run", parents=[*common, agg], help="one round: aggregate a tenant's adapters from the clusters, replicate, record"
    )
    s.add_argument("--tenant", required=True)
    s.add_argument("--cluster", action="append", required=True, metavar="STORE", help=f"a cluster store (repeatable; the first gets the result): {STORE_HELP}")
    s.add_argument("--adapter", action="extend", nargs="+", required=True, metavar="NAME", help="adapter refs, NAME or TENANT/NAME (repeatable)")
    s.add_argument("--out-name", default="federated", help="the result's ref is TENANT/OUT_NAME (default: federated)")
    s.add_argument(
        "--base", metavar="REF",
        help="fedex only: the base model the adapters were trained on (default: TENANT/OUT_NAME-base, the folded base of the round before)",
    )
    s.add_argument("--ledger", metavar="STORE", help="store of the ledger (default: the first cluster)")
    key_file_options(s, ("ledger", "the --ledger store"))
    s.add_argument("--track", action="store_true", help="register the result as an MLflow model version TENANT-OUT_NAME")
    s.add_argument("--tracking-uri", help=TRACKING_URI_HELP)
    s.add_argument(
        "--key", metavar="KEY.pem|block:NAME", action="append",
        help="sign the round with this cluster's ECDSA private key, or a saved Concord Trust block's (checked by verify --trust); "
        "repeat it, one per --cluster in the same order, so that each other cluster checks the aggregate it received and co-signs",
    )
    s.add_argument("--key-password-env", metavar="NAME", help="environment variable holding the key's password (default: CONCORD_KEY_PASSWORD)")
    s.add_argument(
        "--no-remember", action="store_true",
        help="neither check the ledger against, nor add the round to, this machine's memory of ledgers ($CONCORD_HOME/ledgers-seen.json)",
    )
    s.set_defaults(func=cmd_run)

    s = fed.add_parser(
        "cosign", parents=common, help="a cluster checks the aggregate of a round it received, then adds its signature to the round"
    )
    s.add_argument("tenant", metavar="TENANT")
    s.add_argument("--store", required=True, help=f"store of the ledger: {STORE_HELP}")
    s.add_argument("--cluster", required=True, metavar="STORE", help="this cluster's store, where the round's aggregate must be and verify")
    s.add_argument("--key", required=True, metavar="KEY.pem|block:NAME", help="this cluster's ECDSA private key, or a saved Concord Trust block's")
    s.add_argument("--key-password-env", metavar="NAME", help="environment variable holding the key's password (default: CONCORD_KEY_PASSWORD)")
    s.add_argument("--round", type=positive_int, metavar="N", help="the round to co-sign (default: the newest)")
    s.set_defaults(func=cmd_cosign)

    s = fed.add_parser("verify", parents=common, help="check a tenant's ledger: hashes, chain, head (exit 1 when tampered)")
    s.add_argument("tenant", metavar="TENANT")
    s.add_argument("--store", required=True, help=STORE_HELP)
    s.add_argument(
        "--trust", metavar="PUB.pem|block:NAME[,...]|POLICY.yaml",
        help=TRUST_HELP + "; every round, and the head, must be signed by the policy's threshold of them (a policy file's threshold:, or --trust-threshold K)",
    )
    s.add_argument(
        "--min-round", type=positive_int, metavar="N",
        help="the last round seen before: a ledger that now ends before it was rolled back (exit 1); "
        "default: the round this machine remembers; a lower N does not lower that (see --forget)",
    )
    memory = s.add_mutually_exclusive_group()
    memory.add_argument(
        "--forget", action="store_true",
        help="accept a rollback: verify without the round this machine remembers, then remember the ledger as it is now",
    )
    memory.add_argument(
        "--no-remember", action="store_true",
        help="verify without reading or writing this machine's memory of ledgers ($CONCORD_HOME/ledgers-seen.json)",
    )
    s.set_defaults(func=cmd_verify)

    s = fed.add_parser("log", parents=common, help="list a tenant's rounds, newest first")
    s.add_argument("tenant", metavar="TENANT")
    s.add_argument("--store", required=True, help=STORE_HELP)
    s.set_defaults(func=cmd_log)
