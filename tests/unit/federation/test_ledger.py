"""The federation ledger: appending rounds, verifying the chain, and catching every kind of tampering."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from concord.errors import InvalidNameError, LedgerConflictError, LedgerError, RefConflictError
from concord.federation.ledger import (
    ADOPTED,
    ALREADY,
    HEAD_NAME,
    RECORDED,
    append_round,
    content_hash,
    head_ref,
    list_rounds,
    read_head,
    record_round,
    round_hash,
    round_key,
    validate_tenant,
    verify_ledger,
)
from concord.hashing import canonical_json
from concord.stores import LocalDirStore
from concord.stores.local import atomic_write


def _record(i: int) -> dict:
    return {
        "method": "exact",
        "weights": [0.5, 0.5],
        "inputs": [{"adapter": f"t/a{i}", "root": f"{i:064x}"}, {"adapter": f"t/b{i}", "root": f"{i + 100:064x}"}],
        "result": {"ref": "t/federated", "root": f"{i + 200:064x}"},
        "metrics": {"relative_error": 1e-7 * i},
    }


def _path(store: LocalDirStore, tenant: str, n: int) -> Path:
    return Path(store.root) / round_key(tenant, n)


@pytest.fixture
def store(tmp_path) -> LocalDirStore:
    return LocalDirStore(tmp_path / "store")


@pytest.fixture
def three(store) -> list[dict]:
    """Tenant ``t`` with three rounds."""
    return [append_round(store, "t", _record(i)) for i in range(1, 4)]


# ----------------------------------------------------------------------------- appending


def test_rounds_are_numbered_chained_and_hashed(store, three):
    assert [r["round"] for r in three] == [1, 2, 3]
    assert three[0]["prev"] is None
    assert [r["prev"] for r in three[1:]] == [r["hash"] for r in three[:2]]
    for r in three:
        assert r["tenant"] == "t" and r["method"] == "exact" and r["inputs"] == _record(r["round"])["inputs"]
        from blake3 import blake3

        assert r["hash"] == blake3(canonical_json({k: v for k, v in r.items() if k != "hash"})).hexdigest()
    assert sorted(p.name for p in (Path(store.root) / "ledger" / "t").iterdir()) == ["000001.json", "000002.json", "000003.json"]
    assert list_rounds(store, "t") == three  # what is stored is what was returned
    assert read_head(store, "t") == three[-1]["hash"]
    assert [e.root for e in store.read_ref(head_ref("t")).history] == [r["hash"] for r in three]


def test_a_fresh_ledger_verifies_and_an_empty_one_too(store, three):
    report = verify_ledger(store, "t")
    assert report.ok and report.problems == () and report.rounds == 3 and report.head == three[-1]["hash"]
    empty = verify_ledger(store, "nobody")
    assert (empty.ok, empty.rounds, empty.head) == (True, 0, None)
    assert report.to_dict()["problems"] == [] and report.to_dict()["tenant"] == "t"


def test_tenants_have_separate_ledgers(store, three):
    other = append_round(store, "u", _record(9))
    assert other["round"] == 1 and other["prev"] is None
    assert list_rounds(store, "t") == three
    assert verify_ledger(store, "t").ok and verify_ledger(store, "u").ok


def test_the_hash_changes_with_every_field():
    doc = {"round": 1, "tenant": "t", "prev": None, "method": "exact", "weights": [0.5, 0.5]}
    h = round_hash(doc)
    assert round_hash(dict(doc, hash="ignored")) == h
    assert round_hash(dict(doc, round=2)) != h
    assert round_hash(dict(doc, tenant="u")) != h
    assert round_hash(dict(doc, weights=[0.5, 0.50001])) != h
    assert round_hash(dict(doc, prev="0" * 64)) != h


@pytest.mark.parametrize("field", ["round", "tenant", "time", "prev", "hash", "format"])
def test_a_record_may_not_set_the_ledgers_own_fields(store, field):
    with pytest.raises(LedgerError, match=field):
        append_round(store, "t", dict(_record(1), **{field: 1}))
    assert list_rounds(store, "t") == []


@pytest.mark.parametrize("bad", [{"x": float("nan")}, {"x": float("inf")}, {"x": object()}, ["not", "a", "dict"]])
def test_a_record_must_be_plain_json(store, bad):
    with pytest.raises(LedgerError):
        append_round(store, "t", bad)
    assert list_rounds(store, "t") == [] and read_head(store, "t") is None


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "..", "a b", "x" * 200, None, "t\n"])
def test_bad_tenant_names_are_refused(store, name):
    with pytest.raises(InvalidNameError):
        validate_tenant(name)
    with pytest.raises(InvalidNameError):
        append_round(store, name, _record(1))
    with pytest.raises(InvalidNameError):
        verify_ledger(store, name)
    with pytest.raises(InvalidNameError):
        list_rounds(store, name)
    assert not (Path(store.root) / "ledger").exists() and not (Path(store.root) / "x").exists()


def test_good_tenant_names(store):
    for name in ("acme", "team-1", "a.b", "_x", "A_B-c.9"):
        assert validate_tenant(name) == name
        append_round(store, name, _record(1))
        assert verify_ledger(store, name).ok


class _RacingStore(LocalDirStore):
    """A local store whose ledger writes wait until both racers are about to write: both have
    read the same head, so both try to take the same round number."""

    barrier = threading.Barrier(2, timeout=10)

    def _put_object(self, key, data, *, overwrite):
        if key.startswith("ledger/"):
            self.barrier.wait()
        return super()._put_object(key, data, overwrite=overwrite)


def test_two_rounds_racing_for_one_number_one_conflicts_and_writes_nothing(tmp_path):
    base = LocalDirStore(tmp_path / "store")
    first = append_round(base, "t", _record(1))
    _RacingStore.barrier = threading.Barrier(2, timeout=10)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = append_round(_RacingStore(tmp_path / "store"), "t", _record(10 + i))
        except Exception as exc:  # collected and checked below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    won = [r for r in results.values() if isinstance(r, dict)]
    lost = [r for r in results.values() if isinstance(r, Exception)]
    assert len(won) == 1 and len(lost) == 1, results
    (conflict,) = lost
    assert isinstance(conflict, LedgerConflictError) and isinstance(conflict, RefConflictError)
    assert conflict.round == 2 and conflict.tenant == "t" and "concurrently" in str(conflict)
    rounds = list_rounds(base, "t")
    assert rounds == [first, won[0]]  # the loser's round is nowhere
    report = verify_ledger(base, "t")
    assert report.ok and report.rounds == 2 and report.head == won[0]["hash"]


class _OvertakenStore(LocalDirStore):
    """A real store on which, just before this writer moves the head onto the round it wrote,
    another writer (its own store object on the same folder) appends a round: finding this
    writer's round just past the head, it adopts it first."""

    armed = False
    other_record: dict = {}

    def cas_ref(self, name, expected, new, message=""):
        if name.endswith("/_ledger") and self.armed:
            self.armed = False
            self.other = append_round(LocalDirStore(self.root), "t", self.other_record)
        return super().cas_ref(name, expected, new, message)


