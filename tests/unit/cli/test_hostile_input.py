"""Hostile input, each answered in one clear line (or, for link loops, by a walk that ends):
symlink loops, sizes and weights that overflow, YAML alias bombs, mistyped policies, file names
with control characters, empty refs. Every CLI error is one bounded line on stderr, no traceback."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import yaml
from toy_checkpoints import make_checkpoint

from concord.cli import main
from concord.errors import AggregationError, ControlCharacterNameError, PolicyError, UnsafePathError
from concord.hashing import chunk_id
from concord.snapshots.manifest import Manifest, make_file, make_part
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import collect_files, snapshot
from concord.stores import LocalDirStore
from concord.text import MAX_ERROR_LINE, one_line, printable
from concord.tiering.policy import TierPolicy, load_policy, parse_duration


def finishes(fn, seconds: float = 30.0):
    """``fn()``'s result, failing the test (instead of hanging it) when it runs longer."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s (a loop?)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def one_error_line(capsys, argv, code=None):
    """Run the CLI; its stderr must be one line without a traceback. Returns (exit code, line)."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert status != 0, out
    if code is not None:
        assert status == code
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err[:2000]
    assert len(lines[0]) <= MAX_ERROR_LINE + 200
    return status, lines[0]


# --------------------------------------------------------------------------- 1. symlink loops


@pytest.fixture
def looped(tmp_path):
    ck = make_checkpoint(tmp_path / "ckpt", layers=1)
    (ck / "sub").mkdir(exist_ok=True)
    (ck / "sub" / "notes.txt").write_text("hello")
    os.symlink("..", ck / "sub" / "up")  # a loop to an ancestor
    os.symlink(str(ck), ck / "again")  # a loop to the root, absolute
    os.symlink("sub", ck / "a-link")  # a second way into a folder already there (sorts first)
    return ck


def test_a_symlink_loop_ends_and_stores_each_file_once(looped, tmp_path):
    files = finishes(lambda: collect_files(looped))
    rels = [rel for rel, _ in files]
    assert rels == sorted(rels) and len(rels) == len(set(rels))
    assert "sub/notes.txt" in rels  # the real path, not a-link/notes.txt
    assert not any(r.startswith(("a-link/", "again/", "sub/up/")) for r in rels)
    store = LocalDirStore(tmp_path / "store")
    r = finishes(lambda: snapshot(looped, store))
    assert r.files == len(rels)


def test_links_are_still_followed_hugging_face_style(tmp_path):
    cache = tmp_path / "models--org--name"
    (cache / "blobs").mkdir(parents=True)
    (cache / "blobs" / "abc123").write_bytes(b"weights")
    (cache / "snapshots" / "rev1").mkdir(parents=True)
    os.symlink("../../blobs/abc123", cache / "snapshots" / "rev1" / "model.bin")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "tokenizer.json").write_text("{}")
    os.symlink(str(outside), cache / "snapshots" / "rev1" / "tok")  # a folder that is a link
    rels = [rel for rel, _ in finishes(lambda: collect_files(cache / "snapshots" / "rev1"))]
    assert rels == ["model.bin", "tok/tokenizer.json"]


def test_the_readiness_check_and_the_watcher_end_on_a_loop(looped):
    from concord.snapshots.watch import _list_local
    from concord.tiering.engine import checkpoint_ready

    scan = finishes(lambda: checkpoint_ready(looped, settle_seconds=0))
    assert "sub/notes.txt" in scan and not any("up/" in k for k in scan)
    listed = finishes(lambda: _list_local(str(looped)))
    assert set(listed) == set(scan)


def test_the_cli_snapshot_of_a_loop_finishes(looped, tmp_path, capsys):
    code = finishes(lambda: main(["snapshot", str(looped), "--store", str(tmp_path / "s"), "--json"]))
    assert code == 0
    assert json.loads(capsys.readouterr().out)["files"] == len(collect_files(looped))


# --------------------------------------------------------------------------- 2. numbers that overflow


@pytest.mark.parametrize("size", ["infM", "nanK", "1e400K", "-infG", "1e400"])
def test_chunk_sizes_that_overflow_are_one_line(size, ckpt, tmp_path, capsys):
    code, line = one_error_line(capsys, ["snapshot", ckpt, "--store", tmp_path / "s", f"--chunk-size={size}"], code=2)
    assert "--chunk-size" in line and "not a size" in line and "--help" in line


@pytest.mark.parametrize("weights", ["1e308,1e308", "inf,1", "nan,1", "1e400,1", "-1,2"])
def test_federation_weights_that_overflow_are_one_line(weights, tmp_path, capsys):
    argv = ["federate", "aggregate", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "o", "--weights", weights]
    code, line = one_error_line(capsys, argv, code=2)
    assert "--weights" in line


def test_weights_whose_sum_overflows_are_refused_by_the_core():
    from concord.federation.lora import _normalise_weights

    with pytest.raises(AggregationError, match="largest float"):
        _normalise_weights([1e308, 1e308], 2)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**400, "9" * 400 + "w", [1], {"a": 1}, "1e400"])
def test_durations_that_are_not_finite_are_refused(value):
    with pytest.raises(ValueError, match="restore.timeout"):
        parse_duration(value, "restore.timeout")


def test_the_timeout_option_refuses_overflowing_durations(tmp_path, capsys):
    policy = tmp_path / "p.yaml"
    policy.write_text("hot: {store: /h, keep: 1}\nwarm: {store: s3://b/w, keep: 1}\ncold: {store: s3://b/c}\n")
    code, line = one_error_line(capsys, ["tier", "restore", "x", tmp_path / "o", "--policy", policy, "--timeout", "9" * 400], code=2)
    assert "--timeout" in line and "100 years" in line


# --------------------------------------------------------------------------- 3. YAML bombs, long lines

BOMB = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
hot: {store: /tmp/h, keep: *g}
"""


