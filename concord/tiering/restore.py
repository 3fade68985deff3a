"""Restore a tiered checkpoint from the nearest tier that holds it, archive tiers included.

From a tier in an archive storage class (GLACIER, DEEP_ARCHIVE) the chunks are first restored by
the archive: restore requests are sent for the archived ones, then their states are polled until
every one is readable (or the timeout passes; the requests stay in place, so running again later
waits only for what is left). The manifest is read from the same tier (manifests are never
archived). The snapshot is then written out with :func:`concord.snapshots.restore.restore`, and every file
written is read back and re-hashed against the manifest before the restore counts as done.

Each restore leaves a small JSON record in the hot store (``tier-restores/<namespace>/...``):
where the checkpoint came from and how long it took, the numbers a recovery-time objective is
checked against.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from concord.errors import (
    CheckpointNotFoundError,
    ChunkNotFoundError,
    ConcordError,
    IntegrityError,
    RestoreTargetError,
    RestoreTimeoutError,
    TierCopyNotFoundError,
)
from concord.progress import Progress, ensure
from concord.snapshots.manifest import Manifest
from concord.stores.base import ARCHIVED, AVAILABLE, MISSING, Store, validate_segment
from concord.tiering.catalog import utc_iso
from concord.tiering.policy import TIERS, TierPolicy

log = logging.getLogger(__name__)

RESTORE_RECORD_FORMAT = "concord/tier-restore@1"
#: how many chunks one ``chunk_states`` / ``request_restore`` call is given at a time
_BATCH = 1000
#: how much of a restored file is read at once when checking it
_READ_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class TierRestoreResult:
    """What :func:`restore_checkpoint` did: checkpoint ``name`` restored from ``tier`` into
    ``path``, and how long it took, archive waits included."""

    name: str
    root: str
    tier: str
    store: str
    seconds: float  # wall time of the whole restore, waiting for the archive included
    wait_seconds: float  # of which waiting for the archive to make chunks readable
    restore_requests: int
    bytes: int
    files: int
    path: str
    bytes_per_second: float
    record: str | None = None  # the document written to the hot store, if one was
    #: the folder already held exactly this root (every file's size and chunk ids checked):
    #: nothing was waited for, written or recorded
    unchanged: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# --------------------------------------------------------------------------- helpers


class _Stores:
    """The tiers' stores, given or opened on first use (a restore from cold need not reach warm)."""

    def __init__(self, policy: TierPolicy, given: dict[str, Store] | None) -> None:
        self.policy = policy
        self.given = dict(given or {})

    def __getitem__(self, tier: str) -> Store:
        if tier not in self.given:
            self.given[tier] = self.policy.tier(tier).open()
        return self.given[tier]


def compact_utc(ts: float | None = None) -> str:
    """``20250102T030405.123456Z``: a UTC time that sorts as text and fits a document key."""
    when = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return when.strftime("%Y%m%dT%H%M%S.%fZ")


def put_unique_document(store: Store, prefix: str, stem: str, data: bytes) -> str:
    """Write ``prefix/stem.json`` (or ``stem-2.json``... if taken) without overwriting; the key."""
    base = stem[:119]  # a key segment holds at most 128 characters, ".json" and "-NN" included
    for n in range(1, 100):
        key = f"{prefix}/{base if n == 1 else f'{base}-{n}'}.json"
        if store.put_document(key, data, overwrite=False):
            return key
    raise FileExistsError(f"{prefix}/{stem}.json and 98 alternatives already exist in {store.uri}")