def test_a_round_adopted_by_another_writer_is_reported_recorded_and_a_retry_adds_nothing(tmp_path):
    store = _OvertakenStore(tmp_path / "store")
    first = append_round(store, "t", _record(1))
    store.armed, store.other_record = True, _record(3)
    outcome = record_round(store, "t", _record(2))
    assert outcome.status == ADOPTED and outcome.round == 2 and outcome.doc["prev"] == first["hash"]
    assert "recorded as round 2" in outcome.describe() and "another writer" in outcome.describe()
    assert store.other["round"] == 3 and store.other["prev"] == outcome.hash
    assert [r["hash"] for r in list_rounds(store, "t")] == [first["hash"], outcome.hash, store.other["hash"]]

    again = record_round(store, "t", _record(2))  # a retry, as a caller told "not recorded" would do
    assert again.status == ALREADY and again.round == 2 and again.hash == outcome.hash
    assert "already recorded as round 2" in again.describe()
    assert len(list_rounds(store, "t")) == 3 and verify_ledger(store, "t").ok


def test_a_record_already_in_the_ledger_is_never_appended_again(store, three):
    fresh = record_round(store, "t", _record(4))
    assert fresh.status == RECORDED and fresh.round == 4 and fresh.describe().startswith("recorded as round 4")
    for i in (2, 4, 1):
        same = record_round(store, "t", json.loads(json.dumps(_record(i))))
        assert same.status == ALREADY and same.round == i and same.doc == list_rounds(store, "t")[i - 1]
    assert len(list_rounds(store, "t")) == 4 and verify_ledger(store, "t").ok
    assert content_hash(fresh.doc) == content_hash(_record(4)) != content_hash(_record(3))