def test_a_yaml_alias_bomb_policy_is_refused_at_once(tmp_path, capsys):
    policy = tmp_path / "bomb.yaml"
    policy.write_text(BOMB)
    assert len(BOMB) < 320
    started = time.monotonic()
    code, line = one_error_line(capsys, ["tier", "check", "--policy", policy], code=1)
    assert time.monotonic() - started < 5
    assert "anchor" in line and "line 1" in line


def test_aliases_alone_and_deep_nesting_are_refused(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("hot: {store: /h, keep: 1}\nwarm: {store: s3://b/w, keep: 1}\ncold: *x\n")
    with pytest.raises(PolicyError, match="alias"):
        load_policy(policy)
    policy.write_text("hot: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(PolicyError, match="nested more than"):
        finishes(lambda: load_policy(policy))


def test_policy_files_are_read_only_up_to_a_cap(tmp_path):
    policy = tmp_path / "big.yaml"
    policy.write_text("# " + "x" * (1 << 20) + "\nhot: {store: /h}\n")
    with pytest.raises(PolicyError, match="larger than"):
        load_policy(policy)
    policy.write_bytes(b"hot: {store: \xff\xfe}\n")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(policy)
    with pytest.raises(PolicyError, match="cannot be read"):
        load_policy(tmp_path)


def test_a_model_card_alias_bomb_is_refused():
    from concord.audit.model_cards import parse_readme
    from concord.errors import ModelCardError

    with pytest.raises(ModelCardError, match="anchor"):
        finishes(lambda: parse_readme("---\n" + BOMB + "---\n# card\n", "README.md"), 10)


def test_every_cli_error_line_is_capped_and_keeps_its_fix(tmp_path, capsys):
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump({"namespace": "x" * 50_000, "hot": {"store": "/h", "keep": 1}, "warm": {"store": "s3://b/w", "keep": 1}, "cold": {"store": "s3://b/c"}}))
    code, line = one_error_line(capsys, ["tier", "check", "--policy", policy], code=1)
    assert "characters left out" in line and line.endswith("nothing was changed.")
    assert len(one_line("y" * 10**6)) <= MAX_ERROR_LINE + 60


# --------------------------------------------------------------------------- 4. policy types


def _doc(**over):
    doc = {"hot": {"store": "/h", "keep": 1}, "warm": {"store": "s3://b/w", "keep": 2}, "cold": {"store": "s3://b/c"}}
    for key, value in over.items():
        if "." in key:
            top, sub = key.split(".")
            doc[top] = {**doc.get(top, {}), sub: value}
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize(
    "over, expected",
    [
        ({"hot.store": 123}, "hot.store must be text"),
        ({"warm.store": ["a", "b"]}, "warm.store must be text"),
        ({"hot.store": {"x": 1}}, "hot.store must be text"),
        ({"namespace": 123}, "namespace must be text"),
        ({"namespace": ["a"]}, "namespace must be text"),
        ({"pin": [100]}, "pin: 100 is not a checkpoint name"),
        ({"pin": "step-1"}, "pin must be a list"),
        ({"hot.keep_days": True, "hot.keep": None, "warm.keep": None, "warm.keep_days": 2}, "hot.keep_days must be a number"),
        ({"hot.keep_days": float("inf"), "hot.keep": None, "warm.keep": None, "warm.keep_days": 2}, "hot.keep_days must be a number"),
        ({"hot.keep_days": 10**400, "hot.keep": None, "warm.keep": None, "warm.keep_days": 2}, "hot.keep_days must be a number"),
        ({"hot.storage_class": 5}, "hot.storage_class must be text"),
        ({"warm.media": ["tape"]}, "warm.media must be text"),
        ({"restore.timeout": float("inf")}, "restore.timeout"),
        ({"gc_grace": 10**400}, "gc_grace"),
        ({"restore.tier": 1}, "restore.tier must be text"),
        ({"restore.days": True}, "restore.days must be a whole number of 1 or more, got True"),
        ({"ready": []}, "ready must be a mapping"),
        ({"ready": False}, "ready must be a mapping"),
        ({"ready.marker": ["x"]}, "ready.marker must be text"),
        ({"hot.rto": [1]}, "hot.rto"),
    ],
)
def test_every_policy_key_is_type_checked(over, expected):
    with pytest.raises(PolicyError) as info:
        TierPolicy.from_dict(_doc(**over), source="p.yaml")
    assert any(expected in p for p in info.value.problems), info.value.problems
    assert len(str(info.value)) < 2000


def test_type_problems_are_listed_together_without_follow_on_noise():
    with pytest.raises(PolicyError) as info:
        TierPolicy.from_dict(_doc(**{"hot.store": 1, "warm.store": [2], "namespace": 3, "restore.timeout": float("inf")}))
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert not any("same kind of media" in p for p in problems)


def test_an_infinite_timeout_is_not_normalised_into_something_refused(tmp_path, capsys):
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(_doc()) + "restore: {timeout: .inf}\n")
    code, line = one_error_line(capsys, ["tier", "check", "--policy", policy], code=1)
    assert "restore.timeout" in line and "infs" not in line


