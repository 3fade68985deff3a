"""``concord tier add|sweep|status|restore|drill|gc|check``: hot / warm / cold checkpoint tiering.

Every command takes ``--policy``: a policy YAML file, or ``block:NAME`` for a saved Prefect
``TierPolicyBlock``. A policy is checked before anything is touched; a refused policy lists every
problem in its one error line. ``sweep`` (and ``add``, which ends with one) exits 1 while any error
or copy-rule violation is left, ``drill`` while any tier misses its objectives; they still print
their whole report first. ``drill --track`` also logs the drill to MLflow as one run of the
experiment ``concord-restore-drills``, exactly as the restore-drill flow does, and puts the run's
id in the output (``mlflow_run_id``); the tracking server is checked before the drill starts.
"""

from __future__ import annotations

import argparse

from concord.cli._common import (
    TRUST_HELP,
    fail,
    human,
    open_lineage,
    positive_int,
    track_parent,
    tracking_parent,
    whole_number,
)

TIERS = ("hot", "warm", "cold")

POLICY_HELP = "tier policy: a YAML file, or block:NAME of a saved TierPolicyBlock"


def _policy(args):
    from concord.tiering.policy import load_policy

    return load_policy(args.policy)


def _duration(text: str) -> float:
    from concord.tiering.policy import parse_duration

    try:
        seconds = parse_duration(text, "--timeout")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive duration, e.g. 600, 15m or 2h")
    return seconds


def _human(n) -> str:
    return "?" if n is None or n < 0 else human(n)


def _when(iso: str | None) -> str:
    """``2025-01-31T10:04:05+00:00`` → ``2025-01-31 10:04`` (UTC, as the records keep it)."""
    return iso[:16].replace("T", " ") if iso else ""


def _seconds(value) -> str:
    if value is None:
        return "-"
    from concord.tiering.policy import format_duration

    return format_duration(round(float(value), 3)) if value >= 60 else f"{value:.3g} s"


# ----------------------------------------------------------------------------- status table


#: the width ``tier status`` keeps to unless ``--wide``
STATUS_WIDTH = 100


def _cell(tier: dict, wide: bool = True) -> str:
    if tier["present"]:
        when = _when(tier["verified"])
        if not wide:  # the month, day and time: the year is the CREATED column's, in --wide
            return f"✓ {when[5:]}".rstrip()
        return f"✓ {when}".rstrip() + (f" ({tier['verified_how']})" if tier["verified_how"] else "")
    return "✗ missing" if tier["wanted"] else "–"


