"""``models:/NAME@ALIAS`` gives the weights: a Concord model version registered on a real
``mlflow server`` is downloaded by a plain MLflow client (another process, which imports nothing of
Concord itself) through the ``concord://`` artifact repository: the checkpoint's files,
byte-identical to the snapshot, from a folder store or an S3 store on ``moto_server``; under a trust
policy an unsigned or wrongly signed root is refused with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from concord import api
from concord.errors import LineageError, ModelFileNotFoundError, ReadOnlyArtifactsError
from concord.lineage import Lineage
from concord.lineage.sources import parse_source, snapshot_uri
from concord.stores import LocalDirStore
from concord.trust import generate_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REF = "models/minilm"

#: a plain MLflow client: what a notebook does to fetch released weights by name and alias, here
#: for each job of a JSON list (uri, dst and the environment variables it adds)
CLIENT = textwrap.dedent(
    """
    import json, os, sys
    import mlflow

    answers = []
    for job in json.loads(sys.argv[1]):
        os.environ.pop("CONCORD_TRUSTED_KEYS", None)
        os.environ.update(job["env"])
        try:
            got = mlflow.artifacts.download_artifacts(job["uri"], dst_path=job["dst"])
            listed = [(f.path, f.is_dir, f.file_size) for f in mlflow.artifacts.list_artifacts(job["uri"])]
        except Exception as exc:
            answers.append({"error": type(exc).__name__, "message": str(exc)})
        else:
            answers.append({"path": got, "listed": listed})
    print(json.dumps(answers))
    """
)


def mlflow_client(tracking: str, *jobs: tuple[str, Path] | tuple[str, Path, dict[str, str]]) -> list[dict]:
    """Run :data:`CLIENT` in one fresh process against ``tracking`` for each ``(uri, dst[, env])``;
    its answer to each: ``{"path", "listed"}``, or ``{"error", "message"}``."""
    environ = {k: v for k, v in os.environ.items() if k not in ("CONCORD_TRUSTED_KEYS", "CONCORD_TRUST_THRESHOLD")}
    environ["MLFLOW_TRACKING_URI"] = tracking
    listed = json.dumps([{"uri": j[0], "dst": str(j[1]), "env": j[2] if len(j) > 2 else {}} for j in jobs])
    done = subprocess.run([sys.executable, "-c", CLIENT, listed], capture_output=True, text=True, env=environ, timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert done.returncode == 0 and lines, f"no answer from the client (exit {done.returncode}): {done.stderr[-3000:]}"
    answers = json.loads(lines[-1])
    assert len(answers) == len(jobs)
    return answers


def small_model(folder: Path) -> Path:
    """A small safetensors checkpoint with its config and a tokenizer folder, of its own (no other
    test registers the same root, whose replicas lineage would then list)."""
    rng = np.random.default_rng(uuid.uuid4().int)
    (folder / "tokenizer").mkdir(parents=True)
    save_file(
        {"embeddings.weight": rng.standard_normal((512, 64)).astype(np.float32), "layer.0.bias": rng.standard_normal(64).astype(np.float16)},
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text('{"hidden_size": 64, "model_type": "bert"}')
    (folder / "tokenizer" / "vocab.txt").write_text("[PAD]\n[CLS]\nhello\n")
    return folder


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def model(tmp_path) -> Path:
    return small_model(tmp_path / "minilm")


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path, monkeypatch):
    """Where the snapshot lies: a folder, or an S3 bucket on moto_server (whose endpoint the
    MLflow client finds in AWS_ENDPOINT_URL, as every S3 client does)."""
    if request.param == "folder":
        return LocalDirStore(tmp_path / "stores" / "us-east")
    s3 = request.getfixturevalue("s3_store")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    return s3


def register(tracking: str, store, model: Path, *holders) -> dict:
    """Snapshot ``model`` into ``store``, register it as a new model and point ``champion`` at it."""
    root = api.snapshot(model, store, ref=REF, progress=False).root
    name = f"minilm-{uuid.uuid4().hex[:8]}"
    lineage = Lineage(tracking)
    out = lineage.register_model_version(name, root, [store, *holders])
    lineage.client.set_registered_model_alias(name, "champion", out["version"])
    return out


def test_models_uri_downloads_the_checkpoint_byte_identical(mlflow_server, store, model, tmp_path):
    out = register(mlflow_server, store, model)
    mv = Lineage(mlflow_server).client.get_model_version(out["name"], out["version"])
    # the source names the snapshot and its store, nothing of this machine beyond the store
    assert mv.source == snapshot_uri(out["root"], [store.uri]) == out["source"]
    assert parse_source(mv.source).stores == (store.uri,) and socket.gethostname() not in mv.source
    # the tags read as a person reads them, and the detail the code needs is still there
    assert mv.tags["held_by"] == ("us-east (hot)" if isinstance(store, LocalDirStore) else "store (hot)")
    assert json.loads(mv.tags["replicas"]) == [{"store": store.uri, "tier": "hot"}]

    name, version = out["name"], out["version"]
    whole, one, missing = mlflow_client(
        mlflow_server,
        (f"models:/{name}@champion", tmp_path / "D"),
        (f"models:/{name}/{version}/tokenizer/vocab.txt", tmp_path / "E"),  # by number, a sub-path: that file alone
        (f"models:/{name}/{version}/tokenizer.json", tmp_path / "F"),
    )
    assert Path(whole["path"]) == tmp_path / "D", whole
    assert files_of(tmp_path / "D") == files_of(model)  # every file, byte for byte; nothing else
    assert sorted(whole["listed"]) == [
        ["config.json", False, (model / "config.json").stat().st_size],
        ["model.safetensors", False, (model / "model.safetensors").stat().st_size],
        ["tokenizer", True, None],
    ]
    assert Path(one["path"]) == tmp_path / "E" / "tokenizer" / "vocab.txt", one
    assert files_of(tmp_path / "E") == {"tokenizer/vocab.txt": (model / "tokenizer" / "vocab.txt").read_bytes()}
    # a path the snapshot lacks is one clear error naming its files
    assert missing["error"] == "ModelFileNotFoundError", missing
    assert "has no file or folder 'tokenizer.json'" in missing["message"] and "config.json" in missing["message"]


def test_untrusted_root_is_refused_and_nothing_written(mlflow_server, store, tmp_path):
    release = generate_key(tmp_path / "keys" / "release.pem")
    intruder = generate_key(tmp_path / "keys" / "intruder.pem")
    trust = {"CONCORD_TRUSTED_KEYS": str(tmp_path / "keys" / "release.pub.pem")}
    unsigned, forged, released = (register(mlflow_server, store, small_model(tmp_path / n)) for n in ("unsigned", "forged", "released"))
    api.sign(store, intruder, root=forged["root"], progress=False)  # signed, by a key not trusted
    api.sign(store, release, root=released["root"], progress=False)

    answers = mlflow_client(
        mlflow_server,
        *((f"models:/{v['name']}@champion", tmp_path / "D" / n, trust) for n, v in (("unsigned", unsigned), ("forged", forged), ("released", released))),
        (f"models:/{unsigned['name']}@champion", tmp_path / "D" / "no-policy"),
    )
    for (n, v), got in zip((("unsigned", unsigned), ("forged", forged)), answers):
        assert got.get("error") == "UntrustedRootError", got
        assert v["root"] in got["message"] and "not signed by a trusted key" in got["message"]
        assert not any((tmp_path / "D" / n).iterdir())  # nothing written
    assert files_of(tmp_path / "D" / "released") == files_of(tmp_path / "released"), answers[2]
    # without a policy nothing is checked, as for the CLI
    assert files_of(tmp_path / "D" / "no-policy") == files_of(tmp_path / "unsigned"), answers[3]


def test_a_replica_lineage_records_later_serves_when_the_first_store_is_gone(mlflow_server, model, tmp_path):
    us, eu = LocalDirStore(tmp_path / "stores" / "us-east"), LocalDirStore(tmp_path / "stores" / "eu-west")
    out = register(mlflow_server, us, model)
    api.sync(us, [eu], root=out["root"], progress=False)
    Lineage(mlflow_server).record_replica(out["root"], eu, "warm")
    mv = Lineage(mlflow_server).client.get_model_version(out["name"], out["version"])
    assert mv.tags["held_by"] == "eu-west (warm), us-east (hot)"
    assert mv.source == out["source"]  # a source never changes: the replica is in the lineage
    shutil.rmtree(us.root)  # us-east is gone (or out of reach from here)

    (got,) = mlflow_client(mlflow_server, (f"models:/{out['name']}@champion", tmp_path / "D"))
    assert "error" not in got, got
    assert files_of(tmp_path / "D") == files_of(model)


def test_a_version_registered_before_concord_uris_downloads_the_weights(mlflow_server, model, tmp_path):
    """Versions registered on a server before ``concord://`` name the folder's manifest as
    ``concord-file://HOST/…/manifests/<root>.json``: that URI gives the weights too."""
    store = LocalDirStore(tmp_path / "stores" / "us-east")
    root = api.snapshot(model, store, ref=REF, progress=False).root
    name = f"minilm-old-{uuid.uuid4().hex[:8]}"
    client = Lineage(mlflow_server).client
    client.create_registered_model(name)
    manifest = Path(os.path.realpath(store.root)) / "manifests" / f"{root}.json"
    client.create_model_version(name, f"concord-file://{socket.gethostname()}{manifest}", tags={
        "root": root, "store": store.uri, "held_by": json.dumps([{"store": store.uri, "tier": "hot"}]),
    })
    assert Lineage(mlflow_server).model_lineage(name, 1)["replicas"] == [{"store": store.uri, "tier": "hot"}]

    (got,) = mlflow_client(mlflow_server, (f"models:/{name}/1", tmp_path / "D"))
    assert "error" not in got, got
    assert files_of(tmp_path / "D") == files_of(model)


