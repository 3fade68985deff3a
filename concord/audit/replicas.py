"""Weight drift across replicas: is every cluster's copy of a model version the reference's copy?

:func:`compare_replicas` takes one ``(store, ref or root)`` per cluster, resolves each to its
snapshot root and compares every replica with the reference replica (the one named ``reference``,
else the first). It walks the Merkle tree and reads only where hashes differ:

* a replica whose root equals the reference's is identical, and nothing of it is read;
* a tensor whose part hash equals the reference's is identical without reading its bytes;
* any other tensor is assembled from its chunks (each chunk verified against its id), one tensor at
  a time per side, and compared value by value in blocks of :data:`BLOCK_ELEMENTS` elements, so
  memory stays at about one tensor per side whatever the checkpoint's size. The reference's copy of
  a tensor is read once, however many replicas differ there.

Tensors are paired by file and name; a tensor left over on both sides under the same name in
different files (a checkpoint sharded differently) is paired by name alone. What the replica lacks,
what only it has and a change of shape are failures. Values are judged in one of two ways:

* **same dtype**: a replica of the same dtype must be bit-identical (the reason it should be is that
  it is a copy). The ULP and absolute differences are reported to size the damage.
* **another dtype** (bf16 on one cluster, fp32 on another): the higher-precision tensor is cast to
  the lower precision (``Tensor.to``, round to nearest even), and the tensor passes when its largest
  distance in ULPs of the lower precision is at most ``max_ulps`` *and* the two are close by
  torch's default tolerances for the lower dtype (:data:`DEFAULT_TOLERANCES`, those of
  ``torch.testing.assert_close``: ``|replica - reference| <= atol + rtol * |reference|``, computed
  in float32, or float64 for float64, so the check does not round). Both are needed: the largest
  finite value and infinity are 1 ULP apart, and near zero a few ULPs are far below any tolerance.
  "Lower precision" is the dtype with the larger machine epsilon (bf16 below fp16 below fp32).

Integer and bool tensors must hold equal values (ULPs do not apply: ``max_ulp`` is None). Dtypes
torch cannot hold here (F4, F6, F8_E8M0) and complex ones are compared byte for byte.

ULP distance (:func:`ulp_distance`) is measured on bit patterns: a float's bits, read as a
sign-magnitude integer, are mapped to an ordered integer (magnitude for a positive sign, minus the
magnitude for a negative one, the usual two's-complement trick), and the distance is the difference
of the two ordered integers. Adjacent floats are 1 apart, +0 and -0 are 0 apart, and the distance
across zero is correct (the smallest negative and positive subnormals are 2 apart). Two NaNs are
equal (distance 0, whatever their payloads); a NaN against a number is :data:`ULP_MAX` (the largest
int64), which is also where distances saturate (only float64 values of opposite signs and huge
magnitude get there).

A replica is compared as a snapshot: whether its store still holds every chunk of it is what
``concord verify`` answers (chunks read here are verified, and a missing one is a finding).

Non-tensor files (config, tokenizer, README) are compared by file hash when both snapshots use the
same chunk size, else by a BLAKE3 digest of their bytes; safetensors headers are not compared as
files (the tensors they describe are). Severity per replica: identical, or another dtype within
tolerance, is "ok"; a replica or ref that cannot be read, or any tensor failing, is "critical" (P0:
weights that should be identical are not); non-tensor files differing, with every tensor passing, is
"warning" (P1). A missing ref, snapshot or chunk is a finding of the report, never an exception.

torch is imported inside the functions that need it.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from concord.audit.drift import SEVERITIES, Prioritised
from concord.errors import ChunkNotFoundError, ConcordError, ManifestError, ManifestNotFoundError, ReplicaConfigError
from concord.hashing import ChunkHasher
from concord.progress import Progress, ensure
from concord.snapshots.manifest import FileEntry, Manifest, Part
from concord.snapshots.refs import load_manifest, resolve_root
from concord.stores.base import Store

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from concord.trust import TrustPolicy

__all__ = [
    "BLOCK_ELEMENTS",
    "DEFAULT_TOLERANCES",
    "ULP_MAX",
    "ReplicaReport",
    "ReplicaResult",
    "TensorComparison",
    "check_replicas",
    "compare_replicas",
    "compare_tensors",
    "replicas_of",
    "ulp_distance",
]

#: a NaN against a number, and the saturation point of every ULP distance (the largest int64)
ULP_MAX = 2**63 - 1
#: elements compared at once: bounds the temporaries of a comparison (casts, bit patterns, differences)
BLOCK_ELEMENTS = 1 << 22
#: torch.testing.assert_close's default ``(rtol, atol)`` per dtype; other dtypes: (0, 0), i.e. equal
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "F16": (1e-3, 1e-5),
    "BF16": (1.6e-2, 1e-5),
    "F32": (1.3e-6, 1e-5),
    "F64": (1e-7, 1e-7),
}
#: safetensors dtype → torch dtype attribute (looked up on torch; missing ones compare as bytes)
_TORCH_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
#: float dtypes with a sign bit whose bit patterns order like their values (ULPs apply)
_ULP_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
_INTEGER_DTYPES = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
#: names listed in a one-line finding at most
_LISTED = 5


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class TensorComparison:
    """One tensor of a replica against the reference's. Statistics that do not apply are None."""

    tensor: str
    file: str | None  # the reference's file (the replica's, for a tensor only the replica has)
    dtype_reference: str | None  # safetensors dtype name (F32, BF16, ...); None: the reference lacks it
    dtype_replica: str | None
    shape: tuple[int, ...] | None  # the reference's shape (the replica's, for a tensor only it has)
    shape_replica: tuple[int, ...] | None
    ok: bool
    finding: str
    max_ulp: int | None = None  # in ULPs of the lower of the two precisions
    mean_ulp: float | None = None
    max_abs_diff: float | None = None  # None also when a difference is not finite (see finding)
    differing_share: float | None = None  # elements not equal (NaN equals NaN) / elements
    allclose: bool | None = None  # by torch's default tolerances of the lower dtype

    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            d[k] = list(v) if isinstance(v, tuple) else v
        return d


