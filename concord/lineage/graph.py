"""The lineage graph of a model: every version, the versions they derive from, their data snapshots
and contracts; drawn as a Mermaid flowchart, a PNG or a table. The lineage of one version
(:func:`version_graph`) is drawn when it is registered and kept as ``lineage/lineage.png`` in the
run that registered it (:func:`log_lineage_picture`)."""

from __future__ import annotations

import os

from concord.errors import LineageError
from concord.lineage.client import Tracking, retry_locked, shown_uri
from concord.lineage.registry import get_version, parents_of, quote, search_versions, split_version, version_aliases
from concord.lineage.tags import LINEAGE_PNG, TAG_CONTRACT, TAG_DATA, TAG_DATA_NAME, TAG_ROOT, read_tags


def lineage_graph(tracking: Tracking, name: str) -> dict:
    """Nodes and edges: every version of ``name``, the versions they derive from (any model),
    their data snapshots and their contracts."""
    tracking.ensure_ready()
    versions = search_versions(tracking, f"name = '{quote(name)}'")
    if not versions:
        raise LineageError(f"model {name!r} has no versions in {shown_uri(tracking.tracking_uri)}")
    return _walk(tracking, name, versions, version_aliases(tracking, {name}))


def version_graph(tracking: Tracking, name: str, version: str | int) -> dict:
    """The lineage of one version: it, the versions it derives from (and theirs, any model),
    their data snapshots and contracts. ``model`` is ``name/version``."""
    tracking.ensure_ready()
    mv = get_version(tracking, name, str(version))
    graph = _walk(tracking, name, [mv], version_aliases(tracking, {name}), only=str(mv.version))
    return graph | {"model": f"{name}/{mv.version}"}


def _walk(tracking: Tracking, name: str, versions: list, aliases: dict, only: str | None = None) -> dict:
    """The graph reached from ``versions`` through their parents. A version of ``name`` is a
    ``version`` node (the one ``only`` names, when given; its other versions are ``parent``s)."""
    nodes: dict[str, dict] = {}
    edges: list[dict] = []
    pending = list(versions)
    seen: set[str] = set()
    while pending:
        mv = pending.pop()
        key = f"{mv.name}/{mv.version}"
        if key in seen:
            continue
        seen.add(key)
        tags = read_tags(mv.tags)
        vid = f"version:{key}"
        own = mv.name == name and (only is None or str(mv.version) == only)
        nodes[vid] = {
            "id": vid,
            "kind": "version" if own else "parent",
            "label": f"{mv.name} v{mv.version}",
            "name": mv.name,
            "version": str(mv.version),
            "root": tags.get(TAG_ROOT),
            "aliases": sorted(aliases.get((mv.name, str(mv.version)), [])),
        }
        if tags.get(TAG_DATA):
            did = f"data:{tags[TAG_DATA]}"
            label = f"data {tags.get(TAG_DATA_NAME, '')}".strip()
            nodes.setdefault(did, {"id": did, "kind": "data", "label": label, "snapshot": tags[TAG_DATA]})
            edges.append({"source": did, "target": vid, "kind": "data"})
        if tags.get(TAG_CONTRACT):
            cid = f"contract:{tags[TAG_CONTRACT]}"
            ref = tags[TAG_CONTRACT]
            nodes.setdefault(cid, {"id": cid, "kind": "contract", "label": f"contract {ref}", "ref": ref})
            edges.append({"source": cid, "target": vid, "kind": "contract"})
        for p in parents_of(tags):
            edges.append({"source": f"version:{p}", "target": vid, "kind": "parent"})
            if p not in seen:
                p_name, p_version = split_version(p)
                try:
                    pending.append(get_version(tracking, p_name, p_version))
                except LineageError:
                    nodes.setdefault(
                        f"version:{p}",
                        {"id": f"version:{p}", "kind": "missing", "label": f"{p_name} v{p_version} (missing)",
                         "name": p_name, "version": p_version, "root": None, "aliases": []},
                    )
    ordered = sorted(nodes.values(), key=_node_order)
    return {"model": name, "nodes": ordered, "edges": sorted(edges, key=lambda e: (e["source"], e["target"]))}


