"""Tiering: take a finished checkpoint into hot, copy it to warm and cold, demote per policy.

The order of every step is what keeps checkpoints safe:

1. a checkpoint is taken only when complete (a marker, or files that stopped changing and whole
   safetensors files);
2. it is snapshotted into hot, then replicated to warm and cold (only missing chunks move, so
   successive checkpoints of a LoRA run that share a frozen base cost little);
3. a copy is removed from a tier only after every copy that remains has been verified by hash
   (repairing from the copy about to go if needed) and the copy rules still hold afterwards;
4. removing a copy removes its ref; the chunks go later, in garbage collection after a grace period.

A sweep recomputes what each tier should hold from the refs alone, so any run that was killed or
failed half-way (between replicate and delete, or with a store gone) converges on the next one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from concord.errors import (
    CheckpointConflictError,
    ConcordError,
    CopyRuleError,
)
from concord.progress import Progress
from concord.snapshots.ready import checkpoint_ready, checkpoint_time, step_of
from concord.stores.base import Store, check_writable_ref, validate_segment
from concord.stores.leases import write_lease
from concord.tiering.catalog import (
    CopyRecord,
    copies,
    delete_record,
    parse_iso,
    read_records,
    ref_created,
    utc_iso,
    write_record,
)
from concord.tiering.policy import TIERS, TierPolicy

# --------------------------------------------------------------------------- the state of the tiers


@dataclass(frozen=True)
class Checkpoint:
    name: str
    root: str
    created: float
    step: int | None
    bytes: int
    files: int


@dataclass
class TierState:
    """What the three tiers hold for one policy namespace, read from the stores."""

    policy: TierPolicy
    stores: dict[str, Store]
    held: dict[str, dict[str, str]]  # tier -> {name: root}
    records: dict[str, dict[str, CopyRecord]]  # tier -> {name: record}

    @classmethod
    def read(cls, policy: TierPolicy, stores: dict[str, Store] | None = None) -> TierState:
        stores = stores or open_tiers(policy)
        held = {t: copies(stores[t], policy.namespace) for t in TIERS}
        records = {t: read_records(stores[t], policy.namespace) for t in TIERS}
        return cls(policy, stores, held, records)

    def tiers_of(self, name: str) -> set[str]:
        return {t for t in TIERS if name in self.held[t]}

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint any tier holds, newest first (by when it was written, then name)."""
        names = set().union(*(self.held[t] for t in TIERS))
        out = []
        for name in names:
            rec = next((self.records[t][name] for t in TIERS if name in self.records[t] and name in self.held[t]), None)
            root = next(self.held[t][name] for t in TIERS if name in self.held[t])
            if rec is not None:
                created = parse_iso(rec.created) or 0.0
                out.append(Checkpoint(name, root, created, rec.step, rec.bytes, rec.files))
            else:  # copied by a run killed before it wrote the record: the ref's first entry dates it
                t = next(t for t in TIERS if name in self.held[t])
                created = parse_iso(ref_created(self.stores[t], self.policy.namespace, name)) or 0.0
                out.append(Checkpoint(name, root, created, step_of(name), -1, -1))
        out.sort(key=lambda c: (c.created, c.step if c.step is not None else -1, c.name), reverse=True)
        return out

    def record_for(self, name: str) -> CopyRecord | None:
        return next((self.records[t][name] for t in TIERS if name in self.records[t]), None)


def open_tiers(policy: TierPolicy) -> dict[str, Store]:
    return {t: policy.tier(t).open() for t in TIERS}


@contextmanager
def opened_tiers(policy: TierPolicy) -> Iterator[dict[str, Store]]:
    """The three tiers' stores, opened once for everything a run does with them, closed on the way out."""
    opened: dict[str, Store] = {}
    try:
        for t in TIERS:
            opened[t] = policy.tier(t).open()
        yield opened
    finally:
        for store in opened.values():
            store.close()


