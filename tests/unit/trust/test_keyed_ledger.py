"""A keyed federation ledger: rounds signed by the appending cluster, and a forger who can write
the store but holds no trusted key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from concord.federation.ledger import head_ref, list_rounds, record_round, round_hash, round_key, verify_ledger
from concord.stores import LocalDirStore
from concord.trust import load_policy, load_signing_key


def _record(i: int) -> dict:
    return {"method": "exact", "inputs": [{"adapter": f"t/a{i}"}], "result": {"root": f"{i:064x}"}}


@pytest.fixture
def ledger(tmp_path, keydir):
    store = LocalDirStore(tmp_path / "s")
    key = load_signing_key(keydir / "alice.pem")
    for i in range(1, 4):
        record_round(store, "t", _record(i), key=key)
    return store


def _rewrite_consistently(store: LocalDirStore, number: int, change: dict, signature=None) -> None:
    """What someone who can write the store can do: edit round ``number``, recompute its hash,
    re-chain every later round and rewrite the head with a matching history."""
    rounds = list_rounds(store, "t")
    prev = rounds[number - 2]["hash"] if number > 1 else None
    for doc in rounds[number - 1 :]:
        if doc["round"] == number:
            doc.update(change)
        doc["prev"] = prev
        doc.pop("signature", None)
        if signature is not None:
            doc["signature"] = signature
        doc["hash"] = round_hash(doc)
        Path(store.root, round_key("t", doc["round"])).write_text(json.dumps(doc))
        prev = doc["hash"]
    ref_file = Path(store.root, "refs", "t", "_ledger")
    ref = json.loads(ref_file.read_text())
    hashes = [d["hash"] for d in list_rounds(store, "t")]
    for entry, h in zip(ref["history"], hashes):
        entry["root"] = h
    ref["root"] = hashes[-1]
    ref_file.write_text(json.dumps(ref))


def test_signed_rounds_verify_under_the_trust_policy(ledger, keydir):
    policy = load_policy(str(keydir / "alice.pub.pem"))
    report = verify_ledger(ledger, "t", trust=policy)
    assert report.ok and report.rounds == 3
    assert all(r["signature"]["key_id"] == policy.key_ids[0] for r in list_rounds(ledger, "t"))
    # another policy does not trust them
    other = verify_ledger(ledger, "t", trust=load_policy(str(keydir / "mallory.pub.pem")))
    assert not other.ok and "round 1: signed by key" in other.problems[0] and "not trusted" in other.problems[0]


def test_a_consistent_forgery_passes_the_unkeyed_check_and_fails_the_keyed_one(ledger, keydir):
    _rewrite_consistently(ledger, 2, {"result": {"root": "f" * 64}})
    assert verify_ledger(ledger, "t").ok  # the unkeyed chain cannot tell
    report = verify_ledger(ledger, "t", trust=load_policy(str(keydir / "alice.pub.pem")))
    assert not report.ok
    assert [p.split(":")[0].split(" (")[0] for p in report.problems] == ["round 2", "round 3", "signed head names round 3"]
    assert "not signed" in report.problems[0] and "rounds rewritten after it was signed" in report.problems[2]


def test_a_forger_with_the_old_signature_or_an_own_key_is_caught(ledger, keydir):
    policy = load_policy(str(keydir / "alice.pub.pem"))
    old = list_rounds(ledger, "t")[2]["signature"]  # alice's signature of the real round 3
    _rewrite_consistently(ledger, 3, {"method": "stack"}, signature=old)
    report = verify_ledger(ledger, "t", trust=policy)
    assert not report.ok and "does not verify (forged or edited)" in report.problems[0]
    # a round appended with a key nobody trusts
    record_round(ledger, "t", _record(9), key=load_signing_key(keydir / "mallory.pem"))
    report = verify_ledger(ledger, "t", trust=policy)
    assert any(p.startswith("round 4: signed by key") for p in report.problems)
    assert head_ref("t") == "t/_ledger"


def test_federate_verify_trust_at_the_command_line(ledger, keydir, capsys):
    from concord.cli import main

    assert main(["federate", "verify", "t", "--store", ledger.uri, "--trust", str(keydir / "alice.pub.pem")]) == 0
    _rewrite_consistently(ledger, 1, {"method": "fedavg"})
    capsys.readouterr()
    # without this machine's memory of the ledger (which sees round 3 rewritten), the chain cannot tell
    assert main(["federate", "verify", "t", "--store", ledger.uri, "--no-remember"]) == 0
    assert main(["federate", "verify", "t", "--store", ledger.uri, "--trust", str(keydir / "alice.pub.pem"), "--no-remember"]) == 1
    out, err = capsys.readouterr()
    assert "round 1: not signed" in out and err.count("\n") == 1 and "does not verify" in err
    assert main(["federate", "verify", "t", "--store", ledger.uri]) == 1
    assert "its round 3 now hashes to" in capsys.readouterr().err


def test_federate_run_key_signs_the_round(tmp_path, keydir, capsys):
    from test_federation import write_adapter

    from concord.cli import main
    from concord.snapshots.snapshot import snapshot

    stores = [LocalDirStore(tmp_path / c) for c in ("a", "b")]
    for i, s in enumerate(stores):
        snapshot(write_adapter(tmp_path / f"ad{i}", seed=i), s, ref=f"acme/adapter-{i}")
    args = ["federate", "run", "--tenant", "acme", "--cluster", stores[0].uri, "--cluster", stores[1].uri, "--adapter", "adapter-0", "adapter-1"]
    assert main([*args, "--key", str(tmp_path / "missing.pem")]) == 1
    assert "missing.pem: no such file" in capsys.readouterr().err and list_rounds(stores[0], "acme") == []
    assert main([*args, "--key", str(keydir / "alice.pem"), "--json"]) == 0
    capsys.readouterr()
    assert verify_ledger(stores[0], "acme", trust=load_policy(str(keydir / "alice.pub.pem"))).ok


def _drop_last_round(store: LocalDirStore) -> None:
    """What someone who can write the store can do without a key: remove the newest round and
    rewind the head (and its history) onto the round before."""
    rounds = list_rounds(store, "t")
    Path(store.root, round_key("t", rounds[-1]["round"])).unlink()
    ref_file = Path(store.root, "refs", "t", "_ledger")
    ref = json.loads(ref_file.read_text())
    ref["history"] = ref["history"][:-1]
    ref["root"] = rounds[-2]["hash"]
    ref_file.write_text(json.dumps(ref))


def test_a_keyed_append_signs_the_head_and_dropping_rounds_is_caught(ledger, keydir):
    from concord.federation.ledger import read_signed_head

    policy = load_policy(str(keydir / "alice.pub.pem"))
    head = read_signed_head(ledger, "t")
    assert (head["tenant"], head["round"], head["hash"]) == ("t", 3, list_rounds(ledger, "t")[-1]["hash"])
    assert head["signature"]["key_id"] == policy.key_ids[0]
    _drop_last_round(ledger)
    assert verify_ledger(ledger, "t").ok  # every round left is whole and signed: only the head tells
    report = verify_ledger(ledger, "t", trust=policy)
    assert report.problems == (
        f"signed head names round 3 (hash {head['hash'][:12]}), but the ledger ends at round 2 (rounds removed after it was signed)",
    )


def test_an_unsigned_foreign_or_untrusted_head_is_named(ledger, tmp_path, keydir):
    from concord.federation.ledger import head_key, sign_head

    policy = load_policy(str(keydir / "alice.pub.pem"))
    doc = Path(ledger.root, head_key("t"))
    signed = doc.read_bytes()
    doc.unlink()
    assert "the head is not signed (no ledger/t/head.json)" in verify_ledger(ledger, "t", trust=policy).problems[0]
    # alice's signed head of another tenant, at the same round and hash, is no head of this one
    other = json.loads(signed)
    other["tenant"] = "u"
    doc.write_text(json.dumps(other))
    assert "not a head of tenant 't'" in verify_ledger(ledger, "t", trust=policy).problems[0]
    sign_head(ledger, "t", load_signing_key(keydir / "mallory.pem"))
    (problem,) = verify_ledger(ledger, "t", trust=policy).problems
    assert problem.startswith("signed head: signed by key") and "not trusted" in problem
    # re-signing a head without any of its fields changed verifies again
    doc.write_bytes(signed)
    assert verify_ledger(ledger, "t", trust=policy).ok


def test_a_rollback_with_its_old_signed_head_needs_the_last_round_seen(ledger, keydir, capsys):
    """Replaying an older signed head together with its rounds passes every signature check: only
    --min-round (the round a reader saw last) catches it."""
    from concord.cli import main
    from concord.federation.ledger import head_key

    doc = Path(ledger.root, head_key("t"))
    kept = doc.read_bytes()  # an older copy of the signed head (round 3), as anyone who reads the store has
    record_round(ledger, "t", _record(4), key=load_signing_key(keydir / "alice.pem"))
    _drop_last_round(ledger)
    doc.write_bytes(kept)
    trust = str(keydir / "alice.pub.pem")
    assert main(["federate", "verify", "t", "--store", ledger.uri, "--trust", trust]) == 0
    assert main(["federate", "verify", "t", "--store", ledger.uri, "--trust", trust, "--min-round", "3"]) == 0
    capsys.readouterr()
    assert main(["federate", "verify", "t", "--store", ledger.uri, "--trust", trust, "--min-round", "4"]) == 1
    out, err = capsys.readouterr()
    assert "the ledger ends at round 3, but it went to round 4 before (rolled back" in out and err.count("\n") == 1
