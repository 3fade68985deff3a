"""LoRA federation benchmark: exact low-rank aggregation against the dense route, on 7B-like shapes.

Eight clients hold LoRA adapters of rank 16 (lora_alpha 32) on the four attention projections
(q, k, v, o; 4096 × 4096) of 32 layers: 128 modules, random float32 factors (A ~ N(0, 1/in),
B ~ N(0, 0.01²)), random per-client weights (numbers of examples). They are built in memory as
``concord.federation.lora.Adapter`` objects: the benchmark measures the math, not file reading.

- ``exact`` at rank 16: ``concord.federation.lora.aggregate(method="exact", rank=16)`` over all 128 modules,
  with its default options (the Gram-matrix norms and distances of ``max_norm_ratio=10`` included).
- The dense route at rank 16: form ``ΔW = Σ p_k s_k B_k A_k`` as a float32 [4096, 4096] matrix,
  ``torch.linalg.svd``, keep 16 singular triplets. It takes 10–20 s a module on 2 cores, so it runs
  on the first 2 modules and its time is scaled to 128.
- Accuracy: the two rank-16 results compared on those modules; both compared, on the first one,
  with a float64 dense SVD; and ``exact`` at its full rank (128) against the dense float64 ΔW*.
- Memory: peak ``RssAnon`` of a child process that builds the adapters and runs the rank-16
  aggregate, above its level after imports, against the adapters' own bytes.

``--quick`` uses 4 layers of 1024 × 1024.

A second table follows three federation rounds at a fixed rank R (``ROUNDS_CLIENTS`` clients of
rank ``ROUNDS_RANK`` on ``ROUNDS_MODULES`` modules of a float32 base): each round the clients
continue from the global adapter of the round before (its factors plus their own random steps),
and each method is followed along its own trajectory. Per round, the target is the exact weighted
mean of the clients' merged models, ``W + Σ p_k B_k A_k``; the error is the distance of the
method's merged model to it over ``‖Σ p_k B_k A_k‖``. ``fedex`` (FedEx-LoRA: the factors'
mean at rank R, the residual folded into the base, in float32 as a safetensors base holds it)
against ``exact`` truncated at rank R (the best rank-R approximation, not the mean) and ``stack``
(FLoRA: exact, its rank multiplied by the number of clients every round).
"""

from __future__ import annotations

import json
import math
import sys
import time

from bench.common import (
    MB,
    POLL_SECONDS,
    Case,
    Options,
    Row,
    Table,
    Target,
    log,
    probe_memory,
    race,
    self_anon_kb,
    times_note,
)

CLIENTS = 8
RANK = 16
ALPHA = 32
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
DENSE_MODULES = 2
PPM = 1e-6
ROUNDS = 3
ROUNDS_CLIENTS = 4
ROUNDS_RANK = 8
ROUNDS_MODULES = 8


def shape(quick: bool) -> tuple[int, int]:
    """(layers, width)."""
    return (4, 1024) if quick else (32, 4096)


def make_adapters(layers: int, d: int, seed: int = 2024):
    """``CLIENTS`` in-memory adapters of random float32 factors, and their weights."""
    import torch

    from concord.federation.lora import Adapter, LoraModule

    base = "bench/llama-like"
    adapters = []
    for k in range(CLIENTS):
        g = torch.Generator().manual_seed(seed * 1000 + k)
        modules = {}
        for i in range(layers):
            for proj in PROJECTIONS:
                name = f"base_model.model.model.layers.{i}.self_attn.{proj}"
                a = torch.randn(RANK, d, generator=g).div_(math.sqrt(d))
                b = torch.randn(d, RANK, generator=g).mul_(0.01)
                modules[name] = LoraModule(name, a, b, ALPHA / RANK)
        config = {
            "peft_type": "LORA",
            "r": RANK,
            "lora_alpha": ALPHA,
            "target_modules": list(PROJECTIONS),
            "base_model_name_or_path": base,
        }
        adapters.append(Adapter(f"client-{k}", config, base, modules, "float32"))
    g = torch.Generator().manual_seed(seed)
    weights = [float(x) for x in torch.randint(1000, 10000, (CLIENTS,), generator=g)]
    return adapters, weights


def adapter_bytes(adapters) -> int:
    return sum((m.A.numel() + m.B.numel()) * m.A.element_size() for a in adapters for m in a.modules.values())


def dense_target(adapters, p: list[float], name: str, dtype):
    """``ΔW* = Σ p_k s_k B_k A_k`` formed densely in ``dtype``."""
    import torch

    mods = [a.modules[name] for a in adapters]
    w = torch.zeros(mods[0].B.shape[0], mods[0].A.shape[1], dtype=dtype)
    for pk, m in zip(p, mods):
        w.addmm_(m.B.to(dtype), m.A.to(dtype), alpha=pk * m.scale)
    return w


