"""FedEx-LoRA rounds: the adapters averaged at a fixed rank R, the residual folded into the frozen
base weights, so that base + adapter (loaded and merged by peft) is the weighted mean of the
clients' merged models, round after round; the folded base shares every other tensor with the
old one, so replicating it moves only the folded modules' tensors."""

from __future__ import annotations

import json
from pathlib import Path

import peft
import pytest
import torch
import transformers

from concord.errors import AggregationError
from concord.federation import lora
from concord.federation.rounds import run_round
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore

HIDDEN = 128
RANK = 4
ALPHA = 8
WEIGHTS = [3.0, 2.0, 1.0]
CLUSTERS = ("us-east", "eu-central", "ap-south")


def make_base(path: Path) -> Path:
    """A tiny BERT (2 layers, 128 wide) saved as safetensors, as ``save_pretrained`` writes it."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, max_position_embeddings=32
    )
    transformers.BertModel(config).save_pretrained(path, safe_serialization=True)
    return path


def load_base(path: Path):
    return transformers.BertModel.from_pretrained(path).eval()


def make_client(base: Path, out: Path, seed: int) -> Path:
    """A client's adapter as peft saves it after training: random A and B (B is not zero)."""
    model = peft.get_peft_model(load_base(base), peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["query", "value"], lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    return out


def merged(base: Path, adapter: Path) -> dict:
    """The state dict of ``base`` with ``adapter`` loaded and merged by peft, in float64."""
    model = peft.PeftModel.from_pretrained(load_base(base), adapter).merge_and_unload()
    return {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}


def rel_error(got: dict, want: dict) -> float:
    assert set(got) == set(want)
    num = sum(float((got[k] - want[k]).square().sum()) for k in want)
    den = sum(float(want[k].square().sum()) for k in want)
    return (num / den) ** 0.5


def fetch(store, ref: str, out: Path) -> Path:
    restore(store, load_manifest(store, store.read_ref(ref).root), out)
    return out


@pytest.fixture
def three(tmp_path):
    """Three cluster stores, each holding the frozen base model (as every client trained on it)."""
    stores = [LocalDirStore(tmp_path / c) for c in CLUSTERS]
    snapshot(make_base(tmp_path / "base"), stores[0], ref="models/bert-tiny")
    replicate(stores[0], stores[1:], ref="models/bert-tiny")
    return stores


def test_three_fedex_rounds_are_exact_at_a_fixed_rank(three, tmp_path):
    base_ref = "models/bert-tiny"
    p = [w / sum(WEIGHTS) for w in WEIGHTS]
    for rnd in (1, 2, 3):
        work = tmp_path / f"round-{rnd}"
        base_dir = fetch(three[0], base_ref, work / "base")
        clients = []
        for i, store in enumerate(three):
            path = make_client(base_dir, work / f"client-{i}", seed=100 * rnd + i)
            snapshot(path, store, ref=f"acme/adapter-{i}")
            clients.append(path)
        r = run_round(
            "acme", three, [f"adapter-{i}" for i in range(3)], method="fedex", weights=WEIGHTS,
            base="models/bert-tiny" if rnd == 1 else None,
        )
        assert r["method"] == "fedex" and r["rank"] == RANK and r["relative_error"] == 0.0
        assert 0 < r["residual_share"] < 1  # the rank-R mean alone is not the exact mean: something was folded
        assert r["base"]["ref"] == "acme/federated-base" and r["base"]["from"] == base_ref

        # peft: the new base with the aggregated adapter == the weighted mean of the clients' merged models
        want_parts = [merged(base_dir, c) for c in clients]
        want = {k: sum(pk * m[k] for pk, m in zip(p, want_parts)) for k in want_parts[0]}
        for store in three:  # every cluster holds the same exact model
            new_base = fetch(store, "acme/federated-base", work / f"new-base-{Path(store.root).name}")
            adapter = fetch(store, "acme/federated", work / f"adapter-{Path(store.root).name}")
            got = merged(new_base, adapter)
            assert rel_error(got, want) <= 1e-5, (rnd, store.uri, rel_error(got, want))
        assert json.loads((adapter / "adapter_config.json").read_text())["r"] == RANK  # fixed rank, round after round

        # only the folded modules' tensors moved: 2 layers × (query, value)
        assert r["base"]["modules"] == 4
        folded = r["base"]["folded_bytes"]
        assert folded == 4 * HIDDEN * HIDDEN * 4
        assert r["base"]["bytes_sent"] <= 1.02 * folded
        for rep in r["base"]["replicas"]:
            assert 0 < rep["bytes_sent"] <= 1.02 * folded, rep
        base_ref = "acme/federated-base"  # the next round's clients train on the folded base

    # the ledger records each round's base: old → folded
    from concord.federation.ledger import list_rounds

    rounds = list_rounds(three[0], "acme")
    assert [x["result"]["base"]["from"] for x in rounds] == ["models/bert-tiny"] + ["acme/federated-base"] * 2
    assert [x["result"]["base"]["parent"] for x in rounds[1:]] == [x["result"]["base"]["root"] for x in rounds[:-1]]


def test_the_untouched_tensors_are_the_old_bases_bytes(tmp_path):
    base = make_base(tmp_path / "base")
    adapters = [lora.read_adapter(make_client(base, tmp_path / f"c{i}", seed=i)) for i in range(2)]
    result = lora.aggregate(adapters, method="fedex")
    fold = lora.fold_into_base(base, result.residuals, tmp_path / "folded")
    from safetensors.torch import load_file

    old, new = load_file(base / "model.safetensors"), load_file(Path(fold.path) / "model.safetensors")
    changed = sorted(k for k in old if not torch.equal(old[k], new[k]))
    assert changed == sorted(t for _, t in fold.tensors.values()) and len(changed) == 4
    with open(base / "model.safetensors", "rb") as a, open(Path(fold.path) / "model.safetensors", "rb") as b:
        n = int.from_bytes(a.read(8), "little")
        assert b.read(8 + n)[8:] == a.read(n)  # the header, byte for byte
    assert (base / "config.json").read_bytes() == (Path(fold.path) / "config.json").read_bytes()


def test_bad_bases_are_refused_before_anything_is_written(tmp_path):
    base = make_base(tmp_path / "base")
    adapters = [lora.read_adapter(make_client(base, tmp_path / f"c{i}", seed=i)) for i in range(2)]
    result = lora.aggregate(adapters, method="fedex")
    other = tmp_path / "other"
    transformers.BertModel(transformers.BertConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                   intermediate_size=128, max_position_embeddings=32)).save_pretrained(other)
    with pytest.raises(AggregationError, match="shape"):
        lora.fold_into_base(other, result.residuals, tmp_path / "out1")
    assert not (tmp_path / "out1").exists()
    one = transformers.BertModel(transformers.BertConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                                                         intermediate_size=128, max_position_embeddings=32))
    one.save_pretrained(tmp_path / "one-layer")
    with pytest.raises(AggregationError, match="no weight tensor"):
        lora.fold_into_base(tmp_path / "one-layer", result.residuals, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
    with pytest.raises(AggregationError, match="rank applies"):
        lora.aggregate(adapters, method="fedex", rank=2)


def test_a_first_fedex_round_needs_its_base(three, tmp_path):
    for i, store in enumerate(three):
        snapshot(make_client(tmp_path / "base", tmp_path / f"c{i}", seed=i), store, ref=f"acme/adapter-{i}")
    with pytest.raises(ValueError, match="base"):
        run_round("acme", three, ["adapter-0", "adapter-1"], method="fedex")
    with pytest.raises(ValueError, match="'fedex' only"):
        run_round("acme", three, ["adapter-0", "adapter-1"], method="exact", base="models/bert-tiny")


def test_lineage_records_base_then_folded_base_then_adapter(three, tmp_path, tracking_uri):
    from concord.lineage import Lineage

    lineage = Lineage(tracking_uri)
    base_dir = fetch(three[0], "models/bert-tiny", tmp_path / "base0")
    roots = []
    for rnd in (1, 2):
        for i, store in enumerate(three):
            snapshot(make_client(base_dir, tmp_path / f"r{rnd}-c{i}", seed=10 * rnd + i), store, ref=f"lin/adapter-{i}")
        r = run_round("lin", three, [f"adapter-{i}" for i in range(3)], method="fedex", base="models/bert-tiny" if rnd == 1 else None,
                      lineage=lineage)
        assert "error" not in r["lineage"], r["lineage"]
        roots.append((r["base"]["parent"], r["base"]["root"], r["root"]))
        base_dir = fetch(three[0], "lin/federated-base", tmp_path / f"base{rnd}")
    # round 2's adapter ← its folded base ← round 1's folded base ← the original base
    view = lineage.model_lineage("lin-federated", r["lineage"]["version"])
    (folded,) = view["parents"]
    assert folded["name"] == "lin-federated-base" and folded["root"] == roots[1][1]
    (before,) = folded["parents"]
    assert before["root"] == roots[1][0] == roots[0][1]
    (original,) = before["parents"]
    assert original["root"] == roots[0][0] and original["parents"] == []
