"""A registry reference, ``REGISTRY/REPOSITORY:TAG`` or ``REGISTRY/REPOSITORY@sha256:HEX``,
parsed once into a :class:`Reference` that everything downstream takes.

The registry part is required (Concord never guesses Docker Hub): a host name with a dot or a
port, or ``localhost``. Repository components follow the distribution specification's grammar
(lowercase letters, digits, ``.``, ``_``, ``__``, ``-`` separated), tags its tag grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from concord.errors.oci import OciReferenceError

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?|\[[0-9a-fA-F:]+\](?::[0-9]{1,5})?"
)


@dataclass(frozen=True)
class Reference:
    """``registry`` (host[:port]), ``repository`` (``models/minilm``), and a ``tag`` or a ``digest``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def target(self) -> str:
        """What the manifest endpoint is asked for: the digest if given, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        where = f"{self.registry}/{self.repository}"
        return f"{where}@{self.digest}" if self.digest else f"{where}:{self.tag}"


def parse_reference(text: str) -> Reference:
    """Parse ``REGISTRY/REPOSITORY:TAG`` (or ``@sha256:…``); :class:`OciReferenceError` otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise OciReferenceError(str(text), "it is empty")
    s = text.strip()
    if "://" in s:
        raise OciReferenceError(text, "leave the scheme out (HTTPS is the default; --plain-http asks for HTTP)")
    registry, slash, rest = s.partition("/")
    if not slash or not rest:
        raise OciReferenceError(text, "it names no repository after the registry")
    if not ("." in registry or ":" in registry or registry == "localhost") or not _HOST.fullmatch(registry):
        raise OciReferenceError(text, f"{registry!r} is not a registry host (give host:port or a domain name)")
    digest = tag = None
    if "@" in rest:
        rest, _, digest = rest.partition("@")
        if not _DIGEST.fullmatch(digest):
            raise OciReferenceError(text, "a digest is sha256: and 64 lowercase hex digits")
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, _, tag = rest.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise OciReferenceError(text, f"tag {tag!r} must be letters, digits, '.', '_' or '-' (at most 128)")
    if digest is None and tag is None:
        raise OciReferenceError(text, "it has no tag; add one (:v1) so the artifact can be found again")
    for component in rest.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise OciReferenceError(
                text, f"repository part {component!r} must be lowercase letters and digits, separated by '.', '_' or '-'"
            )
    return Reference(registry, rest, tag, digest)
