"""A reader remembers how far each signed ledger went: a rollback to an older signed copy of the
whole ledger fails without --min-round, and a rewritten history too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from concord.cli import main
from concord.errors import LedgerRollbackError
from concord.federation.ledger import list_rounds, record_round
from concord.federation.seen import LedgerMemory, memory_path
from concord.stores import LocalDirStore
from concord.trust import load_signing_key


def _record(i: int, tag: str = "") -> dict:
    return {"method": "exact", "inputs": [{"adapter": f"t/a{i}{tag}"}], "result": {"root": f"{i:064x}"}}


def _ledger_files(store: LocalDirStore) -> list[Path]:
    """Everything a copy of tenant t's ledger is made of: its rounds and signed head, its head ref."""
    return [Path(store.root, "ledger", "t"), Path(store.root, "refs", "t")]


def _copy_ledger(src: LocalDirStore, dst: Path) -> None:
    for path in _ledger_files(src):
        shutil.copytree(path, dst / path.relative_to(src.root))


def _put_back(copy: Path, store: LocalDirStore) -> None:
    """What someone who can write the store does: replace the ledger's files by an older copy."""
    for path in _ledger_files(store):
        shutil.rmtree(path)
        shutil.copytree(copy / path.relative_to(store.root), path)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("CONCORD_HOME", str(h))
    return h


@pytest.fixture
def rolled_back(tmp_path, keydir, home):
    """A signed ledger of 3 rounds, verified here (so remembered at round 3), then replaced by a
    copy of its files taken at round 2: every round and the head are genuinely signed."""
    store = LocalDirStore(tmp_path / "s")
    key = load_signing_key(keydir / "alice.pem")
    for i in (1, 2):
        record_round(store, "t", _record(i), key=key)
    _copy_ledger(store, tmp_path / "at-round-2")
    record_round(store, "t", _record(3), key=key)
    trust = str(keydir / "alice.pub.pem")
    assert main(["federate", "verify", "t", "--store", store.uri, "--trust", trust]) == 0
    _put_back(tmp_path / "at-round-2", store)
    return store, trust


def _verify(store, trust, *extra) -> int:
    return main(["federate", "verify", "t", "--store", store.uri, "--trust", trust, *extra])


def test_a_rollback_fails_without_min_round_in_one_line_naming_the_fix(rolled_back, capsys):
    store, trust = rolled_back
    assert LedgerMemory().recall(store, "t").round == 3
    capsys.readouterr()
    assert _verify(store, trust) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1
    line = err.strip()
    assert f"the ledger of t in {store.uri} ends at round 2, but this machine saw it at round 3" in line
    assert "rolled back" in line and "--forget" in line and memory_path() in line
    assert "✗ the ledger ends at round 2, but it went to round 3 before" in out
    # an explicit lower --min-round does not lower the bar: accepting a rollback takes --forget
    assert _verify(store, trust, "--min-round", "1") == 1
    assert "ends at round 2, but this machine saw it at round 3" in capsys.readouterr().err
    # an explicit higher one raises it
    assert _verify(store, trust, "--min-round", "5") == 1
    assert "it went to round 5 before" in capsys.readouterr().out
    # without the memory the rolled-back ledger verifies, and the memory is left as it was
    assert _verify(store, trust, "--no-remember", "--min-round", "1") == 0
    assert LedgerMemory().recall(store, "t").round == 3


def test_forget_accepts_the_rollback_and_remembers_the_ledger_as_it_is(rolled_back, capsys):
    store, trust = rolled_back
    assert _verify(store, trust, "--forget") == 0
    seen = LedgerMemory().recall(store, "t")
    assert seen.round == 2 and seen.hash == list_rounds(store, "t")[-1]["hash"]
    assert _verify(store, trust) == 0
    # --forget still verifies: a ledger that does not verify is not accepted, the memory unchanged
    Path(store.root, "ledger", "t", "head.json").unlink()
    assert _verify(store, trust, "--forget") == 1
    assert LedgerMemory().recall(store, "t") == seen