_KIND_ORDER = {"data": 0, "contract": 1, "parent": 2, "missing": 2, "version": 3}


def _node_order(node: dict):
    version = node.get("version")
    return (_KIND_ORDER.get(node["kind"], 9), node.get("name", ""), int(version) if version else 0, node["id"])


# ---------------------------------------------------------------------- pictures


def log_lineage_picture(tracking: Tracking, name: str, version: str, run_id: str) -> str | None:
    """Draw the lineage of ``name``/``version`` (:func:`concord.lineage.graph.version_graph`)
    and log it as the artifact ``lineage/lineage.png`` of run ``run_id``; return the artifact's
    path. The version is registered already: a picture that cannot be drawn or stored is a
    warning, not a failed registration (``None``)."""
    import tempfile
    import warnings

    try:
        graph = version_graph(tracking, name, version)
        with tempfile.TemporaryDirectory(prefix="concord-lineage-") as tmp:
            png = render_png(graph, os.path.join(tmp, os.path.basename(LINEAGE_PNG)))
            retry_locked(tracking.client.log_artifact, run_id, png, os.path.dirname(LINEAGE_PNG))
    except Exception as exc:  # noqa: BLE001 - the version stands without its picture
        warnings.warn(f"{name}/{version}: its lineage picture was not logged to run {run_id} ({exc})", stacklevel=2)
        return None
    return LINEAGE_PNG




def to_mermaid(graph: dict) -> str:
    """A Mermaid flowchart of a :meth:`Lineage.lineage_graph` result."""
    ids = {n["id"]: f"n{i}" for i, n in enumerate(graph["nodes"])}
    lines = ["flowchart LR"]
    for kind, style in _MERMAID_STYLES.items():
        lines.append(f"  classDef {kind} {style}")
    for n in graph["nodes"]:
        label = _node_label(n).replace('"', "#quot;").replace("\n", "<br/>")
        lines.append(f'  {ids[n["id"]]}["{label}"]:::{n["kind"]}')
    for e in graph["edges"]:
        if e["source"] in ids and e["target"] in ids:
            lines.append(f'  {ids[e["source"]]} -->|{e["kind"]}| {ids[e["target"]]}')
    return "\n".join(lines) + "\n"


def to_table(graph: dict) -> tuple[list[str], list[list[str]]]:
    """The versions of a lineage graph as a table (headers, rows), oldest first: each version's
    snapshot root, the versions it derives from, its data snapshot, its contract and its aliases.
    What a markdown artifact shows in place of a drawing."""
    incoming: dict[str, dict[str, list[str]]] = {}
    by_id = {n["id"]: n for n in graph["nodes"]}
    for e in graph["edges"]:
        src = by_id.get(e["source"])
        if src is None:
            continue
        shown = {
            "parent": f"{src.get('name')}/{src.get('version')}" + (" (missing)" if src["kind"] == "missing" else ""),
            "data": f"{src['label'][len('data '):] or 'data'} {(src.get('snapshot') or '')[:12]}".strip(),
            "contract": src.get("ref") or src["label"],
        }.get(e["kind"], src["label"])
        incoming.setdefault(e["target"], {}).setdefault(e["kind"], []).append(shown)
    headers = ["version", "snapshot", "derived from", "data", "contract", "aliases"]
    rows = []
    for n in graph["nodes"]:
        if n["kind"] not in ("version", "parent", "missing"):
            continue
        into = incoming.get(n["id"], {})
        rows.append([
            f"{n['name']}/{n['version']}" + (" (missing)" if n["kind"] == "missing" else ""),
            (n.get("root") or "")[:12],
            ", ".join(into.get("parent", [])),
            ", ".join(into.get("data", [])),
            ", ".join(into.get("contract", [])),
            " ".join(f"@{a}" for a in n.get("aliases") or []),
        ])
    return headers, rows


