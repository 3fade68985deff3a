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

Every request has a deadline for the whole of it, retries included (:data:`REQUEST_DEADLINE`, and
for a blob one more second per :data:`MIN_RATE` bytes of it), however its answer arrives: stalled,
or a byte at a time. Every answer is read with a size limit on its decoded bytes (a JSON document
at most :data:`MAX_DOCUMENT`, a blob the size its descriptor declares), so a compressed answer
is never inflated past it. Every JSON document is checked for its shape (:func:`document`)
before a field is read: a registry's answer is one line of :class:`~concord.errors.OciDocumentError`
when it is not what the distribution API sends. Connection failures, ``429`` and ``5xx`` answers
to ``GET`` and ``HEAD`` are retried (:data:`ATTEMPTS`, with backoff) within the same deadline.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urljoin

from concord.documents import load_json_document, need_dict, need_list
from concord.errors.oci import (
    OciAuthError,
    OciDocumentError,
    OciError,
    OciNotFoundError,
    OciRegistryUnreachableError,
    OciTimeoutError,
)
from concord.oci.reference import Reference

USERNAME_ENV = "CONCORD_REGISTRY_USERNAME"
PASSWORD_ENV = "CONCORD_REGISTRY_PASSWORD"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
#: decoded bytes per read of an answer's body
READ_SIZE = 1024 * 1024
#: seconds to connect
CONNECT_TIMEOUT = 10.0
#: seconds one read may wait for its next bytes (never past the request's deadline)
READ_TIMEOUT = 60.0
#: seconds for the whole of a request with a small answer (a manifest, a HEAD, a token), retries included
REQUEST_DEADLINE = 120.0
#: bytes per second a blob must arrive (or leave) at least, on average: its deadline grows by its size over this
MIN_RATE = 1024 * 1024
#: decoded bytes of a JSON document from a registry at most (manifests, indexes, tokens, errors)
MAX_DOCUMENT = 4 * 1024 * 1024
#: decoded bytes of an error answer read for its message
MAX_ERROR_BODY = 64 * 1024
#: no document of the distribution API nests deeper than this (a manifest: 4 levels)
MAX_DOCUMENT_DEPTH = 16
#: attempts of a GET or HEAD on a connection failure, 429 or 5xx
ATTEMPTS = 3
#: seconds before the second attempt (doubled for each further one)
BACKOFF = 0.5
_TRANSIENT = (429, 500, 502, 503, 504)


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
    except (OSError, ValueError, RecursionError):
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


