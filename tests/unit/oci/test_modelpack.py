"""The ModelPack layout without a registry: references, layer media types, the model config read
from a checkpoint, the checks an imported manifest must pass, and where credentials come from."""

from __future__ import annotations

import base64
import json

import pytest
from servers import patched_environ
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.errors import OciNotAModelError, OciReferenceError, OciUnsafePathError, UnsafePathError
from concord.oci import modelpack as mp
from concord.oci.reference import parse_reference
from concord.oci.registry import find_credentials
from concord.snapshots.snapshot import snapshot
from concord.stores.local import LocalDirStore

CLEARED = ("CONCORD_REGISTRY_USERNAME", "CONCORD_REGISTRY_PASSWORD")


@pytest.mark.parametrize(
    "text, parts",
    [
        ("127.0.0.1:5000/models/minilm:v1", ("127.0.0.1:5000", "models/minilm", "v1", None)),
        ("ghcr.io/org/team/model:2024-01.rc_1", ("ghcr.io", "org/team/model", "2024-01.rc_1", None)),
        ("localhost/m@sha256:" + "a" * 64, ("localhost", "m", None, "sha256:" + "a" * 64)),
    ],
)
def test_a_reference_is_parsed_once_into_its_parts(text, parts):
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == parts
    assert str(ref) == text


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "empty"),
        ("https://ghcr.io/m:v1", "scheme"),
        ("models/minilm:v1", "not a registry host"),
        ("ghcr.io/Models/minilm:v1", "lowercase"),
        ("ghcr.io/models/minilm", "no tag"),
        ("ghcr.io/m:bad/tag", "no tag"),
        ("ghcr.io/m@sha256:xyz", "64 lowercase hex"),
        ("ghcr.io/m:" + "t" * 200, "at most 128"),
        ("ghcr.io/../m:v1", "lowercase"),
    ],
)
def test_a_bad_reference_says_what_to_write(text, says):
    with pytest.raises(OciReferenceError, match=says) as info:
        parse_reference(text)
    assert "REGISTRY/REPOSITORY:TAG" in str(info.value)


@pytest.mark.parametrize(
    "path, media_type",
    [
        ("model.safetensors", mp.WEIGHT),
        ("shards/model-00001-of-00002.safetensors", mp.WEIGHT),
        ("pytorch_model.bin", mp.WEIGHT),
        ("model.gguf", mp.WEIGHT),
        ("config.json", mp.WEIGHT_CONFIG),
        ("model.safetensors.index.json", mp.WEIGHT_CONFIG),
        ("tokenizer.json", mp.WEIGHT_CONFIG),
        ("merges.txt", mp.WEIGHT_CONFIG),
        ("README.md", mp.DOC),
        ("LICENSE", mp.DOC),
        ("docs/usage.md", mp.DOC),
        ("modeling_custom.py", mp.CODE),
    ],
)
def test_each_file_becomes_the_layer_of_its_kind(path, media_type):
    assert mp.layer_type(path) == media_type


@pytest.mark.parametrize("count, text", [(6_738_415_616, "6.7B"), (22_713_216, "22.7M"), (1_000, "1.0K"), (999, "999"), (10**12, "1.0T")])
def test_parameter_size_is_written_as_modelpack_writes_it(count, text):
    assert mp.param_size(count) == text


