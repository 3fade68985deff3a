"""What keeps an artifact readable in the Prefect UI's artifact pane, as one check the flow tests
share: a table fits the pane (at most ``MAX_WIDTH`` characters wide, counted as :func:`width`
does: the UI never wraps a table cell), has a header row that says something, and names stores
by their cluster, roots by 12 hex digits: never an absolute path nor a 64-hex id."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

#: the widest a table may be, as :func:`width` counts, to fit the artifact pane of a 1400-pixel
#: window (about 830 pixels; 14-pixel text is about 7.3 pixels a character, and each cell has
#: 24 pixels of padding: about 4 characters a column)
MAX_WIDTH = 112
HEX64 = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def markdown_tables(md: str) -> list[list[list[str]]]:
    """The tables of a markdown text, each as its rows of cells (the header first, the ``---`` row left out)."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in md.splitlines():
        if line.lstrip().startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
                current.append(_cells(line))
        else:
            current = None
    return tables


def width(rows: Iterable[Iterable[str]]) -> int:
    """A table's width in characters: the widest cell of each column, and 4 a column for its padding."""
    widths: dict[int, int] = {}
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths.get(i, 0), len(str(cell)))
    return sum(widths.values()) + 4 * len(widths)


def _cell_problems(where: str, cells: Iterable[str], paths: Iterable[str]) -> list[str]:
    problems = []
    for cell in cells:
        text = str(cell)
        problems += [f"{where}: a path in {text!r}" for p in paths if p and p in text]
        if HEX64.search(text):
            problems.append(f"{where}: a 64-hex id in {text!r}")
    return problems


def artifact_problems(artifact, paths: Iterable[str] = ()) -> list[str]:
    """What is wrong with one Prefect artifact (a table or markdown one) for the UI; ``paths``
    are folders that must not appear in a table (the test's stores)."""
    paths = [str(p) for p in paths]
    key = artifact.key or artifact.type
    if artifact.type == "table":
        rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
        problems = []
        table = [list(rows[0])] + [list(map(str, row.values())) for row in rows] if rows else []
        if width(table) > MAX_WIDTH:
            problems.append(f"{key}: {width(table)} characters wide ({', '.join(table[0])})")
        for row in table[1:]:
            problems += _cell_problems(key, row, paths)
        return problems
    if artifact.type != "markdown":
        return []
    problems = []
    for table in markdown_tables(artifact.data):
        header = table[0]
        if not any(header):
            problems.append(f"{key}: an empty header row above {table[1:2]}")
        if width(table) > MAX_WIDTH:
            problems.append(f"{key}: {width(table)} characters wide ({', '.join(header)})")
        for row in table:
            problems += _cell_problems(key, row, paths)
    return problems


def unreadable(artifacts, paths: Iterable[str] = ()) -> list[str]:
    """Every problem of every artifact given (empty: all readable)."""
    paths = list(paths)
    return [p for a in artifacts for p in artifact_problems(a, paths)]
