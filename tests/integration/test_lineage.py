"""Lineage against real MLflow backends: embedded sqlite, and a real ``mlflow server`` process.

Every answer Concord gives is checked against what MLflow's own client reads back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from concord.errors import LineageError, LineageUnreachableError, PromotionRefused
from concord.lineage import Lineage
from concord.lineage.client import default_tracking_uri
from concord.lineage.contracts import ColumnSpec, Contract, infer_contract, save_contract
from concord.lineage.data import register_data
from concord.lineage.graph import render_png, to_mermaid
from concord.lineage.runs import MLFLOW_DIGEST_CHARS
from concord.lineage.sources import SnapshotLocation, parse_source, snapshot_uri
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- backends


@pytest.fixture(scope="session")
def sqlite_uri(mlflow_quiet, tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow-embedded') / 'mlflow.db'}"


@pytest.fixture(params=["sqlite", "server"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def tracking_uri(backend, request) -> str:
    """One sqlite database for the session, or the session's ``mlflow server``."""
    return request.getfixturevalue("sqlite_uri" if backend == "sqlite" else "mlflow_server")


@pytest.fixture
def fresh_tracking_uri(backend, request, tmp_path, mlflow_quiet) -> str:
    """A sqlite database nobody has used yet (its schema is still to be made), or the server."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    return request.getfixturevalue("mlflow_server")


@pytest.fixture
def lineage(tracking_uri) -> Lineage:
    return Lineage(tracking_uri)


@pytest.fixture
def mlflow_client(tracking_uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


# ----------------------------------------------------------------------------- assets


@pytest.fixture(scope="session")
def penguins():
    from palmerpenguins import load_penguins

    return load_penguins()


@pytest.fixture
def stores(tmp_path) -> dict[str, LocalDirStore]:
    return {name: LocalDirStore(tmp_path / name) for name in ("weights", "data", "contracts", "replica")}


@pytest.fixture
def data_snap(penguins, stores):
    return register_data(penguins, stores["data"], name="penguins")


def _checkpoint(folder: Path) -> Path:
    """A small safetensors checkpoint; the config carries a random id so each test has its own root."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(11)
    folder.mkdir(parents=True)
    save_file(
        {"embed.weight": torch.randn(256, 32, generator=g), "head.weight": torch.randn(32, 8, generator=g)},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "tiny", "id": uuid.uuid4().hex}))
    return folder


@pytest.fixture
def root(stores, tmp_path) -> str:
    return snapshot(_checkpoint(tmp_path / "ckpt"), stores["weights"], ref="models/tiny").root


@pytest.fixture
def contract_v1(penguins, stores) -> Contract:
    contract = infer_contract(penguins, "penguins", 1)
    save_contract(stores["contracts"], contract)
    return contract


def _name(prefix: str = "llm") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
    }


# ----------------------------------------------------------------------------- configuration


def test_default_tracking_uri(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert default_tracking_uri() == "http://mlflow.internal:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("CONCORD_HOME", str(tmp_path / "home"))
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}"
    monkeypatch.delenv("CONCORD_HOME")
    monkeypatch.chdir(tmp_path)
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'data' / 'mlflow.db'}"


# ----------------------------------------------------------------------------- data and registration


def test_log_data_snapshot(lineage, mlflow_client, data_snap, penguins):
    run_id = lineage.log_data_snapshot(data_snap)
    run = mlflow_client.get_run(run_id)
    assert mlflow_client.get_experiment(run.info.experiment_id).name == "concord-data"
    assert run.data.tags["data"] == data_snap.id
    assert run.data.tags["digest"] == data_snap.digest
    (di,) = run.inputs.dataset_inputs
    assert di.dataset.name == "penguins"
    # MLflow keeps 36 characters of a digest: the start of ours; the full one is an input tag
    assert di.dataset.digest == data_snap.digest[:MLFLOW_DIGEST_CHARS]
    tags = {t.key: t.value for t in di.tags}
    assert tags == {
        "mlflow.data.context": "snapshot",
        "data": data_snap.id,
        "digest": data_snap.digest,
    }
    assert json.loads(di.dataset.profile)["num_rows"] == len(penguins) == data_snap.rows
    assert data_snap.id in di.dataset.source


