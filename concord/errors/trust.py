"""Errors of trust: keys, signatures (OpenSSF Model Signing bundles) and trust policies."""

from __future__ import annotations

from concord.errors.base import ConcordError

__all__ = [
    "KeyFileError",
    "KeyPasswordError",
    "SignatureError",
    "SignatureFormatError",
    "TrustError",
    "TrustPolicyError",
    "UnsupportedKeyError",
    "UntrustedRootError",
]


class TrustError(ConcordError, ValueError):
    """Base of the errors about keys, signatures and trust."""


class KeyFileError(TrustError):
    """A key file cannot be read as the PEM key it should be."""

    def __init__(self, path: str, problem: str, fix: str = "") -> None:
        self.path = path
        self.problem = problem
        fix = fix or (
            "Give a PEM file: a private key made by `concord keys generate` or "
            "`openssl ecparam -name prime256v1 -genkey`, or its public key (`openssl ec -pubout`)"
        )
        super().__init__(f"key {path}: {problem}. {fix}.")


class UnsupportedKeyError(KeyFileError):
    """A key of a type or curve OpenSSF Model Signing does not verify (only ECDSA P-256, P-384, P-521)."""

    def __init__(self, path: str, kind: str) -> None:
        self.kind = kind
        super().__init__(
            path,
            f"a {kind} key is not supported",
            "Use an ECDSA key on P-256 (prime256v1), P-384 or P-521: `concord keys generate KEY.pem`",
        )


class KeyPasswordError(KeyFileError):
    """A password-protected private key was given without its password, or with a wrong one."""

    exit_code = 12

    def __init__(self, path: str, given: bool) -> None:
        self.given = given
        problem = "the password does not open it" if given else "it is protected by a password and none was given"
        super().__init__(
            path,
            problem,
            "Give the password in the environment variable CONCORD_KEY_PASSWORD (or --key-password-env NAME)",
        )


class SignatureFormatError(TrustError):
    """A signature document is not an OpenSSF Model Signing bundle Concord can read: not JSON,
    truncated, a field missing or of the wrong type, an envelope or statement of another kind."""

    exit_code = 13

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(
            f"signature {where}: {problem}. It is damaged or is not an OpenSSF Model Signing (v1.0) bundle; "
            "remove it and sign again (`concord sign STORE --ref REF --key KEY.pem`)"
        )


class SignatureError(TrustError):
    """A signature does not hold: made by another key, over another root or other files, or altered."""

    exit_code = 13

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        fix = fix or "Sign the snapshot again with the right key (`concord sign STORE --ref REF --key KEY.pem`)"
        super().__init__(f"signature {where}: {problem}. {fix}.")


class TrustPolicyError(TrustError):
    """A trust policy cannot be set up as written (a trusted key file missing, none given)."""

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        fix = fix or (
            "Give trusted public keys as comma-separated PEM paths or block:NAME entries "
            "(--trust PUB.pem,block:NAME,... or CONCORD_TRUSTED_KEYS)"
        )
        super().__init__(f"trust policy from {where}: {problem}. {fix}")


class UntrustedRootError(TrustError):
    """Under a trust policy, a root has no valid signature from a trusted key: refused, nothing
    written, no ref moved. ``tried`` lists the trusted key ids; ``problems`` what each signature
    found in the store said."""

    exit_code = 13

    def __init__(self, store: str, root: str, tried: tuple[str, ...], problems: tuple[str, ...] = ()) -> None:
        self.store = store
        self.root = root
        self.tried = tuple(tried)
        self.problems = tuple(problems)
        keys = ", ".join(k[:16] for k in self.tried) or "(none)"
        found = f" ({'; '.join(self.problems[:3])})" if self.problems else " (it has no signature)"
        super().__init__(
            f"root {root} in {store} is not signed by a trusted key{found}; keys tried: {keys}. "
            f"Refused: nothing written, no ref moved. Sign it with a trusted key "
            f"(`concord sign {store} --root {root} --key KEY.pem`) or trust its signer's key"
        )