def test_the_same_round_with_another_hash_is_a_rewritten_history(tmp_path, keydir, home, capsys):
    key = load_signing_key(keydir / "alice.pem")
    store, other = LocalDirStore(tmp_path / "s"), LocalDirStore(tmp_path / "o")
    for i in (1, 2, 3):
        record_round(store, "t", _record(i), key=key)
        record_round(other, "t", _record(i, "-other"), key=key)  # as genuinely signed, other content
    trust = str(keydir / "alice.pub.pem")
    assert _verify(store, trust) == 0
    _copy_ledger(other, tmp_path / "other-copy")
    _put_back(tmp_path / "other-copy", store)
    capsys.readouterr()
    assert _verify(store, trust) == 1
    err = capsys.readouterr().err.strip()
    assert f"the ledger of t in {store.uri} goes to round 3, but its round 3 now hashes to" in err
    assert "this machine saw it at round 3" in err and "history rewritten" in err and "--forget" in err


def test_a_fresh_home_trusts_any_signed_ledger_on_first_use(rolled_back, tmp_path, monkeypatch, capsys):
    store, trust = rolled_back
    monkeypatch.setenv("CONCORD_HOME", str(tmp_path / "fresh"))
    capsys.readouterr()
    assert _verify(store, trust) == 0
    out = capsys.readouterr().out
    assert "remembered at round 2" in out and "trusted on first use" in out
    assert LedgerMemory().recall(store, "t").round == 2


def test_an_append_refuses_a_rolled_back_ledger_and_remembers_its_round(rolled_back, keydir):
    store, _ = rolled_back
    with pytest.raises(LedgerRollbackError, match="ends at round 2, but this machine saw it at round 3"):
        LedgerMemory().check(store, "t")
    memory = LedgerMemory()
    memory.forget(store, "t")
    assert memory.check(store, "t") is None
    outcome = record_round(store, "t", _record(4), key=load_signing_key(keydir / "alice.pem"))
    assert memory.remember(store, "t", outcome.round, outcome.hash).round == 3
    assert memory.remember(store, "t", 2, "0" * 64).round == 3  # an entry never moves back


_WRITER = """
import sys
from concord.federation.seen import LedgerMemory
from concord.stores import LocalDirStore
memory = LedgerMemory(sys.argv[1])
for i in range(int(sys.argv[3])):
    memory.remember(LocalDirStore(sys.argv[2], create=False), f"t{i}", i + 1, f"{i:064x}")
"""


def test_two_processes_remembering_at_once_keep_both_entries(tmp_path):
    path = tmp_path / "home" / "ledgers-seen.json"
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(tmp_path / name), "25"])
        for name in ("a", "b")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    entries = LedgerMemory(path).entries()
    assert sorted(entries) == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert all(len(tenants) == 25 for tenants in entries.values())
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_damaged_memory_is_named_with_its_fix(rolled_back, tmp_path, monkeypatch, capsys):
    store, trust = rolled_back
    Path(memory_path()).write_text(json.dumps({"format": "something else"}))
    capsys.readouterr()
    assert _verify(store, trust) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and memory_path() in err and "not a memory of verified ledgers" in err and "remove it" in err
    # a home that cannot hold it: one line naming the fix, never a traceback
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CONCORD_HOME", str(blocker))
    assert _verify(store, trust, "--forget") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be written" in err and "--no-remember" in err
    assert _verify(store, trust) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be read" in err and "--no-remember" in err


def test_federate_run_refuses_to_append_to_a_ledger_behind_what_it_saw(tmp_path, keydir, home, capsys):
    from test_federation import write_adapter

    from concord.snapshots.snapshot import snapshot

    stores = [LocalDirStore(tmp_path / c) for c in ("a", "b")]
    for i, s in enumerate(stores):
        snapshot(write_adapter(tmp_path / f"ad{i}", seed=i), s, ref=f"t/adapter-{i}")
    run = ["federate", "run", "--tenant", "t", "--cluster", stores[0].uri, "--cluster", stores[1].uri, "--adapter", "adapter-0", "adapter-1"]
    run += ["--key", str(keydir / "alice.pem")]
    assert main([*run, "--weights", "1,1"]) == 0
    ledger = stores[0]
    _copy_ledger(ledger, tmp_path / "at-round-1")
    assert main([*run, "--weights", "1,3"]) == 0
    assert LedgerMemory().recall(ledger, "t").round == 2
    _put_back(tmp_path / "at-round-1", ledger)
    result = ledger.read_ref("t/federated")
    capsys.readouterr()
    assert main([*run, "--weights", "1,2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ends at round 1, but this machine saw it at round 2" in err
    assert len(list_rounds(ledger, "t")) == 1 and ledger.read_ref("t/federated") == result  # nothing read, nothing written
    assert main([*run, "--weights", "1,2", "--no-remember"]) == 0  # told not to look: appended as round 2
    assert [r["round"] for r in list_rounds(ledger, "t")] == [1, 2]
