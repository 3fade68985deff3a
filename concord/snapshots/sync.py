"""Replicate a snapshot from one store to many: only missing chunks move, each verified.

For every target (a few at a time): take its garbage-collection lease, read its ref (the
compare-and-swap's expected value) and ask which chunks it already holds (an S3 target answers
from a listing). Then each chunk some target lacks is read from the source once (re-hashed as it
is read) and written to every target that lacks it, on one pool of at most
:data:`MAX_COPY_WORKERS` threads whatever the number of targets; all leases are renewed by one
heartbeat thread. Last, for each target, the manifest is written after every chunk it names, and
the ref moves. A target that fails is reported and gets nothing more; the others go on.
Between stores of one encoding (:attr:`~concord.stores.config.Encoding.identity`) a chunk moves
as it is stored (compressed, encrypted), decoded and hashed once as it is read; between stores
of different encodings it is decoded, checked and encoded again, once per encoding. A chunk
stored as a delta moves as the delta to a target that holds its base chunk whole, and whole to
any other (never a delta whose base the target lacks: a run killed midway leaves nothing that
does not decode). A run killed at any point leaves the target consistent; re-running sends only what is
still missing. A ref moved by someone else meanwhile is reported, never overwritten. Each target is
written under a garbage-collection lease, from its plan to its ref: the chunks the plan finds
present must still be there when the ref moves.

The root's signature documents travel with it (:func:`copy_signatures`), and none is ever written
over a target's copy unless it verifies: with ``check_signature`` (the trust wing's
:func:`concord.trust.copying.signature_problem`, which the CLI and the tier commands pass), a
document that does not parse or whose signature does not verify over this root is not copied at
all and the target keeps what it held; without one, a document the target holds is never replaced.
Either way each document left behind is reported (:attr:`TargetResult.signatures_skipped`).
"""

from __future__ import annotations

import itertools
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import BinaryIO

from concord.errors import ChunkNotFoundError, IntegrityError, ReplicationError
from concord.hashing import chunk_id
from concord.progress import Progress, ensure
from concord.snapshots.manifest import Manifest
from concord.snapshots.refs import resolve_root
from concord.stores.base import Store, check_writable_ref
from concord.stores.leases import write_lease

HAS_BATCH = 1000
#: threads copying chunks, for any number of targets (each reads a chunk once and writes it to
#: every target that lacks it)
MAX_COPY_WORKERS = 32
#: the most chunks one task of a sync's pool copies in a row
MAX_RUN = 32
#: a copy between folder stores of at least this many chunks also runs in worker processes, in
#: slices of this many chunks, on at most this many processes beside this one (and one a core);
#: the environment variable sets the most (0: threads only)
PROCESS_MIN_CHUNKS = 4096
PROCESS_SLICE = 512
MAX_PROCESSES = 8
PROCESSES_ENV = "CONCORD_COPY_PROCESSES"
#: the longest a worker process may take over one slice before its slice is copied here instead
SLICE_DEADLINE = 600
#: how long a worker process has to exit once told to
WORKER_EXIT_DEADLINE = 30
#: targets planned (lease, ref, which chunks they lack) and finished (manifest, signatures, ref)
#: at once
TARGET_WORKERS = 8
#: why a signature document must not be written (None: it holds): (store holding the root's bytes,
#: root, document key, bundle bytes, the root's manifest, whether it would replace one the target
#: holds); :func:`concord.trust.copying.signature_problem` is one
SignatureCheck = Callable[[Store, str, str, bytes, Manifest, bool], str | None]


@dataclass(frozen=True)
class TargetResult:
    """What a sync did to one target: the root it now holds, the chunks and bytes sent and already
    there, the ref moved, signatures left behind."""

    store: str
    root: str
    chunks_sent: int
    bytes_sent: int
    chunks_present: int
    ref: str | None = None
    ref_version: int | None = None
    previous: str | None = None
    #: raw bytes the chunks sent stand for (``bytes_sent`` is what crossed, as the target stores it)
    raw_bytes_sent: int = 0
    #: one line per signature document of the root not copied (the target keeps what it held)
    signatures_skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """Plain JSON types (a task's result and an event's payload are JSON)."""
        return dict(self.__dict__, signatures_skipped=list(self.signatures_skipped))


@dataclass
class _Plan:
    target: Store
    expected: str | None
    missing: list[str]
    present: int
    lease: ExitStack  # holds the target's lease until its ref has moved


