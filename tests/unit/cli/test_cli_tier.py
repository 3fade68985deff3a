"""``concord tier ...`` on local-only policies: three folders standing for hot, warm (a NAS) and
cold (tape, off-site), small checkpoints, every command's JSON contract and exit code."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file
from toy_checkpoints import files_equal

from concord.cli import main
from concord.stores import LocalDirStore

TIERS = ("hot", "warm", "cold")
STATUS_TIER_KEYS = {"present", "wanted", "verified", "verified_how", "bytes", "storage_class"}
STATUS_ROW_KEYS = {"name", "root", "step", "created", "bytes", "pinned", "copies", "tiers"}
SWEEP_KEYS = {"namespace", "copied", "demoted", "repaired", "errors", "violations", "gc", "dry_run", "ok"}


def run(capsys, *argv):
    code = main([*map(str, argv), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def write_policy(path: Path, base: Path, **extra) -> Path:
    doc = {
        "namespace": "llama-lora",
        "hot": {"store": str(base / "hot"), "keep": 2},
        "warm": {"store": str(base / "warm"), "keep": 3, "media": "nas"},
        "cold": {"store": str(base / "cold"), "media": "tape", "offsite": True},
        "ready": {"settle": 0},
        "gc_grace": 0,
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    path.write_text(yaml.safe_dump(doc))
    return path


def make_checkpoint(folder: Path, step: int, when: float) -> Path:
    """A small LoRA-style checkpoint: a frozen base tensor shared by every step, an adapter that
    changes, optimizer state and trainer state; every file dated ``when``."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(step)
    tensors = {
        "base.weight": np.ones((64, 64), dtype=np.float32),
        "lora_A.weight": rng.standard_normal((8, 64)).astype(np.float32),
        "lora_B.weight": rng.standard_normal((64, 8)).astype(np.float32),
    }
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "np"})
    (folder / "optimizer.pt").write_bytes(rng.bytes(3000))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for f in folder.iterdir():
        os.utime(f, (when, when))
    return folder


@pytest.fixture
def policy(tmp_path) -> Path:
    return write_policy(tmp_path / "policy.yaml", tmp_path / "tiers")


@pytest.fixture
def ckpts(tmp_path) -> list[Path]:
    """Four checkpoints, a minute apart, oldest first."""
    t0 = time.time() - 3600
    return [make_checkpoint(tmp_path / "ckpts" / f"step-{s}", s, t0 + 60 * i) for i, s in enumerate((100, 200, 300, 400))]


@pytest.fixture
def tiered(capsys, policy, ckpts) -> list[dict]:
    out = []
    for c in ckpts:
        code, r, err = run(capsys, "tier", "add", "--policy", policy, c)
        assert code == 0, err
        out.append(r)
    return out


def presence(status: dict) -> dict[str, set[str]]:
    return {t: {c["name"] for c in status["checkpoints"] if c["tiers"][t]["present"]} for t in TIERS}


def test_add_reports_the_snapshot_its_new_bytes_and_the_sweep(tiered, ckpts):
    first, second = tiered[0], tiered[1]
    assert {"name", "root", "step", "created", "bytes", "new_bytes", "sweep"} <= first.keys()
    assert (first["name"], first["step"]) == ("step-100", 100)
    assert set(first["new_bytes"]) == set(TIERS) and first["new_bytes"]["hot"] == first["bytes"]
    # the frozen base is already in every tier: the second step costs less than a whole copy
    assert 0 < second["new_bytes"]["warm"] < second["bytes"]
    assert SWEEP_KEYS <= first["sweep"].keys() and first["sweep"]["ok"]
    assert [d["name"] for d in tiered[2]["sweep"]["demoted"]] == ["step-100"]


