"""OCI interop against a real CNCF distribution registry (``docker-registry``) on 127.0.0.1:
``concord export oci`` publishes a snapshot as a ModelPack artifact, ``concord import oci`` brings
it back with the same root; bad input gets one line and leaves nothing behind; credentials
never show."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import requests
from servers import patched_environ, running_registry
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.cli import main
from concord.oci import modelpack as mp
from concord.oci.memo import MEMO_DIR, DigestMemo, content_key
from concord.oci.reference import parse_reference
from concord.oci.registry import Registry
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.stores.local import LocalDirStore

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "pa55-w0rd-never-shown"
CLEARED = ("CONCORD_REGISTRY_USERNAME", "CONCORD_REGISTRY_PASSWORD", "DOCKER_CONFIG")
ACCEPT = {"Accept": "application/vnd.oci.image.manifest.v1+json"}


@pytest.fixture(scope="module", autouse=True)
def concord_home(tmp_path_factory):
    """A home of the module's own: the exports' digest memo goes there, never into ``./data``."""
    with patched_environ({"CONCORD_HOME": str(tmp_path_factory.mktemp("concord-home"))}):
        yield


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """``host:port`` of a registry without authentication."""
    d = tmp_path_factory.mktemp("registry")
    with patched_environ({"DOCKER_CONFIG": str(d / "no-docker-config")}, CLEARED):
        with running_registry(d / "data", d / "registry.log") as address:
            yield address


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory):
    """``host:port`` of a registry asking for HTTP Basic credentials (htpasswd, bcrypt)."""
    d = tmp_path_factory.mktemp("auth-registry")
    with running_registry(d / "data", d / "registry.log", users={USER: PASSWORD}) as address:
        yield address


@pytest.fixture(scope="module")
def published(registry, tmp_path_factory):
    """A toy checkpoint (with a README) snapshotted under ref ``m/toy`` and exported to ``:v1``."""
    base = tmp_path_factory.mktemp("published")
    ckpt = make_checkpoint(base / "ckpt")
    (ckpt / "README.md").write_text("# toy model\n")
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    store = LocalDirStore(str(base / "store"))
    snap = snapshot(ckpt, store, ref="m/toy", chunk_size=SMALL_CHUNK)
    ref = f"{registry}/models/toy:v1"
    return {"ckpt": ckpt, "store": store, "root": snap.root, "ref": ref, "base": base}


def cli(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 and "--json" in argv else None), out + err


def get_manifest(address: str, repo: str, target: str) -> dict:
    r = requests.get(f"http://{address}/v2/{repo}/manifests/{target}", headers=ACCEPT, timeout=10)
    r.raise_for_status()
    return r.json()


def blob_path(data_dir: Path, digest: str) -> Path:
    hexd = digest.split(":")[1]
    return data_dir / "storage" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


def test_export_is_a_modelpack_artifact_and_import_gives_the_same_root(published, registry, tmp_path, capsys):
    code, r, _ = cli(capsys, "export", "oci", str(published["store"].root), "--ref", "m/toy", published["ref"], "--plain-http", "--json")
    assert code == 0
    assert set(r) >= {"reference", "digest", "layers", "bytes_uploaded"}
    assert r["root"] == published["root"] and r["layers"] == 5

    doc = get_manifest(registry, "models/toy", "v1")
    assert doc["mediaType"] == "application/vnd.oci.image.manifest.v1+json" and doc["schemaVersion"] == 2
    assert doc["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert doc["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    assert doc["annotations"][mp.ROOT] == published["root"]
    types = {layer["annotations"]["org.cncf.model.filepath"]: layer["mediaType"] for layer in doc["layers"]}
    assert types == {
        "README.md": "application/vnd.cncf.model.doc.v1.raw",
        "config.json": "application/vnd.cncf.model.weight.config.v1.raw",
        "model.safetensors": "application/vnd.cncf.model.weight.v1.raw",
        "sub/empty.bin": "application/vnd.cncf.model.weight.v1.raw",
        "tokenizer.txt": "application/vnd.cncf.model.weight.config.v1.raw",
    }
    # every layer blob is the file, byte for byte
    for layer in doc["layers"]:
        blob = requests.get(f"http://{registry}/v2/models/toy/blobs/{layer['digest']}", timeout=10).content
        path = published["ckpt"] / layer["annotations"]["org.cncf.model.filepath"]
        assert blob == path.read_bytes()
        assert layer["size"] == len(blob) and layer["digest"] == "sha256:" + hashlib.sha256(blob).hexdigest()
    config = requests.get(f"http://{registry}/v2/models/toy/blobs/{doc['config']['digest']}", timeout=10).json()
    assert config["modelfs"] == {"type": "layers", "diffIds": [layer["digest"] for layer in doc["layers"]]}
    assert config["config"]["format"] == "safetensors" and config["config"]["architecture"] == "transformer"
    assert set(config["config"]["precision"].split(",")) == {"float32", "bfloat16"}
    assert config["descriptor"]["family"] == "llama" and config["descriptor"]["name"] == "toy"

    target = tmp_path / "imported"
    code, r, _ = cli(capsys, "import", "oci", published["ref"], "--store", str(target), "--ref", "m/toy", "--plain-http", "--json")
    assert code == 0 and r["root"] == published["root"] and r["ref"] == "m/toy"
    store = LocalDirStore(str(target))
    assert store.read_ref("m/toy").root == published["root"]
    restore(store, load_manifest(store, published["root"]), tmp_path / "files")
    for f in published["ckpt"].rglob("*"):
        if f.is_file():
            assert (tmp_path / "files" / f.relative_to(published["ckpt"])).read_bytes() == f.read_bytes()


def test_a_new_version_uploads_only_the_changed_file(published, registry, tmp_path, capsys):
    store = published["store"]
    ref = f"{registry}/models/toy:v2"
    cli(capsys, "export", "oci", str(store.root), "--ref", "m/toy", ref, "--plain-http", "--json")
    ckpt2 = tmp_path / "ckpt2"
    shutil.copytree(published["ckpt"], ckpt2)
    (ckpt2 / "README.md").write_text("# toy model, second version\n")
    snapshot(ckpt2, store, ref="m/toy", chunk_size=SMALL_CHUNK)
    code, r, _ = cli(capsys, "export", "oci", str(store.root), "--ref", "m/toy", ref, "--plain-http", "--json")
    assert code == 0
    assert r["layers_uploaded"] == 1
    config_size = get_manifest(registry, "models/toy", "v2")["config"]["size"]
    assert r["bytes_uploaded"] == (ckpt2 / "README.md").stat().st_size + config_size
    # the same snapshot again sends nothing
    code, r, _ = cli(capsys, "export", "oci", str(store.root), "--ref", "m/toy", ref, "--plain-http", "--json")
    assert r["bytes_uploaded"] == 0


def test_signatures_travel_as_referrers(published, registry, tmp_path, capsys):
    from concord.trust import generate_key, load_policy, sign_root

    store, root = published["store"], published["root"]
    key = generate_key(tmp_path / "key.pem")
    sign_root(store, root, key, ref="m/toy")
    ref = f"{registry}/models/signed:v1"
    code, r, _ = cli(capsys, "export", "oci", str(store.root), "--ref", root, ref, "--plain-http", "--json")
    assert code == 0 and r["signatures"] == [key.id]
    index = requests.get(
        f"http://{registry}/v2/models/signed/manifests/{r['digest'].replace(':', '-')}",
        headers={"Accept": "application/vnd.oci.image.index.v1+json"}, timeout=10,
    ).json()
    sig = get_manifest(registry, "models/signed", index["manifests"][0]["digest"])
    assert sig["subject"]["digest"] == r["digest"] and sig["artifactType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    target = LocalDirStore(str(tmp_path / "imported"))
    code, r2, _ = cli(capsys, "import", "oci", ref, "--store", str(target.root), "--plain-http", "--json")
    assert code == 0 and r2["signatures"] == [key.id]
    # the imported root is trusted by the signer's key, as the original is
    policy = load_policy(str(tmp_path / "key.pub.pem"))
    assert policy.report(target, root).trusted and policy.report(target, root).signed_by == (key.id,)
    code, r3, _ = cli(capsys, "import", "oci", ref, "--store", str(tmp_path / "trusted"), "--ref", "m/signed",
                      "--trust", str(tmp_path / "key.pub.pem"), "--plain-http", "--json")
    assert code == 0 and r3["ref"] == "m/signed"
    # an unsigned artifact under a trust policy: refused, and the ref does not move
    other = tmp_path / "other"
    shutil.copytree(published["ckpt"], other)
    (other / "README.md").write_text("# an unsigned model\n")
    unsigned_root = snapshot(other, store, chunk_size=SMALL_CHUNK).root
    unsigned = f"{registry}/models/unsigned:v1"
    code, _, _ = cli(capsys, "export", "oci", str(store.root), "--ref", unsigned_root, unsigned, "--plain-http", "--json")
    assert code == 0
    code, _, text = cli(capsys, "import", "oci", unsigned, "--store", str(tmp_path / "strict"), "--ref", "m/unsigned",
                        "--trust", str(tmp_path / "key.pub.pem"), "--plain-http")
    assert code == 13 and text.count("\n") == 1 and unsigned_root in text
    assert LocalDirStore(str(tmp_path / "strict")).read_ref("m/unsigned") is None


def test_credentials_from_the_environment_or_docker_config_never_shown(published, auth_registry, tmp_path, capsys):
    src = str(published["store"].root)
    ref = f"{auth_registry}/models/toy:v1"
    with patched_environ({"DOCKER_CONFIG": str(tmp_path / "none")}, CLEARED):
        code, _, text = cli(capsys, "export", "oci", src, "--ref", "m/toy", ref, "--plain-http", "--json")
        assert code == 1 and "asks for credentials" in text and "CONCORD_REGISTRY_USERNAME" in text
    with patched_environ({"CONCORD_REGISTRY_USERNAME": USER, "CONCORD_REGISTRY_PASSWORD": "wrong-" + PASSWORD, "DOCKER_CONFIG": str(tmp_path / "none")}):
        code, _, text = cli(capsys, "export", "oci", src, "--ref", "m/toy", ref, "--plain-http", "--json")
        assert code == 1 and "refused the credentials of user 'alice'" in text and PASSWORD not in text
    with patched_environ({"CONCORD_REGISTRY_USERNAME": USER, "CONCORD_REGISTRY_PASSWORD": PASSWORD}):
        code, pushed, text = cli(capsys, "export", "oci", src, "--ref", "m/toy", ref, "--plain-http", "--json")
        assert code == 0 and pushed["layers"] == 5 and PASSWORD not in text
    docker = tmp_path / "docker"
    docker.mkdir()
    token = __import__("base64").b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {auth_registry: {"auth": token}}}))
    with patched_environ({"DOCKER_CONFIG": str(docker)}, CLEARED):
        code, r, text = cli(capsys, "import", "oci", ref, "--store", str(tmp_path / "in"), "--plain-http", "--json")
        assert code == 0 and r["root"] == pushed["root"]
        assert PASSWORD not in text and token not in text


def test_bad_input_gets_one_line_and_leaves_nothing(published, registry, tmp_path, capsys):
    src = str(published["store"].root)
    target = tmp_path / "target"

    def refused(*argv: str, exit_code: int = 1) -> str:
        code, _, text = cli(capsys, *argv)
        assert code == exit_code and text.startswith("concord: error: ") and text.count("\n") == 1, text
        assert not (target / "refs").exists() or not list((target / "refs").rglob("*"))
        return text

    assert "does not answer" in refused("import", "oci", "127.0.0.1:9/models/toy:v1", "--store", str(target), "--plain-http", exit_code=14)
    assert "--plain-http" in refused("export", "oci", src, "--ref", "m/toy", f"{registry}/models/toy:v1", exit_code=14)
    assert "no such manifest" in refused("import", "oci", f"{registry}/models/toy:missing", "--store", str(target), "--plain-http", exit_code=10)

    reg = Registry(parse_reference(f"{registry}/models/other:v1"), plain_http=True)
    empty = b"{}"
    reg.put_blob("sha256:" + hashlib.sha256(empty).hexdigest(), 2, lambda: [empty])
    layer = b"not a model"
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    reg.put_blob(layer_digest, len(layer), lambda: [layer])

    def push(tag: str, artifact_type: str, config_type: str, path: str) -> None:
        doc = {
            "schemaVersion": 2, "mediaType": mp.MANIFEST_TYPE, "artifactType": artifact_type,
            "config": {"mediaType": config_type, "digest": "sha256:" + hashlib.sha256(empty).hexdigest(), "size": 2},
            "layers": [{"mediaType": mp.WEIGHT, "digest": layer_digest, "size": len(layer), "annotations": {mp.FILEPATH: path}}],
        }
        reg.put_manifest(json.dumps(doc).encode(), tag)

    push("image", "application/vnd.example.thing", "application/vnd.oci.empty.v1+json", "x.bin")
    assert "not a ModelPack model artifact" in refused("import", "oci", f"{registry}/models/other:image", "--store", str(target), "--plain-http")
    for i, evil in enumerate(("../escape.bin", "/etc/passwd", "a/../../b.bin", "ok/\x1b[31m.bin")):
        push(f"evil{i}", mp.ARTIFACT_TYPE, mp.CONFIG_TYPE, evil)
        assert "refusing layer file path" in refused("import", "oci", f"{registry}/models/other:evil{i}", "--store", str(target), "--plain-http")
    assert not (tmp_path / "escape.bin").exists() and not target.exists()
    reg.close()


def test_a_layer_whose_bytes_do_not_match_its_digest_is_refused(published, tmp_path, tmp_path_factory, capsys):
    d = tmp_path_factory.mktemp("corrupt-registry")
    with patched_environ({"DOCKER_CONFIG": str(d / "none")}, CLEARED), running_registry(d / "data", d / "registry.log") as address:
        ref = f"{address}/models/toy:v1"
        code, r, _ = cli(capsys, "export", "oci", str(published["store"].root), "--ref", "m/toy", ref, "--plain-http", "--json")
        assert code == 0
        doc = get_manifest(address, "models/toy", "v1")
        layer = next(x for x in doc["layers"] if x["annotations"][mp.FILEPATH] == "tokenizer.txt")
        data = blob_path(d / "data", layer["digest"])
        damaged = bytearray(data.read_bytes())
        damaged[100] ^= 0xFF
        data.write_bytes(bytes(damaged))
        target = tmp_path / "target"
        code, _, text = cli(capsys, "import", "oci", ref, "--store", str(target), "--ref", "m/toy", "--plain-http")
        assert code == 15 and "hashes to" in text and "tokenizer.txt" in text
        assert not (target / "refs").exists() or not list((target / "refs").rglob("*"))
        assert not (target / "manifests").exists() or not list((target / "manifests").iterdir())


def test_other_oci_tools_read_the_artifact(published, registry, tmp_path, capsys):
    """The oras SDK pulls a Concord export into the same folder layout (by each layer's title)."""
    import oras.client

    ref = f"{registry}/models/interop:v1"
    code, r, _ = cli(capsys, "export", "oci", str(published["store"].root), "--ref", published["root"], ref, "--plain-http", "--json")
    assert code == 0
    oras.client.OrasClient(hostname=registry, insecure=True).pull(target=ref, outdir=str(tmp_path / "pulled"))
    for f in published["ckpt"].rglob("*"):
        if f.is_file():
            assert (tmp_path / "pulled" / f.relative_to(published["ckpt"])).read_bytes() == f.read_bytes()


# --------------------------------------------------------------------------- the digest memo


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def export_json(capsys, store, root: str, ref: str, *extra: str) -> dict:
    code, r, text = cli(capsys, "export", "oci", str(store.root), "--ref", root, ref, "--plain-http", "--json", *extra)
    assert code == 0, text
    return r


def layers_are_the_files(address: str, repo: str, tag: str, folder: Path) -> dict[str, str]:
    """Every layer of ``repo:tag`` is its file byte for byte, named by the SHA-256 of those bytes."""
    digests = {}
    for layer in get_manifest(address, repo, tag)["layers"]:
        path = layer["annotations"][mp.FILEPATH]
        data = (folder / path).read_bytes()
        assert layer["digest"] == sha256_of(data), path
        assert requests.get(f"http://{address}/v2/{repo}/blobs/{layer['digest']}", timeout=10).content == data
        digests[path] = layer["digest"]
    return digests


def blob_exists(address: str, repo: str, digest: str) -> bool:
    return requests.head(f"http://{address}/v2/{repo}/blobs/{digest}", timeout=10).status_code == 200


def v2_of(published, tmp_path: Path, readme: str = "# toy model, memo version\n") -> tuple[Path, str]:
    folder = tmp_path / "v2"
    shutil.copytree(published["ckpt"], folder)
    (folder / "README.md").write_text(readme)
    return folder, snapshot(folder, published["store"], chunk_size=SMALL_CHUNK).root


def test_a_second_export_hashes_only_the_changed_file(published, registry, tmp_path, capsys):
    store, root = published["store"], published["root"]
    with patched_environ({"CONCORD_HOME": str(tmp_path / "home")}):
        first = export_json(capsys, store, root, f"{registry}/models/memo:v1")
        assert first["bytes_hashed"] == first["bytes"] and first["layers_remembered"] == 0
        assert (tmp_path / "home" / MEMO_DIR).is_dir()
        folder, root2 = v2_of(published, tmp_path)
        second = export_json(capsys, store, root2, f"{registry}/models/memo:v2")
        readme = (folder / "README.md").stat().st_size
        assert second["bytes_hashed"] == readme
        assert second["layers_remembered"] == 3  # all but the README and the empty file
        assert second["layers_uploaded"] == 1
        layers_are_the_files(registry, "models/memo", "v2", folder)
        # into a repository that holds none of it: remembered digests, every blob uploaded and checked on the way
        fresh = export_json(capsys, store, root2, f"{registry}/models/memo-fresh:v2")
        assert fresh["bytes_hashed"] == 0 and fresh["layers_remembered"] == 4 and fresh["layers_uploaded"] == 5
        layers_are_the_files(registry, "models/memo-fresh", "v2", folder)
        # --no-memo, and the environment variable, hash every file again
        assert export_json(capsys, store, root2, f"{registry}/models/memo:v2", "--no-memo")["bytes_hashed"] == second["bytes"]
        with patched_environ({"CONCORD_NO_OCI_MEMO": "1"}):
            assert export_json(capsys, store, root2, f"{registry}/models/memo:v2")["bytes_hashed"] == second["bytes"]


def test_a_wrong_memo_entry_never_publishes_a_wrong_digest_for_bytes_it_uploads(published, registry, tmp_path, capsys):
    store, root = published["store"], published["root"]
    home = tmp_path / "home"
    with patched_environ({"CONCORD_HOME": str(home)}):
        export_json(capsys, store, root, f"{registry}/models/wrong:v1")
        files = load_manifest(store, root).by_path
        ckpt = published["ckpt"]
        memo = DigestMemo(home / MEMO_DIR)
        tokenizer = (ckpt / "tokenizer.txt").read_bytes()
        # the tokenizer: a digest no registry holds; the config: the README's, a blob of another size
        lie = sha256_of(b"not the tokenizer")
        memo.put(content_key(files["tokenizer.txt"]), files["tokenizer.txt"].size, lie)
        memo.put(content_key(files["config.json"]), files["config.json"].size, sha256_of((ckpt / "README.md").read_bytes()))
        memo.save()
        for repo in ("models/wrong-fresh", "models/wrong"):  # the blobs missing, then there
            r = export_json(capsys, store, root, f"{registry}/{repo}:v1")
            assert layers_are_the_files(registry, repo, "v1", ckpt)["tokenizer.txt"] == sha256_of(tokenizer)
            assert not blob_exists(registry, repo, lie)
        # the bytes contradicted the first entry, the registry's size the second: both dropped and rewritten
        assert r["bytes_hashed"] == 0
        memo = DigestMemo(home / MEMO_DIR)
        assert memo.get(content_key(files["tokenizer.txt"]), files["tokenizer.txt"].size) == sha256_of(tokenizer)
        assert memo.get(content_key(files["config.json"]), files["config.json"].size) == sha256_of((ckpt / "config.json").read_bytes())


def test_a_poisoned_memo_at_worst_publishes_an_artifact_import_refuses(registry, tmp_path, capsys):
    """An entry naming another blob of the same size that the registry holds is not re-checked
    (the export reads nothing of the file): the manifest then names that blob, and an import
    refuses the artifact, writing nothing."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"a" * 1000)
    (folder / "b.txt").write_bytes(b"b" * 1000)
    store = LocalDirStore(str(tmp_path / "store"))
    root = snapshot(folder, store, chunk_size=SMALL_CHUNK).root
    home = tmp_path / "home"
    with patched_environ({"CONCORD_HOME": str(home)}):
        ref = f"{registry}/models/poisoned"
        export_json(capsys, store, root, ref + ":v1")
        a = load_manifest(store, root).by_path["a.txt"]
        memo = DigestMemo(home / MEMO_DIR)
        memo.put(content_key(a), a.size, sha256_of(b"b" * 1000))
        memo.save()
        export_json(capsys, store, root, ref + ":v2")
    target = tmp_path / "target"
    code, _, text = cli(capsys, "import", "oci", ref + ":v2", "--store", str(target), "--ref", "m/poisoned", "--plain-http")
    assert code != 0 and text.count("\n") == 1 and root in text, text
    assert not target.exists() or not (target / "refs").exists() or not list((target / "refs").rglob("*"))
    code, _, text = cli(capsys, "import", "oci", ref + ":v1", "--store", str(target), "--ref", "m/poisoned", "--plain-http")
    assert code == 0, text


def test_a_damaged_memo_is_ignored(published, registry, tmp_path, capsys):
    store, root = published["store"], published["root"]
    home = tmp_path / "home"
    with patched_environ({"CONCORD_HOME": str(home)}):
        total = export_json(capsys, store, root, f"{registry}/models/damaged:v1")["bytes"]
        shards = sorted((home / MEMO_DIR).iterdir())
        assert len(shards) >= 3
        # one line's digest changed (its check no longer holds), one shard cut short, one not a memo at all
        lines = shards[0].read_text().split("\n")
        digest = lines[1].split(" ")[2]
        lines[1] = lines[1].replace(digest, digest[::-1])
        shards[0].write_text("\n".join(lines))
        shards[1].write_bytes(shards[1].read_bytes()[:120])
        for shard in shards[2:]:
            shard.write_bytes(b"\xff\x00" * 64)
        r = export_json(capsys, store, root, f"{registry}/models/damaged:v1")
        assert r["bytes_hashed"] == total and r["layers_remembered"] == 0
        layers_are_the_files(registry, "models/damaged", "v1", published["ckpt"])
        # rewritten whole: the next export hashes nothing
        assert export_json(capsys, store, root, f"{registry}/models/damaged:v1")["bytes_hashed"] == 0