@dataclass(frozen=True)
class ReplicaResult(Prioritised):
    """One cluster's replica compared with the reference replica.

    The tensor and file counts are None where they do not apply: for the reference itself, for a
    replica identical by root (nothing was opened) and for one that could not be read.
    """

    cluster: str
    store: str
    spec: str  # the ref or root asked for
    root: str | None  # None: the spec did not resolve
    reference: bool  # this is the reference replica
    identical: bool  # same content as the reference (same root, or every byte compared equal)
    severity: str  # "ok" | "warning" (P1) | "critical" (P0)
    finding: str
    tensors_compared: int | None = None  # tensors present on both sides (by hash or by value)
    tensors_identical_by_hash: int | None = None
    tensors_failed: int | None = None  # including missing, extra and reshaped ones
    tensors_missing: tuple[str, ...] = ()
    tensors_extra: tuple[str, ...] = ()
    files_differing: tuple[str, ...] = ()  # non-tensor files whose bytes differ
    files_missing: tuple[str, ...] = ()
    files_extra: tuple[str, ...] = ()
    worst: tuple[TensorComparison, ...] = ()  # failures first, then by max_ulp, at most ``top``
    signed_by: tuple[str, ...] = ()  # trusted keys whose signatures hold for the root in this store (with a trust policy)
    trusted: bool | None = None  # None: no trust policy was given


    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            if k == "worst":
                v = [t.to_dict() for t in v]
            elif isinstance(v, tuple):
                v = list(v)
            d[k] = v
        d["priority"] = self.priority
        return d


@dataclass(frozen=True)
class ReplicaReport(Prioritised):
    """Every cluster's replica against the reference replica."""

    reference: str  # the reference's cluster label
    replicas: tuple[ReplicaResult, ...]  # in the order given, the reference included
    severity: str  # the worst replica's
    max_ulps: int
    top: int

    @property
    def ok(self) -> bool:
        return self.severity == "ok"


    def replica(self, cluster: str) -> ReplicaResult:
        for r in self.replicas:
            if r.cluster == cluster:
                return r
        names = ", ".join(r.cluster for r in self.replicas)
        raise KeyError(f"no cluster {cluster!r} in this report; it has {names}")

    def to_dict(self) -> dict:
        ref = self.replica(self.reference)
        return {
            "reference": self.reference,
            "reference_root": ref.root,
            "severity": self.severity,
            "priority": self.priority,
            "ok": self.ok,
            "max_ulps": self.max_ulps,
            "top": self.top,
            "replicas": [r.to_dict() for r in self.replicas],
        }


# --------------------------------------------------------------------------- ULPs and tensors


def _torch_dtype(name: str | None):
    import torch

    attr = _TORCH_DTYPES.get(name or "")
    return getattr(torch, attr, None) if attr else None