def test_relative_folders_of_a_policy_file_are_relative_to_the_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "conf").mkdir()
    policy = tmp_path / "conf" / "p.yaml"
    policy.write_text(yaml.safe_dump(_doc(**{"hot.store": "data/hot"})))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_policy(policy).hot.store == str(tmp_path / "conf" / "data" / "hot")
    assert main(["tier", "check", "--policy", os.path.relpath(policy), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["hot"]["store"] == str(tmp_path / "conf" / "data" / "hot")


def test_a_policy_block_refuses_relative_folders(tmp_path):
    from pydantic import ValidationError

    from concord_pipelines.blocks.tiers import TierPolicyBlock

    with pytest.raises(ValidationError, match="relative folder"):
        TierPolicyBlock(hot_store="data/hot", warm_store="s3://b/w", cold_store="s3://b/c")
    assert TierPolicyBlock(hot_store=str(tmp_path / "hot"), warm_store="s3://b/w", cold_store="s3://b/c").get_policy()


# --------------------------------------------------------------------------- 5. control characters


def test_printable_escapes_control_characters_only():
    assert printable("model.safetensors") == "model.safetensors"
    assert printable("ünïcødé → ✓") == "ünïcødé → ✓"
    assert printable("a\nb\x1b[2J\x7f\t") == "a\\nb\\x1b[2J\\x7f\\t"
    assert one_line("first\nsecond\x1b[31m") == "first second\\x1b[31m"


@pytest.mark.parametrize("name", ["evil\x1b[2Jname.txt", "two\nlines.txt", "del\x7f.bin", "tab\tbed.txt"])
def test_snapshot_refuses_file_names_with_control_characters(name, tmp_path, capsys):
    ck = make_checkpoint(tmp_path / "ckpt", layers=1)
    (ck / "deep").mkdir()
    (ck / "deep" / name).write_bytes(b"x")
    with pytest.raises(ControlCharacterNameError) as info:
        collect_files(ck)
    assert printable(name) in str(info.value) and "Rename" in str(info.value)
    code, line = one_error_line(capsys, ["snapshot", ck, "--store", tmp_path / "s"], code=1)
    assert printable(name) in line and "\x1b" not in line
    assert not (tmp_path / "s" / "manifests").exists() or not os.listdir(tmp_path / "s" / "manifests")


def _crafted(store: LocalDirStore, name: str) -> Manifest:
    data = b"payload"
    store.put_chunk(chunk_id(data), data)
    files = [make_file(n, len(data), "blob", [make_part("data", "", 0, len(data), [chunk_id(data)])]) for n in ("ok.txt", name)]
    manifest = Manifest.build(1 << 20, files)
    store.put_manifest(manifest.root, manifest.to_json())
    return manifest


@pytest.mark.parametrize("name", ["evil\nname.txt", "esc\x1b]0;pwned\x07.txt", "cr\r.txt"])
def test_restore_refuses_to_create_control_character_names(name, tmp_path, capsys):
    store = LocalDirStore(tmp_path / "s")
    manifest = _crafted(store, name)
    with pytest.raises(UnsafePathError, match="control character"):
        restore(store, manifest, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    code, line = one_error_line(capsys, ["restore", tmp_path / "s", "--root", manifest.root, tmp_path / "out2"], code=1)
    assert "control character" in line and repr(name)[1:-1] in line
    assert not (tmp_path / "out2").exists()


def test_diff_and_log_escape_names_and_messages(tmp_path, capsys):
    store = LocalDirStore(tmp_path / "s")
    a = _crafted(store, "x\x1b[2J\nforged line.txt")
    b = Manifest.build(a.chunk_size, [a.files[0]])
    store.put_manifest(b.root, b.to_json())
    store.cas_ref("default/t", None, a.root, "made by \x1b[31mred\x1b[0m\nforged")
    assert main(["diff", str(tmp_path / "s"), a.root, b.root]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "x\\x1b[2J\\nforged line.txt" in out
    assert not any(line.startswith("forged") for line in out.splitlines())
    assert main(["log", str(tmp_path / "s"), "t"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and len(out.splitlines()) == 1 and "red\\x1b[0m\\nforged" in out


# --------------------------------------------------------------------------- 6. empty refs


@pytest.mark.parametrize("ref", ["", "   ", "\t"])
@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot", "{ck}", "--store", "{s}", "--ref", "{ref}"],
        ["sync", "{s}", "{s2}", "--ref", "{ref}"],
        ["sync", "{s}", "{s2}", "--root", "{ref}"],
        ["restore", "{s}", "--ref", "{ref}", "{out}"],
        ["restore", "{s}", "--root", "{ref}", "{out}"],
        ["verify", "{s}", "--ref", "{ref}"],
        ["verify", "{s}", "--root", "{ref}"],
        ["rollback", "{s}", "--ref", "{ref}"],
        ["rollback", "{s}", "--ref", "t", "--to", "{ref}"],
        ["log", "{s}", "{ref}"],
        ["audit", "replicas", "{s}", "{s2}", "--ref", "{ref}"],
        ["audit", "cards", "{s}", "{s2}", "--ref", "{ref}"],
        ["audit", "replicas", "{s}", "{s2}", "--ref", "t", "--reference", "{ref}"],
        ["model", "register", "m", "--store", "{s}", "--ref", "{ref}"],
    ],
)
def test_an_empty_ref_given_explicitly_is_refused(argv, ref, ckpt, tmp_path, capsys):
    values = {"ck": str(ckpt), "s": str(tmp_path / "s"), "s2": str(tmp_path / "s2"), "out": str(tmp_path / "out"), "ref": ref}
    code, line = one_error_line(capsys, [a.format(**values) for a in argv], code=2)
    assert ("is empty" in line or "is blank" in line) and "give a" in line
    assert not (tmp_path / "s").exists() and not (tmp_path / "out").exists()


def test_a_wrong_command_line_is_one_line(capsys):
    code, line = one_error_line(capsys, ["snapshot"], code=2)
    assert line.startswith("concord snapshot: error:") and "--help" in line
