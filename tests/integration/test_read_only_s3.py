"""Reading commands on S3 addresses that hold no store say so in one line (a real moto_server)."""

from __future__ import annotations

import uuid

import pytest

from concord.cli import main
from concord.errors import StoreNotFoundError
from concord.snapshots.snapshot import snapshot
from concord.stores import open_store_to_read

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def endpoint(moto_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    return moto_server


def _buckets(s3_store) -> set[str]:
    return {b["Name"] for b in s3_store._client().list_buckets()["Buckets"]}


@pytest.mark.parametrize("argv", [["refs", "{s}"], ["verify", "{s}"], ["log", "{s}", "x"], ["federate", "verify", "acme", "--store", "{s}"]])
def test_a_missing_bucket_is_no_store_and_is_not_created(endpoint, s3_store, capsys, argv):
    missing = f"s3://concord-missing-{uuid.uuid4().hex[:12]}"
    before = _buckets(s3_store)
    code = main([a.replace("{s}", missing) for a in argv])
    out, err = capsys.readouterr()
    assert code == 10 and out == "" and err.count("\n") == 1  # 10: no store
    assert f"no Concord store at {missing} (bucket" in err and "does not exist" in err and "check the path" in err
    assert _buckets(s3_store) == before


def test_a_prefix_holding_no_store_is_said_and_a_real_one_opens(endpoint, s3_store, capsys, tmp_path):
    typo = f"s3://{s3_store.bucket}/{s3_store.prefix}-typo"
    assert main(["verify", typo]) == 10
    _, err = capsys.readouterr()
    assert err == f"concord: error: no Concord store at {typo} (no refs/, manifests/ or chunks/ under it); check the path.\n"
    with pytest.raises(StoreNotFoundError):
        open_store_to_read(typo)
    (tmp_path / "f.txt").write_text("x")
    snapshot(tmp_path / "f.txt", s3_store, ref="cfg")
    assert main(["refs", s3_store.uri]) == 0 and "default/cfg" in capsys.readouterr().out
