"""``concord snapshot|snapshot-part|snapshot-assemble|diff|sync|restore|verify|rollback|refs|log``: snapshots in stores.

``snapshot`` takes a checkpoint folder into a store (``snapshot-part`` on each node, then
``snapshot-assemble`` once, for a checkpoint spread over several nodes' disks), ``sync`` replicates a snapshot (only the
missing chunks move), ``restore`` writes its files back out, ``verify`` re-hashes chunks and can
repair them from a healthy replica, ``rollback`` moves a ref back through its history. ``diff``,
``verify``, ``refs``, ``log`` and ``restore`` only read: a path holding no store is an error.
"""

from __future__ import annotations

import os
import sys

from concord.cli._common import (
    STORE_HELP,
    TRUST_HELP,
    chunk_size,
    human,
    key_file_options,
    keyed_store,
    readable_store,
    ref_arg,
    ref_positional,
    root_arg,
    writable_store,
)

# ----------------------------------------------------------------------------- commands


def _policy(args):
    """The trust policy of a command: ``--trust``, else ``$CONCORD_TRUSTED_KEYS``, else None."""
    from concord.trust import load_policy

    return load_policy(getattr(args, "trust", None))


def cmd_snapshot(args, out) -> int:
    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE

    options = dict(
        ref=args.ref, chunk_size=args.chunk_size or DEFAULT_CHUNK_SIZE, message=args.message or "", progress=out.progress,
        base=args.base, delta=not args.no_delta,
    )
    signed = None
    if args.signature:
        from concord.errors import TrustPolicyError
        from concord.trust.signing import snapshot_signed

        policy = _policy(args)
        if policy is None:
            raise TrustPolicyError("--signature", "a signature is kept only after it verifies: give its signer's public key with --trust PUB.pem")
        with open(args.signature, "rb") as fh:
            data = fh.read()
        store = writable_store(args.store)
        r, signed = snapshot_signed(args.source, store, data, policy.keys, where=args.signature, **options)
    else:
        from concord.api import snapshot as take

        store = writable_store(args.store)
        r = take(args.source, store, **options)
    d, lines = _snapshot_answer(r, store)
    if signed is not None:
        d["signed_by"] = [signed.key_id]
        lines.append(f"  signature from {args.signature} kept: key {signed.key_id[:16]}")
    out.emit(d, lines)
    return 0


def _snapshot_answer(r, store) -> tuple[dict, list[str]]:
    """A snapshot's answer (payload and lines), from ``snapshot`` or ``snapshot-assemble``."""
    d = r.to_dict()
    d["store"] = store.uri
    lines = [
        f"snapshot {r.root}",
        f"  {r.files} files, {r.tensors} tensors, {r.chunks} chunks, {human(r.bytes)}",
        f"  new in {store.uri}: {r.new_chunks} chunks, {human(r.new_bytes)}{_stored(r, store)}",
    ]
    if r.ref:
        lines.append(f"  ref {r.ref} → version {r.ref_version}" + (f" (was {r.previous[:12]})" if r.previous else " (a new ref)"))
    return d, lines


def _stored(r, store) -> str:
    """A compressed or encrypted store keeps other bytes than the raw ones: both are shown."""
    return f" ({human(r.new_stored_bytes)} stored)" if r.new_chunks and store.encoding().framed else ""


def cmd_snapshot_part(args, out) -> int:
    from concord.api import snapshot_part

    store = writable_store(args.store)
    part = snapshot_part(
        args.source, store, node=args.node, paths=args.path, chunk_size=args.chunk_size, out=args.out, progress=out.progress
    )
    d = {k: v for k, v in part.to_dict().items() if k != "manifest"} | {"store": store.uri, "part_file": os.path.abspath(args.out)}
    lines = [
        f"part of node {part.node}: {d['files']} files, {d['chunks']} chunks, {human(d['bytes'])} of {part.folder}",
        f"  new in {store.uri}: {part.new_chunks} chunks, {human(part.new_bytes)}{_stored(part, store)}",
        f"  written to {d['part_file']}: give it, with every other node's part, to concord snapshot-assemble",
    ]
    out.emit(d, lines)
    return 0


def cmd_snapshot_assemble(args, out) -> int:
    from concord.api import _read_part, snapshot_assemble

    parts = [_read_part(path) for path in args.parts]
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()] if args.nodes is not None else None
    store = writable_store(args.store)
    r = snapshot_assemble(
        store, parts, nodes=nodes, ref=args.ref, message=args.message or "", allow_incomplete=args.allow_incomplete
    )
    d, lines = _snapshot_answer(r, store)
    d["nodes"] = [p["node"] for p in parts]
    lines.insert(1, f"  assembled from {len(parts)} part(s): {', '.join(d['nodes'])}")
    out.emit(d, lines)
    return 0


