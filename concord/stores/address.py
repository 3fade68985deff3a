"""A store address, parsed once.

What a person types to name a store — a folder (``data/stores/us-east``), ``file:///path``,
``s3://bucket/prefix`` or ``scheme:REST`` for a scheme an entry point provides (``block:NAME``) —
is parsed here, and only here, into a :class:`StoreAddress`. Everything downstream takes that
value: it says what kind of store the text names, tells two spellings of one store apart
(:attr:`StoreAddress.identity`), shows it (:attr:`StoreAddress.label`) and opens it
(:meth:`StoreAddress.open`). A text that names no store raises
:class:`~concord.errors.InvalidStoreURIError` saying why; nothing is opened or created to parse.

Schemes other than ``file`` and ``s3`` come from the ``concord.store_schemes`` entry point (the
``blocks`` package registers ``block``) or :func:`register_scheme`, so the core never imports
Prefect.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlparse

from concord.errors import InvalidStoreURIError
from concord.plugins import Plugins, split_prefix
from concord.redact import redact

if TYPE_CHECKING:
    from concord.stores.base import Store

#: the kinds of store an address names
FOLDER, S3, SCHEME = "folder", "s3", "scheme"
#: the entry-point group of ``scheme:`` prefixes
SCHEME_GROUP = "concord.store_schemes"

_EMPTY = "empty store address: give a folder, file:///path, s3://bucket/prefix or block:NAME"
_SCHEMES = Plugins(SCHEME_GROUP)


def register_scheme(scheme: str, factory: Callable[[str], Store]) -> None:
    """Teach store addresses a new ``scheme:`` prefix; ``factory`` gets the text after it."""
    _SCHEMES.register(scheme, factory)


@dataclass(frozen=True)
class StoreAddress:
    """A store address, checked: build it with :meth:`parse`.

    ``kind`` is :data:`FOLDER` (``path``: a folder as typed, or the unquoted path of a
    ``file://`` URI), :data:`S3` (``bucket`` and ``prefix``, without surrounding '/') or
    :data:`SCHEME` (``scheme`` and ``rest``: ``block`` and ``NAME``). An S3 address may end in
    ``?connections=N`` (how many transfers the store runs at once, 1 to 1024; default 16): it is
    ``connections``, and no part of the store's identity. ``scheme`` is ``""`` for a
    folder typed as a path, ``"file"`` or ``"s3"`` for those URIs; ``rest`` is what follows
    ``scheme:`` (the whole text for a folder typed as a path).
    """

    text: str
    kind: str
    scheme: str = ""
    rest: str = ""
    path: str | None = None
    bucket: str | None = None
    prefix: str = ""
    #: transfers at once, from ``?connections=N`` (S3 only); None: the store's default
    connections: int | None = None

    @classmethod
    def parse(cls, spec: str | os.PathLike | StoreAddress, *, check: bool = True) -> StoreAddress:
        """The address ``spec`` names (a :class:`StoreAddress` is returned as it is; an
        ``os.PathLike`` is a folder), or :class:`~concord.errors.InvalidStoreURIError`.

        With ``check=False`` only the form is read (which kind, which parts): S3's bucket and
        prefix rules and whether a scheme is installed are left to :meth:`open`, which applies them
        (a tier policy is judged by the kinds of its stores before any is opened)."""
        if isinstance(spec, StoreAddress):
            return spec
        if isinstance(spec, os.PathLike):
            path = os.fspath(spec)
            return cls(text=path, kind=FOLDER, rest=path, path=path)
        if not isinstance(spec, str) or not spec.strip():
            raise InvalidStoreURIError(str(spec), _EMPTY)
        text = spec.strip()
        if text.startswith("s3://"):
            return cls._s3(text, check)
        if text.startswith("file://"):
            parsed = urlparse(text)
            if parsed.netloc not in ("", "localhost"):
                raise InvalidStoreURIError(text, "file:// URIs must name a local path (file:///path)")
            return cls(text=text, kind=FOLDER, scheme="file", rest=text[len("file:"):], path=unquote(parsed.path))
        split = split_prefix(text)
        if split is None:
            return cls(text=text, kind=FOLDER, rest=text, path=text)
        scheme, rest = split
        if check and not _SCHEMES.has(scheme):
            raise InvalidStoreURIError(text, f"unknown scheme {scheme!r} (folder, file://, s3:// or block:)")
        if not rest:
            raise InvalidStoreURIError(text, f"nothing after '{scheme}:'")
        return cls(text=text, kind=SCHEME, scheme=scheme, rest=rest)

    @classmethod
    def _s3(cls, text: str, check: bool) -> StoreAddress:
        """``s3://bucket/some/prefix``, with (``check``) the rules :class:`S3ObjectStore` applies on open."""
        from concord.stores.s3 import validate_bucket_name, validate_prefix

        parsed = urlparse(text)
        bucket = parsed.netloc
        prefix = parsed.path.strip("/")
        if not bucket:
            raise InvalidStoreURIError(text, "no bucket name after s3://", part="address")
        if parsed.fragment:
            raise InvalidStoreURIError(text, "fragments are not allowed", part="address")
        connections = _connections(text, parsed.query)
        if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
            raise InvalidStoreURIError(text, "the prefix has an empty, '.' or '..' segment", part="address")
        if check:
            validate_prefix(validate_bucket_name(bucket), prefix)
        rest = text[len("s3:"):].split("?", 1)[0]
        return cls(text=text, kind=S3, scheme="s3", rest=rest, bucket=bucket, prefix=prefix, connections=connections)

    # ------------------------------------------------------------------ what it names

    @property
    def identity(self) -> str:
        """What tells two addresses of one store apart: a folder's real absolute path (so
        ``data/stores/x``, ``data/stores/x/`` and ``file:///abs/data/stores/x`` are one store),
        ``s3://bucket/prefix`` without a trailing '/', or ``scheme:rest``. Nothing is opened;
        a relative folder is resolved against the working folder of the moment."""
        if self.kind == FOLDER:
            return os.path.realpath(self.path)
        if self.kind == S3:
            return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        return f"{self.scheme}:{self.rest}"

    @property
    def label(self) -> str:
        """The address as it may be shown: as written, with any credential in it hidden."""
        return redact(self.text)

    @property
    def name(self) -> str:
        """The store's short name, as a report calls a cluster: a folder's or prefix's last part
        (the bucket for a whole bucket); a scheme address's text after its last '/', else all of it."""
        if self.kind == FOLDER:
            return self.path.rstrip("/").rsplit("/", 1)[-1] or self.path
        if self.kind == S3:
            return self.prefix.rsplit("/", 1)[-1] if self.prefix else self.bucket
        return self.text.rstrip("/").rsplit("/", 1)[-1] or self.text

    def __str__(self) -> str:
        return self.text

    # ------------------------------------------------------------------ opening

    def open(self, *, create: bool = True, must_exist: bool = False) -> Store:
        """The store this address names.

        A folder is created unless ``create`` is False. With ``must_exist`` (every command that
        only reads) nothing is ever created, and a folder that holds no store, or is not there,
        raises :class:`~concord.errors.StoreNotFoundError` at once instead of reading as an empty
        store; an S3 bucket that does not exist says so on first use.
        """
        if self.kind == S3:
            from concord.stores.s3 import S3ObjectStore

            return S3ObjectStore(self.bucket, self.prefix, connections=self.connections)
        if self.kind == FOLDER:
            from concord.stores.local import LocalDirStore

            return LocalDirStore(self.path, create=create and not must_exist, must_exist=must_exist)
        factory = _SCHEMES.get(self.scheme)
        if factory is None:
            raise InvalidStoreURIError(self.text, f"unknown scheme {self.scheme!r} (folder, file://, s3:// or block:)")
        return factory(self.rest)


def _connections(text: str, query: str) -> int | None:
    """The ``connections`` of an S3 address's query string (None if it has none); any other
    option, a repeated one or a value out of range is refused, saying which."""
    if not query:
        return None
    from concord.stores.s3 import DEFAULT_CONNECTIONS, MAX_CONNECTIONS

    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"connections"})
    if unknown or "connections" not in options:
        raise InvalidStoreURIError(text, f"unknown option {(unknown or [query])[0]!r}: the one option is ?connections=N", part="address")
    values = options["connections"]
    value = values[0].strip()
    if len(values) != 1 or not value.isdigit() or not 1 <= int(value) <= MAX_CONNECTIONS:
        raise InvalidStoreURIError(
            text, f"connections must be one whole number from 1 to {MAX_CONNECTIONS} (default {DEFAULT_CONNECTIONS})", part="address"
        )
    return int(value)


def short_names(specs: Sequence[str]) -> list[str]:
    """A name per store address, as a report calls a cluster: its short name
    (``data/stores/us-east`` → ``us-east``, ``s3://bucket/eu-central`` → ``eu-central``) when those
    are unique among ``specs``, else the addresses themselves (any credential in them hidden)."""
    shown = []
    for spec in specs:
        try:
            address = StoreAddress.parse(spec, check=False)
        except InvalidStoreURIError:  # a recorded holder that names no store is still named
            shown.append((redact(spec), redact(spec)))
        else:
            shown.append((address.name, address.label))
    names = [name for name, _ in shown]
    return names if len(set(names)) == len(names) else [label for _, label in shown]


__all__ = ["FOLDER", "S3", "SCHEME", "SCHEME_GROUP", "StoreAddress", "register_scheme", "short_names"]