def test_register_points_at_the_store_and_copies_nothing(
    lineage, mlflow_client, backend, stores, root, data_snap, contract_v1
):
    name = _name()
    data_run = mlflow_client.get_run(lineage.log_data_snapshot(data_snap))
    out = lineage.register_model_version(
        name,
        root,
        [stores["replica"].root, stores["weights"].root],  # the first store does not hold it
        data_snapshot=data_snap.id,
        contract="penguins@1",
        data_store=stores["data"],
        contracts_store=stores["contracts"],
        tiers={stores["weights"].root: "warm"},
        description="tiny test model",
    )
    mv = mlflow_client.get_model_version(name, out["version"])
    assert out["version"] == str(mv.version) == "1"
    # the description: the note, then the lineage as links MLflow's UI follows
    assert mv.description.startswith("tiny test model\n\n#### Lineage\n")
    # the data snapshot's link opens the run that logged it (the newest, when logged more than once)
    assert f"(#/experiments/{data_run.info.experiment_id}/runs/{data_run.info.run_id})" in mv.description
    assert "**schema contract**: `penguins@1`" in mv.description and "derived from" not in mv.description
    # tag keys are short enough for MLflow's version list to show them whole
    assert max(len(k) for k in mv.tags) <= 10
    assert mv.run_id == out["run_id"]
    assert mv.source == out["source"]
    # the source names the snapshot and the store holding it, on a server as in sqlite
    assert mv.source == snapshot_uri(root, [stores["weights"].uri])
    assert parse_source(mv.source) == SnapshotLocation(root, (stores["weights"].uri,))
    assert mv.tags == out["tags"]
    assert mv.tags["root"] == root
    assert mv.tags["store"] == stores["weights"].uri
    assert mv.tags["data"] == data_snap.id
    assert mv.tags["contract"] == "penguins@1"
    assert mv.tags["c_digest"] == contract_v1.digest()
    assert mv.tags["held_by"] == "weights (warm)"  # as a person reads it
    assert json.loads(mv.tags["replicas"]) == [{"store": stores["weights"].uri, "tier": "warm"}]
    # an external model: the weights stay in the store; the run holds only the lineage picture
    assert [a.path for a in mlflow_client.list_artifacts(out["run_id"])] == ["lineage"]
    assert [a.path for a in mlflow_client.list_artifacts(out["run_id"], "lineage")] == ["lineage/lineage.png"]
    run = mlflow_client.get_run(out["run_id"])
    assert mlflow_client.get_experiment(run.info.experiment_id).name == "concord-lineage"
    assert run.data.tags["version"] == f"{name}/1"
    assert [d.dataset.digest for d in run.inputs.dataset_inputs] == [data_snap.digest[:MLFLOW_DIGEST_CHARS]]


def test_a_root_no_store_holds_is_refused(lineage, mlflow_client, stores, root):
    missing = "ab" * 32
    name = _name()
    with pytest.raises(LineageError, match="no store holds snapshot") as info:
        lineage.register_model_version(name, missing, [stores["weights"].root, stores["replica"].root])
    assert stores["weights"].uri in str(info.value) and "concord sync" in str(info.value)
    assert mlflow_client.search_registered_models(filter_string=f"name = '{name}'") == []
    with pytest.raises(LineageError, match="64-hex"):
        lineage.register_model_version(name, root[:20], [stores["weights"].root])
    with pytest.raises(LineageError, match="not a registered model version"):
        lineage.register_model_version(name, root, [stores["weights"].root], parents=[f"{_name()}/1"])
    assert mlflow_client.search_registered_models(filter_string=f"name = '{name}'") == []


def test_unreachable_server_fails_fast_and_touches_no_store(tmp_path, stores, root, data_snap):
    lineage = Lineage("http://127.0.0.1:1")
    weights = Path(stores["weights"].root)
    before = _tree(weights)
    never = tmp_path / "never-created"
    start = time.monotonic()
    with pytest.raises(LineageUnreachableError) as info:
        lineage.register_model_version(_name(), root, [str(never), str(weights)], data_snapshot=data_snap.id)
    assert time.monotonic() - start < 10
    assert isinstance(info.value, ConnectionError)
    assert "http://127.0.0.1:1" in str(info.value) and "mlflow server" in str(info.value)
    assert not never.exists()
    assert _tree(weights) == before
    with pytest.raises(LineageUnreachableError):
        lineage.log_data_snapshot(data_snap)
    with pytest.raises(LineageUnreachableError):
        lineage.record_replica(root, str(never))
    assert not never.exists()