def test_the_model_config_says_what_the_checkpoint_says(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    store = LocalDirStore(str(tmp_path / "store"))
    manifest = snapshot(ckpt, store, chunk_size=SMALL_CHUNK).manifest
    doc = mp.model_config(manifest, {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, name="toy", layer_digests=["sha256:" + "0" * 64])
    tensors = [t for f in manifest.files for t in f.tensors]
    params = sum(__import__("math").prod(t.shape) for t in tensors)
    assert doc["config"] == {"architecture": "transformer", "format": "safetensors", "paramSize": mp.param_size(params), "precision": "float32,bfloat16"}
    assert doc["descriptor"] == {"revision": manifest.root, "name": "toy", "family": "llama"}
    assert doc["modelfs"] == {"type": "layers", "diffIds": ["sha256:" + "0" * 64]}
    bare = mp.model_config(manifest, None, name=None, layer_digests=[])
    assert "architecture" not in bare["config"] and bare["descriptor"] == {"revision": manifest.root}


def _manifest(layers: list[dict], artifact_type: str = mp.ARTIFACT_TYPE, config_type: str = mp.CONFIG_TYPE) -> dict:
    config = {"mediaType": config_type, "digest": "sha256:" + "1" * 64, "size": 2}
    return {"schemaVersion": 2, "mediaType": mp.MANIFEST_TYPE, "artifactType": artifact_type, "config": config, "layers": layers}


def _layer(path: str, media_type: str = mp.WEIGHT) -> dict:
    return {"mediaType": media_type, "digest": "sha256:" + "2" * 64, "size": 3, "annotations": {mp.FILEPATH: path}}


def test_a_model_manifest_gives_its_files():
    doc = _manifest([_layer("model.safetensors"), _layer("sub/config.json", mp.WEIGHT_CONFIG)])
    assert [p for p, _ in mp.check_model_manifest(doc, "r")] == ["model.safetensors", "sub/config.json"]


@pytest.mark.parametrize(
    "doc, says",
    [
        (_manifest([_layer("a")], artifact_type="application/vnd.example+json", config_type="application/vnd.oci.empty.v1+json"), "artifactType"),
        (_manifest([_layer("a")], config_type="application/vnd.oci.image.config.v1+json"), "artifactType"),
        (_manifest([]), "no layers"),
        (_manifest([_layer("a", "application/vnd.cncf.model.weight.v1.tar")]), "only unarchived"),
        (_manifest([{**_layer("a"), "annotations": {}}]), "no org.cncf.model.filepath"),
        (_manifest([{**_layer("a"), "digest": "sha512:" + "3" * 128}]), "only sha256"),
        ({**_manifest([_layer("a")]), "mediaType": "application/vnd.oci.image.index.v1+json"}, "not an OCI image manifest"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_what_is_not_a_model_is_refused(doc, says):
    with pytest.raises(OciNotAModelError, match=says):
        mp.check_model_manifest(doc, "reg/x:v1")


@pytest.mark.parametrize(
    "paths",
    [["../up.bin"], ["/etc/passwd"], ["a/./b"], ["a//b"], ["a\\b"], ["ok\x1b[2J"], ["x", "x"], ["a", "a/b"], [""]],
)
def test_a_path_that_escapes_or_collides_is_refused(paths):
    with pytest.raises(OciUnsafePathError) as info:
        mp.check_model_manifest(_manifest([_layer(p) for p in paths]), "reg/x:v1")
    assert isinstance(info.value, UnsafePathError) and "nothing was written" in str(info.value)


def test_credentials_from_the_environment_first_then_the_docker_config(tmp_path):
    docker = tmp_path / "docker"
    docker.mkdir()
    token = base64.b64encode(b"bob:from-config").decode()
    (docker / "config.json").write_text(
        json.dumps(
            {
                "auths": {
                    "https://reg.example:5000": {"auth": token},
                    "other.example": {"username": "u", "password": "p"},
                }
            }
        )
    )
    with patched_environ({"DOCKER_CONFIG": str(docker)}, CLEARED):
        c = find_credentials("reg.example:5000")
        assert (c.username, c.password, c.source) == ("bob", "from-config", str(docker / "config.json"))
        assert "from-config" not in repr(c)
        assert find_credentials("other.example").username == "u"
        assert find_credentials("unknown.example") is None
    with patched_environ({"DOCKER_CONFIG": str(docker), "CONCORD_REGISTRY_USERNAME": "eve", "CONCORD_REGISTRY_PASSWORD": "env"}):
        c = find_credentials("reg.example:5000")
        assert (c.username, c.password) == ("eve", "env") and "CONCORD_REGISTRY" in c.source
    (docker / "config.json").write_text("{not json")
    with patched_environ({"DOCKER_CONFIG": str(docker)}, CLEARED):
        assert find_credentials("reg.example:5000") is None


def test_an_export_needs_a_tag(tmp_path):
    from concord.oci import export_oci

    store = LocalDirStore(str(tmp_path / "store"))
    manifest = snapshot(make_checkpoint(tmp_path / "ckpt"), store, chunk_size=SMALL_CHUNK).manifest
    with pytest.raises(OciReferenceError, match="needs a tag"):
        export_oci(store, manifest, parse_reference("127.0.0.1:9/m@sha256:" + "a" * 64), plain_http=True)
