"""Snapshots: the content-addressed snapshot of a checkpoint folder, its Merkle tree, diff, replication,
restore, verification, refs, garbage collection, staging and the checkpoint watcher."""
