"""LoRA federation math: read PEFT adapters, aggregate their updates exactly, write a PEFT adapter.

Client ``k`` of a round holds, for every adapted module, factors ``A_k`` [r_k, in] and ``B_k``
[out, r_k] and a scale ``s_k`` (``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA; PEFT's
``rank_pattern`` / ``alpha_pattern`` honoured per module). Its update is ``ΔW_k = s_k B_k A_k``.
With weights ``p_k`` (normalised to sum 1) the round's target is the weighted mean of the updates

    ΔW* = Σ_k p_k ΔW_k = B_cat A_cat,   B_cat = [p_1 s_1 B_1 | … | p_n s_n B_n],   A_cat = [A_1; …; A_n]

The common practice (FedIT, Flower's FlowerTune) averages the factors instead, and
``mean(B)·mean(A) ≠ mean(B·A)``. The methods of :func:`aggregate`:

``exact``
    ΔW* refactored without ever forming a dense [out, in] matrix: QR of ``B_cat = Q_B R_B`` and of
    ``A_catᵀ = Q_A R_A``, SVD of the small core ``R_B R_Aᵀ = U S Vᵀ`` ([Σr, Σr]), so
    ``ΔW* = (Q_B U) S (Q_A V)ᵀ``; the result is ``B' = Q_B U S^½``, ``A' = S^½ Vᵀ Q_Aᵀ``. By default
    every singular value above ``max(out, in, Σr) · ε₆₄ · σ₁`` is kept (the zeros left by
    rank-deficient stacks are trimmed), which is ΔW* to float precision. With ``rank=r`` below
    that, the module keeps its ``r`` largest singular values: by Eckart–Young the best rank-r
    approximation in Frobenius norm; ``relative_error`` is then
    ``sqrt(Σ_m Σ_{i>r} σ_{m,i}²) / sqrt(Σ_m Σ_i σ_{m,i}²)`` over all modules ``m``. The math runs
    in float64; the factors come out in the adapters' common dtype (float32 if they differ).
``stack``
    FLoRA: ``B' = B_cat``, ``A' = A_cat``; rank Σ r_k, exact, no decomposition, no truncation.
``fedex``
    FedEx-LoRA: the adapter is the factor-wise mean at the clients' rank R (as ``fedavg``), and
    the residual ``ΔW* − B'A'`` (in weight space: each client's scale ``s_k`` and clip factor
    already in, so nothing is scaled twice) is returned per module in ``residuals``, to be folded
    into the frozen base weights (:func:`fold_into_base`). Base + residual + ``B'A'`` is then
    ``W₀ + ΔW*`` (the exact weighted mean of the clients' merged models) at a fixed rank R, round
    after round, where ``exact`` at rank R truncates and ``stack`` grows the rank by Σ r_k.
    ``relative_error`` is that of the folded model (0); ``residual_share`` says how much of
    ``‖ΔW*‖`` had to be folded. Same ranks per module needed, as for ``fedavg``.
``fedavg``
    The factor-wise mean, for compatibility and comparison: ``A' = Σ_k p_k A_k`` and
    ``B' = Σ_k p_k s_k B_k`` (every client's scale folded into its B). When all clients share one
    scale ``s`` this is exactly the common practice ``s · mean(B) · mean(A)``. It needs equal ranks
    per module. Its ``relative_error`` is its distance to ΔW*, ``‖B'A' − ΔW*‖ / ‖ΔW*‖``.

Every result has its scale folded into B, so the written adapter has ``lora_alpha / r = 1`` for
every module (``rank_pattern`` and ``alpha_pattern`` carry the modules whose rank differs from the
largest one, as PEFT's own conversions write them).

Robust options act on the updates ΔW_k, never on the factors, and run in this order:

1. ``max_norm_ratio=ρ`` rejects every client with ``‖ΔW_k‖ > ρ · median_j ‖ΔW_j‖``;
2. ``clip_norm=C`` scales each client with ``‖ΔW_k‖ > C`` down to norm ``C``;
3. ``robust="krum"`` (Multi-Krum) or ``"trimmed"`` rejects ``f`` of the ``m`` remaining clients,
   ``f = max(1, min(ceil(trim_fraction · m), floor((m − 1) / 2)))``: ``trim_fraction`` is the
   share of clients assumed Byzantine, and a majority is always kept. Krum scores each client by
   the sum of its squared distances to its ``max(1, m − f − 2)`` nearest neighbours and keeps the
   ``m − f`` lowest scores; ``trimmed`` drops the ``f`` clients with the largest mean distance to
   the others. Both need ``m ≥ 3``. Distances are those of the clipped updates.

Rejected clients get weight 0 and the others' weights are renormalised. Norms and distances come
from the factors through small Gram matrices, never from dense updates:
``‖ΔW_k‖² = s_k² tr((B_kᵀB_k)(A_kA_kᵀ))`` and
``⟨ΔW_i, ΔW_j⟩ = s_i s_j tr((B_iᵀB_j)(A_jA_iᵀ))``, summed over modules.

The bound. Let ``p`` be the normalised weights as given, ``c_k ≤ 1`` the clip factors, and
``R_j = Σ_{k≠j} p_k c_k ΔW_k`` the aggregate had client ``j`` sent nothing. If no honest client is
rejected, then whatever ``j`` sends, ``‖ΔŴ − R_j‖_F ≤ p_j · M`` where ``M`` is the largest norm of
any update that enters the aggregate: if ``j`` is accepted the difference is ``p_j c_j ΔW_j``; if
it is rejected, ``ΔŴ = R_j / (1 − p_j)`` and ``‖ΔŴ − R_j‖ = p_j/(1 − p_j) · ‖R_j‖ ≤ p_j max_{k≠j}
c_k‖ΔW_k‖``. With ``clip_norm=C``, ``M ≤ C``; with ``max_norm_ratio=ρ``, ``M ≤ ρ · median``, and
while fewer than half the clients are poisoned the median is at most the largest honest norm.
(For ``exact`` at a reduced rank, the truncation error comes on top.)

Only the standard library is imported at module import; torch, safetensors and peft's formats
are used inside the functions.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import os
import re
import shutil
import statistics
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from concord.errors import AdapterError, AdapterOutputExistsError, AggregationError, RoundMismatchError

if TYPE_CHECKING:
    import torch

    from concord.snapshots.safetensors_header import TensorInfo

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
#: prefix of module names in PEFT's saved files; rank/alpha patterns match the name without it
PEFT_PREFIX = "base_model.model."
METHODS = ("exact", "stack", "fedavg", "fedex")
#: safetensors dtypes a residual can be folded into, as torch dtype names
FOLD_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
ROBUST = ("none", "krum", "trimmed")
REQUIRED_CONFIG = ("r", "lora_alpha", "target_modules", "base_model_name_or_path")
#: initialisations that change the base weights: their factors are not updates of the base
BASE_CHANGING_INITS = ("pissa", "olora", "loftq", "corda", "lora_ga")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: config fields of LoRA variants whose update is not ``scale * B @ A`` of the saved factors
UNSUPPORTED_VARIANTS = (
    ("use_dora", "DoRA"),
    ("lora_bias", "a LoRA bias"),
    ("use_qalora", "QALoRA"),
    ("use_bdlora", "block-diagonal LoRA"),
    ("kasa_config", "KaSA"),
    ("monteclora_config", "MonteCLoRA"),
    ("arrow_config", "Arrow routing"),
    ("target_parameters", "LoRA on raw parameters"),
)

_KEY = re.compile(r"^(?P<name>.+)\.lora_(?P<factor>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")


# --------------------------------------------------------------------------- types


@dataclass(frozen=True, eq=False)
class LoraModule:
    """One adapted module: its update is ``scale * B @ A``."""

    #: module path without the lora_A/lora_B suffix, e.g. "base_model.model.encoder.layer.0.attention.self.query"
    name: str
    A: torch.Tensor = field(repr=False)  # [r, in], float32
    B: torch.Tensor = field(repr=False)  # [out, r], float32
    scale: float = 1.0

    @property
    def rank(self) -> int:
        return int(self.A.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.A.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.B.shape[0])


@dataclass(frozen=True, eq=False)
class Adapter:
    """A PEFT LoRA adapter read from a folder; ``dtype`` is the dtype its file stores."""

    path: str
    config: dict = field(repr=False)
    base_model: str
    modules: dict[str, LoraModule] = field(repr=False)
    dtype: str

    def delta(self, name: str) -> torch.Tensor:
        """The dense update ``scale * B @ A`` of one module (for tests and small cases)."""
        m = self.modules[name]
        return m.scale * (m.B @ m.A)


@dataclass(frozen=True)
class ClientReport:
    """What the aggregation made of one client."""

    index: int
    path: str
    #: final weight in the aggregate (0 when rejected); the accepted ones sum to 1
    weight: float
    #: Frobenius norm of the client's whole update ‖ΔW_k‖ (all modules), before clipping
    norm: float
    #: mean Frobenius distance of its (clipped) update to those of the other clients that passed
    #: the norm check
    distance: float
    accepted: bool
    clipped: bool
    #: why it was rejected or clipped; empty when it entered unchanged
    reason: str


@dataclass(frozen=True, eq=False)
class AggregateResult:
    method: str
    #: the largest rank over modules (the written config's ``r``)
    rank: int
    ranks: dict[str, int]
    clients: tuple[ClientReport, ...]
    #: ‖ΔW* − ΔŴ‖ / ‖ΔW*‖ against the exact weighted mean of the accepted (clipped) updates
    relative_error: float
    #: name -> (A [r, in], B [out, r]) with the scale folded into B: the update is B @ A
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    base_model: str
    #: ``fedex`` only: name -> the dense float64 residual [out, in] to add to the base weight
    residuals: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    #: ``fedex`` only: ‖residual‖ / ‖ΔW*‖ over all modules (how much was folded into the base)
    residual_share: float | None = None

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "rank": self.rank,
            "ranks": dict(self.ranks),
            "clients": [asdict(c) for c in self.clients],
            "relative_error": self.relative_error,
            "base_model": self.base_model,
            **({"residual_share": self.residual_share} if self.method == "fedex" else {}),
        }


# --------------------------------------------------------------------------- reading


def read_adapter(path: str | os.PathLike) -> Adapter:
    """Read and validate the PEFT LoRA adapter in folder ``path``; factors come back as float32.

    Raises :class:`~concord.errors.AdapterError` (a ``ValueError``) naming the first problem: a
    missing or malformed config, tensors that are not LoRA factors, a factor without its partner,
    inconsistent shapes or ranks, NaN or Inf values.
    """
    import torch
    from safetensors import safe_open

    folder = os.fspath(path)
    if not os.path.isdir(folder):
        problem = "no such folder" if not os.path.exists(folder) else "not a folder (pass the adapter's folder)"
        raise AdapterError(folder, problem)
    config = _read_config(folder)
    weights = os.path.join(folder, WEIGHTS_NAME)
    if not os.path.isfile(weights):
        extra = ""
        if os.path.isfile(os.path.join(folder, "adapter_model.bin")):
            extra = " (it holds adapter_model.bin: save with safe_serialization=True)"
        raise AdapterError(folder, f"{WEIGHTS_NAME} is missing{extra}")

    factors: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    adapter_names: set[str | None] = set()
    try:
        with safe_open(weights, framework="pt") as f:
            keys = list(f.keys())
            others = [k for k in keys if not _KEY.match(k)]
            if others:
                shown = ", ".join(others[:3]) + (" …" if len(others) > 3 else "")
                raise AdapterError(
                    folder,
                    f"{WEIGHTS_NAME} holds {len(others)} tensor(s) that are not LoRA factors "
                    f"'<module>.lora_A.weight' / '<module>.lora_B.weight' ({shown})",
                )
            for key in keys:
                m = _KEY.match(key)
                slot = factors.setdefault(m["name"], {})
                if m["factor"] in slot:
                    raise AdapterError(folder, f"module {m['name']} has two lora_{m['factor']} tensors ({slot[m['factor']][0]}, {key})")
                slot[m["factor"]] = (key, f.get_tensor(key))
                adapter_names.add(m["adapter"])
    except AdapterError:
        raise
    except Exception as exc:  # the safetensors library raises its own error types
        raise AdapterError(folder, f"{WEIGHTS_NAME} cannot be read: {exc}") from exc
    if not factors:
        raise AdapterError(folder, f"{WEIGHTS_NAME} holds no LoRA factors")
    if len(adapter_names) > 1:
        raise AdapterError(folder, f"{WEIGHTS_NAME} mixes the factors of several adapters {sorted(map(str, adapter_names))}")

    rank_pattern, alpha_pattern = config["rank_pattern"] or {}, config["alpha_pattern"] or {}
    rslora = bool(config.get("use_rslora", False))
    modules: dict[str, LoraModule] = {}
    dtypes: set[str] = set()
    for name in sorted(factors):
        slot = factors[name]
        for want, have in (("A", "B"), ("B", "A")):
            if want not in slot:
                raise AdapterError(folder, f"module {name}: lora_{have}.weight has no lora_{want}.weight partner")
        a, b = slot["A"][1], slot["B"][1]
        if a.ndim != 2 or b.ndim != 2:
            raise AdapterError(
                folder,
                f"module {name}: lora_A is {tuple(a.shape)} and lora_B {tuple(b.shape)}, expected 2-D "
                "[r, in] and [out, r] (convolution LoRA is not supported)",
            )
        if a.shape[0] != b.shape[1]:
            raise AdapterError(
                folder, f"module {name}: lora_A is {tuple(a.shape)} but lora_B {tuple(b.shape)}; their ranks differ"
            )
        if 0 in a.shape or 0 in b.shape:
            raise AdapterError(folder, f"module {name}: empty factors {tuple(a.shape)}, {tuple(b.shape)}")
        for t in (a, b):
            dtype = str(t.dtype).removeprefix("torch.")
            if dtype not in FLOAT_DTYPES:
                raise AdapterError(folder, f"module {name}: factors of dtype {dtype}; expected one of {', '.join(FLOAT_DTYPES)}")
            dtypes.add(dtype)
        a32, b32 = a.to(torch.float32).contiguous(), b.to(torch.float32).contiguous()
        for label, t in (("lora_A", a32), ("lora_B", b32)):
            if not bool(torch.isfinite(t).all()):
                raise AdapterError(folder, f"module {name}: {label} holds NaN or Inf values")
        r = int(a.shape[0])
        key = name.removeprefix(PEFT_PREFIX)
        r_cfg = _pattern_value(rank_pattern, key, config["r"])
        if r_cfg != r:
            raise AdapterError(
                folder, f"module {name}: its factors have rank {r} but adapter_config.json gives it r={r_cfg}"
            )
        alpha = _pattern_value(alpha_pattern, key, config["lora_alpha"])
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        modules[name] = LoraModule(name, a32, b32, float(scale))
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    return Adapter(folder, config, config["base_model_name_or_path"], modules, dtype)


def _read_config(folder: str) -> dict:
    cfg_path = os.path.join(folder, CONFIG_NAME)
    if not os.path.isfile(cfg_path):
        raise AdapterError(folder, f"{CONFIG_NAME} is missing")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise AdapterError(folder, f"{CONFIG_NAME} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(folder, f"{CONFIG_NAME} is not a JSON object")
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(folder, f"peft_type is {config.get('peft_type')!r}, not 'LORA'")
    missing = [k for k in REQUIRED_CONFIG if k not in config]
    if missing:
        raise AdapterError(folder, f"{CONFIG_NAME} lacks {', '.join(missing)}")
    r, alpha = config["r"], config["lora_alpha"]
    if not _is_int(r) or r < 1:
        raise AdapterError(folder, f"r is {r!r}, expected a positive integer")
    if not _is_number(alpha):
        raise AdapterError(folder, f"lora_alpha is {alpha!r}, expected a finite number")
    targets = config["target_modules"]
    if not (isinstance(targets, str) and targets) and not (
        isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
    ):
        raise AdapterError(folder, f"target_modules is {targets!r}, expected a module name list or a regex")
    base = config["base_model_name_or_path"]
    if not isinstance(base, str) or not base:
        raise AdapterError(folder, f"base_model_name_or_path is {base!r}; set it to the base model's name or path")
    for flag, what in UNSUPPORTED_VARIANTS:
        if config.get(flag):
            raise AdapterError(folder, f"{flag} is set: {what} is not a plain low-rank update and cannot be aggregated")
    for key in ("modules_to_save", "trainable_token_indices"):
        if config.get(key):
            raise AdapterError(folder, f"{key} is set ({config[key]!r}): only LoRA factors can be aggregated")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(BASE_CHANGING_INITS):
        raise AdapterError(
            folder,
            f"init_lora_weights is {init!r}, which changes the base weights; convert it to a plain LoRA "
            "adapter first (peft's save_pretrained with path_initial_model_for_weight_conversion)",
        )
    for key, check in (("rank_pattern", lambda v: _is_int(v) and v >= 1), ("alpha_pattern", _is_number)):
        patterns = config.get(key) or {}
        if not isinstance(patterns, dict):
            raise AdapterError(folder, f"{key} is {patterns!r}, expected an object")
        for pat, value in patterns.items():
            try:
                re.compile(pat)
            except re.error as exc:
                raise AdapterError(folder, f"{key} key {pat!r} is not a valid regex: {exc}") from exc
            if not check(value):
                raise AdapterError(folder, f"{key}[{pat!r}] is {value!r}")
        config[key] = patterns
    return config


def _pattern_value(patterns: dict, key: str, default):
    """PEFT's rule (``peft.utils.other.get_pattern_key``): the first pattern in order that matches
    the module's name, or a dotted suffix of it, as a whole."""
    for pat, value in patterns.items():
        if re.match(rf"(.*\.)?({pat})$", key):
            return value
    return default


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


