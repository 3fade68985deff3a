"""``concord diff`` goes by content: a re-shard, a rename of every tensor and a shard split of a
delta-stored version read as tensors moved or renamed, and the bytes the diff reports are the
bytes a sync to a replica holding the first version then moves (docs/deltas.md, "Diff").

The model is a small synthetic bf16 safetensors checkpoint written here; the stores keep chunks
compressed (``auto``), so the bytes sent as stored differ from the raw bytes and both are checked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from toy_checkpoints import SMALL_CHUNK

from concord.api import diff
from concord.cli import main
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.stores.config import configure

#: how close the diff's figures must be to what the sync sends
TOLERANCE = 1.05


@pytest.fixture
def model() -> dict[str, torch.Tensor]:
    """Twelve bf16 tensors of 8 KiB to 512 KiB (several chunks of 64 KiB each for most)."""
    g = torch.Generator().manual_seed(0)
    sd = {"embeddings.weight": torch.randn(2048, 128, generator=g)}
    for i in range(4):
        sd[f"layers.{i}.attn.weight"] = torch.randn(256, 128, generator=g) * 0.02
        sd[f"layers.{i}.mlp.weight"] = torch.randn(512, 128, generator=g) * 0.02
        sd[f"layers.{i}.norm.weight"] = 1 + torch.randn(4096, generator=g) * 0.01
    sd["head.weight"] = torch.randn(1024, 128, generator=g) * 0.02
    return {k: v.to(torch.bfloat16) for k, v in sd.items()}


def _one_file(folder: Path, sd: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text('{"hidden_size": 128}')
    return folder


def _sharded(folder: Path, sd: dict[str, torch.Tensor], shards: int) -> Path:
    """``sd`` split into ``shards`` files with an index, as ``save_pretrained(max_shard_size=...)`` writes it."""
    folder.mkdir(parents=True)
    names = list(sd)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k] for k in names[s::shards]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in sd.values())},
        "weight_map": weight_map,
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text('{"hidden_size": 128}')
    return folder


def _moved(sd: dict[str, torch.Tensor], rel: float = 1e-3) -> dict[str, torch.Tensor]:
    """A full fine-tune: every tensor moved by ``rel × mean|W| × N(0, 1)``."""
    g = torch.Generator().manual_seed(1)
    out = {}
    for k, v in sd.items():
        w = v.float()
        out[k] = (w + rel * w.abs().mean() * torch.randn(w.shape, generator=g)).to(v.dtype)
    return out


def _compressed(path: Path) -> LocalDirStore:
    store = LocalDirStore(path)
    configure(store, compress="auto")
    return store


def _within(reported: int, sent: int) -> bool:
    return sent > 0 and 1 / TOLERANCE <= reported / sent <= TOLERANCE


def _store_and_replica(tmp_path: Path, first: Path):
    """A compressed store holding ``first`` under ref m, and a compressed replica synced to it."""
    store, replica = _compressed(tmp_path / "store"), _compressed(tmp_path / "replica")
    snapshot(first, store, ref="m", chunk_size=SMALL_CHUNK)
    replicate(store, [replica], ref="m")
    return store, replica


def _kinds(d) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in d.changes:
        out[c.kind] = out.get(c.kind, 0) + 1
    return out


def test_a_reshard_into_three_files_reads_as_tensors_moved_and_reports_what_the_sync_moves(tmp_path, model):
    store, replica = _store_and_replica(tmp_path, _one_file(tmp_path / "one", model))
    snapshot(_sharded(tmp_path / "three", model, 3), store, ref="m", chunk_size=SMALL_CHUNK)
    d = diff(store, "m~1", "m")
    shards = [f"model-{s:05d}-of-00003.safetensors" for s in (1, 2, 3)]
    assert {(c.file, c.kind) for c in d.changes if c.tensor is None} == {
        ("model.safetensors", "removed"),
        ("model.safetensors.index.json", "added"),
        *((s, "added") for s in shards),
    }
    moved = [c for c in d.changes if c.tensor is not None]
    assert {c.tensor for c in moved} == set(model) and len(moved) == len(model)
    assert all(c.kind == "moved" and c.from_file == "model.safetensors" and c.file in shards for c in moved)

    (sent,) = replicate(store, [replica], ref="m")
    # the three headers and the index: every tensor's chunks are already there
    assert d.chunks_differing == sent.chunks_sent == 4
    assert d.bytes_differing == sent.raw_bytes_sent < 64 * 1024
    assert _within(d.bytes_differing, sent.raw_bytes_sent) and _within(d.bytes_to_send, sent.bytes_sent)
    assert d.delta_chunks == 0


def test_a_rename_of_every_tensor_reads_as_renamed_and_moves_only_the_header(tmp_path, model):
    store, replica = _store_and_replica(tmp_path, _one_file(tmp_path / "a", model))
    renamed = {f"model.{k}": v for k, v in model.items()}
    snapshot(_one_file(tmp_path / "b", renamed), store, ref="m", chunk_size=SMALL_CHUNK)
    d = diff(store, "m~1", "m")
    assert {(c.kind, c.file, c.from_file, c.from_tensor, c.tensor) for c in d.changes} == {
        ("renamed", "model.safetensors", "model.safetensors", k, f"model.{k}") for k in model
    }
    (sent,) = replicate(store, [replica], ref="m")
    assert d.chunks_differing == sent.chunks_sent == 1  # the header
    assert _within(d.bytes_differing, sent.raw_bytes_sent) and _within(d.bytes_to_send, sent.bytes_sent)


def test_a_shard_split_of_a_delta_stored_version_reports_the_deltas_a_sync_sends(tmp_path, model):
    store, replica = _store_and_replica(tmp_path, _one_file(tmp_path / "base", model))
    tuned = _moved(model)
    v2 = snapshot(_one_file(tmp_path / "ft", tuned), store, ref="m", chunk_size=SMALL_CHUNK)
    v3 = snapshot(_sharded(tmp_path / "split", tuned, 2), store, ref="m", chunk_size=SMALL_CHUNK)
    assert sum(1 for cid in v3.manifest.chunk_lengths() if store.delta_of(cid)) > 0

    # against the fine-tune it splits, only the headers and the index move
    d = diff(store, v2.root, v3.root)
    assert {c.kind for c in d.changes if c.tensor is not None} == {"moved"}
    assert d.chunks_differing == 3 and d.delta_chunks == 0

    # against the base the replica holds, every tensor changed and went to a new file
    d = diff(store, "m~2", "m")
    changed = [c for c in d.changes if c.tensor is not None]
    assert len(changed) == len(model)
    assert all(c.kind == "changed" and c.from_file == "model.safetensors" for c in changed)
    (sent,) = replicate(store, [replica], ref="m")
    assert d.chunks_differing == sent.chunks_sent
    assert _within(d.bytes_differing, sent.raw_bytes_sent)
    assert _within(d.bytes_to_send, sent.bytes_sent), (d.bytes_to_send, sent.bytes_sent)
    assert d.delta_chunks > 0 and d.bytes_to_send < 0.5 * d.bytes_differing  # the deltas, not the chunks whole


def test_the_json_output_carries_the_same_figures(tmp_path, model, capsys):
    store, _ = _store_and_replica(tmp_path, _one_file(tmp_path / "base", model))
    snapshot(_sharded(tmp_path / "split", _moved(model), 2), store, ref="m", chunk_size=SMALL_CHUNK)
    d = diff(store, "m~1", "m")
    assert main(["diff", str(tmp_path / "store"), "m~1", "m", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(json.dumps(d.to_dict()))
    assert doc["delta_chunks"] == d.delta_chunks > 0 and doc["bytes_to_send"] == d.bytes_to_send
    assert main(["diff", str(tmp_path / "store"), "m~1", "m"]) == 0
    text = capsys.readouterr().out
    assert "~ model-00001-of-00002.safetensors :: " in text and "(was in model.safetensors)" in text
    assert f"{d.delta_chunks} chunk(s) as deltas" in text


def test_a_renamed_file_and_a_tensor_moved_inside_its_file(tmp_path, model):
    store, _ = _store_and_replica(tmp_path, _one_file(tmp_path / "a", model))
    b = _one_file(tmp_path / "b", {**model, "head.weight": torch.zeros(2048, 128, dtype=torch.bfloat16)})
    (b / "config.json").rename(b / "settings.json")
    snapshot(b, store, ref="m", chunk_size=SMALL_CHUNK)
    d = diff(store, "m~1", "m")
    by = {(c.file, c.tensor): c for c in d.changes}
    assert by["settings.json", None].kind == "renamed" and by["settings.json", None].from_file == "config.json"
    assert ("config.json", None) not in by
    assert by["model.safetensors", "head.weight"].kind == "changed"
    # the larger head moved the tensors after it; their bytes did not change
    assert {c.kind for c in d.changes if c.tensor not in (None, "head.weight")} == {"moved"}
    head = 2048 * 128 * 2
    assert d.bytes_differing < head + 64 * 1024  # the zeros (one distinct chunk) and the header


def test_an_encrypted_store_reports_the_deltas_a_replica_of_its_key_takes(tmp_path, model):
    key = os.urandom(32)
    store = LocalDirStore(tmp_path / "store")
    configure(store, compress="auto", encrypt=True, key=key)
    base = snapshot(_one_file(tmp_path / "base", model), store, ref="m", chunk_size=SMALL_CHUNK)
    snapshot(_sharded(tmp_path / "split", _moved(model), 2), store, ref="m", chunk_size=SMALL_CHUNK)
    replica = LocalDirStore(tmp_path / "replica")  # the same key and salt: a copy of the store's config
    os.makedirs(replica.root, exist_ok=True)
    (Path(replica.root) / "config").write_bytes((Path(store.root) / "config").read_bytes())
    replica.unlock(key)
    replicate(store, [replica], root=base.root)
    d = diff(store, "m~1", "m")  # the store holds its key
    (sent,) = replicate(store, [replica], ref="m")
    assert d.delta_chunks > 0 and d.chunks_differing == sent.chunks_sent
    assert _within(d.bytes_to_send, sent.bytes_sent), (d.bytes_to_send, sent.bytes_sent)


def test_a_delta_whose_base_the_first_version_lacks_counts_whole(tmp_path, model):
    store, _ = _store_and_replica(tmp_path, _one_file(tmp_path / "base", model))
    snapshot(_one_file(tmp_path / "ft", _moved(model)), store, ref="m", chunk_size=SMALL_CHUNK)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"hidden_size": 128}')
    snapshot(other, store, ref="other", chunk_size=SMALL_CHUNK)
    replica = _compressed(tmp_path / "holds-other")
    replicate(store, [replica], ref="other")
    d = diff(store, "other", "m")  # the fine-tune's deltas need chunks of the base, which "other" lacks
    (sent,) = replicate(store, [replica], ref="m")
    assert d.delta_chunks == 0 and d.chunks_differing == sent.chunks_sent
    assert _within(d.bytes_to_send, sent.bytes_sent), (d.bytes_to_send, sent.bytes_sent)


def test_an_s3_store_reports_what_a_sync_from_it_sends(tmp_path, model, s3_store):
    configure(s3_store, compress="auto")
    snapshot(_one_file(tmp_path / "base", model), s3_store, ref="m", chunk_size=SMALL_CHUNK)
    replica = _compressed(tmp_path / "replica")
    replicate(s3_store, [replica], ref="m")
    snapshot(_sharded(tmp_path / "split", _moved(model), 3), s3_store, ref="m", chunk_size=SMALL_CHUNK)
    d = diff(s3_store, "m~1", "m")
    (sent,) = replicate(s3_store, [replica], ref="m")
    assert d.delta_chunks > 0 and d.chunks_differing == sent.chunks_sent
    assert _within(d.bytes_differing, sent.raw_bytes_sent) and _within(d.bytes_to_send, sent.bytes_sent)
