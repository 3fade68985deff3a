"""Quorum trust: three cluster keys, a threshold of two, and every consumer of ``--trust``.

A root counts as trusted only when at least ``threshold`` *distinct* trusted keys signed *this*
root. Each case is tried through every command that takes ``--trust`` (verify, signatures,
restore, sync, checkout, tier restore, audit replicas, audit model, log) with a policy file and with
``--trust-threshold`` beside a key list: one valid signature plus a forged one, plus one over
another root, plus one by a key outside the policy, or one key's signature twice, is refused and
nothing is written; two valid ones are trusted. Every bundle a cluster adds with ``concord sign``
stays a bundle the real ``model_signing`` verifies on its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from oms_interop import import_model_signing
from quorum_keys import CLUSTERS, forge, key
from test_tier_trust import policy_doc

from concord.cli import main
from concord.errors import TrustPolicyError, UntrustedRootError
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.stores import LocalDirStore
from concord.tiering.engine import TierState, add_checkpoint
from concord.tiering.policy import TierPolicy
from concord.trust import ENV, TrustPolicy, load_policy, read_signature, sign_root, signature_key
from concord.trust.policy import THRESHOLD

UNTRUSTED = UntrustedRootError.exit_code
#: every way a second signature can fail to count, and the one where it counts
REFUSED = ("forged", "other-root", "outsider", "same-key-twice")
CASES = (*REFUSED, "two-valid")


@pytest.fixture(autouse=True)
def no_env_policy(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("CONCORD_TRUST_THRESHOLD", raising=False)


@pytest.fixture
def release(tmp_path: Path, model: Path):
    """A checkpoint tiered into hot (and copied to a second cluster), plus another root in both:
    (tier policy file, hot store, second store, ref, root, other root)."""
    doc = policy_doc(tmp_path)
    policy = TierPolicy.from_dict(doc)
    assert add_checkpoint(policy, model, "step-1", gc=False).sweep.ok
    (tmp_path / "tiers.yaml").write_text(json.dumps(doc))  # JSON is YAML
    hot = policy.tier("hot").open()
    root = TierState.read(policy).held["hot"]["step-1"]
    ref = policy.ref("step-1")
    other_dir = tmp_path / "other-model"
    shutil.copytree(model, other_dir)
    (other_dir / "config.json").write_text('{"hidden": 99}')
    other = snapshot(other_dir, hot, ref="models/other").root
    second = LocalDirStore(tmp_path / "second")
    replicate(hot, [second], ref=ref)
    replicate(hot, [second], ref="models/other")
    return tmp_path / "tiers.yaml", hot, second, ref, root, other



def arrange(case: str, stores, root: str, other: str, clusters: Path) -> None:
    """us-east signs ``root`` validly in each store; the second signature is the case's."""
    us, eu = key(clusters, "us-east"), key(clusters, "eu-central")
    for store in stores:
        sign_root(store, root, us)
        if case == "two-valid":
            sign_root(store, root, eu)  # co-signing: a second bundle beside the first
        elif case == "forged":
            _, data = sign_root(store, root, eu)
            store.put_document(signature_key(root, eu.id), forge(data), overwrite=True)
        elif case == "other-root":
            _, data = sign_root(store, other, eu)
            store.put_document(signature_key(root, eu.id), data)  # a genuine bundle over another root
        elif case == "outsider":
            _, data = sign_root(store, root, key(clusters, "outsider"))
            store.put_document(signature_key(root, eu.id), data)  # claims eu-central's name
        elif case == "same-key-twice":
            again = LocalDirStore(Path(store.root).parent / f"scratch-{Path(store.root).name}")
            shutil.copytree(store.root, again.root, dirs_exist_ok=True)
            _, data = sign_root(again, root, us)  # a second, fresh us-east signature
            store.put_document(signature_key(root, eu.id), data)
            store.put_document(signature_key(root, "ab" * 32), read_signature(store, root, us.id))
        else:  # pragma: no cover
            raise AssertionError(case)


def specs(clusters: Path) -> dict[str, list[str]]:
    """The two spellings of one policy: a policy file, and keys with --trust-threshold."""
    keys = ",".join(str(clusters / f"{n}.pub.pem") for n in CLUSTERS)
    return {"file": ["--trust", str(clusters / "policy.yaml")], "threshold": ["--trust", keys, "--trust-threshold", "2"]}


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- every consumer


