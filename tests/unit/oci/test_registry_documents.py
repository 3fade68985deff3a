"""What a registry sends is checked for its shape before a field is read: documents, descriptor
lists, file paths, digests; deadlines grow with a blob's size; the errors survive a pickle."""

from __future__ import annotations

import pickle

import pytest

from concord.errors import OciDocumentError, OciNotAModelError, OciTimeoutError, OciUnsafePathError
from concord.oci import modelpack as mp
from concord.oci import registry as reg


def _manifest(layers: list) -> dict:
    return {"schemaVersion": 2, "mediaType": mp.MANIFEST_TYPE, "artifactType": mp.ARTIFACT_TYPE,
            "config": {"mediaType": mp.CONFIG_TYPE, "digest": "sha256:" + "1" * 64, "size": 2}, "layers": layers}


def _layer(path: str, **over) -> dict:
    return {"mediaType": mp.WEIGHT, "digest": "sha256:" + "2" * 64, "size": 3, "annotations": {mp.FILEPATH: path}, **over}


@pytest.mark.parametrize(
    "data, says",
    [
        (b"[1, 2]", "top level is an array"),
        (b'"a string"', "top level is a string"),
        (b"[" * 10_000 + b"]" * 10_000, "nested deeper"),
        (b'{"a":' * 17 + b"1" + b"}" * 17, "nested deeper"),
        (b"{not json", "not valid JSON"),
        (b'{"size": 1e400}', "not finite"),
        (b" " * (reg.MAX_DOCUMENT + 1), "more than"),
    ],
)
def test_a_registry_document_of_the_wrong_shape_is_one_error_naming_it(data, says):
    with pytest.raises(OciDocumentError, match=says) as info:
        reg.document(data, "reg.example/m:v1", "referrers index")
    text = str(info.value)
    assert text.startswith("reg.example/m:v1: the registry's referrers index") and "\n" not in text


@pytest.mark.parametrize(
    "doc, says",
    [
        ({"manifests": "abc"}, "manifests is a string, expected an array"),
        ({"manifests": {"a": 1}}, "manifests is an object, expected an array"),
        ({"manifests": [{"digest": "x"}, 3]}, r"manifests\[1\] is an integer, expected an object"),
    ],
)
def test_a_descriptor_list_of_the_wrong_shape_is_refused(doc, says):
    with pytest.raises(OciDocumentError, match=says):
        reg.descriptors(doc, "manifests", "r", "index")


def test_a_missing_descriptor_list_is_empty_and_a_field_of_the_wrong_kind_is_refused():
    assert reg.descriptors({}, "manifests", "r", "index") == []
    assert reg.doc_field({}, "subject", dict, "r", "m", required=False) is None
    with pytest.raises(OciDocumentError, match="subject is a string, expected an object"):
        reg.doc_field({"subject": "sha256:0"}, "subject", dict, "r", "m")


@pytest.mark.parametrize(
    "path",
    ["a/" * 5000 + "x.bin", "a/" * mp.MAX_PATH_DEPTH + "x.bin", "x" * (mp.MAX_PATH_BYTES + 1)],
)
def test_a_path_too_deep_or_too_long_is_refused_before_anything_is_written(path):
    with pytest.raises(OciUnsafePathError, match="deeper than|longer than") as info:
        mp.check_model_manifest(_manifest([_layer(path)]), "reg/x:v1")
    assert len(str(info.value)) < 600  # the path is shown cut short, on one line


def test_a_path_as_deep_as_allowed_is_taken():
    path = "a/" * (mp.MAX_PATH_DEPTH - 1) + "x.bin"
    assert [p for p, _ in mp.check_model_manifest(_manifest([_layer(path)]), "r")] == [path]


@pytest.mark.parametrize(
    "layer, says",
    [
        (_layer("a", digest="sha256:" + "g" * 64), "only sha256"),
        (_layer("a", digest="sha256:../../../../v2/other/blobs/x" + "0" * 36), "only sha256"),
        (_layer("a", size=True), "no digest or size"),
        (_layer("a", size=-1), "no digest or size"),
    ],
)
def test_a_layer_whose_digest_or_size_is_not_one_is_refused(layer, says):
    with pytest.raises(OciNotAModelError, match=says):
        mp.check_model_manifest(_manifest([layer]), "reg/x:v1")


def test_annotations_that_are_not_an_object_are_refused():
    with pytest.raises(OciNotAModelError, match="annotations are not an object"):
        mp.check_model_manifest({**_manifest([_layer("a")]), "annotations": [1]}, "reg/x:v1")


def test_a_blob_deadline_grows_with_its_size_and_a_document_has_the_request_deadline():
    small, large = reg.Deadline.for_bytes(0), reg.Deadline.for_bytes(10 * reg.MIN_RATE)
    assert small.seconds == reg.REQUEST_DEADLINE == reg.Deadline(reg.REQUEST_DEADLINE).seconds
    assert large.seconds == pytest.approx(reg.REQUEST_DEADLINE + 10)
    assert 0 < small.left() <= small.seconds


@pytest.mark.parametrize(
    "exc, code",
    [
        (OciTimeoutError("reg.example", "blob sha256:ab", 12.5), 14),
        (OciDocumentError("reg.example/m:v1", "manifest", "the top level is an array"), 1),
    ],
)
def test_the_new_errors_survive_a_pickle_and_keep_their_kind(exc, code):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and back.exit_code == code
    assert back.__dict__ == exc.__dict__
