"""A restore drill as an MLflow run: one run of the experiment ``concord-restore-drills`` per drill.

The flow's task and ``concord tier drill --track`` log a drill through :func:`log_drill`, so its
run is the same whichever wrote it: metrics ``ok``, ``findings``, ``rto_seconds_<tier>`` and
``rpo_seconds_<tier>``; the namespace, the sample and the objectives as parameters; the drill's
JSON as the artifact ``drill.json``. The run itself is written by
:meth:`concord.lineage.Lineage.log_run`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from concord.lineage import Lineage

#: the MLflow experiment every restore drill is logged to, one run per drill
DRILL_EXPERIMENT = "concord-restore-drills"


def drill_run(drill: dict, *, sample: int = 1) -> dict:
    """The run of a restore drill (``DrillResult.to_dict()``) as keyword arguments of
    :meth:`~concord.lineage.Lineage.log_run`: run ``<namespace>-<started>``, tagged with the
    namespace, whether it passed and when it started."""
    metrics = {"ok": 1.0 if drill["ok"] else 0.0, "findings": float(len(drill["findings"]))}
    params = {"namespace": drill["namespace"], "sample": str(sample)}
    for t, d in drill["tiers"].items():
        for what in ("rto", "rpo"):
            if d.get(f"{what}_seconds") is not None:
                metrics[f"{what}_seconds_{t}"] = float(d[f"{what}_seconds"])
            objective = d.get(f"{what}_objective")
            params[f"{what}_objective_{t}"] = "none" if objective is None else f"{objective:g}"
    return {
        "experiment": DRILL_EXPERIMENT,
        "run_name": f"{drill['namespace']}-{drill['started']}",
        "tags": {
            "concord.namespace": drill["namespace"],
            "concord.drill.ok": str(drill["ok"]).lower(),
            "concord.drill.started": drill["started"],
        },
        "params": params,
        "metrics": metrics,
        "texts": {"drill.json": json.dumps(drill, indent=1, sort_keys=True, default=str)},
    }


def log_drill(lineage: Lineage, drill: dict, *, sample: int = 1) -> str:
    """Log a restore drill as one run of ``concord-restore-drills`` (:func:`drill_run`); return the run id."""
    return lineage.log_run(**drill_run(drill, sample=sample))