def test_status_json_is_tier_status_and_reflects_the_keep_counts(capsys, policy, tiered, tmp_path):
    code, status, _ = run(capsys, "tier", "status", "--policy", policy)
    assert code == 0
    assert set(status) == {"namespace", "stores", "encodings", "checkpoints", "violations"}
    assert status["encodings"] == {t: "plain" for t in TIERS}
    assert status["namespace"] == "llama-lora" and status["violations"] == []
    assert status["stores"] == {t: str(tmp_path / "tiers" / t) for t in TIERS}
    assert [c["name"] for c in status["checkpoints"]] == ["step-400", "step-300", "step-200", "step-100"]
    for c in status["checkpoints"]:
        assert set(c) == STATUS_ROW_KEYS and set(c["tiers"]) == set(TIERS)
        assert all(set(c["tiers"][t]) == STATUS_TIER_KEYS for t in TIERS)
        assert c["copies"] == sum(c["tiers"][t]["present"] for t in TIERS)
        for t in TIERS:
            tier = c["tiers"][t]
            assert tier["present"] == tier["wanted"]
            assert (tier["verified"] is not None) == tier["present"]
            assert tier["bytes"] == (c["bytes"] if tier["present"] else 0)
    assert presence(status) == {
        "hot": {"step-400", "step-300"},
        "warm": {"step-400", "step-300", "step-200"},
        "cold": {"step-400", "step-300", "step-200", "step-100"},
    }
    roots = {c["name"]: c["root"] for c in status["checkpoints"]}
    assert roots == {r["name"]: r["root"] for r in tiered}
    # the tiers' own stores agree: a ref per copy
    for t, names in presence(status).items():
        refs = set(LocalDirStore(tmp_path / "tiers" / t).list_refs())
        assert {r for r in refs if r.startswith("llama-lora/")} == {f"llama-lora/{n}" for n in names}


def test_sweep_is_idempotent(capsys, policy, tiered):
    _, before, _ = run(capsys, "tier", "status", "--policy", policy)
    for _ in range(2):
        code, r, _ = run(capsys, "tier", "sweep", "--policy", policy)
        assert code == 0 and SWEEP_KEYS <= r.keys()
        assert (r["copied"], r["demoted"], r["repaired"], r["errors"], r["violations"]) == ([], [], [], [], [])
        assert r["ok"] is True and set(r["gc"]) == set(TIERS)
    _, after, _ = run(capsys, "tier", "status", "--policy", policy)
    assert presence(after) == presence(before)


def test_a_sweep_copies_back_a_lost_copy_and_a_dry_run_changes_nothing(capsys, policy, tiered, tmp_path):
    cold = LocalDirStore(tmp_path / "tiers" / "cold")
    newest = tiered[-1]
    cold.delete_ref("llama-lora/step-400", newest["root"])
    code, r, err = run(capsys, "tier", "sweep", "--policy", policy, "--dry-run")
    assert code == 1 and r["dry_run"] is True
    assert r["copied"] == [{"name": "step-400", "tier": "cold", "from": "hot", "bytes_sent": None}]
    assert any("step-400" in v and "cold" in v for v in r["violations"])
    assert err.startswith("concord: error: ") and err.count("\n") == 1 and "violation" in err
    assert cold.read_ref("llama-lora/step-400") is None  # a dry run changes nothing

    code, r, _ = run(capsys, "tier", "sweep", "--policy", policy)
    assert code == 0 and [(c["name"], c["tier"]) for c in r["copied"]] == [("step-400", "cold")]
    assert cold.read_ref("llama-lora/step-400").root == newest["root"]


