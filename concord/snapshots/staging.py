"""Staging a checkpoint that lives under an S3 prefix into a temporary local folder.

Snapshots and tier adds read a local folder (safetensors files are memory-mapped). A checkpoint
announced under ``s3://bucket/runs/llama/step-0100`` is first *staged*: every object under the
prefix is downloaded into ``<staging root>/concord-staging-XXXX/step-0100/``, keeping its relative
name and its LastModified time, so the staged folder snapshots to the same root as a local copy
of the same files, and taking it in twice changes nothing.

Each object is read with ``If-Match`` on the ETag it was listed with and its size is checked
after the download: an object replaced or deleted while it is staged fails the staging
(:class:`~concord.errors.SourceChangedError`) instead of giving a mixed checkpoint. Keys that
would land outside the staging folder ('..', '.', empty segments, a leading '/', '\\') are refused
before anything is downloaded (:class:`~concord.errors.UnsafePathError`).

:func:`staged_checkpoint` is a context manager that removes the staging folder on the way out,
whatever happened inside. A local source is given back as it is: nothing is copied. Pipelines
that download in a retried step of their own hold a :func:`staging_folder` and :func:`stage` into
it (emptying it first with :func:`empty_folder` on a second attempt). The staging
root is ``staging_dir``, else ``$CONCORD_STAGING_DIR``, else the system's temporary folder; the
S3 endpoint is ``endpoint_url``, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, else AWS
(as for S3 stores).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass

from concord.errors import InvalidStoreURIError, SourceChangedError, SourceNotFoundError, UnsafePathError
from concord.progress import Progress, ensure
from concord.snapshots.paths import relative_path, target_path

log = logging.getLogger(__name__)

STAGING_DIR_ENV = "CONCORD_STAGING_DIR"
#: bytes read from an object's body at a time
READ_SIZE = 8 * 1024 * 1024
#: objects at least this large get a log line of their own
LARGE_OBJECT = 256 * 1024 * 1024
#: objects downloaded at once
PARALLEL_DOWNLOADS = 4


def is_s3(source: object) -> bool:
    return isinstance(source, str) and source.startswith("s3://")


def s3_checkpoint_problem(uri: str) -> str | None:
    """Why ``uri`` cannot name a checkpoint under an S3 prefix (None when it can). No network."""
    from concord.stores.address import S3, StoreAddress

    try:
        address = StoreAddress.parse(uri)
    except InvalidStoreURIError as exc:
        if exc.part == "bucket":
            bucket = exc.spec[len("s3://"):]
            return f"bucket name {bucket!r} breaks the S3 naming rules (3 to 63 of a-z, 0-9, '.', '-')"
        if exc.part == "prefix":
            return "the prefix holds a control character or '\\'"
        return "is not an s3://bucket/prefix URI (no bucket, a query or fragment, or an empty, '.' or '..' segment)"
    if address.kind != S3:
        return "is not an s3://bucket/prefix URI (no bucket, a query or fragment, or an empty, '.' or '..' segment)"
    if not address.prefix:
        return "names a whole bucket; give the checkpoint's own prefix (s3://bucket/runs/model/step-N)"
    return None


@dataclass(frozen=True)
class StagedCheckpoint:
    """A checkpoint ready to be read from a local folder."""

    source: str  # what was asked for: a local folder, or the s3:// URI
    path: str  # the local folder to read
    staged: bool  # True when ``path`` is a temporary copy (removed on leaving the context)
    files: int = 0  # objects downloaded
    bytes: int = 0  # bytes downloaded


@dataclass(frozen=True)
class _Object:
    key: str
    rel: str
    size: int
    etag: str | None
    mtime: float


def _listing(store) -> list[_Object]:
    """Every object under the store's prefix, checked; refuses the whole listing on one bad key."""
    base = f"{store.prefix}/"
    objects: list[_Object] = []
    with store._translate("list", base):
        for page in store.list_pages(base):
            for obj in page.get("Contents", ()):
                key = obj["Key"]
                if key.endswith("/"):
                    continue  # a folder placeholder, not a file
                rel = relative_path(key[len(base) :], shown=key)
                etag = obj.get("ETag")
                objects.append(_Object(key, rel, int(obj.get("Size", 0)), etag, obj["LastModified"].timestamp()))
    names = {o.rel for o in objects}
    for o in objects:
        parts = o.rel.split("/")
        clash = next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in names), None)
        if clash is not None:
            raise UnsafePathError(f"{base}{clash}", f"it is both an object and the folder of {o.key}")
    return sorted(objects, key=lambda o: o.rel)