_REGISTER = textwrap.dedent(
    """
    import json, os, sys, time
    from concord.lineage import Lineage

    uri, store, root, name, ready, go = sys.argv[1:7]
    lineage = Lineage(uri)
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    print(json.dumps(lineage.register_model_version(name, root, [store])))
    """
)


def test_two_processes_register_at_once(fresh_tracking_uri, stores, root, tmp_path):
    """Both start together on a database nobody has used yet (sqlite) or on the server: both
    registrations succeed, with distinct versions."""
    import mlflow  # noqa: F401  (warm the import cache so both children start alike)

    name = _name()
    go = tmp_path / "go"
    procs = []
    for i in range(2):
        ready = tmp_path / f"ready-{i}"
        args = [fresh_tracking_uri, stores["weights"].root, root, name, str(ready), str(go)]
        child = subprocess.Popen(
            [sys.executable, "-c", _REGISTER, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append((ready, child))
    deadline = time.monotonic() + 120
    while not all(ready.exists() for ready, _ in procs):
        assert time.monotonic() < deadline, "the children did not start"
        assert all(p.poll() is None for _, p in procs), [p.communicate() for _, p in procs]
        time.sleep(0.01)
    go.touch()
    results = []
    for _, p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["version"] for r in results) == ["1", "2"]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=fresh_tracking_uri, registry_uri=fresh_tracking_uri)
    versions = client.search_model_versions(f"name = '{name}'")
    assert sorted(str(v.version) for v in versions) == ["1", "2"]
    assert {v.tags["root"] for v in versions} == {root}


# ----------------------------------------------------------------------------- queries


@pytest.fixture
def family(lineage, stores, root, data_snap, contract_v1):
    """base v1 (another model) → child v1 → child v2 (with data and contract)."""
    kw = dict(data_store=stores["data"], contracts_store=stores["contracts"])
    base = lineage.register_model_version(_name("base"), root, [stores["weights"].root])
    name = _name()
    v1 = lineage.register_model_version(
        name, root, [stores["weights"].root], data_snapshot=data_snap.id, parents=[f"{base['name']}/1"], **kw
    )
    v2 = lineage.register_model_version(
        name, root, [stores["weights"].root], data_snapshot=data_snap.id, contract="penguins@1",
        parents=[f"{name}/1"], **kw,
    )
    return {"base": base, "v1": v1, "v2": v2, "name": name}


def test_model_lineage_matches_mlflow(lineage, mlflow_client, family, stores, root, data_snap, contract_v1):
    name = family["name"]
    got = lineage.model_lineage(name, 2)
    mv = mlflow_client.get_model_version(name, "2")
    assert (got["name"], got["version"]) == (name, "2")
    assert got["root"] == mv.tags["root"] == root
    assert got["source"] == mv.source
    assert got["run_id"] == mv.run_id
    assert got["data_snapshots"] == [mv.tags["data"]] == [data_snap.id]
    assert got["contract"] == {"ref": "penguins@1", "digest": contract_v1.digest()}
    assert got["replicas"] == json.loads(mv.tags["replicas"])
    assert got["aliases"] == sorted(mv.aliases)
    run = mlflow_client.get_run(mv.run_id)
    assert got["dataset_digests"] == [d.dataset.digest for d in run.inputs.dataset_inputs]
    assert got["dataset_digests"] == [data_snap.digest[:MLFLOW_DIGEST_CHARS]]
    assert got["inputs"][0]["concord_digest"] == data_snap.digest
    assert got["inputs"][0]["context"] == "training"
    # parents, resolved recursively across models
    (parent,) = got["parents"]
    assert (parent["name"], parent["version"], parent["root"]) == (name, "1", root)
    (grand,) = parent["parents"]
    base = mlflow_client.get_model_version(family["base"]["name"], "1")
    assert (grand["name"], grand["version"], grand["root"]) == (base.name, "1", base.tags["root"])
    assert grand["parents"] == []


