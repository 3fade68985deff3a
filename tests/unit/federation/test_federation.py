"""Federation rounds on small synthetic PEFT LoRA adapters in local cluster stores: tenant
isolation, replication to every cluster, the ledger, lineage that never loses a round, and the
``concord federate`` commands."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from concord.cli import main
from concord.errors import AdapterNotFoundError, InvalidNameError, TenantError
from concord.federation.ledger import append_round, list_rounds, read_head, round_key, verify_ledger
from concord.federation.rounds import adapter_ref, run_round
from concord.lineage import Lineage
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

D = 16
MODULES = ("layers.0.attn.query", "layers.0.attn.value", "layers.1.attn.query", "layers.1.attn.value")


def write_adapter(path: Path, seed: int, *, r: int = 4, alpha: int = 8, base: str = "tiny-base", modules=MODULES) -> Path:
    """A PEFT LoRA adapter folder as ``save_pretrained`` writes it: ``adapter_config.json`` and
    ``adapter_model.safetensors`` with ``base_model.model.<module>.lora_{A,B}.weight``."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for m in modules:
        tensors[f"base_model.model.{m}.lora_A.weight"] = 0.1 * torch.randn(r, D, generator=g)
        tensors[f"base_model.model.{m}.lora_B.weight"] = 0.1 * torch.randn(D, r, generator=g)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base,
        "r": r,
        "lora_alpha": alpha,
        "target_modules": ["query", "value"],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "rank_pattern": {},
        "alpha_pattern": {},
        "task_type": None,
    }
    (path / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return path


def _pattern(patterns: dict, module: str, default):
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def deltas(folder: Path) -> dict:
    """``{module: scaling * B @ A}`` of a PEFT LoRA adapter folder: the update it adds to each weight."""
    from safetensors.torch import load_file

    config = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    out = {}
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len("base_model.model.") : -len(".lora_A.weight")]
        b = tensors[key.replace("lora_A", "lora_B")]
        r = _pattern(config.get("rank_pattern") or {}, module, config["r"])
        alpha = _pattern(config.get("alpha_pattern") or {}, module, config["lora_alpha"])
        assert a.shape[0] == b.shape[1] == r, (module, a.shape, b.shape, r)
        scale = alpha / (r**0.5 if config.get("use_rslora") else r)
        out[module] = scale * (b.double() @ a.double())
    return out


@pytest.fixture
def clusters(tmp_path) -> list[LocalDirStore]:
    return [LocalDirStore(tmp_path / "stores" / c) for c in ("us-east", "eu-central", "ap-south")]


@pytest.fixture
def tenant_adapters(tmp_path, clusters):
    """Tenant ``acme``: one adapter per cluster (ranks 4, 2, 8), snapshotted under ``acme/adapter-<i>``."""
    folders = []
    for i, (store, (r, alpha)) in enumerate(zip(clusters, [(4, 8), (2, 4), (8, 16)])):
        folder = write_adapter(tmp_path / "adapters" / f"acme-{i}", seed=i, r=r, alpha=alpha)
        snapshot(folder, store, ref=f"acme/adapter-{i}")
        folders.append(folder)
    return folders


def _state(store: LocalDirStore) -> dict[str, bytes]:
    """Every file of a store, for before/after comparisons."""
    root = Path(store.root)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- names and tenants


def test_adapter_names_resolve_inside_the_tenant():
    assert adapter_ref("acme", "x") == "acme/x"
    assert adapter_ref("acme", "acme/x") == "acme/x"
    with pytest.raises(TenantError, match="belongs to tenant 'globex'"):
        adapter_ref("acme", "globex/x")
    for bad in ("a/b/c", "../x", "acme/../x", "", "acme/_ledger", "_ledger", "x\n", "acme/"):
        with pytest.raises(InvalidNameError):
            adapter_ref("acme", bad)
    with pytest.raises(InvalidNameError):
        adapter_ref("../acme", "x")