def _dtype_name(dtype) -> str:
    attr = str(dtype).removeprefix("torch.")
    for name, a in _TORCH_DTYPES.items():
        if a == attr:
            return name
    return attr


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise distance in ULPs between two float tensors of the same dtype and shape (int64).

    Bits are read as sign and magnitude; same signs: ``|m_a - m_b|``; opposite signs: ``m_a + m_b``
    (so +0 and -0 are 0 apart, and the distance across zero counts every float in between). Two
    NaNs: 0; a NaN against a number: :data:`ULP_MAX`, where distances also saturate.
    """
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(
            f"ulp_distance needs two tensors of one dtype and shape, got {a.dtype} {tuple(a.shape)} and "
            f"{b.dtype} {tuple(b.shape)}; cast the higher-precision one to the other's dtype first"
        )
    name = _dtype_name(a.dtype)
    if name not in _ULP_DTYPES:
        raise ValueError(f"ulp_distance needs a signed float dtype ({', '.join(_ULP_DTYPES)}), got {a.dtype}")
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    mask = (1 << (8 * a.element_size() - 1)) - 1
    ia = a.reshape(-1).view(bits).to(torch.int64)
    ib = b.reshape(-1).view(bits).to(torch.int64)
    ma, mb = ia & mask, ib & mask
    same_sign = (ia < 0) == (ib < 0)
    # opposite signs: m_a + m_b, saturating at ULP_MAX without ever overflowing
    across = torch.minimum(mb, ULP_MAX - ma) + ma
    d = torch.where(same_sign, (ma - mb).abs(), across)
    na, nb = torch.isnan(a.reshape(-1)), torch.isnan(b.reshape(-1))
    d = torch.where(na & nb, 0, torch.where(na | nb, ULP_MAX, d))
    return d.reshape(a.shape)


def _lower_precision(a: str, b: str) -> str:
    import torch

    def key(name: str) -> tuple[float, int]:
        dt = _torch_dtype(name)
        return (torch.finfo(dt).eps, -torch.finfo(dt).bits)

    return max((a, b), key=key)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8)


def compare_tensors(
    reference: torch.Tensor,
    replica: torch.Tensor,
    *,
    max_ulps: int = 1,
    name: str = "",
    file: str | None = None,
) -> TensorComparison:
    """Compare one replica tensor with the reference's (the rules of the module docstring)."""
    import torch

    ref_dt, rep_dt = _dtype_name(reference.dtype), _dtype_name(replica.dtype)
    shape, shape_rep = tuple(reference.shape), tuple(replica.shape)
    common = dict(
        tensor=name, file=file, dtype_reference=ref_dt, dtype_replica=rep_dt, shape=shape, shape_replica=shape_rep
    )
    if shape != shape_rep:
        finding = f"shape {list(shape)} in the reference, {list(shape_rep)} here"
        return TensorComparison(ok=False, finding=finding, **common)
    same = ref_dt == rep_dt
    if same and torch.equal(_flat_bytes(reference), _flat_bytes(replica)):
        stats = dict(max_abs_diff=0.0, differing_share=0.0 if reference.numel() else None)
        if ref_dt in _ULP_DTYPES:
            stats.update(max_ulp=0, mean_ulp=0.0 if reference.numel() else None, allclose=True)
        return TensorComparison(ok=True, finding="identical bytes", **common, **stats)
    if ref_dt in _ULP_DTYPES and rep_dt in _ULP_DTYPES:
        low = ref_dt if same else _lower_precision(ref_dt, rep_dt)
        stats = _float_stats(reference, replica, low)
        within = stats["max_ulp"] is not None and stats["max_ulp"] <= max_ulps
        describe = _describe(stats, low)
        if same:
            return TensorComparison(
                ok=False, finding=f"bytes differ ({describe}); a replica in the same dtype must be bit-identical",
                **common, **stats,
            )
        cast = f"{ref_dt} → {rep_dt}" if low == rep_dt else f"{rep_dt} here, compared as {low}"
        ok = within and bool(stats["allclose"])
        if ok:
            verdict = f"within {max_ulps} ULP of {low} and allclose"
        else:
            reasons = []
            if not within:
                reasons.append(f"more than {max_ulps} ULP of {low}")
            if not stats["allclose"]:
                rtol, atol = DEFAULT_TOLERANCES.get(low, (0.0, 0.0))
                reasons.append(f"not allclose (rtol {rtol:g}, atol {atol:g})")
            verdict = " and ".join(reasons)
        return TensorComparison(ok=ok, finding=f"{cast}: {verdict} ({describe})", **common, **stats)
    if ref_dt in _INTEGER_DTYPES and rep_dt in _INTEGER_DTYPES:
        stats = _integer_stats(reference, replica)
        ok = not same and stats["differing_share"] in (0.0, None)
        if ok:
            finding = f"{ref_dt} → {rep_dt}: equal values"
        else:
            finding = f"values differ ({_describe(stats, None)})"
        return TensorComparison(ok=ok, finding=finding, **common, **stats)
    return TensorComparison(ok=False, finding=_not_numeric(ref_dt, rep_dt), **common)


def _not_numeric(ref_dt: str | None, rep_dt: str | None) -> str:
    if ref_dt == rep_dt:
        return f"bytes differ (dtype {ref_dt} is compared byte for byte)"
    return f"dtype {rep_dt} here, {ref_dt} in the reference: no numeric comparison between them"