def test_data_lineage_matches_mlflow(lineage, mlflow_client, family, data_snap):
    got = lineage.data_lineage(data_snap.id)
    theirs = mlflow_client.search_model_versions(f"tags.`data` = '{data_snap.id}'")
    assert [(d["name"], d["version"]) for d in got] == sorted(
        ((v.name, str(v.version)) for v in theirs), key=lambda nv: (nv[0], int(nv[1]))
    )
    mine = [(d["name"], d["version"]) for d in got if d["name"] == family["name"]]
    assert mine == [(family["name"], "1"), (family["name"], "2")]
    by_key = {(v.name, str(v.version)): v for v in theirs}
    for d in got:
        v = by_key[(d["name"], d["version"])]
        assert (d["root"], d["source"], d["run_id"]) == (v.tags["root"], v.source, v.run_id)
    assert all(d["name"] != family["base"]["name"] for d in got)  # registered without data
    assert lineage.data_lineage("0" * 64) == []


def test_record_replica_updates_every_version_of_the_root(lineage, mlflow_client, family, stores, root):
    updated = lineage.record_replica(root, stores["replica"].root, "cold")
    theirs = mlflow_client.search_model_versions(f"tags.`root` = '{root}'")
    assert updated == sorted(f"{v.name}/{v.version}" for v in theirs)
    assert len(updated) == 3
    for v in theirs:
        held = json.loads(mlflow_client.get_model_version(v.name, v.version).tags["replicas"])
        assert {"store": stores["replica"].uri, "tier": "cold"} in held
        assert {"store": stores["weights"].uri, "tier": "hot"} in held
    # recording the same store again changes its tier, never duplicates it
    lineage.record_replica(root, stores["replica"].root, "warm")
    replicas = lineage.model_lineage(family["name"], 1)["replicas"]
    assert [r for r in replicas if r["store"] == stores["replica"].uri] == [{"store": stores["replica"].uri, "tier": "warm"}]


def test_graph_mermaid_and_png(lineage, family, tmp_path, data_snap):
    graph = lineage.lineage_graph(family["name"])
    ids = {n["id"] for n in graph["nodes"]}
    name, base = family["name"], family["base"]["name"]
    assert {f"version:{name}/1", f"version:{name}/2", f"version:{base}/1", f"data:{data_snap.id}", "contract:penguins@1"} <= ids
    edges = {(e["source"], e["target"], e["kind"]) for e in graph["edges"]}
    assert (f"version:{base}/1", f"version:{name}/1", "parent") in edges
    assert (f"version:{name}/1", f"version:{name}/2", "parent") in edges
    assert (f"data:{data_snap.id}", f"version:{name}/2", "data") in edges
    assert ("contract:penguins@1", f"version:{name}/2", "contract") in edges
    text = to_mermaid(graph)
    assert text.startswith("flowchart LR")
    for label in (f"{name} v1", f"{name} v2", f"{base} v1", "contract penguins@1", "data penguins"):
        assert label in text
    assert text.count("-->") == len(graph["edges"])
    png = render_png(graph, tmp_path / "out" / "lineage.png")
    data = Path(png).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 1024
    with pytest.raises(LineageError, match="no versions"):
        lineage.lineage_graph(_name("nobody"))


