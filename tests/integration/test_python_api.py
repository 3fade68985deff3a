"""Every example of docs/python.md, read from the page and run as written, against a folder store
and an S3 store on a real moto_server: the page cannot drift from the API.

Each example runs in a folder of its own holding what its text names (``ckpt/step-1000``,
``keys/release.pem``, ``tiers.yaml``, ``data/train.csv``…); only the two store addresses are
rewritten (to folders there, or to a bucket of the moto_server)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import uuid
from pathlib import Path

import pytest
from servers import patched_environ, running_registry
from toy_checkpoints import files_equal, fine_tune, make_checkpoint

import concord
from concord.api import VERBS
from concord.snapshots.refs import resolve_root
from concord.stores import open_store

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python.md"
PRIMARY, REPLICA, ARCHIVE = "s3://models/us-east", "s3://models/eu-west", "s3://models/archive"
#: the OCI registry the examples name, and the credentials a test must not inherit
OCI_REGISTRY, OCI_CLEARED = "localhost:5000", ("CONCORD_REGISTRY_USERNAME", "CONCORD_REGISTRY_PASSWORD", "DOCKER_CONFIG")
#: sections whose code is a template with the caller's own names (run in test_training_script)
TEMPLATES = ("A training script", "Names")


def examples() -> dict[str, str]:
    """Each ``## heading`` of the page → its first ``python`` block."""
    found = {}
    for section in re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]:
        heading, _, body = section.partition("\n")
        block = re.search(r"```python\n(.*?)```", body, re.S)
        if block and not heading.startswith(TEMPLATES):
            found[heading.strip()] = block.group(1)
    return found


EXAMPLES = examples()

# ----------------------------------------------------------------------------- the world an example runs in


