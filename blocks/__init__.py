"""Prefect blocks: where things live (cluster stores), how checkpoints are tiered, whom a deployment trusts."""

from concord_pipelines.blocks.stores import LocalStore, S3Store, load_store_block
from concord_pipelines.blocks.tiers import TierPolicyBlock, load_policy_block
from concord_pipelines.blocks.trust import TrustBlock, load_trust_block

__all__ = ["LocalStore", "S3Store", "TierPolicyBlock", "TrustBlock", "load_policy_block", "load_store_block", "load_trust_block"]
