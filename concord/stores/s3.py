"""A store in an S3 bucket (AWS or any S3-compatible endpoint: MinIO, Ceph, moto...).

Atomicity comes from S3 itself: a PutObject is visible whole or not at all, so there are no
temporary names. Objects that must never be replaced are written with ``If-None-Match: *``, and
ref updates are compare-and-swap through ``If-Match: <etag>``, both evaluated by the server.

A store's ``storage_class`` applies to chunks only. In an archive class (GLACIER, DEEP_ARCHIVE) a
chunk must be restored before it can be read: :meth:`S3ObjectStore.chunk_states` tells which are
archived or restoring, :meth:`S3ObjectStore.request_restore` asks for restores, and reading an
archived chunk raises :class:`~concord.errors.ChunkArchivedError`.

boto3 is imported on first use, so importing this module (or the CLI) stays fast. Every botocore
exception is translated at one boundary (:meth:`S3ObjectStore._translate`) into a
:mod:`concord.errors` class; none escapes.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from concord.errors import (
    ChunkArchivedError,
    ChunkNotFoundError,
    ConcordError,
    InvalidStoreURIError,
    StoreAccessError,
    StoreError,
    StoreUnreachableError,
)
from concord.redact import redact, scrub_exception
from concord.stores.base import (
    ARCHIVED,
    AVAILABLE,
    MISSING,
    RESTORING,
    Store,
    _check_digest,
    check_restore_request,
    chunk_name,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--table-s3")

_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AccountProblem",
        "403",
        "Forbidden",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_CONDITION_FAILED_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})
#: what a server that does not do conditional deletes answers to ``If-Match`` on DeleteObject
_UNSUPPORTED_CODES = frozenset({"NotImplemented", "501"})

#: server-side encryption S3 applies to every object written (SSE-S3, SSE-KMS)
SSE_MODES = ("AES256", "aws:kms")

#: storage classes whose objects must be restored before they can be read
ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})

READ_TIMEOUT = 60.0
MAX_POOL_CONNECTIONS = 32
#: transfers an S3 store runs at once unless its address or block says (``?connections=N``)
DEFAULT_CONNECTIONS = 16
#: the most a store may be given
MAX_CONNECTIONS = 1024
#: a question about this many chunks or more, outside an :meth:`S3ObjectStore.inventory`, is
#: answered from listings instead of a HEAD each
LIST_WORTH = 100
#: an object larger than this that no inventory knows is asked about (one HEAD) before its bytes
#: are sent; a smaller one goes at once, ``If-None-Match: *`` refusing it if present
ASK_FIRST_BYTES = 1 << 20
#: keys in a full ListObjectsV2 page
PAGE_KEYS = 1000
#: a store of up to about this many chunks is listed whole on an operation's first question
WHOLE_LISTING = 16 * PAGE_KEYS
_MAX_LEVEL = 4

#: how many times a GET whose answer breaks off is sent, at most (``CONCORD_S3_READ_ATTEMPTS``)
READ_ATTEMPTS = 5
READ_ATTEMPTS_ENV = "CONCORD_S3_READ_ATTEMPTS"
#: the first pause before a GET is sent again, in seconds; it doubles with each try, up to
#: :data:`MAX_BACKOFF` (``CONCORD_S3_RETRY_BACKOFF``)
RETRY_BACKOFF = 0.5
RETRY_BACKOFF_ENV = "CONCORD_S3_RETRY_BACKOFF"
MAX_BACKOFF = 8.0
#: the most seconds one object's read may spend in tries and pauses before it is given up
#: (``CONCORD_S3_READ_DEADLINE``)
READ_DEADLINE = 120.0
READ_DEADLINE_ENV = "CONCORD_S3_READ_DEADLINE"
#: answers a GET is sent again after (once botocore's own retries of them are spent)
_TRANSIENT_CODES = frozenset(
    {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling"}
)


def read_retry() -> tuple[int, float, float]:
    """How a broken read is retried: (tries, first backoff in seconds, deadline in seconds), from
    the environment (:data:`READ_ATTEMPTS_ENV`, :data:`RETRY_BACKOFF_ENV`, :data:`READ_DEADLINE_ENV`)
    or the defaults."""

    def number(name: str, default: float, least: float) -> float:
        text = os.environ.get(name, "").strip()
        if not text:
            return default
        try:
            value = float(text)
        except ValueError:
            raise StoreError(f"${name}={text!r}: give a finite number of at least {least:g}") from None
        if not value >= least or value == float("inf"):
            raise StoreError(f"${name}={text!r}: give a finite number of at least {least:g}")
        return value

    return (
        int(number(READ_ATTEMPTS_ENV, READ_ATTEMPTS, 1)),
        number(RETRY_BACKOFF_ENV, RETRY_BACKOFF, 0),
        number(READ_DEADLINE_ENV, READ_DEADLINE, 0),
    )


def _broken_body_errors() -> tuple[type[BaseException], ...]:
    """What reading an answer raises when it breaks off: botocore's wrappers, urllib3's and
    http.client's own, and the socket's (a reset, a time-out)."""
    import http.client

    from botocore import exceptions as bce
    from urllib3 import exceptions as u3e

    return (
        bce.ResponseStreamingError,
        bce.ReadTimeoutError,
        bce.ConnectionClosedError,
        bce.IncompleteReadError,
        u3e.ProtocolError,
        u3e.IncompleteRead,
        u3e.ReadTimeoutError,
        http.client.HTTPException,
        ConnectionError,
        TimeoutError,
    )


def _fault_name(exc: BaseException) -> str:
    """What broke, in a few words: ``ServiceUnavailable``, ``ConnectionResetError``, ``IncompleteReadError``."""
    code = _error_code(exc)
    if code:
        return code
    inner = getattr(exc, "kwargs", {}).get("error") if hasattr(exc, "kwargs") else None
    while isinstance(inner, BaseException) and inner.args and isinstance(inner.args[-1], BaseException):
        inner = inner.args[-1]  # urllib3's ProtocolError holds the socket's error last
    return type(inner if isinstance(inner, BaseException) else exc).__name__


def validate_bucket_name(bucket: str) -> str:
    """Check ``bucket`` against the S3 bucket naming rules; return it unchanged."""
    reason = None
    if not isinstance(bucket, str) or not bucket:
        reason = "the bucket name is empty"
    elif not _BUCKET.match(bucket):
        reason = (
            "bucket names are 3 to 63 characters of lowercase letters, digits, '.' and '-', "
            "starting and ending with a letter or digit"
        )
    elif ".." in bucket or ".-" in bucket or "-." in bucket:
        reason = "bucket names may not contain '..', '.-' or '-.'"
    elif bucket.startswith(_RESERVED_BUCKET_PREFIXES) or bucket.endswith(_RESERVED_BUCKET_SUFFIXES):
        reason = "the bucket name uses a prefix or suffix that S3 reserves"
    else:
        try:
            ipaddress.IPv4Address(bucket)
            reason = "bucket names may not look like an IP address"
        except ValueError:
            pass
    if reason:
        raise InvalidStoreURIError(f"s3://{bucket}", reason, part="bucket")
    return bucket


def validate_prefix(bucket: str, prefix: str) -> str:
    """``prefix`` without surrounding '/', refusing empty, '.' and '..' segments."""
    if prefix is None:
        return ""
    if not isinstance(prefix, str):
        raise InvalidStoreURIError(f"s3://{bucket}/{prefix}", "the prefix must be a string", part="prefix")
    cleaned = prefix.strip("/")
    if cleaned and any(p in ("", ".", "..") for p in cleaned.split("/")):
        raise InvalidStoreURIError(f"s3://{bucket}/{prefix}", "the prefix has an empty, '.' or '..' segment", part="prefix")
    if any(ord(ch) < 32 or ch == "\\" for ch in cleaned):
        raise InvalidStoreURIError(f"s3://{bucket}/{prefix}", "the prefix has a control character or '\\'", part="prefix")
    return cleaned


def check_connections(connections: object, where: str = "the store") -> int | None:
    """``connections`` (how many transfers a store runs at once) if it is a whole number from 1 to
    :data:`MAX_CONNECTIONS`, or None (the default); else ``ValueError`` saying so."""
    if connections is None:
        return None
    if isinstance(connections, bool) or not isinstance(connections, int) or not 1 <= connections <= MAX_CONNECTIONS:
        raise ValueError(
            f"{where}: connections must be a whole number from 1 to {MAX_CONNECTIONS} (transfers at once; "
            f"default {DEFAULT_CONNECTIONS}), got {connections!r}"
        )
    return connections


#: clients kept for sharing, at most (each endpoint, set of credentials and settings has one)
MAX_SHARED_CLIENTS = 16
_CLIENTS: dict[tuple, Any] = {}  # (process, endpoint, region, credentials, settings, AWS_* environment) -> client
_CLIENTS_LOCK = threading.Lock()


def _shared_client(store: S3ObjectStore) -> Any:
    """The boto3 client for ``store``'s endpoint, region, credentials and client settings, built
    once per process (a forked child builds its own: a client's connections are not shared across
    processes). The ``AWS_*`` environment is part of the key, since a client reads credentials and
    settings from it when it is built."""
    pool = max(MAX_POOL_CONNECTIONS, store.parallelism)
    key = (
        os.getpid(), store.endpoint_url, store.region_name, tuple(sorted(store._credentials.items())),
        store.max_attempts, store.connect_timeout, pool,
        tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))),
    )
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                retries={"max_attempts": store.max_attempts, "mode": "standard"},
                connect_timeout=store.connect_timeout,
                read_timeout=READ_TIMEOUT,
                max_pool_connections=pool,
                # S3-compatible servers reached by address rarely resolve bucket subdomains
                s3={"addressing_style": "path" if store.endpoint_url else "auto"},
            )
            session = boto3.session.Session(region_name=store.region_name, **store._credentials)
            client = session.client("s3", endpoint_url=store.endpoint_url, config=config)
            if len(_CLIENTS) >= MAX_SHARED_CLIENTS:  # forget the oldest (the stores holding it keep it)
                del _CLIENTS[next(iter(_CLIENTS))]
            _CLIENTS[key] = client
        return client


class S3ObjectStore(Store):
    """A :class:`Store` at ``s3://bucket/prefix``.

    The endpoint is ``endpoint_url`` if given, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``
    from the environment, else AWS. Credentials not passed explicitly come from boto3's usual chain
    (environment, config files, instance roles). Nothing touches the network until the first call.

    ``storage_class`` (e.g. ``STANDARD_IA``, ``GLACIER``) is applied to chunk objects only:
    manifests, refs and documents are small, and are always written in STANDARD so that listing
    refs, reading a manifest or comparing snapshots never waits for an archive restore. With an
    archive class (GLACIER, DEEP_ARCHIVE) the store is an archive (:attr:`archive`): chunks must be
    restored (:meth:`request_restore`) before they can be read.

    ``sse`` (``AES256`` for SSE-S3, ``aws:kms`` for SSE-KMS, with ``sse_kms_key_id`` naming the KMS
    key, else the account's default) is sent with every object written: chunks, manifests, refs,
    documents and the configuration. It is S3's encryption at rest; a store's own encryption
    (``concord init --encrypt``) is independent of it and may be combined with it.
    """

    parallelism = DEFAULT_CONNECTIONS

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        storage_class: str | None = None,
        create_bucket: bool = False,
        connect_timeout: float = 5.0,
        max_attempts: int = 3,
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
        connections: int | None = None,
    ) -> None:
        self.bucket = validate_bucket_name(bucket)
        self.prefix = validate_prefix(bucket, prefix)
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.endpoint_url = (
            endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        )
        self.region_name = region_name
        self.storage_class = storage_class
        self.create_bucket = create_bucket
        if sse is not None and sse not in SSE_MODES:
            raise ValueError(f"sse must be one of {', '.join(SSE_MODES)} (SSE-S3, SSE-KMS) or unset, got {sse!r}")
        if sse_kms_key_id and sse != "aws:kms":
            raise ValueError("sse_kms_key_id goes with sse='aws:kms' (SSE-KMS); set both, or neither")
        self.sse = sse
        self.sse_kms_key_id = sse_kms_key_id or None
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be positive, got {connect_timeout!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        self.connect_timeout = float(connect_timeout)
        self.max_attempts = int(max_attempts)
        self.connections = check_connections(connections, self.uri)
        self.parallelism = self.connections or DEFAULT_CONNECTIONS
        self._credentials = {
            "aws_access_key_id": aws_access_key_id,
            "aws_secret_access_key": aws_secret_access_key,
            "aws_session_token": aws_session_token,
        }
        self._lock = threading.Lock()
        self._cached_client: Any = None

    def __repr__(self) -> str:
        where = f", endpoint_url={self._endpoint_name()!r}" if self.endpoint_url else ""
        return f"{type(self).__name__}({self.uri!r}{where})"

    @property
    def archive(self) -> bool:
        """True when chunks are written to an archive class and need a restore to be read."""
        return self.storage_class in ARCHIVE_CLASSES

    # A store travels between processes (task runners) as its settings, never as a live client.
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_lock"] = None
        state["_cached_client"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ client and errors

    def _client(self) -> Any:
        """The boto3 S3 client (the bucket checked or created on first use). Stores of one
        endpoint, region, credentials and client settings share one client in a process, with
        its connection pool: a sync to a hundred buckets holds one client, not a hundred (each
        holds some 15 MB of service model and its own pool)."""
        client = self._cached_client
        if client is not None:
            return client
        with self._lock:
            if self._cached_client is None:
                client = _shared_client(self)
                self._ensure_bucket(client)
                self._cached_client = client
            return self._cached_client

    def _ensure_bucket(self, client: Any) -> None:
        from botocore.exceptions import ClientError

        try:
            client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            code = _error_code(exc)
            if code in _ACCESS_CODES:
                return  # allowed to use objects but not to look at the bucket: let each call say
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise
            if not self.create_bucket:
                raise StoreAccessError(
                    self.uri,
                    f"bucket {self.bucket!r} does not exist at {self._endpoint_name()}; create it "
                    "or pass create_bucket=True",
                ) from exc
        args: dict[str, Any] = {"Bucket": self.bucket}
        region = client.meta.region_name
        if region and region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            client.create_bucket(**args)
        except ClientError as exc:
            if _error_code(exc) != "BucketAlreadyOwnedByYou":
                if _error_code(exc) == "BucketAlreadyExists":
                    raise StoreAccessError(
                        self.uri, f"bucket {self.bucket!r} belongs to another account; choose another name"
                    ) from exc
                raise

    def _endpoint_name(self) -> str:
        """The endpoint as it may be shown: any credential in its user-info hidden."""
        return redact(self.endpoint_url) if self.endpoint_url else "AWS"

    @contextmanager
    def _translate(self, action: str, key: str | None = None) -> Iterator[None]:
        """Turn any botocore exception raised inside into the matching :mod:`concord.errors` class."""
        from botocore import exceptions as bce

        what = f"{action} {key}" if key is not None else action
        # each botocore error is chained under the Concord one: its message (the endpoint URL)
        # is scrubbed first, so a traceback never shows a password either
        try:
            yield
        except ConcordError:
            raise
        except (bce.ConnectionError, bce.HTTPClientError, *_broken_body_errors()) as exc:
            scrub_exception(exc)
            raise StoreUnreachableError(self.uri, f"{what} at {self._endpoint_name()} failed ({exc})") from exc
        except (bce.NoCredentialsError, bce.PartialCredentialsError) as exc:
            raise StoreAccessError(self.uri, f"{what}: no usable credentials ({exc})") from exc
        except bce.ClientError as exc:
            scrub_exception(exc)
            code = _error_code(exc)
            message = exc.response.get("Error", {}).get("Message") or str(exc)
            if code == "NoSuchBucket":
                raise StoreAccessError(
                    self.uri,
                    f"bucket {self.bucket!r} does not exist at {self._endpoint_name()}; create it "
                    "or pass create_bucket=True",
                ) from exc
            if code in _ACCESS_CODES:
                raise StoreAccessError(self.uri, f"{what}: {code}: {message}") from exc
            raise StoreError(f"store {self.uri}: {what} failed: {code}: {message}") from exc
        except bce.BotoCoreError as exc:
            scrub_exception(exc)
            raise StoreError(f"store {self.uri}: {what} failed: {exc}") from exc

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def close(self) -> None:
        """Let go of the client (it stays open for the other stores sharing it, and is reused by
        this one's next request)."""
        with self._lock:
            self._cached_client = None

    # ------------------------------------------------------------------ raw primitives

    def _head(self, key: str) -> dict | None:
        """HEAD ``key`` (relative to the prefix); None if absent. Call inside :meth:`_translate`."""
        from botocore.exceptions import ClientError

        try:
            return self._client().head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                return None
            raise

    def _put_object(self, key: str, data: bytes | memoryview, *, overwrite: bool) -> bool:
        """One PutObject. Unless ``overwrite``, it carries ``If-None-Match: *``, and the server's
        412 answer says the object was there: no request asks first, except for an object of more
        than :data:`ASK_FIRST_BYTES` that no :meth:`inventory` knows about (its bytes are worth a
        HEAD). A chunk the operation's inventory lists is not sent at all."""
        from botocore.exceptions import ClientError

        body = data if isinstance(data, bytes) else bytes(data)
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": body, **self._sse_args()}
        if self.storage_class and key.startswith("chunks/"):
            args["StorageClass"] = self.storage_class
        md5 = hashlib.md5(body, usedforsecurity=False)
        args["ContentMD5"] = base64.b64encode(md5.digest()).decode()  # a server that checks refuses a changed body
        inventory = self._inventory if key.startswith("chunks/") else None
        with self._translate("write", key):
            if not overwrite:
                if inventory is not None and inventory.holds(key):
                    return False  # listed: don't send the bytes at all
                if inventory is None and len(body) > ASK_FIRST_BYTES and self._head(key) is not None:
                    return False
                args["IfNoneMatch"] = "*"
            try:
                response = self._client().put_object(**args)
            except ClientError as exc:
                if not overwrite and _error_code(exc) in _CONDITION_FAILED_CODES:
                    if inventory is not None:
                        inventory.add(key)  # another writer's copy: there now
                    return False
                raise
            self._check_arrival(key, len(body), md5.hexdigest(), response.get("ETag"))
        if inventory is not None:
            inventory.add(key)
        return True

    def _sse_args(self) -> dict[str, str]:
        """The server-side encryption headers of every PutObject."""
        if self.sse is None:
            return {}
        args = {"ServerSideEncryption": self.sse}
        if self.sse_kms_key_id:
            args["SSEKMSKeyId"] = self.sse_kms_key_id
        return args

    def _check_arrival(self, key: str, size: int, md5: str, etag: str | None) -> None:
        """After a put, make sure the store holds what was sent: the PutObject's answer names the
        object's MD5 as its ETag (a single-part upload without SSE-KMS), so a match costs no
        request. Only an answer that does not match (SSE-KMS, a server whose ETags are not
        MD5s) is followed by a HEAD, which checks the object's length."""
        if etag is not None and etag.strip('"') == md5:
            return
        head = self._head(key)
        if head is None:
            raise StoreError(
                f"store {self.uri}: {key} was written but is not there afterwards; "
                "check the bucket's lifecycle rules and retry"
            )
        if etag is not None and head.get("ETag") != etag:
            return  # someone wrote the key again since: their write, not ours, is there now
        if head.get("ContentLength") != size:
            raise StoreError(
                f"store {self.uri}: {key} arrived with {head.get('ContentLength')} bytes, "
                f"{size} were sent. The upload was truncated: re-send it (for chunks, "
                "`concord verify STORE --repair-from OTHER_STORE`)."
            )

    def _get_object(self, key: str) -> bytes | None:
        return self._read_with_token(key)[0]

    def _read_head(self, key: str, n: int) -> bytes | None:
        """One ranged GET of the first ``n`` bytes (an empty object has none)."""
        return self._get(key, first=n)[0]

    def _parallel(self, fn, items: list, action: str) -> list:
        """``fn`` over ``items`` on up to :attr:`parallelism` threads, results in order. The
        client is built (and the bucket checked) once here, not in every worker; the first
        error cancels what has not started."""
        if not items:
            return []
        with self._translate(action, f"{len(items)} object(s)"):
            self._client()
        if len(items) == 1:
            return [fn(items[0])]
        with ThreadPoolExecutor(max_workers=min(self.parallelism, len(items))) as pool:
            futures = [pool.submit(fn, item) for item in items]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def _exists_many(self, keys: list[str]) -> list[bool]:
        """Chunks from the operation's :meth:`inventory` (or, for a question of at least
        :data:`LIST_WORTH` chunks outside one, from an inventory of this question's own);
        anything else with one HEAD each."""
        inventory = self._inventory
        chunks = [k for k in keys if k.startswith("chunks/")]
        if inventory is None and len(chunks) >= LIST_WORTH:
            inventory = _Inventory(self)
        known: dict[str, bool] = {}
        if inventory is not None and chunks:
            known[chunks[0]] = inventory.holds(chunks[0])  # the first page: how the rest is answered
            answers = {k: inventory.answer(k) for k in chunks[1:]}
            known.update((k, a) for k, a in answers.items() if a is not None)
            asked = [k for k, a in answers.items() if a is None]  # only these need a request
            known.update(zip(asked, self._parallel(inventory.holds, asked, "check")))

        def exists(key: str) -> bool:
            with self._translate("check", key):
                return self._head(key) is not None

        asked = [k for k in keys if k not in known]
        known.update(zip(asked, self._parallel(exists, asked, "check")))
        return [known[k] for k in keys]

    def _new_inventory(self) -> _Inventory:
        """What one operation learns of the chunks here from ListObjectsV2 pages of ``chunks/``
        instead of a HEAD per chunk (:class:`_Inventory`)."""
        return _Inventory(self)

    def _delete_object(self, key: str) -> None:
        with self._translate("delete", key):
            self._client().delete_object(Bucket=self.bucket, Key=self._key(key))
        inventory = self._inventory
        if inventory is not None and key.startswith("chunks/"):
            inventory.discard(key)

    def _list_keys(self, prefix: str) -> Iterator[str]:
        for key, _, _ in self._list_stats(prefix):
            yield key

    def list_pages(self, full_prefix: str) -> Iterator[dict]:
        """Each ListObjectsV2 page of the keys under ``full_prefix`` (a key of the bucket, not
        relative to the store's prefix), each page sent again (:meth:`_retrying`) when its answer
        breaks off. Call inside :meth:`_translate`."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
        while True:
            page = self._retrying(f"listing {full_prefix or 'the bucket'}", lambda: self._client().list_objects_v2(**args))
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            args["ContinuationToken"] = token

    def _list_stats(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        with self._translate("list", prefix):
            for page in self.list_pages(full):
                for obj in page.get("Contents", ()):
                    name = obj["Key"]
                    if not name.endswith("/"):
                        yield name[strip:], int(obj.get("Size", 0)), obj["LastModified"].timestamp()

    def _read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
        return self._get(key)

    def _get(self, key: str, *, first: int | None = None) -> tuple[bytes | None, str | None]:
        """GET ``key`` (its ``first`` bytes only, if given) and read its body whole, sent again by
        :meth:`_retrying` when the answer breaks off: the one place where S3 bytes are read.
        ``(None, None)`` when the object is absent."""
        from botocore.exceptions import ClientError

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if first is not None:
            args["Range"] = f"bytes=0-{first - 1}"

        def get() -> tuple[bytes | None, str | None]:
            try:
                response = self._client().get_object(**args)
            except ClientError as exc:
                code = _error_code(exc)
                if code in _NOT_FOUND_CODES:
                    return None, None
                if first is not None and code == "InvalidRange":
                    return b"", None
                if code == "InvalidObjectState":
                    raise ChunkArchivedError(self.uri, key, self._archived_class(key, exc)) from exc
                raise
            body = response["Body"]
            try:  # StreamingBody.read checks the length and wraps urllib3's errors
                return body.read(), response.get("ETag")
            finally:
                body.close()

        with self._translate("read", key):
            return self._retrying(f"reading {key}", get)

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, made again when its answer breaks off (a connection reset or closed in the
        middle of the body, a body shorter than its length, a read that stalls past the read
        timeout) or is a 5xx that outlived botocore's own retries: after a backoff that doubles
        each time, up to :func:`read_retry`'s tries and deadline. What outlives them is a
        :class:`~concord.errors.StoreUnreachableError` naming the store, ``what`` and the fix."""
        from botocore.exceptions import ClientError

        attempts, backoff, deadline = read_retry()
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except ConcordError:
                raise
            except ClientError as exc:
                if _error_code(exc) not in _TRANSIENT_CODES:
                    raise
                fault: BaseException = exc
            except _broken_body_errors() as exc:
                fault = exc
            scrub_exception(fault)
            pause = min(backoff * 2 ** (attempt - 1), MAX_BACKOFF) * random.uniform(0.5, 1.0)
            spent = time.monotonic() - start
            if attempt >= attempts or spent + pause > deadline:
                raise StoreUnreachableError(
                    self.uri,
                    f"{what} at {self._endpoint_name()} failed {attempt} time(s) in {spent:.1f} s "
                    f"({_fault_name(fault)}); run the command again once the endpoint answers whole "
                    f"(more tries: ${READ_ATTEMPTS_ENV})",
                ) from fault
            log.info("%s from %s broke off (%s); trying again in %.2f s", what, self.uri, type(fault).__name__, pause)
            time.sleep(pause)

    def _write_if(self, key: str, data: bytes, token: str | None) -> bool:
        from botocore.exceptions import ClientError

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": bytes(data), **self._sse_args()}
        if token is None:
            args["IfNoneMatch"] = "*"
        else:
            args["IfMatch"] = token
        with self._translate("write", key):
            try:
                self._client().put_object(**args)
            except ClientError as exc:
                code = _error_code(exc)
                # NoSuchKey: the object we expected was deleted meanwhile, so the swap lost too
                if code in _CONDITION_FAILED_CODES or (token is not None and code in _NOT_FOUND_CODES):
                    return False
                raise
        return True

    def _archived_class(self, key: str, exc: Any) -> str:
        """The storage class of an object a GET refused as archived (for the error message)."""
        named = exc.response.get("Error", {}).get("StorageClass")
        if named:
            return str(named)
        head = self._head(key)
        return str((head or {}).get("StorageClass") or self.storage_class or "unknown")

    def _delete_if(self, key: str, token: str) -> bool:
        """DeleteObject with ``If-Match: <etag>``, so the server refuses if the ref was rewritten
        since it was read. Where that cannot be sent (a botocore without the parameter, a
        server answering NotImplemented) the delete is a plain one, and a ref rewritten in the
        few milliseconds between the read and the delete is removed with it; a server that
        ignores the header has the same window."""
        from botocore.exceptions import ClientError

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        with self._translate("delete", key):
            client = self._client()
            if _delete_takes_if_match(client):
                try:
                    client.delete_object(**args, IfMatch=token)
                    return True
                except ClientError as exc:
                    code = _error_code(exc)
                    if code in _CONDITION_FAILED_CODES or code in _NOT_FOUND_CODES:
                        return False
                    if code not in _UNSUPPORTED_CODES:
                        raise
            client.delete_object(**args)
        return True

    # ------------------------------------------------------------------ archive storage

    def chunk_states(self, ids: list[str]) -> dict[str, str]:
        """HEAD every chunk (in parallel) and read its storage class and restore status."""
        ids = [_check_digest(c, "chunk id") for c in dict.fromkeys(ids)]

        def state(cid: str) -> str:
            key = self._chunk_key(cid)
            with self._translate("check", key):
                return archive_state(self._head(key))

        return dict(zip(ids, self._parallel(state, ids, "check")))

    def request_restore(self, ids: list[str], *, days: int = 1, tier: str = "Standard") -> int:
        """RestoreObject for every chunk (in parallel); return how many restores were requested.

        A restore already under way counts as requested (S3 answers RestoreAlreadyInProgress);
        a chunk not in an archive class needs none and is not counted; a missing chunk raises
        :class:`~concord.errors.ChunkNotFoundError`.
        """
        check_restore_request(days, tier)
        ids = [_check_digest(c, "chunk id") for c in dict.fromkeys(ids)]
        request = {"Days": days, "GlacierJobParameters": {"Tier": tier}}

        def restore(cid: str) -> bool:
            from botocore.exceptions import ClientError

            key = self._chunk_key(cid)
            with self._translate("restore", key):
                try:
                    self._client().restore_object(Bucket=self.bucket, Key=self._key(key), RestoreRequest=request)
                except ClientError as exc:
                    code = _error_code(exc)
                    if code == "RestoreAlreadyInProgress":
                        return True
                    if code == "InvalidObjectState":
                        return False  # not archived: readable as it is
                    if code in _NOT_FOUND_CODES:
                        raise ChunkNotFoundError(self.uri, cid) from exc
                    raise
            return True

        return sum(self._parallel(restore, ids, "restore"))


def archive_state(head: dict | None) -> str:
    """What a HEAD response says about an object: ``missing``, ``restoring`` (a restore is under
    way), ``available`` (restored, or never archived) or ``archived`` (needs a restore)."""
    if head is None:
        return MISSING
    restore = head.get("Restore") or ""
    if 'ongoing-request="true"' in restore:
        return RESTORING
    if 'ongoing-request="false"' in restore:
        return AVAILABLE
    if head.get("StorageClass") in ARCHIVE_CLASSES:
        return ARCHIVED
    return AVAILABLE


def _delete_takes_if_match(client: Any) -> bool:
    """Whether this botocore knows DeleteObject's ``IfMatch`` (added in late 2024)."""
    shape = client.meta.service_model.operation_model("DeleteObject").input_shape
    return "IfMatch" in shape.members


def _error_code(exc: Any) -> str:
    error = getattr(exc, "response", None) or {}
    code = str(error.get("Error", {}).get("Code") or "")
    if not code:
        code = str(error.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")
    return code


def _region(key: str, level: int) -> str:
    """The listing prefix of the region ``key`` (``chunks/<2 hex>/<name>``) falls in at ``level``
    (how many leading hex digits of the name name a region): ``chunks/``, ``chunks/a``,
    ``chunks/ab/``, ``chunks/ab/abc`` ..."""
    name = key.rsplit("/", 1)[-1]
    if level == 0:
        return "chunks/"
    if level == 1:
        return f"chunks/{name[:1]}"
    return f"chunks/{name[:2]}/{name[:level] if level > 2 else ''}"


class _Inventory:
    """Which chunks a store holds, as one operation learns it: from ListObjectsV2 pages (1,000
    keys each) rather than a HEAD per chunk, remembered for the operation; a chunk written or
    refused as present meanwhile is added, one deleted is removed.

    The first question lists the first page of ``chunks/``. A store of up to 1,000 chunks is then
    known whole, and one of up to about :data:`WHOLE_LISTING` is listed whole at once (at most 16
    pages). A larger store is cut into regions of 1,000 to 16,000 chunks by the leading hex digits
    of their names (chunk names are hashes, spread evenly; the first page tells how densely): a
    region is listed once as many questions have fallen in it as it has pages, and until then each
    question is one HEAD. So an operation pays at most about twice the cheaper of a HEAD per chunk
    and a listing of the regions it touches, however large the store.

    What it learns holds for the operation: a writer lists under its garbage-collection lease, so
    no collection deletes a listed chunk meanwhile, and a chunk another writer adds after the
    listing is found by the conditional PUT's 412 answer."""

    def __init__(self, store: S3ObjectStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._known: set[bytes] = set()  # 32-byte names: a million chunks in about 70 MB
        self._level: int | None = None  # None: the first page is not listed yet
        self._pages = 1  # pages a region is expected to take
        self._listed: set[str] = set()
        self._asked: dict[str, int] = {}
        self._busy: dict[str, threading.Event] = {}

    def add(self, key: str) -> None:
        name = _digest(key)
        if name is not None:
            with self._lock:
                self._known.add(name)

    def discard(self, key: str) -> None:
        name = _digest(key)
        with self._lock:
            self._known.discard(name)

    def answer(self, key: str) -> bool | None:
        """Whether the store holds ``key``, if that is known without a request; else None."""
        name = _digest(key)
        with self._lock:
            if name in self._known:
                return True
            if self._level is not None and _region(key, self._level) in self._listed:
                return False
        return None

    def holds(self, key: str) -> bool:
        """Whether the store holds chunk object ``key`` (relative to the store's prefix)."""
        self._once("", lambda: self._level is not None, self._first_page)
        name = _digest(key)
        if name is None:
            return False  # not a chunk's name: never listed as one
        with self._lock:
            if name in self._known:
                return True
            region = _region(key, self._level)
            if region in self._listed:
                return False
            asked = self._asked[region] = self._asked.get(region, 0) + 1
            rent = asked < self._pages
        if rent:  # too few questions here yet to pay for listing the region
            with self.store._translate("check", key):
                found = self.store._head(key) is not None
            if found:
                self.add(key)
            return found
        self._once(region, lambda: region in self._listed, lambda: self._list(region))
        with self._lock:
            return name in self._known

    def _once(self, token: str, done: Callable[[], bool], work: Callable[[], None]) -> None:
        """``work()`` unless ``done()`` (asked under the lock): one thread at a time per ``token``,
        the others wait for it, and one of them tries again if it failed."""
        while True:
            with self._lock:
                if done():
                    return
                event = self._busy.get(token)
                mine = event is None
                if mine:
                    event = self._busy[token] = threading.Event()
            if not mine:
                event.wait(READ_DEADLINE)
                continue
            try:
                work()
            finally:
                with self._lock:
                    self._busy.pop(token, None)
                event.set()

    def _take(self, page: dict) -> str | None:
        """Remember a page's keys; the last one (None for an empty page)."""
        strip = len(self.store.prefix) + 1 if self.store.prefix else 0
        keys = [obj["Key"][strip:] for obj in page.get("Contents", ())]
        names = [n for n in map(_digest, keys) if n is not None]
        with self._lock:
            self._known.update(names)
        return keys[-1] if keys else None

    def _first_page(self) -> None:
        with self.store._translate("list", "chunks/"):
            pages = self.store.list_pages(self.store._key("chunks/"))
            first = next(pages)
            last = self._take(first)
            level, per_region = 0, 1
            if first.get("IsTruncated") and last is not None:
                estimate = _estimate(last)
                if estimate is None or estimate <= WHOLE_LISTING:
                    for page in pages:
                        self._take(page)
                else:
                    level = max(1, min(_MAX_LEVEL, int(math.log(estimate / PAGE_KEYS, 16))))
                    per_region = max(1, math.ceil(estimate / 16**level / PAGE_KEYS))
        with self._lock:
            if level == 0:
                self._listed.add("chunks/")
            self._level, self._pages = level, per_region

    def _list(self, region: str) -> None:
        with self.store._translate("list", region):
            for page in self.store.list_pages(self.store._key(region)):
                self._take(page)
        with self._lock:
            self._listed.add(region)


def _estimate(last: str) -> float | None:
    """How many chunks a store holds, judged from the last key of the first (full) page of its
    listing: names are hashes, spread evenly, so the page covered this share of them. None when
    the name is not hex (then the store is listed whole)."""
    try:
        share = (int(last.rsplit("/", 1)[-1][:12], 16) + 1) / 16**12
    except ValueError:
        return None
    return PAGE_KEYS / share


def _digest(key: str) -> bytes | None:
    """The 32 bytes a chunk object's key names (``chunks/ab/ab…``), or None for any other key."""
    name = chunk_name(key)
    return bytes.fromhex(name) if name is not None else None
