"""What people read in MLflow and Prefect about a version's lineage, as pure functions: tags under
their short names (and the old ``concord.*`` ones), the markdown table of a lineage graph, links
into MLflow's UI, and the lineage picture."""

from __future__ import annotations

import pytest

from concord.lineage.graph import render_png, to_table
from concord.lineage.registry import ui_link
from concord.lineage.tags import LEGACY, TAG_HELD_BY, TAG_PROMOTED, TAG_REPLICAS, TAG_ROOT, read_tags

ROOT, DATA = "ab" * 32, "cd" * 32


def test_every_version_tag_key_fits_mlflows_version_list():
    # MLflow's version list cuts a chip past 30 characters: the key too when it is over 15
    assert all(len(new) <= 10 for new in LEGACY) and len(TAG_PROMOTED + "stable") <= 15


def test_old_tag_names_are_read_under_the_new_ones_and_the_new_ones_win():
    old = {"concord.root": ROOT, "concord.held_by": "[]", "concord.promoted.champion": "2025-01-01", "other": "x"}
    got = read_tags(old)
    assert got[TAG_ROOT] == ROOT and got[TAG_REPLICAS] == "[]" and got["promoted.champion"] == "2025-01-01"
    assert got[TAG_HELD_BY] == "(none)"
    assert got["other"] == "x" and got["concord.root"] == ROOT  # nothing removed
    assert read_tags({"concord.root": "old", TAG_ROOT: ROOT})[TAG_ROOT] == ROOT
    assert read_tags(None) == {}


@pytest.mark.parametrize(
    "parts, link",
    [
        (("models", "llama-base", "versions", "3"), "#/models/llama-base/versions/3"),
        (("models", "a b/c", "versions", "1"), "#/models/a%20b%2Fc/versions/1"),
        (("experiments", "7", "runs", "f00"), "#/experiments/7/runs/f00"),
    ],
)
def test_ui_links_are_relative_to_the_tracking_servers_page(parts, link):
    assert ui_link(*parts) == link


def _graph() -> dict:
    def version(name, v, kind, aliases=()):
        return {"id": f"version:{name}/{v}", "kind": kind, "label": f"{name} v{v}", "name": name, "version": v,
                "root": ROOT, "aliases": list(aliases)}

    nodes = [
        {"id": f"data:{DATA}", "kind": "data", "label": "data penguins", "snapshot": DATA},
        {"id": "contract:penguins@1", "kind": "contract", "label": "contract penguins@1", "ref": "penguins@1"},
        version("base", "1", "parent"),
        {"id": "version:gone/4", "kind": "missing", "label": "gone v4 (missing)", "name": "gone", "version": "4", "root": None, "aliases": []},
        version("m", "1", "version"),
        version("m", "2", "version", ["champion"]),
    ]
    edges = [
        {"source": "version:base/1", "target": "version:m/1", "kind": "parent"},
        {"source": "version:gone/4", "target": "version:m/1", "kind": "parent"},
        {"source": "version:m/1", "target": "version:m/2", "kind": "parent"},
        {"source": f"data:{DATA}", "target": "version:m/2", "kind": "data"},
        {"source": "contract:penguins@1", "target": "version:m/2", "kind": "contract"},
    ]
    return {"model": "m", "nodes": nodes, "edges": edges}


def test_a_lineage_graph_as_a_table_has_one_row_per_version():
    headers, rows = to_table(_graph())
    assert headers == ["version", "snapshot", "derived from", "data", "contract", "aliases"]
    assert rows == [
        ["base/1", ROOT[:12], "", "", "", ""],
        ["gone/4 (missing)", "", "", "", "", ""],
        ["m/1", ROOT[:12], "base/1, gone/4 (missing)", "", "", ""],
        ["m/2", ROOT[:12], "m/1", f"penguins {DATA[:12]}", "penguins@1", "@champion"],
    ]


def test_the_lineage_picture_is_a_png(tmp_path):
    from PIL import Image

    out = render_png(_graph() | {"model": "m/2"}, tmp_path / "lineage" / "lineage.png")
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size[0] > img.size[1] > 100
