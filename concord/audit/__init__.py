"""Audits: data drift, replica and cross-dtype weight drift, model cards, and the report they make together."""