def c_verify(capsys, trust, rel, tmp_path):
    _, hot, _, _, root, _ = rel
    code, out, err = cli(capsys, "verify", hot.uri, "--root", root, "--json", *trust)
    doc = json.loads(out)
    assert doc["trust"][0]["trusted"] is (code == 0) if "trust" in doc else doc["trusted"] is (code == 0)
    return code == 0


def c_signatures(capsys, trust, rel, tmp_path):
    _, hot, _, _, root, _ = rel
    code, out, _ = cli(capsys, "signatures", hot.uri, "--root", root, "--json", *trust)
    assert json.loads(out)["trusted"] is (code == 0)
    return code == 0


def c_restore(capsys, trust, rel, tmp_path):
    _, hot, _, ref, _, _ = rel
    code, _, _ = cli(capsys, "restore", hot.uri, "--ref", ref, tmp_path / "restored", *trust)
    assert (tmp_path / "restored").exists() is (code == 0)
    return code == 0


def c_sync(capsys, trust, rel, tmp_path):
    _, hot, _, ref, root, _ = rel
    code, _, _ = cli(capsys, "sync", hot.uri, tmp_path / "synced", "--ref", ref, *trust)
    target = LocalDirStore(tmp_path / "synced")
    assert (target.read_ref(ref) is not None) is (code == 0)
    return code == 0


def c_checkout(capsys, trust, rel, tmp_path):
    _, hot, _, ref, _, _ = rel
    code, _, _ = cli(capsys, "checkout", hot.uri, tmp_path / "node" / "current", "--ref", ref, *trust)
    assert (tmp_path / "node" / "current").exists() is (code == 0)
    return code == 0


def c_tier_restore(capsys, trust, rel, tmp_path):
    tiers = rel[0]
    out = tmp_path / "from-tier"
    code, _, _ = cli(capsys, "tier", "restore", "step-1", out, "--tier", "hot", "--policy", tiers, *trust)
    assert out.exists() is (code == 0)
    return code == 0


def c_audit(capsys, trust, rel, tmp_path):
    _, hot, second, ref, _, _ = rel
    code, out, _ = cli(capsys, "audit", "replicas", "--ref", ref, hot.uri, second.uri, "--json", *trust)
    trusted = [r["trusted"] for r in json.loads(out)["replicas"]["replicas"]]
    assert len(set(trusted)) == 1 and (code == 3) is (not trusted[0])
    return trusted[0]


def c_log(capsys, trust, rel, tmp_path):
    """concord log: each version says whether its root is trusted, and who of the clusters signed it."""
    _, hot, _, ref, root, _ = rel
    code, out, _ = cli(capsys, "log", hot.uri, ref, "--json", *trust)
    (entry,) = [e for e in json.loads(out)["history"] if e["root"] == root]
    code_text, text, _ = cli(capsys, "log", hot.uri, ref, *trust)
    (line,) = [line for line in text.splitlines() if root[:12] in line]
    assert code == code_text == 0 and entry["quorum"] in line
    assert (f"[trusted: {entry['quorum']}]" in line) is entry["trusted"]
    assert "(threshold)" not in line and THRESHOLD not in entry["invalid"]  # too few signers is not a signature
    return entry["trusted"]


def c_library(capsys, trust, rel, tmp_path):
    """The library's checks (what sync, restore and the flows call): require and restore_check."""
    _, hot, _, ref, root, _ = rel
    policy = load_policy(trust[1], threshold=int(trust[3]) if len(trust) > 2 else None)
    try:
        policy.require(hot, root)
        policy.restore_check(hot, root)
    except UntrustedRootError:
        with pytest.raises(UntrustedRootError):
            restore(hot, load_manifest(hot, root), tmp_path / "lib",
                    check_root=policy.restore_check)
        assert not (tmp_path / "lib").exists()
        return False
    return True


CONSUMERS = {
    "verify": c_verify, "signatures": c_signatures, "restore": c_restore, "sync": c_sync, "checkout": c_checkout,
    "tier-restore": c_tier_restore, "audit-replicas": c_audit, "log": c_log, "library": c_library,
}