def _download(store, obj: _Object, dest: str, source: str, progress: Progress, stop: threading.Event) -> None:
    from botocore.exceptions import ClientError

    os.makedirs(os.path.dirname(dest), exist_ok=True)
    where = f"{source}/{obj.rel}"
    if obj.size >= LARGE_OBJECT:
        log.info("staging %s (%.1f GiB)", where, obj.size / 2**30)
    args = {"Bucket": store.bucket, "Key": obj.key} | ({"IfMatch": obj.etag} if obj.etag else {})
    written = 0
    with store._translate("read", obj.key):
        try:
            body = store._client().get_object(**args)["Body"]
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound", "PreconditionFailed", "412"):
                raise SourceChangedError(where) from exc  # deleted or replaced since it was listed
            raise
        try:
            with open(dest, "xb") as f:
                while not stop.is_set():
                    block = body.read(READ_SIZE)
                    if not block:
                        break
                    f.write(block)
                    written += len(block)
                    progress.advance(len(block))
        finally:
            body.close()
    if stop.is_set():
        return
    if written != obj.size:
        raise SourceChangedError(where)  # listed with another size: it changed while staged
    os.utime(dest, (obj.mtime, obj.mtime))


def stage(source: str, into: str, *, endpoint_url: str | None = None, progress: Progress | None = None) -> StagedCheckpoint:
    """Download every object under the S3 prefix ``source`` into the empty folder ``into``.

    Raises :class:`SourceNotFoundError` when no object is under the prefix, :class:`UnsafePathError`
    for a key that would leave ``into`` (before anything is downloaded),
    :class:`SourceChangedError` for an object deleted, replaced or resized while it is staged,
    the store errors of :mod:`concord.stores.s3` for an unreachable endpoint or refused access,
    and ``OSError`` (ENOSPC) when the staging disk is too small. ``into`` is left as it is on
    failure: remove it (:func:`staged_checkpoint` does).
    """
    from concord.stores.address import StoreAddress
    from concord.stores.s3 import S3ObjectStore

    problem = s3_checkpoint_problem(source)
    if problem:
        raise InvalidStoreURIError(source, problem)
    address = StoreAddress.parse(source)
    store = S3ObjectStore(address.bucket, address.prefix, endpoint_url=endpoint_url)
    try:
        objects = _listing(store)
        if not objects:
            raise SourceNotFoundError(source)
        total = sum(o.size for o in objects)
        free = shutil.disk_usage(into).free
        if free < total:
            raise OSError(
                errno.ENOSPC,
                f"staging {source} needs {total} bytes but only {free} are free where it is staged; "
                f"point ${STAGING_DIR_ENV} at a larger disk",
            )
        root = os.path.realpath(into)
        targets = [(o, target_path(o.rel, root, resolve=True, shown=o.key)) for o in objects]
        prog = ensure(progress)
        prog.start(total, f"staging {os.path.basename(root)}")
        stop = threading.Event()
        try:
            with ThreadPoolExecutor(min(PARALLEL_DOWNLOADS, len(targets)), thread_name_prefix="concord-staging") as pool:
                futures = [pool.submit(_download, store, o, dest, source, prog, stop) for o, dest in targets]
                try:
                    for future in as_completed(futures):
                        future.result()
                except BaseException:
                    stop.set()  # running downloads stop at their next read; the rest never start
                    for future in futures:
                        future.cancel()
                    raise
        finally:
            prog.close()
    finally:
        store.close()
    log.info("staged %s: %d object(s), %d bytes", source, len(objects), total)
    return StagedCheckpoint(source=source, path=into, staged=True, files=len(objects), bytes=total)


@contextmanager
def staging_folder(source: str, *, staging_dir: str | None = None) -> Iterator[str | None]:
    """A new empty folder to stage the checkpoint ``source`` into, for the time of the ``with`` block.

    For an ``s3://bucket/prefix/NAME``: a folder ``NAME`` (so the checkpoint keeps its name) inside
    a fresh temporary folder of the staging root, removed on leaving the block, after success or
    failure alike. For a local source: None, and nothing is made.
    """
    if not is_s3(source):
        yield None
        return
    root = staging_dir or os.environ.get(STAGING_DIR_ENV) or None
    if root:
        os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="concord-staging-", dir=root)
    try:
        name = source.rstrip("/").rsplit("/", 1)[-1]
        into = os.path.join(tmp, name if name not in ("", ".", "..") else "checkpoint")
        os.mkdir(into)
        yield into
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(tmp):
            log.warning("could not remove the staging folder %s; remove it by hand", tmp)


def empty_folder(path: str) -> None:
    """Remove everything inside the folder ``path`` (what an earlier, failed staging left)."""
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


@contextmanager
def staged_checkpoint(
    source: str,
    *,
    endpoint_url: str | None = None,
    staging_dir: str | None = None,
    progress: Progress | None = None,
) -> Iterator[StagedCheckpoint]:
    """The checkpoint ``source`` as a local folder for the time of the ``with`` block.

    A local folder is yielded as it is. An ``s3://bucket/prefix/NAME`` is downloaded into a
    :func:`staging_folder`, which is removed on leaving the block, after success or failure alike
    (a failed download included).
    """
    with staging_folder(source, staging_dir=staging_dir) as into:
        if into is None:
            yield StagedCheckpoint(source=source, path=source, staged=False)
        else:
            yield stage(source, into, endpoint_url=endpoint_url, progress=progress)
