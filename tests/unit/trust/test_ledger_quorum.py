"""A quorum of clusters for federation rounds: each cluster checks the aggregate it received and
co-signs the round and the head; ``federate verify`` under a threshold K refuses a round with
fewer than K distinct trusted signatures (a forged one, one over another round, one key twice
never make up the number)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from quorum_keys import CLUSTERS, key

from concord.cli import main
from concord.errors import LedgerError
from concord.federation.ledger import (
    cosign_round,
    head_key,
    list_rounds,
    read_signed_head,
    record_round,
    round_key,
    verify_ledger,
)
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore
from concord.trust import load_policy


def _record(i: int) -> dict:
    return {"method": "exact", "inputs": [{"adapter": f"t/a{i}"}], "result": {"root": f"{i:064x}"}}


@pytest.fixture(autouse=True)
def no_env_policy(monkeypatch):
    monkeypatch.delenv("CONCORD_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("CONCORD_TRUST_THRESHOLD", raising=False)


def policy(clusters: Path, threshold: int):
    return load_policy(str(clusters / "policy.yaml")).with_threshold(threshold)


def _put(store: LocalDirStore, key_: str, doc: dict) -> None:
    store.put_document(key_, json.dumps(doc).encode(), overwrite=True)


def _forged(sig: dict) -> dict:
    raw = bytearray(base64.b64decode(sig["sig"]))
    raw[len(raw) // 2] ^= 0x01
    return {**sig, "sig": base64.b64encode(bytes(raw)).decode()}


@pytest.fixture
def ledger(tmp_path, clusters):
    """Two rounds appended (and signed) by us-east."""
    store = LocalDirStore(tmp_path / "ledger")
    for i in (1, 2):
        record_round(store, "t", _record(i), key=key(clusters, "us-east"))
    return store


def test_one_signer_is_refused_under_a_threshold_of_two(ledger, clusters):
    assert verify_ledger(ledger, "t", trust=policy(clusters, 1)).ok
    r = verify_ledger(ledger, "t", trust=policy(clusters, 2))
    assert not r.ok
    assert "round 2: signed by 1 of 3 (us-east; eu-central, ap-south missing), 2 needed" in r.problems
    assert any(p.startswith("signed head: signed by 1 of 3") for p in r.problems)


def test_a_cosigned_round_and_head_meet_the_quorum(ledger, clusters):
    cosign_round(ledger, "t", 1, key(clusters, "eu-central"))
    r = verify_ledger(ledger, "t", trust=policy(clusters, 2))
    assert [p.split(":")[0] for p in r.problems] == ["round 2", "signed head"]  # round 1 alone is co-signed
    cosign_round(ledger, "t", 2, key(clusters, "eu-central"))
    r = verify_ledger(ledger, "t", trust=policy(clusters, 2))
    assert r.ok, r.problems
    assert r.signed_by == {1: ("us-east", "eu-central"), 2: ("us-east", "eu-central")}
    assert not verify_ledger(ledger, "t", trust=policy(clusters, 3)).ok
    # co-signing again is harmless, and the signatures do not change the round's hash
    before = list_rounds(ledger, "t")[1]["hash"]
    cosign_round(ledger, "t", 2, key(clusters, "eu-central"))
    assert list_rounds(ledger, "t")[1]["hash"] == before and len(list_rounds(ledger, "t")[1]["signatures"]) == 1
    # a re-signed head (a retried append) keeps its co-signers
    record_round(ledger, "t", _record(2), key=key(clusters, "us-east"))
    assert verify_ledger(ledger, "t", trust=policy(clusters, 2)).ok


@pytest.mark.parametrize("case", ["forged", "other-round", "same-key-twice", "outsider"])
def test_a_second_signature_that_does_not_count_never_makes_the_quorum(ledger, clusters, case):
    for n in (1, 2):
        cosign_round(ledger, "t", n, key(clusters, "eu-central"))
    assert verify_ledger(ledger, "t", trust=policy(clusters, 2)).ok
    rounds = list_rounds(ledger, "t")
    doc = rounds[1]
    if case == "forged":
        doc["signatures"] = [_forged(doc["signatures"][0])]
    elif case == "other-round":
        doc["signatures"] = rounds[0]["signatures"]  # eu-central's genuine signature of round 1
    elif case == "same-key-twice":
        doc["signatures"] = [doc["signature"], doc["signature"]]
    else:
        outsider = LocalDirStore(Path(ledger.root).parent / "scratch")
        for i in (1, 2):
            record_round(outsider, "t", _record(i), key=key(clusters, "us-east"))
        cosign_round(outsider, "t", 2, key(clusters, "outsider"))
        doc["signatures"] = list_rounds(outsider, "t")[1]["signatures"]
    _put(ledger, round_key("t", 2), doc)
    r = verify_ledger(ledger, "t", trust=policy(clusters, 2))
    assert not r.ok and r.signed_by[2] == ("us-east",)
    assert any(p.startswith("round 2: signed by 1 of 3 (us-east; eu-central, ap-south missing)") for p in r.problems), r.problems
    # the head, co-signed for round 2, is still fine: only the round is named
    assert not any(p.startswith("signed head") for p in r.problems)


def test_the_head_quorum_cannot_be_borrowed(ledger, clusters):
    for n in (1, 2):
        cosign_round(ledger, "t", n, key(clusters, "eu-central"))
    head = read_signed_head(ledger, "t")
    head["signatures"] = [list_rounds(ledger, "t")[1]["signatures"][0]]  # a round's signature is not a head's
    _put(ledger, head_key("t"), head)
    r = verify_ledger(ledger, "t", trust=policy(clusters, 2))
    assert not r.ok and any(p.startswith("signed head: signed by 1 of 3") for p in r.problems), r.problems


def test_an_edited_round_is_never_cosigned(ledger, clusters):
    doc = list_rounds(ledger, "t")[1]
    doc["method"] = "stack"
    _put(ledger, round_key("t", 2), doc)
    with pytest.raises(LedgerError, match="edited"):
        cosign_round(ledger, "t", 2, key(clusters, "eu-central"))
    assert "signatures" not in list_rounds(ledger, "t")[1]


# ----------------------------------------------------------------------------- a round across three stores


@pytest.fixture
def three(tmp_path):
    from test_federation import write_adapter

    stores = [LocalDirStore(tmp_path / c) for c in CLUSTERS]
    for i, s in enumerate(stores):
        snapshot(write_adapter(tmp_path / f"ad{i}", seed=i), s, ref=f"acme/adapter-{i}")
    return stores


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_round_missing_one_clusters_signature_is_refused_under_three_and_accepted_under_two(three, clusters, tmp_path, capsys):
    us, eu, ap = three
    run = ["federate", "run", "--tenant", "acme", *[x for s in three for x in ("--cluster", s.uri)],
           "--adapter", "adapter-0", "adapter-1", "adapter-2", "--no-remember"]
    code, out, err = cli(capsys, *run, "--key", clusters / "us-east.pem", "--key", clusters / "eu-central.pem", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["signatures"] == [key(clusters, "us-east").id, key(clusters, "eu-central").id]
    verify = ["federate", "verify", "acme", "--store", us.uri, "--no-remember", "--trust", clusters / "policy.yaml"]
    code, out, err = cli(capsys, *verify)
    assert code == 0, err
    assert "round 1: signed by us-east, eu-central" in out
    code, out, err = cli(capsys, *verify, "--trust-threshold", "3")
    assert code == 1 and "signed by 2 of 3 (us-east, eu-central; ap-south missing), 3 needed" in out, out
    assert err.count("\n") == 1
    # ap-south checks the aggregate it received, then signs: now three of three
    code, out, err = cli(capsys, "federate", "cosign", "acme", "--store", us.uri, "--cluster", ap.uri, "--key", clusters / "ap-south.pem")
    assert code == 0, err
    code, out, err = cli(capsys, *verify, "--trust-threshold", "3", "--json")
    assert code == 0 and json.loads(out)["signed_by"] == {"1": list(CLUSTERS)}


def test_a_cluster_without_a_sound_copy_of_the_aggregate_does_not_sign(three, clusters, tmp_path, capsys):
    us, eu, ap = three
    run = ["federate", "run", "--tenant", "acme", "--cluster", us.uri, "--cluster", eu.uri, "--adapter", "adapter-0", "adapter-1", "--no-remember"]
    assert cli(capsys, *run, "--key", clusters / "us-east.pem")[0] == 0
    # ap-south never received the aggregate
    code, _, err = cli(capsys, "federate", "cosign", "acme", "--store", us.uri, "--cluster", ap.uri, "--key", clusters / "ap-south.pem")
    assert code != 0 and "does not hold its aggregate" in err and err.count("\n") == 1
    # eu-central's copy is damaged: one chunk's bytes altered
    root = list_rounds(us, "acme")[0]["result"]["root"]
    chunks = sorted(p for p in Path(eu.root).rglob("*") if p.is_file() and "chunks" in p.parts)
    victim = chunks[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))
    code, _, err = cli(capsys, "federate", "cosign", "acme", "--store", us.uri, "--cluster", eu.uri, "--key", clusters / "eu-central.pem")
    assert code != 0 and "does not verify" in err and root[:12] in err
    assert "signatures" not in list_rounds(us, "acme")[0]
    # more keys than clusters: refused before any store is touched
    code, _, err = cli(capsys, *run, *[x for n in CLUSTERS for x in ("--key", clusters / f"{n}.pem")])
    assert code != 0 and "one key per cluster" in err
