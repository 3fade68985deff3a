"""The parameter checks shared by the flows a checkpoint event starts: pure functions, no server."""

from __future__ import annotations

import pytest

from concord_pipelines.flows._arguments import (
    BadArguments,
    checkpoint_problems,
    ref_problems,
    store_problems,
    targets_problems,
)


@pytest.mark.parametrize(
    "spec, said",
    [
        ("", "empty store address"),
        ("   ", "empty store address"),
        (None, "empty store address"),
        ("{{ event.payload.store }}", "did not fill in"),
        ("s3://Bad_Bucket/x", "is not a store address"),
        ("s3://bucket-1/a/../b", "is not a store address"),
        ("file://elsewhere/x", "is not a store address"),
        ("nosuchscheme:x", "unknown scheme"),
    ],
)
def test_a_bad_store_address_is_named(spec, said):
    (problem,) = store_problems(spec, "store")
    assert said in problem


def test_a_file_is_no_store_and_a_new_folder_is_one(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "is a file" in store_problems(str(tmp_path / "f"), "store")[0]
    assert store_problems(str(tmp_path / "new" / "store"), "store") == []
    assert not (tmp_path / "new").exists()  # checking creates nothing


def test_targets_are_other_stores_each_once(tmp_path):
    primary = str(tmp_path / "a")
    assert targets_problems([], primary) == ["targets is empty: give the store of every other cluster"]
    assert targets_problems(None, primary)
    [same] = targets_problems([f"file://{primary}"], primary)
    assert "primary store itself" in same
    [twice] = targets_problems([str(tmp_path / "b"), str(tmp_path / "b") + "/"], primary)
    assert "same store as" in twice
    assert targets_problems([str(tmp_path / "b"), "s3://bucket-1/c"], primary) == []


@pytest.mark.parametrize("ref, ok", [("models/llama", True), ("llama", True), ("models/", False), ("models/../x", False),
                                     ("a/b/c", False), ("", False), (".hidden/x", False), ("models/{{ x }}", False)])
def test_ref_names(ref, ok):
    assert (ref_problems(ref) == []) is ok


def test_checkpoint_sources(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "COMPLETE").write_text("")
    check = lambda v, **kw: checkpoint_problems(v, "source", **(dict(relative=True, need_files=True) | kw))  # noqa: E731
    assert "holds no checkpoint files" in check("ckpt")[0]
    assert check("ckpt", need_files=False) == []
    (tmp_path / "ckpt" / "sub").mkdir()
    (tmp_path / "ckpt" / "sub" / "model.safetensors").write_bytes(b"x")
    assert check("ckpt") == [] and check(str(tmp_path / "ckpt")) == []
    assert "absolute local folder path" in check("ckpt", relative=False)[0]
    assert "is a file" in check("ckpt/sub/model.safetensors")[0]
    assert "must be a local folder or an s3:// URI" in check("gs://bucket/x")[0]
    assert "must be a folder path" in check(42)[0]
    assert check("s3://bucket-1/runs/llama/step-1") == []  # an S3 checkpoint is checked without a request
    assert "whole bucket" in check("s3://bucket-1")[0]


def test_the_error_lists_every_problem_and_says_what_to_do():
    class Bad(BadArguments):
        flow = "some-flow"
        payload_fields = "path"
        fix = "a folder"

    plain, event = Bad(["a is bad", "b is bad"]), Bad(["a is bad"], event=True)
    assert str(plain).startswith("some-flow refused its parameters before touching any store: a is bad; b is bad.")
    assert "If an event started this run" in str(plain) and "run it again with a folder" in str(plain)
    assert "An event started this run" in str(event) and event.problems == ["a is bad"]
    assert isinstance(plain, ValueError)