# --------------------------------------------------------------------------- rounds


def check_round(adapters: Sequence[Adapter]) -> None:
    """All adapters target the same base model and the same modules with the same shapes.

    Ranks and alphas may differ. The reference is what most adapters agree on (the first one's on
    a tie); :class:`~concord.errors.RoundMismatchError` names the first adapter that differs.
    """
    adapters = list(adapters)
    if not adapters:
        raise AggregationError("no adapters given", "Pass at least one adapter.")
    sigs = [(a.base_model, _shapes(a)) for a in adapters]
    ref_base, ref_shapes = Counter(sigs).most_common(1)[0][0]
    for i, (a, (base, shapes)) in enumerate(zip(adapters, sigs)):
        if base != ref_base:
            raise RoundMismatchError(a.path, f"its base model is {base!r}, the round's is {ref_base!r}", i)
        if shapes == ref_shapes:
            continue
        mine, theirs = dict(shapes), dict(ref_shapes)
        lacks = sorted(set(theirs) - set(mine))
        extra = sorted(set(mine) - set(theirs))
        if lacks:
            raise RoundMismatchError(a.path, f"it lacks {len(lacks)} module(s) the others adapt ({_few(lacks)})", i)
        if extra:
            raise RoundMismatchError(a.path, f"it adapts {len(extra)} module(s) the others do not ({_few(extra)})", i)
        name = next(n for n in mine if mine[n] != theirs[n])
        (o1, i1), (o2, i2) = mine[name], theirs[name]
        raise RoundMismatchError(a.path, f"module {name} is [{o1}, {i1}] (out, in), the others' [{o2}, {i2}]", i)


