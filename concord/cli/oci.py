"""``concord export oci`` and ``concord import oci``: a snapshot as a CNCF ModelPack artifact in
an OCI registry, and back. Credentials come from ``CONCORD_REGISTRY_USERNAME`` /
``CONCORD_REGISTRY_PASSWORD`` or the Docker config file, and are never printed."""

from __future__ import annotations

import argparse
from contextlib import contextmanager

from concord.cli._common import STORE_HELP, TRUST_HELP, human, readable_store, ref_arg, writable_store

PLAIN_HTTP_HELP = "speak plain HTTP to the registry (HTTPS is the default)"
REFERENCE_HELP = "REGISTRY/REPOSITORY:TAG, e.g. registry.example.com:5000/models/minilm:v1"


def _reference(text: str):
    from concord.errors.oci import OciReferenceError
    from concord.oci.reference import parse_reference

    try:
        return parse_reference(text)
    except OciReferenceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextmanager
def _sigterm_interrupts():
    """SIGTERM interrupts the command as Ctrl-C does, so what it staged is removed on the way out."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def cmd_export_oci(args, out) -> int:
    from concord.api import export_oci

    store = readable_store(args.store)
    with _sigterm_interrupts():
        r = export_oci(
            store, str(args.reference), name=args.name, plain_http=args.plain_http, progress=out.progress,
            memo=not args.no_memo, ref=args.ref,
        )
    d = r.to_dict()
    d["store"] = store.uri
    lines = [
        f"pushed {r.reference}",
        f"  digest {r.digest}",
        f"  snapshot {r.root}: {r.layers} layers, {human(r.bytes)}",
        f"  uploaded {r.layers_uploaded} layer(s), {human(r.bytes_uploaded)} (the registry had the rest)",
        f"  hashed {human(r.bytes_hashed)} ({r.layers_remembered} layer digest(s) remembered from earlier exports)",
    ]
    if r.signatures:
        lines.append(f"  signatures attached: {', '.join(r.signatures)}")
    out.emit(d, lines)
    return 0


def cmd_import_oci(args, out) -> int:
    from concord.api import import_oci

    with _sigterm_interrupts():
        r = import_oci(str(args.reference), args.store, ref=args.ref, plain_http=args.plain_http, progress=out.progress, trust=args.trust)
    d = r.to_dict()
    d["store"] = writable_store(args.store).uri  # made by the import, once the artifact passed every check
    lines = [
        f"imported {r.reference}",
        f"  digest {r.digest}",
        f"  snapshot {r.root}: {r.files} files, {human(r.bytes)} ({human(r.new_bytes)} new in {d['store']})",
    ]
    if r.ref:
        lines.append(f"  ref {r.ref} → {r.root[:12]}" + (f" (was {r.previous[:12]})" if r.previous else " (a new ref)"))
    if r.signatures:
        lines.append(f"  signatures kept: {', '.join(r.signatures)}")
    out.emit(d, lines)
    return 0


def register(sub, common: list) -> None:
    ex = sub.add_parser("export", help="publish a snapshot elsewhere: oci (a ModelPack artifact in a registry)").add_subparsers(
        dest="sub", metavar="FORMAT", required=True
    )
    s = ex.add_parser("oci", parents=common, help="push a snapshot to an OCI registry as a CNCF ModelPack artifact")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument("--ref", required=True, type=ref_arg, help="the snapshot: a ref, REF~N, or a 64-hex root")
    s.add_argument("reference", metavar="REGISTRY/REPO:TAG", type=_reference, help=REFERENCE_HELP)
    s.add_argument("--name", help="model name in the artifact's config (default: the ref's last part)")
    s.add_argument("--plain-http", action="store_true", help=PLAIN_HTTP_HELP)
    s.add_argument(
        "--no-memo", action="store_true",
        help="hash every file, not using or updating the SHA-256 this machine remembers of files it exported ($CONCORD_NO_OCI_MEMO=1)",
    )
    s.set_defaults(func=cmd_export_oci)

    im = sub.add_parser("import", help="bring a snapshot in from elsewhere: oci (a ModelPack artifact)").add_subparsers(
        dest="sub", metavar="FORMAT", required=True
    )
    s = im.add_parser("oci", parents=common, help="pull a ModelPack artifact from an OCI registry into a snapshot")
    s.add_argument("reference", metavar="REGISTRY/REPO:TAG", type=_reference, help=REFERENCE_HELP)
    s.add_argument("--store", required=True, help=STORE_HELP)
    s.add_argument("--ref", type=ref_arg, help="point this ref ([namespace/]name) at the imported snapshot")
    s.add_argument("--plain-http", action="store_true", help=PLAIN_HTTP_HELP)
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; the ref moves only if a trusted key signed the imported root")
    s.set_defaults(func=cmd_import_oci)
