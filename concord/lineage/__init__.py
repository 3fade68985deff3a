"""Lineage in MLflow: model versions × data snapshots × schema contracts.

The wing's modules, each usable alone:

- :mod:`~concord.lineage.data`: data snapshots (a table's bytes in a store, named by their digest);
- :mod:`~concord.lineage.contracts`: schema contracts, validation, compatibility;
- :mod:`~concord.lineage.tags`: the experiments and tags Concord writes into MLflow;
- :mod:`~concord.lineage.client`: the tracking server (URI, readiness, client, experiments);
- :mod:`~concord.lineage.runs`: runs (any run; data snapshots as dataset inputs);
- :mod:`~concord.lineage.registry`: model versions, the promotion gate, what is recorded;
- :mod:`~concord.lineage.graph`: the lineage graph of a model (or of one version), as Mermaid, a
  PNG or a table; each registered version's picture kept in MLflow.

:class:`Lineage` is what callers hold: one tracking server, with every operation as a method.
Nothing here imports mlflow, pandas or great-expectations until a method needs them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from concord.lineage import graph, registry, runs
from concord.lineage.client import Tracking

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from concord.lineage.data import DataSnapshot
    from concord.stores.base import Store

__all__ = ["Lineage"]


class Lineage(Tracking):
    """Lineage records in one MLflow tracking server (and its model registry).

    ``Lineage(tracking_uri=None)``: ``None`` is ``$MLFLOW_TRACKING_URI``, else sqlite in
    ``$CONCORD_HOME``. Every write checks the backend first (:meth:`ensure_ready`), so an
    unreachable server fails before any store is touched.
    """

    # ------------------------------------------------------------------ runs

    def log_run(
        self,
        *,
        experiment: str,
        run_name: str | None = None,
        tags: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
        texts: Mapping[str, str] | None = None,
        files: Mapping[str, Iterable[str | os.PathLike[str]]] | None = None,
        description: str | None = None,
    ) -> str:
        """Log one finished run in the experiment ``experiment`` (created on first use) and return
        its id.

        ``run_name``: the run's name (MLflow makes one up without it). ``tags``, ``params``: logged
        as ``str(value)``. ``metrics``: floats, at step 0. ``texts``: artifact file name → its text
        (``{"report.md": markdown}``). ``files``: artifact folder → local files copied into it
        (``{"histograms": pngs}``; ``""`` for the top level). ``description``: the run's description
        (its ``mlflow.note.content`` tag). The run ends FINISHED; if logging fails midway it ends
        FAILED and the error is raised. See :func:`concord.lineage.runs.log_run`.
        """
        return runs.log_run(
            self, experiment=experiment, run_name=run_name, tags=tags, params=params, metrics=metrics,
            texts=texts, files=files, description=description,
        )

    def log_data_snapshot(self, snap: DataSnapshot, df: pd.DataFrame | None = None, *, store: Store | None = None) -> str:
        """Log ``snap`` as the input of a run in experiment ``concord-data``; return the run id.

        Without ``df`` the table is loaded from ``store`` (default: the store ``snap`` names).
        """
        return runs.log_data_snapshot(self, snap, df, store=store)

    # ------------------------------------------------------------------ the registry

    def register_model_version(
        self,
        name: str,
        root: str,
        stores: Sequence[str | Store],
        *,
        data_snapshot: str | None = None,
        contract: str | Any | None = None,
        parents: Iterable[str] = (),
        tiers: dict[str, str] | None = None,
        description: str = "",
        data_store: Store | None = None,
        contracts_store: Store | None = None,
    ) -> dict[str, Any]:
        """Register snapshot ``root`` as a new version of model ``name``
        (:func:`concord.lineage.registry.register_model_version`): its description links to its
        parents and data snapshot, and the run that registered it holds its lineage picture,
        ``lineage/lineage.png`` (:func:`concord.lineage.graph.log_lineage_picture`)."""
        return registry.register_model_version(
            self, name, root, stores, data_snapshot=data_snapshot, contract=contract, parents=parents,
            tiers=tiers, description=description, data_store=data_store, contracts_store=contracts_store,
            on_registered=lambda n, v, run_id: graph.log_lineage_picture(self, n, v, run_id),
        )

    def record_replica(self, root: str, store: str | Store, tier: str = "hot") -> list[str]:
        """Record that ``store`` holds ``root`` on ``tier``, on every version with that root;
        returns the ``name/version`` of each version updated."""
        return registry.record_replica(self, root, store, tier)

    def promote(self, name: str, version: str | int, alias: str, *, data_store: Store, contracts: Store) -> dict[str, Any]:
        """Point ``alias`` at ``name``/``version`` only if the promotion gate passes
        (:func:`concord.lineage.registry.promote`); else :class:`~concord.errors.PromotionRefused`."""
        return registry.promote(self, name, version, alias, data_store=data_store, contracts=contracts)

    # ------------------------------------------------------------------ queries

    def model_lineage(self, name: str, version: str | int) -> dict[str, Any]:
        """Everything recorded about one version (:func:`concord.lineage.registry.model_lineage`)."""
        return registry.model_lineage(self, name, version)

    def data_lineage(self, snapshot_id: str) -> list[dict[str, Any]]:
        """Every model version that records ``snapshot_id`` as its data, ordered by name and version."""
        return registry.data_lineage(self, snapshot_id)

    def promoted_roots(self) -> list[str]:
        """The snapshot roots of every model version that holds an alias (e.g. champion)."""
        return registry.promoted_roots(self)

    def version_graph(self, name: str, version: str | int) -> dict[str, Any]:
        """Nodes and edges of one version's lineage (:func:`concord.lineage.graph.version_graph`)."""
        return graph.version_graph(self, name, version)

    def lineage_graph(self, name: str) -> dict[str, Any]:
        """Nodes and edges of model ``name``'s lineage (:func:`concord.lineage.graph.lineage_graph`)."""
        return graph.lineage_graph(self, name)