def desired_tiers(
    policy: TierPolicy, checkpoints: list[Checkpoint], pinned: Iterable[str] = (), now: float | None = None
) -> dict[str, set[str]]:
    """Which tiers each checkpoint belongs in. Cold: all. Warm: what it keeps, plus whatever hot
    keeps and every pinned one. Hot: its newest (or youngest) and the pinned ones (3-2-1)."""
    now = time.time() if now is None else now
    pinned = set(pinned)

    def kept(spec, rank: int, c: Checkpoint) -> bool:
        if spec.keep is not None:
            return rank < spec.keep
        return (now - c.created) < spec.keep_days * 86400

    out = {}
    for rank, c in enumerate(checkpoints):
        want = {"cold"}
        if c.name in pinned or kept(policy.hot, rank, c):
            want |= {"hot", "warm"}
        if kept(policy.warm, rank, c):
            want.add("warm")
        out[c.name] = want
    return out


def pinned_names(policy: TierPolicy, checkpoints: list[Checkpoint], pinned_roots: Iterable[str] = ()) -> set[str]:
    roots = set(pinned_roots)
    return set(policy.pin) | {c.name for c in checkpoints if c.root in roots}


def copy_rule_violations(state: TierState, pinned: Iterable[str] = (), now: float | None = None) -> list[str]:
    """Every checkpoint without the copies the rules demand (empty when all is well)."""
    cps = state.checkpoints()
    pinned = set(pinned)
    want = desired_tiers(state.policy, cps, pinned, now)
    out = []
    for c in cps:
        have = state.tiers_of(c.name)
        if "cold" not in have:
            out.append(f"{c.name}: no cold copy (every checkpoint keeps one)")
        if want[c.name] >= {"hot", "warm", "cold"} and not have >= {"hot", "warm", "cold"}:
            missing = ", ".join(sorted({"hot", "warm", "cold"} - have))
            why = "pinned" if c.name in pinned else "among the newest"
            out.append(f"{c.name}: {why}, needs 3-2-1 but has no {missing} copy")
    return out


# --------------------------------------------------------------------------- verification


def verify_copy(store: Store, root: str) -> str:
    """Check a tier's copy of a snapshot; return how ("blake3" or, for archived chunks, "present").

    Readable copies have every chunk re-read and re-hashed. Chunks in an archive storage class
    cannot be read without a restore: their manifest is verified, and each chunk must be present
    (its bytes were hashed as they were sent; restore drills read them back in full).
    Raises :class:`CopyRuleError` when something is missing or corrupt.
    """
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.verify import verify

    if getattr(store, "archive", False):
        manifest = load_manifest(store, root, verify=True)
        ids = list(manifest.chunk_lengths())
        have = set()
        for i in range(0, len(ids), 1000):
            have |= store.has_chunks(ids[i : i + 1000])
        if len(have) != len(ids):
            raise CopyRuleError("?", store.uri, f"{len(ids) - len(have)} chunk(s) of {root[:12]}… missing in {store.uri}")
        return "present"
    result = verify(store, root=root)
    if not result.ok:
        raise CopyRuleError(
            "?", store.uri, f"{len(result.missing)} missing and {len(result.corrupt)} corrupt chunk(s) of {root[:12]}… in {store.uri}"
        )
    return "blake3"


def _verify_or_repair(store: Store, root: str, repair_from: Store | None) -> tuple[str, int]:
    """Verify ``store``'s copy; if it is damaged and ``repair_from`` is readable, repair it first."""
    try:
        return verify_copy(store, root), 0
    except CopyRuleError:
        if repair_from is None or getattr(repair_from, "archive", False) or getattr(store, "archive", False):
            raise
    from concord.snapshots.verify import verify

    fixed = verify(store, root=root, repair_from=repair_from)
    if not fixed.ok:
        raise CopyRuleError("?", store.uri, f"copy of {root[:12]}… is damaged and could not be repaired")
    return verify_copy(store, root), len(fixed.repaired)


# --------------------------------------------------------------------------- add and sweep


