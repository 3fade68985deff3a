"""Tier policies: which store is hot, warm and cold, how much each keeps, and the copy rules.

A policy is plain data (a small YAML file for people at a terminal, whose relative folders are
relative to the file, or a Prefect block in the UI); :meth:`TierPolicy.validate` refuses any policy that could not keep the copy rules:

* the newest checkpoints (those hot keeps) and pinned ones hold **3-2-1**: three copies (hot,
  warm, cold), on at least two kinds of media, one of them off-site (cold);
* every checkpoint, however old, keeps a verified cold copy (cold keeps everything: no ``keep``).

YAML::

    namespace: llama-lora                  # refs/<namespace>/<checkpoint> in every tier
    hot:  {store: data/hot, keep: 2, rto: 1m}
    warm: {store: s3://bucket/warm, keep: 4, storage_class: STANDARD_IA, rto: 10m}
    cold: {store: s3://bucket/cold, storage_class: GLACIER, compress: auto, rto: 12h}
    rpo: 1h                                 # newest checkpoint in each tier no older than this
    pin: [step-100]
    gc_grace: 1h
    ready: {marker: COMPLETE, settle: 2s}
    restore: {days: 1, tier: Standard, timeout: 12h, poll: 30s}
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from concord.errors import InvalidStoreURIError, PolicyError
from concord.plugins import Plugins
from concord.stores.address import FOLDER, S3, StoreAddress
from concord.stores.base import Store, validate_segment
from concord.stores.codec import COMPRESS_MODES

TIERS = ("hot", "warm", "cold")
ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
S3_CLASSES = frozenset(
    {"STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR", "REDUCED_REDUNDANCY"}
) | ARCHIVE_CLASSES
RESTORE_TIERS = ("Expedited", "Standard", "Bulk")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}

_TIER_KEYS = {
    "hot": {"store", "keep", "keep_days", "storage_class", "media", "rto", "rpo", "compress", "key_file"},
    "warm": {"store", "keep", "keep_days", "storage_class", "media", "rto", "rpo", "compress", "key_file"},
    "cold": {"store", "storage_class", "media", "offsite", "rto", "rpo", "compress", "key_file"},
}
_TOP_KEYS = {"namespace", "hot", "warm", "cold", "rpo", "pin", "gc_grace", "ready", "restore"}
_READY_KEYS = {"marker", "settle"}
_RESTORE_KEYS = {"days", "tier", "timeout", "poll"}


#: longest duration a policy or command line may give (100 years): longer ones overflow clocks
MAX_DURATION = 100 * 365.25 * 86400


def parse_duration(value: Any, what: str) -> float:
    """``90``, ``"90s"``, ``"15m"``, ``"2h"``, ``"7d"``, ``"1w"`` → seconds.

    Anything else is refused with a ``ValueError``: another type, a negative number, and
    infinities, NaN and values over :data:`MAX_DURATION` (``.inf`` would otherwise pass as a
    timeout, then print as ``infs``, which this very parser refuses)."""
    problem = f"{what}: {_show(value)} is not a duration; write e.g. 90s, 15m, 2h or 7d"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(problem)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        m = _DURATION.match(value)
        if not m:
            raise ValueError(problem)
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if math.isnan(seconds):
        raise ValueError(problem)
    if seconds < 0:
        raise ValueError(f"{what}: {_show(value)} is negative")
    if seconds > MAX_DURATION:
        raise ValueError(f"{what}: {_show(value)} is longer than 100 years; give a finite duration such as 12h or 30d")
    return seconds


def _show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters (a problem line quotes what it refuses)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 10]}…({len(text)} chars)"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class TierSpec:
    """One tier: where it lives and what it keeps."""

    tier: str
    store: str
    keep: int | None = None
    keep_days: float | None = None
    storage_class: str | None = None
    media: str | None = None
    offsite: bool | None = None
    rto_seconds: float | None = None
    rpo_seconds: float | None = None
    #: how the tier's store keeps chunks (none, zstd, auto): set on the store when it is first
    #: opened empty (``concord init``); a store already configured otherwise is refused
    compress: str | None = None
    #: the file holding the tier's store key (``concord init --encrypt`` wrote it): the tier's
    #: store is opened with it, and a store first opened empty is made encrypted with it; without
    #: it an encrypted store takes ``--key-file`` / ``CONCORD_KEY_FILE`` like every other
    key_file: str | None = None

    @property
    def archive(self) -> bool:
        return (self.storage_class or "").upper() in ARCHIVE_CLASSES

    @cached_property
    def address(self) -> StoreAddress:
        """The tier's store, parsed (:class:`~concord.errors.InvalidStoreURIError` if it names none)."""
        return StoreAddress.parse(self.store, check=False)  # S3's rules apply when it is opened

    @property
    def media_kind(self) -> str:
        """The kind of media for the 2-in-3-2-1 rule: declared, or from the address and class."""
        if self.media:
            return self.media
        if self.address.kind == S3:
            return "archive" if self.archive else "object"
        if self.address.kind == FOLDER:
            return "disk"
        return f"{self.address.scheme}:{self.address.rest}"

    @property
    def is_offsite(self) -> bool:
        if self.offsite is not None:
            return bool(self.offsite)
        return self.address.kind == S3

    def open(self) -> Store:
        """The tier's store (the storage class applied to the chunks it writes)."""
        store = self.address.open()
        if self.storage_class:
            if not hasattr(store, "storage_class"):
                raise PolicyError(self.tier, [f"{self.tier}.storage_class is set but {self.store} is not an S3 store"])
            store.storage_class = self.storage_class
        if self.key_file:
            from concord.stores.cipher import read_key_file

            try:
                store.unlock(read_key_file(self.key_file))
            except ValueError as exc:
                raise PolicyError(self.tier, [f"{self.tier}.key_file: {exc}"]) from None
        if self.compress or self.key_file:
            from concord.stores.config import configure, read_config

            current = read_config(store)
            compress = self.compress or (current.compress if current else "none")
            encrypt = bool(self.key_file) or bool(current and current.encrypted)
            if current is None or current.compress != compress or current.encrypted != encrypt:
                configure(store, compress=compress, encrypt=encrypt)  # refuses a store that holds snapshots
        if self.key_file:
            from concord.errors import StoreKeyError

            try:
                store.encoding()  # the key must be the store's own, checked before anything is read
            except StoreKeyError as exc:
                raise StoreKeyError(exc.store, exc.problem, f"Fix {self.tier}.key_file ({self.key_file}) in the tier policy") from None
        return store

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"store": self.store}
        for key in ("keep", "keep_days", "storage_class", "media", "offsite", "compress", "key_file"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.rto_seconds is not None:
            out["rto"] = format_duration(self.rto_seconds)
        if self.rpo_seconds is not None:
            out["rpo"] = format_duration(self.rpo_seconds)
        return out


@dataclass(frozen=True)
class TierPolicy:
    """A checked tier policy: the hot, warm and cold stores and what each keeps, the objectives,
    pins, garbage collection and archive restores (docs/tiering.md)."""

    hot: TierSpec
    warm: TierSpec
    cold: TierSpec
    namespace: str = "checkpoints"
    rpo_seconds: float | None = None
    pin: tuple[str, ...] = ()
    gc_grace_seconds: float = 3600.0
    marker: str | None = None
    settle_seconds: float = 2.0
    restore_days: int = 1
    restore_tier: str = "Standard"
    restore_timeout_seconds: float = 12 * 3600.0
    restore_poll_seconds: float = 30.0
    source: str = field(default="policy", compare=False)

    # ------------------------------------------------------------------ reading

    def tier(self, name: str) -> TierSpec:
        if name not in TIERS:
            raise ValueError(f"unknown tier {name!r}; the tiers are hot, warm and cold")
        return getattr(self, name)

    @property
    def tiers(self) -> tuple[TierSpec, TierSpec, TierSpec]:
        return (self.hot, self.warm, self.cold)

    def rpo_for(self, tier: str) -> float | None:
        spec = self.tier(tier)
        return spec.rpo_seconds if spec.rpo_seconds is not None else self.rpo_seconds

    def ref(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    def with_stores(self, **stores: str) -> TierPolicy:
        """The same policy with some tiers' stores replaced (tests, drills into scratch copies)."""
        return replace(self, **{t: replace(self.tier(t), store=s) for t, s in stores.items()})

    # ------------------------------------------------------------------ the copy rules

    def problems(self) -> list[str]:
        """Everything that makes this policy unusable (empty when it is sound)."""
        out: list[str] = []
        try:
            validate_segment(self.namespace, "namespace")
        except ValueError:
            out.append(f"namespace {self.namespace!r} must be letters, digits, '.', '_' or '-' (up to 128)")
        for name in self.pin:
            try:
                validate_segment(name, "checkpoint name")
            except ValueError:
                out.append(f"pin: {name!r} is not a valid checkpoint name")
        stores = True  # every tier names a store: else the copy rules would judge stand-ins
        for spec in self.tiers:
            t = spec.tier
            if not spec.store or not str(spec.store).strip():
                out.append(f"{t}.store is required (a folder, s3://bucket/prefix or block:NAME)")
                stores = False
            else:
                try:
                    _ = spec.address  # parsed here so that a bad address is reported with the others
                except InvalidStoreURIError as exc:
                    out.append(f"{t}.store {spec.store!r} is not a store: {exc.reason}")
                    stores = False
            if spec.keep is not None and (isinstance(spec.keep, bool) or int(spec.keep) != spec.keep or spec.keep < 1):
                out.append(f"{t}.keep must be a whole number of 1 or more, got {spec.keep!r}")
            if spec.keep_days is not None and not spec.keep_days > 0:
                out.append(f"{t}.keep_days must be positive, got {spec.keep_days!r}")
            if spec.storage_class is not None:
                sc = spec.storage_class.upper()
                if sc not in S3_CLASSES:
                    out.append(f"{t}.storage_class {spec.storage_class!r} is not an S3 storage class ({', '.join(sorted(S3_CLASSES))})")
                elif stores and spec.address.kind == FOLDER:
                    out.append(f"{t}.storage_class applies only to s3:// stores, and {t}.store is a folder")
        for spec in (self.hot, self.warm):
            if spec.keep is None and spec.keep_days is None:
                out.append(f"{spec.tier} needs keep (newest N checkpoints) or keep_days; only cold keeps everything")
            if spec.keep is not None and spec.keep_days is not None:
                out.append(f"{spec.tier}: give keep or keep_days, not both")
            if spec.archive:
                out.append(
                    f"{spec.tier}.storage_class {spec.storage_class} is an archive class: {spec.tier} copies "
                    "must be readable without a restore; archive classes belong in cold"
                )
        h, w = self.hot, self.warm
        if h.keep is not None and w.keep is not None and w.keep < h.keep:
            out.append(
                f"warm.keep ({w.keep}) is less than hot.keep ({h.keep}): the newest {h.keep} checkpoints "
                "need a warm copy too (3-2-1: three copies)"
            )
        if h.keep_days is not None and w.keep_days is not None and w.keep_days < h.keep_days:
            out.append(
                f"warm.keep_days ({w.keep_days:g}) is less than hot.keep_days ({h.keep_days:g}): what hot "
                "keeps needs a warm copy too (3-2-1: three copies)"
            )
        if (h.keep is None) != (w.keep is None) and not any(p.startswith(("hot needs", "warm needs")) for p in out):
            out.append("give hot and warm the same unit (both keep, or both keep_days) so warm provably keeps what hot keeps")
        if stores:
            out.extend(self._copy_problems())
        if self.gc_grace_seconds < 0:
            out.append("gc_grace must not be negative")
        if self.marker is not None:
            if not self.marker or "/" in self.marker or self.marker in (".", ".."):
                out.append(f"ready.marker {self.marker!r} must be a plain file name, e.g. COMPLETE")
        if self.settle_seconds < 0:
            out.append("ready.settle must not be negative")
        if not (isinstance(self.restore_days, int) and self.restore_days >= 1):
            out.append(f"restore.days must be a whole number of 1 or more, got {self.restore_days!r}")
        if self.restore_tier not in RESTORE_TIERS:
            out.append(f"restore.tier {self.restore_tier!r} must be one of {', '.join(RESTORE_TIERS)}")
        if not self.restore_timeout_seconds > 0:
            out.append("restore.timeout must be positive")
        if not self.restore_poll_seconds > 0:
            out.append("restore.poll must be positive")
        return out

    def _copy_problems(self) -> list[str]:
        """Where 3-2-1 breaks for the tiers' stores: one store twice, one kind of media, nothing off-site."""
        out: list[str] = []
        identities: dict[str, str] = {}
        for spec in self.tiers:
            identity = spec.address.identity
            if identity in identities:
                out.append(
                    f"{spec.tier} and {identities[identity]} are the same store ({spec.store}): "
                    "three copies need three stores"
                )
            identities.setdefault(identity, spec.tier)
        kinds = {spec.media_kind for spec in self.tiers}
        if len(kinds) < 2:
            out.append(
                f"all three tiers are on the same kind of media ({kinds.pop()}): 3-2-1 needs two kinds; "
                "put warm or cold on S3, or declare media: for a store that is another kind (e.g. tape)"
            )
        if not self.cold.is_offsite:
            out.append(
                "cold must be off-site (3-2-1: one copy off-site): use an s3:// store, or set "
                "cold.offsite: true for a folder that is mounted from another site"
            )
        return out

    def validate(self) -> TierPolicy:
        problems = self.problems()
        if problems:
            raise PolicyError(self.source, problems)
        return self

    # ------------------------------------------------------------------ (de)serialising

    @classmethod
    def from_dict(cls, doc: Any, source: str = "policy") -> TierPolicy:
        """Build and validate a policy from its YAML/JSON form; every problem is reported at once."""
        problems: list[str] = []
        if not isinstance(doc, dict):
            raise PolicyError(source, ["the policy must be a mapping with hot, warm and cold"])
        _unknown(doc, _TOP_KEYS, "", problems)

        def dur(value, what):
            if value is None:
                return None
            try:
                return parse_duration(value, what)
            except ValueError as exc:
                problems.append(str(exc))
                return None

        def text(value, what, example):
            """A string key: anything else (a number, a list, a mapping) is a problem, never str()-ed."""
            if value is None:
                return None
            if not isinstance(value, str):
                problems.append(f"{what} must be text such as {example}, got {_kind(value)} {_show(value)}")
                return None
            return value

        specs = {}
        refused_store = False  # then the copy rules would only be checked against stand-ins
        for t in TIERS:
            raw = doc.get(t)
            if raw is None:
                problems.append(f"{t} is required (at least {{store: ...}})")
                raw = {}
            if not isinstance(raw, dict):
                problems.append(f"{t} must be a mapping such as {{store: PATH}}, got {_kind(raw)} {_show(raw)}")
                raw = {}
            if t == "cold" and ("keep" in raw or "keep_days" in raw):
                problems.append("cold keeps every checkpoint (each keeps at least one verified cold copy): remove cold.keep")
                raw = {k: v for k, v in raw.items() if k not in ("keep", "keep_days")}
            _unknown(raw, _TIER_KEYS[t], f"{t}.", problems)
            keep = raw.get("keep")
            if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)):
                problems.append(f"{t}.keep must be a whole number, got {_kind(keep)} {_show(keep)}")
                keep = None
            keep_days = raw.get("keep_days")
            if keep_days is not None:
                if isinstance(keep_days, bool) or not isinstance(keep_days, (int, float)) or not 0 < keep_days <= 36525:
                    problems.append(f"{t}.keep_days must be a number of days above 0 and at most 36525 (100 years), got {_show(keep_days)}")
                    keep_days = None
                else:
                    keep_days = float(keep_days)
            offsite = raw.get("offsite")
            if offsite is not None and not isinstance(offsite, bool):
                problems.append(f"{t}.offsite must be true or false, got {_show(offsite)}")
                offsite = None
            store = raw.get("store")
            if store is not None and not isinstance(store, str):
                problems.append(
                    f"{t}.store must be text (a folder, s3://bucket/prefix or block:NAME), got {_kind(store)} {_show(store)}"
                )
                store = None
                refused_store = True
            sc = text(raw.get("storage_class"), f"{t}.storage_class", "STANDARD_IA")
            media = text(raw.get("media"), f"{t}.media", "tape")
            key_file = text(raw.get("key_file"), f"{t}.key_file", "keys/cold.key")
            compress = text(raw.get("compress"), f"{t}.compress", "auto")
            if compress is not None and compress not in COMPRESS_MODES:
                problems.append(f"{t}.compress must be one of {', '.join(COMPRESS_MODES)}, got {_show(compress)}")
                compress = None
            specs[t] = TierSpec(
                tier=t,
                store=(store or "").strip(),
                keep=keep,
                keep_days=keep_days,
                storage_class=sc.upper() if sc else None,
                media=media or None,
                offsite=offsite,
                rto_seconds=dur(raw.get("rto"), f"{t}.rto"),
                rpo_seconds=dur(raw.get("rpo"), f"{t}.rpo"),
                compress=compress,
                key_file=(key_file or "").strip() or None,
            )
        if any(p.startswith((f"{t} is required", f"{t} must be a mapping")) for t in TIERS for p in problems):
            raise PolicyError(source, problems)  # the rest would only repeat what is missing
        ready = {} if doc.get("ready") is None else doc["ready"]
        restore = {} if doc.get("restore") is None else doc["restore"]
        for name, sub, keys in (("ready", ready, _READY_KEYS), ("restore", restore, _RESTORE_KEYS)):
            if not isinstance(sub, dict):
                problems.append(f"{name} must be a mapping, got {_kind(sub)} {_show(sub)}")
            else:
                _unknown(sub, keys, f"{name}.", problems)
        ready = ready if isinstance(ready, dict) else {}
        restore = restore if isinstance(restore, dict) else {}
        pin = [] if doc.get("pin") is None else doc["pin"]
        if not isinstance(pin, (list, tuple)):
            problems.append(f"pin must be a list of checkpoint names, got {_kind(pin)} {_show(pin)}")
            pin = []
        for p in pin:
            if not isinstance(p, str):
                problems.append(f"pin: {_show(p)} is not a checkpoint name (names are text; quote a number: '100')")
        pin = [p for p in pin if isinstance(p, str)]
        namespace = text(doc.get("namespace"), "namespace", "llama-lora")
        marker = text(ready.get("marker"), "ready.marker", "COMPLETE")
        restore_tier = text(restore.get("tier"), "restore.tier", "Standard")
        days = restore.get("days", 1)
        if isinstance(days, bool) or not isinstance(days, int) or days < 1:
            problems.append(f"restore.days must be a whole number of 1 or more, got {_show(days)}")
            days = 1
        policy = cls(
            hot=specs["hot"],
            warm=specs["warm"],
            cold=specs["cold"],
            namespace=namespace if namespace is not None else "checkpoints",
            rpo_seconds=dur(doc.get("rpo"), "rpo"),
            pin=tuple(pin),
            gc_grace_seconds=_or(dur(doc.get("gc_grace"), "gc_grace"), 3600.0),
            marker=marker,
            settle_seconds=_or(dur(ready.get("settle"), "ready.settle"), 2.0),
            restore_days=days,
            restore_tier=restore_tier if restore_tier is not None else "Standard",
            restore_timeout_seconds=_or(dur(restore.get("timeout"), "restore.timeout"), 12 * 3600.0),
            restore_poll_seconds=_or(dur(restore.get("poll"), "restore.poll"), 30.0),
            source=source,
        )
        if not refused_store:
            problems.extend(policy.problems())
        if problems:
            raise PolicyError(source, list(dict.fromkeys(problems)))
        return policy

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"namespace": self.namespace}
        for spec in self.tiers:
            out[spec.tier] = spec.to_dict()
        if self.rpo_seconds is not None:
            out["rpo"] = format_duration(self.rpo_seconds)
        if self.pin:
            out["pin"] = list(self.pin)
        out["gc_grace"] = format_duration(self.gc_grace_seconds)
        ready: dict[str, Any] = {"settle": format_duration(self.settle_seconds)}
        if self.marker:
            ready["marker"] = self.marker
        out["ready"] = ready
        out["restore"] = {
            "days": self.restore_days,
            "tier": self.restore_tier,
            "timeout": format_duration(self.restore_timeout_seconds),
            "poll": format_duration(self.restore_poll_seconds),
        }
        return out


