"""``concord``: the terminal face of the core.

Every command prints a readable summary (with progress bars on a terminal), or with ``--json``
exactly one JSON object on stdout. Failures exit non-zero with one line on stderr. Only the
standard library is imported up front, so ``concord --help`` answers at once.

One module per noun registers its commands (:mod:`.stores`, :mod:`.snapshots`, :mod:`.lineage`, :mod:`.federate`,
:mod:`.tier`, :mod:`.audit`, :mod:`.serving`, :mod:`.oci`); what they share is in :mod:`._common`. Each command is
``cmd_x(args, out) -> int``, called here with an :class:`~concord.cli._common.Output`.
"""

from __future__ import annotations

import argparse
import os
import sys

from concord.cli import audit, federate, lineage, oci, serving, snapshots, stores, tier, trust
from concord.cli._common import Output, Parser, add_trust_threshold, fail, quiet_libraries, resolve_trust

#: the nouns, in the order ``concord --help`` lists their commands
NOUNS = (stores, snapshots, trust, lineage, federate, tier, audit, serving, oci)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    common.add_argument(
        "--key-file", metavar="FILE", help="the key of an encrypted store (default: $CONCORD_KEY_FILE); never printed"
    )
    p = Parser(
        prog="concord",
        description=(
            "Keep model assets consistent across cluster stores: snapshot, diff, sync, restore, verify, "
            "rollback; data snapshots, schema contracts, model versions and lineage in MLflow."
        ),
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for noun in NOUNS:
        noun.register(sub, [common])
    add_trust_threshold(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from concord.errors import ConcordError

    # every store the command opens reads an encrypted store's key from there (for this command only)
    key_file = getattr(args, "key_file", None) if args.command != "init" else None
    before = os.environ.get("CONCORD_KEY_FILE")
    if key_file:
        os.environ["CONCORD_KEY_FILE"] = key_file
    try:
        with quiet_libraries():
            resolve_trust(args)
            return args.func(args, Output(args.json))
    except KeyboardInterrupt:
        print("concord: interrupted; re-run the same command to finish (stores are left consistent)", file=sys.stderr)
        return 130
    except (ConcordError, OSError, ValueError, ArithmeticError) as exc:
        return fail(exc)
    finally:
        if key_file:
            if before is None:
                os.environ.pop("CONCORD_KEY_FILE", None)
            else:
                os.environ["CONCORD_KEY_FILE"] = before


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