@pytest.mark.parametrize("spelling", ["file", "threshold"])
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("case", REFUSED)
def test_a_second_signature_that_does_not_count_is_refused_by_every_consumer(case, consumer, spelling, release, clusters, tmp_path, capsys):
    _, hot, second, _, root, other = release
    arrange(case, [hot, second], root, other, clusters)
    assert CONSUMERS[consumer](capsys, specs(clusters)[spelling], release, tmp_path) is False
    # the same root under a threshold of one is trusted by the same consumer: the refusal is the quorum's
    one = ["--trust", specs(clusters)["threshold"][1], "--trust-threshold", "1"]
    assert CONSUMERS[consumer](capsys, one, release, tmp_path / "one") is True


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_two_valid_signatures_of_three_clusters_are_trusted_by_every_consumer(consumer, release, clusters, tmp_path, capsys):
    _, hot, second, _, root, other = release
    arrange("two-valid", [hot, second], root, other, clusters)
    for spelling, trust in specs(clusters).items():
        assert CONSUMERS[consumer](capsys, trust, release, tmp_path / spelling) is True, spelling
    three = ["--trust", specs(clusters)["threshold"][1], "--trust-threshold", "3"]
    assert CONSUMERS[consumer](capsys, three, release, tmp_path / "three") is False


@pytest.mark.parametrize("case", CASES)
def test_audit_model_applies_the_quorum_on_every_store_lineage_records(case, release, clusters, tracking_uri, capsys):
    """concord audit model: the stores come from MLflow lineage, and each replica's root is
    trusted only under the same rule (the threshold's distinct keys signed this root)."""
    from concord.lineage import Lineage

    _, hot, second, _, root, other = release
    name = f"quorum-{case}"
    version = Lineage(tracking_uri).register_model_version(name, root, [hot.uri, second.uri])["version"]
    arrange(case, [hot, second], root, other, clusters)
    one = ["--trust", specs(clusters)["threshold"][1], "--trust-threshold", "1"]
    for label, trust in [*specs(clusters).items(), ("one", one)]:
        code, out, err = cli(capsys, "audit", "model", name, version, "--tracking-uri", tracking_uri, "--json", *trust)
        doc = json.loads(out)
        replicas = doc["replicas"]["replicas"]
        assert doc["model"]["root"] == root and len(replicas) == 2, (label, err)
        want = case == "two-valid" or label == "one"
        assert [r["trusted"] for r in replicas] == [want, want], (label, replicas)
        assert (doc["sections"]["replicas"] == "critical") is (not want), (label, doc["sections"])
        assert code == 3 or want, (label, code)


# ----------------------------------------------------------------------------- the library's one rule


@pytest.mark.parametrize("case", CASES)
def test_decide_counts_distinct_keys_over_this_root(case, release, clusters):
    _, hot, _, _, root, other = release
    arrange(case, [hot], root, other, clusters)
    policy = load_policy(str(clusters / "policy.yaml"))
    v = policy.report(hot, root)
    us, eu = key(clusters, "us-east").id, key(clusters, "eu-central").id
    assert v.trusted is (case == "two-valid")
    assert set(v.signed_by) == ({us, eu} if case == "two-valid" else {us})  # a forged or foreign signer is never named
    if case != "two-valid":
        assert "1 of 3 (us-east; eu-central, ap-south missing), 2 needed" == v.quorum
        with pytest.raises(UntrustedRootError):
            policy.require(hot, root)


def test_signatures_names_who_signed_and_who_is_missing(release, clusters, tmp_path, capsys):
    _, hot, _, _, root, other = release
    arrange("two-valid", [hot], root, other, clusters)
    code, out, _ = cli(capsys, "signatures", hot.uri, "--root", root, "--trust", clusters / "policy.yaml")
    assert code == 0 and "2 of 3 (us-east, eu-central; ap-south missing)" in out, out
    assert "(us-east)" in out and "(eu-central)" in out
    code, out, _ = cli(capsys, "signatures", hot.uri, "--root", root, "--trust", clusters / "policy.yaml", "--json")
    doc = json.loads(out)
    assert doc["quorum"] == "2 of 3 (us-east, eu-central; ap-south missing), 2 needed" and doc["threshold"] == 2
    code, out, err = cli(capsys, "signatures", hot.uri, "--root", root, *specs(clusters)["threshold"][:2], "--trust-threshold", "3")
    assert code == UNTRUSTED and "2 of 3 (us-east, eu-central; ap-south missing), 3 needed" in out and err.count("\n") == 1