def _or(value, default):
    return default if value is None else value


def _kind(value: Any) -> str:
    """What a YAML value is, in YAML's words (a problem line says what it got)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _unknown(doc: dict, allowed: set[str], where: str, problems: list[str]) -> None:
    for key in doc:
        if key not in allowed:
            shown = key if isinstance(key, str) and key.isprintable() and len(key) <= 60 else _show(key)
            problems.append(f"unknown key {where}{shown} (allowed: {', '.join(sorted(allowed))})")


#: where ``block:NAME`` policies come from (the ``blocks`` package registers ``block``)
_POLICY_SOURCES = Plugins("concord.policy_sources")

#: largest policy file read (a policy is a few hundred bytes)
MAX_POLICY_BYTES = 64 * 1024

#: the first words of the comment ``make demo`` heads its policy file with: its S3 tiers lived on
#: the demo's moto_server, so an error about them says so
DEMO_POLICY_MARK = "# Written by `make demo`"


def written_by_demo(source: str) -> bool:
    """Whether the policy file ``source`` is one ``make demo`` wrote (its first lines carry
    :data:`DEMO_POLICY_MARK`); False for a block or a file that cannot be read."""
    try:
        with open(source, "rb") as f:
            head = f.read(2048).decode("utf-8", "replace")
    except OSError:
        return False
    return any(line.startswith(DEMO_POLICY_MARK) for line in head.splitlines()[:5])


def unavailable_store(policy: TierPolicy, stores: dict, exc: BaseException) -> BaseException:
    """``exc`` (a :class:`~concord.errors.StoreUnreachableError` or
    :class:`~concord.errors.StoreAccessError` from one of the opened ``stores``, tier → store) as a
    :class:`~concord.errors.TierStoreUnavailableError` naming the policy file, the tier, the store
    and its endpoint (and that the policy is the demo's, when it is); ``exc`` itself when it is
    about none of them."""
    from concord.errors import StoreAccessError, TierStoreUnavailableError
    from concord.redact import redact

    where = getattr(exc, "store", None)
    for tier, store in stores.items():
        if store is not None and where in (store.uri, policy.tier(tier).store):
            break
    else:
        return exc
    endpoint = getattr(store, "endpoint_url", None)
    shown = redact(endpoint) if endpoint else "AWS (no AWS_ENDPOINT_URL set)"
    cause = redact(" ".join(str(exc.__cause__ or exc).split()))
    return TierStoreUnavailableError(
        policy.source, tier, store.uri, shown, cause,
        demo=written_by_demo(policy.source), refused=isinstance(exc, StoreAccessError),
    )


def load_policy(spec: str | os.PathLike | TierPolicy) -> TierPolicy:
    """A validated policy from a YAML file, or ``block:NAME`` (a Prefect ``TierPolicyBlock``).

    A file is read only up to :data:`MAX_POLICY_BYTES`, as plain YAML: anchors and aliases (and
    so alias bombs) are refused (:mod:`concord.yamlsafe`). Its relative folders are relative to
    the file."""
    if isinstance(spec, TierPolicy):
        return spec.validate()
    text = os.fspath(spec)
    if text.startswith("block:"):
        load = _POLICY_SOURCES.get("block")
        if load is not None:
            return load(text[len("block:"):]).validate()
        raise PolicyError(text, ["block: policies need the blocks package installed (pip install -e .)"])
    import yaml

    from concord.yamlsafe import load as load_yaml

    try:
        with open(text, "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    except FileNotFoundError:
        raise PolicyError(text, ["no such policy file; write one (see docs/tiering.md) or pass block:NAME"]) from None
    except OSError as exc:
        raise PolicyError(text, [f"the policy file cannot be read ({exc.strerror or exc})"]) from None
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(
            text, [f"the file is larger than {MAX_POLICY_BYTES // 1024} KiB; a tier policy is a few hundred bytes of YAML"]
        )
    try:
        doc = load_yaml(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PolicyError(text, [f"not UTF-8 text (byte {exc.start})"]) from None
    except yaml.YAMLError as exc:
        raise PolicyError(text, [f"not valid YAML ({' '.join(str(exc).split())})"]) from None
    if isinstance(doc, dict):
        doc = _relative_to(doc, os.path.dirname(os.path.abspath(text)))
    return TierPolicy.from_dict(doc, source=text)


def _relative_to(doc: dict, folder: str) -> dict:
    """Folders in a policy file are relative to the file, not to wherever the command runs."""
    out = dict(doc)
    for t in TIERS:
        tier = out.get(t)
        if isinstance(tier, dict) and isinstance(tier.get("store"), str):
            try:
                address = StoreAddress.parse(tier["store"], check=False)
            except InvalidStoreURIError:
                continue  # the policy's problems say what is wrong with it
            if address.kind == FOLDER and not address.scheme:  # a folder typed as a path
                path = os.path.expanduser(address.path)
                if not os.path.isabs(path):
                    out[t] = {**tier, "store": os.path.normpath(os.path.join(folder, path))}
        tier = out.get(t)
        if isinstance(tier, dict) and isinstance(tier.get("key_file"), str) and tier["key_file"].strip():
            path = os.path.expanduser(tier["key_file"].strip())
            if not os.path.isabs(path):
                out[t] = {**tier, "key_file": os.path.normpath(os.path.join(folder, path))}
    return out