def write_adapter(path: Path, seed: int, dim: int = 16, r: int = 4) -> Path:
    """A small PEFT LoRA adapter folder (``adapter_config.json``, ``adapter_model.safetensors``)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for m in ("layers.0.attn.query", "layers.0.attn.value"):
        tensors[f"base_model.model.{m}.lora_A.weight"] = 0.1 * torch.randn(r, dim, generator=g)
        tensors[f"base_model.model.{m}.lora_B.weight"] = 0.1 * torch.randn(dim, r, generator=g)
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": "tiny-base",
        "r": r,
        "lora_alpha": 8,
        "target_modules": ["query", "value"],
        "bias": "none",
        "fan_in_fan_out": False,
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(params=["folder", "s3"])
def world(request, tmp_path, monkeypatch):
    """A folder holding what the examples name, the current directory while one runs; the two
    store addresses it stands for (``models/llama`` has two versions in the first, the newer
    signed with ``keys/release.pem``; the second is a replica of it)."""
    monkeypatch.chdir(tmp_path)
    for name in ("CONCORD_TRUSTED_KEYS", "CONCORD_KEY_FILE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONCORD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CONCORD_NO_PROGRESS", "1")
    if request.param == "s3":
        s3 = request.getfixturevalue("s3_store")
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
        base = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}"
    else:
        base = "stores"
    # the registry of data snapshots, profiles and contracts is a store too: on S3 in the S3 world
    registry = f"{base}/registry" if request.param == "s3" else str(tmp_path / "registry")
    monkeypatch.setenv("CONCORD_REGISTRY", registry)
    # an S3 address as a person types it, with how many transfers run at once
    places = {
        PRIMARY: f"{base}/us-east" + ("?connections=4" if request.param == "s3" else ""),
        REPLICA: f"{base}/eu-west",
        ARCHIVE: f"{base}/archive",
    }
    v1 = make_checkpoint(tmp_path / "ckpt" / "step-1000")
    (v1 / "COMPLETE").write_text("")
    v2 = fine_tune(v1, tmp_path / "ckpt" / "step-2000", ["layers.0.attn.q.weight"])
    primary = open_store(places[PRIMARY])
    for v in (v1, v2):
        concord.snapshot(v, primary, ref="models/llama", progress=False)
    from concord.trust import generate_key, load_signing_key, sign_root

    (tmp_path / "keys").mkdir()
    key = generate_key(tmp_path / "keys" / "release.pem")
    sign_root(primary, resolve_root(primary, "models/llama"), load_signing_key(tmp_path / "keys" / "release.pem"))
    concord.sync(primary, places[REPLICA], ref="models/llama", progress=False)
    concord.snapshot(write_adapter(tmp_path / "adapters" / "0", 0), primary, ref="acme/adapter-0", progress=False)
    concord.snapshot(
        write_adapter(tmp_path / "adapters" / "1", 1), places[REPLICA], ref="acme/adapter-1", progress=False
    )
    (tmp_path / "data").mkdir()
    rows = "\n".join(f"{i},{(i * 7) % 13 / 10},{'ab'[i % 2]}" for i in range(200))
    for name in ("train", "today"):
        (tmp_path / "data" / f"{name}.csv").write_text("id,x,label\n" + rows + "\n")
    tiers = {t: f"{base}/tier-{t}" if t != "hot" else "tiers/hot" for t in ("hot", "warm", "cold")}
    folders = request.param == "folder"  # 3-2-1: folders for warm and cold are declared other media, off-site
    (tmp_path / "tiers.yaml").write_text(
        f"namespace: llama\nhot: {{store: {tiers['hot']}, keep: 2}}\n"
        f"warm: {{store: {tiers['warm']}, keep: 4{', media: nas' if folders else ''}}}\n"
        f"cold: {{store: {tiers['cold']}{', offsite: true' if folders else ''}}}\nready: {{marker: COMPLETE}}\n"
    )
    mlflow_db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_db}")
    return {"dir": tmp_path, "places": places, "registry": registry, "v1": v1, "v2": v2, "key_id": key.id}


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory):
    """``host:port`` of a CNCF distribution registry on 127.0.0.1, without authentication."""
    d = tmp_path_factory.mktemp("oci-registry")
    with patched_environ({"DOCKER_CONFIG": str(d / "no-docker-config")}, OCI_CLEARED):
        with running_registry(d / "data", d / "registry.log") as address:
            yield address


def run_example(heading: str, world: dict, also: dict[str, str] | None = None) -> tuple[dict, str]:
    """Run the example under ``heading`` as written, its store addresses those of ``world`` (and
    each text of ``also`` replaced); (its names, what it printed)."""
    code = EXAMPLES[heading]
    for typed, real in world["places"].items():
        code = code.replace(f'"{typed}"', repr(real))
    for typed, real in (also or {}).items():
        code = code.replace(typed, real)
    names: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"docs/python.md: {heading}", "exec"), names)
    return names, printed.getvalue()


def _root(world: dict, spec: str, which: str = PRIMARY) -> str:
    return resolve_root(open_store(world["places"][which]), spec)


# ----------------------------------------------------------------------------- one test per example


def test_the_page_has_an_example_for_every_verb():
    code = "\n".join(EXAMPLES.values())
    assert [v for v in VERBS if f"concord.{v}(" not in code] == []


def test_open_store(world):
    names, printed = run_example("concord.open_store", world)
    assert isinstance(names["store"], concord.Store)
    assert f"models/llama {_root(world, 'models/llama')}" in printed


def test_snapshot(world):
    names, _ = run_example("concord.snapshot", world)
    r = names["r"]
    assert isinstance(r, concord.SnapshotResult)
    assert r.ref == "models/llama" and r.ref_version == 3 and r.new_chunks == 0  # step-1000 again: nothing new
    assert _root(world, "models/llama") == r.root == _root(world, "models/llama~2")


def test_sync(world):
    moved = concord.snapshot(world["v1"], world["places"][PRIMARY], ref="models/llama", progress=False).root
    names, printed = run_example("concord.sync", world)
    assert isinstance(names["t"], concord.TargetResult) and names["t"].root == moved
    assert _root(world, "models/llama", REPLICA) == moved != _root(world, "models/llama~1", REPLICA)
    assert names["t"].root in printed


def test_diff(world):
    names, printed = run_example("concord.diff", world)
    d = names["d"]
    assert isinstance(d, concord.DiffResult) and not d.same
    assert [(c.file, c.tensor) for c in d.changes] == [("model.safetensors", "layers.0.attn.q.weight")]
    assert "layers.0.attn.q.weight" in printed


def test_restore(world):
    names, _ = run_example("concord.restore", world)
    assert isinstance(names["r"], concord.RestoreResult) and names["r"].root == _root(world, "models/llama~1")
    assert files_equal(world["dir"] / "restored" / "llama", world["v1"])


def test_verify(world):
    names, _ = run_example("concord.verify", world)
    r = names["r"]
    assert isinstance(r, concord.VerifyResult) and r.ok and r.chunks_checked > 0 and not r.missing


def test_rollback(world):
    before = _root(world, "models/llama~1")
    names, _ = run_example("concord.rollback", world)
    r = names["r"]
    assert isinstance(r, concord.RollbackResult) and r.root == before == _root(world, "models/llama")


def test_refs_and_log(world):
    names, printed = run_example("concord.refs and concord.log", world)
    (llama,) = [r for r in names["refs"] if r["ref"] == "models/llama"]
    assert llama["version"] == 2 and llama["root"] == _root(world, "models/llama")
    history = names["history"]
    assert [e["version"] for e in history] == [2, 1]
    assert [e["root"] for e in history] == [_root(world, "models/llama"), _root(world, "models/llama~1")]
    # the newer root is signed with keys/release.pem; the older one by nobody
    assert [e["signed_by"] for e in history] == [[world["key_id"]], []] and "models/llama" in printed


def test_sign_and_signatures(world):
    names, _ = run_example("concord.sign and concord.signatures", world)
    assert isinstance(names["s"], concord.SignResult) and names["s"].key_id == world["key_id"]
    assert (
        isinstance(names["v"], concord.Verdict)
        and names["v"].trusted
        and list(names["v"].signed_by) == [world["key_id"]]
    )


def test_checkout(world):
    names, _ = run_example("concord.checkout", world)
    r = names["r"]
    assert isinstance(r, concord.CheckoutResult) and r.switched and r.root == _root(world, "models/llama")
    assert files_equal(world["dir"] / "serving" / "current", world["v2"])


def test_checkout_of_an_unsigned_root_is_refused(world):
    # the same example, on the version no key signed: refused, nothing written to the node
    heading = "concord.checkout"
    EXAMPLES[heading + " (unsigned)"] = EXAMPLES[heading].replace('ref="models/llama"', 'ref="models/llama~1"')
    try:
        with pytest.raises(concord.UntrustedRootError) as caught:
            run_example(heading + " (unsigned)", world)
    finally:
        del EXAMPLES[heading + " (unsigned)"]
    assert caught.value.exit_code == 13 and caught.value.root == _root(world, "models/llama~1")
    assert not (world["dir"] / "serving").exists()


def test_rollback_checkout(world):
    names, _ = run_example("concord.rollback_checkout", world)
    r = names["r"]
    assert isinstance(r, concord.CheckoutRollbackResult) and r.root == _root(world, "models/llama~1")
    assert files_equal(world["dir"] / "serving" / "current", world["v1"])


def test_tiering(world):
    names, printed = run_example("Tiering: concord.tier_add, tier_status, tier_sweep, tier_restore, tier_drill, tier_gc", world)
    assert "{'step-1000': ['hot', 'warm', 'cold']}" in printed and "[] True" in printed
    gc = names["gc"]
    assert set(gc) == {"hot", "warm", "cold"} and all(isinstance(g, concord.GcResult) and g.dry_run for g in gc.values())
    assert all(g.live_roots >= 1 for g in gc.values())  # the checkpoint's snapshot is live in every tier
    assert files_equal(world["dir"] / "restored" / "step-1000", world["v1"])


def test_federation(world):
    names, _ = run_example("Federation: concord.federate_round, federate_verify, federate_log and federate_aggregate", world)
    assert names["a"]["method"] == "exact" and (world["dir"] / "adapters" / "merged" / "adapter_model.safetensors").is_file()
    ledger = names["ledger"]
    assert ledger["tenant"] == "acme" and [r["round"] for r in ledger["rounds"]] == [1]
    assert ledger["head"] == ledger["rounds"][0]["hash"] and ledger["rounds"][0]["result"]["root"] == names["r"]["root"]
    assert names["r"]["round"] == 1 and names["r"]["ref"] == "acme/federated"
    assert isinstance(names["v"], concord.RememberedReport) and names["v"].report.ok and names["v"].error is None
    assert _root(world, "acme/federated", REPLICA) == names["r"]["root"]
    assert names["r"]["signatures"] == [world["key_id"]] and names["c"]["key_id"] == world["key_id"]
    assert names["v"].report.signed_by == {1: ("release",)}


def test_audits(world):
    names, printed = run_example("Audits: concord.audit_replicas, audit_cards and audit_data", world)
    assert isinstance(names["report"], concord.AuditReport) and names["report"].severity == "ok"
    assert printed.splitlines()[2] == "ok"  # the same table twice has not drifted


def test_lineage(world):
    names, printed = run_example(
        "Lineage: concord.register_data, register_model, model_lineage and open_lineage", world
    )
    assert isinstance(names["data"], concord.DataSnapshot) and names["data"].rows == 200
    assert names["data"].id in printed.splitlines()[0]
    assert "'llama'" in printed.splitlines()[1] and str(names["mv"]["version"]) in printed.splitlines()[1]


def test_init_store_and_store_info(world):
    names, printed = run_example("concord.init_store and concord.store_info", world)
    assert printed.splitlines()[0] == "auto"
    u = names["u"]
    assert isinstance(u, concord.StoreUsage) and u.compress == "auto" and (u.refs, u.manifests) == (1, 1)
    assert 0 < u.named.stored_bytes < u.named.raw_bytes  # byte planes and zstd keep fewer bytes than raw
    assert _root(world, "models/llama", ARCHIVE) == _root(world, "models/llama~1")  # the same root, whatever the encoding
    # asked again, the same configuration changes nothing; another is refused, naming the store
    assert concord.init_store(world["places"][ARCHIVE], compress="auto")["compress"] == "auto"
    with pytest.raises(concord.ConcordError, match="already configured"):
        concord.init_store(world["places"][ARCHIVE], compress="zstd")


def test_snapshot_part_and_snapshot_assemble(world):
    names, _ = run_example("concord.snapshot_part and concord.snapshot_assemble", world)
    r = names["r"]
    assert isinstance(names["b"], concord.NodePart) and isinstance(r, concord.SnapshotResult)
    # the root one snapshot of the whole folder has
    assert r.root == _root(world, "models/llama~1") == _root(world, "models/llama-spread") and r.ref_version == 1
    assert (world["dir"] / "node-0.part").is_file()
    # a node left out is refused before anything is written
    with pytest.raises(concord.ConcordError, match="node-0"):
        concord.snapshot_assemble(world["places"][PRIMARY], [names["b"]], nodes=["node-0", "node-1"], ref="models/other")
    assert "models/other" not in open_store(world["places"][PRIMARY]).list_refs()


def test_generate_signing_key(world):
    names, printed = run_example("concord.generate_signing_key", world)
    key = names["key"]
    assert isinstance(key, concord.SigningKey) and (world["dir"] / "keys" / "ops.pub.pem").is_file()
    assert printed.split() == [key.id, "True"] and key.id != world["key_id"]
    with pytest.raises(concord.ConcordError, match="ops.pem"):  # never overwritten
        concord.generate_signing_key("keys/ops.pem")


def test_tier_check(world):
    names, printed = run_example("concord.tier_check", world)
    assert isinstance(names["policy"], concord.TierPolicy) and printed.startswith("llama [('hot', ")
    (world["dir"] / "bad.yaml").write_text("namespace: llama\nhot: {keep: 0}\nwarm: {}\n")
    with pytest.raises(concord.PolicyError) as caught:
        concord.tier_check("bad.yaml")
    assert caught.value.problems


def test_audit_profile(world):
    names, printed = run_example("concord.audit_profile", world)
    p = names["p"]
    assert p["profile"]["rows"] == 200 and p["parts"] == 1
    assert (world["dir"] / "train.profile").stat().st_size == p["bytes"]
    assert p["stored"]["store"] == open_store(world["registry"]).uri  # beside the data snapshot, in the registry
    assert printed.splitlines()[1] == "ok ok"  # the same table, audited against the stored profile and the file


def test_contracts(world):
    names, printed = run_example(
        "Contracts: concord.contract_infer, contract_validate, contract_compatible and contract_list", world
    )
    assert printed.splitlines() == ["True", "True ['train@1', 'train@2']"]
    assert concord.contract_list(registry=world["registry"]) == ["train@1", "train@2"]
    (world["dir"] / "data" / "bad.csv").write_text("id,x,label\n1,not a number,c\n")
    r = concord.contract_validate("train@1", table="data/bad.csv")  # a violation is in the answer
    assert isinstance(r, concord.ValidationResult) and not r.success and r.failures


def test_export_and_import_oci(world, oci_registry):
    names, printed = run_example(
        "OCI registries: concord.export_oci and concord.import_oci", world, also={OCI_REGISTRY: oci_registry}
    )
    e, i = names["e"], names["i"]
    assert isinstance(e, concord.ExportResult) and isinstance(i, concord.ImportResult)
    assert e.root == i.root == _root(world, "models/llama") == _root(world, "models/llama-oci", REPLICA)
    assert printed.split()[2:] == ["True", "models/llama-oci"]


def test_promotion_and_lineage_queries(world):
    names, printed = run_example(
        "Promotion and queries: concord.promote_model, data_info, data_lineage and lineage_graph", world
    )
    data, mv = names["data"], names["mv"]
    assert printed.splitlines()[0] == f"200 [{str(mv['version'])!r}]"  # versions are MLflow's strings
    assert "champion" in concord.model_lineage("llama", mv["version"])["aliases"]  # the alias moved
    assert concord.data_info(data.id, registry=world["registry"]).id == data.id  # in the registry: S3 in the S3 world
    png = world["dir"] / "lineage" / "llama.png"
    assert printed.splitlines()[1] == str(png) and png.stat().st_size > 0
    assert data.id[:12] in (world["dir"] / "lineage" / "llama.mmd").read_text()