def _float_stats(reference: torch.Tensor, replica: torch.Tensor, low: str) -> dict:
    import torch

    low_dt = _torch_dtype(low)
    work = torch.float64 if low == "F64" else torch.float32
    rtol, atol = DEFAULT_TOLERANCES.get(low, (0.0, 0.0))
    a_all, b_all = reference.reshape(-1), replica.reshape(-1)
    n = a_all.numel()
    max_ulp, ulp_sum, differing, max_abs = 0, 0.0, 0, 0.0
    allclose, non_finite = True, False
    for start in range(0, n, BLOCK_ELEMENTS):
        a = a_all[start : start + BLOCK_ELEMENTS].to(low_dt)
        b = b_all[start : start + BLOCK_ELEMENTS].to(low_dt)
        u = ulp_distance(a, b)
        max_ulp = max(max_ulp, int(u.max()))
        ulp_sum += float(u.to(torch.float64).sum())
        differing += int((u != 0).sum())
        del u
        af, bf = a.to(work), b.to(work)
        del a, b
        if allclose and not bool(torch.isclose(bf, af, rtol=rtol, atol=atol, equal_nan=True).all()):
            allclose = False
        d = (af - bf).abs()
        d[(af == bf) | (torch.isnan(af) & torch.isnan(bf))] = 0
        finite = torch.isfinite(d)
        if not bool(finite.all()):
            non_finite = True
            d = d[finite]
        if d.numel():
            max_abs = max(max_abs, float(d.max()))
    if n == 0:
        return dict(max_ulp=0, mean_ulp=None, max_abs_diff=0.0, differing_share=None, allclose=True)
    return dict(
        max_ulp=max_ulp,
        mean_ulp=ulp_sum / n,
        max_abs_diff=None if non_finite else max_abs,
        differing_share=differing / n,
        allclose=allclose,
    )


def _integer_stats(reference: torch.Tensor, replica: torch.Tensor) -> dict:
    import torch

    a_all, b_all = reference.reshape(-1), replica.reshape(-1)
    n = a_all.numel()
    differing, max_abs = 0, 0.0
    for start in range(0, n, BLOCK_ELEMENTS):
        a = a_all[start : start + BLOCK_ELEMENTS].to(torch.float64)
        b = b_all[start : start + BLOCK_ELEMENTS].to(torch.float64)
        d = (a - b).abs()
        differing += int((d != 0).sum())
        if d.numel():
            max_abs = max(max_abs, float(d.max()))
    return dict(max_abs_diff=max_abs, differing_share=differing / n if n else None)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _describe(stats: dict, low: str | None) -> str:
    parts = []
    if stats.get("differing_share") is not None:
        parts.append(f"{_fmt(stats['differing_share'] * 100)}% of elements differ")
    if low is not None and stats.get("max_ulp") is not None:
        u = stats["max_ulp"]
        parts.append("max ULP: NaN against a number or saturated" if u == ULP_MAX else f"max {u} ULP of {low}")
    if stats.get("max_abs_diff") is None and low is not None:
        parts.append("a difference is not finite (inf or NaN against a number)")
    else:
        parts.append(f"max abs diff {_fmt(stats.get('max_abs_diff'))}")
    return ", ".join(parts)


# --------------------------------------------------------------------------- reading