def missing_chunks(target: Store, ids: list[str]) -> list[str]:
    """The ids ``target`` lacks, asked in batches."""
    out: list[str] = []
    for i in range(0, len(ids), HAS_BATCH):
        batch = ids[i : i + HAS_BATCH]
        have = target.has_chunks(batch)
        out.extend(c for c in batch if c not in have)
    return out


def copy_chunks(
    source: Store,
    target: Store,
    ids: list[str],
    progress: Progress,
    *,
    overwrite: bool = False,
    dtypes: dict[str, str] | None = None,
) -> tuple[int, int, int]:
    """Copy ``ids`` from ``source`` to ``target``, each verified on the way; (chunks, bytes as
    stored in the target, raw bytes) written. ``dtypes`` (chunk id → the dtype of its tensor) let
    a compressed target choose its codec."""
    tallies, failures = fan_out(source, [(target, ids)], progress, overwrite=overwrite, dtypes=dtypes)
    if failures:
        raise failures[0]
    return tallies[0]


def fan_out(
    source: Store,
    wants: list[tuple[Store, list[str]]],
    progress: Progress,
    *,
    overwrite: bool = False,
    dtypes: dict[str, str] | None = None,
) -> tuple[list[tuple[int, int, int]], dict[int, BaseException]]:
    """Copy to each ``(target, ids)`` of ``wants`` the chunks it lacks, reading each chunk from
    ``source`` once, however many targets want it, and writing it to each of them, on one pool
    of at most :data:`MAX_COPY_WORKERS` threads. Each chunk is hashed as it is read (between
    stores of one encoding, decoded and hashed once, then sent as stored); a chunk is encoded once
    per encoding it is sent in. Per target (in ``wants``' order): (chunks, bytes as stored, raw
    bytes) written; and {index in ``wants``: the error that stopped that target} — a target that
    fails gets nothing more, the others go on.

    Between folder stores, many chunks are also copied by worker processes
    (:func:`copy_processes`, :mod:`concord.snapshots.copyworker`), so that the interpreter's work
    for each chunk runs on every core, not on one at a time."""
    procs = copy_processes(source, wants)
    if procs:
        return _fan_out_processes(source, wants, progress, procs, overwrite=overwrite, dtypes=dtypes or {})
    return _fan_out_threads(source, wants, progress, overwrite=overwrite, dtypes=dtypes)


def copy_processes(source: Store, wants: list[tuple[Store, list[str]]]) -> int:
    """How many worker processes copy beside this process's threads: none but between folder
    stores (an object store waits on the network, which threads overlap), and only for at least
    :data:`PROCESS_MIN_CHUNKS` chunks on a machine of more than one core: one per core (the
    kernel's share of each chunk, creating and writing its file, leaves a core idle at times),
    at most :data:`MAX_PROCESSES`, or what ``CONCORD_COPY_PROCESSES`` says (0: threads only)."""
    from concord.stores.local import LocalDirStore

    if sum(len(ids) for _, ids in wants) < PROCESS_MIN_CHUNKS:
        return 0
    if type(source) is not LocalDirStore or not all(type(t) is LocalDirStore for t, _ in wants):
        return 0  # a store of its own kind (a subclass) may not travel as its settings
    most = MAX_PROCESSES
    said = os.environ.get(PROCESSES_ENV, "").strip()
    if said:
        if not said.isdigit():
            raise ValueError(f"{PROCESSES_ENV} must be a whole number of worker processes (0: threads only), got {said!r}")
        most = int(said)
    cores = os.cpu_count() or 1
    return 0 if cores < 2 else max(0, min(most, cores))


def copy_jobs(
    source: Store, targets: list[Store], jobs: list[tuple[str, list[int]]], overwrite: bool, dtypes: dict[str, str]
) -> tuple[list[tuple[int, int, int]], list[int], int]:
    """Copy ``jobs`` (chunk id, the indexes in ``targets`` that lack it) on this process's
    threads and flush every target: per target (chunks, bytes as stored, raw bytes) written, the
    targets that failed, and the bytes done (what a worker process answers its parent)."""
    done = _Count()
    tallies, failures = _fan_out_threads(source, _per_target(targets, jobs), done, overwrite=overwrite, dtypes=dtypes)
    failed = set(failures)
    for i, t in enumerate(targets):
        if i not in failed:
            try:
                t.flush()
            except Exception:  # noqa: BLE001 (the parent copies this share again, and flushes it)
                failed.add(i)
    return tallies, sorted(failed), done.n