def test_each_cosigned_bundle_verifies_alone_with_model_signing(release, clusters, tmp_path, capsys):
    """Co-signing: each cluster runs ``concord sign`` with its own key on the same store; each
    bundle, written out, is accepted by the real ``model_signing`` on the restored folder alone."""
    _, hot, _, ref, root, _ = release
    for name in CLUSTERS:
        code, _, err = cli(capsys, "sign", hot.uri, "--root", root, "--key", clusters / f"{name}.pem", "--out", tmp_path / f"{name}.sig")
        assert code == 0, err
    restore(hot, load_manifest(hot, root), tmp_path / "folder")
    ms = import_model_signing()
    for name in CLUSTERS:
        ms.verifying.Config().use_elliptic_key_verifier(public_key=clusters / f"{name}.pub.pem").verify(
            tmp_path / "folder", tmp_path / f"{name}.sig"
        )
    # and one cluster's bundle does not verify under another cluster's key
    with pytest.raises(Exception):  # noqa: B017 - model_signing raises its own ValueError subclasses
        ms.verifying.Config().use_elliptic_key_verifier(public_key=clusters / "eu-central.pub.pem").verify(
            tmp_path / "folder", tmp_path / "us-east.sig"
        )
    policy = load_policy(str(clusters / "policy.yaml")).with_threshold(3)
    assert policy.report(hot, root).trusted
    # the signatures travel with a sync: the copy is trusted by the same quorum
    code, _, err = cli(capsys, "sync", hot.uri, tmp_path / "copy", "--ref", ref, "--trust", clusters / "policy.yaml", "--trust-threshold", "3")
    assert code == 0, err
    assert policy.report(LocalDirStore(tmp_path / "copy"), root).trusted


# ----------------------------------------------------------------------------- bad policies


def test_bad_policy_files_and_thresholds_are_one_line_errors(clusters, tmp_path, release, capsys):
    _, hot, _, _, root, _ = release
    keys = ",".join(str(clusters / f"{n}.pub.pem") for n in CLUSTERS)
    bad = {
        "too-high.yaml": "threshold: 4\nkeys:\n" + "".join(f"  {n}: {clusters / n}.pub.pem\n" for n in CLUSTERS),
        "zero.yaml": "threshold: 0\nkeys: [" + ",".join(f"{clusters / n}.pub.pem" for n in CLUSTERS) + "]\n",
        "no-keys.yaml": "threshold: 1\n",
        "empty-keys.yaml": "threshold: 1\nkeys: []\n",
        "typo.yaml": "treshold: 2\nkeys: [" + f"{clusters}/us-east.pub.pem" + "]\n",
        "word.yaml": "threshold: two\nkeys: [" + f"{clusters}/us-east.pub.pem" + "]\n",
        "missing-key.yaml": "keys:\n  us-east: nowhere.pub.pem\n",
        "list.yaml": "- a\n- b\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        code, out, err = cli(capsys, "verify", hot.uri, "--root", root, "--trust", tmp_path / name)
        assert code != 0 and err.count("\n") == 1 and name in err, (name, err)
        with pytest.raises(TrustPolicyError, match=name):
            load_policy(str(tmp_path / name))
    code, _, err = cli(capsys, "verify", hot.uri, "--root", root, "--trust", f"{clusters / 'policy.yaml'},{keys}")
    assert code != 0 and "alone" in err and err.count("\n") == 1
    code, _, err = cli(capsys, "verify", hot.uri, "--root", root, "--trust", keys, "--trust-threshold", "4")
    assert code != 0 and "threshold 4" in err and err.count("\n") == 1
    code, _, err = cli(capsys, "verify", hot.uri, "--root", root, "--trust-threshold", "2")
    assert code != 0 and "no trusted key" in err
    # a policy file's paths are relative to the file, wherever the command runs
    assert load_policy(str(clusters / "policy.yaml")).names == tuple(
        (key(clusters, n).id, n) for n in CLUSTERS
    )


def test_the_environment_threshold_applies_to_the_environment_keys(clusters, monkeypatch):
    keys = ",".join(str(clusters / f"{n}.pub.pem") for n in CLUSTERS)
    monkeypatch.setenv(ENV, keys)
    monkeypatch.setenv("CONCORD_TRUST_THRESHOLD", "2")
    assert load_policy().threshold == 2
    assert load_policy(keys).threshold == 1  # --trust given: its own threshold
    monkeypatch.setenv("CONCORD_TRUST_THRESHOLD", "2x")
    with pytest.raises(TrustPolicyError, match="CONCORD_TRUST_THRESHOLD"):
        load_policy()
    assert isinstance(load_policy(TrustPolicy.from_spec(keys), threshold=3), TrustPolicy)