def _memory_limit() -> int:
    """This machine's physical memory in bytes (no tensor larger than it can be compared)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


class _Reader:
    """Assembles a part's bytes from its chunks (each verified), a few chunks in flight at once."""

    def __init__(self, pool: ThreadPoolExecutor, progress: Progress) -> None:
        self.pool = pool
        self.progress = progress

    def part_bytes(self, store: Store, part: Part, chunk_size: int) -> bytearray:
        """The part's bytes. What the manifest claims is checked before memory is taken for it:
        the size against this machine's memory, that every chunk is there, and the first chunk's
        length; so a crafted manifest claiming a huge tensor is a finding, never an allocation."""
        where = f"{store.uri}: part {part.name or part.kind}"
        limit = _memory_limit()
        if part.length > limit:
            raise ManifestError(
                where,
                f"claims {part.length} bytes, more than this machine's {limit} bytes of memory; nothing of it was read",
            )
        spans = list(part.chunk_spans(chunk_size))
        ids = [cid for cid, _, _ in spans]
        missing = set(ids) - store.has_chunks(ids)
        if missing:
            raise ChunkNotFoundError(store.uri, sorted(missing)[0])
        first = store.get_chunk(spans[0][0]) if spans else b""
        if spans and len(first) != spans[0][2]:
            raise ManifestError(where, f"chunk {spans[0][0]} holds {len(first)} bytes, expected {spans[0][2]}")
        buf = bytearray(part.length)
        view = memoryview(buf)

        def fetch(span: tuple[str, int, int]) -> None:
            cid, offset, length = span
            data = first if span is spans[0] else store.get_chunk(cid)
            if len(data) != length:
                raise ManifestError(where, f"chunk {cid} holds {len(data)} bytes, expected {length}")
            start = offset - part.offset
            view[start : start + length] = data
            self.progress.advance(length)

        list(self.pool.map(fetch, spans))
        return buf

    def tensor(self, store: Store, part: Part, chunk_size: int) -> torch.Tensor | bytearray:
        """The tensor (bytes, when torch has no such dtype) of a tensor part."""
        import torch

        buf = self.part_bytes(store, part, chunk_size)
        dt = _torch_dtype(part.dtype)
        if dt is None or part.dtype not in _ULP_DTYPES + _INTEGER_DTYPES:
            return buf
        shape = tuple(part.shape or ())
        numel = math.prod(shape)
        itemsize = torch.empty(0, dtype=dt).element_size()
        if numel * itemsize != len(buf):
            raise ManifestError(
                f"{store.uri}: tensor {part.name}",
                f"{len(buf)} bytes cannot hold {part.dtype} {list(shape)} ({numel * itemsize} bytes)",
            )
        if not buf:
            return torch.empty(shape, dtype=dt)
        t = torch.frombuffer(buf, dtype=dt)
        if sys.byteorder != "little":  # safetensors stores little-endian
            t = t.view(torch.uint8).reshape(-1, itemsize).flip(1).reshape(-1).view(dt)
        return t.reshape(shape)

    def file_digest(self, store: Store, entry: FileEntry, chunk_size: int) -> str:
        h = ChunkHasher()
        for part in entry.parts:
            for cid, _, _ in part.chunk_spans(chunk_size):
                data = store.get_chunk(cid)
                h.update(data)
                self.progress.advance(len(data))
        return h.hexdigest()


def _compare_loaded(ref, rep, ref_part: Part, rep_part: Part, path: str, max_ulps: int) -> TensorComparison:
    if isinstance(ref, (bytes, bytearray)) or isinstance(rep, (bytes, bytearray)):
        common = dict(
            tensor=ref_part.name,
            file=path,
            dtype_reference=ref_part.dtype,
            dtype_replica=rep_part.dtype,
            shape=ref_part.shape,
            shape_replica=rep_part.shape,
        )
        if ref_part.dtype == rep_part.dtype and ref == rep:
            return TensorComparison(ok=True, finding="identical bytes", **common)
        return TensorComparison(ok=False, finding=_not_numeric(ref_part.dtype, rep_part.dtype), **common)
    return compare_tensors(ref, rep, max_ulps=max_ulps, name=ref_part.name, file=path)


# --------------------------------------------------------------------------- pairing


@dataclass
class _Plan:
    """What one differing replica needs: its manifest, and what its comparison found so far."""

    index: int
    store: Store
    manifest: Manifest
    by_hash: int = 0
    compared: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    results: list[TensorComparison] = field(default_factory=list)
    files_differing: list[str] = field(default_factory=list)
    files_missing: list[str] = field(default_factory=list)
    files_extra: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # non-tensor files whose bytes could not be read
    resharded: bool = False  # the tensors sit in other safetensors files than the reference's
    dtype_changes: dict[str, int] = field(default_factory=dict)


def _tensors(manifest: Manifest) -> dict[tuple[str, str], Part]:
    return {(f.path, p.name): p for f in manifest.files for p in f.tensors}


def _pair(ref: Manifest, rep: Manifest) -> tuple[list, list, list]:
    """``(pairs, missing, extra)``: pairs of ``(path, ref part, rep part)`` by file and name, then by
    name alone for tensors left over once on each side; keys ``(path, name)`` of the rest."""
    a, b = _tensors(ref), _tensors(rep)
    pairs = [(key[0], a[key], b[key]) for key in a if key in b]
    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    names_a: dict[str, list] = {}
    names_b: dict[str, list] = {}
    for k in only_a:
        names_a.setdefault(k[1], []).append(k)
    for k in only_b:
        names_b.setdefault(k[1], []).append(k)
    moved = {n for n in names_a if len(names_a[n]) == 1 and len(names_b.get(n, ())) == 1}
    for n in sorted(moved):
        ka, kb = names_a[n][0], names_b[n][0]
        pairs.append((ka[0], a[ka], b[kb]))
    missing = [k for k in only_a if k[1] not in moved]
    extra = [k for k in only_b if k[1] not in moved]
    return pairs, missing, extra


# --------------------------------------------------------------------------- the comparison


def replicas_of(stores: Iterable[Store], ref: str) -> dict[str, tuple[Store, str]]:
    """``{store.uri: (store, ref)}``: the same ref in every store, for :func:`compare_replicas`
    (and :func:`concord.audit.model_cards.compare_cards`)."""
    out: dict[str, tuple[Store, str]] = {}
    for s in stores:
        if s.uri in out:
            raise ReplicaConfigError("replicas_of", f"store {s.uri} is listed twice", "List each store once.")
        out[s.uri] = (s, ref)
    return out


