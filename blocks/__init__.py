"""Prefect blocks: where things live (cluster stores)."""

from blocks.stores import LocalStore, S3Store, load_store_block

__all__ = ["LocalStore", "S3Store", "load_store_block"]
