"""Small real checkpoints for the core's tests, built with safetensors itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SMALL_CHUNK = 64 * 1024


def make_checkpoint(folder: Path, *, seed: int = 0, layers: int = 3, dim: int = 96) -> Path:
    """A LLaMA-like toy checkpoint: bf16 and fp32 tensors, a config and a tokenizer file."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"embed.weight": torch.randn(512, dim, generator=g).to(torch.bfloat16)}
    for i in range(layers):
        tensors[f"layers.{i}.attn.q.weight"] = torch.randn(dim * 4, dim, generator=g)
        tensors[f"layers.{i}.attn.k.weight"] = torch.randn(dim, dim, generator=g).to(torch.bfloat16)
        tensors[f"layers.{i}.norm.weight"] = torch.ones(dim)
    tensors["empty"] = torch.zeros(0)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"hidden_size": dim, "layers": layers}))
    (folder / "tokenizer.txt").write_bytes(os.urandom(200_000))
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "empty.bin").write_bytes(b"")
    return folder


def fine_tune(src: Path, dst: Path, names: list[str], delta: float = 0.01) -> Path:
    """Copy ``src`` to ``dst`` with ``names`` changed, as a fine-tune would change them."""
    import shutil

    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    for n in names:
        sd[n] = (sd[n].float() + delta).to(sd[n].dtype)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def files_equal(a: Path, b: Path) -> bool:
    import filecmp

    cmp = filecmp.dircmp(a, b)

    def same(c) -> bool:
        if c.left_only or c.right_only or c.funny_files:
            return False
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        return not mismatch and not errors and all(same(s) for s in c.subdirs.values())

    return same(cmp)


def make_lora_checkpoint(folder: Path, base: Path, step: int, *, marker: str | None = "COMPLETE", rank: int = 4) -> Path:
    """A training checkpoint of a LoRA run: the frozen base weights, a small adapter that changes
    every step, optimizer and RNG state, the trainer's state, and a completion marker (written last)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(base / "model.safetensors", folder / "model.safetensors")
    g = torch.Generator().manual_seed(1000 + step)
    adapter = {f"layers.{i}.attn.q.lora_{ab}": torch.randn(rank, 96, generator=g) for i in range(3) for ab in "AB"}
    save_file(adapter, str(folder / "adapter_model.safetensors"))
    torch.save({"step": step, "exp_avg": {k: v * 0.1 for k, v in adapter.items()}}, folder / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "step": step}, folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "loss": 1.0 / (1 + step)}))
    if marker:
        (folder / marker).write_text("")
    return folder


def make_spread_checkpoint(folder: Path, *, nodes: int = 3, seed: int = 0) -> tuple[Path, list[Path]]:
    """A DCP checkpoint as ``nodes`` ranks would leave it on their local disks: ``folder/whole``
    holds all of it (one ``.distcp`` file per rank, ``.metadata``, a config and a tokenizer),
    ``folder/node-I`` only rank I's ``.distcp`` file and a copy of ``.metadata``, node 0 also the
    config and tokenizer. Returns the whole folder and the node folders."""
    import shutil
    import warnings

    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(seed)
    whole = folder / "whole"
    sd = {f"layers.{i}.weight": torch.randn(64, 256, generator=g) for i in range(3 * nodes)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(whole / "ckpt"), thread_count=nodes))
    (whole / "config.json").write_text(json.dumps({"ranks": nodes}))
    (whole / "tokenizer.txt").write_bytes(os.urandom(100_000))
    shards = sorted((whole / "ckpt").glob("*.distcp"))
    assert len(shards) == nodes, shards
    out = []
    for i, shard in enumerate(shards):
        node = folder / f"node-{i}"
        (node / "ckpt").mkdir(parents=True)
        shutil.copy2(shard, node / "ckpt" / shard.name)
        shutil.copy2(whole / "ckpt" / ".metadata", node / "ckpt" / ".metadata")
        if i == 0:
            for name in ("config.json", "tokenizer.txt"):
                shutil.copy2(whole / name, node / name)
        out.append(node)
    return whole, out