def cmd_diff(args, out) -> int:
    from concord.api import diff

    sa = readable_store(args.store)
    sb = keyed_store(readable_store(args.against), args.against_key_file, "--against-key-file") if args.against else None
    d = diff(sa, args.a, args.b, against=sb)
    ra, rb = d.a, d.b
    payload = d.to_dict()
    if d.same:
        lines = [f"same snapshot {ra}"]
    else:
        lines = [f"{ra[:12]} → {rb[:12]}: {len(d.changes)} change(s)"]
        lines += [f"  {_change_line(c)}" for c in d.changes]
        lines.append(f"  {d.chunks_differing} chunk(s), {human(d.bytes_differing)} not in {ra[:12]}: what a sync to a store holding it moves")
        if d.bytes_to_send is not None and (d.bytes_to_send != d.bytes_differing or d.delta_chunks):
            deltas = f", {d.delta_chunks} chunk(s) as deltas" if d.delta_chunks else ""
            lines.append(f"  sent as the store keeps them: {human(d.bytes_to_send)}{deltas}")
    out.emit(payload, lines)
    return 0


def _change_line(c) -> str:
    """One change of a diff: a mark, the file (and tensor), and where a moved or renamed one was."""
    mark = {"added": "+", "removed": "-", "changed": "~", "moved": ">", "renamed": "="}[c.kind]
    line = f"{mark} {c.file}" + (f" :: {c.tensor}" if c.tensor else "")
    if c.tensor is None:
        return line + (f" (was {c.from_file})" if c.from_file else "")
    origin = []
    if c.from_file and c.from_file != c.file:
        origin.append(f"was in {c.from_file}")
    elif c.kind == "moved":
        origin.append("at another offset")
    if c.from_tensor:
        origin.append(f"was {c.from_tensor}")
    return line + (f" ({', '.join(origin)})" if origin else "")


def cmd_sync(args, out) -> int:
    from concord.api import sync

    policy = _policy(args)  # an empty list fails before any store is opened (or made)
    src = keyed_store(writable_store(args.source), args.source_key_file, "--source-key-file")
    targets = [keyed_store(writable_store(t), args.target_key_file, "--target-key-file") for t in args.targets]
    results = sync(src, targets, ref=args.ref, root=args.root, trust=policy, progress=out.progress)
    lines = []
    for r in results:
        raw = f" ({human(r.raw_bytes_sent)} raw)" if r.raw_bytes_sent != r.bytes_sent else ""
        lines.append(
            f"{r.store}: {r.root[:12]}  sent {r.chunks_sent} chunk(s), {human(r.bytes_sent)}{raw}; "
            f"{r.chunks_present} already there" + (f"; ref {r.ref} v{r.ref_version}" if r.ref else "")
        )
        lines += [f"  ! signature left behind: {s}" for s in r.signatures_skipped]
    out.emit({"source": src.uri, "targets": [r.to_dict() for r in results]}, lines)
    return 0


def cmd_restore(args, out) -> int:
    from concord.api import restore

    r = restore(args.store, args.out_dir, ref=args.ref, root=args.root, trust=args.trust, progress=out.progress)
    if r.unchanged:
        line = f"unchanged: {r.path} already holds {r.root[:12]} ({r.files} files, checked by content)"
    else:
        line = f"restored {r.root[:12]}: {r.files} files, {human(r.bytes)} into {r.path}"
    out.emit(r.to_dict(), [line])
    return 0


def cmd_verify(args, out) -> int:
    from concord.api import verify
    from concord.errors import IntegrityError

    policy = _policy(args)  # an empty list fails before any chunk is read
    store = readable_store(args.store)
    repair = keyed_store(readable_store(args.repair_from), args.repair_key_file, "--repair-key-file") if args.repair_from else None
    r = verify(store, ref=args.ref, root=args.root, repair_from=repair, progress=out.progress)
    lines = [
        f"{store.uri}: {r.chunks_checked} chunk(s) checked, {len(r.missing)} missing, "
        f"{len(r.corrupt)} corrupt, {len(r.repaired)} repaired"
    ]
    payload = r.to_dict()
    untrusted = _trust_lines(store, args, payload, lines, policy)
    lines += [f"  missing {c}" for c in r.missing] + [f"  corrupt {c}" for c in r.corrupt]
    lines += [f"  damaged manifest {m}" for m in r.bad_manifests]
    lines += [f"  broken {b}" for b in r.broken_refs] + [f"  note: {g}" for g in r.history_gaps]
    out.emit(payload, lines)
    if not r.ok:
        if r.broken_refs:  # a ref that cannot be restored is the first thing to say: name it and the fix
            more = f" (and {len(r.broken_refs) - 1} more ref(s), listed above)" if len(r.broken_refs) > 1 else ""
            chunks = set(r.missing) | set(r.corrupt)
            bad = len(chunks - set(r.repaired))
            also = f"; also {bad} missing or corrupt chunk(s)" if bad else ""
            print(f"concord: error: {' '.join(r.broken_refs[0].split())}{more}{also}", file=sys.stderr)
            return IntegrityError.exit_code
        print(
            f"concord: error: {store.uri} has missing or corrupt data; "
            "re-run with --repair-from STORE pointing at a healthy replica",
            file=sys.stderr,
        )
        return IntegrityError.exit_code
    if untrusted:
        from concord.errors import UntrustedRootError

        print(f"concord: error: {untrusted[0]}" + (f" (and {len(untrusted) - 1} more)" if len(untrusted) > 1 else ""), file=sys.stderr)
        return UntrustedRootError.exit_code
    return 0


