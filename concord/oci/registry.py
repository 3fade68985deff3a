"""A small client of the OCI distribution API: what export and import need, and nothing else.

Blobs: ``HEAD`` (is it there?), upload (``POST`` a session, then one streamed ``PUT`` with the
digest) and streamed ``GET``. Manifests: ``PUT`` and ``GET`` by tag or digest. Referrers: the
referrers API, or the tag schema fallback (``sha256-<hex>``) that registries without it (CNCF
distribution 2.8) are given by their clients.

Authentication answers the registry's challenge: HTTP Basic, or a Bearer token fetched from the
realm it names (with Basic credentials if any). Credentials come from
``CONCORD_REGISTRY_USERNAME``/``CONCORD_REGISTRY_PASSWORD``, else from the Docker config file
(``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``, its ``auths``); they are never
logged, shown in an error, or returned. HTTPS unless ``plain_http`` is asked for.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator
from urllib.parse import urlencode, urljoin

from concord.errors.oci import (
    OciAuthError,
    OciError,
    OciNotFoundError,
    OciRegistryUnreachableError,
)
from concord.oci.reference import Reference

USERNAME_ENV = "CONCORD_REGISTRY_USERNAME"
PASSWORD_ENV = "CONCORD_REGISTRY_PASSWORD"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
#: bytes per read when a blob is downloaded
READ_SIZE = 1024 * 1024
TIMEOUT = (10, 300)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str  # where they came from, shown in an error (never the values)


def _docker_config_path() -> str:
    folder = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(folder, "config.json")


def find_credentials(registry: str) -> Credentials | None:
    """The credentials for ``registry``: the environment first, then the Docker config's ``auths``."""
    user, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if user and password is not None:
        return Credentials(user, password, f"${USERNAME_ENV}/${PASSWORD_ENV}")
    path = _docker_config_path()
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        return None
    for key, entry in auths.items():
        host = re.sub(r"^https?://", "", str(key)).split("/", 1)[0]
        if host != registry or not isinstance(entry, dict):
            continue
        if entry.get("username") and entry.get("password") is not None:
            return Credentials(str(entry["username"]), str(entry["password"]), path)
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            if sep:
                return Credentials(user, password, path)
    return None


class _Body:
    """A request body streamed from an iterable of byte blocks, with a known length (so the
    request carries ``Content-Length`` rather than chunked encoding)."""

    def __init__(self, blocks: Iterable[bytes], length: int) -> None:
        self._blocks = blocks
        self.len = length

    def __len__(self) -> int:
        return self.len

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._blocks)