def _shapes(a: Adapter) -> tuple[tuple[str, tuple[int, int]], ...]:
    return tuple(sorted((n, (m.out_features, m.in_features)) for n, m in a.modules.items()))


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (" …" if len(names) > 3 else "")


# --------------------------------------------------------------------------- norms and distances


def _inner_products(adapters: Sequence[Adapter]) -> torch.Tensor:
    """``G[i, j] = ⟨ΔW_i, ΔW_j⟩`` (Frobenius, summed over modules) from the factors, in float64.

    Per module, with every client's factors stacked (``B_all`` [out, Σr], ``A_all`` [Σr, in]),
    ``H = (B_allᵀ B_all) ∘ (A_all A_allᵀ)`` and the block sum of ``H`` over client ``i``'s rows
    and ``j``'s columns is ``tr((B_iᵀB_j)(A_jA_iᵀ))``.
    """
    import torch

    n = len(adapters)
    total = torch.zeros(n, n, dtype=torch.float64)
    for name in adapters[0].modules:
        mods = [a.modules[name] for a in adapters]
        b_all = torch.cat([m.B for m in mods], 1).to(torch.float64)
        a_all = torch.cat([m.A for m in mods], 0).to(torch.float64)
        h = (b_all.T @ b_all).mul_(a_all @ a_all.T)
        owner = torch.repeat_interleave(torch.arange(n), torch.tensor([m.rank for m in mods]))
        e = torch.nn.functional.one_hot(owner, n).to(torch.float64)  # [Σr, n]
        s = torch.tensor([m.scale for m in mods], dtype=torch.float64)
        total += (e.T @ h @ e) * torch.outer(s, s)
    return total