def _trust_lines(store, args, payload: dict, lines: list[str], policy) -> list[str]:
    """Add each checked root's ``signed_by`` (the trusted keys whose signatures hold, None
    without a policy: nothing is verified then) and ``trusted`` to a verify's answer
    (``payload['trust']``); the roots that are not trusted, as one line each."""
    from concord.snapshots.refs import resolve_root

    if policy is None:  # the signature documents are counted, never named as signers: that needs --trust
        if args.ref or args.root:
            from concord.trust import signature_ids

            ids = signature_ids(store, resolve_root(store, args.ref or args.root))
            payload["signed_by"], payload["trusted"], payload["unchecked"] = None, None, ids
            lines += [f"  unchecked signature claiming key id {k} (give --trust PUB.pem to check it)" for k in ids]
        return []
    if args.ref or args.root:
        roots = {args.ref or args.root: resolve_root(store, args.ref or args.root)}
    else:
        roots = {}
        for name in store.list_refs():
            ref = store.read_ref(name)
            if ref is not None and store.has_manifest(ref.root):
                roots[name] = ref.root
    report, untrusted = [], []
    for name, root in roots.items():
        v = policy.report(store, root)
        report.append({"ref": name, **v.to_dict()})
        lines.append(f"  {name}: {root[:12]} trusted: {'yes' if v.trusted else 'no'} (signed by {v.quorum})")
        lines += [f"    {line}" for line in v.lines()]
        if not v.trusted:
            untrusted.append(
                f"{name} ({root}) in {store.uri} is not trusted ({v.why()}); keys tried: {', '.join(k[:16] for k in policy.key_ids)}"
            )
    payload["trust"] = report
    if len(report) == 1:
        payload["signed_by"], payload["trusted"] = report[0]["signed_by"], report[0]["trusted"]
    return untrusted


def cmd_rollback(args, out) -> int:
    from concord.api import rollback

    r = rollback(args.store, args.ref, to=args.to)
    out.emit(r.to_dict(), [f"{r.ref}: {r.previous[:12]} → {r.root[:12]} (version {r.version})"])
    return 0


def cmd_refs(args, out) -> int:
    from concord.api import refs as list_refs

    store = readable_store(args.store)
    refs = list_refs(store)
    lines = [f"{r['ref']:40} {r['root'][:12]}  v{r['version']}  {r['time']}" for r in refs] or ["(no refs)"]
    out.emit({"store": store.uri, "refs": refs}, lines)
    return 0


def cmd_log(args, out) -> int:
    from concord.api import log
    from concord.stores import canonical_ref

    hist = log(args.store, args.ref, trust=getattr(args, "trust", None))

    def signs(e: dict) -> str:
        if e["signed_by"] is None:  # nothing is verified without a policy: no key is named
            return f"  [{len(e['unchecked'])} signature(s), unchecked: give --trust]" if e["unchecked"] else ""
        text = f"  [signed: {', '.join(k[:12] for k in e['signed_by'])}]" if e["signed_by"] else ""
        text += "".join(f"  [invalid signature from key id {k[:12]}]" for k in e["invalid"])
        return text + f"  [{'trusted' if e['trusted'] else 'untrusted'}: {e['quorum']}]"

    lines = [f"v{e['version']:<4} {e['root'][:12]}  {e['time']}  {e['message']}" + signs(e) for e in hist]
    out.emit({"ref": canonical_ref(args.ref), "history": hist}, lines)
    return 0


# ----------------------------------------------------------------------------- parser