def test_an_adapter_of_another_tenant_is_refused_before_anything_is_read_or_written(tmp_path, clusters, tenant_adapters):
    snapshot(write_adapter(tmp_path / "globex", seed=9), clusters[0], ref="globex/adapter-0")
    before = [_state(s) for s in clusters]
    with pytest.raises(TenantError):
        run_round("acme", clusters, ["adapter-0", "globex/adapter-0"])
    assert [_state(s) for s in clusters] == before
    assert list_rounds(clusters[0], "acme") == [] and read_head(clusters[0], "acme") is None


def test_a_round_of_one_tenant_leaves_another_tenants_refs_and_ledger_untouched(tmp_path, clusters, tenant_adapters):
    # tenant globex has adapters with the same names and a ledger of its own, in the same stores
    for i, store in enumerate(clusters):
        snapshot(write_adapter(tmp_path / "globex" / str(i), seed=100 + i), store, ref=f"globex/adapter-{i}")
    append_round(clusters[0], "globex", {"method": "exact", "inputs": []})
    globex_before = [
        {k: v for k, v in _state(s).items() if k.startswith(("refs/globex/", "ledger/globex/"))} for s in clusters
    ]

    r = run_round("acme", clusters, ["adapter-0", "adapter-1", "adapter-2"])
    for store, before in zip(clusters, globex_before):
        after = {k: v for k, v in _state(store).items() if k.startswith(("refs/globex/", "ledger/globex/"))}
        assert after == before
    # the round read acme's adapters, not globex's namesakes
    assert [i["root"] for i in r["inputs"]] == [s.read_ref(f"acme/adapter-{n}").root for n, s in enumerate(clusters)]
    assert verify_ledger(clusters[0], "globex").ok and len(list_rounds(clusters[0], "globex")) == 1
    assert r["round"] == 1  # acme's first round, whatever globex has done


# ----------------------------------------------------------------------------- a round


def test_a_round_aggregates_exactly_replicates_everywhere_and_is_recorded(clusters, tenant_adapters, tmp_path):
    weights = [0.5, 0.3, 0.2]
    r = run_round("acme", clusters, ["adapter-0", "acme/adapter-1", "adapter-2"], method="exact", weights=weights)

    assert (r["tenant"], r["round"], r["prev"], r["ref"], r["method"]) == ("acme", 1, None, "acme/federated", "exact")
    assert r["client_ranks"] == [4, 2, 8] and r["rank"] <= 14 and set(r["ranks"]) == {f"base_model.model.{m}" for m in MODULES}
    assert r["relative_error"] is not None and r["relative_error"] < 1e-5
    assert [c["adapter"] for c in r["clients"]] == ["acme/adapter-0", "acme/adapter-1", "acme/adapter-2"]
    assert [c["weight"] for c in r["clients"]] == pytest.approx(weights)
    assert all(c["accepted"] for c in r["clients"])
    assert [i["cluster"] for i in r["inputs"]] == [s.uri for s in clusters]  # each found where it lives

    # the result is on every cluster under the same ref and root, complete
    assert [p["store"] for p in r["replicas"]] == [s.uri for s in clusters]
    for store in clusters:
        assert store.read_ref("acme/federated").root == r["root"]
        manifest = load_manifest(store, r["root"])
        assert store.has_chunks(list(manifest.chunk_lengths())) == set(manifest.chunk_lengths())
    assert all(p["root"] == r["root"] for p in r["replicas"])
    assert all(p["bytes_sent"] > 0 for p in r["replicas"][1:])

    # the result, restored from the last cluster, is the weighted sum of the clients' updates
    from concord.snapshots.restore import restore

    out = tmp_path / "restored"
    restore(clusters[2], load_manifest(clusters[2], r["root"]), out)
    got = deltas(out)
    clients = [deltas(f) for f in tenant_adapters]
    assert set(got) == set(MODULES)
    for m in MODULES:
        want = sum(w * c[m] for w, c in zip(weights, clients))
        assert (got[m] - want).norm() / want.norm() < 1e-5, m

    # the ledger, in the first cluster, records the round
    (entry,) = list_rounds(clusters[0], "acme")
    assert entry["hash"] == r["hash"] and read_head(clusters[0], "acme") == r["hash"]
    assert entry["result"]["root"] == r["root"] and entry["method"] == "exact"
    assert [(i["adapter"], i["root"]) for i in entry["inputs"]] == [(i["adapter"], i["root"]) for i in r["inputs"]]
    assert entry["weights"] == pytest.approx(weights) and entry["client_ranks"] == [4, 2, 8]
    assert entry["options"] == {"weights": weights, "rank": None, "clip_norm": None, "robust": "none"}
    assert entry["metrics"]["relative_error"] == r["relative_error"]
    assert len(entry["metrics"]["clients"]) == 3
    assert verify_ledger(clusters[0], "acme").ok
    for store in clusters[1:]:
        assert list_rounds(store, "acme") == []  # the ledger lives in one store


