"""Formatting for flow artifacts: sizes a person reads, and Markdown tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from concord_pipelines.tasks.common import store_name
from concord_pipelines.tasks.progress import human_bytes as human

__all__ = ["EVENTS_PAGE", "MiB", "artifact_links", "brief", "cluster", "events_line", "human", "md_facts", "md_table", "short", "ui_link"]

#: the Prefect UI's event feed showing Concord's events only (Prefect's own task and flow run
#: events left out)
EVENTS_PAGE = "events?events=concord.*"

MiB = 1024 * 1024


def short(root: str | None) -> str:
    return f"`{root[:12]}`" if root else "(none)"


#: a store as a table names it: its cluster's short name, never a long path (see
#: :func:`~concord_pipelines.tasks.common.store_name`)
cluster = store_name


def brief(text: Any, n: int = 60) -> str:
    """``text`` on one line, cut to ``n`` characters (``…`` where cut): a table cell, which the UI
    never wraps."""
    line = " ".join(str(text).split())
    return line if len(line) <= n else line[: n - 1] + "…"


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def md_facts(rows: Iterable[Sequence[Any]]) -> str:
    """Label → value pairs as a list (``- **label**: value``): a two-column table would show an
    empty header row above them in the UI."""
    return "\n".join(f"- **{_cell(label)}**: {_cell(value)}" for label, value in rows)


def ui_link(page: str) -> str:
    """The address of a page of the Prefect UI (``PREFECT_UI_URL``, which Prefect derives from
    ``PREFECT_API_URL``), or the page's path on the UI's own host when the UI's address is not known."""
    from prefect.settings import PREFECT_UI_URL

    base = str(PREFECT_UI_URL.value() or "").rstrip("/")
    return f"{base}/{page.lstrip('/')}" if base else f"/{page.lstrip('/')}"


def events_line() -> str:
    """A markdown line linking the UI's event feed filtered to Concord's events."""
    return f"Concord's events (Prefect's own left out): [event feed]({ui_link(EVENTS_PAGE)})."


def artifact_links(flow_run_id: Any) -> str:
    """Links to the artifacts of one flow run (a subflow's), each by its key: ``[key](address)``,
    comma-separated; empty when the run has none or the API does not answer."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    if flow_run_id is None:
        return ""
    try:
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    except Exception:  # links are a convenience: the summary stands without them
        return ""
    seen: dict[str, str] = {}
    for a in found:
        if a.key and a.type != "progress":
            seen[a.key] = ui_link(f"artifacts/artifact/{a.id}")  # the newest of a key wins
    return ", ".join(f"[{key}]({url})" for key, url in seen.items())