class Registry:
    """One repository's connection to a registry (a ``requests`` session), authenticated on demand."""

    def __init__(self, ref: Reference, *, plain_http: bool = False) -> None:
        import requests

        self.ref = ref
        self.plain_http = plain_http
        self.base = f"{'http' if plain_http else 'https'}://{ref.registry}"
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "concord-oci"
        self.credentials = find_credentials(ref.registry)
        self._auth_header: str | None = None

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ requests and auth

    def _url(self, path: str) -> str:
        return f"{self.base}/v2/{self.ref.repository}/{path}"

    def request(self, method: str, url: str, *, body: Callable[[], object] | None = None, headers=None, stream=False):
        """Send a request, answering one authentication challenge; ``body`` makes a fresh body
        for each attempt (a streamed body is read once)."""
        import requests

        for attempt in range(2):
            h = dict(headers or {})
            if self._auth_header:
                h["Authorization"] = self._auth_header
            try:
                r = self.session.request(
                    method, url, data=body() if body else None, headers=h, stream=stream, timeout=TIMEOUT, allow_redirects=True
                )
            except requests.exceptions.SSLError as exc:
                raise OciRegistryUnreachableError(self.ref.registry, self.base, f"TLS failed: {type(exc).__name__}", plain_http=self.plain_http) from None
            except requests.exceptions.RequestException as exc:
                raise OciRegistryUnreachableError(self.ref.registry, self.base, _cause(exc), plain_http=self.plain_http) from None
            if r.status_code != 401:
                return r
            challenge = r.headers.get("WWW-Authenticate", "")
            r.close()
            if attempt or not self._answer(challenge):
                raise OciAuthError(
                    self.ref.registry,
                    str(self.ref),
                    source=self.credentials.source if self.credentials else None,
                    username=self.credentials.username if self.credentials else None,
                )
        raise AssertionError("unreachable")  # pragma: no cover

    def _answer(self, challenge: str) -> bool:
        """Set the Authorization header for a ``WWW-Authenticate`` challenge; False when no answer."""
        scheme, _, params = challenge.partition(" ")
        scheme = scheme.lower()
        c = self.credentials
        if scheme == "basic":
            if c is None:
                return False
            token = base64.b64encode(f"{c.username}:{c.password}".encode()).decode()
            self._auth_header = f"Basic {token}"
            return True
        if scheme == "bearer":
            import requests

            fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
            realm = fields.get("realm")
            if not realm:
                return False
            query = {k: fields[k] for k in ("service", "scope") if k in fields}
            query.setdefault("scope", f"repository:{self.ref.repository}:pull,push")
            auth = (c.username, c.password) if c else None
            try:
                r = self.session.get(f"{realm}?{urlencode(query)}", auth=auth, timeout=TIMEOUT)
            except requests.exceptions.RequestException as exc:
                raise OciRegistryUnreachableError(self.ref.registry, realm, _cause(exc), plain_http=self.plain_http) from None
            if r.status_code != 200:
                return False
            doc = r.json()
            token = doc.get("token") or doc.get("access_token")
            if not token:
                return False
            self._auth_header = f"Bearer {token}"
            return True
        return False

    def _fail(self, r, what: str) -> OciError:
        detail = ""
        try:
            errors = r.json().get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
        except ValueError:
            pass
        return OciError(f"{self.ref}: the registry refused to {what} (HTTP {r.status_code}{': ' + detail if detail else ''})")

    # ------------------------------------------------------------------ blobs

    def has_blob(self, digest: str) -> bool:
        r = self.request("HEAD", self._url(f"blobs/{digest}"))
        if r.status_code == 200:
            return True
        if r.status_code == 404:
            return False
        raise self._fail(r, f"say whether it holds blob {digest}")

    def put_blob(self, digest: str, size: int, blocks: Callable[[], Iterable[bytes]]) -> None:
        """Upload one blob: a session, then one ``PUT`` streaming ``blocks()`` with its digest."""
        r = self.request("POST", self._url("blobs/uploads/"), headers={"Content-Length": "0"})
        if r.status_code not in (201, 202) or not r.headers.get("Location"):
            raise self._fail(r, "start a blob upload")
        location = urljoin(self.base + "/", r.headers["Location"])
        url = location + ("&" if "?" in location else "?") + urlencode({"digest": digest})
        r = self.request(
            "PUT", url, body=lambda: _Body(blocks(), size), headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        )
        if r.status_code not in (201, 204):
            raise self._fail(r, f"take blob {digest}")

    def get_blob(self, digest: str):
        """An open streamed response for a blob (``iter_content``); the caller closes it."""
        r = self.request("GET", self._url(f"blobs/{digest}"), stream=True)
        if r.status_code == 404:
            r.close()
            raise OciNotFoundError(f"{self.ref.registry}/{self.ref.repository}@{digest}", "blob")
        if r.status_code != 200:
            r.close()
            raise self._fail(r, f"send blob {digest}")
        return r

    def read_blob(self, digest: str, limit: int) -> bytes:
        """A small blob (a config, a signature) read whole, refused above ``limit`` bytes."""
        r = self.get_blob(digest)
        try:
            data = bytearray()
            for block in r.iter_content(READ_SIZE):
                data += block
                if len(data) > limit:
                    raise OciError(f"{self.ref}: blob {digest} is larger than {limit} bytes, too large for what it should be")
            return bytes(data)
        finally:
            r.close()

    # ------------------------------------------------------------------ manifests

    def put_manifest(self, data: bytes, target: str, media_type: str = MANIFEST_TYPE) -> str:
        """Store a manifest under a tag or its digest; the digest the registry answered with."""
        r = self.request("PUT", self._url(f"manifests/{target}"), body=lambda: data, headers={"Content-Type": media_type})
        if r.status_code not in (200, 201):
            raise self._fail(r, f"take manifest {target}")
        return r.headers.get("Docker-Content-Digest", "")

    def get_manifest(self, target: str, accept: Iterable[str] = (MANIFEST_TYPE,), limit: int = 4 * 1024 * 1024) -> tuple[bytes, str]:
        """The bytes and media type of the manifest at a tag or digest."""
        r = self.request("GET", self._url(f"manifests/{target}"), headers={"Accept": ", ".join(accept)}, stream=True)
        try:
            if r.status_code == 404:
                raise OciNotFoundError(f"{self.ref.registry}/{self.ref.repository}{'@' if ':' in target else ':'}{target}")
            if r.status_code != 200:
                raise self._fail(r, f"send manifest {target}")
            data = bytearray()
            for block in r.iter_content(READ_SIZE):
                data += block
                if len(data) > limit:
                    raise OciError(f"{self.ref}: manifest {target} is larger than {limit} bytes")
            return bytes(data), r.headers.get("Content-Type", "").split(";")[0].strip()
        finally:
            r.close()

    def referrers(self, digest: str) -> list[dict]:
        """Descriptors of the manifests whose ``subject`` is ``digest``: the referrers API, or the
        ``sha256-<hex>`` tag of the referrers tag schema when the registry has no such API."""
        r = self.request("GET", self._url(f"referrers/{digest}"), headers={"Accept": INDEX_TYPE})
        if r.status_code == 200 and r.headers.get("Content-Type", "").startswith(INDEX_TYPE):
            return list(r.json().get("manifests") or [])
        try:
            data, _ = self.get_manifest(fallback_tag(digest), accept=(INDEX_TYPE,))
        except OciNotFoundError:
            return []
        return list(json.loads(data).get("manifests") or [])


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for a subject digest: ``sha256-<hex>``."""
    return digest.replace(":", "-")


def _cause(exc: BaseException) -> str:
    """A short, credential-free cause of a connection failure."""
    text = str(exc)
    for known in ("Connection refused", "Name or service not known", "timed out", "No route to host", "Temporary failure in name resolution"):
        if known in text:
            return known.lower()
    return type(exc).__name__
