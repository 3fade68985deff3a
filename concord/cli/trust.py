"""``concord sign|signatures|keys generate``: who released a root.

``sign`` signs the root a ref points at with an ECDSA key, as an OpenSSF Model Signing bundle
kept in the store (``signatures/<root>/<key id>.sig``) and, with ``--out``, written to a file that
``model_signing verify key`` accepts for a folder restored from the snapshot. ``signatures``
lists a root's signatures (and, with ``--trust``, which hold). ``keys generate`` makes a key pair.
"""

from __future__ import annotations

import os

from concord.cli._common import STORE_HELP, TRUST_HELP, readable_store, ref_arg, root_arg, writable_store


def key_password(args) -> str | None:
    """The private key's password, from the environment variable the command names."""
    name = getattr(args, "key_password_env", None) or "CONCORD_KEY_PASSWORD"
    return os.environ.get(name) or None


def cmd_sign(args, out) -> int:
    from concord.api import sign
    from concord.trust import load_signing_key_spec

    key = load_signing_key_spec(args.key, key_password(args))  # a bad key fails before the store is read
    store = writable_store(args.store)
    r = sign(store, key, ref=args.ref, root=args.root, name=args.name, out=args.out, progress=out.progress)
    root = r.root
    d = r.to_dict()
    d["store"] = store.uri
    if args.out:
        d["out"] = os.path.abspath(args.out)
    lines = [
        f"signed {root}",
        f"  key {r.key_id[:16]} ({args.key}); {r.files} file(s), SHA-256 over {r.bytes} bytes",
        f"  kept as {store.uri}/{r.document}",
    ]
    if args.out:
        lines.append(f"  bundle written to {d['out']} (model_signing verify key DIR --signature {args.out} --public_key PUB.pem)")
    out.emit(d, lines)
    return 0


def cmd_signatures(args, out) -> int:
    import sys

    from concord.api import signatures
    from concord.errors import UntrustedRootError
    from concord.snapshots.refs import resolve_root
    from concord.trust import load_policy, signature_ids

    policy = load_policy(args.trust)  # an empty list fails before the store is read
    store = readable_store(args.store)
    root = resolve_root(store, args.ref or args.root)
    d: dict = {"store": store.uri, "root": root}
    if policy is None:  # nothing can be verified without keys: no key is named as a signer
        ids = signature_ids(store, root)
        d.update(signed_by=None, unchecked=ids)
        lines = [f"{root}: {len(ids)} signature document(s), none checked (give --trust PUB.pem to check them)"]
        lines += [f"  unchecked signature claiming key id {k}" for k in ids]
        out.emit(d, lines)
        return 0
    v = signatures(store, root=root, trust=policy)
    d.update(
        signed_by=list(v.signed_by), trusted=v.trusted, trusted_by=v.trusted_by, problems=dict(v.problems),
        quorum=v.quorum, threshold=policy.threshold, names={k: policy.name_of(k) for k in v.signed_by},
    )
    lines = [f"{root}: signed by {v.quorum}; {len(v.documents)} signature document(s)"]
    lines += [f"  {line}" for line in v.lines(policy.name_of)]
    lines.append(f"  trusted: {'yes' if v.trusted else 'no'}")
    out.emit(d, lines)
    if not v.trusted:
        print(f"concord: error: root {root} in {store.uri} is not trusted ({v.why()}); keys tried: "
              f"{', '.join(k[:16] for k in policy.key_ids)}", file=sys.stderr)
        return UntrustedRootError.exit_code
    return 0


def cmd_keys_generate(args, out) -> int:
    from concord.api import generate_signing_key

    password = os.environ.get(args.password_env) if args.password_env else None
    if args.password_env and not password:
        raise ValueError(f"--password-env {args.password_env}: that environment variable is empty or unset; set it to the password")
    key = generate_signing_key(args.path, password=password, public=args.public)
    d = {"private": os.path.abspath(args.path), "public": os.path.abspath(key.public.source), "key_id": key.id, "encrypted": bool(password)}
    out.emit(d, [f"key {key.id}", f"  private {d['private']} (keep it secret)", f"  public  {d['public']} (give it to --trust)"])
    return 0


def register(sub, common: list) -> None:
    s = sub.add_parser("sign", parents=common, help="sign a snapshot (OpenSSF Model Signing bundle, kept in the store)")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--ref", type=ref_arg, help="sign the root this ref points at")
    g.add_argument("--root", type=root_arg)
    s.add_argument(
        "--key", required=True, metavar="KEY.pem|block:NAME",
        help="ECDSA private key (P-256, P-384 or P-521), PEM; or block:NAME, the signing key of a saved Concord Trust block",
    )
    s.add_argument(
        "--key-password-env", metavar="NAME", help="environment variable holding the key's password (default: CONCORD_KEY_PASSWORD; a block holds its own)"
    )
    s.add_argument("--out", metavar="FILE", help="also write the bundle to FILE (for model_signing verify)")
    s.add_argument("--name", help="model name in the signed statement (default: the ref's name)")
    s.set_defaults(func=cmd_sign)

    s = sub.add_parser("signatures", parents=common, help="list a snapshot's signatures (and, with --trust, which verify; exit 1 when untrusted)")
    s.add_argument("store", metavar="STORE", help=STORE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--ref", type=ref_arg)
    g.add_argument("--root", type=root_arg)
    s.add_argument("--trust", metavar="PUB.pem|block:NAME[,...]", help=TRUST_HELP)
    s.set_defaults(func=cmd_signatures)

    s = sub.add_parser("keys", parents=common, help="signing keys")
    ks = s.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = ks.add_parser("generate", parents=common, help="write a new ECDSA P-256 key pair (KEY.pem and KEY.pub.pem)")
    g.add_argument("path", metavar="KEY.pem", help="private key file to create (never overwritten)")
    g.add_argument("--public", metavar="PUB.pem", help="public key file (default: KEY.pub.pem)")
    g.add_argument("--password-env", metavar="NAME", help="encrypt the private key with the password in this environment variable")
    g.set_defaults(func=cmd_keys_generate)