def _by_chunk(wants: list[tuple[Store, list[str]]]) -> dict[str, list[int]]:
    """Chunk id -> the indexes in ``wants`` of the targets that lack it (in the first's order)."""
    wanted: dict[str, list[int]] = {}
    for i, (_, ids) in enumerate(wants):
        for cid in ids:
            wanted.setdefault(cid, []).append(i)
    return wanted


def _per_target(targets: list[Store], jobs: list[tuple[str, list[int]]]) -> list[tuple[Store, list[str]]]:
    """``jobs`` (chunk id, the indexes in ``targets`` that lack it) as :func:`fan_out`'s ``wants``."""
    wants: list[tuple[Store, list[str]]] = [(t, []) for t in targets]
    for cid, idx in jobs:
        for i in idx:
            wants[i][1].append(cid)
    return wants


class _Count:
    """A progress that counts the bytes done (a worker process's, for its parent's bar)."""

    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def start(self, total: int, desc: str) -> None:
        pass

    def advance(self, n: int) -> None:
        with self._lock:
            self.n += n

    def close(self) -> None:
        pass


_FRAME_LENGTH = struct.Struct(">Q")


def write_frame(out: BinaryIO, obj: object) -> None:
    """One frame between a copy and its worker process: 8 bytes of length, then a pickle."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_FRAME_LENGTH.pack(len(data)) + data)
    out.flush()


def read_frame(inp: BinaryIO) -> object:
    """The next frame's object (one :func:`write_frame` of the other end made); None at the end."""
    head = inp.read(_FRAME_LENGTH.size)
    if len(head) < _FRAME_LENGTH.size:
        return None
    (n,) = _FRAME_LENGTH.unpack(head)
    data = inp.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)  # noqa: S301 (made by this process's parent or child, never a user's bytes)


class _Worker:
    """One worker process (``python -m concord.snapshots.copyworker``) and its pipes."""

    def __init__(self, source: Store, targets: list[Store], overwrite: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "concord.snapshots.copyworker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # a worker that fails says nothing: its parent copies its slice, and reports any error
        )
        write_frame(self.proc.stdin, (source, targets, overwrite))

    def run(self, jobs: list[tuple[str, list[int]]], dtypes: dict[str, str]):
        """The worker's answer to ``jobs``; :class:`OSError` if it went away or said nothing in time."""
        write_frame(self.proc.stdin, (jobs, dtypes))
        ready, _, _ = select.select([self.proc.stdout], [], [], SLICE_DEADLINE)
        if not ready:
            raise OSError(f"a copy worker said nothing in {SLICE_DEADLINE} s")
        answer = read_frame(self.proc.stdout)
        if answer is None:
            raise OSError("a copy worker ended before it answered")
        return answer

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # its end of input: it exits
            self.proc.wait(timeout=WORKER_EXIT_DEADLINE)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self.proc.stdout.close()


