"""Many writers appending to one tenant's ledger at once, on a local folder and on S3 (a real
moto_server): every writer is told truthfully what became of its round, and no round's content is
ever in the ledger twice, however often a writer retries."""

from __future__ import annotations

import threading

import pytest

from concord.errors import LedgerConflictError
from concord.federation.ledger import content_hash, list_rounds, read_head, record_round, verify_ledger
from concord.stores import LocalDirStore
from concord.stores.s3 import S3ObjectStore

pytestmark = pytest.mark.integration

WRITERS = 6
ROUNDS_EACH = 4
ATTEMPTS = 200


def _record(writer: int, n: int) -> dict:
    # writers 0 and 1 record the same rounds: the same content reaching the ledger from two places
    who = writer if writer > 1 else 0
    return {"method": "exact", "inputs": [{"adapter": f"t/w{who}", "round": n}], "result": {"root": f"{who:032x}{n:032x}"}}


def _open(kind: str, where) -> object:
    if kind == "local":
        return LocalDirStore(where)
    bucket, prefix, endpoint = where
    return S3ObjectStore(bucket, prefix, endpoint_url=endpoint)


@pytest.fixture(params=["local", "s3"])
def target(request, tmp_path):
    """(kind, where): each writer opens its own store object on the same place."""
    if request.param == "local":
        return "local", tmp_path / "store"
    s3 = request.getfixturevalue("s3_store")
    return "s3", (s3.bucket, s3.prefix, request.getfixturevalue("moto_server"))


def test_concurrent_appenders_are_told_the_truth_and_never_duplicate_a_round(target):
    kind, where = target
    barrier = threading.Barrier(WRITERS, timeout=60)
    told: dict[int, list] = {w: [] for w in range(WRITERS)}  # what each writer was told, in order
    failures: list[BaseException] = []

    def writer(w: int) -> None:
        store = _open(kind, where)
        try:
            barrier.wait()
            for n in range(ROUNDS_EACH):
                record = _record(w, n)
                for _ in range(ATTEMPTS):
                    try:
                        outcome = record_round(store, "t", record)
                    except LedgerConflictError as exc:  # lost to another round: retry, as the error says
                        told[w].append(("lost", record, exc))
                        continue
                    told[w].append(("recorded", record, outcome))
                    break
                else:
                    raise AssertionError(f"writer {w} never got round {n} recorded")
        except BaseException as exc:  # checked below
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures

    store = _open(kind, where)
    rounds = list_rounds(store, "t")
    report = verify_ledger(store, "t")
    assert report.ok, report.problems
    contents = [content_hash(r) for r in rounds]
    assert len(contents) == len(set(contents)), "a round's content is in the ledger twice"
    distinct = {content_hash(_record(w, n)) for w in range(WRITERS) for n in range(ROUNDS_EACH)}
    assert set(contents) == distinct  # every round there, once
    assert read_head(store, "t") == rounds[-1]["hash"]

    by_number = {r["round"]: r for r in rounds}
    statuses = set()
    for w, events in told.items():
        for what, record, answer in events:
            if what == "recorded":
                statuses.add(answer.status)
                # the round it was told about holds its content, under the number and hash it was told
                held = by_number[answer.round]
                assert held["hash"] == answer.hash and content_hash(held) == content_hash(record), (w, answer)
                assert str(answer.round) in answer.describe()
            else:
                # a lost round: the number it lost holds a different round, the one it was told about
                held = by_number[answer.round]
                assert content_hash(held) != content_hash(record), (w, str(answer))
                assert answer.winner == held["hash"], (w, str(answer))
                assert "not recorded" in str(answer) and "again" in str(answer)
    assert "recorded" in statuses