_COLORS = {
    "version": "#4C78A8",
    "parent": "#72B7B2",
    "missing": "#BAB0AC",
    "data": "#F58518",
    "contract": "#54A24B",
}
_EDGE_COLORS = {"parent": "#333", "data": "#B35806", "contract": "#2E7D32"}
_MERMAID_STYLES = {k: f"fill:{c},color:#fff,stroke:#333" for k, c in _COLORS.items()}


def _node_label(n: dict) -> str:
    lines = [n["label"]]
    if n.get("root"):
        lines.append(f"root {n['root'][:12]}")
    if n.get("snapshot"):
        lines.append(n["snapshot"][:12])
    if n.get("aliases"):
        lines.append(" ".join(f"@{a}" for a in n["aliases"]))
    return "\n".join(lines)


def render_png(graph: dict, path: str | os.PathLike) -> str:
    """Draw the graph as a PNG (left to right: data and contracts, then versions by generation)."""
    import networkx as nx
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    g = nx.DiGraph()
    for n in graph["nodes"]:
        g.add_node(n["id"], **n)
    for e in graph["edges"]:
        if e["source"] in g and e["target"] in g:
            g.add_edge(e["source"], e["target"], kind=e["kind"])
    if nx.is_directed_acyclic_graph(g):
        for layer, generation in enumerate(nx.topological_generations(g)):
            for node in generation:
                g.nodes[node]["layer"] = layer
    else:
        for node in g:
            g.nodes[node]["layer"] = 0 if g.nodes[node]["kind"] in ("data", "contract") else 1
    layers: dict[int, list[str]] = {}
    for node, data in g.nodes(data=True):
        layers.setdefault(data["layer"], []).append(node)
    pos = {}
    for layer, members in layers.items():
        members.sort(key=lambda m: _node_order(g.nodes[m]))
        for i, node in enumerate(members):
            pos[node] = (layer * 3.0, -(i - (len(members) - 1) / 2) * 1.4)
    width = max(6.0, 3.0 * len(layers) + 1.5)
    height = max(3.5, 1.1 * max((len(m) for m in layers.values()), default=1) + 1.5)

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    ax.set_axis_off()
    boxes = {}
    for node, (x, y) in pos.items():
        data = g.nodes[node]
        boxes[node] = ax.text(
            x, y, _node_label(data), ha="center", va="center", fontsize=8, color="white", zorder=3,
            bbox={"boxstyle": "round,pad=0.45", "facecolor": _COLORS.get(data["kind"], "#888"), "edgecolor": "#333"},
        )
    for u, v, data in g.edges(data=True):
        span = abs(g.nodes[v]["layer"] - g.nodes[u]["layer"])
        ax.annotate(
            "", xy=pos[v], xytext=pos[u], zorder=2,
            arrowprops={
                "arrowstyle": "-|>", "color": _EDGE_COLORS.get(data["kind"], "#555"), "lw": 1.2,
                "patchA": boxes[u].get_bbox_patch(), "patchB": boxes[v].get_bbox_patch(),
                "shrinkA": 2, "shrinkB": 2,
                # an edge that skips a layer bends, so it does not run behind the boxes in between
                "connectionstyle": f"arc3,rad={0.25 if span > 1 else 0.0}",
            },
        )
    xs = [p[0] for p in pos.values()] or [0]
    ys = [p[1] for p in pos.values()] or [0]
    ax.set_xlim(min(xs) - 1.6, max(xs) + 1.6)
    ax.set_ylim(min(ys) - 1.0, max(ys) + 1.0)
    kinds = sorted({g.nodes[n]["kind"] for n in g}, key=lambda k: _KIND_ORDER.get(k, 9))
    ax.legend(
        handles=[Patch(color=_COLORS.get(k, "#888"), label=k) for k in kinds],
        loc="upper left", fontsize=8, frameon=False,
    )
    ax.set_title(f"lineage of {graph['model']}", fontsize=10)
    fig.tight_layout()
    out = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format="png")
    return out