def _fit(text: str, width: int) -> str:
    """``text`` cut in its middle to ``width`` characters (the end of a checkpoint's name, its
    step, and of a store's address, its last folder, are what tell them apart)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def status_lines(status: dict, wide: bool = False) -> list[str]:
    """A checkpoint × tier table: ✓ and when the copy was last verified, – where there is none.

    By default it fits :data:`STATUS_WIDTH` columns: each tier's store on its own line, no CREATED
    column, verification as month, day and time, long names and addresses cut in the middle
    (``…``), problems wrapped. ``wide``: every column in full (CREATED, how each copy was verified)."""
    import textwrap

    limit = None if wide else STATUS_WIDTH
    if wide:
        lines = [f"namespace {status['namespace']}: " + ", ".join(f"{t} {status['stores'][t]} ({status['encodings'][t]})" for t in TIERS)]
    else:
        lines = [f"namespace {status['namespace']}"]
        for t in TIERS:
            enc = f"  ({status['encodings'][t]})"
            lines.append(f"  {t:<4}  " + _fit(str(status["stores"][t]), STATUS_WIDTH - 8 - len(enc)) + enc)
    head = ("CHECKPOINT", "STEP", *(("CREATED",) if wide else ()), "SIZE", *(t.upper() for t in TIERS))
    rows = []
    for c in status["checkpoints"]:
        name = c["name"] + (" (pinned)" if c["pinned"] else "")
        step = "" if c["step"] is None else str(c["step"])
        created = (_when(c["created"]),) if wide else ()
        rows.append([name, step, *created, _human(c["bytes"]), *(_cell(c["tiers"][t], wide) for t in TIERS)])
    if not rows:
        lines.append("(no checkpoints tiered yet)")
    else:
        table = [list(head), *rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(head))]
        if limit is not None:
            over = sum(widths) + 2 * (len(widths) - 1) - limit
            if over > 0:  # the names give way: everything else is short already
                widths[0] = max(len(head[0]), widths[0] - over)
                for r in rows:
                    r[0] = _fit(r[0], widths[0])
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    for v in status["violations"]:
        if limit is None:
            lines.append(f"✗ {v}")
        else:
            lines += textwrap.wrap(v, limit, initial_indent="✗ ", subsequent_indent="  ", break_on_hyphens=False)
    return lines


def sweep_lines(r: dict) -> list[str]:
    dry = " (dry run: nothing changed)" if r.get("dry_run") else ""
    lines = [
        f"sweep of {r['namespace']}{dry}: {len(r['copied'])} cop{'y' if len(r['copied']) == 1 else 'ies'} made, "
        f"{len(r['demoted'])} demoted, {len(r['repaired'])} repaired, "
        f"{len(r['errors'])} error(s), {len(r['violations'])} violation(s)"
    ]
    for c in r["copied"]:
        sent = "" if c.get("bytes_sent") is None else f", sent {_human(c['bytes_sent'])}"
        lines.append(f"  + {c['name']} → {c['tier']} (from {c['from']}{sent})")
    for d in r["demoted"]:
        verified = d.get("verified") or {}
        listed = ", ".join(f"{t} {how}" for t, how in verified.items()) if isinstance(verified, dict) else ", ".join(verified)
        lines.append(f"  - {d['name']} removed from {d['tier']} (verified first: {listed})")
    for x in r["repaired"]:
        lines.append(f"  ~ {x['name']} in {x['tier']}: {x['chunks']} chunk(s) repaired from {x['from']}")
    for t, g in (r.get("gc") or {}).items():
        if any(g.get(k) for k in ("deleted_chunks", "deleted_manifests", "deleted_signatures", "deleted_leftovers", "postponed_by")):
            lines.append(f"  gc {t}: {_gc_summary(g)}")
    lines += [f"  ✗ error: {e}" for e in r["errors"]] + [f"  ✗ violation: {v}" for v in r["violations"]]
    lines += signature_lines(r.get("signatures_skipped", []))
    return lines


def signature_lines(skipped: list[str]) -> list[str]:
    """One line per signature document a copy left behind (the tier kept what it held)."""
    return [f"  ! signature left behind: {s}" for s in skipped]


def _gc_summary(g: dict) -> str:
    verb = "would delete" if g.get("dry_run") else "deleted"
    text = (
        f"{verb} {g.get('deleted_chunks', 0)} chunk(s) ({_human(g.get('deleted_bytes', 0))}) and "
        f"{g.get('deleted_manifests', 0)} manifest(s), {g.get('deleted_signatures', 0)} signature(s) of those roots, "
        f"{g.get('deleted_leftovers', 0)} leftover temporary file(s); "
        f"{g.get('young_chunks', 0)} unreferenced chunk(s) "
        f"younger than the grace period kept; {g.get('live_chunks', 0)} chunk(s) in use"
    )
    if g.get("postponed_by"):
        text += f"; postponed while {', '.join(g['postponed_by'])} holds a lease"
    return text


def _sweep_failure(r: dict) -> str:
    problems = r["errors"] + r["violations"]
    return (
        f"{len(r['errors'])} error(s) and {len(r['violations'])} copy-rule violation(s) left in "
        f"{r['namespace']} (first: {problems[0]}); fix the cause and run `concord tier sweep` again"
    )


# ----------------------------------------------------------------------------- commands


def cmd_add(args, out) -> int:
    from concord.api import tier_add

    policy = _policy(args)
    r = tier_add(policy, args.checkpoint_dir, args.name, step=args.step, progress=out.progress).to_dict()
    sent = ", ".join(f"{t} {_human(n)}" for t, n in r["new_bytes"].items())
    step = "" if r["step"] is None else f", step {r['step']}"
    lines = [f"added {r['name']} ({r['root'][:12]}{step}, {_human(r['bytes'])}) to {policy.namespace}; new bytes as stored: {sent}"]
    lines += signature_lines(r["signatures_skipped"])
    sweep = r["sweep"]
    if sweep is not None:
        lines += sweep_lines(sweep)
    out.emit(r, lines)
    if sweep is not None and (sweep["errors"] or sweep["violations"]):
        return fail(f"{r['name']} was added, but " + _sweep_failure(sweep))
    return 0


def cmd_sweep(args, out) -> int:
    from concord.api import tier_sweep

    r = tier_sweep(_policy(args), dry_run=args.dry_run, progress=out.progress).to_dict()
    out.emit(r, sweep_lines(r))
    if r["errors"] or r["violations"]:
        return fail(_sweep_failure(r))
    return 0


def cmd_status(args, out) -> int:
    from concord.api import tier_status

    # status only reads: a tier's folder that is not there yet holds nothing, and is not created;
    # an unreachable one is named with the policy file, tier and endpoint
    status = tier_status(_policy(args))
    out.emit(status, status_lines(status, wide=args.wide))
    return 0


def cmd_restore(args, out) -> int:
    from concord.api import tier_restore

    r = tier_restore(
        _policy(args), args.name, args.out_dir, tier=args.tier, timeout=args.timeout, trust=args.trust, progress=out.progress
    ).to_dict()
    if r["unchanged"]:
        out.emit(r, [f"unchanged: {r['path']} already holds {r['name']} ({r['root'][:12]}, {r['files']} file(s), checked by content)"])
        return 0
    waited = f", {_seconds(r['wait_seconds'])} of it waiting on the archive" if r.get("wait_seconds") else ""
    lines = [
        f"restored {r['name']} ({r['root'][:12]}) from {r['tier']} ({r['store']}) into {r['path']}",
        f"  {r['files']} file(s), {_human(r['bytes'])} in {_seconds(r['seconds'])}{waited}",
    ]
    out.emit(r, lines)
    return 0


def _mark(ok) -> str:
    return "–" if ok is None else "✓" if ok else "✗"


def drill_lines(r: dict) -> list[str]:
    lines = [f"restore drill of {r['namespace']} at {_when(r['started'])}: {'ok' if r['ok'] else 'FAILED'}"]
    for t, d in r["tiers"].items():
        rto = f"RTO {_seconds(d['rto_seconds'])} (objective {_seconds(d['rto_objective'])}) {_mark(d['rto_ok'])}"
        rpo = f"RPO {_seconds(d['rpo_seconds'])} (objective {_seconds(d['rpo_objective'])}) {_mark(d['rpo_ok'])}"
        sampled = ", ".join(d["sampled"]) or "nothing"
        lines.append(f"  {t:<5} {_mark(d['ok'])}  {rto}, {rpo}; restored {sampled} from {d['store']}")
    lines += [f"  ✗ {_finding(f)}" for f in r["findings"]]
    return lines


def cmd_drill(args, out) -> int:
    from concord.api import tier_drill

    policy = _policy(args)
    lineage = None
    if args.track:  # an unreachable tracking server fails before the drill starts
        lineage = open_lineage(args.tracking_uri)
        lineage.ensure_ready()
    r = tier_drill(policy, sample=args.sample, progress=out.progress).to_dict()
    lines = drill_lines(r)
    if lineage is not None:
        from concord.tiering.tracking import log_drill

        r["mlflow_run_id"] = log_drill(lineage, r, sample=args.sample)
        lines.append(f"logged to MLflow run {r['mlflow_run_id']}")
    out.emit(r, lines)
    if not r["ok"]:
        failed = [t for t, d in r["tiers"].items() if not d["ok"]]
        first = f" (first finding: {_finding(r['findings'][0])})" if r["findings"] else ""
        return fail(
            f"restore drill of {r['namespace']} failed in {', '.join(failed) or 'the drill itself'}{first}; "
            "see the report above"
        )
    return 0


def _finding(f) -> str:
    if isinstance(f, dict):
        return str(f.get("problem") or f.get("message") or f)
    return str(f)


def cmd_gc(args, out) -> int:
    from concord.api import tier_gc

    policy = _policy(args)
    found = {t: g.to_dict() for t, g in tier_gc(policy, tier=args.tier, dry_run=args.dry_run).items()}
    result = {"namespace": policy.namespace, "dry_run": args.dry_run, "grace_seconds": policy.gc_grace_seconds, "tiers": found}
    lines = [f"garbage collection{' (dry run: nothing deleted)' if args.dry_run else ''}, grace {_seconds(policy.gc_grace_seconds)}"]
    lines += [f"  {t} ({g['store']}): {_gc_summary(g)}" for t, g in found.items()]
    out.emit(result, lines)
    return 0


def cmd_check(args, out) -> int:
    from concord.api import tier_check
    from concord.errors import PolicyError

    try:
        policy = tier_check(args.policy)
    except PolicyError as exc:
        if out.json:
            out.emit({"source": args.policy, "ok": False, "problems": exc.problems}, [])
        raise
    import yaml

    doc = policy.to_dict()
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).rstrip("\n")
    out.emit({"source": args.policy, "ok": True, "policy": doc}, [f"# {args.policy}: ok (normalised)", *text.splitlines()])
    return 0


# ----------------------------------------------------------------------------- parser


def register(sub, common: list) -> None:
    pol = argparse.ArgumentParser(add_help=False)
    pol.add_argument("--policy", required=True, metavar="POLICY", help=POLICY_HELP)

    tier = sub.add_parser("tier", help="hot/warm/cold checkpoint tiering: add, sweep, status, restore, drill, gc").add_subparsers(
        dest="sub", metavar="ACTION", required=True
    )
    s = tier.add_parser("add", parents=[*common, pol], help="take a finished checkpoint into hot, copy it to warm and cold, then sweep")
    s.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR")
    s.add_argument("--name", help="checkpoint name (default: the folder's name)")
    s.add_argument("--step", type=whole_number, metavar="N", help="training step (default: the number the name ends with)")
    s.set_defaults(func=cmd_add)

    s = tier.add_parser(
        "sweep", parents=[*common, pol], help="copy what is missing, demote what the policy no longer keeps (exit 1 on violations)"
    )
    s.add_argument("--dry-run", action="store_true", help="report what would change; change nothing")
    s.set_defaults(func=cmd_sweep)

    s = tier.add_parser("status", parents=[*common, pol], help="each checkpoint × tier: present, verified when, bytes")
    s.add_argument(
        "--wide", action="store_true",
        help=f"every column in full (created, how each copy was verified); default: fit {STATUS_WIDTH} columns",
    )
    s.set_defaults(func=cmd_status)

    s = tier.add_parser("restore", parents=[*common, pol], help="restore a checkpoint from the nearest (or a given) tier")
    s.add_argument("name", metavar="NAME")
    s.add_argument("out_dir", metavar="OUT_DIR")
    s.add_argument("--tier", choices=TIERS, help="restore from this tier (default: the nearest that holds it)")
    s.add_argument("--timeout", type=_duration, metavar="SECONDS", help="wait this long for an archive restore (default: the policy's)")
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; an unsigned root is refused")
    s.set_defaults(func=cmd_restore)

    trk = track_parent("drill", "the restore-drill flow")
    s = tier.add_parser(
        "drill",
        parents=[*common, pol, tracking_parent(), trk],
        help="restore samples from every tier, verify, measure RTO and RPO (exit 1 when missed)",
    )
    s.add_argument("--sample", type=positive_int, default=1, metavar="N", help="checkpoints restored per tier (default 1)")
    s.set_defaults(func=cmd_drill)

    s = tier.add_parser("gc", parents=[*common, pol], help="delete chunks no ref needs, older than the policy's gc_grace")
    s.add_argument("--tier", choices=TIERS, help="only this tier (default: all three)")
    s.add_argument("--dry-run", action="store_true", help="report what would be deleted; delete nothing")
    s.set_defaults(func=cmd_gc)

    s = tier.add_parser("check", parents=[*common, pol], help="validate a policy and print it normalised")
    s.set_defaults(func=cmd_check)