class Deadline:
    """The moment a request (all its attempts, its whole answer) must be over by."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    @classmethod
    def for_bytes(cls, size: int) -> Deadline:
        """The deadline of a request that moves ``size`` bytes of a blob."""
        return cls(REQUEST_DEADLINE + max(0, size) / MIN_RATE)

    def left(self) -> float:
        return self.at - time.monotonic()


class _Body:
    """A request body streamed from an iterable of byte blocks, with a known length (so the
    request carries ``Content-Length`` rather than chunked encoding), refused past its deadline."""

    def __init__(self, blocks: Iterable[bytes], length: int, deadline: Deadline, expired: Callable[[], Exception]) -> None:
        self._blocks = blocks
        self.len = length
        self._deadline = deadline
        self._expired = expired

    def __len__(self) -> int:
        return self.len

    def __iter__(self) -> Iterator[bytes]:
        for block in self._blocks:
            if self._deadline.left() <= 0:
                raise self._expired()
            yield block


def document(data: bytes, reference: str, what: str, *, max_bytes: int = MAX_DOCUMENT) -> dict:
    """The JSON object ``data`` (from a registry), checked as store documents are: size, UTF-8,
    depth, numbers, and an object at the top; :class:`OciDocumentError` naming ``what`` otherwise."""
    return load_json_document(
        data, what, max_bytes=max_bytes, max_depth=MAX_DOCUMENT_DEPTH, error=lambda problem: OciDocumentError(reference, what, problem)
    )


def doc_field(doc: dict, key: str, kind: type, reference: str, what: str, *, required: bool = True) -> Any:
    """``doc[key]`` if it is a ``kind`` (dict, list or str); None when absent and not ``required``."""
    value = doc.get(key)
    if value is None and not required:
        return None

    def fail(problem: str) -> OciDocumentError:
        return OciDocumentError(reference, what, problem)

    if kind is dict:
        return need_dict(value, key, fail)
    if kind is list:
        return need_list(value, key, fail)
    if not isinstance(value, kind):
        from concord.documents import json_type

        raise fail(f"{key} is {json_type(value)}, expected {'a string' if kind is str else kind.__name__}")
    return value


def descriptors(doc: dict, key: str, reference: str, what: str) -> list[dict]:
    """The list of objects ``doc[key]`` (an index's ``manifests``, a manifest's ``layers``); [] when absent."""
    items = doc_field(doc, key, list, reference, what, required=False) or []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            from concord.documents import json_type

            raise OciDocumentError(reference, what, f"{key}[{i}] is {json_type(item)}, expected an object")
    return items


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

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ requests and auth

    def _url(self, path: str) -> str:
        return f"{self.base}/v2/{self.ref.repository}/{path}"

    def _timeout(self, what: str, deadline: Deadline) -> OciTimeoutError:
        return OciTimeoutError(self.ref.registry, what, deadline.seconds)

    def request(
        self,
        method: str,
        url: str,
        *,
        body: Callable[[], object] | None = None,
        headers=None,
        deadline: Deadline | None = None,
        what: str = "an answer",
    ):
        """Send a request and give back its streamed response (read it with :meth:`body` or
        :meth:`read`, then close it), answering one authentication challenge; ``body`` makes a
        fresh body for each attempt (a streamed body is read once). ``GET`` and ``HEAD`` are
        tried again on a connection failure, 429 or 5xx, until ``deadline``."""
        import requests

        deadline = deadline or Deadline(REQUEST_DEADLINE)
        retry = method in ("GET", "HEAD")
        challenged = False
        attempt = 0
        while True:
            attempt += 1
            left = deadline.left()
            if left <= 0:
                raise self._timeout(what, deadline)
            h = dict(headers or {})
            if self._auth_header:
                h["Authorization"] = self._auth_header
            try:
                r = self.session.request(
                    method,
                    url,
                    data=body() if body else None,
                    headers=h,
                    stream=True,
                    timeout=(min(CONNECT_TIMEOUT, left), min(READ_TIMEOUT, left)),
                    allow_redirects=True,
                )
            except requests.exceptions.SSLError as exc:
                raise OciRegistryUnreachableError(self.ref.registry, self.base, f"TLS failed: {type(exc).__name__}", plain_http=self.plain_http) from None
            except OciError:
                raise  # a body past its deadline
            except requests.exceptions.RequestException as exc:
                if retry and attempt < ATTEMPTS and self._pause(attempt, deadline):
                    continue
                if deadline.left() <= 0:
                    raise self._timeout(what, deadline) from None
                raise OciRegistryUnreachableError(self.ref.registry, self.base, _cause(exc), plain_http=self.plain_http) from None
            if retry and r.status_code in _TRANSIENT and attempt < ATTEMPTS:
                r.close()
                if self._pause(attempt, deadline):
                    continue
                raise self._timeout(what, deadline)
            if r.status_code != 401:
                return r
            challenge = r.headers.get("WWW-Authenticate", "")
            r.close()
            if challenged or not self._answer(challenge, deadline):
                raise OciAuthError(
                    self.ref.registry,
                    str(self.ref),
                    source=self.credentials.source if self.credentials else None,
                    username=self.credentials.username if self.credentials else None,
                )
            challenged = True

    @staticmethod
    def _pause(attempt: int, deadline: Deadline) -> bool:
        """Wait before the next attempt; False when the deadline leaves no time for one."""
        wait = BACKOFF * 2 ** (attempt - 1)
        if deadline.left() <= wait:
            return False
        time.sleep(wait)
        return True

    def body(self, r, *, limit: int, deadline: Deadline, what: str) -> Iterator[bytes]:
        """The decoded bytes of response ``r``, block by block: refused past ``limit`` bytes (a
        compressed answer is inflated no further) or past ``deadline`` (however slowly they come)."""
        from urllib3.exceptions import HTTPError as Urllib3Error

        raw = r.raw
        total = 0
        while True:
            left = deadline.left()
            if left <= 0:
                raise self._timeout(what, deadline)
            wait = min(READ_TIMEOUT, left)
            _read_timeout(raw, wait)
            try:
                block = raw.read1(READ_SIZE, decode_content=True)
            except (Urllib3Error, OSError) as exc:
                if deadline.left() <= 0:
                    raise self._timeout(what, deadline) from None
                if "timed out" in str(exc).lower() or isinstance(exc, TimeoutError):
                    raise OciTimeoutError(self.ref.registry, f"{what} (stalled)", wait) from None
                raise OciRegistryUnreachableError(self.ref.registry, self.base, f"{what} broke off: {_cause(exc)}", plain_http=self.plain_http) from None
            if not block:
                return
            total += len(block)
            if total > limit:
                raise OciError(f"{self.ref}: {what} is larger than {limit} bytes, more than it may be; nothing was kept from it")
            yield block

    def read(self, r, *, limit: int, deadline: Deadline, what: str) -> bytes:
        """The whole decoded body of ``r`` (see :meth:`body`); ``r`` is closed."""
        try:
            return b"".join(self.body(r, limit=limit, deadline=deadline, what=what))
        finally:
            r.close()

    def _answer(self, challenge: str, deadline: Deadline) -> bool:
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
            left = deadline.left()
            if left <= 0:
                raise self._timeout("a token", deadline)
            try:
                r = self.session.get(
                    f"{realm}?{urlencode(query)}", auth=auth, stream=True, timeout=(min(CONNECT_TIMEOUT, left), min(READ_TIMEOUT, left))
                )
            except requests.exceptions.RequestException as exc:
                raise OciRegistryUnreachableError(self.ref.registry, realm, _cause(exc), plain_http=self.plain_http) from None
            if r.status_code != 200:
                r.close()
                return False
            doc = document(self.read(r, limit=MAX_DOCUMENT, deadline=deadline, what="token"), str(self.ref), "token answer")
            token = doc.get("token") or doc.get("access_token")
            if not isinstance(token, str) or not token:
                return False
            self._auth_header = f"Bearer {token}"
            return True
        return False

    def _fail(self, r, what: str, deadline: Deadline | None = None) -> OciError:
        """The error for an answer that is not the one asked for (``r`` is closed)."""
        detail = ""
        try:
            data = self.read(r, limit=MAX_ERROR_BODY, deadline=deadline or Deadline(REQUEST_DEADLINE), what="an error answer")
            errors = json.loads(data).get("errors") or []
            if isinstance(errors, list):
                detail = "; ".join(f"{e.get('code')}: {e.get('message')}"[:200] for e in errors[:3] if isinstance(e, dict))
        except (OciError, ValueError, AttributeError, RecursionError):
            pass  # the status is what counts; a body past its limits or of another shape says nothing more
        return OciError(f"{self.ref}: the registry refused to {what} (HTTP {r.status_code}{': ' + detail if detail else ''})")

    # ------------------------------------------------------------------ blobs

    def has_blob(self, digest: str) -> bool:
        return self.blob_length(digest) is not None

    def blob_length(self, digest: str) -> int | None:
        """The size the registry gives for blob ``digest`` (its ``HEAD`` answer's
        ``Content-Length``; ``-1`` when it gives none), or ``None`` when it holds no such blob."""
        r = self.request("HEAD", self._url(f"blobs/{digest}"), what=f"the answer for blob {digest}")
        if r.status_code == 200:
            r.close()
            length = r.headers.get("Content-Length", "")
            return int(length) if length.isascii() and length.isdigit() else -1
        if r.status_code == 404:
            r.close()
            return None
        raise self._fail(r, f"say whether it holds blob {digest}")

    def put_blob(self, digest: str, size: int, blocks: Callable[[], Iterable[bytes]]) -> None:
        """Upload one blob: a session, then one ``PUT`` streaming ``blocks()`` with its digest.
        The registry computes the digest of what arrives and refuses the blob when it differs."""
        r = self.request("POST", self._url("blobs/uploads/"), headers={"Content-Length": "0"}, what="an upload session")
        if r.status_code not in (201, 202) or not r.headers.get("Location"):
            raise self._fail(r, "start a blob upload")
        r.close()
        location = urljoin(self.base + "/", r.headers["Location"])
        url = location + ("&" if "?" in location else "?") + urlencode({"digest": digest})
        deadline = Deadline.for_bytes(size)
        what = f"the upload of blob {digest}"
        r = self.request(
            "PUT",
            url,
            body=lambda: _Body(blocks(), size, deadline, lambda: self._timeout(what, deadline)),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            deadline=deadline,
            what=what,
        )
        if r.status_code not in (201, 204):
            raise self._fail(r, f"take blob {digest}")
        r.close()

    def get_blob(self, digest: str, deadline: Deadline | None = None):
        """An open streamed response for a blob (read it with :meth:`body`); the caller closes it."""
        r = self.request("GET", self._url(f"blobs/{digest}"), deadline=deadline, what=f"blob {digest}")
        if r.status_code == 404:
            r.close()
            raise OciNotFoundError(f"{self.ref.registry}/{self.ref.repository}@{digest}", "blob")
        if r.status_code != 200:
            raise self._fail(r, f"send blob {digest}", deadline)
        return r

    def blob_blocks(self, digest: str, size: int) -> Iterator[bytes]:
        """The bytes of a blob of ``size`` bytes as they arrive, refused past ``size`` or past its deadline."""
        deadline = Deadline.for_bytes(size)
        r = self.get_blob(digest, deadline)
        try:
            yield from self.body(r, limit=size, deadline=deadline, what=f"blob {digest}")
        finally:
            r.close()

    def read_blob(self, digest: str, limit: int) -> bytes:
        """A small blob (a config, a signature) read whole, refused above ``limit`` bytes."""
        return b"".join(self.blob_blocks(digest, limit))

    # ------------------------------------------------------------------ manifests

    def put_manifest(self, data: bytes, target: str, media_type: str = MANIFEST_TYPE) -> str:
        """Store a manifest under a tag or its digest; the digest the registry answered with."""
        r = self.request("PUT", self._url(f"manifests/{target}"), body=lambda: data, headers={"Content-Type": media_type}, what=f"manifest {target}")
        if r.status_code not in (200, 201):
            raise self._fail(r, f"take manifest {target}")
        r.close()
        return r.headers.get("Docker-Content-Digest", "")

    def get_manifest(self, target: str, accept: Iterable[str] = (MANIFEST_TYPE,), limit: int = MAX_DOCUMENT) -> tuple[bytes, str]:
        """The bytes and media type of the manifest at a tag or digest."""
        deadline = Deadline(REQUEST_DEADLINE)
        what = f"manifest {target}"
        r = self.request("GET", self._url(f"manifests/{target}"), headers={"Accept": ", ".join(accept)}, deadline=deadline, what=what)
        if r.status_code == 404:
            r.close()
            raise OciNotFoundError(f"{self.ref.registry}/{self.ref.repository}{'@' if ':' in target else ':'}{target}")
        if r.status_code != 200:
            raise self._fail(r, f"send manifest {target}", deadline)
        media_type = r.headers.get("Content-Type", "").split(";")[0].strip()
        return self.read(r, limit=limit, deadline=deadline, what=what), media_type

    def referrers(self, digest: str) -> list[dict]:
        """Descriptors of the manifests whose ``subject`` is ``digest``: the referrers API, or the
        ``sha256-<hex>`` tag of the referrers tag schema when the registry has no such API."""
        deadline = Deadline(REQUEST_DEADLINE)
        what = f"referrers index of {digest}"
        r = self.request("GET", self._url(f"referrers/{digest}"), headers={"Accept": INDEX_TYPE}, deadline=deadline, what=what)
        if r.status_code == 200 and r.headers.get("Content-Type", "").startswith(INDEX_TYPE):
            data = self.read(r, limit=MAX_DOCUMENT, deadline=deadline, what=what)
        else:
            r.close()
            try:
                data, _ = self.get_manifest(fallback_tag(digest), accept=(INDEX_TYPE,))
            except OciNotFoundError:
                return []
        return descriptors(document(data, str(self.ref), what), "manifests", str(self.ref), what)


def _read_timeout(raw, seconds: float) -> None:
    """Let the next read of ``raw`` (a urllib3 response) wait ``seconds`` at most."""
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.settimeout(max(0.001, seconds))
        except OSError:
            pass


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for a subject digest: ``sha256-<hex>``."""
    return digest.replace(":", "-")


def _cause(exc: BaseException) -> str:
    """A short, credential-free cause of a connection failure."""
    text = str(exc)
    for known in (
        "Connection refused",
        "Connection reset",
        "Name or service not known",
        "timed out",
        "No route to host",
        "Temporary failure in name resolution",
    ):
        if known in text:
            return known.lower()
    return type(exc).__name__
