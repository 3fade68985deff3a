from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toy_checkpoints import fine_tune

from concord.cli import main
from concord.errors import ManifestError, UnsafePathError
from concord.snapshots.manifest import Manifest


def run(capsys, *argv):
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_cli_contract_on_local_stores(capsys, ckpt, tmp_path):
    c1, c2, c3 = (str(tmp_path / f"c{i}") for i in range(3))
    code, snap, _ = run(capsys, "snapshot", str(ckpt), "--store", c1, "--ref", "toy", "--chunk-size", "64K")
    assert code == 0
    assert {"root", "files", "tensors", "chunks", "bytes", "new_chunks", "new_bytes"} <= snap.keys()
    code, sync, _ = run(capsys, "sync", c1, c2, c3, "--ref", "toy")
    assert code == 0 and [t["root"] for t in sync["targets"]] == [snap["root"]] * 2
    for t in sync["targets"]:
        assert {"store", "root", "chunks_sent", "bytes_sent", "chunks_present"} <= t.keys()
    ft = fine_tune(ckpt, tmp_path / "ft", ["layers.2.attn.q.weight"])
    _, snap2, _ = run(capsys, "snapshot", str(ft), "--store", c1, "--ref", "toy", "--chunk-size", "64K")
    code, d, _ = run(capsys, "diff", c2, "toy", "--against", c1, "toy")
    assert code == 0 and d["same"] is False
    assert d["changes"] == [{"file": "model.safetensors", "tensor": "layers.2.attn.q.weight", "kind": "changed"}]
    assert d["chunks_differing"] == snap2["new_chunks"] and d["bytes_differing"] == snap2["new_bytes"]
    code, d, _ = run(capsys, "diff", c1, "toy~1", "toy~1")
    assert d["same"] is True and d["changes"] == []
    _, sync2, _ = run(capsys, "sync", c1, c2, "--ref", "toy")
    assert sync2["targets"][0]["bytes_sent"] == snap2["new_bytes"]
    code, rest, _ = run(capsys, "restore", c2, "--ref", "toy", str(tmp_path / "out"))
    assert code == 0 and {"root", "files", "bytes"} <= rest.keys() and rest["root"] == snap2["root"]
    assert rest["unchanged"] is False
    code, again, _ = run(capsys, "restore", c2, "--ref", "toy", str(tmp_path / "out"))  # the same, again
    assert code == 0 and again["unchanged"] is True and again["root"] == snap2["root"]
    assert main(["restore", c2, "--ref", "toy", str(tmp_path / "out")]) == 0
    assert "unchanged: " in capsys.readouterr().out
    code, ver, _ = run(capsys, "verify", c2, "--ref", "toy")
    assert code == 0 and {"chunks_checked", "missing", "corrupt", "repaired"} <= ver.keys()
    code, rb, _ = run(capsys, "rollback", c2, "--ref", "toy")
    assert code == 0 and (rb["root"], rb["previous"]) == (snap["root"], snap2["root"])
    code, log, _ = run(capsys, "log", c2, "toy")
    assert [h["root"] for h in log["history"]] == [snap["root"], snap2["root"], snap["root"]]
    code, refs, _ = run(capsys, "refs", c2)
    assert refs["refs"][0]["ref"] == "default/toy"


def test_cli_verify_reports_corruption_and_repairs(capsys, ckpt, tmp_path):
    c1, c2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    run(capsys, "snapshot", str(ckpt), "--store", c1, "--ref", "toy")
    run(capsys, "sync", c1, c2, "--ref", "toy")
    chunk = next(p for p in (tmp_path / "c2" / "chunks").rglob("*") if p.is_file())
    chunk.write_bytes(b"flipped")
    code, ver, err = run(capsys, "verify", c2)
    assert code == 15 and ver["corrupt"] == [chunk.name] and "--repair-from" in err
    code, ver, _ = run(capsys, "verify", c2, "--repair-from", c1)
    assert code == 0 and ver["repaired"] == [chunk.name]


@pytest.mark.parametrize(
    "argv, needle, exit_code",
    [
        (["snapshot", "/no/such/dir", "--store", "{tmp}/s"], "no such file", 10),
        (["diff", "{tmp}/s", "nope", "nope"], "no ref", 10),
        (["restore", "{tmp}/s", "--root", "ab" * 32, "{tmp}/o"], "no snapshot", 10),
        (["sync", "{tmp}/s", "{tmp}/t", "--ref", "../../etc"], "invalid ref name", 1),
        (["rollback", "{tmp}/s", "--ref", "nope"], "no ref", 10),
        (["snapshot", "{tmp}", "--store", "s3://"], "no bucket", 1),
        (["snapshot", "{tmp}", "--store", "ftp:x"], "unknown scheme", 1),
        (["diff", "{tmp}/typo", "nope", "nope"], "no Concord store", 10),
        (["restore", "{tmp}/typo", "--root", "ab" * 32, "{tmp}/o"], "no Concord store", 10),
    ],
)
def test_cli_failures_are_one_clear_line(capsys, tmp_path, argv, needle, exit_code):
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "s" / "refs").mkdir(parents=True)  # an (empty) store; {tmp}/typo holds none
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    out, err = capsys.readouterr()
    assert code == exit_code and out == ""
    assert err.startswith("concord: error: ") and err.count("\n") == 1 and needle in err


def test_core_and_cli_import_neither_prefect_nor_torch():
    code = (
        "import sys, concord.cli, concord.snapshots.snapshot, concord.snapshots.sync, concord.snapshots.diff, concord.snapshots.restore, "
        "concord.snapshots.verify, concord.snapshots.refs, concord.stores;"
        "concord.cli.build_parser();"
        "bad = [m for m in ('prefect', 'torch', 'boto3', 'mlflow', 'pandas') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_help_lists_every_command():
    res = subprocess.run([sys.executable, "-m", "concord.cli", "--help"], capture_output=True, text=True, check=True)
    for cmd in ("snapshot", "diff", "sync", "restore", "verify", "rollback"):
        assert cmd in res.stdout


# ------------------------------------------------------------------ malformed manifests (property-based)

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_malformed_manifests_raise_only_our_errors(ckpt, data):
    import tempfile

    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    global _VALID
    if "_VALID" not in globals():
        with tempfile.TemporaryDirectory() as d:
            _VALID = json.loads(snapshot(ckpt, LocalDirStore(d), chunk_size=65536).manifest.to_json())
    doc = json.loads(json.dumps(_VALID))
    # replace one node somewhere in the document with arbitrary JSON
    path = []
    node = doc
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append((node, key))
        node = node[key]
    if path:
        parent, key = path[-1]
        parent[key] = data.draw(_json)
    raw = json.dumps(doc).encode() if data.draw(st.booleans()) else data.draw(st.binary(max_size=64))
    try:
        Manifest.from_json(raw)
    except (ManifestError, UnsafePathError):
        pass