def test_each_version_carries_its_lineage_picture_and_links(lineage, mlflow_client, family, stores, root, data_snap, tmp_path):
    """What a person opening MLflow sees: every version's run holds ``lineage/lineage.png`` (that
    version's lineage, drawn), and its description links to its parents and data snapshot."""
    from PIL import Image

    name, base = family["name"], family["base"]["name"]
    for n, v in ((base, "1"), (name, "1"), (name, "2")):
        mv = mlflow_client.get_model_version(n, v)
        assert [a.path for a in mlflow_client.list_artifacts(mv.run_id, "lineage")] == ["lineage/lineage.png"]
        local = mlflow_client.download_artifacts(mv.run_id, "lineage/lineage.png", str(tmp_path / f"{n}-{v}"))
        with Image.open(local) as img:
            assert img.format == "PNG" and img.size[0] > 300 and img.size[1] > 200
        assert mv.description.startswith("#### Lineage\n")
        assert f"#/experiments/{mlflow_client.get_run(mv.run_id).info.experiment_id}/runs/{mv.run_id}/artifacts/lineage/lineage.png" in mv.description
        assert max(len(k) for k in mv.tags) <= 10
    v1, v2 = (mlflow_client.get_model_version(name, v).description for v in ("1", "2"))
    assert f"**derived from**: [{base}/1](#/models/{base}/versions/1)" in v1
    assert f"**derived from**: [{name}/1](#/models/{name}/versions/1)" in v2
    assert f"[penguins `{data_snap.id[:12]}`](#/experiments/" in v2 and "**schema contract**: `penguins@1`" in v2
    assert "derived from" not in mlflow_client.get_model_version(base, "1").description

    # the picture of v2 is v2's lineage: it, its ancestors, their data and contract; not later versions
    graph = lineage.version_graph(name, 2)
    kinds = {n["id"]: n["kind"] for n in graph["nodes"]}
    assert graph["model"] == f"{name}/2"
    assert kinds == {
        f"version:{name}/2": "version", f"version:{name}/1": "parent", f"version:{base}/1": "parent",
        f"data:{data_snap.id}": "data", "contract:penguins@1": "contract",
    }
    assert set(lineage.version_graph(name, 1)["nodes"][i]["id"] for i in range(3)) >= {f"version:{base}/1", f"version:{name}/1"}
    assert f"version:{name}/2" not in {n["id"] for n in lineage.version_graph(name, 1)["nodes"]}

    # Concord's experiments open on MLflow's classic runs list
    exp = mlflow_client.get_experiment_by_name("concord-lineage")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"

    # a version whose tags are concord.root … (as Concord wrote them before) is read the same
    name, replica = _name("old"), stores["replica"].uri
    mlflow_client.create_registered_model(name)
    mlflow_client.create_model_version(name, "s3://concord-old/p/manifests/x.json", tags={
        "concord.root": root, "concord.data_snapshot": data_snap.id, "concord.data_name": "penguins",
        "concord.parents": f"{family['name']}/2", "concord.held_by": json.dumps([{"store": replica, "tier": "cold"}]),
    })
    got = lineage.model_lineage(name, 1)
    assert got["root"] == root and got["data_snapshots"] == [data_snap.id]
    assert got["parents"][0]["name"] == family["name"] and got["replicas"] == [{"store": replica, "tier": "cold"}]
    assert (name, "1") in {(d["name"], d["version"]) for d in lineage.data_lineage(data_snap.id)}
    assert f"{name}/1" in lineage.record_replica(root, stores["replica"], "warm")
    tags = mlflow_client.get_model_version(name, "1").tags
    assert json.loads(tags["replicas"]) == [{"store": replica, "tier": "warm"}] and tags["held_by"] == "replica (warm)"
    # and one whose held_by is the JSON list (as Concord wrote it before replicas) too
    before = _name("json-held-by")
    mlflow_client.create_registered_model(before)
    mlflow_client.create_model_version(before, "s3://concord-old/p/manifests/x.json", tags={
        "root": root, "held_by": json.dumps([{"store": replica, "tier": "cold"}]),
    })
    assert lineage.model_lineage(before, 1)["replicas"] == [{"store": replica, "tier": "cold"}]
    assert f"{before}/1" in lineage.record_replica(root, stores["weights"], "hot")
    tags = mlflow_client.get_model_version(before, "1").tags
    assert tags["held_by"] == "replica (cold), weights (hot)"
    assert json.loads(tags["replicas"]) == sorted(
        [{"store": replica, "tier": "cold"}, {"store": stores["weights"].uri, "tier": "hot"}], key=lambda h: h["store"]
    )
    edges = {(e["source"], e["target"]) for e in lineage.lineage_graph(name)["edges"]}
    assert (f"version:{family['name']}/2", f"version:{name}/1") in edges


# ----------------------------------------------------------------------------- the promotion gate