def test_rounds_chain_and_an_unchanged_round_sends_nothing_and_is_recorded_once(clusters, tenant_adapters):
    first = run_round("acme", clusters, ["adapter-0", "adapter-1", "adapter-2"])
    assert first["recorded"] == "recorded" and first["ledger_note"].startswith("recorded as round 1 of acme")
    again = run_round("acme", clusters, ["adapter-0", "adapter-1", "adapter-2"])  # e.g. a retry
    assert (again["round"], again["hash"], again["root"], again["recorded"]) == (1, first["hash"], first["root"], "already")
    assert "already recorded as round 1" in again["ledger_note"]
    assert all(p["bytes_sent"] == 0 for p in again["replicas"])
    other = run_round("acme", clusters, ["adapter-0", "adapter-2"], weights=[3, 1])
    assert other["round"] == 2 and other["prev"] == first["hash"] and other["root"] != first["root"]
    for store in clusters:
        ref = store.read_ref("acme/federated")
        assert ref.root == other["root"] and [e.root for e in ref.history] == [first["root"], other["root"]]
    report = verify_ledger(clusters[0], "acme")
    assert report.ok and report.rounds == 2 and report.head == other["hash"]

    # going back to the first round's inputs moves the ref back: a new round, not the first again
    back = run_round("acme", clusters, ["adapter-0", "adapter-1", "adapter-2"])
    assert (back["round"], back["root"], back["recorded"]) == (3, first["root"], "recorded")
    assert [e["result"]["version"] for e in list_rounds(clusters[0], "acme")] == [1, 2, 3]
    assert verify_ledger(clusters[0], "acme").ok


def test_a_client_far_above_the_median_norm_is_rejected_and_recorded(tmp_path, clusters, tenant_adapters):
    rogue = tmp_path / "adapters" / "rogue"
    write_adapter(rogue, seed=7, r=4, alpha=8)
    from safetensors.torch import load_file, save_file

    tensors = {k: (100 * v if ".lora_B." in k else v) for k, v in load_file(str(rogue / "adapter_model.safetensors")).items()}
    save_file(tensors, str(rogue / "adapter_model.safetensors"))
    snapshot(rogue, clusters[1], ref="acme/rogue")

    r = run_round("acme", clusters, ["adapter-0", "rogue", "adapter-1"])
    verdicts = [(c["adapter"], c["accepted"], c["weight"]) for c in r["clients"]]
    assert verdicts == [("acme/adapter-0", True, 0.5), ("acme/rogue", False, 0.0), ("acme/adapter-1", True, 0.5)]
    assert "median" in r["clients"][1]["reason"]
    (entry,) = list_rounds(clusters[0], "acme")
    assert [c["accepted"] for c in entry["metrics"]["clients"]] == [True, False, True] and entry["weights"] == [0.5, 0.0, 0.5]

    from concord.snapshots.restore import restore

    restore(clusters[0], load_manifest(clusters[0], r["root"]), tmp_path / "out")
    got, a, b = deltas(tmp_path / "out"), deltas(tenant_adapters[0]), deltas(tenant_adapters[1])
    for m in MODULES:
        want = 0.5 * a[m] + 0.5 * b[m]
        assert (got[m] - want).norm() / want.norm() < 1e-5


