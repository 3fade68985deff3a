"""What a model version's source names (``concord:///<root>?store=…`` and the sources registered
before), the order stores are tried in, and the replica tags a person reads."""

from __future__ import annotations

import json

import pytest

from concord.errors import LineageError
from concord.lineage.sources import SnapshotLocation, nearest_first, parse_source, snapshot_uri
from concord.lineage.tags import TAG_HELD_BY, TAG_REPLICAS, held_by_text, read_tags, replica_tags, replicas_of

ROOT = "ab" * 32


@pytest.mark.parametrize(
    "stores",
    [
        ["/data/stores/us-east"],
        ["s3://models/eu-west", "/data/stores/us-east"],
        ["/odd/a&b?c=d #e%41", "s3://b/p?connections=4"],  # what a query would otherwise split or decode
    ],
)
def test_a_source_names_its_root_and_stores_and_reads_back(stores):
    uri = snapshot_uri(ROOT, stores)
    assert uri.startswith(f"concord:///{ROOT}?store=")
    assert parse_source(uri) == SnapshotLocation(ROOT, tuple(stores))


def test_a_source_reads_as_a_person_reads_it():
    assert snapshot_uri(ROOT, ["s3://models/eu-west", "/data/x"]) == f"concord:///{ROOT}?store=s3://models/eu-west&store=/data/x"


def test_sources_registered_before_name_the_manifest():
    assert parse_source(f"file:///data/stores/us-east/manifests/{ROOT}.json") == SnapshotLocation(ROOT, ("/data/stores/us-east",))
    assert parse_source(f"s3://bucket/p/q/manifests/{ROOT}.json") == SnapshotLocation(ROOT, ("s3://bucket/p/q",))
    assert parse_source(f"concord-file://node-7/data/s%20x/manifests/{ROOT}.json") == SnapshotLocation(ROOT, ("/data/s x",))


def test_a_uri_whose_path_mlflow_took_keeps_its_stores():
    # mlflow.artifacts.download_artifacts("concord:///<root>?store=…") cuts the root off as the artifact path
    assert parse_source("concord:///?store=/data/x") == SnapshotLocation(None, ("/data/x",))


@pytest.mark.parametrize(
    "uri, says",
    [
        ("concord:///not-a-root?store=/x", "64-hex snapshot root"),
        (f"concord:///{ROOT}", "name the stores"),
        (f"concord:///{ROOT}?store=", "name the stores"),
        ("s3://bucket/model/weights.bin", "names no Concord snapshot"),
        (f"file:///x/manifests/{ROOT[:-1]}.json", "names no Concord snapshot"),
    ],
)
def test_a_source_naming_no_snapshot_is_one_clear_error(uri, says):
    with pytest.raises(LineageError, match=says):
        parse_source(uri)


def test_the_nearest_store_comes_first():
    replicas = [
        {"store": "s3://b/cold-copy", "tier": "cold"},
        {"store": "s3://b/warm-copy", "tier": "warm"},
        {"store": "/disk/hot", "tier": "hot"},
        {"store": "s3://b/hot", "tier": "hot"},
    ]
    # hot before warm before cold; within a tier a folder of this machine before S3; each once
    assert nearest_first(["s3://b/hot", "/disk/other"], replicas) == [
        "/disk/other", "/disk/hot", "s3://b/hot", "s3://b/warm-copy", "s3://b/cold-copy",
    ]
    assert nearest_first(["s3://b/x", "s3://b/y"]) == ["s3://b/x", "s3://b/y"]  # otherwise as given


def test_replica_tags_are_short_and_readable_and_keep_the_detail():
    held = [{"store": "/data/stores/us-east", "tier": "hot"}, {"store": "s3://models/eu-west", "tier": "warm"}]
    tags = replica_tags(held)
    assert tags[TAG_HELD_BY] == "eu-west (warm), us-east (hot)"
    assert replicas_of(tags) == sorted(held, key=lambda h: h["store"])
    assert max(len(k) for k in tags) <= 10
    # two stores of one name are told apart by their addresses
    assert held_by_text([{"store": "/a/models", "tier": "hot"}, {"store": "s3://b/models", "tier": "cold"}]) == "/a/models (hot), s3://b/models (cold)"


def test_replicas_written_before_are_read_as_todays():
    listed = [{"store": "/data/stores/us-east", "tier": "warm"}]
    for old in ({"held_by": json.dumps(listed)}, {"concord.held_by": json.dumps(listed)}):
        got = read_tags(old)
        assert replicas_of(got) == listed and got[TAG_HELD_BY] == "us-east (warm)"
        assert json.loads(got[TAG_REPLICAS]) == listed
    # today's tags win, and a value that is not Concord's list reads as no replica
    assert read_tags({**replica_tags(listed), "concord.held_by": "[]"})[TAG_HELD_BY] == "us-east (warm)"
    assert replicas_of({TAG_REPLICAS: "not json"}) == [] and replicas_of({TAG_REPLICAS: '{"store": "x"}'}) == []


def test_the_schemes_are_registered_when_the_plugin_module_is_imported_before_mlflow():
    import subprocess
    import sys

    code = (
        "import concord.lineage.artifacts\n"
        "from mlflow.store.artifact.artifact_repository_registry import _artifact_repository_registry as r\n"
        "print(sorted(s for s in r._registry if s.startswith('concord')))\n"
    )
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[-2] == "['concord', 'concord-file']"
