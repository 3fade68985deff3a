"""Benchmarks of Concord against the tools it replaces: ``python -m bench [snapshot|sync|diff]``.

See bench/README.md for what each one measures and the targets it is held to.
"""
