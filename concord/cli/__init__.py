"""``concord``: the terminal face of the core.

Every command prints a readable summary (with progress bars on a terminal), or with ``--json``
exactly one JSON object on stdout. Failures exit non-zero with one line on stderr. Only the
standard library is imported up front, so ``concord --help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from typing import Iterator

STORE_HELP = "a folder, file:///path, s3://bucket/prefix or block:NAME"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _progress(args):
    if args.json:
        from concord.progress import NullProgress

        return NullProgress()
    from concord.progress import TqdmProgress

    return TqdmProgress()


def _emit(args, payload: dict, lines: list[str]) -> None:
    """Print ``payload`` as one JSON object (``--json``), or ``lines`` for a person.

    Every human line goes through :func:`concord.text.printable`: a file name, ref message or
    column name holding a newline or a terminal escape is shown escaped, never obeyed."""
    if args.json:
        sys.stdout.write(json.dumps(payload, sort_keys=True) + "\n")
    else:
        from concord.text import printable

        sys.stdout.write("\n".join(printable(line) for line in lines) + "\n")


def fail(message: object) -> int:
    """The CLI's one error printer: ``concord: error: MESSAGE`` as one bounded line on stderr
    (:func:`concord.text.one_line`); returns the exit status 1."""
    from concord.redact import redact
    from concord.text import one_line

    # a library's error may show an endpoint's password: hidden here whatever raised it
    print(f"concord: error: {one_line(redact(message))}", file=sys.stderr)
    return 1


def _store(spec: str):
    from concord.stores import open_store

    return open_store(spec)


def _read_store(spec: str):
    """A store for a command that only reads: never created; a path holding no store is an error."""
    from concord.stores import open_store_to_read

    return open_store_to_read(spec)


# ----------------------------------------------------------------------------- commands


def cmd_snapshot(args) -> int:
    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
    from concord.snapshots.snapshot import snapshot

    store = _store(args.store)
    r = snapshot(
        args.source,
        store,
        ref=args.ref,
        chunk_size=args.chunk_size or DEFAULT_CHUNK_SIZE,
        message=args.message or "",
        progress=_progress(args),
    )
    d = r.to_dict()
    d["store"] = store.uri
    lines = [
        f"snapshot {r.root}",
        f"  {r.files} files, {r.tensors} tensors, {r.chunks} chunks, {_human(r.bytes)}",
        f"  new in {store.uri}: {r.new_chunks} chunks, {_human(r.new_bytes)}",
    ]
    if r.ref:
        lines.append(f"  ref {r.ref} → version {r.ref_version} (was {(r.previous or '(new)')[:12]})")
    _emit(args, d, lines)
    return 0


def cmd_diff(args) -> int:
    from concord.snapshots.diff import diff_manifests
    from concord.snapshots.refs import load_manifest, resolve_root

    sa = _read_store(args.store)
    sb = _read_store(args.against) if args.against else sa
    ra, rb = resolve_root(sa, args.a), resolve_root(sb, args.b)
    d = diff_manifests(load_manifest(sa, ra), load_manifest(sb, rb))
    payload = d.to_dict()
    if d.same:
        lines = [f"same snapshot {ra}"]
    else:
        lines = [f"{ra[:12]} → {rb[:12]}: {len(d.changes)} change(s)"]
        for c in d.changes:
            mark = {"added": "+", "removed": "-", "changed": "~"}[c.kind]
            lines.append(f"  {mark} {c.file}" + (f" :: {c.tensor}" if c.tensor else ""))
        lines.append(f"  {d.chunks_differing} chunk(s), {_human(d.bytes_differing)} differ")
    _emit(args, payload, lines)
    return 0


def cmd_sync(args) -> int:
    from concord.snapshots.sync import replicate

    src = _store(args.source)
    targets = [_store(t) for t in args.targets]
    results = replicate(src, targets, ref=args.ref, root=args.root, progress=_progress(args))
    lines = []
    for r in results:
        lines.append(
            f"{r.store}: {r.root[:12]}  sent {r.chunks_sent} chunk(s), {_human(r.bytes_sent)}; "
            f"{r.chunks_present} already there" + (f"; ref {r.ref} v{r.ref_version}" if r.ref else "")
        )
    _emit(args, {"source": src.uri, "targets": [r.to_dict() for r in results]}, lines)
    return 0


def cmd_restore(args) -> int:
    from concord.snapshots.refs import load_manifest, resolve_root
    from concord.snapshots.restore import restore

    store = _read_store(args.store)
    root = resolve_root(store, args.ref or args.root)
    r = restore(store, load_manifest(store, root), args.out_dir, progress=_progress(args))
    _emit(args, r.to_dict(), [f"restored {r.root[:12]}: {r.files} files, {_human(r.bytes)} into {r.path}"])
    return 0


def cmd_verify(args) -> int:
    from concord.snapshots.verify import verify

    store = _read_store(args.store)
    repair = _read_store(args.repair_from) if args.repair_from else None
    r = verify(store, ref=args.ref, root=args.root, repair_from=repair, progress=_progress(args))
    lines = [
        f"{store.uri}: {r.chunks_checked} chunk(s) checked, {len(r.missing)} missing, "
        f"{len(r.corrupt)} corrupt, {len(r.repaired)} repaired"
    ]
    lines += [f"  missing {c}" for c in r.missing] + [f"  corrupt {c}" for c in r.corrupt]
    lines += [f"  damaged manifest {m}" for m in r.bad_manifests]
    lines += [f"  broken {b}" for b in r.broken_refs] + [f"  note: {g}" for g in r.history_gaps]
    _emit(args, r.to_dict(), lines)
    if not r.ok:
        if r.broken_refs:  # a ref that cannot be restored is the first thing to say: name it and the fix
            more = f" (and {len(r.broken_refs) - 1} more ref(s), listed above)" if len(r.broken_refs) > 1 else ""
            chunks = set(r.missing) | set(r.corrupt)
            bad = len(chunks - set(r.repaired))
            also = f"; also {bad} missing or corrupt chunk(s)" if bad else ""
            print(f"concord: error: {' '.join(r.broken_refs[0].split())}{more}{also}", file=sys.stderr)
            return 1
        print(
            f"concord: error: {store.uri} has missing or corrupt data; "
            "re-run with --repair-from STORE pointing at a healthy replica",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_rollback(args) -> int:
    from concord.snapshots.refs import rollback

    store = _store(args.store)
    r = rollback(store, args.ref, args.to)
    _emit(args, r.to_dict(), [f"{r.ref}: {r.previous[:12]} → {r.root[:12]} (version {r.version})"])
    return 0


def cmd_refs(args) -> int:
    store = _read_store(args.store)
    refs = []
    for name in store.list_refs():
        ref = store.read_ref(name)
        if ref is not None:
            refs.append({"ref": name, "root": ref.root, "version": ref.version, "time": ref.history[-1].time})
    lines = [f"{r['ref']:40} {r['root'][:12]}  v{r['version']}  {r['time']}" for r in refs] or ["(no refs)"]
    _emit(args, {"store": store.uri, "refs": refs}, lines)
    return 0


def cmd_log(args) -> int:
    from concord.errors import RefNotFoundError
    from concord.stores import canonical_ref

    store = _read_store(args.store)
    ref = store.read_ref(args.ref)
    if ref is None:
        raise RefNotFoundError(store.uri, canonical_ref(args.ref))
    hist = [e.__dict__ for e in reversed(ref.history)]
    lines = [f"v{e['version']:<4} {e['root'][:12]}  {e['time']}  {e['message']}" for e in hist]
    _emit(args, {"ref": ref.name, "history": hist}, lines)
    return 0


# ----------------------------------------------------------------------------- parser


def _chunk_size(text: str) -> int:
    """``4194304``, ``4M``, ``512K``, ``1.5MiB`` → bytes; anything else (``infM``, ``nanK``,
    ``1e400``, ``-4M``) is refused in one line."""
    import math

    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    problem = f"{text!r} is not a size; write e.g. 4194304, 4M or 512K"
    try:
        if t and t[-1] in units:
            number = float(t[:-1])
            if not math.isfinite(number) or not math.isfinite(number * units[t[-1]]):
                raise argparse.ArgumentTypeError(problem)
            return int(number * units[t[-1]])
        return int(t)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(problem) from None


def _name_arg(what: str, hint: str = "; to give none, leave the option out"):
    """An argparse type for a ref or root given explicitly: an empty or blank one is refused
    (``--ref ""`` would otherwise quietly mean "no ref")."""

    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is {'blank' if text else 'empty'}: give a {what}{hint}")
        return text

    check.__name__ = what.replace(" ", "_")
    return check


ref_arg = _name_arg("ref name ([namespace/]name)")
root_arg = _name_arg("64-hex snapshot root")
ref_positional = _name_arg("ref name ([namespace/]name)", "")


class Parser(argparse.ArgumentParser):
    """argparse, but a wrong command line is one line on stderr (exit 2), not a usage block."""

    def error(self, message: str):
        from concord.text import one_line

        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p = Parser(
        prog="concord",
        description=(
            "Keep model assets consistent across cluster stores: snapshot, diff, sync, restore, verify, "
            "rollback; data snapshots, schema contracts, model versions and lineage in MLflow."
        ),
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("snapshot", parents=[common], help="snapshot a checkpoint folder into a store")
    s.add_argument("source", metavar="DIR", help="checkpoint folder (or one file)")
    s.add_argument("--store", required=True, help=STORE_HELP)
    s.add_argument("--ref", type=ref_arg, help="point this ref ([namespace/]name) at the new snapshot")
    s.add_argument("--chunk-size", type=_chunk_size, help="chunk size (default 4M; 64K to 64M)")
    s.add_argument("--message", help="note kept in the ref's history")
    s.set_defaults(func=cmd_snapshot)

    s = sub.add_parser("diff", parents=[common], help="which files, tensors and chunks differ between two snapshots")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument("a", metavar="REF_OR_ROOT", help="ref, ref~N (N versions back) or 64-hex root")
    s.add_argument("--against", metavar="STORE", help="look the second snapshot up in this store")
    s.add_argument("b", metavar="REF_OR_ROOT")
    s.set_defaults(func=cmd_diff)

    s = sub.add_parser("sync", parents=[common], help="replicate a snapshot to one or more stores (only missing chunks move)")
    s.add_argument("source", metavar="SRC", help=STORE_HELP)
    s.add_argument("targets", metavar="DST", nargs="+")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--ref", type=ref_arg, help="ref to replicate (moved on each target by compare-and-swap)")
    g.add_argument("--root", type=root_arg, help="64-hex root to replicate (no ref is moved)")
    s.set_defaults(func=cmd_sync)

    s = sub.add_parser("restore", parents=[common], help="write a snapshot's files into a new folder")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--ref", type=ref_arg)
    g.add_argument("--root", type=root_arg)
    s.add_argument("out_dir", metavar="OUT_DIR")
    s.set_defaults(func=cmd_restore)

    s = sub.add_parser("verify", parents=[common], help="re-hash chunks; report (and repair) missing or corrupt ones")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    g = s.add_mutually_exclusive_group()
    g.add_argument("--ref", type=ref_arg, help="check only what this ref needs (default: the whole store)")
    g.add_argument("--root", type=root_arg)
    s.add_argument("--repair-from", metavar="STORE", help="fetch good copies of bad chunks from this store")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("rollback", parents=[common], help="move a ref back to an earlier root of its history")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument("--ref", type=ref_arg, required=True)
    s.add_argument("--to", metavar="ROOT", type=root_arg, help="root (or 8+ hex prefix) from the history; default: the previous one")
    s.set_defaults(func=cmd_rollback)

    s = sub.add_parser("refs", parents=[common], help="list the refs of a store")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.set_defaults(func=cmd_refs)

    s = sub.add_parser("log", parents=[common], help="show a ref's history")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument("ref", metavar="REF", type=ref_positional)
    s.set_defaults(func=cmd_log)

    from concord.cli import lineage as cli_lineage

    cli_lineage.add_parsers(sub, common)

    from concord.cli import federate as cli_federate

    cli_federate.add_parsers(sub, common)

    from concord.cli import tier as cli_tier

    cli_tier.add_parsers(sub, common)

    from concord.cli import audit as cli_audit

    cli_audit.add_parsers(sub, common)
    return p


#: set for the duration of a command, before Prefect or MLflow is imported (restored afterwards)
_QUIET_ENV = {
    # ``block:NAME`` without PREFECT_API_URL: Prefect starts a temporary server for the lookup,
    # whose telemetry heartbeat logs an error, or a long traceback, on this command's stderr
    # when it cannot be sent. Forced off: that server lives only as long as the command.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
_QUIET_DEFAULTS = {
    "DO_NOT_TRACK": "1",  # Prefect's client-side usage events (and their first-run notice)
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # MLflow's INFO lines (database set-up of a sqlite tracking URI)
}


@contextmanager
def _quiet_libraries() -> Iterator[None]:
    """The libraries a command may load print nothing of their own on its stderr: a command
    answers with its output and, on failure, one ``concord: error:`` line. A value the user set
    for ``DO_NOT_TRACK`` or ``MLFLOW_LOGGING_LEVEL`` is kept."""
    values = dict(_QUIET_ENV, **{k: v for k, v in _QUIET_DEFAULTS.items() if k not in os.environ})
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from concord.errors import ConcordError

    try:
        with _quiet_libraries():
            return args.func(args)
    except KeyboardInterrupt:
        print("concord: interrupted; re-run the same command to finish (stores are left consistent)", file=sys.stderr)
        return 130
    except (ConcordError, OSError, ValueError, ArithmeticError) as exc:
        return fail(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
