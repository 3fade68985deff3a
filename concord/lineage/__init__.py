"""Lineage in MLflow: model versions × data snapshots × schema contracts."""