def update_norms(adapters: Sequence[Adapter]) -> list[float]:
    """``‖ΔW_k‖_F`` of each adapter's whole update (all modules), from Gram matrices of the factors."""
    adapters = list(adapters)
    check_round(adapters)
    g = _inner_products(adapters)
    return [math.sqrt(max(float(g[k, k]), 0.0)) for k in range(len(adapters))]


def pairwise_distances(adapters: Sequence[Adapter]) -> list[list[float]]:
    """``‖ΔW_i − ΔW_j‖_F`` for every pair (all modules), from Gram matrices of the factors."""
    adapters = list(adapters)
    check_round(adapters)
    return _distances(_inner_products(adapters), [1.0] * len(adapters))


def _distances(g: torch.Tensor, c: list[float]) -> list[list[float]]:
    """Distances between the updates scaled by ``c`` (clip factors), given their inner products."""
    n = len(c)
    out = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            d2 = c[i] ** 2 * float(g[i, i]) + c[j] ** 2 * float(g[j, j]) - 2 * c[i] * c[j] * float(g[i, j])
            out[i][j] = out[j][i] = math.sqrt(max(d2, 0.0))
    return out


# --------------------------------------------------------------------------- aggregation


def aggregate(
    adapters: Sequence[Adapter],
    *,
    method: Literal["exact", "stack", "fedavg", "fedex"] = "exact",
    weights: Sequence[float] | None = None,
    rank: int | None = None,
    clip_norm: float | None = None,
    robust: Literal["none", "krum", "trimmed"] = "none",
    trim_fraction: float = 0.2,
    max_norm_ratio: float | None = 10.0,
) -> AggregateResult:
    """Aggregate the updates of ``adapters`` into one low-rank update (see the module's docstring).

    ``weights`` (e.g. numbers of examples; default equal) are normalised to sum 1. ``rank`` caps
    the rank of every module and applies to ``exact`` only. The result's factors carry the scale
    in B; write them with :func:`write_adapter`.
    """
    import torch

    adapters = list(adapters)
    _check_options(method, rank, clip_norm, robust, trim_fraction, max_norm_ratio)
    check_round(adapters)
    p = _normalise_weights(weights, len(adapters))
    g = _inner_products(adapters)
    w, c, reports = _select(adapters, p, g, clip_norm, robust, trim_fraction, max_norm_ratio)
    active = [k for k in range(len(adapters)) if w[k] > 0]
    out_dtype = getattr(torch, _output_dtype([adapters[k] for k in active]))

    modules: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    residuals: dict[str, torch.Tensor] = {}
    ranks: dict[str, int] = {}
    lost = total = 0.0
    for name in adapters[0].modules:
        mods = [adapters[k].modules[name] for k in active]
        wk = [w[k] for k in active]
        gain = [c[k] * m.scale for k, m in zip(active, mods)]
        if method == "exact":
            a, b, lost_m, total_m = _exact_module(mods, [x * y for x, y in zip(wk, gain)], rank)
        elif method == "stack":
            a, b = _stacked(mods, [x * y for x, y in zip(wk, gain)])
            lost_m = total_m = 0.0
        elif method == "fedex":
            a, b, lost_m, total_m = _fedavg_module(name, mods, wk, gain)
            # the low-rank result as it is written (in the output dtype), so that the residual
            # makes up for the rounding of the factors too
            a, b = a.to(out_dtype).to(torch.float64), b.to(out_dtype).to(torch.float64)
            a_cat, b_cat = _stacked(mods, [x * y for x, y in zip(wk, gain)])
            residuals[name] = b_cat @ a_cat - b @ a
        else:
            a, b, lost_m, total_m = _fedavg_module(name, mods, wk, gain)
        lost += lost_m
        total += total_m
        modules[name] = (a.to(out_dtype).contiguous(), b.to(out_dtype).contiguous())
        ranks[name] = int(a.shape[0])
    share = math.sqrt(lost / total) if total > 0 else 0.0
    return AggregateResult(
        method=method,
        rank=max(ranks.values()),
        ranks=ranks,
        clients=tuple(reports),
        relative_error=0.0 if method == "fedex" else share,
        modules=modules,
        base_model=adapters[0].base_model,
        residuals=residuals,
        residual_share=share if method == "fedex" else None,
    )