def _fan_out_processes(
    source: Store,
    wants: list[tuple[Store, list[str]]],
    progress: Progress,
    procs: int,
    *,
    overwrite: bool,
    dtypes: dict[str, str],
) -> tuple[list[tuple[int, int, int]], dict[int, BaseException]]:
    """:func:`fan_out` with ``procs`` worker processes beside this process's threads, all taking
    slices of :data:`PROCESS_SLICE` chunks from one queue. A slice a worker could not finish (it
    went away, or a target failed there) is copied again here: what it wrote is found there and
    skipped, and an error is raised as a copy in this process raises it, so the result is what
    threads alone give."""
    wanted = _by_chunk(wants)
    targets = [t for t, _ in wants]
    tallies = [[0, 0, 0] for _ in wants]
    failures: dict[int, BaseException] = {}
    lock = threading.Lock()
    items = iter(wanted.items())
    stop = threading.Event()  # a copy raised (an interrupt): hand out no more
    errors: list[BaseException] = []  # what a driving thread raised

    def take() -> list[tuple[str, list[int]]] | None:
        """The next slice, to the targets that have not failed (None: no chunk is left)."""
        while not stop.is_set():
            with lock:
                batch = list(itertools.islice(items, PROCESS_SLICE))
                if not batch:
                    return None
                jobs = [(cid, [i for i in idx if i not in failures]) for cid, idx in batch]
            jobs = [job for job in jobs if job[1]]
            if jobs:
                return jobs
        return None

    def add(counts) -> None:
        with lock:
            for t, c in zip(tallies, counts):
                t[0], t[1], t[2] = t[0] + c[0], t[1] + c[1], t[2] + c[2]

    def here(jobs: list[tuple[str, list[int]]]) -> None:
        counts, failed = _fan_out_threads(source, _per_target(targets, jobs), progress, overwrite=overwrite, dtypes=dtypes)
        add(counts)
        with lock:
            for i, exc in failed.items():
                failures.setdefault(i, exc)

    def drive() -> None:
        """Feed one worker process slices until none is left (or it fails: then copy here)."""
        try:
            drive_one()
            while (jobs := take()) is not None:
                here(jobs)
        except BaseException as exc:  # noqa: BLE001 (the whole copy fails with it, never a slice left out)
            stop.set()
            errors.append(exc)

    def drive_one() -> None:
        try:
            worker = _Worker(source, targets, overwrite)
        except Exception:  # noqa: BLE001 (no process to be had: this thread copies here)
            return
        try:
            while (jobs := take()) is not None:
                try:
                    counts, failed, done = worker.run(jobs, {cid: dtypes[cid] for cid, _ in jobs if cid in dtypes})
                except Exception:  # noqa: BLE001 (the worker is gone: this slice and the rest are copied here)
                    here(jobs)
                    break
                add(counts)
                progress.advance(done)
                if failed:  # again here, to those targets only: the error as this process sees it
                    here([(cid, [i for i in idx if i in failed]) for cid, idx in jobs if any(i in failed for i in idx)])
        finally:
            worker.close()

    drivers = [threading.Thread(target=drive, name=f"concord-copy-process-{k}", daemon=True) for k in range(procs)]
    for d in drivers:
        d.start()
    try:
        while (jobs := take()) is not None:
            here(jobs)
    except BaseException:
        stop.set()
        raise
    finally:
        for d in drivers:
            d.join()
    if errors:
        raise errors[0]
    return [(t[0], t[1], t[2]) for t in tallies], failures


