"""Restore drills: prove that every tier can give its checkpoints back, and how fast.

A drill restores a sample of checkpoints from each tier in turn (the newest always, then random
others), each from that very tier into a scratch folder that is removed afterwards, and checks
every byte. It measures per tier:

* **RTO**, the longest restore it timed there (archive waiting included);
* **RPO**, how old the newest checkpoint the tier holds is;

and compares them with the policy's objectives (``rto`` per tier, ``rpo`` per tier or overall).
A restore that fails on a missing or corrupt chunk is a finding: with ``repair`` the damaged copy
is repaired from another tier holding a readable copy, and the restore is timed once more. A drill
that found damage has failed, even once repaired: the report says what was repaired and from where.

Each drill leaves its report as a JSON document in the hot store (``tier-drills/<namespace>/...``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from concord.errors import (
    ChunkNotFoundError,
    ConcordError,
    IntegrityError,
    ManifestError,
    ManifestNotFoundError,
)
from concord.progress import Progress
from concord.stores.base import Store
from concord.tiering.catalog import copies, read_records, utc_iso
from concord.tiering.engine import Checkpoint, TierState
from concord.tiering.policy import TIERS, TierPolicy, format_duration
from concord.tiering.restore import compact_utc, put_unique_document, restore_checkpoint

log = logging.getLogger(__name__)

DRILL_FORMAT = "concord/tier-drill@1"
#: what a restore fails with when the copy itself is damaged (repairable from another tier)
DAMAGE = (IntegrityError, ChunkNotFoundError, ManifestError, ManifestNotFoundError)


@dataclass
class DrillResult:
    """What :func:`run_drill` found: per tier the checkpoints restored, RTO and RPO against their
    objectives; ``ok`` when every tier met them."""

    namespace: str
    started: str
    ok: bool = True
    findings: list[str] = field(default_factory=list)
    tiers: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0
    record: str | None = None  # the report's document in the hot store, once written

    def to_dict(self) -> dict:
        return {
            "namespace": self.namespace,
            "started": self.started,
            "ok": self.ok,
            "findings": list(self.findings),
            "tiers": self.tiers,
            "seconds": self.seconds,
            "record": self.record,
        }


#: what a drill's summary says of each tier
SUMMARY_KEYS = ("store", "rto_seconds", "rto_objective", "rto_ok", "rpo_seconds", "rpo_objective", "rpo_ok", "ok")


def drill_summary(drill: dict, *, items: int = 20) -> dict:
    """What a notification says about a drill (``DrillResult.to_dict()``): per tier, RTO and RPO
    against their objectives and what was sampled; the first ``items`` findings and their count."""
    return {
        "namespace": drill["namespace"],
        "started": drill["started"],
        "ok": drill["ok"],
        "tiers": {
            t: {k: d.get(k) for k in SUMMARY_KEYS} | {"sampled": list(d.get("sampled") or [])}
            for t, d in drill["tiers"].items()
        },
        "findings": list(drill["findings"][:items]),
        "finding_count": len(drill["findings"]),
    }


def _secs(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3g} s"


def _read_tiers(policy: TierPolicy, given: dict[str, Store] | None, findings: list[str]):
    """The tiers' state; a tier that cannot be opened or listed is a finding, and holds nothing."""
    stores: dict[str, Store] = {}
    held: dict[str, dict[str, str]] = {}
    records: dict = {}
    broken: set[str] = set()
    for t in TIERS:
        held[t], records[t] = {}, {}
        try:
            stores[t] = (given or {}).get(t) or policy.tier(t).open()
            held[t] = copies(stores[t], policy.namespace)
            records[t] = read_records(stores[t], policy.namespace)
        except ConcordError as exc:
            findings.append(f"{t}: its store cannot be read: {exc}")
            broken.add(t)
    return TierState(policy, stores, held, records), broken