def _check_options(method, rank, clip_norm, robust, trim_fraction, max_norm_ratio) -> None:
    if method not in METHODS:
        raise AggregationError(f"unknown method {method!r}", f"Choose one of {', '.join(METHODS)}.")
    if robust not in ROBUST:
        raise AggregationError(f"unknown robust option {robust!r}", f"Choose one of {', '.join(ROBUST)}.")
    if rank is not None:
        if not _is_int(rank) or rank < 1:
            raise AggregationError(f"rank is {rank!r}", "Pass a positive integer, or None for the exact rank.")
        if method != "exact":
            raise AggregationError(
                f"rank applies to method 'exact' only, not {method!r}",
                "stack keeps every client's rank and fedavg the clients' common rank; drop rank or use exact.",
            )
    if clip_norm is not None and not (_is_number(clip_norm) and clip_norm > 0):
        raise AggregationError(f"clip_norm is {clip_norm!r}", "Pass a positive number, or None not to clip.")
    if max_norm_ratio is not None and not (_is_number(max_norm_ratio) and max_norm_ratio >= 1):
        raise AggregationError(
            f"max_norm_ratio is {max_norm_ratio!r}", "Pass a number of at least 1, or None not to reject by norm."
        )
    if not (_is_number(trim_fraction) and 0 < trim_fraction < 0.5):
        raise AggregationError(f"trim_fraction is {trim_fraction!r}", "Pass a share strictly between 0 and 0.5.")


