"""One process of the writers × garbage-collection stress test (``test_gc_stress.py``).

``python gc_stress_worker.py ROLE TARGET SOURCE SECONDS OUT [FOLDER...]`` runs ROLE in a loop on
the store TARGET until SECONDS have passed, then writes what it did to OUT (JSON):

* ``sync``: replicate each of SOURCE's refs to TARGET, check the ref verifies, delete the ref
  again (its objects lie unreferenced in TARGET, to be reused by the next sync, or collected);
* ``snapshot``: snapshot each FOLDER to TARGET under a ref (every chunk already there after the
  first round), check, delete the ref;
* ``fresh``: snapshot a folder of new random bytes each time (new garbage), check, delete;
* ``delta``: snapshot the first FOLDER under a ref, then its fine-tune (the folder
  ``CONCORD_GC_STRESS_FINETUNE`` names) under another, as deltas of the first; delete the
  base's ref (its chunks are then needed only as the deltas' bases), check the fine-tune, delete;
* ``gc``: collect garbage with no grace period, again and again.

A check that fails while the writer's ref still names its root is a live snapshot lost.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback


def main(role: str, target_spec: str, source_spec: str, seconds: float, out: str, folders: list[str]) -> None:
    from concord.snapshots.gc import collect_garbage
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate
    from concord.snapshots.verify import verify
    from concord.stores import open_store

    target = open_store(target_spec)
    source = open_store(source_spec)
    me = f"{role}-{os.getpid()}"
    report = {"role": role, "ops": 0, "lost": [], "errors": [], "deleted_manifests": 0, "deleted_chunks": 0, "postponed": 0, "deltas": 0}
    deadline = time.monotonic() + seconds
    i = 0

    def check(ref: str, root: str) -> None:
        if not verify(target, ref=ref).ok:
            report["lost"].append(f"{ref} -> {root[:12]} did not verify while the ref named it")

    while time.monotonic() < deadline:
        i += 1
        try:
            if role == "gc":
                r = collect_garbage(target, grace_seconds=0, wait_seconds=2.0)
                report["deleted_manifests"] += r.deleted_manifests
                report["deleted_chunks"] += r.deleted_chunks
                report["postponed"] += bool(r.postponed_by)
                time.sleep(0.05)
            elif role == "sync":
                for name in source.list_refs():
                    (res,) = replicate(source, [target], ref=name)
                    check(name, res.root)
                    target.delete_ref(name, res.root)
            elif role == "snapshot":
                for n, folder in enumerate(folders):
                    ref = f"snap/{me}-{n}"
                    res = snapshot(folder, target, ref=ref, chunk_size=64 * 1024)
                    check(ref, res.root)
                    target.delete_ref(ref, res.root)
            elif role == "delta":
                base_ref, ft_ref = f"delta/{me}-base", f"delta/{me}-ft"
                b = snapshot(folders[0], target, ref=base_ref, chunk_size=64 * 1024)
                res = snapshot(os.environ["CONCORD_GC_STRESS_FINETUNE"], target, ref=ft_ref, base=base_ref, chunk_size=64 * 1024)
                report["deltas"] += sum(1 for c in res.manifest.chunk_lengths() if target.delta_of(c))
                target.delete_ref(base_ref, b.root)
                time.sleep(0.2)  # a collection runs while only the deltas keep the base's chunks
                check(ft_ref, res.root)
                target.delete_ref(ft_ref, res.root)
            elif role == "fresh":
                with tempfile.TemporaryDirectory() as tmp:
                    with open(os.path.join(tmp, "weights.bin"), "wb") as f:
                        f.write(os.urandom(200_000))
                    ref = f"fresh/{me}"
                    res = snapshot(tmp, target, ref=ref, chunk_size=64 * 1024)
                    check(ref, res.root)
                    target.delete_ref(ref, res.root)
            else:
                raise SystemExit(f"unknown role {role!r}")
            report["ops"] += 1
        except Exception as exc:  # every failure is reported by the test
            report["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
            if len(report["errors"]) > 20:
                break
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5], sys.argv[6:])