def test_two_writers_racing_with_the_same_round_both_get_it_recorded_once(tmp_path):
    base = LocalDirStore(tmp_path / "store")
    append_round(base, "t", _record(1))
    _RacingStore.barrier = threading.Barrier(2, timeout=10)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = record_round(_RacingStore(tmp_path / "store"), "t", _record(2))
        except Exception as exc:  # collected and checked below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(getattr(r, "status", r) for r in results.values()) == sorted([RECORDED, ALREADY]), results
    assert {r.round for r in results.values()} == {2} and len({r.hash for r in results.values()}) == 1
    assert len(list_rounds(base, "t")) == 2 and verify_ledger(base, "t").ok


def test_a_round_that_lost_its_number_says_to_which_round_and_its_retry_is_recorded_once(tmp_path):
    base = LocalDirStore(tmp_path / "store")
    append_round(base, "t", _record(1))
    _RacingStore.barrier = threading.Barrier(2, timeout=10)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = record_round(_RacingStore(tmp_path / "store"), "t", _record(10 + i))
        except Exception as exc:  # collected and checked below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    (lost_i,) = [i for i, r in results.items() if isinstance(r, LedgerConflictError)]
    (won,) = [r for r in results.values() if not isinstance(r, Exception)]
    lost = results[lost_i]
    assert won.status == RECORDED and lost.round == won.round == 2 and lost.winner == won.hash
    assert f"hash {won.hash[:12]}" in str(lost) and "not recorded" in str(lost) and "Run it again" in str(lost)
    retry = record_round(base, "t", _record(10 + lost_i))
    assert retry.status == RECORDED and retry.round == 3
    assert record_round(base, "t", _record(10 + lost_i)).status == ALREADY
    assert len(list_rounds(base, "t")) == 3 and verify_ledger(base, "t").ok


def test_a_round_whose_head_move_was_interrupted_is_adopted_by_the_next_append(store, three):
    # what a run stopped between writing round 4's document and moving the head leaves behind
    pending = {"format": three[0]["format"], "round": 4, "tenant": "t", "time": "2025-01-01T00:00:00.000+00:00", "prev": three[-1]["hash"], **_record(4)}
    pending["hash"] = round_hash(pending)
    assert store.put_document(round_key("t", 4), json.dumps(pending).encode())
    report = verify_ledger(store, "t")
    assert not report.ok and any("not covered by the head" in p for p in report.problems), report.problems

    fifth = append_round(store, "t", _record(5))
    assert fifth["round"] == 5 and fifth["prev"] == pending["hash"]
    assert verify_ledger(store, "t").ok
    assert [e.root for e in store.read_ref(head_ref("t")).history] == [r["hash"] for r in list_rounds(store, "t")]


def test_append_refuses_to_extend_a_ledger_whose_head_disagrees(store, three):
    (_path(store, "t", 3)).unlink()  # the last round removed: the head names a round that is gone
    with pytest.raises(LedgerError, match="head"):
        append_round(store, "t", _record(4))
    assert not _path(store, "t", 4).exists()


# ----------------------------------------------------------------------------- tampering


def _edit(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc, indent=1))


def _problems(store, tenant="t") -> list[str]:
    report = verify_ledger(store, tenant)
    assert not report.ok and list(report.problems), "the tampering went unnoticed"
    return list(report.problems)


def test_reformatting_a_round_is_not_tampering(store, three):
    path = _path(store, "t", 2)
    path.write_text(json.dumps(json.loads(path.read_text())))  # same content, other whitespace
    assert verify_ledger(store, "t").ok


@pytest.mark.parametrize(
    "changes",
    [
        {"weights": [0.9, 0.1]},
        {"method": "fedavg"},
        {"metrics": {"relative_error": 0.0}},
        {"time": "1999-01-01T00:00:00.000+00:00"},
    ],
)
def test_an_edited_field_is_detected(store, three, changes):
    _edit(_path(store, "t", 2), **changes)
    problems = _problems(store)
    assert any(p.startswith("round 2: edited") for p in problems), problems
    assert any(p.startswith("round 3: prev") for p in problems), problems  # round 3 no longer follows it


