"""Errors of a store's configuration: its format, how it compresses and how it encrypts."""

from __future__ import annotations

from concord.errors.base import ConcordError
from concord.errors.stores import StoreError

__all__ = [
    "FrameError",
    "SealError",
    "StoreConfigError",
    "StoreKeyError",
    "StoreKeyFileError",
    "UnknownEncodingError",
]


class StoreConfigError(StoreError, ValueError):
    """A store's ``config`` object cannot be used: written by a newer Concord, damaged, or an
    ``init`` that would change a store already configured."""

    def __init__(self, store: str, problem: str, fix: str = "") -> None:
        self.store = store
        self.problem = problem
        super().__init__(f"store {store}: {problem}. {fix}".rstrip())


class StoreKeyError(StoreError, PermissionError):
    """An encrypted store was opened with no key, or with a key that is not its own."""

    exit_code = 12

    def __init__(self, store: str, problem: str, fix: str = "") -> None:
        self.store = store
        self.problem = problem
        fix = fix or "Give its key file with --key-file FILE or CONCORD_KEY_FILE"
        super().__init__(f"store {store} is encrypted: {problem}. {fix} (nothing was read or written).")

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownEncodingError(StoreError, ValueError):
    """A stored object starts with an encoding byte this Concord does not know, or its encoded
    bytes do not decode (a corrupt compressed or encrypted chunk)."""

    exit_code = 15

    def __init__(self, store: str, what: str, problem: str) -> None:
        self.store = store
        self.what = what
        self.problem = problem
        super().__init__(
            f"{what} in {store}: {problem}. Upgrade Concord if a newer one wrote it, else repair it with "
            "`concord verify STORE --repair-from OTHER_STORE`."
        )


class StoreKeyFileError(ConcordError, ValueError):
    """A store key file cannot be read, or does not hold a store key (32 bytes, raw or as hex);
    ``problem`` names the file and says which."""

    exit_code = 12

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(
            f"{problem}: a store key is 32 random bytes, raw or as 64 hex characters "
            "(`concord init STORE --encrypt --key-file NEW_FILE` writes one)"
        )


class FrameError(ConcordError, ValueError):
    """Encoded (compressed) bytes that do not decode; the store turns it into an
    :class:`UnknownEncodingError` naming the chunk."""

    exit_code = 15


class SealError(ConcordError, ValueError):
    """A sealed object that does not open: damaged, moved, or sealed under another key; the store
    turns it into an :class:`UnknownEncodingError` naming the object."""

    exit_code = 15
