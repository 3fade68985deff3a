"""``concord init``: a store's configuration (compression, encryption at rest)."""

from __future__ import annotations

import os

from concord.cli._common import STORE_HELP, writable_store


def cmd_init(args, out) -> int:
    from concord.stores.cipher import new_key, read_key_file, write_key_file
    from concord.stores.config import KEY_FILE_ENV, configure

    key = None
    created_key = False
    if args.encrypt:
        path = args.key_file or os.environ.get(KEY_FILE_ENV)
        if not path:
            raise ValueError(f"--encrypt needs the store's key: give --key-file FILE (a new FILE gets a new key) or set {KEY_FILE_ENV}")
        if os.path.exists(path):
            key = read_key_file(path)
        else:
            key = new_key()
            created_key = True
    elif args.key_file:
        raise ValueError("--key-file goes with --encrypt (or with any command on an encrypted store)")
    store = writable_store(args.store)
    try:
        config = configure(store, compress=args.compress, encrypt=args.encrypt, key=key)
    finally:
        store.close()
    if created_key:  # only once the store took it: a refused init leaves no key file behind
        write_key_file(path, key)
    payload = {"store": store.uri, **config.describe(), "key_file_created": created_key}
    enc = config.describe()["encryption"]
    lines = [
        f"{store.uri}: compress {config.compress}, "
        + (f"encrypted ({enc['algorithm']}, key id {enc['key_id']})" if enc else "not encrypted")
    ]
    if created_key:
        lines.append(f"  a new key was written to {path}: keep a copy; without it the store cannot be read")
    out.emit(payload, lines)
    return 0


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