def test_restore_reports_tier_seconds_bytes_and_gives_identical_files(capsys, policy, tiered, ckpts, tmp_path):
    code, r, _ = run(capsys, "tier", "restore", "--policy", policy, "step-400", tmp_path / "r400")
    assert code == 0
    assert {"name", "root", "tier", "store", "seconds", "wait_seconds", "restore_requests", "bytes", "files", "path", "bytes_per_second"} <= r.keys()
    assert (r["tier"], r["bytes"], r["root"]) == ("hot", tiered[-1]["bytes"], tiered[-1]["root"])
    assert r["seconds"] >= 0 and r["files"] == 3
    assert files_equal(ckpts[-1], tmp_path / "r400") and r["unchanged"] is False
    # run again into the folder it made: unchanged, said so in one line
    code, r, _ = run(capsys, "tier", "restore", "--policy", policy, "step-400", tmp_path / "r400")
    assert code == 0 and r["unchanged"] is True and r["root"] == tiered[-1]["root"]
    assert main(["tier", "restore", "--policy", str(policy), "step-400", str(tmp_path / "r400")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"unchanged: {tmp_path / 'r400'} already holds step-400") and out.count("\n") == 1
    # another checkpoint into it: refused in one line, the folder as it was
    code, _, err = run(capsys, "tier", "restore", "--policy", policy, "step-300", tmp_path / "r400")
    assert code != 0 and str(tmp_path / "r400") in err and err.count("\n") == 1
    assert files_equal(ckpts[-1], tmp_path / "r400")

    # only cold holds the oldest; the nearest copy of the second newest is hot, but warm can be asked for
    code, r, _ = run(capsys, "tier", "restore", "--policy", policy, "step-100", tmp_path / "r100")
    assert code == 0 and r["tier"] == "cold" and files_equal(ckpts[0], tmp_path / "r100")
    code, r, _ = run(capsys, "tier", "restore", "--policy", policy, "step-300", tmp_path / "r300", "--tier", "warm", "--timeout", "60")
    assert code == 0 and r["tier"] == "warm" and files_equal(ckpts[2], tmp_path / "r300")

    code, r, err = run(capsys, "tier", "restore", "--policy", policy, "step-100", tmp_path / "r100b", "--tier", "hot")
    assert code == 10 and r is None and err.count("\n") == 1 and "cold" in err
    code, _, err = run(capsys, "tier", "restore", "--policy", policy, "step-999", tmp_path / "r999")
    assert code == 10 and "step-999" in err and err.count("\n") == 1


def test_drill_passes_and_fails_on_an_impossible_objective(capsys, policy, tiered, tmp_path):
    code, r, _ = run(capsys, "tier", "drill", "--policy", policy, "--sample", 2)
    assert code == 0 and r["ok"] is True and r["findings"] == []
    assert {"namespace", "started", "ok", "findings", "tiers"} <= r.keys() and set(r["tiers"]) == set(TIERS)
    for t in TIERS:
        d = r["tiers"][t]
        assert {"store", "sampled", "restores", "rto_seconds", "rto_objective", "rto_ok", "rpo_seconds", "rpo_objective", "rpo_ok", "ok"} <= d.keys()
        assert len(d["sampled"]) == 2 and d["rto_seconds"] > 0 and d["ok"] is True

    strict = write_policy(tmp_path / "strict.yaml", tmp_path / "tiers", hot={"rto": 0.000001})
    code, r, err = run(capsys, "tier", "drill", "--policy", strict)
    assert code == 1 and r["ok"] is False  # the report is printed all the same
    assert r["tiers"]["hot"]["rto_ok"] is False and r["tiers"]["warm"]["ok"] is True
    assert any("RTO" in f for f in r["findings"])
    assert err.startswith("concord: error: ") and err.count("\n") == 1 and "hot" in err


def test_gc_reports_each_tier(capsys, policy, tiered):
    code, r, _ = run(capsys, "tier", "gc", "--policy", policy, "--dry-run")
    assert code == 0 and r["dry_run"] is True and set(r["tiers"]) == set(TIERS) and r["grace_seconds"] == 0
    assert all({"deleted_chunks", "deleted_bytes", "live_chunks"} <= g.keys() for g in r["tiers"].values())
    code, r, _ = run(capsys, "tier", "gc", "--policy", policy, "--tier", "hot")
    assert code == 0 and set(r["tiers"]) == {"hot"} and r["dry_run"] is False


def test_check_prints_the_policy_normalised(capsys, policy, tmp_path):
    code, r, _ = run(capsys, "tier", "check", "--policy", policy)
    assert code == 0 and r["ok"] is True and r["source"] == str(policy)
    assert r["policy"]["hot"] == {"store": str(tmp_path / "tiers" / "hot"), "keep": 2}
    assert r["policy"]["gc_grace"] == "0s" and r["policy"]["restore"]["tier"] == "Standard"
    assert main(["tier", "check", "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out) == r["policy"]  # the human form is the normalised YAML


def test_an_invalid_policy_exits_1_listing_every_problem(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "hot": {"store": str(tmp_path / "h"), "keep": 3},
                "warm": {"store": str(tmp_path / "w"), "keep": 1},
                "cold": {"store": str(tmp_path / "c"), "keep": 9},
                "bogus": 1,
            }
        )
    )
    code, r, err = run(capsys, "tier", "check", "--policy", bad)
    assert code == 1 and r["ok"] is False and len(r["problems"]) >= 4
    assert err.startswith("concord: error: ") and err.count("\n") == 1
    for needle in ("unknown key bogus", "remove cold.keep", "warm.keep (1) is less than hot.keep (3)", "same kind of media", "off-site"):
        assert needle in err
        assert any(needle in p for p in r["problems"])
    for argv in (["status"], ["sweep"], ["add", str(tmp_path)]):
        code, out, err = run(capsys, "tier", *argv, "--policy", bad)
        assert code == 1 and out is None and "off-site" in err and err.count("\n") == 1
    assert not (tmp_path / "h").exists()

    code, _, err = run(capsys, "tier", "status", "--policy", tmp_path / "missing.yaml")
    assert code == 1 and "no such policy file" in err


def test_a_checkpoint_still_being_written_is_refused_and_nothing_reaches_hot(capsys, tmp_path):
    policy = write_policy(tmp_path / "marker.yaml", tmp_path / "tiers", ready={"marker": "COMPLETE"})
    folder = make_checkpoint(tmp_path / "ckpts" / "step-500", 500, time.time())
    code, r, err = run(capsys, "tier", "add", "--policy", policy, folder)
    assert code == 1 and r is None
    assert err.startswith("concord: error: ") and err.count("\n") == 1 and "COMPLETE" in err
    hot = tmp_path / "tiers" / "hot"
    assert not hot.exists() or not any(p.is_file() for p in hot.rglob("*"))

    (folder / "COMPLETE").write_text("")
    code, r, _ = run(capsys, "tier", "add", "--policy", policy, folder, "--name", "final", "--step", 7)
    assert code == 0 and (r["name"], r["step"]) == ("final", 7)
    assert LocalDirStore(hot).read_ref("llama-lora/final").root == r["root"]


def test_human_output_is_a_table_and_summary_lines(capsys, policy, tiered):
    assert main(["tier", "status", "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "namespace llama-lora" and [line.split()[0] for line in lines[1:4]] == list(TIERS)
    header = lines[4].split()
    assert header[:3] == ["CHECKPOINT", "STEP", "SIZE"] and header[-3:] == ["HOT", "WARM", "COLD"]
    row = {line.split()[0]: line for line in lines[5:]}
    assert row["step-400"].count("✓") == 3
    assert row["step-100"].count("✓") == 1 and row["step-100"].count("–") == 2
    assert main(["tier", "sweep", "--policy", str(policy)]) == 0
    assert capsys.readouterr().out.startswith("sweep of llama-lora: 0 copies made, 0 demoted")
    assert main(["tier", "drill", "--policy", str(policy)]) == 0
    assert "restore drill of llama-lora" in capsys.readouterr().out


# ----------------------------------------------------------------------------- status: width, unreachable S3


def test_status_fits_100_columns_and_wide_shows_every_column(capsys, tmp_path, ckpts):
    long = "minilm-lora-rank-16-alpha-32-lr-2e-4-cosine-warmup-step-"
    policy = write_policy(tmp_path / "policy.yaml", tmp_path / ("tiers-" + "x" * 90), pin=[f"{long}100"])
    roots = {}
    for c, step in zip(ckpts[:2], (100, 200)):
        code, r, err = run(capsys, "tier", "add", "--policy", policy, c, "--name", f"{long}{step}")
        assert code == 0, err
        roots[step] = r["root"]
    # a copy-rule violation, long enough to wrap: the newest checkpoint's warm copy is gone
    warm = LocalDirStore(tmp_path / ("tiers-" + "x" * 90) / "warm")
    assert warm.delete_ref(f"llama-lora/{long}200", roots[200])

    assert main(["tier", "status", "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, out
    assert "CREATED" not in out and "…" in out  # long names and folders cut in the middle
    rows = [line for line in lines if line.startswith(long[:10])]
    assert len(rows) == 2 and any(r.split("…")[1].split()[0].endswith("200") for r in rows)
    first = next(i for i, line in enumerate(lines) if line.startswith("✗ "))  # the violation, wrapped whole
    assert " ".join(line[2:] for line in lines[first:]).endswith(f"{long}200: among the newest, needs 3-2-1 but has no warm copy")

    assert main(["tier", "status", "--policy", str(policy), "--wide"]) == 0
    wide = capsys.readouterr().out
    assert max(len(line) for line in wide.splitlines()) > 100
    assert "CREATED" in wide and f"{long}100 (pinned)" in wide and "(on-write)" in wide


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_s3(monkeypatch) -> str:
    """An S3 endpoint on 127.0.0.1 where nothing listens, as the demo's is once it ended."""
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return endpoint


def test_status_on_the_demos_policy_after_the_demo_says_whose_s3_it_was(capsys, tmp_path, dead_s3):
    from demo.tiering import write_policy as write_demo_policy

    policy = write_demo_policy(tmp_path)
    code, out, err = run(capsys, "tier", "status", "--policy", policy)
    assert code == 14 and out is None and err.startswith("concord: error: ") and err.count("\n") == 1
    for needle in (f"tier policy {policy}", "warm store s3://concord-warm/ckpt", f"at {dead_s3} did not answer", "make demo", "stopped"):
        assert needle in err, err


def test_status_on_an_s3_policy_whose_endpoint_is_down_names_file_tier_and_endpoint(capsys, tmp_path, dead_s3):
    policy = write_policy(tmp_path / "mine.yaml", tmp_path / "tiers", warm={"store": "s3://my-warm/ckpt"})
    code, out, err = run(capsys, "tier", "status", "--policy", policy)
    assert code == 14 and out is None and err.count("\n") == 1
    assert f"tier policy {policy}: the warm store s3://my-warm/ckpt at {dead_s3} did not answer" in err
    assert "AWS_ENDPOINT_URL" in err and "make demo" not in err
