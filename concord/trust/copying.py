"""Whether a signature document may be written over another store's: the check a sync (and every
tier command, which syncs) makes before a bundle travels with its root.

A signature document ``signatures/<root>/<key id>.sig`` is copied only when it **holds for this
root by the key it is named by**, whoever trusts that key: it parses as an OMS bundle; its key
hint is the key id in its name; its signature verifies with the key of that id; it binds this
root (a Concord bundle names it; a root-less ``model_signing`` bundle lists exactly the root's
files, and, when it would replace a document the target holds, has the SHA-256 digests of the
root's files, recomputed from the source's bytes).

The bundle does not carry its public key, only the key's id (the SHA-256 of its PEM), and a sync
has no trust list to look it up in (which keys to trust is the trust policy's decision, made by
:meth:`~concord.trust.policy.TrustPolicy.decide` wherever a root is used). So the key is
recovered from the signature itself: ECDSA public-key recovery gives at most four points per
curve; the one whose PEM hashes to the bundle's key id is the key, and ``cryptography`` then
verifies the signature with it. A bundle altered anywhere, truncated, or signed by another key
than the one it names is refused: nothing is written, and the target keeps what it held.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from concord.errors import ConcordError
from concord.snapshots.manifest import Manifest
from concord.stores.base import Store
from concord.trust import bundle as oms
from concord.trust.keys import CURVES, PublicKey, key_id_of
from concord.trust.signing import PREFIX, SUFFIX, check_names, compare_digests, file_digests


@dataclass(frozen=True)
class _Curve:
    name: str
    p: int
    a: int
    n: int
    gx: int
    gy: int

    @property
    def b(self) -> int:
        return (self.gy * self.gy - self.gx**3 - self.a * self.gx) % self.p


def _curve(name: str, p: int, n: int) -> _Curve:
    """The NIST curve ``name`` (a = -3): its generator as ``cryptography`` derives it (the public
    key of the private key 1), so only the field prime and the group order are written here."""
    from cryptography.hazmat.primitives.asymmetric import ec

    g = ec.derive_private_key(1, getattr(ec, name.upper())()).public_key().public_numbers()
    return _Curve(name, p, p - 3, n, g.x, g.y)


_CURVES: list[_Curve] = []


def _curves() -> list[_Curve]:
    if not _CURVES:
        _CURVES.extend(
            [
                _curve(
                    "secp256r1",
                    2**256 - 2**224 + 2**192 + 2**96 - 1,
                    0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
                ),
                _curve(
                    "secp384r1",
                    2**384 - 2**128 - 2**96 + 2**32 - 1,
                    0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973,
                ),
                _curve(
                    "secp521r1",
                    2**521 - 1,
                    int("1" + "F" * 65 + "A51868783BF2F966B7FCC0148F709A5D03BB5C9B8899C47AEBB6FB71E91386409", 16),
                ),
            ]
        )
    return _CURVES


def _add(c: _Curve, P, Q):
    """P + Q in affine coordinates (None is the point at infinity)."""
    if P is None:
        return Q
    if Q is None:
        return P
    (x1, y1), (x2, y2) = P, Q
    if x1 == x2:
        if (y1 + y2) % c.p == 0:
            return None
        m = (3 * x1 * x1 + c.a) * pow(2 * y1, -1, c.p) % c.p
    else:
        m = (y2 - y1) * pow(x2 - x1, -1, c.p) % c.p
    x3 = (m * m - x1 - x2) % c.p
    return x3, (m * (x1 - x3) - y1) % c.p


def _mul(c: _Curve, k: int, P):
    out = None
    while k:
        if k & 1:
            out = _add(c, out, P)
        P = _add(c, P, P)
        k >>= 1
    return out


def recover_key(signature: bytes, message: bytes, key_id: str) -> PublicKey | None:
    """The P-256/P-384/P-521 public key whose id is ``key_id`` and whose ECDSA ``signature`` (DER)
    over ``message`` verifies, or None if there is none (another key signed, or the bytes were
    altered)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    try:
        r, s = decode_dss_signature(signature)
    except ValueError:
        return None
    for c in _curves():
        if not (0 < r < c.n and 0 < s < c.n):
            continue
        e = int.from_bytes(hashlib.new(CURVES[c.name], message).digest(), "big")
        e >>= max(0, 8 * len(hashlib.new(CURVES[c.name]).digest()) - c.n.bit_length())
        r_inv = pow(r, -1, c.n)
        G = (c.gx, c.gy)
        for x in (r, r + c.n):
            if x >= c.p:
                continue
            alpha = (pow(x, 3, c.p) + c.a * x + c.b) % c.p
            y = pow(alpha, (c.p + 1) // 4, c.p)  # each of these primes is 3 mod 4
            if y * y % c.p != alpha:
                continue
            for yy in (y, c.p - y):
                Q = _add(c, _mul(c, s * r_inv % c.n, (x, yy)), _mul(c, (-e * r_inv) % c.n, G))
                if Q is None:
                    continue
                try:
                    public = ec.EllipticCurvePublicNumbers(Q[0], Q[1], getattr(ec, c.name.upper())()).public_key()
                except ValueError:
                    continue
                if key_id_of(public) == key_id:
                    key = PublicKey.of(public, f"key id {key_id[:16]}")
                    return key if key.verify(signature, message) else None
    return None


def signature_problem(store: Store, root: str, key: str, data: bytes, manifest: Manifest, replacing: bool) -> str | None:
    """Why the signature document ``data``, to be kept under ``key`` (``signatures/<root>/<key
    id>.sig``) next to ``root`` of ``manifest`` in a store whose bytes ``store`` holds, must not be
    written, or None when it holds for this root by the key it is named by (see the module).
    With ``replacing`` (a document is there already), a root-less bundle's digests are compared
    with the root's files too, read from ``store``. The shape :func:`concord.snapshots.sync.replicate`
    takes as ``check_signature``."""
    where = f"{store.uri}/{key}"
    name = key.rsplit("/", 1)[-1]
    key_id = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else ""
    if key != f"{PREFIX}/{root}/{key_id}{SUFFIX}" or len(key_id) != 64:
        return "it is not named signatures/<root>/<key id>.sig"
    try:
        parsed = oms.parse_bundle(data, where)
        if parsed.key_hint != key_id:
            return f"it names key {parsed.key_hint[:16] or '(none)'}, not the key {key_id[:16]} it is kept under"
        if recover_key(parsed.signature, parsed.signed_message, key_id) is None:
            return f"its signature does not verify with key {key_id[:16]} (the bundle was altered or made by another key)"
        st = parsed.statement
        if st.root is not None and st.root != root:
            return f"it signs root {st.root[:12]}, not {root[:12]}"
        check_names(((f.path, f.size) for f in manifest.files), st, where)
        if st.root is None and replacing:
            paths = {st.serialization.path_of(n) for n in st.resources}
            compare_digests(st.resources, file_digests(store, manifest, paths, serialization=st.serialization), where)
    except ConcordError as exc:
        return str(exc)[:300]
    return None


__all__ = ["recover_key", "signature_problem"]