def _fan_out_threads(
    source: Store,
    wants: list[tuple[Store, list[str]]],
    progress: Progress,
    *,
    overwrite: bool = False,
    dtypes: dict[str, str] | None = None,
) -> tuple[list[tuple[int, int, int]], dict[int, BaseException]]:
    """:func:`fan_out` on this process's threads."""
    dtypes = dtypes or {}
    wanted = _by_chunk(wants)
    if not wanted:
        return [(0, 0, 0) for _ in wants], {}
    source_enc = source.encoding()
    encodings = [target.encoding() for target, _ in wants]
    # the stored form travels between stores of the source's encoding (when it is not bare bytes)
    as_stored = [source_enc.framed and enc.identity == source_enc.identity for enc in encodings]
    tallies = [[0, 0, 0] for _ in wants]
    failures: dict[int, BaseException] = {}
    lock = threading.Lock()

    def fail(i: int, exc: BaseException) -> None:
        with lock:
            failures.setdefault(i, exc)

    whole: dict[tuple[int, str], bool] = {}  # (target, base object name): held there whole

    def holds_whole(i: int, name: str) -> bool:
        with lock:
            known = whole.get((i, name))
        if known is None:
            known = wants[i][0].holds_whole(name)
            with lock:
                whole[i, name] = known
        return known

    def one(cid: str) -> None:
        with lock:
            todo = [i for i in wanted[cid] if i not in failures]
        if not todo:
            return
        try:
            blob = data = base = None
            if any(as_stored[i] for i in todo):
                blob = source.read_chunk_stored(cid)
                if blob is None:
                    raise ChunkNotFoundError(source.uri, cid)
                # a delta travels as it is to a target holding its base whole, else whole
                base = source_enc.base_of(cid, memoryview(blob)[: source_enc.HEAD_BYTES])
                data = source.decode_stored(cid, blob)
                actual = chunk_id(data)
                if actual != cid:
                    raise IntegrityError(f"chunk {cid} in {source.uri}", cid, actual)
            else:  # transient: written to every target before this thread reads another chunk
                data = source.read_chunk(cid, verify=True)
        except Exception as exc:  # noqa: BLE001 (every target that wanted it fails with it)
            for i in todo:
                fail(i, exc)
            return
        raw = len(data)
        encoded: dict[str, bytes] = {}  # one encoding per encoding identity, shared by its targets
        for i in todo:
            target, enc = wants[i][0], encodings[i]
            try:
                if as_stored[i] and (base is None or holds_whole(i, base)):
                    stored = len(blob) if target.put_chunk_stored(cid, blob, overwrite=overwrite, checked_length=raw) else None
                elif as_stored[i]:  # the target lacks the base (or holds it as a delta): the chunk goes whole
                    stored = target.put_chunk_sized(cid, data, verify=False, overwrite=overwrite, dtype=dtypes.get(cid))
                elif not enc.framed:  # stored as it is
                    stored = raw if target.put_chunk(cid, data, verify=False, overwrite=overwrite) else None
                elif sum(1 for j in todo if encodings[j].identity == enc.identity) == 1:
                    stored = target.put_chunk_sized(cid, data, verify=False, overwrite=overwrite, dtype=dtypes.get(cid))
                else:
                    if enc.identity not in encoded:
                        encoded[enc.identity] = bytes(enc.encode_chunk(cid, data, dtypes.get(cid)))
                    blob_i = encoded[enc.identity]
                    stored = len(blob_i) if target.put_chunk_stored(cid, blob_i, overwrite=overwrite, checked_length=raw) else None
            except Exception as exc:  # noqa: BLE001 (this target stops; the others go on)
                fail(i, exc)
                continue
            progress.advance(raw)
            if stored is not None:
                with lock:
                    t = tallies[i]
                    t[0], t[1], t[2] = t[0] + 1, t[1] + stored, t[2] + raw

    # as many as the busiest side likes: a folder reads fast, an object store waits on each request
    workers = max(1, min(MAX_COPY_WORKERS, len(wanted), max(source.parallelism, *(t.parallelism for t, _ in wants))))
    # a run of chunks a task: one future and one hand-over between threads for a run of small
    # chunks, not each (a folder of 20,000 small files), while a few chunks still give every
    # thread work
    run = max(1, min(MAX_RUN, len(wanted) // (8 * workers)))

    def some(cids: list[str]) -> None:
        for cid in cids:
            one(cid)

    with ThreadPoolExecutor(workers, thread_name_prefix="concord-copy") as pool:
        # a few runs queued per thread, never one future per chunk of the snapshot at once
        # (100,000 of them hold more memory than the manifest)
        pending: deque = deque()
        ids = iter(wanted)
        while batch := list(itertools.islice(ids, run)):
            if len(pending) >= 4 * workers:
                pending.popleft().result()
            pending.append(pool.submit(some, batch))
        for f in pending:
            f.result()
    return [tuple(t) for t in tallies], failures


def chunk_dtypes(manifest: Manifest) -> dict[str, str]:
    """Chunk id → the dtype of the tensor it belongs to (tensor chunks only)."""
    return {cid: p.dtype for f in manifest.files for p in f.parts if p.dtype for cid in p.chunk_ids()}


@dataclass(frozen=True)
class SignatureCopy:
    """What :func:`copy_signatures` did: documents written, and one line per document left behind."""

    written: int
    skipped: tuple[str, ...] = ()


def copy_signatures(
    source: Store,
    target: Store,
    root: str,
    *,
    check: SignatureCheck | None = None,
    manifest: Manifest | None = None,
) -> SignatureCopy:
    """Copy the signature documents of ``root`` (``signatures/<root>/*``) that the target lacks or
    holds differently, never replacing one with a document that does not verify: with ``check``,
    a document it finds a problem with is not written (the target keeps its own); without one, only
    documents the target lacks are written. ``manifest`` is the root's (read from ``source`` if not
    given, only when ``check`` needs it)."""
    written, skipped = 0, []
    for key in source.list_documents(f"signatures/{root}"):
        data = source.get_document(key)
        if data is None:
            continue
        held = target.get_document(key)
        if held == data:
            continue
        if check is None:
            if held is None:
                target.put_document(key, data, overwrite=False)
                written += 1
            else:
                skipped.append(f"{key}: kept {target.uri}'s copy, which differs from {source.uri}'s (no signature check was given to tell which one verifies)")
            continue
        if manifest is None:
            manifest = Manifest.from_json(source.get_manifest_bytes(root), expected_root=root, verify=True)
        problem = check(source, root, key, data, manifest, held is not None)
        if problem is not None:
            kept = f"kept {target.uri}'s copy" if held is not None else "not copied"
            skipped.append(f"{key} from {source.uri}: {kept}, {problem}")
            continue
        target.put_document(key, data, overwrite=True)
        written += 1
    return SignatureCopy(written, tuple(skipped))


def replicate(
    source: Store,
    targets: list[Store],
    *,
    ref: str | None = None,
    root: str | None = None,
    progress: Progress | None = None,
    check_root: Callable[[Store, str], object] | None = None,
    check_signature: SignatureCheck | None = None,
) -> list[TargetResult]:
    """Bring every target up to the snapshot named by ``ref`` (or ``root``) in ``source``.
    ``check_root`` (a trust policy's ``require``) may refuse the root before anything moves; the
    root's signature documents (``signatures/<root>/``) travel with it, before the ref moves, each
    checked by ``check_signature`` (see :func:`copy_signatures`: a document that does not verify is
    never written over a target's)."""
    if not targets:
        raise ValueError("replicate: name at least one target store")
    if (ref is None) == (root is None):
        raise ValueError("replicate: give exactly one of ref= or root=")
    ref = check_writable_ref(ref) if ref is not None else None  # "" is a mistake, not "no ref"
    root = resolve_root(source, ref or root)
    if check_root is not None:
        check_root(source, root)  # refuses (raises) before any target is touched
    manifest_bytes = source.get_manifest_bytes(root)
    manifest = Manifest.from_json(manifest_bytes, expected_root=root, verify=True)
    lengths = manifest.chunk_lengths()
    ids = list(lengths)
    dtypes = chunk_dtypes(manifest)

    what = f"sync of {root[:12]} from {source.uri}" + (f" to ref {ref}" if ref else "")
    check_signature = _once_each(check_signature) if check_signature is not None else None

    def plan(target: Store) -> _Plan:
        with ExitStack() as lease:
            lease.enter_context(write_lease(target, what))
            expected = None
            if ref:
                current = target.read_ref(ref)
                expected = current.root if current else None
            missing = missing_chunks(target, ids)
            return _Plan(target, expected, missing, len(ids) - len(missing), lease.pop_all())

    plans, failures = _each(targets, plan)
    prog = ensure(progress)

    def finish(job: tuple[_Plan, tuple[int, int, int]]) -> TargetResult:
        p, (sent, nbytes, raw) = job
        with p.lease:
            p.target.put_manifest(root, manifest_bytes)
            signatures = copy_signatures(source, p.target, root, check=check_signature, manifest=manifest)
            version = None
            if ref:
                version = p.target.cas_ref(ref, p.expected, root, f"sync from {source.uri}").version
        return TargetResult(p.target.uri, root, sent, nbytes, p.present, ref, version, p.expected, raw, signatures.skipped)

    try:
        prog.start(sum(lengths[c] for p in plans for c in p.missing), "sync")
        # each missing chunk read once, written to every target that lacks it
        tallies, broken = fan_out(source, [(p.target, p.missing) for p in plans], prog, dtypes=dtypes)
        for i, exc in broken.items():
            failures[plans[i].target.uri] = exc
        jobs = [(p, t) for i, (p, t) in enumerate(zip(plans, tallies)) if i not in broken]
        results, more = _each(jobs, finish, key=lambda job: job[0].target)
    finally:
        for p in plans:
            p.lease.close()  # a no-op for the ones their run released
        prog.close()
    failures.update(more)
    if failures:
        if len(targets) == 1:
            raise next(iter(failures.values()))
        raise ReplicationError(results, failures)
    return results


def _once_each(check: SignatureCheck) -> SignatureCheck:
    """``check``, asked once per document however many targets want it (a root-less bundle's
    digests are a read of the whole root)."""
    answers: dict[tuple[str, bytes, bool], str | None] = {}
    lock = threading.Lock()

    def once(store: Store, root: str, key: str, data: bytes, manifest: Manifest, replacing: bool) -> str | None:
        with lock:
            if (key, data, replacing) not in answers:
                answers[key, data, replacing] = check(store, root, key, data, manifest, replacing)
            return answers[key, data, replacing]

    return once


def _each(items, fn, key=lambda x: x):
    """Run ``fn`` on every item, :data:`TARGET_WORKERS` at a time; (results in order, {store uri: exception})."""
    results, failures = [], {}
    with ThreadPoolExecutor(max(1, min(TARGET_WORKERS, len(items))), thread_name_prefix="concord-target") as pool:
        futures = [(item, pool.submit(fn, item)) for item in items]
        for item, fut in futures:
            try:
                results.append(fut.result())
            except Exception as exc:  # collected per target, raised together below
                failures[key(item).uri] = exc
    return results, failures