def _sample(present: list[Checkpoint], n: int, rng: random.Random) -> list[Checkpoint]:
    if not present:
        return []
    rest = present[1:]
    return [present[0]] + rng.sample(rest, min(n - 1, len(rest)))


def _repair(state: TierState, tier: str, c: Checkpoint, root: str) -> tuple[int, str | None, str | None]:
    """Repair ``tier``'s copy of ``c`` from another tier with a readable copy of the same root.

    ``(chunks repaired, the tier repaired from, a problem left or None)``.
    """
    from concord.snapshots.verify import verify

    store = state.stores[tier]
    sources = [
        o
        for o in TIERS
        if o != tier
        and o in state.stores
        and state.held[o].get(c.name) == root
        and not getattr(state.stores[o], "archive", False)
    ]
    if not sources:
        return 0, None, "no other tier holds a readable copy to repair it from"
    repaired, used, problem = 0, [], None
    for o in sources:
        try:
            fixed = verify(store, root=root, repair_from=state.stores[o])
        except ConcordError as exc:
            problem = f"repair from {o} failed: {exc}"
            continue
        if fixed.repaired:
            used.append(o)
        repaired += len(fixed.repaired)
        if fixed.ok:
            return repaired, "+".join(used) or o, None
        problem = f"{len(set(fixed.missing) | set(fixed.corrupt)) - len(fixed.repaired)} chunk(s) still damaged after repair from {o}"
    return repaired, "+".join(used) or None, problem


def _drill_one(
    policy: TierPolicy, state: TierState, tier: str, c: Checkpoint, base: str, *, repair: bool, progress, findings: list[str]
) -> dict:
    """Restore ``c`` from ``tier`` into a fresh folder under ``base``, repairing once if damaged."""
    root = state.held[tier][c.name]
    entry = {"name": c.name, "seconds": None, "bytes": None, "ok": False, "error": None, "repaired": None}

    def attempt() -> None:
        out = tempfile.mkdtemp(prefix=f"{tier}-{c.name[:40]}-", dir=base)
        os.rmdir(out)  # a fresh name; the restore creates the folder only when complete
        try:
            r = restore_checkpoint(policy, c.name, out, tier=tier, progress=progress, stores=state.stores, record=False)
            entry.update(seconds=r.seconds, bytes=r.bytes, ok=True)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    try:
        attempt()
        return entry
    except DAMAGE as exc:
        entry["error"] = str(exc)
        if not repair:
            findings.append(f"{tier}: {c.name} is damaged ({exc}); not repaired (repair is off)")
            return entry
    except (ConcordError, OSError) as exc:
        entry["error"] = str(exc)
        findings.append(f"{tier}: restoring {c.name} failed: {exc}")
        return entry

    repaired, source, problem = _repair(state, tier, c, root)
    entry["repaired"] = repaired
    entry["repaired_from"] = source
    if problem is not None:
        findings.append(f"{tier}: {c.name} is damaged ({entry['error']}); {problem}" + (f" ({repaired} chunk(s) repaired)" if repaired else ""))
        return entry
    findings.append(f"{tier}: {c.name} was damaged ({entry['error']}); repaired {repaired} chunk(s) from {source}")
    try:
        attempt()
    except (ConcordError, OSError) as exc:
        findings.append(f"{tier}: restoring {c.name} failed again after the repair: {exc}")
        entry["retry_error"] = str(exc)
    return entry


