"""A store address is parsed once, here: each kind, its identity and label, and what it refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from concord.errors import InvalidStoreURIError
from concord.plugins import Plugins
from concord.stores import LocalDirStore, address, check_store_address, open_store, register_scheme
from concord.stores.address import FOLDER, S3, SCHEME, StoreAddress


def parse(text):
    return StoreAddress.parse(text)


def test_a_folder_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = parse("  data/stores/us-east  ")
    assert (a.kind, a.scheme, a.path, a.text, a.name) == (FOLDER, "", "data/stores/us-east", "data/stores/us-east", "us-east")
    assert a.identity == os.path.realpath(tmp_path / "data/stores/us-east")
    assert str(a) == "data/stores/us-east" and a.bucket is None
    assert parse(Path("x/y")).path == "x/y"
    # a one-letter or non-identifier part before ':' is a folder, not a scheme
    assert parse("C:/x").kind == FOLDER and parse("a-b:c").kind == FOLDER


def test_file_uris_are_unquoted_and_local_only():
    a = parse("file:///data/my%20store")
    assert (a.kind, a.scheme, a.path, a.name) == (FOLDER, "file", "/data/my store", "my store")
    assert parse("file://localhost/data/c1").path == "/data/c1"
    with pytest.raises(InvalidStoreURIError, match="file:// URIs must name a local path"):
        parse("file://elsewhere/x")


def test_s3_bucket_and_prefix():
    a = parse("s3://bucket-1/runs/llama/")
    assert (a.kind, a.bucket, a.prefix, a.name, a.identity) == (S3, "bucket-1", "runs/llama", "llama", "s3://bucket-1/runs/llama")
    whole = parse("s3://bucket-1")
    assert (whole.prefix, whole.name, whole.identity) == ("", "bucket-1", "s3://bucket-1")


def test_a_scheme_from_an_entry_point():
    a = parse("block:us-east")
    assert (a.kind, a.scheme, a.rest, a.identity, a.name) == (SCHEME, "block", "us-east", "block:us-east", "block:us-east")
    assert parse("block:concord-local-store/us-east").name == "us-east"


@pytest.mark.parametrize(
    "text, said, part",
    [
        ("", "empty store address", None),
        ("   ", "empty store address", None),
        (None, "empty store address", None),
        ("s3://", "no bucket name after s3://", "address"),
        ("s3:///prefix", "no bucket name after s3://", "address"),
        ("s3://bucket-1/p?x=1", "unknown option 'x'", "address"),
        ("s3://bucket-1/p?connections=8&x=1", "unknown option 'x'", "address"),
        ("s3://bucket-1/p#f", "fragments are not allowed", "address"),
        ("s3://bucket-1/p?connections=0", "connections must be one whole number from 1 to 1024", "address"),
        ("s3://bucket-1/p?connections=many", "connections must be one whole number", "address"),
        ("s3://bucket-1/p?connections=4&connections=8", "connections must be one whole number", "address"),
        ("s3://bucket-1/p?connections=2000", "connections must be one whole number", "address"),
        ("s3://bucket-1/a/../b", "the prefix has an empty, '.' or '..' segment", "address"),
        ("s3://bucket-1/a//b", "the prefix has an empty, '.' or '..' segment", "address"),
        ("s3://Bad_Bucket/x", "bucket names are 3 to 63 characters", "bucket"),
        ("s3://192.168.1.1/x", "may not look like an IP address", "bucket"),
        ("s3://bucket-1/a\\b", "control character", "prefix"),
        ("nosuchscheme:x", "unknown scheme 'nosuchscheme'", None),
        ("block:", "nothing after 'block:'", None),
    ],
)
def test_what_names_no_store_is_refused_with_the_reason(text, said, part):
    with pytest.raises(InvalidStoreURIError) as caught:
        parse(text)
    assert said in str(caught.value) and said in caught.value.reason
    assert caught.value.part == part
    with pytest.raises(InvalidStoreURIError, match="A store is a folder path"):
        check_store_address(text)


def test_two_spellings_of_one_store_have_one_identity(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ident = lambda text: parse(text).identity  # noqa: E731
    assert ident("stores/a") == ident(f"file://{tmp_path}/stores/a") == ident(f"{tmp_path}/stores/a/")
    assert ident("s3://bucket-1/p/q") == ident("s3://bucket-1/p/q/") != ident("s3://bucket-1/p")
    assert ident("block:us-east") != ident("us-east")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert ident("link") == ident("file://" + str(tmp_path / "real").replace(" ", "%20"))


def test_the_label_hides_credentials(monkeypatch):
    assert parse("block:us-east").label == "block:us-east"
    monkeypatch.setattr(address, "_SCHEMES", address._SCHEMES.copy())
    register_scheme("viaurl", lambda rest: None)
    a = parse("viaurl:http://user:secret@minio:9000/x")
    assert "secret" not in a.label and "user:***@minio:9000" in a.label
    assert a.text == "viaurl:http://user:secret@minio:9000/x"  # the address itself keeps it, to open the store


def test_opening_dispatches_on_the_kind(tmp_path, monkeypatch):
    store = parse(str(tmp_path / "new")).open()
    assert isinstance(store, LocalDirStore) and store.root == str(tmp_path / "new") and (tmp_path / "new").is_dir()
    assert isinstance(parse(f"file://{tmp_path}/other").open(create=False), LocalDirStore)
    assert not (tmp_path / "other").exists()
    s3 = parse("s3://bucket-1/p").open()
    assert (type(s3).__name__, s3.bucket, s3.prefix, s3.uri) == ("S3ObjectStore", "bucket-1", "p", "s3://bucket-1/p")
    seen = []
    monkeypatch.setattr(address, "_SCHEMES", Plugins(address.SCHEME_GROUP))
    register_scheme("memtest", lambda rest: seen.append(rest) or store)
    assert open_store("memtest:abc") is store and seen == ["abc"]
    assert open_store(store) is store and open_store(parse(str(tmp_path / "new"))).root == store.root


def test_a_parsed_address_is_a_value():
    a = parse("s3://bucket-1/p")
    assert a == parse(" s3://bucket-1/p ") and hash(a) == hash(parse("s3://bucket-1/p"))
    assert StoreAddress.parse(a) is a
    with pytest.raises(AttributeError):
        a.bucket = "other"  # type: ignore[misc]


def test_without_check_only_the_form_is_read():
    a = StoreAddress.parse("s3://b1/x", check=False)  # too short for S3, but an S3 address all the same
    assert (a.kind, a.bucket, a.prefix) == (S3, "b1", "x")
    with pytest.raises(InvalidStoreURIError, match="bucket names are 3 to 63"):
        a.open()
    b = StoreAddress.parse("nosuchscheme:x", check=False)
    assert (b.kind, b.scheme, b.rest) == (SCHEME, "nosuchscheme", "x")
    with pytest.raises(InvalidStoreURIError, match="unknown scheme 'nosuchscheme'"):
        b.open()
    for text in ("s3://", "s3://b1/a/../b", "file://elsewhere/x", "block:", ""):
        with pytest.raises(InvalidStoreURIError):
            StoreAddress.parse(text, check=False)


def test_an_s3_address_sets_its_connections_and_keeps_its_identity():
    a = parse("s3://bucket-1/a/b?connections=48")
    assert (a.connections, a.bucket, a.prefix, a.identity) == (48, "bucket-1", "a/b", "s3://bucket-1/a/b")
    assert a.identity == parse("s3://bucket-1/a/b").identity and parse("s3://bucket-1/a/b").connections is None
    store = a.open()
    assert (store.connections, store.parallelism, store.uri) == (48, 48, "s3://bucket-1/a/b")
    assert parse("s3://bucket-1/a").open().parallelism == 16  # the default