def test_a_rank_cap_is_applied_and_its_error_recorded(clusters, tenant_adapters):
    r = run_round("acme", clusters, ["adapter-0", "adapter-1", "adapter-2"], rank=3)
    assert r["rank"] == 3 and set(r["ranks"].values()) == {3}
    assert 0 < r["relative_error"] < 1
    (entry,) = list_rounds(clusters[0], "acme")
    assert entry["options"]["rank"] == 3 and entry["rank"] == 3
    assert entry["metrics"]["relative_error"] == r["relative_error"]


def test_the_ledger_can_live_in_its_own_store(tmp_path, clusters, tenant_adapters):
    ledger = LocalDirStore(tmp_path / "ledger")
    r = run_round("acme", clusters, ["adapter-0", "adapter-1"], ledger_store=ledger, out_name="fed-2")
    assert r["ledger"] == ledger.uri and r["ref"] == "acme/fed-2"
    assert [e["hash"] for e in list_rounds(ledger, "acme")] == [r["hash"]]
    assert all(list_rounds(s, "acme") == [] for s in clusters)


def test_a_missing_adapter_fails_the_round_and_records_nothing(clusters, tenant_adapters):
    with pytest.raises(AdapterNotFoundError, match="acme/nowhere") as exc:
        run_round("acme", clusters, ["adapter-0", "nowhere"])
    assert exc.value.stores == [s.uri for s in clusters]
    assert list_rounds(clusters[0], "acme") == []
    assert all(s.read_ref("acme/federated") is None for s in clusters)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"method": "median"}, "method"),
        ({"robust": "magic"}, "robust"),
        ({"out_name": "_ledger"}, "output name"),
        ({"out_name": "../x"}, "invalid"),
    ],
)
def test_bad_options_are_refused_up_front(clusters, tenant_adapters, kwargs, error):
    before = [_state(s) for s in clusters]
    with pytest.raises(ValueError, match=error):
        run_round("acme", clusters, ["adapter-0", "adapter-1"], **kwargs)
    assert [_state(s) for s in clusters] == before


def test_naming_an_adapter_or_a_cluster_twice_is_refused(clusters, tenant_adapters):
    with pytest.raises(ValueError, match="named twice"):
        run_round("acme", clusters, ["adapter-0", "acme/adapter-0"])
    with pytest.raises(ValueError, match="named twice"):
        run_round("acme", [clusters[0], LocalDirStore(clusters[0].root)], ["adapter-0"])


def test_a_lineage_failure_never_loses_the_round(clusters, tenant_adapters):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    r = run_round("acme", clusters, ["adapter-0", "adapter-1"], lineage=Lineage(f"http://127.0.0.1:{port}", health_timeout=2))
    assert r["lineage"]["name"] == "acme-federated" and "unreachable" in r["lineage"]["error"]
    assert "version" not in r["lineage"]
    assert [e["hash"] for e in list_rounds(clusters[0], "acme")] == [r["hash"]]
    assert all(s.read_ref("acme/federated").root == r["root"] for s in clusters)


def test_the_result_is_registered_in_lineage(tmp_path, clusters, tenant_adapters):
    lineage = Lineage(f"sqlite:///{tmp_path / 'mlflow.db'}")
    r = run_round("acme", clusters, ["adapter-0", "adapter-1"], lineage=lineage)
    assert r["lineage"] == {"name": "acme-federated", "version": "1"}
    mv = lineage.client.get_model_version("acme-federated", "1")
    assert f"federation round {r['round']}" in mv.description and r["hash"] in mv.description
    info = lineage.model_lineage("acme-federated", "1")
    assert info["root"] == r["root"]
    assert {h["store"] for h in info["replicas"]} == {s.uri for s in clusters}


# ----------------------------------------------------------------------------- the CLI