@dataclass
class SweepResult:
    """What :func:`sweep` did: copies made, demotions, repairs and garbage collection, and the
    errors and copy-rule violations left."""

    namespace: str
    copied: list[dict] = field(default_factory=list)
    demoted: list[dict] = field(default_factory=list)
    repaired: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    gc: dict[str, dict] = field(default_factory=dict)
    dry_run: bool = False
    #: signature documents a copy left behind, one line each: they did not verify, and the tier
    #: kept what it held (see :func:`concord.snapshots.sync.copy_signatures`)
    signatures_skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.violations

    def to_dict(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


@dataclass
class AddResult:
    """What :func:`add_checkpoint` did: the checkpoint's root and step, the new bytes each tier
    took, and the sweep after."""

    name: str
    root: str
    step: int | None
    created: str
    bytes: int
    new_bytes: dict[str, int]
    sweep: SweepResult | None
    #: signature documents the copies to warm and cold left behind (see :class:`SweepResult`)
    signatures_skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["sweep"] = self.sweep.to_dict() if self.sweep else None
        return d


def _record(policy: TierPolicy, tier: str, store: Store, c: Checkpoint, *, how: str, verified: bool = True) -> CopyRecord:
    now = utc_iso()
    rec = CopyRecord(
        name=c.name,
        root=c.root,
        tier=tier,
        created=utc_iso(c.created),
        step=c.step,
        bytes=c.bytes,
        files=c.files,
        added=now,
        verified=now if verified else None,
        verified_how=how if verified else None,
        storage_class=getattr(store, "storage_class", None),
    )
    write_record(store, policy.namespace, rec)
    return rec


def add_checkpoint(
    policy: TierPolicy,
    path: str | os.PathLike,
    name: str | None = None,
    *,
    step: int | None = None,
    pinned_roots: Iterable[str] = (),
    sweep_after: bool = True,
    gc: bool = True,
    progress: Progress | None = None,
    stores: dict[str, Store] | None = None,
    sleep=time.sleep,
) -> AddResult:
    """Take a finished checkpoint folder into hot, replicate it to warm and cold, then sweep.

    Idempotent: adding the same folder under the same name again changes nothing; a name already
    tiered with other contents is refused (:class:`CheckpointConflictError`).
    """
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate
    from concord.trust.copying import signature_problem

    policy.validate()
    src = os.path.abspath(os.fspath(path))
    name = name or os.path.basename(src.rstrip(os.sep))
    validate_segment(name, "checkpoint name")
    check_writable_ref(policy.ref(name), "checkpoint name")
    scan = checkpoint_ready(src, marker=policy.marker, settle_seconds=policy.settle_seconds, sleep=sleep)
    stores = stores or open_tiers(policy)
    ref = policy.ref(name)
    existing = {t: stores[t].read_ref(ref) for t in TIERS}
    known = next((r.root for r in existing.values() if r is not None), None)
    hot = stores["hot"]
    # one lease from before the snapshot looks at hot until the ref has moved: a collection in
    # between would see a manifest no ref names yet
    with write_lease(hot, f"tier add {name}"):
        snap = snapshot(src, hot, progress=progress, message=f"checkpoint {name}")
        if known is not None and known != snap.root:
            raise CheckpointConflictError(name, known, snap.root)
        hot.cas_ref(ref, None, snap.root, f"tier add {name}")
    c = Checkpoint(name, snap.root, checkpoint_time(scan), step if step is not None else step_of(name), snap.bytes, snap.files)
    _record(policy, "hot", hot, c, how="on-write")
    new_bytes = {"hot": snap.new_bytes}
    targets = [stores["warm"], stores["cold"]]
    from concord.errors import ReplicationError

    failures = {}
    try:
        results = replicate(hot, targets, ref=ref, progress=progress, check_signature=signature_problem)
    except ReplicationError as exc:
        results, failures = exc.results, exc.failures
    except ConcordError as exc:  # one target only never happens here; kept for clarity
        results, failures = [], {targets[0].uri: exc}
    by_uri = {r.store: r for r in results}
    for t in ("warm", "cold"):
        r = by_uri.get(stores[t].uri)
        if r is not None:
            new_bytes[t] = r.bytes_sent
            _record(policy, t, stores[t], c, how="on-write")
    if failures:
        # What arrived stays (and is recorded); the next add or sweep copies the rest.
        raise next(iter(failures.values()))
    skipped = [f"{t}: {line}" for t in ("warm", "cold") if (r := by_uri.get(stores[t].uri)) for line in r.signatures_skipped]
    result = AddResult(name, snap.root, c.step, utc_iso(c.created), snap.bytes, new_bytes, None, skipped)
    if sweep_after:
        result.sweep = sweep(policy, pinned_roots=pinned_roots, gc=gc, progress=progress, stores=stores)
    return result


def sweep(
    policy: TierPolicy,
    *,
    pinned_roots: Iterable[str] = (),
    dry_run: bool = False,
    gc: bool = True,
    now: float | None = None,
    progress: Progress | None = None,
    stores: dict[str, Store] | None = None,
) -> SweepResult:
    """Bring every tier to what the policy wants: copy what is missing, demote what is not kept
    (only after verifying the copies that stay), collect garbage after the grace period."""
    from concord.snapshots.sync import replicate
    from concord.trust.copying import signature_problem

    policy.validate()
    stores = stores or open_tiers(policy)
    state = TierState.read(policy, stores)
    cps = state.checkpoints()
    pinned = pinned_names(policy, cps, pinned_roots)
    want = desired_tiers(policy, cps, pinned, now)
    result = SweepResult(policy.namespace, dry_run=dry_run)

    # 1. copies that should exist and do not (a run killed half-way, a store that was down)
    for c in cps:
        have = state.tiers_of(c.name)
        for t in ("cold", "warm", "hot"):
            if t in want[c.name] and t not in have:
                source = next((s for s in ("hot", "warm", "cold") if s in have and not getattr(stores[s], "archive", False)), None)
                if source is None:
                    result.errors.append(f"{c.name}: {t} copy missing and only an archived copy is left; run `concord tier restore` first")
                    continue
                if dry_run:
                    result.copied.append({"name": c.name, "tier": t, "from": source, "bytes_sent": None})
                    continue
                try:
                    (r,) = replicate(
                        stores[source], [stores[t]], ref=policy.ref(c.name), progress=progress, check_signature=signature_problem
                    )
                except ConcordError as exc:
                    result.errors.append(f"{c.name}: copying to {t} failed: {exc}")
                    continue
                result.signatures_skipped += [f"{c.name} to {t}: {line}" for line in r.signatures_skipped]
                state.held[t][c.name] = c.root
                have.add(t)
                rec = state.record_for(c.name)
                cp = c if rec is None else Checkpoint(c.name, c.root, c.created, rec.step, rec.bytes, rec.files)
                _record(policy, t, stores[t], cp, how="on-write")
                result.copied.append({"name": c.name, "tier": t, "from": source, "bytes_sent": r.bytes_sent})

    # 2. demotions: hot first, then warm; never cold
    for c in reversed(cps):  # oldest first
        have = state.tiers_of(c.name)
        for t in ("hot", "warm"):
            if t not in have or t in want[c.name]:
                continue
            remaining = sorted(have - {t}, key=TIERS.index)
            if "cold" not in remaining:
                result.errors.append(f"{c.name}: kept in {t}: it has no cold copy yet")
                continue
            if dry_run:
                result.demoted.append({"name": c.name, "tier": t, "verified": remaining, "dry_run": True})
                continue
            try:
                hows = {}
                for other in remaining:
                    how, fixed = _verify_or_repair(stores[other], c.root, stores[t])
                    hows[other] = how
                    if fixed:
                        result.repaired.append({"name": c.name, "tier": other, "chunks": fixed, "from": t})
                    _touch_verified(policy, stores[other], other, c, how, state)
                stores[t].delete_ref(policy.ref(c.name), c.root)
                delete_record(stores[t], policy.namespace, c.name)
            except CopyRuleError as exc:
                result.errors.append(str(CopyRuleError(c.name, t, exc.problem)))
                continue
            except ConcordError as exc:
                result.errors.append(f"{c.name}: kept in {t}: {exc}")
                continue
            del state.held[t][c.name]
            have.discard(t)
            result.demoted.append({"name": c.name, "tier": t, "verified": hows})

    # 3. records whose ref is gone (a run killed between the two deletions)
    if not dry_run:
        for t in TIERS:
            for name in set(state.records[t]) - set(state.held[t]):
                try:
                    delete_record(stores[t], policy.namespace, name)
                except ConcordError:
                    pass

    # 4. garbage: chunks no ref needs any more, after the grace period
    if gc:
        from concord.snapshots.gc import collect_garbage

        for t in TIERS:
            try:
                g = collect_garbage(stores[t], grace_seconds=policy.gc_grace_seconds, dry_run=dry_run, now=now)
                result.gc[t] = g.to_dict()
            except ConcordError as exc:
                result.errors.append(f"garbage collection in {t} skipped: {exc}")

    after = state
    if not dry_run:
        try:
            after = TierState.read(policy, stores)
        except ConcordError as exc:  # a store went away: judge by what this sweep saw and did
            result.errors.append(f"re-reading the tiers after the sweep failed: {exc}")
    result.violations = copy_rule_violations(after, pinned, now)
    return result


def _touch_verified(policy: TierPolicy, store: Store, tier: str, c: Checkpoint, how: str, state: TierState) -> None:
    rec = state.records[tier].get(c.name)
    now = utc_iso()
    if rec is None:
        rec = CopyRecord(c.name, c.root, tier, utc_iso(c.created), c.step, c.bytes, c.files, now, now, how, getattr(store, "storage_class", None))
    else:
        rec = CopyRecord(**{**rec.__dict__, "verified": now, "verified_how": how})
    write_record(store, policy.namespace, rec)
    state.records[tier][c.name] = rec


# --------------------------------------------------------------------------- status


def tier_status(
    policy: TierPolicy,
    *,
    pinned_roots: Iterable[str] = (),
    now: float | None = None,
    stores: dict[str, Store] | None = None,
) -> dict:
    """Each checkpoint × tier: present, verified when and how, bytes, storage class; plus the
    copy-rule violations. Reads only refs and records (no chunk is touched)."""
    policy.validate()
    state = TierState.read(policy, stores)
    cps = state.checkpoints()
    pinned = pinned_names(policy, cps, pinned_roots)
    want = desired_tiers(policy, cps, pinned, now)
    rows = []
    for c in cps:
        tiers = {}
        for t in TIERS:
            rec = state.records[t].get(c.name)
            present = c.name in state.held[t]
            tiers[t] = {
                "present": present,
                "wanted": t in want[c.name],
                "verified": rec.verified if (rec and present) else None,
                "verified_how": rec.verified_how if (rec and present) else None,
                "bytes": (rec.bytes if rec else c.bytes) if present else 0,
                "storage_class": (rec.storage_class if rec else getattr(state.stores[t], "storage_class", None)) if present else None,
            }
        rows.append(
            {
                "name": c.name,
                "root": c.root,
                "step": c.step,
                "created": utc_iso(c.created),
                "bytes": c.bytes,
                "pinned": c.name in pinned,
                "copies": sum(1 for t in TIERS if tiers[t]["present"]),
                "tiers": tiers,
            }
        )
    return {
        "namespace": policy.namespace,
        "stores": {t: state.stores[t].uri for t in TIERS},
        "encodings": {t: _encoding(state.stores[t]) for t in TIERS},
        "checkpoints": rows,
        "violations": copy_rule_violations(state, pinned, now),
    }


def _encoding(store: Store) -> str:
    """How a tier's store keeps chunks, in words: "plain", "compress auto", "compress zstd, encrypted"."""
    from concord.stores.config import read_config

    config = read_config(store)
    if config is None:
        return "plain"
    parts = [f"compress {config.compress}"] if config.compress != "none" else []
    parts += ["encrypted"] if config.encrypted else []
    return ", ".join(parts) or "plain"


def stored_bytes(store: Store) -> int:
    """Bytes of every chunk a store holds (what the tier costs)."""
    return sum(size for _, size, _ in store.iter_chunk_stats())