def test_concord_uris_are_read_only_and_name_their_snapshot(mlflow_quiet, model, tmp_path):
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    store = LocalDirStore(tmp_path / "stores" / "us-east")
    root = api.snapshot(model, store, ref=REF, progress=False).root
    repo = get_artifact_repository(snapshot_uri(root, [store.uri]))
    with pytest.raises(ReadOnlyArtifactsError, match="read-only"):
        repo.log_artifact(str(model / "config.json"))
    with pytest.raises(ReadOnlyArtifactsError):
        repo.log_artifacts(str(model))
    with pytest.raises(ModelFileNotFoundError, match="weights.bin"):
        repo.download_artifacts("weights.bin", str(tmp_path))
    (tmp_path / "out").mkdir()
    assert Path(repo.download_artifacts("config.json", str(tmp_path / "out"))).read_bytes() == (model / "config.json").read_bytes()


def test_a_damaged_copy_is_never_handed_out(mlflow_quiet, model, tmp_path):
    """Every chunk is checked as it is read: a damaged copy in the nearest store is passed over
    for the next store that holds the snapshot, and with none left the download fails, leaving
    nothing in the destination."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    us, eu = LocalDirStore(tmp_path / "stores" / "us-east"), LocalDirStore(tmp_path / "stores" / "eu-west")
    root = api.snapshot(model, us, ref=REF, progress=False).root
    api.sync(us, [eu], root=root, progress=False)
    chunks = sorted((Path(us.root) / "chunks").rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0)
    biggest = chunks[-1]
    biggest.chmod(0o644)
    damaged = bytearray(biggest.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    biggest.write_bytes(bytes(damaged))

    (tmp_path / "D").mkdir()
    repo = get_artifact_repository(snapshot_uri(root, [us.uri, eu.uri]))
    assert repo.download_artifacts("", str(tmp_path / "D")) == str(tmp_path / "D")
    assert files_of(tmp_path / "D") == files_of(model)

    (tmp_path / "E").mkdir()
    with pytest.raises(LineageError, match="could not be read from any store") as caught:
        get_artifact_repository(snapshot_uri(root, [us.uri])).download_artifacts("", str(tmp_path / "E"))
    assert us.uri in str(caught.value)
    assert list((tmp_path / "E").iterdir()) == []
