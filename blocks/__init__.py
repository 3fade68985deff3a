"""Prefect blocks: where things live (cluster stores) and how checkpoints are tiered."""

from blocks.stores import LocalStore, S3Store, load_store_block
from blocks.tiers import TierPolicyBlock, load_policy_block

__all__ = ["LocalStore", "S3Store", "TierPolicyBlock", "load_policy_block", "load_store_block"]