@pytest.fixture
def gate(lineage, stores, root, data_snap, contract_v1, penguins):
    """Contracts in the contracts store, and a registration helper for model ``name``."""
    columns = {c.name: c for c in contract_v1.columns}
    dropped = Contract("penguins", 2, tuple(c for c in contract_v1.columns if c.name != "year"))
    relaxed = Contract(  # body_mass_g loses its upper bound: every table valid before stays valid
        "penguins", 3,
        tuple(
            ColumnSpec(c.name, c.type, c.required, c.min, None if c.name == "body_mass_g" else c.max, c.allowed)
            for c in contract_v1.columns
        ),
    )
    strict = Contract(
        "penguins-strict", 1,
        (
            ColumnSpec("sex", "string", required=True),  # 11 penguins have no recorded sex
            ColumnSpec("bill_length_mm", "float", required=False, max=50.0),
            columns["species"],
        ),
    )
    for c in (dropped, relaxed, strict):
        save_contract(stores["contracts"], c)
    name = _name()

    def register(contract: str | None, data: bool = True) -> str:
        return lineage.register_model_version(
            name, root, [stores["weights"].root],
            data_snapshot=data_snap.id if data else None, contract=contract,
            data_store=stores["data"], contracts_store=stores["contracts"],
        )["version"]

    return {"name": name, "register": register, "data": stores["data"], "contracts": stores["contracts"]}


def test_promotion_succeeds_and_mlflow_sees_the_alias(lineage, mlflow_client, gate, data_snap):
    v1 = gate["register"]("penguins@1")
    out = lineage.promote(gate["name"], v1, "champion", data_store=gate["data"], contracts=gate["contracts"])
    assert out["checks"]["validation"] == {"data_snapshot": data_snap.id, "success": True, "failures": []}
    assert out["checks"]["previous"] is None
    mv = mlflow_client.get_model_version_by_alias(gate["name"], "champion")
    assert str(mv.version) == v1
    assert mv.tags["promoted.champion"] == out["time"]
    assert lineage.model_lineage(gate["name"], v1)["aliases"] == ["champion"]
    # a compatible contract (a bound removed) takes the alias over
    v2 = gate["register"]("penguins@3")
    out = lineage.promote(gate["name"], v2, "champion", data_store=gate["data"], contracts=gate["contracts"])
    assert out["checks"]["previous"] == f"{gate['name']}/{v1}"
    assert out["checks"]["compatibility"]["compatible"] is True
    assert str(mlflow_client.get_model_version_by_alias(gate["name"], "champion").version) == v2


def test_promotion_refused_for_data_that_violates_the_contract(lineage, mlflow_client, gate):
    version = gate["register"]("penguins-strict@1")
    with pytest.raises(PromotionRefused) as info:
        lineage.promote(gate["name"], version, "staging", data_store=gate["data"], contracts=gate["contracts"])
    reasons = info.value.reasons
    assert len(reasons) == 1 and "violates contract penguins-strict@1" in reasons[0]
    assert "column 'sex'" in reasons[0] and "11 of 344 values are null" in reasons[0]
    assert "column 'bill_length_mm'" in reasons[0]
    assert info.value.alias == "staging" and info.value.version == version
    with pytest.raises(Exception) as missing:
        mlflow_client.get_model_version_by_alias(gate["name"], "staging")
    assert getattr(missing.value, "error_code", None) in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
    assert "promoted.staging" not in mlflow_client.get_model_version(gate["name"], version).tags


def test_promotion_refused_for_an_incompatible_contract(lineage, mlflow_client, gate):
    v1 = gate["register"]("penguins@1")
    lineage.promote(gate["name"], v1, "champion", data_store=gate["data"], contracts=gate["contracts"])
    v2 = gate["register"]("penguins@2")  # drops a column: the data still validates, consumers would break
    with pytest.raises(PromotionRefused) as info:
        lineage.promote(gate["name"], v2, "champion", data_store=gate["data"], contracts=gate["contracts"])
    (reason,) = info.value.reasons
    assert "penguins@2 is not compatible with penguins@1" in reason
    assert f"{gate['name']}/{v1}" in reason and "column 'year': removed" in reason
    assert str(mlflow_client.get_model_version_by_alias(gate["name"], "champion").version) == v1


def test_promotion_refused_without_data_and_contract(lineage, gate):
    version = gate["register"](None, data=False)
    with pytest.raises(PromotionRefused) as info:
        lineage.promote(gate["name"], version, "champion", data_store=gate["data"], contracts=gate["contracts"])
    assert len(info.value.reasons) == 2
    assert "no data snapshot" in info.value.reasons[0] and "no schema contract" in info.value.reasons[1]
    assert "(1)" in str(info.value) and "(2)" in str(info.value)
    with pytest.raises(LineageError, match="reserves"):
        lineage.promote(gate["name"], version, "v1", data_store=gate["data"], contracts=gate["contracts"])
