"""Errors of OCI interop: publishing a snapshot to a registry as a ModelPack artifact, and
importing one back. A message names the registry reference and what to do; it never holds a
credential."""

from __future__ import annotations

from concord.errors.base import ConcordError
from concord.errors.snapshots import UnsafePathError

__all__ = [
    "OciAuthError",
    "OciDigestMismatchError",
    "OciDocumentError",
    "OciError",
    "OciMemoContradictedError",
    "OciNotAModelError",
    "OciNotFoundError",
    "OciReferenceError",
    "OciRegistryUnreachableError",
    "OciTimeoutError",
    "OciUnsafePathError",
]


class OciError(ConcordError):
    """A registry refused or answered something Concord cannot use."""


class OciReferenceError(OciError, ValueError):
    """A registry reference that is not ``REGISTRY/REPO:TAG`` (or ``@sha256:...``)."""

    def __init__(self, text: str, problem: str) -> None:
        self.text = text
        super().__init__(
            f"registry reference {text!r}: {problem}. Write REGISTRY/REPOSITORY:TAG, "
            "e.g. registry.example.com:5000/models/minilm:v1"
        )


class OciRegistryUnreachableError(OciError, ConnectionError):
    """The registry does not answer (refused, unknown host, TLS failure, time-out)."""

    exit_code = 14

    def __init__(self, registry: str, url: str, cause: str, *, plain_http: bool) -> None:
        self.registry = registry
        hint = (
            "check the address and that the registry runs"
            if plain_http
            else "check the address and that the registry runs; a registry that speaks plain HTTP needs --plain-http"
        )
        super().__init__(f"registry {registry} does not answer at {url} ({cause}): {hint}")


class OciTimeoutError(OciRegistryUnreachableError, TimeoutError):
    """A registry answer that did not arrive within its deadline (stalled, or dripping bytes)."""

    def __init__(self, registry: str, what: str, seconds: float) -> None:
        self.registry = registry
        self.what = what
        self.seconds = seconds
        ConcordError.__init__(
            self,
            f"registry {registry}: {what} did not arrive within its {seconds:g} s deadline "
            "(the registry stalled or sends too slowly); nothing was kept from it: try again, "
            "or check the registry and the link to it",
        )


class OciDocumentError(OciError, ValueError):
    """A registry answer (manifest, index, token, error) that is not the JSON document it should be."""

    def __init__(self, reference: str, what: str, problem: str) -> None:
        self.reference = reference
        self.what = what
        self.problem = problem
        super().__init__(
            f"{reference}: the registry's {what} is not what the distribution API sends ({problem}); "
            "nothing was written. The registry is misbehaving or not a registry: check its address"
        )


class OciAuthError(OciError, PermissionError):
    """The registry wants credentials, or refused the ones given (which are never shown)."""

    def __init__(self, registry: str, reference: str, *, source: str | None, username: str | None) -> None:
        self.registry = registry
        self.reference = reference
        if source is None:
            fix = (
                f"registry {registry} asks for credentials for {reference}: set CONCORD_REGISTRY_USERNAME and "
                f"CONCORD_REGISTRY_PASSWORD, or log in (`docker login {registry}`) so ~/.docker/config.json holds them"
            )
        else:
            fix = (
                f"registry {registry} refused the credentials of user {username!r} (from {source}) for {reference}: "
                "fix the user name or password there, or check that this user may read and write this repository"
            )
        super().__init__(fix)


class OciNotFoundError(OciError, FileNotFoundError):
    """A tag, manifest or blob the registry does not hold."""

    exit_code = 10

    def __init__(self, reference: str, what: str = "manifest") -> None:
        self.reference = reference
        super().__init__(
            f"{reference}: the registry holds no such {what}; check the repository and tag "
            "(a tag is made by `concord export oci`)"
        )


class OciNotAModelError(OciError, ValueError):
    """An artifact that is not a ModelPack model (another artifactType or media type)."""

    def __init__(self, reference: str, problem: str) -> None:
        self.reference = reference
        super().__init__(
            f"{reference} is not a ModelPack model artifact: {problem}. Import only artifacts whose "
            "artifactType is application/vnd.cncf.model.manifest.v1+json with unarchived (.raw) layers"
        )


class OciDigestMismatchError(OciError, ValueError):
    """A blob whose bytes do not hash to the digest (or size) its descriptor names."""

    exit_code = 15

    def __init__(self, reference: str, what: str, expected: str, actual: str) -> None:
        self.reference = reference
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{reference}: {what} hashes to {actual}, its descriptor says {expected}; nothing was imported. "
            "The registry's copy is damaged or was replaced: push the artifact again"
        )


class OciMemoContradictedError(OciError, ValueError):
    """An export's upload whose bytes do not hash to the digest this machine's memo gave for them
    (the export drops the entry and hashes the file afresh; the registry never gets the blob)."""

    exit_code = 15

    def __init__(self, path: str, expected: str, actual: str) -> None:
        self.path = path
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{path}: its checked bytes hash to {actual}, the digest memo said {expected}; the upload was "
            "stopped before its last block and the entry dropped: export again (or with --no-memo)"
        )


class OciUnsafePathError(OciError, UnsafePathError):
    """A layer's ``org.cncf.model.filepath`` that would leave the snapshot's folder."""

    def __init__(self, reference: str, path: str, reason: str) -> None:
        self.reference = reference
        self.path = path
        self.reason = reason
        ConcordError.__init__(
            self,
            f"{reference}: refusing layer file path {path!r}: {reason}; nothing was written. "
            "A file path annotation must be relative, use '/', and stay inside the model's folder",
        )
