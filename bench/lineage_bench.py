"""Lineage benchmark: what showing a version's lineage in MLflow adds to registering it.

Setup (untimed): a small safetensors checkpoint snapshotted into a local store, and an embedded
sqlite tracking database in the work folder (its schema made once).

Timed, in interleaved rounds, each round registering ``N`` versions of a fresh model, each the
child of the one before (so the later pictures draw a chain of ancestors; N = 6, 3 with ``--quick``):
- ``Lineage.register_model_version``: the version with its description of links and its
  lineage picture drawn and logged as ``lineage/lineage.png`` of the registering run, against
- the same registration without the picture (``registry.register_model_version`` with no
  ``on_registered``): the baseline.
Rows: a round's time both ways (ratio for the record, no target) and the time the picture adds
per version (target: at most 1 s, well under what a person waits on a registration).
Every registered version must have its picture (or none, for the baseline), or the benchmark raises.
"""

from __future__ import annotations

import itertools

from bench.common import Case, Options, Row, Table, Target, fresh_dir, log, race, remove, times_note


def run(opts: Options) -> list[Table]:
    import numpy as np
    from safetensors.numpy import save_file

    from concord.lineage import Lineage, registry
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    n = 3 if opts.quick else 6
    work = fresh_dir(opts.work_dir / "lineage")
    try:
        ckpt = work / "ckpt"
        ckpt.mkdir()
        rng = np.random.default_rng(0)
        save_file({"w": rng.standard_normal((256, 256)).astype(np.float32)}, str(ckpt / "model.safetensors"))
        store = LocalDirStore(work / "store")
        root = snapshot(ckpt, store, ref="bench/model").root
        lineage = Lineage(f"sqlite:///{work / 'mlflow.db'}")
        lineage.ensure_ready()
        models = itertools.count()

        def chain(with_picture: bool) -> str:
            name = f"{'pic' if with_picture else 'plain'}-{next(models)}"
            for i in range(n):
                parents = [f"{name}/{i}"] if i else []
                if with_picture:
                    lineage.register_model_version(name, root, [store], parents=parents)
                else:
                    registry.register_model_version(lineage, name, root, [store], parents=parents)
            return name

        def check(with_picture: bool):
            def after() -> None:
                client = lineage.client
                name = pictured.result if with_picture else plain.result
                for v in range(1, n + 1):
                    mv = client.get_model_version(name, str(v))
                    got = [a.path for a in client.list_artifacts(mv.run_id, "lineage")]
                    if got != (["lineage/lineage.png"] if with_picture else []):
                        raise RuntimeError(f"{name}/{v}: lineage artifacts {got}")
            return after

        pictured = Case(f"register {n} versions with the lineage picture", lambda: chain(True), after=check(True))
        plain = Case(f"register {n} versions without it", lambda: chain(False), after=check(False))
        race(opts.runs, pictured, plain, wait_idle=opts.wait_idle)
        log(f"lineage: {pictured.best:.3f} s against {plain.best:.3f} s for {n} versions")
    finally:
        remove(work)

    added = (pictured.best - plain.best) / n
    table = Table(f"lineage: registering {n} versions, each the child of the one before (embedded sqlite), best of {opts.runs}")
    table.add(Row(f"register {n} versions with description links and lineage.png", pictured.best, plain.best, "s", None, "without the picture"))
    table.add(Row("time the picture adds per version (draw, PNG, log artifact)", added, None, "s", Target("value", "<=", 1.0)))
    table.notes += [
        "the picture is drawn with matplotlib (networkx layout) from the version's lineage as MLflow records it: "
        "one lookup per ancestor, so a long chain costs a little more",
        times_note([pictured, plain]),
    ]
    return [table]