def check_replicas(replicas: Mapping[str, tuple[Store, str]], reference: str | None, what: str) -> str:
    """Validate a ``{cluster: (store, ref or root)}`` mapping; return the reference's label."""
    if not isinstance(replicas, Mapping) or not replicas:
        raise ReplicaConfigError(
            what, "no replicas given", "Pass {cluster: (store, ref or root)}, at least one entry (see replicas_of)."
        )
    for label, value in replicas.items():
        if not (
            isinstance(label, str)
            and isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], Store)
            and isinstance(value[1], str)
            and value[1]
        ):
            raise ReplicaConfigError(
                what,
                f"entry {label!r} is {value!r}",
                "Map each cluster label (a string) to a pair (Store, ref name or 64-hex root).",
            )
    if reference is None:
        return next(iter(replicas))
    if reference not in replicas:
        raise ReplicaConfigError(
            what,
            f"reference {reference!r} is not one of the clusters ({', '.join(replicas)})",
            "Name one of them, or leave it out to use the first.",
        )
    return reference


def compare_replicas(
    replicas: Mapping[str, tuple[Store, str]],
    *,
    reference: str | None = None,
    max_ulps: int = 1,
    top: int = 10,
    progress: Progress | None = None,
    trust: TrustPolicy | None = None,
) -> ReplicaReport:
    """Compare every cluster's replica with the reference replica (``reference``, else the first).

    With ``trust`` (a :class:`~concord.trust.TrustPolicy`), each replica's root must also carry a
    valid signature from a trusted key in its own store: an unsigned or untrusted root, on any
    cluster, is critical (P0), whatever its bytes.

    ``replicas`` maps a cluster label to ``(store, ref or root)``; ``max_ulps`` is how far a tensor
    stored in another dtype may be, in ULPs of the lower precision, from the reference's rounded to
    that precision; ``top`` is how many tensors each replica's ``worst`` lists. ``progress`` counts
    the bytes read.
    """
    ref_label = check_replicas(replicas, reference, "compare_replicas")
    for name, value in (("max_ulps", max_ulps), ("top", top)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "max_ulps" else 1):
            raise ReplicaConfigError(
                "compare_replicas",
                f"{name} must be a whole number {'>= 0' if name == 'max_ulps' else '>= 1'}, got {value!r}",
                "Pass e.g. max_ulps=1, top=10.",
            )
    labels = list(replicas)
    roots: dict[str, str | None] = {}
    problems: dict[str, str] = {}
    for label in labels:
        store, spec = replicas[label]
        try:
            roots[label] = resolve_root(store, spec)
        except ConcordError as exc:
            roots[label] = None
            problems[label] = f"cannot resolve {spec!r}: {exc}"
            continue
        try:  # a root taken from lineage, or a ref whose snapshot was collected, may name nothing here
            if not store.has_manifest(roots[label]):
                problems[label] = str(ManifestNotFoundError(store.uri, roots[label]))
        except ConcordError as exc:
            problems[label] = f"cannot look up snapshot {roots[label]} in {store.uri}: {exc}"

    results: dict[str, ReplicaResult] = {}
    ref_store = replicas[ref_label][0]
    ref_root = roots[ref_label]
    ref_manifest: Manifest | None = None
    differing = [x for x in labels if x != ref_label and x not in problems and roots[x] != ref_root]
    if ref_root is not None and differing:
        try:
            ref_manifest = load_manifest(ref_store, ref_root)
        except ConcordError as exc:
            problems[ref_label] = f"cannot load snapshot {ref_root} from {ref_store.uri}: {exc}"

    def simple(label: str, severity: str, finding: str, identical: bool = False) -> ReplicaResult:
        store, spec = replicas[label]
        return ReplicaResult(
            cluster=label, store=store.uri, spec=spec, root=roots[label], reference=label == ref_label,
            identical=identical, severity=severity, finding=finding,
        )

    if ref_label in problems:
        results[ref_label] = simple(ref_label, "critical", f"reference replica unreadable: {problems[ref_label]}")
    else:
        results[ref_label] = simple(ref_label, "ok", "the reference replica", identical=True)
    plans: list[_Plan] = []
    for i, label in enumerate(labels):
        if label == ref_label:
            continue
        store, _ = replicas[label]
        if label in problems:
            results[label] = simple(label, "critical", problems[label])
        elif ref_label in problems:
            finding = f"not compared: the reference replica {ref_label!r} is unreadable"
            results[label] = simple(label, "warning", finding)
        elif roots[label] == ref_root:
            results[label] = simple(label, "ok", "identical: same root as the reference", identical=True)
        else:
            try:
                manifest = load_manifest(store, roots[label])
            except ConcordError as exc:
                finding = f"cannot load snapshot {roots[label]} from {store.uri}: {exc}"
                results[label] = simple(label, "critical", finding)
                continue
            plans.append(_Plan(i, store, manifest))
    if plans and ref_manifest is not None:  # the reference's manifest is loaded whenever a plan exists
        _run_plans(ref_store, ref_manifest, plans, max_ulps, ensure(progress))
        for plan in plans:
            label = labels[plan.index]
            results[label] = _summarise(plan, simple(label, "ok", ""), ref_manifest, max_ulps, top)
    if trust is not None:
        for label in labels:
            results[label] = _with_trust(results[label], replicas[label][0], trust)
    ordered = tuple(results[label] for label in labels)
    worst = max((r.severity for r in ordered), key=_RANK.__getitem__)
    return ReplicaReport(reference=ref_label, replicas=ordered, severity=worst, max_ulps=max_ulps, top=top)


