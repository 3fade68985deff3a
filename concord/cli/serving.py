"""``concord checkout``: the version a serving node reads, flipped atomically, and flipped back.

``concord checkout STORE --ref REF DEST`` writes the snapshot beside the link ``DEST``
(reusing the bytes of the version served now, fetching only the rest), verifies it, and flips the
link; ``--rollback DEST`` flips back to the version before; ``--status DEST`` lists the versions
on the node; ``--prune --keep N DEST`` removes older ones.
"""

from __future__ import annotations

import argparse

from concord.cli._common import (
    STORE_HELP,
    TRUST_HELP,
    human,
    key_file_options,
    keyed_store,
    positive_float,
    positive_int,
    readable_store,
    ref_arg,
    root_arg,
)


def _health(args):
    if not (args.health_cmd or args.health_url):
        return None
    from concord.serving.health import HealthCheck

    return HealthCheck(
        cmd=args.health_cmd, url=args.health_url, timeout=args.health_timeout,
        attempts=args.health_attempts, interval=args.health_interval,
    )


def cmd_checkout(args, out) -> int:
    from concord.serving import versions

    if args.status or args.rollback or args.prune:
        if args.store and args.dest:
            raise ValueError("--status, --rollback and --prune take only DEST (no STORE)")
        args.dest = args.dest or args.store
    if not args.dest:
        raise ValueError("give DEST, the link a serving process reads (e.g. /srv/models/current)")
    if args.status:
        return _status(args, out)
    if args.rollback:
        from concord.api import rollback_checkout

        r = rollback_checkout(args.dest, wait=args.wait)
        out.emit(r.to_dict(), [f"{r.path} → {r.root[:12]} (rolled back from {r.previous[:12]}) in {r.seconds:.3f} s"])
        return 0
    if args.prune:
        if not args.keep:
            raise ValueError("--prune needs --keep N: how many versions to keep on the node")
        layout = versions.Layout.of(args.dest)
        layout.current()
        with layout.locked(args.wait):
            removed = versions.prune(layout, args.keep)
        out.emit({"path": layout.link, "pruned": removed}, [f"removed {len(removed)} version(s) beside {layout.link}"]
                 + [f"  {r}" for r in removed])
        return 0
    if not args.store or not (args.ref or args.root):
        raise ValueError("give STORE and --ref REF (or --root ROOT) to check out, or --rollback / --status / --prune")
    from concord.api import checkout

    health = _health(args)
    store = readable_store(args.store)
    cache = None
    if args.cache:
        from concord.stores import open_store

        cache = keyed_store(open_store(args.cache), args.cache_key_file, "--cache-key-file")
    # --trust, else $CONCORD_TRUSTED_KEYS, else none; an untrusted root is refused before its manifest is read
    r = checkout(
        store, args.dest, ref=args.ref, root=args.root, trust=args.trust, cache=cache, keep=args.keep, health=health,
        wait=args.wait, fsync=not args.no_fsync, rehash=args.rehash, progress=out.progress,
    )
    if r.switched:
        lines = [
            f"{r.path} → {r.root[:12]} (was {(r.previous or '(nothing)')[:12]}): {r.files} files, {human(r.bytes)} "
            f"in {r.seconds:.2f} s",
            f"  fetched {human(r.bytes_fetched)}, reused {human(r.bytes_reused)} from this node"
            + (f", {human(r.bytes_from_cache)} from the cache" if cache is not None else ""),
        ]
    else:
        lines = [f"{r.path} already serves {r.root[:12]}; nothing to do"]
    lines += [f"  pruned {p}" for p in r.pruned]
    out.emit(r.to_dict(), lines)
    return 0


def _status(args, out) -> int:
    from concord.serving.versions import status

    s = status(args.dest)
    lines = [f"{s.link} → {s.current or '(no link)'}"]
    for v in s.versions:
        mark = "*" if v.current else ("-" if v.previous else " ")
        size = human(v.bytes) if v.bytes is not None else "?"
        lines.append(f" {mark} {v.root}  {size:>10}  {v.last_used or ''}")
    lines += [f"   partial {p} (a re-run of its checkout resumes it)" for p in s.partial]
    if s.pending_gate:
        lines.append(f"   gate pending for {s.pending_gate[:12]}: its checkout was interrupted before the health gate "
                     "passed (re-run it with the gate, or --rollback)")
    out.emit(s.to_dict(), lines)
    return 0


def _intermixed(parser: argparse.ArgumentParser) -> None:
    """Let ``parser`` take its positionals on both sides of options (``STORE --ref REF DEST``)
    although the first is optional (``--rollback DEST``): Python 3.11's argparse otherwise gives
    the optional one nothing and refuses the second."""

    class Intermixed(type(parser)):
        _mixing = False

        def parse_known_args(self, args=None, namespace=None):
            if self._mixing:
                return super().parse_known_args(args, namespace)
            self._mixing = True
            try:
                return self.parse_known_intermixed_args(args, namespace)
            finally:
                self._mixing = False

    parser.__class__ = Intermixed


def register(sub, common: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "checkout",
        parents=common,
        help="check a snapshot out beside a serving link and flip the link atomically (or roll it back)",
        description=(
            "Write the snapshot into a versions folder beside DEST (reusing the bytes of the version DEST serves "
            "now, fetching only the rest), verify every byte, then flip DEST, a symlink, atomically."
        ),
    )
    s.add_argument("store", metavar="STORE", nargs="?", help=STORE_HELP)
    s.add_argument("dest", metavar="DEST", nargs="?", help="the link a serving process reads, e.g. /srv/models/current")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--ref", type=ref_arg, help="ref ([namespace/]name, or name~N) whose root to check out")
    g.add_argument("--root", type=root_arg, help="64-hex root to check out")
    g.add_argument("--rollback", action="store_true", help="flip DEST back to the version it served before, at once")
    g.add_argument("--status", action="store_true", help="list the versions on this node, which is current and their roots")
    g.add_argument("--prune", action="store_true", help="only prune: keep the --keep N most recently used versions")
    s.add_argument("--keep", type=positive_int, metavar="N",
                   help="after the flip, keep N versions (never removing the current one or the one before)")
    s.add_argument("--cache", metavar="STORE", help="a local store several nodes of a host share: chunks are read "
                   "from it when there, and kept in it when fetched")
    key_file_options(s, ("cache", "the --cache store"))
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; a root no trusted key signed is never written to the node")
    hc = s.add_mutually_exclusive_group()
    hc.add_argument("--health-cmd", metavar="CMD", help="shell command run after the flip; non-zero exit flips back")
    hc.add_argument("--health-url", metavar="URL", help="GET after the flip; anything but 2xx flips back")
    s.add_argument("--health-timeout", type=positive_float, default=60.0, metavar="S", help="seconds per attempt, for the whole answer or command (default 60)")
    s.add_argument("--health-attempts", type=positive_int, default=1, metavar="N", help="attempts before the gate fails (default 1)")
    s.add_argument("--health-interval", type=positive_float, default=2.0, metavar="S", help="seconds between attempts (default 2)")
    s.add_argument("--wait", type=positive_float, default=600.0, metavar="S",
                   help="how long to wait for another checkout of DEST to finish (default 600)")
    s.add_argument("--no-fsync", action="store_true", help="do not flush the new files to disk before the flip")
    s.add_argument("--rehash", action="store_true", help="also read back and hash the bytes copied from versions on "
                   "the node whose files are unchanged since they were verified")
    s.set_defaults(func=cmd_checkout)
    _intermixed(s)
