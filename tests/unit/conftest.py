"""Fixtures for the core's tests: a toy checkpoint and local stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from toy_checkpoints import make_checkpoint

from concord.stores import LocalDirStore


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "ckpt")


@pytest.fixture
def stores(tmp_path: Path):
    return [LocalDirStore(tmp_path / f"c{i}") for i in range(3)]
