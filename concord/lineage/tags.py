"""The names Concord writes into MLflow: its experiments, and the tags on model versions and runs.

Tags on a model version (and on the run that registered it, except ``concord.held_by``):

- ``concord.root``: the snapshot root (the Merkle root of the weights);
- ``concord.store``: URI of the store the version's ``source`` points into;
- ``concord.data_snapshot``, ``concord.data_name``, ``concord.digest``: the data snapshot it was
  trained or evaluated on (id, name, BLAKE3 of the file);
- ``concord.contract`` (``name@version``) and ``concord.contract_digest``: its schema contract;
- ``concord.parents``: comma-separated ``name/version`` of the versions it derives from;
- ``concord.held_by``: JSON list of ``{"store": …, "tier": …}``, every replica;
- ``concord.promoted.<alias>``: when the promotion gate let the version take that alias.
"""

from __future__ import annotations

#: one run per data snapshot logged, its table as the run's dataset input
EXPERIMENT_DATA = "concord-data"
#: one run per model version registered
EXPERIMENT_LINEAGE = "concord-lineage"

TAG_ROOT = "concord.root"
TAG_STORE = "concord.store"
TAG_DATA = "concord.data_snapshot"
TAG_DATA_NAME = "concord.data_name"
TAG_DIGEST = "concord.digest"
TAG_CONTRACT = "concord.contract"
TAG_CONTRACT_DIGEST = "concord.contract_digest"
TAG_PARENTS = "concord.parents"
TAG_HELD_BY = "concord.held_by"
TAG_MODEL = "concord.model"
TAG_MODEL_VERSION = "concord.model_version"
TAG_PROMOTED = "concord.promoted."

#: MLflow's tag holding a run's description (shown as its notes)
TAG_NOTE = "mlflow.note.content"