def dense_route(adapters, p: list[float], names: list[str], rank: int, dtype=None) -> dict:
    """The dense baseline: form ΔW, full SVD, keep ``rank`` triplets (the rank-r matrix itself)."""
    import torch

    dtype = dtype or torch.float32
    out = {}
    for name in names:
        u, s, vh = torch.linalg.svd(dense_target(adapters, p, name, dtype), full_matrices=False)
        out[name] = (u[:, :rank] * s[:rank]) @ vh[:rank]
    return out


def rel_diff(got: dict, ref: dict) -> float:
    """``‖got − ref‖ / ‖ref‖`` in Frobenius norm over all the modules of ``ref``, in float64."""
    num = sum(float((got[n].double() - ref[n].double()).square().sum()) for n in ref)
    den = sum(float(ref[n].double().square().sum()) for n in ref)
    return math.sqrt(num / den)


def low_rank(result, names) -> dict:
    return {n: result.modules[n][1].double() @ result.modules[n][0].double() for n in names}


def run(opts: Options) -> list[Table]:
    import torch

    from concord.federation.lora import aggregate

    layers, d = shape(opts.quick)
    adapters, weights = make_adapters(layers, d)
    p = [w / sum(weights) for w in weights]
    names = list(adapters[0].modules)
    n_modules = len(names)
    dense_names = names[:DENSE_MODULES]
    size = adapter_bytes(adapters)
    log(f"{CLIENTS} adapters × {n_modules} modules of {d}×{d}, r={RANK}: {size / MB:.0f} MB of factors")

    def exact():
        return aggregate(adapters, method="exact", weights=weights, rank=RANK)

    log(f"exact warm-up {_timed(exact):.2f} s")
    cases = race(
        opts.runs,
        Case("exact, rank 16, all modules", exact),
        Case(f"dense, rank 16, {DENSE_MODULES} modules", lambda: dense_route(adapters, p, dense_names, RANK)),
        warmup=False,
        wait_idle=opts.wait_idle,
    )
    ex, dn = cases
    result, dense = ex.result, dn.result
    t_exact, t_dense = ex.best, dn.best * n_modules / DENSE_MODULES
    diff = rel_diff(low_rank(result, dense_names), dense)

    log("float64 dense SVD of the first module (reference)")
    ref64 = dense_route(adapters, p, dense_names[:1], RANK, torch.float64)
    diff64_exact = rel_diff(low_rank(result, dense_names[:1]), ref64)
    diff64_dense = rel_diff({n: dense[n] for n in ref64}, ref64)

    log("exact at full rank")
    full = aggregate(adapters, method="exact", weights=weights)
    target = {n: dense_target(adapters, p, n, torch.float64) for n in dense_names}
    err_full = rel_diff(low_rank(full, dense_names), target)

    log("peak memory of the rank-16 aggregate in a child process")
    mem = _peak_anon(layers, d)
    log(f"peak RssAnon above baseline {mem['peak_mb']:.0f} MB for {mem['adapter_mb']:.0f} MB of adapters")

    table = Table(
        f"lora: exact aggregation of {CLIENTS} adapters, {layers} layers × {len(PROJECTIONS)} modules of "
        f"{d}×{d}, r={RANK}, best of {opts.runs}"
    )
    dense_name = f"dense fp32 SVD, {DENSE_MODULES} modules scaled"
    table.add(
        Row(
            f"rank-{RANK} aggregate throughput",
            n_modules / t_exact,
            n_modules / t_dense,
            "modules/s",
            None if opts.quick else Target("ratio", ">=", 100),
            dense_name,
        )
    )
    table.add(Row(f"rank-{RANK} aggregate, all {n_modules} modules", t_exact, t_dense, "s", None, dense_name))
    table.add(
        Row(
            f"rank-{RANK} result: exact vs dense route ({DENSE_MODULES} modules)",
            diff / PPM,
            None,
            "ppm",
            Target("value", "<=", 10),
        )
    )
    table.add(
        Row(
            f"rank-{RANK} result vs dense fp64 SVD (1 module)",
            diff64_exact / PPM,
            diff64_dense / PPM,
            "ppm",
            Target("value", "<=", 10),
            "dense fp32 route",
        )
    )
    table.add(
        Row(
            f"full rank ({full.rank}): error vs dense fp64 ΔW* ({DENSE_MODULES} modules)",
            err_full / PPM,
            None,
            "ppm",
            Target("value", "<=", 1),
        )
    )
    table.add(
        Row(
            f"peak anon memory, exact rank {RANK} (adapters included)",
            mem["peak_mb"],
            mem["adapter_mb"],
            "MB",
            Target("ratio", "<=", 2),
            "adapters' own size",
        )
    )
    table.notes += [
        f"ppm = 10⁻⁶ relative Frobenius difference; results compared as the rank-{RANK} matrices they "
        "encode (B·A for exact, U_r S_r V_rᵀ for the dense route), in float64",
        f"exact computes in float64 and returns float32 factors; it reported a truncation error "
        f"(relative_error) of {result.relative_error:.3f} at rank {RANK} and {full.relative_error:g} at "
        f"full rank (random factors keep most energy outside the top {RANK} directions)",
        f"the dense route (float32 ΔW, torch.linalg.svd, keep {RANK}) took {dn.best / DENSE_MODULES:.1f} s "
        f"a module; the whole model's time is that × {n_modules}",
        f"memory: RssAnon polled every {POLL_SECONDS * 1000:.0f} ms ({mem['samples']} samples) from the parent; "
        f"the child's baseline after imports was {mem['baseline_mb']:.0f} MB, it held {mem['inputs_mb']:.0f} MB "
        f"once the adapters were built; {torch.get_num_threads()} torch threads",
        times_note(cases),
    ]
    if opts.quick:
        table.notes.append(
            "--quick: no speed target, which is set for 4096-wide modules (the dense SVD costs d³, exact "
            "about d·(Σr)², so the ratio grows with the width)"
        )
    return [table, rounds_table(opts)]


