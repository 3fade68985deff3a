"""``concord import oci`` under a threshold policy, against a real CNCF distribution registry on
127.0.0.1: every cluster's signature travels with the export as a referrer, and the import moves
its ref only when two distinct trusted cluster keys signed the imported root (a forged second
signature, one over another root, or one key twice does not count: export already refuses to
publish the last two, import refuses a bundle that does not verify)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from servers import patched_environ, running_registry
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.cli import main
from concord.snapshots.snapshot import snapshot
from concord.stores.local import LocalDirStore
from concord.trust import read_signature, sign_root, signature_key

sys.path.append(str(Path(__file__).parents[1] / "unit" / "trust"))
from quorum_keys import CLUSTERS, forge, key, make_cluster_keys  # noqa: E402

pytestmark = pytest.mark.integration

CLEARED = ("CONCORD_REGISTRY_USERNAME", "CONCORD_REGISTRY_PASSWORD", "DOCKER_CONFIG", "CONCORD_TRUSTED_KEYS", "CONCORD_TRUST_THRESHOLD")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    d = tmp_path_factory.mktemp("registry")
    with patched_environ({"DOCKER_CONFIG": str(d / "no-docker-config"), "CONCORD_HOME": str(d / "home")}, CLEARED):
        with running_registry(d / "data", d / "registry.log") as address:
            yield address


@pytest.fixture(scope="module")
def clusters(tmp_path_factory) -> Path:
    return make_cluster_keys(tmp_path_factory.mktemp("cluster-keys"))



@pytest.mark.parametrize("case", ["forged", "other-root", "same-key-twice", "two-valid"])
def test_import_oci_needs_two_distinct_cluster_signatures(case, registry, clusters, tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    store = LocalDirStore(str(tmp_path / "store"))
    root = snapshot(ckpt, store, ref="m/toy", chunk_size=SMALL_CHUNK).root
    (ckpt / "extra.txt").write_text("another release")
    other = snapshot(ckpt, store, chunk_size=SMALL_CHUNK).root
    us, eu = key(clusters, "us-east"), key(clusters, "eu-central")
    sign_root(store, root, us)
    if case == "two-valid":
        sign_root(store, root, eu)
    elif case == "forged":
        _, data = sign_root(store, root, eu)
        store.put_document(signature_key(root, eu.id), forge(data), overwrite=True)
    elif case == "other-root":
        _, data = sign_root(store, other, eu)
        store.put_document(signature_key(root, eu.id), data)
    else:
        store.put_document(signature_key(root, eu.id), read_signature(store, root, us.id))
    ref = f"{registry}/models/{case}:v1"
    code = main(["export", "oci", str(store.root), "--ref", root, ref, "--plain-http", "--json"])
    _, err = capsys.readouterr()
    if case in ("other-root", "same-key-twice"):  # a bundle over another root, or filed under another key: never published
        assert code == 13 and err.count("\n") == 1 and ("another key" in err or "names only" in err or "filed under" in err), err
        return
    assert code == 0, err
    target = tmp_path / "imported"
    code = main(["import", "oci", ref, "--store", str(target), "--ref", "m/imported", "--trust", str(clusters / "policy.yaml"), "--plain-http"])
    out, err = capsys.readouterr()
    trusted = case == "two-valid"
    assert (code == 0) is trusted, (case, out, err)
    assert (LocalDirStore(str(target)).read_ref("m/imported") is not None) is trusted
    if not trusted:
        assert code == 13 and err.count("\n") == 1, err
    # the same artifact under --trust-threshold 1 beside the keys: one good signature is enough,
    # except that an attached bundle that does not verify at all fails the import outright
    keys = ",".join(str(clusters / f"{n}.pub.pem") for n in CLUSTERS)
    code = main(["import", "oci", ref, "--store", str(tmp_path / "one"), "--ref", "m/one", "--trust", keys, "--trust-threshold", "1", "--plain-http"])
    _, err = capsys.readouterr()
    assert (code == 0) is (case != "forged"), err
