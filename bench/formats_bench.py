"""Training-checkpoint formats: what a next step with 10% of its tensors changed adds to a store.

A LLaMA-shaped bf16 state dict (``plan_shape`` of ``--size-gb``, default 0.25 GB) is saved twice,
the second time with 10% of its tensors changed (``changed_tensor_names``, weight matrices
spread over the layers), as a PyTorch Distributed Checkpoint (``torch.distributed.checkpoint.save``,
one process), as a ``torch.save`` file, as a legacy (non-zip) ``torch.save`` file and as a GGUF
v3 file of bf16 tensors. Each pair is snapshotted into a fresh store, step 1 then step 2, and the
bytes step 2 adds (``new_bytes``) are divided by the changed tensors' bytes:

- concord: the files as they are, cut at their tensors (concord/snapshots/formats);
- blob chunking: the same files under a name no reader claims, so each is one opaque part cut
  into 4 MiB chunks, as every version before these readers did;
- restic (when ``restic`` is on the PATH): ``restic backup`` of step 1 then of step 2 (the same
  path) into a fresh local repository, uncompressed (``--compression off``, since concord's
  bytes are raw too); what step 2 adds is the growth of the repository's ``data/`` folder (its
  packs), content-defined chunking. The second backup's own ``data_added`` is in the notes.

The diff of the two concord snapshots must name exactly the changed tensors, else the benchmark
raises.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

from bench.common import (
    GB,
    Options,
    Row,
    Table,
    Target,
    _random_tensor,
    _raw,
    changed_tensor_names,
    fresh_dir,
    log,
    plan_shape,
    remove,
)

FRACTION = 0.10
TARGET = 1.02


def run(opts: Options) -> list[Table]:
    import torch

    shape = plan_shape(int(opts.size_gb * GB))
    specs = shape.tensors()
    changed = changed_tensor_names(shape, FRACTION)
    log(f"formats: {len(specs)} bf16 tensors (d={shape.d}, {shape.layers} layers), {len(changed)} changed")
    base = {name: _random_tensor(s, 1234 * 100_003 + i, len(s) == 1) for i, (name, s) in enumerate(specs)}
    step = dict(base)
    for k, name in enumerate(changed):
        step[name] = base[name] + _random_tensor(base[name].shape, 77 + k, False).mul_(0.01)
    changed_bytes = sum(step[n].numel() * step[n].element_size() for n in changed)
    total = sum(t.numel() * t.element_size() for t in base.values())
    work = fresh_dir(opts.work_dir / "formats")
    restic = shutil.which("restic")
    table = Table(
        f"formats: a next step with {FRACTION:.0%} of {len(specs)} tensors changed "
        f"({total / GB:.2f} GB, {changed_bytes / GB:.3f} GB changed): added bytes ÷ changed tensor bytes"
    )
    try:
        for label, save in (("DCP", _save_dcp), ("torch.save", _save_torch), ("legacy torch.save", _save_legacy), ("GGUF", _save_gguf)):
            a, b = save(work / f"{label}-1", base), save(work / f"{label}-2", step)
            ours = _added(a, b, work / f"{label}-store", changed)
            blob = _added(_as_blobs(a, work / f"{label}-blob-1"), _as_blobs(b, work / f"{label}-blob-2"), work / f"{label}-blob-store", None)
            table.notes.append(f"{label}: step 2 added {ours:,} bytes (blob chunking {blob:,}) for {changed_bytes:,} changed: {ours / changed_bytes:.4f}×")
            table.add(
                Row(
                    f"{label}: concord vs blob chunking",
                    ours / changed_bytes,
                    blob / changed_bytes,
                    "×",
                    Target("value", "<=", TARGET),
                    "blob chunking",
                )
            )
            if restic:
                added, reported = _restic_added(restic, a, b, work / f"{label}-restic")
                table.add(Row(f"{label}: concord vs restic", ours / changed_bytes, added / changed_bytes, "×", Target("value", "<=", TARGET), "restic"))
                table.notes.append(f"{label}: restic's repository grew {added:,} bytes ({added / changed_bytes:.4f}×; its data_added: {reported:,})")
    finally:
        del base, step
        remove(work)
    if not restic:
        table.notes.append("restic is not installed: its column is left out")
    table.notes.append("torch " + torch.__version__ + "; default chunk size (4 MiB); added bytes are the raw bytes of new chunks")
    return [table]


def _save_dcp(folder: Path, sd: dict) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=str(folder))
    return folder


def _save_torch(folder: Path, sd: dict) -> Path:
    import torch

    folder.mkdir(parents=True)
    torch.save(sd, folder / "model.pt")
    return folder


def _save_legacy(folder: Path, sd: dict) -> Path:
    import torch

    folder.mkdir(parents=True)
    torch.save(sd, folder / "model.pt", _use_new_zipfile_serialization=False)
    return folder


GGUF_BF16 = 30
GGUF_ALIGNMENT = 32


def _save_gguf(folder: Path, sd: dict) -> Path:
    """A GGUF v3 file of the bf16 tensors, by the format's layout (dimensions innermost first)."""
    import struct

    def string(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kv = [string("general.architecture") + struct.pack("<I", 8) + string("llama")]
    infos, offset = [], 0
    for name, t in sd.items():
        dims = list(reversed(t.shape))
        infos.append(string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", GGUF_BF16, offset))
        offset += -(-t.numel() * 2 // GGUF_ALIGNMENT) * GGUF_ALIGNMENT
    head = b"GGUF" + struct.pack("<IQQ", 3, len(sd), len(kv)) + b"".join(kv) + b"".join(infos)
    folder.mkdir(parents=True)
    with open(folder / "model.gguf", "wb") as f:
        f.write(head + b"\0" * (-len(head) % GGUF_ALIGNMENT))
        for t in sd.values():
            raw = _raw(t)
            f.write(raw)
            f.write(b"\0" * (-len(raw) % GGUF_ALIGNMENT))
    return folder


def _as_blobs(folder: Path, out: Path) -> Path:
    """The same files, hard-linked under names no format reader claims."""
    out.mkdir(parents=True)
    for p in folder.iterdir():
        os.link(p, out / f"{p.name}.opaque")
    return out


def _added(a: Path, b: Path, store_dir: Path, changed: list[str] | None) -> int:
    from concord.snapshots.diff import diff_manifests
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    store = LocalDirStore(store_dir)
    first = snapshot(a, store)
    second = snapshot(b, store)
    if changed is not None:
        named = {c.tensor for c in diff_manifests(first.manifest, second.manifest).changes if c.tensor}
        if named != set(changed):
            raise RuntimeError(f"diff named {sorted(named)[:5]}… instead of the {len(changed)} changed tensors")
    remove(store_dir)
    return second.new_bytes


def _restic_added(restic: str, a: Path, b: Path, repo: Path) -> tuple[int, int]:
    """(growth of the repository's packs, restic's own data_added) of backing up ``b`` after ``a``."""
    env = dict(os.environ, RESTIC_REPOSITORY=str(repo), RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=str(repo.parent / "restic-cache"))
    subprocess.run([restic, "init"], env=env, check=True, capture_output=True, timeout=600)
    sizes, reported = [], 0
    for folder in (a, b):  # the same path both times, so restic sees one folder's next version
        stage = repo.parent / "restic-src"
        remove(stage)
        shutil.copytree(folder, stage, copy_function=os.link)
        done = subprocess.run(
            [restic, "backup", "--json", "--compression", "off", str(stage)],
            env=env, check=True, capture_output=True, text=True, timeout=1800, cwd=repo.parent,
        )
        summary = [json.loads(line) for line in done.stdout.splitlines() if '"summary"' in line]
        reported = int(summary[-1]["data_added"])
        sizes.append(_tree_bytes(repo / "data"))
        remove(stage)
    remove(repo)
    remove(repo.parent / "restic-cache")
    return sizes[1] - sizes[0], reported


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
