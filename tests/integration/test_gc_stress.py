"""Writers × garbage collection, for real: several writer processes in loops (syncs that reuse a
root the store still holds unreferenced, snapshots whose chunks all exist, snapshots of new
bytes) against a collection loop with no grace period, on a folder and on S3 (moto_server).
Afterwards every ref verifies, and no writer ever found its snapshot broken while its ref named
it. ``CONCORD_GC_STRESS_SECONDS`` sets how long each store is stressed (default 20 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from counting import unindexed_deltas
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.snapshots.snapshot import snapshot
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore, open_store
from concord.stores.leases import LEASE_PREFIX, LOCK_PREFIX

pytestmark = pytest.mark.integration

SECONDS = float(os.environ.get("CONCORD_GC_STRESS_SECONDS", "20"))
WORKER = Path(__file__).with_name("gc_stress_worker.py")


@pytest.fixture(params=["local", "local-compressed", "s3"])
def target_spec(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "target")
    if request.param == "local-compressed":  # where fine-tunes are stored as deltas of their base
        from concord.stores.config import configure

        configure(LocalDirStore(tmp_path / "target"), compress="auto")
        return str(tmp_path / "target")
    s3 = request.getfixturevalue("s3_store")
    return s3.uri


def _fine_tuned(src: Path, dst: Path) -> Path:
    """``src`` with every float tensor moved by 1e-3 of its mean magnitude, as a fine-tune moves it."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(7)
    sd = load_file(str(src / "model.safetensors"))
    for k, v in sd.items():
        if v.is_floating_point() and v.numel():
            w = v.float()
            sd[k] = (w + 1e-3 * w.abs().mean() * torch.randn(w.shape, generator=g)).to(v.dtype)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_writers_racing_collections_never_lose_a_live_snapshot(target_spec, tmp_path, moto_server):
    source = LocalDirStore(tmp_path / "source")
    folders = [make_checkpoint(tmp_path / f"ck{i}", seed=i, layers=2, dim=64) for i in range(3)]
    for i, folder in enumerate(folders):
        snapshot(folder, source, ref=f"src/m{i}", chunk_size=SMALL_CHUNK)
    tuned = _fine_tuned(folders[0], tmp_path / "tuned")
    env = dict(os.environ, AWS_ENDPOINT_URL=moto_server, PYTHONPATH=os.pathsep.join(sys.path), CONCORD_GC_STRESS_FINETUNE=str(tuned))
    roles = ["gc", "sync", "snapshot", "snapshot", "fresh", "delta"]
    procs = []
    for n, role in enumerate(roles):
        out = tmp_path / f"report-{n}.json"
        cmd = [sys.executable, str(WORKER), role, target_spec, str(source.root), str(SECONDS), str(out), *map(str, folders)]
        procs.append((out, subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)))
    reports = []
    for out, proc in procs:
        _, err = proc.communicate(timeout=SECONDS + 300)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.read_text()))

    lost = [x for r in reports for x in r["lost"]]
    errors = [x for r in reports for x in r["errors"]]
    assert lost == [] and errors == [], (lost, errors[:3])
    gc = reports[0]
    writes = sum(r["ops"] for r in reports[1:])
    if target_spec.endswith("target") and (Path(target_spec) / "config").exists():
        assert reports[-1]["ops"] >= 1 and reports[-1]["deltas"] > 0, reports[-1]  # deltas were in play
    # the race was run: collections deleted garbage while writers wrote
    assert gc["ops"] >= 3 and gc["deleted_manifests"] > 0 and writes >= 10, reports

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", moto_server)
        target = open_store(target_spec)
        for name in target.list_refs():
            for entry in target.read_ref(name).history:
                assert verify(target, root=entry.root).ok, (name, entry.root)
        assert target.list_documents(LEASE_PREFIX) == [] and target.list_documents(LOCK_PREFIX) == []
        if target.encoding().framed:  # every delta left has its entry in the delta index
            assert unindexed_deltas(target) == []
    print(f"\n{target_spec}: {SECONDS:.0f} s, {writes} writes, {gc['ops']} collections "
          f"({gc['deleted_manifests']} manifests, {gc['deleted_chunks']} chunks deleted, {gc['postponed']} postponed)")