def _with_trust(r: ReplicaResult, store: Store, trust: TrustPolicy) -> ReplicaResult:
    """``r`` with its root's signatures checked under ``trust``: untrusted is critical."""
    from dataclasses import replace

    if r.root is None:
        return replace(r, trusted=False)
    try:
        v = trust.report(store, r.root)
    except ConcordError as exc:
        return replace(r, trusted=False, severity="critical", finding=f"{r.finding}; signatures unreadable: {exc}")
    if v.trusted:
        return replace(r, signed_by=v.signed_by, trusted=True)
    # signed_by names only keys whose signatures hold: a document that does not verify is a problem, not a signer
    why = "unsigned" if not v.documents else f"not trusted ({v.why()})"
    finding = f"root {r.root[:12]} is {why} (keys tried: {', '.join(k[:16] for k in trust.key_ids)}); {r.finding}"
    return replace(r, signed_by=v.signed_by, trusted=False, severity="critical", finding=finding)


def _run_plans(ref_store: Store, ref: Manifest, plans: list[_Plan], max_ulps: int, progress: Progress) -> None:
    """Settle every plan: pair tensors, compare files, then read each differing tensor."""
    jobs: dict[tuple[str, str], list[tuple[_Plan, Part]]] = {}
    total = 0
    ref_tensor_bytes: dict[tuple[str, str], int] = {}
    file_jobs: list[tuple[_Plan, FileEntry, FileEntry]] = []
    for plan in plans:
        rep = plan.manifest
        pairs, missing, extra = _pair(ref, rep)
        ref_tensors, rep_tensors = _tensors(ref), _tensors(rep)
        for path, name in missing:
            p = ref_tensors[(path, name)]
            plan.missing.append(name)
            missing_here = TensorComparison(name, path, p.dtype, None, p.shape, None, False, "missing from this replica")
            plan.results.append(missing_here)
        for path, name in extra:
            q = rep_tensors[(path, name)]
            plan.extra.append(name)
            only_here = TensorComparison(name, path, None, q.dtype, q.shape, q.shape, False, "only this replica has it")
            plan.results.append(only_here)
        for path, p, q in pairs:
            plan.compared += 1
            if p.hash == q.hash:
                plan.by_hash += 1
                continue
            if p.dtype != q.dtype:
                change = f"{p.dtype}→{q.dtype}"
                plan.dtype_changes[change] = plan.dtype_changes.get(change, 0) + 1
            if tuple(p.shape or ()) != tuple(q.shape or ()):
                plan.results.append(
                    TensorComparison(
                        p.name, path, p.dtype, q.dtype, p.shape, q.shape, ok=False,
                        finding=f"shape {list(p.shape or ())} in the reference, {list(q.shape or ())} here",
                    )
                )
                continue
            key = (path, p.name)
            jobs.setdefault(key, []).append((plan, q))
            ref_tensor_bytes[key] = p.length
            total += q.length
        plan.resharded = {f.path for f in ref.files if f.kind == "safetensors"} != {
            f.path for f in rep.files if f.kind == "safetensors"
        }
        ref_blobs = {f.path: f for f in ref.files if f.kind != "safetensors"}
        rep_blobs = {f.path: f for f in rep.files if f.kind != "safetensors"}
        plan.files_missing.extend(sorted(ref_blobs.keys() - rep_blobs.keys()))
        plan.files_extra.extend(sorted(rep_blobs.keys() - ref_blobs.keys()))
        for path in sorted(ref_blobs.keys() & rep_blobs.keys()):
            a, b = ref_blobs[path], rep_blobs[path]
            if a.hash == b.hash:
                continue
            if a.size != b.size or ref.chunk_size == rep.chunk_size:
                plan.files_differing.append(path)
            else:  # another chunk size: the hashes say nothing, the bytes do
                file_jobs.append((plan, a, b))
                total += a.size + b.size
    total += sum(ref_tensor_bytes.values())
    if not jobs and not file_jobs:
        return
    workers = max(1, ref_store.parallelism, *(p.store.parallelism for p in plans))
    progress.start(total, "compare replicas")
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="concord-replicas") as pool:
            reader = _Reader(pool, progress)
            for plan, a, b in file_jobs:
                try:
                    same = reader.file_digest(ref_store, a, ref.chunk_size) == reader.file_digest(
                        plan.store, b, plan.manifest.chunk_size
                    )
                except ConcordError as exc:
                    plan.unreadable.append(f"{a.path} ({exc})")
                    continue
                if not same:
                    plan.files_differing.append(a.path)
            for f in ref.files:  # in the reference's order, each reference tensor read once
                for p in f.tensors:
                    waiting = jobs.get((f.path, p.name))
                    if not waiting:
                        continue
                    _compare_one(reader, ref_store, ref, f.path, p, waiting, max_ulps)
    finally:
        progress.close()