def _chunk_states(store: Store, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i in range(0, len(ids), _BATCH):
        out.update(store.chunk_states(ids[i : i + _BATCH]))
    return out


def _request(store: Store, ids: list[str], policy: TierPolicy) -> int:
    n = 0
    for i in range(0, len(ids), _BATCH):
        n += store.request_restore(ids[i : i + _BATCH], days=policy.restore_days, tier=policy.restore_tier)
    return n


def wait_for_archive(
    store: Store,
    ids: list[str],
    policy: TierPolicy,
    *,
    timeout: float,
    poll: float,
    progress: Progress | None = None,
    sleep=time.sleep,
    clock=time.monotonic,
) -> tuple[int, float]:
    """Make every chunk in ``ids`` readable in an archive store; ``(restore requests, seconds waited)``.

    Seconds waited is 0.0 when every chunk is readable at the first look (nothing was waited for).

    Archived chunks get a restore request (``policy.restore_days`` / ``restore_tier``), then the
    states are polled every ``poll`` seconds. Progress counts objects (one per chunk). Raises
    :class:`RestoreTimeoutError` after ``timeout`` seconds with chunks still restoring, and
    :class:`ChunkNotFoundError` for a chunk the store does not hold at all.
    """
    ids = list(dict.fromkeys(ids))
    t0 = clock()
    prog = ensure(progress)
    prog.start(len(ids), "archive restore")
    try:
        states = _chunk_states(store, ids)
        missing = [c for c in ids if states.get(c, MISSING) == MISSING]
        if missing:
            raise ChunkNotFoundError(store.uri, missing[0])
        pending = [c for c in ids if states[c] != AVAILABLE]
        prog.advance(len(ids) - len(pending))
        if not pending:  # every chunk already readable: nothing was waited for
            return 0, 0.0
        requests = _request(store, [c for c in pending if states[c] == ARCHIVED], policy)
        while pending:
            elapsed = clock() - t0
            if elapsed >= timeout:
                raise RestoreTimeoutError(store.uri, len(pending), len(ids), elapsed)
            sleep(max(0.0, min(poll, timeout - elapsed)))
            states = _chunk_states(store, pending)
            missing = [c for c in pending if states.get(c, MISSING) == MISSING]
            if missing:
                raise ChunkNotFoundError(store.uri, missing[0])
            # a restored copy that expired before we got to it is archived again: ask once more
            requests += _request(store, [c for c in pending if states[c] == ARCHIVED], policy)
            still = [c for c in pending if states[c] != AVAILABLE]
            prog.advance(len(pending) - len(still))
            pending = still
        return requests, clock() - t0
    finally:
        prog.close()


def check_restored(manifest: Manifest, out: str, *, progress: Progress | None = None) -> None:
    """Read every restored file back and re-hash it chunk by chunk against ``manifest``, on one
    thread per core (the reads come from the page cache; hashing is the cost).

    Raises :class:`IntegrityError` naming the first file whose size or bytes differ.
    """
    from concurrent.futures import ThreadPoolExecutor

    from concord.hashing import chunk_id
    from concord.snapshots.manifest import safe_relpath

    jobs = []
    for f in manifest.files:
        path = os.path.join(out, *safe_relpath(f.path).split("/"))
        try:
            size = os.path.getsize(path)
        except OSError:
            raise IntegrityError(f"restored file {path}", f"{f.size} bytes", "no such file") from None
        if size != f.size:
            raise IntegrityError(f"restored file {path}", f"{f.size} bytes", f"{size} bytes")
        for p in f.parts:
            for cid, offset, length in p.chunk_spans(manifest.chunk_size):
                jobs.append((path, cid, offset, length))

    prog = ensure(progress)
    prog.start(manifest.total_bytes, "check restore")

    def check(job) -> None:
        path, cid, offset, length = job
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        actual = chunk_id(data) if len(data) == length else f"{len(data)} bytes"
        if actual != cid:
            raise IntegrityError(f"restored file {path} (bytes {offset}-{offset + length})", cid, actual)
        prog.advance(length)

    try:
        with ThreadPoolExecutor(max(2, os.cpu_count() or 2), thread_name_prefix="concord-check") as pool:
            for _ in pool.map(check, jobs):
                pass
    finally:
        prog.close()


def _target_free(out: str) -> bool:
    """Whether ``out`` is free to restore into (absent, or an empty folder); False for a folder
    holding something (which may be this very checkpoint: see :func:`restore_checkpoint`);
    :class:`RestoreTargetError` for anything else there."""
    if not os.path.exists(out):
        return True
    if not os.path.isdir(out):
        raise RestoreTargetError(out)
    return not os.listdir(out)


def find_copy(policy: TierPolicy, name: str, stores, tier: str | None = None) -> tuple[str, str]:
    """``(tier, root)`` of the copy to restore: ``tier``'s, or the nearest (hot, warm, cold).

    A tier whose store cannot be read is passed over when looking for the nearest copy; if no
    tier answers at all, the first such error is raised.
    """
    ref = policy.ref(name)
    if tier is not None:
        r = stores[tier].read_ref(ref)
        if r is None:
            held = []
            for t in TIERS:
                if t != tier:
                    try:
                        if stores[t].read_ref(ref) is not None:
                            held.append(t)
                    except ConcordError:
                        pass
            raise TierCopyNotFoundError(name, policy.namespace, tier, held)
        return tier, r.root
    errors: list[ConcordError] = []
    for t in TIERS:
        try:
            r = stores[t].read_ref(ref)
        except ConcordError as exc:
            log.warning("tier %s unreadable while looking for %s: %s", t, name, exc)
            errors.append(exc)
            continue
        if r is not None:
            return t, r.root
    if len(errors) == len(TIERS):
        raise errors[0]
    raise CheckpointNotFoundError(name, policy.namespace)


# --------------------------------------------------------------------------- restore


def restore_checkpoint(
    policy: TierPolicy,
    name: str,
    out_dir: str | os.PathLike,
    *,
    tier: str | None = None,
    timeout: float | None = None,
    poll: float | None = None,
    progress: Progress | None = None,
    stores: dict[str, Store] | None = None,
    record: bool = True,
    check_root: Callable[[Store, str], object] | None = None,
) -> TierRestoreResult:
    """Restore checkpoint ``name`` into ``out_dir`` (which must not exist, or be empty).

    A folder that already holds exactly the copy's root (every file's size and every chunk's
    BLAKE3, nothing more) is left as it is: the result says ``unchanged``, nothing is asked of an
    archive, written or recorded, so a retried restore succeeds. A folder holding anything else is
    refused (:class:`RestoreTargetError`) before any archive wait, and left untouched.

    From ``tier`` when given, else from the nearest tier holding it (hot, then warm, then cold).
    From an archive tier, waits for the archive restore first (``timeout`` / ``poll`` default to
    the policy's ``restore.timeout`` / ``restore.poll``). The result is re-read and re-hashed;
    ``out_dir`` is left only when it holds the whole checkpoint, byte for byte. ``check_root`` (a
    trust policy's ``restore_check``) may refuse the copy's root before anything is asked of an
    archive or written.
    """
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore

    t0 = time.monotonic()
    started = utc_iso()
    policy.validate()
    validate_segment(name, "checkpoint name")
    if tier is not None:
        policy.tier(tier)  # an unknown tier name is refused before anything is read
    timeout = policy.restore_timeout_seconds if timeout is None else float(timeout)
    poll = policy.restore_poll_seconds if poll is None else float(poll)
    if not timeout > 0 or not poll > 0:
        raise ValueError(f"timeout and poll must be positive, got timeout={timeout!r}, poll={poll!r}")
    out = os.path.abspath(os.fspath(out_dir))
    free = _target_free(out)  # a folder holding something is judged once the copy's root is known
    existed = os.path.isdir(out)
    tiers = _Stores(policy, stores)

    chosen, root = find_copy(policy, name, tiers, tier)
    store = tiers[chosen]
    manifest = load_manifest(store, root, verify=True)
    expected = check_root(store, root) if check_root is not None else None  # refuses before any wait or write
    if not free:  # fail now, not after hours of waiting for an archive
        from concord.snapshots.restore import holds_root

        if not holds_root(manifest, out):
            raise RestoreTargetError(out)
        seconds = time.monotonic() - t0
        return TierRestoreResult(
            name=name, root=root, tier=chosen, store=store.uri, seconds=seconds, wait_seconds=0.0, restore_requests=0,
            bytes=manifest.total_bytes, files=manifest.n_files, path=out, bytes_per_second=0.0, unchanged=True,
        )
    requests, waited = 0, 0.0
    if getattr(store, "archive", False):
        requests, waited = wait_for_archive(
            store, list(manifest.chunk_lengths()), policy, timeout=timeout, poll=poll, progress=progress
        )
    done = restore(store, manifest, out, progress=progress, check_root=(lambda _s, _r: expected) if expected else None)
    try:
        check_restored(manifest, done.path, progress=progress)
    except BaseException:
        shutil.rmtree(done.path, ignore_errors=True)
        if existed:
            os.makedirs(done.path, exist_ok=True)
        raise
    seconds = time.monotonic() - t0
    result = TierRestoreResult(
        name=name,
        root=root,
        tier=chosen,
        store=store.uri,
        seconds=seconds,
        wait_seconds=waited,
        restore_requests=requests,
        bytes=done.bytes,
        files=done.files,
        path=done.path,
        bytes_per_second=done.bytes / seconds if seconds > 0 else 0.0,
    )
    if record:
        result = _write_record(policy, tiers, result, started)
    return result


def _write_record(policy: TierPolicy, tiers: _Stores, result: TierRestoreResult, started: str) -> TierRestoreResult:
    """Record the restore in the hot store. A restore that worked is not failed by its record:
    the hot store may well be what is being recovered from."""
    from dataclasses import replace

    doc = {
        "format": RESTORE_RECORD_FORMAT,
        "namespace": policy.namespace,
        "started": started,
        "finished": utc_iso(),
        **{k: v for k, v in result.to_dict().items() if k != "record"},
    }
    try:
        key = put_unique_document(
            tiers["hot"],
            f"tier-restores/{policy.namespace}",
            f"{compact_utc()}-{result.name}",
            json.dumps(doc, indent=1, sort_keys=True).encode(),
        )
    except (ConcordError, OSError) as exc:
        log.warning("restore of %s done, but its record could not be written to the hot store: %s", result.name, exc)
        return result
    return replace(result, record=key)