def _round_clients(state: dict, d: int, rnd: int, seed: int):
    """The clients of round ``rnd``: the global adapter ``state`` (name → (A, B), scale 1; empty
    in round 1) plus each client's own random step, as in-memory adapters of scale 1."""
    import torch

    from concord.federation.lora import Adapter, LoraModule

    out = []
    for k in range(ROUNDS_CLIENTS):
        g = torch.Generator().manual_seed(seed * 1000 + 10 * rnd + k)
        modules = {}
        for i in range(ROUNDS_MODULES):
            name = f"base_model.model.layers.{i}.q_proj"
            a0, b0 = state.get(name, (torch.zeros(ROUNDS_RANK, d), torch.zeros(d, ROUNDS_RANK)))
            a = a0 + torch.randn(a0.shape, generator=g).div_(math.sqrt(d))
            b = b0 + torch.randn(b0.shape, generator=g).mul_(0.01)
            modules[name] = LoraModule(name, a.float(), b.float(), 1.0)
        config = {"peft_type": "LORA", "r": int(a.shape[0]), "lora_alpha": int(a.shape[0]), "target_modules": ["q_proj"],
                  "base_model_name_or_path": "bench/base"}
        out.append(Adapter(f"client-{k}", config, "bench/base", modules, "float32"))
    return out


def follow(method: str, d: int, seed: int = 7) -> dict:
    """``ROUNDS`` rounds of ``method`` from one float32 base: each round's error against the exact
    mean of its clients' merged models, and the adapter's rank."""
    import torch

    from concord.federation.lora import aggregate

    g = torch.Generator().manual_seed(seed)
    base = {f"base_model.model.layers.{i}.q_proj": torch.randn(d, d, generator=g).div_(math.sqrt(d)) for i in range(ROUNDS_MODULES)}
    weights = [float(w) for w in torch.randint(1000, 10000, (ROUNDS_CLIENTS,), generator=g)]
    p = [w / sum(weights) for w in weights]
    state: dict = {}
    errors, ranks, seconds = [], [], 0.0
    for rnd in range(1, ROUNDS + 1):
        clients = _round_clients(state, d, rnd, seed)
        target = {n: dense_target(clients, p, n, torch.float64) for n in base}
        t0 = time.perf_counter()
        if method == "exact":
            r = aggregate(clients, method="exact", weights=weights, rank=ROUNDS_RANK)
        else:
            r = aggregate(clients, method=method, weights=weights)
        seconds += time.perf_counter() - t0
        new_base = {n: (w.double() + r.residuals[n]).float() for n, w in base.items()} if method == "fedex" else base
        merged = {n: new_base[n].double() + r.modules[n][1].double() @ r.modules[n][0].double() for n in base}
        want = {n: base[n].double() + target[n] for n in base}
        num = sum(float((merged[n] - want[n]).square().sum()) for n in base)
        den = sum(float(target[n].square().sum()) for n in base)
        errors.append(math.sqrt(num / den))
        ranks.append(r.rank)
        base, state = new_base, {n: (a.float(), b.float()) for n, (a, b) in r.modules.items()}
    return {"errors": errors, "ranks": ranks, "seconds": seconds}