def test_an_edit_that_also_rewrites_the_hash_breaks_the_chain(store, three):
    path = _path(store, "t", 2)
    doc = json.loads(path.read_text())
    doc["weights"] = [0.9, 0.1]
    doc["hash"] = round_hash(doc)
    path.write_text(json.dumps(doc))
    problems = _problems(store)
    assert not any("edited" in p for p in problems)
    assert any(p.startswith("round 3: prev") and "chain broken" in p for p in problems), problems


def test_a_removed_middle_round_is_detected(store, three):
    _path(store, "t", 2).unlink()
    problems = _problems(store)
    assert "round 2: missing (removed from the ledger)" in problems
    assert any(p.startswith("round 3: prev") for p in problems), problems


def test_a_removed_last_round_is_detected(store, three):
    _path(store, "t", 3).unlink()
    problems = _problems(store)
    assert any("head" in p and "hash of no round" in p for p in problems), problems


def test_removing_the_last_round_and_moving_the_head_back_is_detected(store, three):
    _path(store, "t", 3).unlink()
    store.cas_ref(head_ref("t"), three[2]["hash"], three[1]["hash"], "covering tracks")
    problems = _problems(store)
    assert any("history" in p for p in problems), problems


def test_swapped_rounds_are_detected(store, three):
    a, b = _path(store, "t", 1), _path(store, "t", 2)
    tmp = a.with_suffix(".tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    problems = _problems(store)
    assert any("round 1: its document says round 2" in p for p in problems), problems
    assert any("round 2: its document says round 1" in p for p in problems), problems
    assert any("chain broken" in p for p in problems), problems


def test_a_round_copied_from_another_tenant_is_detected(store, three):
    other = [append_round(store, "u", _record(i)) for i in range(1, 3)]
    shutil.copyfile(_path(store, "u", 2), _path(store, "t", 2))
    problems = _problems(store)
    assert any("round 2: belongs to tenant 'u'" in p for p in problems), problems
    assert verify_ledger(store, "u").ok and other[1]["tenant"] == "u"


def test_a_round_copied_from_another_tenant_as_the_next_round_is_detected(store, three):
    append_round(store, "u", _record(1))
    shutil.copyfile(_path(store, "u", 1), _path(store, "t", 4))
    problems = _problems(store)
    assert any("round 4: belongs to tenant 'u'" in p for p in problems), problems
    assert any("round 4: its document says round 1" in p for p in problems), problems


def test_a_removed_head_and_stray_documents_are_detected(store, three):
    (Path(store.root) / "refs" / "t" / HEAD_NAME).unlink()
    assert any("no head ref" in p for p in _problems(store))
    store.put_document("ledger/u/notes.txt", b"hello")
    assert any("not a round document" in p for p in _problems(store, "u"))


def test_an_unreadable_round_is_reported(store, three):
    _path(store, "t", 2).write_text("{not json")
    assert any(p.startswith("round 2: unreadable") for p in _problems(store))


class _HeadFailsOnceStore(LocalDirStore):
    """A real store whose first head update dies on the network after the round was written."""

    armed = False

    def cas_ref(self, name, expected, new, message=""):
        if name.endswith("/_ledger") and self.armed:
            self.armed = False
            raise ConnectionError("connection reset while moving the head")
        return super().cas_ref(name, expected, new, message)


def test_a_retried_append_after_a_failed_head_move_is_the_same_round(tmp_path):
    store = _HeadFailsOnceStore(tmp_path / "store")
    first = append_round(store, "t", _record(1))
    store.armed = True
    with pytest.raises(ConnectionError):
        append_round(store, "t", _record(2))
    again = append_round(store, "t", _record(2))  # the task's retry
    assert again["round"] == 2 and [r["round"] for r in list_rounds(store, "t")] == [1, 2]
    assert again["prev"] == first["hash"] and verify_ledger(store, "t").ok
    other = append_round(store, "t", _record(3))
    assert other["round"] == 3 and other["prev"] == again["hash"]


def test_an_exclusive_write_never_replaces_a_file_that_appeared_after_the_check(tmp_path):
    # the window the ledger race hit: the name was free when checked, taken by the time of writing
    path = tmp_path / "ledger" / "t" / "000002.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"the winner's round")
    assert atomic_write(str(path), b"the loser's round", exclusive=True) is False
    assert path.read_bytes() == b"the winner's round"
    assert [p.name for p in path.parent.iterdir()] == ["000002.json"]  # no temp file left
    assert atomic_write(str(path.with_name("000003.json")), b"next", exclusive=True) is True
    assert path.with_name("000003.json").read_bytes() == b"next"
