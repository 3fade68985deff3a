"""The names Concord writes into MLflow: its experiments, and the tags on model versions and runs.

Tag keys are short, so MLflow's version list shows them whole: it cuts a tag's chip once key and
value pass 30 characters, the longer of the two only, but both when each is over 15 (a 64-hex root
under ``concord.data_snapshot`` read ``concord.…``); a key of at most 10 characters is never cut.
Tags on a model version (and on the run that registered it, except ``held_by`` and ``replicas``):

- ``root``: the snapshot root (the Merkle root of the weights);
- ``store``: URI of the store the version's ``source`` points into;
- ``data``, ``data_name``, ``digest``: the data snapshot it was trained or evaluated on (id,
  name, BLAKE3 of the file);
- ``contract`` (``name@version``) and ``c_digest``: its schema contract and the contract's digest;
- ``parents``: comma-separated ``name/version`` of the versions it derives from;
- ``held_by``: every replica as a person reads it, each store's short name and its tier
  (``eu-west (warm), us-east (hot)``);
- ``replicas``: the same, for code: a JSON list of ``{"store": URI, "tier": …}`` (what
  :func:`replicas_of` reads);
- ``promoted.<alias>``: when the promotion gate let the version take that alias (whole in the
  list for an alias of up to 6 characters; longer ones show their start).

The run that registered a version also has ``model`` and ``version`` (``name/N``), and its lineage
picture as the artifact ``lineage/lineage.png``. Versions written before these names carry the
same facts under ``concord.<old name>`` (:data:`LEGACY`), and versions written before
``replicas`` hold its JSON list under ``held_by``; :func:`read_tags` reads each of them as today's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

#: one run per data snapshot logged, its table as the run's dataset input
EXPERIMENT_DATA = "concord-data"
#: one run per model version registered
EXPERIMENT_LINEAGE = "concord-lineage"

TAG_ROOT = "root"
TAG_STORE = "store"
TAG_DATA = "data"
TAG_DATA_NAME = "data_name"
TAG_DIGEST = "digest"
TAG_CONTRACT = "contract"
TAG_CONTRACT_DIGEST = "c_digest"
TAG_PARENTS = "parents"
TAG_HELD_BY = "held_by"
TAG_REPLICAS = "replicas"
TAG_MODEL = "model"
TAG_MODEL_VERSION = "version"
TAG_PROMOTED = "promoted."

#: the names the same tags had before (``concord.root`` …), still read
LEGACY = {
    TAG_ROOT: "concord.root",
    TAG_STORE: "concord.store",
    TAG_DATA: "concord.data_snapshot",
    TAG_DATA_NAME: "concord.data_name",
    TAG_DIGEST: "concord.digest",
    TAG_CONTRACT: "concord.contract",
    TAG_CONTRACT_DIGEST: "concord.contract_digest",
    TAG_PARENTS: "concord.parents",
    TAG_REPLICAS: "concord.held_by",
    TAG_MODEL: "concord.model",
    TAG_MODEL_VERSION: "concord.model_version",
}
LEGACY_PROMOTED = "concord.promoted."

#: the run artifact holding a registered version's lineage picture
LINEAGE_PNG = "lineage/lineage.png"

#: MLflow's tag holding a run's description (shown as its notes)
TAG_NOTE = "mlflow.note.content"


def read_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """A version's (or run's) tags under today's names: a fact recorded under its old
    ``concord.…`` name is read as if written under the new one (the new one wins)."""
    out = dict(tags or {})
    for new, old in LEGACY.items():
        if old in out and new not in out:
            out[new] = out[old]
    for key in list(out):
        if key.startswith(LEGACY_PROMOTED):
            out.setdefault(TAG_PROMOTED + key[len(LEGACY_PROMOTED):], out[key])
    held = out.get(TAG_HELD_BY, "")
    if held.lstrip().startswith("["):  # written before ``replicas``: held_by was the JSON list
        out.setdefault(TAG_REPLICAS, held)
    if TAG_REPLICAS in out and (not held or held.lstrip().startswith("[")):
        out[TAG_HELD_BY] = held_by_text(replicas_of(out))
    return out


def replicas_of(tags: Mapping[str, str]) -> list[dict]:
    """The replicas a version's tags (read by :func:`read_tags`) record: ``{"store", "tier"}``
    each; none for a value that is not the JSON list Concord writes."""
    try:
        held = json.loads(tags.get(TAG_REPLICAS) or "[]")
    except ValueError:
        return []
    if not isinstance(held, list):
        return []
    return [h for h in held if isinstance(h, dict) and isinstance(h.get("store"), str)]


def replica_tags(held: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """``held_by`` and ``replicas`` for the replicas ``held`` (``{"store", "tier"}`` each),
    sorted by store."""
    ordered = sorted(({"store": h["store"], "tier": h.get("tier") or "hot"} for h in held), key=lambda h: h["store"])
    return {TAG_HELD_BY: held_by_text(ordered), TAG_REPLICAS: json.dumps(ordered)}


def held_by_text(held: Iterable[Mapping[str, str]]) -> str:
    """The replicas as a person reads them: ``eu-west (warm), us-east (hot)``, each store by its
    short name (a folder's or prefix's last part), by its address where two names are equal."""
    from concord.stores.address import short_names

    held = list(held)
    names = short_names([h["store"] for h in held])
    shown = sorted(f"{n} ({h.get('tier') or 'hot'})" for n, h in zip(names, held))
    return ", ".join(shown) or "(none)"