def register(sub, common: list) -> None:
    s = sub.add_parser("snapshot", parents=common, help="snapshot a checkpoint folder into a store")
    s.add_argument("source", metavar="DIR", help="checkpoint folder (or one file)")
    s.add_argument("--store", required=True, help=STORE_HELP)
    s.add_argument("--ref", type=ref_arg, help="point this ref ([namespace/]name) at the new snapshot")
    s.add_argument("--chunk-size", type=chunk_size, help="chunk size (default 4M; 64K to 64M)")
    s.add_argument("--message", help="note kept in the ref's history")
    s.add_argument(
        "--base", metavar="REF|ROOT", type=ref_arg,
        help="store new chunks as deltas of this version's (compressed or encrypted stores; default: the ref's current version)",
    )
    s.add_argument("--no-delta", action="store_true", help="store every new chunk whole, never as a delta")
    s.add_argument(
        "--signature",
        metavar="FILE",
        help="an OpenSSF Model Signing bundle of the folder (model_signing sign key): kept once it verifies with a --trust key",
    )
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP)
    s.set_defaults(func=cmd_snapshot)

    s = sub.add_parser(
        "snapshot-part", parents=common,
        help="on one node of a spread checkpoint: store its files' chunks and write its part for snapshot-assemble",
    )
    s.add_argument("source", metavar="DIR", help="the checkpoint folder on this node's own disk")
    s.add_argument("--store", required=True, help=STORE_HELP + "; the one store every node writes into")
    s.add_argument("--node", required=True, help="this node's name, a different one on every node")
    s.add_argument("--out", required=True, metavar="PART.json", help="where to write this node's part (a manifest of its files)")
    s.add_argument("--path", action="append", metavar="REL", help="take only this file of DIR ('/'-separated; repeat for more)")
    s.add_argument("--chunk-size", type=chunk_size, help="chunk size (default 4M; 64K to 64M), the same on every node")
    s.set_defaults(func=cmd_snapshot_part)

    s = sub.add_parser(
        "snapshot-assemble", parents=common,
        help="make one snapshot of every node's part (snapshot-part): the root a snapshot of the whole folder has",
    )
    s.add_argument("parts", metavar="PART.json", nargs="+", help="every node's part file")
    s.add_argument("--store", required=True, help=STORE_HELP + "; the store the parts were taken into")
    s.add_argument("--nodes", metavar="NAME[,NAME...]", help="the nodes whose parts are expected (default: those given)")
    s.add_argument("--ref", type=ref_arg, help="point this ref ([namespace/]name) at the new snapshot")
    s.add_argument("--message", help="note kept in the ref's history")
    s.add_argument(
        "--allow-incomplete", action="store_true",
        help="assemble even if a DCP .metadata names .distcp files no part holds (refused by default)",
    )
    s.set_defaults(func=cmd_snapshot_assemble)

    s = sub.add_parser("diff", parents=common, help="which files and tensors differ between two snapshots, by content, and what a sync would move")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument("a", metavar="REF_OR_ROOT", help="ref, ref~N (N versions back) or 64-hex root")
    s.add_argument("--against", metavar="STORE", help="look the second snapshot up in this store")
    s.add_argument("b", metavar="REF_OR_ROOT")
    key_file_options(s, ("against", "the --against store"))
    s.set_defaults(func=cmd_diff)

    s = sub.add_parser("sync", parents=common, help="replicate a snapshot to one or more stores (only missing chunks move)")
    s.add_argument("source", metavar="SRC", help=STORE_HELP)
    s.add_argument("targets", metavar="DST", nargs="+")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--ref", type=ref_arg, help="ref to replicate (moved on each target by compare-and-swap)")
    g.add_argument("--root", type=root_arg, help="64-hex root to replicate (no ref is moved)")
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; an unsigned root is refused")
    key_file_options(s, ("source", "SRC"), ("target", "every DST"))
    s.set_defaults(func=cmd_sync)

    s = sub.add_parser("restore", parents=common, help="write a snapshot's files into a new folder")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--ref", type=ref_arg)
    g.add_argument("--root", type=root_arg)
    s.add_argument("out_dir", metavar="OUT_DIR")
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; an unsigned root is refused")
    s.set_defaults(func=cmd_restore)

    s = sub.add_parser("verify", parents=common, help="re-hash chunks; report (and repair) missing or corrupt ones")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    g = s.add_mutually_exclusive_group()
    g.add_argument("--ref", type=ref_arg, help="check only what this ref needs (default: the whole store)")
    g.add_argument("--root", type=root_arg)
    s.add_argument("--repair-from", metavar="STORE", help="fetch good copies of bad chunks from this store")
    key_file_options(s, ("repair", "the --repair-from store"))
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; reports signed_by and trusted")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("rollback", parents=common, help="move a ref back to an earlier root of its history")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument("--ref", type=ref_arg, required=True)
    s.add_argument("--to", metavar="ROOT", type=root_arg, help="root (or 8+ hex prefix) from the history; default: the previous one")
    s.set_defaults(func=cmd_rollback)

    s = sub.add_parser("refs", parents=common, help="list the refs of a store")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.set_defaults(func=cmd_refs)

    s = sub.add_parser("log", parents=common, help="show a ref's history")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument("ref", metavar="REF", type=ref_positional)
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP + "; shows which keys signed each version")
    s.set_defaults(func=cmd_log)