def _normalise_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0 / n] * n
    ws = list(weights)
    if len(ws) != n:
        raise AggregationError(f"{len(ws)} weights for {n} adapters", "Pass one weight per adapter, in order.")
    for i, x in enumerate(ws):
        if not _is_number(x) or x < 0:
            raise AggregationError(
                f"weight {i} is {x!r}", "Weights must be finite and non-negative (e.g. numbers of examples)."
            )
    ws = [float(x) for x in ws]
    try:
        total = math.fsum(ws)
    except OverflowError:
        total = math.inf
    if not math.isfinite(total):
        raise AggregationError(
            "the weights sum to more than the largest float", "Scale them down (only their ratios matter), e.g. 0.5,0.5."
        )
    if total <= 0:
        raise AggregationError("the weights sum to zero", "Give at least one adapter a positive weight.")
    return [x / total for x in ws]


def _byzantine_count(m: int, trim_fraction: float) -> int:
    """How many of ``m`` clients krum and trimmed reject: the assumed Byzantine share, at least
    one, always leaving a majority."""
    return max(1, min(math.ceil(trim_fraction * m - 1e-9), (m - 1) // 2))


def _select(adapters, p, g, clip_norm, robust, trim_fraction, max_norm_ratio):
    """Norm rejection, clipping and robust selection; returns final weights, clip factors, reports."""
    n = len(adapters)
    norms = [math.sqrt(max(float(g[k, k]), 0.0)) for k in range(n)]
    accepted = [p[k] > 0 for k in range(n)]
    reasons = ["" if accepted[k] else "weight 0" for k in range(n)]
    live = [k for k in range(n) if accepted[k]]
    if max_norm_ratio is not None and live:
        median = statistics.median(norms[k] for k in live)
        for k in live:
            if norms[k] > max_norm_ratio * median:
                accepted[k] = False
                reasons[k] = f"norm {norms[k]:.4g} exceeds max_norm_ratio {max_norm_ratio:g} × median norm {median:.4g}"
    c = [1.0] * n
    if clip_norm is not None:
        for k in range(n):
            if norms[k] > clip_norm:
                c[k] = clip_norm / norms[k]
    dist = _distances(g, c)
    peers = [k for k in range(n) if accepted[k]]
    if robust != "none":
        m = len(peers)
        if m < 3:
            raise AggregationError(
                f"robust={robust!r} needs at least 3 accepted clients, {m} left",
                "Use robust='none' (with clip_norm) for smaller rounds.",
            )
        f = _byzantine_count(m, trim_fraction)
        if robust == "krum":
            near = max(1, m - f - 2)
            score = {i: sum(sorted(dist[i][j] ** 2 for j in peers if j != i)[:near]) for i in peers}
            what = f"krum score (squared distances to its {near} nearest)"
        else:
            score = {i: statistics.fmean(dist[i][j] for j in peers if j != i) for i in peers}
            what = "mean distance to the others"
        for i in sorted(peers, key=lambda i: (score[i], i))[m - f :]:
            accepted[i] = False
            reasons[i] = f"{robust}: {what} {score[i]:.4g} is among the {f} highest of {m}"
    kept = math.fsum(p[k] for k in range(n) if accepted[k])
    if kept <= 0:
        raise AggregationError("every client was rejected", "Loosen max_norm_ratio or check the adapters.")
    w = [p[k] / kept if accepted[k] else 0.0 for k in range(n)]
    reports = []
    for k in range(n):
        others = [dist[k][j] for j in peers if j != k]
        clipped = accepted[k] and c[k] < 1.0
        if clipped:
            reasons[k] = f"clipped from norm {norms[k]:.4g} to {clip_norm:g}"
        reports.append(
            ClientReport(
                index=k,
                path=adapters[k].path,
                weight=w[k],
                norm=norms[k],
                distance=statistics.fmean(others) if others else 0.0,
                accepted=accepted[k],
                clipped=clipped,
                reason=reasons[k],
            )
        )
    return w, c, reports


def _output_dtype(adapters: Sequence[Adapter]) -> str:
    dtypes = {a.dtype for a in adapters}
    return dtypes.pop() if len(dtypes) == 1 else "float32"


def _stacked(mods: Sequence[LoraModule], coefs: Sequence[float]):
    """``B_cat = [c_1 B_1 | …]`` and ``A_cat = [A_1; …]`` in float64: ``B_cat @ A_cat = Σ c_k B_k A_k``."""
    import torch

    b = torch.cat([m.B.to(torch.float64) * x for m, x in zip(mods, coefs)], 1)
    a = torch.cat([m.A.to(torch.float64) for m in mods], 0)
    return a, b


def _exact_module(mods, coefs, rank_cap):
    """The rank-trimmed (or capped) SVD refactoring of ``Σ c_k B_k A_k`` via QR of the stacked
    factors; returns A, B, the squared singular values cut by the cap, and the total.

    The QRs stay in Householder form (``geqrf``): only ``Q_B U_r`` and ``Q_A V_r`` are ever
    applied (``ormqr``), never the explicit Q factors.
    """
    import torch

    a_cat, b_cat = _stacked(mods, coefs)
    out_f, in_f = b_cat.shape[0], a_cat.shape[1]
    h_b, tau_b = torch.geqrf(b_cat)  # B_cat = Q_B R_B
    h_a, tau_a = torch.geqrf(a_cat.T.contiguous())  # A_catᵀ = Q_A R_A
    k_b, k_a = min(b_cat.shape), min(a_cat.shape)
    u, s, vh = torch.linalg.svd(h_b[:k_b].triu() @ h_a[:k_a].triu().T, full_matrices=False)
    tol = float(s[0]) * max(out_f, in_f, a_cat.shape[0]) * torch.finfo(torch.float64).eps if s.numel() else 0.0
    keep = int((s > tol).sum()) if s.numel() and float(s[0]) > 0 else 0
    r = keep if rank_cap is None else min(keep, rank_cap)
    s2 = s.square()
    total = float(s2.sum())
    lost = float(s2[r:keep].sum())
    if r == 0:  # a zero update: PEFT needs r >= 1, so one zero pair
        return torch.zeros(1, in_f, dtype=torch.float64), torch.zeros(out_f, 1, dtype=torch.float64), 0.0, total
    root = s[:r].sqrt()
    x = torch.zeros(out_f, r, dtype=torch.float64)
    x[:k_b] = u[:, :r] * root
    y = torch.zeros(in_f, r, dtype=torch.float64)
    y[:k_a] = vh[:r].T * root
    b = torch.ormqr(h_b, tau_b, x)  # Q_B U_r S_r^½
    a = torch.ormqr(h_a, tau_a, y).T  # (Q_A V_r S_r^½)ᵀ
    return a, b, lost, total


def _fedavg_module(name, mods, wk, gain):
    """``A' = Σ w_k A_k``, ``B' = Σ w_k g_k B_k`` (g_k = clip factor × scale), and its squared
    distance to the exact ``Σ w_k g_k B_k A_k`` with that squared norm, via Gram matrices."""
    import torch

    ranks = sorted({m.rank for m in mods})
    if len(ranks) > 1:
        raise AggregationError(
            f"fedavg needs one rank per module across clients; module {name} has ranks {ranks}",
            "Use method='exact' or 'stack', which accept any ranks.",
        )
    a = sum(m.A.to(torch.float64) * x for m, x in zip(mods, wk))
    b = sum(m.B.to(torch.float64) * (x * y) for m, x, y in zip(mods, wk, gain))
    a_cat, b_cat = _stacked(mods, [x * y for x, y in zip(wk, gain)])
    x = torch.cat([b, -b_cat], 1)
    y = torch.cat([a, a_cat], 0)
    err2 = float(((x.T @ x) * (y @ y.T)).sum())
    total2 = float(((b_cat.T @ b_cat) * (a_cat @ a_cat.T)).sum())
    return a, b, max(err2, 0.0), max(total2, 0.0)


# --------------------------------------------------------------------------- writing


def write_adapter(result: AggregateResult, out_dir: str | os.PathLike, *, like: Adapter) -> str:
    """Write ``result`` as a PEFT adapter folder ``out_dir`` and return its absolute path.

    Tensor names are PEFT's saved names (``<module>.lora_A.weight``, module names as in ``like``);
    the config is ``like``'s with ``r`` = the largest rank, ``lora_alpha = r``, per-module
    ``rank_pattern`` / ``alpha_pattern`` giving every module ``alpha / r = 1``, rsLoRA off. The
    folder is assembled under a temporary name beside ``out_dir``, read back and checked, then
    renamed into place; ``out_dir`` must not exist or be empty.
    """
    from safetensors.torch import save_file

    out = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise AdapterOutputExistsError(out)
    if set(result.modules) != set(like.modules):
        raise AggregationError(
            "the result's modules differ from those of the adapter given as like",
            "Pass one of the round's own adapters as like.",
        )
    config = _output_config(result, like)
    tensors = {}
    for name, (a, b) in result.modules.items():
        tensors[f"{name}.lora_A.weight"] = a.contiguous()
        tensors[f"{name}.lora_B.weight"] = b.contiguous()
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.concord-tmp-{uuid.uuid4().hex[:12]}")
    os.mkdir(tmp)
    try:
        save_file(tensors, os.path.join(tmp, WEIGHTS_NAME), metadata={"format": "pt"})
        with open(os.path.join(tmp, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")
        back = read_adapter(tmp)
        for name, m in back.modules.items():
            if m.rank != result.ranks[name] or abs(m.scale - 1.0) > 1e-12:
                raise RuntimeError(
                    f"the written adapter reads back module {name} with rank {m.rank} and scale {m.scale}, "
                    f"expected rank {result.ranks[name]} and scale 1 (a rank_pattern key matches another module)"
                )
        try:
            os.rename(tmp, out)  # replaces an empty folder, fails on a non-empty one
        except OSError as exc:
            raise AdapterOutputExistsError(out) from exc
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- folding (fedex)


@dataclass(frozen=True)
class FoldResult:
    """What :func:`fold_into_base` wrote: the new base folder and the tensors it changed."""

    path: str
    #: module name -> (file, tensor name) of the base weight each residual went into
    tensors: dict[str, tuple[str, str]]
    #: bytes of the tensors changed (every other byte of the folder is the old base's)
    folded_bytes: int

    def to_dict(self) -> dict:
        return {"path": self.path, "tensors": {k: list(v) for k, v in self.tensors.items()}, "folded_bytes": self.folded_bytes}


def _base_tensors(base: str) -> dict[str, tuple[str, TensorInfo]]:
    """Tensor name -> (file relative to ``base``, its :class:`TensorInfo`) over every
    safetensors file of the base model folder."""
    from concord.snapshots.safetensors_header import read_header

    found: dict[str, tuple[str, TensorInfo]] = {}
    for folder, _dirs, files in os.walk(base):
        for f in sorted(files):
            if not f.endswith(".safetensors"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, base)
            with open(path, "rb") as fh:
                header = read_header(fh, os.fstat(fh.fileno()).st_size, path)
            for t in header.tensors:
                if t.name in found:
                    raise AdapterError(base, f"tensor {t.name} is in both {found[t.name][0]} and {rel}")
                found[t.name] = (rel, t)
    return found


def _weight_of(name: str, tensors: dict[str, tuple[str, TensorInfo]], base: str) -> str:
    """The base tensor the adapted module ``name`` (PEFT's saved name) adapts: ``<module>.weight``,
    or the one tensor ending in ``.<module>.weight`` (a checkpoint saved with a model prefix)."""
    module = name.removeprefix(PEFT_PREFIX)
    if f"{module}.weight" in tensors:
        return f"{module}.weight"
    hits = [t for t in tensors if t.endswith(f".{module}.weight")]
    if len(hits) != 1:
        raise AggregationError(
            f"the base model in {base} has {'no' if not hits else len(hits)} weight tensor(s) for the adapted module {module}"
            + (f" ({_few(hits)})" if hits else ""),
            "Give the base model the adapters were trained on (its safetensors files hold <module>.weight).",
        )
    return hits[0]


def fold_into_base(
    base_dir: str | os.PathLike, residuals: dict[str, torch.Tensor], out_dir: str | os.PathLike, *, fan_in_fan_out: bool = False
) -> FoldResult:
    """Write the base model folder ``base_dir`` again as ``out_dir`` with each residual of
    ``residuals`` (module name -> [out, in], from ``aggregate(method="fedex")``) added to its
    module's weight (transposed for ``fan_in_fan_out`` layers such as GPT-2's Conv1D). Every
    file is copied byte for byte; in a safetensors file only the bytes of the folded tensors are
    rewritten, in place, at the same offsets and in the same dtype (the addition runs in float64,
    then is rounded once to the tensor's dtype), so the new base shares every other tensor, and
    its header, with the old one: replicating it moves only the folded tensors. Every module is
    matched and checked (shape, dtype) before anything is written; the folder is assembled under
    a temporary name beside ``out_dir`` and renamed into place."""
    import torch

    base = os.path.abspath(os.fspath(base_dir))
    out = os.path.abspath(os.fspath(out_dir))
    if not os.path.isdir(base):
        raise AdapterError(base, "the base model is not a folder")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise AdapterOutputExistsError(out)
    tensors = _base_tensors(base)
    plan: dict[str, tuple[str, TensorInfo, torch.Tensor]] = {}
    for name, res in residuals.items():
        tname = _weight_of(name, tensors, base)
        rel, info = tensors[tname]
        want = tuple(res.shape[::-1]) if fan_in_fan_out else tuple(res.shape)
        if tuple(info.shape) != want:
            raise AggregationError(
                f"base tensor {tname} in {rel} has shape {list(info.shape)}, the adapters' module {name} updates {list(want)}",
                "Give the base model the adapters were trained on (and fan_in_fan_out as in their config).",
            )
        if info.dtype not in FOLD_DTYPES:
            raise AggregationError(
                f"base tensor {tname} in {rel} is {info.dtype}; a residual can be folded into {', '.join(FOLD_DTYPES)} only",
                "Fold into a floating-point copy of the base model.",
            )
        plan[name] = (rel, info, res.T if fan_in_fan_out else res)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.concord-tmp-{uuid.uuid4().hex[:12]}")
    try:
        shutil.copytree(base, tmp)
        folded = 0
        for rel, info, res in plan.values():
            dtype = getattr(torch, FOLD_DTYPES[info.dtype])
            with open(os.path.join(tmp, rel), "r+b") as fh:
                fh.seek(info.begin)
                raw = bytearray(fh.read(info.length))
                w = torch.frombuffer(raw, dtype=dtype).reshape(res.shape)
                new = (w.to(torch.float64) + res).to(dtype).contiguous()
                data = new.view(torch.uint8).numpy().tobytes()  # bfloat16 has no numpy dtype: its bytes
                fh.seek(info.begin)
                fh.write(data)
            folded += len(data)
        try:
            os.rename(tmp, out)
        except OSError as exc:
            raise AdapterOutputExistsError(out) from exc
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return FoldResult(out, {name: (rel, info.name) for name, (rel, info, _) in plan.items()}, folded)


def _output_config(result: AggregateResult, like: Adapter) -> dict:
    config = copy.deepcopy(like.config)
    r = result.rank
    pattern = {name.removeprefix(PEFT_PREFIX): k for name, k in result.ranks.items() if k != r}
    config.update(
        r=r,
        lora_alpha=r,
        rank_pattern=pattern,
        alpha_pattern=dict(pattern),
        use_rslora=False,
        base_model_name_or_path=result.base_model,
        init_lora_weights=True,
    )
    return config
