"""A Prefect block for a tier policy: which store is hot, warm and cold, and how much each keeps.

The block holds the same settings as a policy YAML file, as typed fields a person fills in the
Prefect UI. :meth:`TierPolicyBlock.get_policy` turns them into the core's
:class:`~concord.tiering.policy.TierPolicy` through ``TierPolicy.from_dict``, so a block is
checked by exactly the rules a YAML file is (3-2-1, cold keeps everything, one unit for hot and
warm, ...) and refused with every problem listed.

``load_policy_block`` is what ``load_policy("block:NAME")`` calls (through the
``concord.policy_sources`` entry point), so the CLI and the core reach saved policies without
importing Prefect themselves.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from prefect.blocks.core import Block
from pydantic import Field, field_validator

from concord.errors import InvalidStoreURIError, PolicyError
from concord.stores.address import FOLDER, StoreAddress
from concord.tiering.policy import TierPolicy, format_duration, parse_duration
from concord_pipelines.blocks.api import load_block, where_blocks_live

__all__ = ["ColdStorageClass", "Compression", "RestoreTier", "TierPolicyBlock", "WarmStorageClass", "load_policy_block"]

#: S3 storage classes whose objects can be read at once (hot and warm copies must be readable)
WarmStorageClass = Literal[
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "REDUCED_REDUNDANCY",
]
#: every S3 storage class a cold tier may use, the archive classes (restored before reading) included
ColdStorageClass = Literal[
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "REDUCED_REDUNDANCY",
    "GLACIER",
    "DEEP_ARCHIVE",
]
#: how a tier store keeps its chunks (set when the tier's store is first opened empty)
Compression = Literal["none", "zstd", "auto"]
#: S3 retrieval tiers for archive restores, fastest and dearest first
RestoreTier = Literal["Expedited", "Standard", "Bulk"]

_DOCUMENTATION_URL = "https://docs.prefect.io/v3/concepts/blocks"
_STORE_HELP = "a folder, s3://bucket/prefix, or block:NAME of a saved Concord store block"
_DURATIONS = (
    "hot_rto", "hot_rpo", "warm_rto", "warm_rpo", "cold_rto", "cold_rpo", "rpo",
    "gc_grace", "ready_settle", "restore_timeout", "restore_poll",
)


class TierPolicyBlock(Block):
    """Where a namespace's checkpoints live hot, warm and cold, and the rules that move them.

    Attributes:
        namespace: Checkpoints are the refs <namespace>/<name> in every tier.
        hot_store: The fast store training reads from.
        hot_keep: How many of the newest checkpoints hot keeps.
        warm_store: The store for recent checkpoints.
        warm_keep: How many of the newest checkpoints warm keeps.
        cold_store: The off-site store that keeps every checkpoint.
        rpo: The newest checkpoint in each tier is never older than this.
        pin: Checkpoints kept hot and warm whatever their age.
    """

    _block_type_name = "Concord Tier Policy"
    _description = (
        "Hot, warm and cold stores for a namespace of checkpoints, how many checkpoints each keeps, "
        "recovery objectives, and how archived copies are restored."
    )
    # no logo: a remote image does not load where the UI has no internet, and Prefect accepts only
    # http(s) addresses (no data: URI); the UI shows its own block icon instead
    _logo_url = None
    _documentation_url = _DOCUMENTATION_URL
    _code_example = """
    Save a policy once (or create it in the UI after `prefect block register -m concord_pipelines.blocks.tiers`):
    ```python
    from concord_pipelines.blocks.tiers import TierPolicyBlock

    TierPolicyBlock(
        namespace="llama-lora",
        hot_store="/data/hot",
        hot_keep=2,
        warm_store="s3://models/warm",
        warm_keep=4,
        warm_storage_class="STANDARD_IA",
        cold_store="s3://models-archive/cold",
        cold_storage_class="GLACIER",
        rpo="1h",
    ).save("llama-lora")
    ```

    Load it by name in a flow or task, or name it `block:llama-lora` anywhere Concord takes a policy:
    ```python
    from concord_pipelines.blocks.tiers import TierPolicyBlock

    tier_policy_block = TierPolicyBlock.load("BLOCK_NAME")
    policy = tier_policy_block.get_policy()
    print(policy.to_dict())
    ```
    """

    namespace: str = Field(
        default="checkpoints",
        description="Checkpoints are the refs <namespace>/<name> in every tier (letters, digits, '.', '_' or '-').",
        examples=["llama-lora"],
    )

    hot_store: str = Field(
        title="Hot store",
        description=f"The fast store training reads from: {_STORE_HELP}.",
        examples=["/data/concord/hot"],
    )
    hot_keep: int | None = Field(
        default=2,
        ge=1,
        title="Hot keep",
        description="How many of the newest checkpoints hot keeps (leave empty to keep by age with hot_keep_days).",
    )
    hot_keep_days: float | None = Field(
        default=None,
        gt=0,
        title="Hot keep days",
        description="Keep checkpoints younger than this many days hot, instead of a count (then clear hot_keep and use warm_keep_days).",
    )
    hot_storage_class: WarmStorageClass | None = Field(
        default=None,
        title="Hot storage class",
        description="The S3 storage class of hot copies on an s3:// store (archive classes are not allowed: hot copies must be readable).",
    )
    hot_media: str | None = Field(
        default=None,
        title="Hot media",
        description="The kind of media hot is on, for the 3-2-1 rule (e.g. nvme); empty to infer it from the store (disk, object).",
    )
    hot_compress: Compression | None = Field(
        default=None,
        title="Hot compression",
        description=(
            "How the hot store keeps chunks: none, zstd, or auto (byte planes for float tensors); empty to leave the "
            "store as it is. Applied when the store is first opened empty."
        ),
    )
    hot_rto: str | None = Field(
        default=None,
        title="Hot RTO",
        description="Recovery time objective of a restore from hot, e.g. 1m; empty for none.",
        examples=["1m"],
    )
    hot_rpo: str | None = Field(
        default=None,
        title="Hot RPO",
        description="Recovery point objective of hot, overriding rpo, e.g. 1h; empty to use rpo.",
    )

    warm_store: str = Field(
        title="Warm store",
        description=f"The store for recent checkpoints: {_STORE_HELP}.",
        examples=["s3://models/concord-warm"],
    )
    warm_keep: int | None = Field(
        default=4,
        ge=1,
        title="Warm keep",
        description="How many of the newest checkpoints warm keeps; at least hot_keep (3-2-1: what hot keeps needs a warm copy too).",
    )
    warm_keep_days: float | None = Field(
        default=None,
        gt=0,
        title="Warm keep days",
        description="Keep checkpoints younger than this many days warm, instead of a count (use with hot_keep_days).",
    )
    warm_storage_class: WarmStorageClass | None = Field(
        default=None,
        title="Warm storage class",
        description="The S3 storage class of warm copies on an s3:// store, e.g. STANDARD_IA; empty for the bucket's default.",
    )
    warm_media: str | None = Field(
        default=None,
        title="Warm media",
        description="The kind of media warm is on, for the 3-2-1 rule (e.g. nas); empty to infer it from the store.",
    )
    warm_compress: Compression | None = Field(
        default=None,
        title="Warm compression",
        description=(
            "How the warm store keeps chunks: none, zstd, or auto (byte planes for float tensors); empty to leave the "
            "store as it is. Applied when the store is first opened empty."
        ),
    )
    warm_rto: str | None = Field(
        default=None,
        title="Warm RTO",
        description="Recovery time objective of a restore from warm, e.g. 10m; empty for none.",
        examples=["10m"],
    )
    warm_rpo: str | None = Field(
        default=None,
        title="Warm RPO",
        description="Recovery point objective of warm, overriding rpo; empty to use rpo.",
    )

    cold_store: str = Field(
        title="Cold store",
        description=f"The off-site store that keeps every checkpoint: {_STORE_HELP}.",
        examples=["s3://models-archive/concord-cold"],
    )
    cold_storage_class: ColdStorageClass | None = Field(
        default=None,
        title="Cold storage class",
        description="The S3 storage class of cold copies, e.g. GLACIER or DEEP_ARCHIVE (restored before reading); empty for the bucket's default.",
    )
    cold_offsite: bool | None = Field(
        default=None,
        title="Cold is off-site",
        description="Whether the cold store is at another site; empty to assume so for s3:// stores only. Set it for a folder mounted from another site.",
    )
    cold_media: str | None = Field(
        default=None,
        title="Cold media",
        description="The kind of media cold is on, for the 3-2-1 rule (e.g. tape); empty to infer it from the store and storage class.",
    )
    cold_compress: Compression | None = Field(
        default=None,
        title="Cold compression",
        description=(
            "How the cold store keeps chunks: none, zstd, or auto (byte planes for float tensors), e.g. auto to keep "
            "cold about a third smaller; empty to leave the store as it is. Applied when the store is first opened empty."
        ),
    )
    cold_rto: str | None = Field(
        default=None,
        title="Cold RTO",
        description="Recovery time objective of a restore from cold, archive restore included, e.g. 12h; empty for none.",
        examples=["12h"],
    )
    cold_rpo: str | None = Field(
        default=None,
        title="Cold RPO",
        description="Recovery point objective of cold, overriding rpo; empty to use rpo.",
    )

    rpo: str | None = Field(
        default=None,
        title="RPO",
        description="Recovery point objective: the newest checkpoint in each tier is never older than this, e.g. 1h; empty for none.",
        examples=["1h"],
    )
    pin: list[str] = Field(
        default_factory=list,
        description="Checkpoint names kept hot and warm (with a cold copy) whatever their age.",
        examples=[["step-100"]],
    )
    gc_grace: str = Field(
        default="1h",
        title="GC grace",
        description="Chunks no ref needs are deleted only once they are older than this, e.g. 1h.",
    )
    ready_marker: str | None = Field(
        default=None,
        description="A file the trainer writes last (e.g. COMPLETE); a checkpoint is taken only once it exists. Empty to wait for files to settle instead.",
        examples=["COMPLETE"],
    )
    ready_settle: str = Field(
        default="2s",
        description="Without a marker, a checkpoint is taken only when no file changed over this long, e.g. 2s.",
    )
    restore_days: int = Field(
        default=1,
        ge=1,
        description="How many days an archived object restored for reading stays readable.",
    )
    restore_tier: RestoreTier = Field(
        default="Standard",
        description="The S3 retrieval tier of archive restores: Expedited (minutes), Standard (hours) or Bulk (cheapest, slowest).",
    )
    restore_timeout: str = Field(
        default="12h",
        description="How long a restore waits for archived objects to become readable, e.g. 12h.",
    )
    restore_poll: str = Field(
        default="30s",
        description="How often a restore checks on archived objects, e.g. 30s.",
    )

    @field_validator(*_DURATIONS, mode="before")
    @classmethod
    def _check_duration(cls, value: Any, info) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = format_duration(float(value))
        if isinstance(value, str):
            value = value.strip()
            if not value and info.field_name not in ("gc_grace", "ready_settle", "restore_timeout", "restore_poll"):
                return None
            parse_duration(value, info.field_name)  # its ValueError says how to write one
        return value

    @field_validator("hot_store", "warm_store", "cold_store", mode="before")
    @classmethod
    def _check_store(cls, value: Any, info) -> Any:
        """Empty and relative folders are refused: a policy file's relative folders are relative to
        the file, but a saved block has no folder of its own, and each worker that loads it would
        read a relative folder against its own working folder."""
        if isinstance(value, str):
            value = value.strip()
            if not value:
                raise ValueError(f"{info.field_name} is empty: give {_STORE_HELP}")
            try:
                address = StoreAddress.parse(value, check=False)
            except InvalidStoreURIError:
                return value  # the policy's own rules say what is wrong with it
            if address.kind == FOLDER and not address.scheme:  # a folder typed as a path
                if not os.path.isabs(os.path.expanduser(address.path)):
                    raise ValueError(
                        f"{info.field_name} {value!r} is a relative folder: a saved block is read by workers in "
                        "other working folders; give an absolute path"
                    )
        return value

    @field_validator("hot_media", "warm_media", "cold_media", "ready_marker", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return None
        return value.strip() if isinstance(value, str) else value

    # ------------------------------------------------------------------ the policy

    def to_policy_dict(self) -> dict:
        """The policy in its YAML form (what a policy file with these settings would hold)."""

        def tier(prefix: str, keys: tuple[str, ...]) -> dict:
            out = {}
            for key in keys:
                value = getattr(self, f"{prefix}_{key}")
                if value is not None:
                    out[key] = value
            return out

        doc: dict[str, Any] = {
            "namespace": self.namespace,
            "hot": tier("hot", ("store", "keep", "keep_days", "storage_class", "media", "compress", "rto", "rpo")),
            "warm": tier("warm", ("store", "keep", "keep_days", "storage_class", "media", "compress", "rto", "rpo")),
            "cold": tier("cold", ("store", "storage_class", "offsite", "media", "compress", "rto", "rpo")),
            "gc_grace": self.gc_grace,
            "ready": {"settle": self.ready_settle},
            "restore": {
                "days": self.restore_days,
                "tier": self.restore_tier,
                "timeout": self.restore_timeout,
                "poll": self.restore_poll,
            },
        }
        if self.rpo is not None:
            doc["rpo"] = self.rpo
        if self.pin:
            doc["pin"] = list(self.pin)
        if self.ready_marker is not None:
            doc["ready"]["marker"] = self.ready_marker
        return doc

    def get_policy(self) -> TierPolicy:
        """The validated core policy; :class:`~concord.errors.PolicyError` lists every problem."""
        name = getattr(self, "_block_document_name", None)
        return TierPolicy.from_dict(self.to_policy_dict(), source=f"block:{name}" if name else "TierPolicyBlock")

    @classmethod
    def from_policy(cls, policy: TierPolicy) -> TierPolicyBlock:
        """A block holding ``policy`` (to save a policy file's settings as a block)."""
        fields: dict[str, Any] = {
            "namespace": policy.namespace,
            "rpo": format_duration(policy.rpo_seconds) if policy.rpo_seconds is not None else None,
            "pin": list(policy.pin),
            "gc_grace": format_duration(policy.gc_grace_seconds),
            "ready_marker": policy.marker,
            "ready_settle": format_duration(policy.settle_seconds),
            "restore_days": policy.restore_days,
            "restore_tier": policy.restore_tier,
            "restore_timeout": format_duration(policy.restore_timeout_seconds),
            "restore_poll": format_duration(policy.restore_poll_seconds),
        }
        for spec in policy.tiers:
            t = spec.tier
            fields[f"{t}_store"] = spec.store
            fields[f"{t}_storage_class"] = spec.storage_class
            fields[f"{t}_media"] = spec.media
            fields[f"{t}_compress"] = spec.compress
            fields[f"{t}_rto"] = format_duration(spec.rto_seconds) if spec.rto_seconds is not None else None
            fields[f"{t}_rpo"] = format_duration(spec.rpo_seconds) if spec.rpo_seconds is not None else None
            if t == "cold":
                fields["cold_offsite"] = spec.offsite
            else:
                fields[f"{t}_keep"] = spec.keep
                fields[f"{t}_keep_days"] = spec.keep_days
        return cls(**fields)


# --------------------------------------------------------------------------- block:NAME


def load_policy_block(name: str) -> TierPolicy:
    """The policy of the saved :class:`TierPolicyBlock` ``name`` (what ``block:NAME`` means)."""
    spec = f"block:{name}"
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        raise PolicyError(spec, ["no block name after 'block:'"])
    try:
        block = load_block(TierPolicyBlock, name, spec)
    except ValueError as exc:
        raise PolicyError(spec, [f"the saved block cannot be loaded ({' '.join(str(exc).split())})"]) from exc
    if block is None:
        raise PolicyError(
            spec,
            [
                f"there is no {TierPolicyBlock.get_block_type_slug()} block named {name!r} in {where_blocks_live()}; create it with "
                f"`TierPolicyBlock(...).save({name!r})` or in the Prefect UI after "
                "`prefect block register -m concord_pipelines.blocks.tiers`"
            ],
        )
    return block.get_policy()
