"""Formatting for flow artifacts: sizes a person reads, and Markdown tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from concord_pipelines.tasks.progress import human_bytes as human

__all__ = ["MiB", "human", "md_table", "short"]

MiB = 1024 * 1024


def short(root: str | None) -> str:
    return f"`{root[:12]}`" if root else "(none)"


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