def _run(capsys, *argv) -> tuple[int, dict | str | None, str]:
    """(exit code, the JSON object printed with --json or else the text printed, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    if "--json" in argv:
        return code, (json.loads(out) if out.strip() else None), err
    return code, out, err


def test_cli_aggregate_json_contract(tmp_path, capsys):
    a = write_adapter(tmp_path / "a", seed=1, r=4, alpha=8)
    b = write_adapter(tmp_path / "b", seed=2, r=2, alpha=2)
    out = tmp_path / "out"
    code, payload, err = _run(capsys, "federate", "aggregate", str(a), str(b), "--method", "exact", "--weights", "0.75,0.25", "--out", str(out), "--json")
    assert code == 0, err
    assert {"method", "rank", "clients", "relative_error", "out"} <= set(payload)
    assert payload["method"] == "exact" and payload["client_ranks"] == [4, 2]
    assert isinstance(payload["rank"], int) and payload["rank"] <= 6
    assert Path(payload["out"]) == out and (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert [c["weight"] for c in payload["clients"]] == pytest.approx([0.75, 0.25])
    assert all({"index", "weight", "norm", "distance", "accepted", "clipped", "reason"} <= set(c) for c in payload["clients"])
    got, da, db = deltas(out), deltas(a), deltas(b)
    for m in MODULES:
        want = 0.75 * da[m] + 0.25 * db[m]
        assert (got[m] - want).norm() / want.norm() < 1e-5


def test_cli_aggregate_refuses_bad_input(tmp_path, capsys):
    a = write_adapter(tmp_path / "a", seed=1)
    with pytest.raises(SystemExit) as exc:
        main(["federate", "aggregate", str(a), "--weights", "0.5,x", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["federate", "aggregate", str(a), "--method", "median", "--out", str(tmp_path / "o")])
    capsys.readouterr()
    code, _, err = _run(capsys, "federate", "aggregate", str(a), str(tmp_path / "nothing-here"), "--out", str(tmp_path / "o"))
    assert code == 1 and err.startswith("concord: error:")


def test_cli_run_verify_and_log(clusters, tenant_adapters, capsys):
    stores = [a for s in clusters for a in ("--cluster", s.uri)]
    adapters = ["--adapter", "adapter-0", "adapter-1", "--adapter", "acme/adapter-2"]
    code, r, err = _run(capsys, "federate", "run", "--tenant", "acme", *stores, *adapters, "--weights", "1,1,2", "--json")
    assert code == 0, err
    assert {"tenant", "round", "hash", "root", "method", "rank", "clients", "relative_error", "replicas"} <= set(r)
    assert r["round"] == 1 and [c["weight"] for c in r["clients"]] == pytest.approx([0.25, 0.25, 0.5])
    assert all(s.read_ref("acme/federated").root == r["root"] for s in clusters)

    code, report, err = _run(capsys, "federate", "verify", "acme", "--store", clusters[0].uri, "--json")
    assert code == 0 and report["ok"] and report["rounds"] == 1 and report["head"] == r["hash"]
    code, log, _ = _run(capsys, "federate", "log", "acme", "--store", clusters[0].uri, "--json")
    assert code == 0 and [x["hash"] for x in log["rounds"]] == [r["hash"]] and log["head"] == r["hash"]

    code, _, err = _run(capsys, "federate", "run", "--tenant", "acme", *stores, "--adapter", "globex/adapter-0")
    assert code == 1 and "belongs to tenant 'globex'" in err

    # tamper: change round 1's weights
    path = Path(clusters[0].root) / round_key("acme", 1)
    doc = json.loads(path.read_text())
    doc["weights"] = [0.9, 0.05, 0.05]
    path.write_text(json.dumps(doc))
    code, report, err = _run(capsys, "federate", "verify", "acme", "--store", clusters[0].uri, "--json")
    assert code == 1 and not report["ok"] and any("round 1: edited" in p for p in report["problems"])
    assert "does not verify" in err
    code, text, _ = _run(capsys, "federate", "verify", "acme", "--store", clusters[0].uri)
    assert code == 1 and "TAMPERED" in text and "round 1: edited" in text


def test_cli_verify_refuses_a_bad_tenant(tmp_path, capsys):
    code, _, err = _run(capsys, "federate", "verify", "../x", "--store", str(tmp_path / "s"))
    assert code == 1 and "invalid tenant name" in err
