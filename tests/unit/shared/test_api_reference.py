"""``make docs`` builds the API reference: one page with every name ``import concord`` exports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import concord

ROOT = Path(__file__).resolve().parents[3]


def _docs_command() -> list[str]:
    """The pdoc arguments of the Makefile's ``docs`` target, so that the test builds what it builds."""
    makefile = (ROOT / "Makefile").read_text()
    m = re.search(r"^docs:.*\n\t\$\(VENV\)/bin/pdoc (.*) -o \$\(API_DOCS\) (.*)$", makefile, re.MULTILINE)
    assert m, "the Makefile has no docs target running pdoc"
    return [*m.group(1).split(), *(a.strip("'") for a in m.group(2).split())]


def test_the_api_page_builds_with_every_exported_name(tmp_path):
    args = _docs_command()
    out = subprocess.run(
        [sys.executable, "-m", "pdoc", *args[:-2], "-o", str(tmp_path), *args[-2:]],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "concord.html").read_text()
    missing = [name for name in concord.__all__ if f'id="{name}"' not in html]
    assert missing == [], f"not on the API page: {missing}"
    # the arguments and errors of a verb are rendered from its docstring, not left as text
    snapshot = html[html.index('id="snapshot"') :]
    assert "Raises" in snapshot[:20_000] and "ref" in snapshot[:20_000]
    # one page: the wings' modules are not documented on pages of their own
    assert sorted(p.name for p in tmp_path.glob("*.html")) == ["concord.html", "index.html"]
