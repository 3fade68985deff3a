"""``concord init`` and ``concord info``: a store's configuration (compression, encryption at
rest), and what the store holds and what its encoding saves."""

from __future__ import annotations

import os

from concord.cli._common import STORE_HELP, human


def cmd_init(args, out) -> int:
    from concord.api import init_store
    from concord.stores.config import KEY_FILE_ENV

    if args.encrypt and not (args.key_file or os.environ.get(KEY_FILE_ENV)):
        raise ValueError(f"--encrypt needs the store's key: give --key-file FILE (a new FILE gets a new key) or set {KEY_FILE_ENV}")
    if args.key_file and not args.encrypt:
        raise ValueError("--key-file goes with --encrypt (or with any command on an encrypted store)")
    r = init_store(args.store, compress=args.compress, encrypt=args.encrypt, key_file=args.key_file)
    payload = {k: v for k, v in r.items() if k != "key_file"}
    enc = r["encryption"]
    lines = [
        f"{r['store']}: compress {r['compress']}, "
        + (f"encrypted ({enc['algorithm']}, key id {enc['key_id']})" if enc else "not encrypted")
    ]
    if r["key_file_created"]:
        lines.append(f"  a new key was written to {r['key_file']}: keep a copy; without it the store cannot be read")
    out.emit(payload, lines)
    return 0


def cmd_info(args, out) -> int:
    from concord.api import store_info

    u = store_info(args.store, frames=not args.no_frames, progress=out.progress)
    out.emit(u.to_dict(), info_lines(u))
    return 0


def info_lines(u) -> list[str]:
    """What ``concord info`` shows a person (``u``: a :class:`~concord.snapshots.usage.StoreUsage`)."""
    enc = u.encryption
    lines = [
        u.store,
        f"  encoding     compress {u.compress}; "
        + (f"encrypted ({enc['algorithm']}, key id {enc['key_id']})" if enc else "not encrypted"),
        f"  refs         {u.refs}" + (f" ({len(u.damaged_refs)} unreadable: {', '.join(u.damaged_refs)})" if u.damaged_refs else ""),
        f"  snapshots    {u.manifests}" + (f" ({u.unreferenced_manifests} no ref names)" if u.unreferenced_manifests else ""),
    ]
    n, o = u.named, u.orphans
    ratio = f" ({u.ratio:.3f}× of raw)" if u.ratio else ""
    if not o.count:
        raw = f" for {human(n.raw_bytes)} raw" if n.count else ""
        lines.append(f"  chunks       {n.count}, {human(n.stored_bytes)} stored{raw}{ratio}")
    else:
        lines.append(f"  chunks       {u.chunks.count}, {human(u.chunks.stored_bytes)} stored")
        lines.append(f"    named      {n.count} named by a manifest: {human(n.stored_bytes)} stored for {human(n.raw_bytes)} raw{ratio}")
        raw = f"{human(o.raw_bytes)} raw" if o.raw_bytes is not None else "raw size unknown"
        lines.append(f"    orphans    {o.count} no manifest names: {human(o.stored_bytes)} stored, {raw}")
    if u.collectable.count:
        lines.append(
            f"  collectable  {u.collectable.count} chunk(s), {human(u.collectable.stored_bytes)} stored: "
            "what garbage collection deletes once past its grace period (`concord tier gc`)"
        )
    if u.frames is not None:
        parts = [
            f"{label.replace('_', ' ')} {t.count} ({human(t.stored_bytes)})"
            for label, t in sorted(u.frames.items(), key=lambda kv: -kv[1].stored_bytes)
        ]
        lines.append("  kept as      " + (" · ".join(parts) if parts else "(no chunks)"))
    if u.missing_chunks:
        lines.append(f"  missing      {u.missing_chunks} chunk(s) a manifest names are not held: `concord verify {u.store}` names them")
    if u.damaged_manifests:
        lines.append(
            f"  damaged      {len(u.damaged_manifests)} manifest(s) do not read (their chunks count as orphans): "
            + ", ".join(r[:12] for r in u.damaged_manifests)
        )
    return lines


def register(sub, common: list) -> None:
    s = sub.add_parser(
        "init",
        parents=common,
        help="configure a new store: compression (none, zstd, auto) and encryption at rest",
    )
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument(
        "--compress",
        choices=("none", "zstd", "auto"),
        default="none",
        help="how chunks are kept: auto splits floating-point tensors into byte planes before zstd (default none)",
    )
    s.add_argument("--encrypt", action="store_true", help="encrypt chunks, manifests, refs and documents (AES-256-GCM)")
    s.set_defaults(func=cmd_init)

    s = sub.add_parser(
        "info",
        parents=common,
        help="what a store holds and what its encoding saves: refs, snapshots, chunks stored and raw, orphans",
        description=(
            "One screen about a store: its encoding (compression; encryption and key id, never the key), how many "
            "refs, snapshots and chunks it holds, the bytes its chunks take as stored beside the raw bytes they "
            "stand for (from the manifests, each chunk once), the chunks no manifest names (their raw size is "
            "unknown in a compressed or encrypted store) and what garbage collection would delete. In a compressed "
            "or encrypted store it also counts how chunks are kept (raw, zstd, byte planes) from each chunk's "
            "first two bytes: nothing is decoded or decrypted, but it is one small read per chunk (a ranged GET on "
            "S3); --no-frames leaves it out. An encrypted store needs its key (--key-file or $CONCORD_KEY_FILE)."
        ),
    )
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    s.add_argument(
        "--no-frames",
        action="store_true",
        help="do not read each chunk's first bytes to count how chunks are kept (one small read per chunk)",
    )
    s.set_defaults(func=cmd_info)