def run_drill(
    policy: TierPolicy,
    *,
    sample: int = 1,
    scratch: str | os.PathLike | None = None,
    repair: bool = True,
    now: float | None = None,
    progress: Progress | None = None,
    stores: dict[str, Store] | None = None,
    rng_seed: int | None = None,
) -> DrillResult:
    """Restore up to ``sample`` checkpoints from each tier, measure RTO and RPO per tier against
    the policy's objectives, and record the report in the hot store.

    ``scratch`` is where restores go (a folder of it is made and removed afterwards; by default a
    temporary folder). ``now`` is the time RPO is measured at (default: now). ``ok`` is False
    when an objective is missed, a restore failed, a tier holds nothing, or damage was found.
    """
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise ValueError(f"sample must be a whole number of checkpoints per tier, at least 1, got {sample!r}")
    policy.validate()
    t0 = time.monotonic()
    result = DrillResult(policy.namespace, utc_iso())
    now = time.time() if now is None else now
    rng = random.Random(rng_seed)
    state, broken = _read_tiers(policy, stores, result.findings)
    cps = state.checkpoints()

    if scratch is None:
        holder = tempfile.TemporaryDirectory(prefix="concord-drill-")
        base = holder.name
    else:
        holder = None
        os.makedirs(os.fspath(scratch), exist_ok=True)
        base = tempfile.mkdtemp(prefix="concord-drill-", dir=os.fspath(scratch))
    try:
        for t in TIERS:
            spec = policy.tier(t)
            present = [c for c in cps if c.name in state.held[t]]
            before = len(result.findings)
            chosen = _sample(present, sample, rng)
            restores = [
                _drill_one(policy, state, t, c, base, repair=repair, progress=progress, findings=result.findings)
                for c in chosen
            ]
            timed = [r["seconds"] for r in restores if r["ok"]]
            rto = max(timed) if timed else None
            rto_objective = spec.rto_seconds
            rto_ok = None if rto_objective is None else (rto is not None and rto <= rto_objective)
            if rto_ok is False and rto is not None:
                result.findings.append(f"{t}: RTO {_secs(rto)} misses the objective of {format_duration(rto_objective)}")
            elif rto_ok is False and present:
                result.findings.append(f"{t}: no restore completed, so the RTO objective of {format_duration(rto_objective)} is not met")

            newest = present[0] if present else None
            rpo = (now - newest.created) if newest is not None and newest.created > 0 else None
            rpo_objective = policy.rpo_for(t)
            rpo_ok = None if rpo_objective is None else (rpo is not None and rpo <= rpo_objective)
            if t not in broken and newest is None:
                result.findings.append(f"{t}: holds no checkpoint of {policy.namespace}, so its RPO is unknown")
            elif newest is not None and rpo is None:
                result.findings.append(f"{t}: when {newest.name} was written is unknown, so the RPO is unknown")
            elif rpo_ok is False:
                result.findings.append(
                    f"{t}: RPO {_secs(rpo)} (newest checkpoint {newest.name}) misses the objective of {format_duration(rpo_objective)}"
                )
            result.tiers[t] = {
                "store": state.stores[t].uri if t in state.stores else spec.store,
                "sampled": [c.name for c in chosen],
                "restores": restores,
                "rto_seconds": rto,
                "rto_objective": rto_objective,
                "rto_ok": rto_ok,
                "rpo_seconds": rpo,
                "rpo_objective": rpo_objective,
                "rpo_ok": rpo_ok,
                "ok": len(result.findings) == before and t not in broken,
            }
    finally:
        if holder is not None:
            holder.cleanup()
        else:
            shutil.rmtree(base, ignore_errors=True)
    result.ok = not result.findings and all(v["ok"] for v in result.tiers.values())
    result.seconds = time.monotonic() - t0
    _write_report(policy, state, result)
    return result


def _write_report(policy: TierPolicy, state: TierState, result: DrillResult) -> None:
    hot = state.stores.get("hot")
    if hot is None:
        log.warning("drill report not recorded: the hot store cannot be opened")
        return
    doc = {"format": DRILL_FORMAT, **result.to_dict(), "finished": utc_iso()}
    doc.pop("record")
    try:
        result.record = put_unique_document(
            hot, f"tier-drills/{policy.namespace}", compact_utc(), json.dumps(doc, indent=1, sort_keys=True).encode()
        )
    except (ConcordError, OSError) as exc:
        log.warning("drill report not recorded in the hot store: %s", exc)