def rounds_table(opts: Options) -> Table:
    d = 512 if opts.quick else 1024
    log(f"{ROUNDS} rounds of {ROUNDS_CLIENTS} clients at rank {ROUNDS_RANK}: fedex, exact truncated, stack")
    got = {m: follow(m, d) for m in ("fedex", "exact", "stack")}
    fx, ex, st = got["fedex"], got["exact"], got["stack"]
    table = Table(
        f"lora rounds: {ROUNDS} rounds of {ROUNDS_CLIENTS} clients at rank {ROUNDS_RANK}, {ROUNDS_MODULES} modules of {d}×{d} (float32 base)"
    )
    table.add(Row(f"error after {ROUNDS} rounds: fedex vs exact truncated at rank {ROUNDS_RANK}", fx["errors"][-1] / PPM,
                  ex["errors"][-1] / PPM, "ppm", Target("value", "<=", 10), f"exact, rank {ROUNDS_RANK}"))
    table.add(Row(f"error after {ROUNDS} rounds: fedex vs stack", fx["errors"][-1] / PPM, st["errors"][-1] / PPM, "ppm",
                  Target("value", "<=", 10), "stack (FLoRA)"))
    table.add(Row(f"largest error over the {ROUNDS} rounds: fedex vs exact truncated", max(fx["errors"]) / PPM, max(ex["errors"]) / PPM,
                  "ppm", Target("value", "<=", 10), f"exact, rank {ROUNDS_RANK}"))
    table.add(Row(f"rank after {ROUNDS} rounds: fedex vs stack", fx["ranks"][-1], st["ranks"][-1], "", Target("value", "<=", ROUNDS_RANK),
                  "stack (FLoRA)"))
    table.add(Row(f"rank after {ROUNDS} rounds: fedex vs exact truncated", fx["ranks"][-1], ex["ranks"][-1], "", None, f"exact, rank {ROUNDS_RANK}"))
    table.add(Row(f"aggregation time, {ROUNDS} rounds: fedex vs stack", fx["seconds"], st["seconds"], "s", None, "stack (FLoRA)"))
    table.notes += [
        "error: ‖merged − (W + Σ p_k B_k A_k)‖ / ‖Σ p_k B_k A_k‖ over all modules, the merged model being the method's base "
        "(fedex: with the residual folded in, rounded to float32) plus its adapter; ppm = 10⁻⁶",
        "per round, fedex " + ", ".join(f"{e / PPM:.3g}" for e in fx["errors"]) + " ppm; exact truncated "
        + ", ".join(f"{e / PPM:.3g}" for e in ex["errors"]) + " ppm; stack " + ", ".join(f"{e / PPM:.3g}" for e in st["errors"])
        + " ppm; stack's rank " + " → ".join(map(str, st["ranks"])),
        "fedex's time includes forming the dense residual of every module (the fold itself is not timed)",
    ]
    return table


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- memory probe


def _peak_anon(layers: int, d: int) -> dict:
    """Run :func:`memory_child` and poll its RssAnon from here."""
    code = "import sys; from bench.lora_bench import memory_child; memory_child(int(sys.argv[1]), int(sys.argv[2]))"
    peak, baseline_kb, result, samples = probe_memory(code, [str(layers), str(d)])
    return {
        "peak_mb": (max(peak["RssAnon"], result["peak_kb"]) - baseline_kb) * 1024 / MB,
        "inputs_mb": (result["inputs_kb"] - baseline_kb) * 1024 / MB,
        "baseline_mb": baseline_kb * 1024 / MB,
        "adapter_mb": result["adapter_bytes"] / MB,
        "samples": samples,
    }


def memory_child(layers: int, d: int) -> None:
    """Entry point of the memory probe: build the adapters, aggregate at rank 16, report."""
    import gc

    import torch

    from concord.federation.lora import aggregate

    # load the linear-algebra kernels before the baseline is taken
    x = torch.randn(64, 8, dtype=torch.float64)
    torch.linalg.svd(torch.linalg.qr(x)[1])
    gc.collect()
    baseline = self_anon_kb()
    print(f"READY {baseline}", flush=True)
    sys.stdin.readline()
    adapters, weights = make_adapters(layers, d)
    inputs = self_anon_kb()
    result = aggregate(adapters, method="exact", weights=weights, rank=RANK)
    peak = self_anon_kb()
    if result.rank != RANK:
        raise RuntimeError(f"the memory probe's aggregate has rank {result.rank}, expected {RANK}")
    print(json.dumps({"adapter_bytes": adapter_bytes(adapters), "inputs_kb": inputs, "peak_kb": peak}), flush=True)