def _compare_one(
    reader: _Reader, ref_store: Store, ref: Manifest, path: str, p: Part, waiting: list, max_ulps: int
) -> None:
    """Read reference tensor ``p`` once and compare every replica ``waiting`` for it."""
    def failed(q: Part, finding: str) -> TensorComparison:
        return TensorComparison(p.name, path, p.dtype, q.dtype, p.shape, q.shape, ok=False, finding=finding)

    try:
        ref_tensor = reader.tensor(ref_store, p, ref.chunk_size)
    except ConcordError as exc:
        for plan, q in waiting:
            plan.results.append(failed(q, f"the reference's copy is unreadable: {exc}"))
        return
    for plan, q in waiting:
        try:
            rep_tensor = reader.tensor(plan.store, q, plan.manifest.chunk_size)
        except ConcordError as exc:
            plan.results.append(failed(q, f"unreadable in this replica: {exc}"))
            continue
        plan.results.append(_compare_loaded(ref_tensor, rep_tensor, p, q, path, max_ulps))
        del rep_tensor


def _sort_key(t: TensorComparison) -> tuple:
    if t.max_ulp is not None:
        rank = float(t.max_ulp)
    else:
        rank = math.inf if not t.ok else -1.0
    return (t.ok, -rank, -(t.mean_ulp or 0.0), -(t.differing_share or 0.0), t.tensor)


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def _summarise(plan: _Plan, base: ReplicaResult, ref: Manifest, max_ulps: int, top: int) -> ReplicaResult:
    results = sorted(plan.results, key=_sort_key)
    failed = [t.tensor for t in results if not t.ok]
    notes = []
    if plan.files_differing:
        notes.append(f"differing: {_listed(plan.files_differing)}")
    if plan.files_missing:
        notes.append(f"missing: {_listed(plan.files_missing)}")
    if plan.files_extra:
        notes.append(f"only here: {_listed(plan.files_extra)}")
    if plan.unreadable:
        notes.append(f"unreadable: {_listed(plan.unreadable)}")
    files = f"; non-tensor files {'; '.join(notes)}" if notes else ""
    identical = not failed and not notes and not plan.dtype_changes and not plan.resharded
    if failed or plan.unreadable:
        severity = "critical"
        head = f"{len(failed)} tensor(s) fail against the reference: {_listed(failed)}"
        finding = (head if failed else "weights match the reference") + files
    elif notes:
        severity = "warning"
        finding = "weights match the reference" + files
    elif plan.dtype_changes:
        severity = "ok"
        changes = ", ".join(f"{n} tensor(s) {c}" for c, n in sorted(plan.dtype_changes.items()))
        finding = f"weights match the reference within {max_ulps} ULP and torch's default tolerances ({changes})"
    else:
        severity = "ok"
        finding = "same weights as the reference" if plan.resharded else "identical content"
        if plan.manifest.chunk_size != ref.chunk_size:
            finding += " (stored with another chunk size)"
    if plan.resharded and not failed:
        finding += "; the tensors are stored in other safetensors files than the reference's"
    return ReplicaResult(
        cluster=base.cluster,
        store=base.store,
        spec=base.spec,
        root=base.root,
        reference=False,
        identical=identical,
        severity=severity,
        finding=finding,
        tensors_compared=plan.compared,
        tensors_identical_by_hash=plan.by_hash,
        tensors_failed=len(failed),
        tensors_missing=tuple(sorted(plan.missing)),
        tensors_extra=tuple(sorted(plan.extra)),
        files_differing=tuple(sorted(set(plan.files_differing))),
        files_missing=tuple(plan.files_missing),
        files_extra=tuple(plan.files_extra),
        worst=tuple(results[:top]),
    )
