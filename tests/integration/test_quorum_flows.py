"""Quorum trust in the pipelines, on a real temporary Prefect server: a Concord Trust block with
three cluster keys and ``threshold: 2`` refuses, in the flows that take it (replicate, restore,
verify-store, checkout-node with a policy file, restore-checkpoint, the nightly drift audit), a
root whose second signature is forged, over another root, by a key outside the policy or by the
same key, and trusts one two clusters signed;
the lora-federation flow collects the clusters' signatures (each cluster checks the aggregate it
received), its ledger check refuses a round with fewer than the threshold, and its artifact
says who signed each round."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from servers import free_port

from concord.snapshots.snapshot import snapshot
from concord.stores import open_store
from concord.trust import generate_key, read_signature, sign_root, signature_key
from concord_pipelines.flows.audit import nightly_drift_audit
from concord_pipelines.flows.replicate import replicate_snapshot
from concord_pipelines.flows.rollout import checkout_node
from concord_pipelines.flows.snapshot import restore_snapshot
from concord_pipelines.flows.verify import verify_store

sys.path.append(str(Path(__file__).parents[1] / "unit" / "trust"))
from quorum_keys import forge  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(600)]

REF = "models/tiny"
CLUSTERS = ("us-east", "eu-central", "ap-south")


@pytest.fixture
def cluster_blocks(tmp_path):
    """A trust block per cluster: its own signing key, all three public keys trusted (named by
    cluster), threshold 2. Returns ({cluster: block name}, {cluster: SigningKey})."""
    from prefect.blocks.system import Secret

    from concord_pipelines.blocks.trust import TrustBlock

    keys = {c: generate_key(tmp_path / "keys" / f"{c}.pem") for c in CLUSTERS}
    pems = [(tmp_path / "keys" / f"{c}.pub.pem").read_text() for c in CLUSTERS]
    tag = uuid.uuid4().hex[:8]
    names = {}
    for c in CLUSTERS:
        Secret(value=(tmp_path / "keys" / f"{c}.pem").read_text()).save(f"{c}-{tag}-key")
        names[c] = f"{c}-{tag}"
        TrustBlock(trusted_keys=pems, key_names=list(CLUSTERS), threshold=2, signing_key=Secret.load(f"{c}-{tag}-key")).save(names[c])
    return names, keys



@pytest.mark.parametrize("case", ["forged", "other-root", "outsider", "same-key-twice", "two-valid"])
def test_the_flows_apply_the_blocks_threshold(case, checkpoints, store_dirs, cluster_blocks, tmp_path):
    names, keys = cluster_blocks
    us, eu, ap = (store_dirs[c] for c in CLUSTERS)
    store = open_store(us)
    root = snapshot(checkpoints("v1"), store, ref=REF).root
    other = snapshot(checkpoints("v2", changed={"embed.weight": 1.0}), store).root
    sign_root(store, root, keys["us-east"])
    if case == "two-valid":
        sign_root(store, root, keys["eu-central"])
    elif case == "forged":
        _, data = sign_root(store, root, keys["eu-central"])
        store.put_document(signature_key(root, keys["eu-central"].id), forge(data), overwrite=True)
    elif case == "other-root":
        _, data = sign_root(store, other, keys["eu-central"])
        store.put_document(signature_key(root, keys["eu-central"].id), data)
    elif case == "outsider":  # a genuine signature by a key outside the policy, filed under eu-central's id
        _, data = sign_root(store, root, generate_key(tmp_path / "keys" / "outsider.pem"))
        store.put_document(signature_key(root, keys["eu-central"].id), data)
    else:
        store.put_document(signature_key(root, keys["eu-central"].id), read_signature(store, root, keys["us-east"].id))
    trusted = case == "two-valid"
    block = names["ap-south"]

    state = replicate_snapshot(us, [ap], REF, trust_block=block, return_state=True)
    assert state.is_completed() is trusted
    assert (open_store(ap).read_ref(REF) is not None) is trusted
    state = restore_snapshot(us, REF, str(tmp_path / "out"), trust_block=block, return_state=True)
    assert state.is_completed() is trusted and (tmp_path / "out").exists() is trusted
    v = verify_store(us, REF, trust_block=block)
    (sig,) = v["signatures"]
    assert sig["trusted"] is trusted and sig["threshold"] == 2
    assert sig["quorum"].startswith("2 of 3 (us-east, eu-central; ap-south missing)" if trusted else "1 of 3 (us-east; eu-central, ap-south missing)")
    # checkout-node takes the policy file (keys by cluster name, threshold 2)
    policy = tmp_path / "keys" / "policy.yaml"
    policy.write_text("threshold: 2\nkeys:\n" + "".join(f"  {c}: {c}.pub.pem\n" for c in CLUSTERS))
    state = checkout_node(us, str(tmp_path / "node" / "current"), ref=REF, trust=str(policy), return_state=True)
    assert state.is_completed() is trusted and (tmp_path / "node" / "current").exists() is trusted
    # the nightly audit: a replica whose root lacks the quorum is critical
    audit = nightly_drift_audit(
        ref=REF, stores=[us], trust_block=block, fail_on="never", name=f"quorum-{uuid.uuid4().hex[:8]}",
        registry=str(tmp_path / "registry"), tracking_uri=f"http://127.0.0.1:{free_port()}",
    )
    (replica,) = audit["replicas"]["replicas"]
    assert replica["trusted"] is trusted and (replica["severity"] == "critical") is (not trusted), replica
    signers = {keys["us-east"].id, keys["eu-central"].id} if trusted else {keys["us-east"].id}
    assert set(replica["signed_by"]) == signers
    assert (audit["sections"]["replicas"] == "critical") is (not trusted)


def test_restore_checkpoint_needs_the_blocks_threshold_of_distinct_signers(tmp_path, cluster_blocks):
    """The tier flows: a checkpoint tiered by us-east's deployment carries one signature per tier,
    so restore-checkpoint under a threshold of two refuses it, also with us-east's bundle filed
    again under eu-central's id or eu-central's forged, until eu-central co-signs it."""
    from test_tier_flows import make_checkpoint, write_policy

    from concord_pipelines.flows.tiering import restore_checkpoint_flow, tier_checkpoints

    names, keys = cluster_blocks
    policy = write_policy(tmp_path / "policy.yaml", tmp_path / "tiers", f"run-{uuid.uuid4().hex[:8]}")
    ckpt = make_checkpoint(tmp_path / "ckpts" / "step-100", 100, 1_700_000_000)
    root = tier_checkpoints(policy, checkpoint_dir=str(ckpt), pin_promoted=False, trust_block=names["us-east"])["added"]["root"]
    hot = open_store(str(tmp_path / "tiers" / "hot"))
    eu_doc = signature_key(root, keys["eu-central"].id)

    def restored(out: str) -> bool:
        state = restore_checkpoint_flow(policy, "step-100", str(tmp_path / out), tier="hot", trust_block=names["ap-south"],
                                        return_state=True)
        assert state.is_completed() is (tmp_path / out).exists(), out
        return state.is_completed()

    assert not restored("one-signer")
    hot.put_document(eu_doc, read_signature(hot, root, keys["us-east"].id))  # one key twice
    assert not restored("same-key-twice")
    _, data = sign_root(hot, root, keys["eu-central"])
    hot.put_document(eu_doc, forge(data), overwrite=True)
    assert not restored("forged")
    sign_root(hot, root, keys["eu-central"])  # a genuine co-signature
    assert restored("two-valid")


def test_the_federation_flow_collects_a_quorum_and_shows_who_signed(tmp_path, store_dirs, cluster_blocks, artifacts_of):
    from test_federation_flow import write_adapter

    from concord.federation.ledger import list_rounds
    from concord_pipelines.flows.federation import lora_federation

    names, keys = cluster_blocks
    specs = [store_dirs[c] for c in CLUSTERS]
    for i, spec in enumerate(specs):
        snapshot(write_adapter(tmp_path / "adapters" / str(i), seed=i, r=4, alpha=8), open_store(spec), ref=f"acme/adapter-{i}")
    adapters = ["adapter-0", "adapter-1", "adapter-2"]
    # eu-central co-signs, ap-south does not: two of three
    state = lora_federation(
        "acme", specs, adapters, record_lineage=False, trust_block=names["us-east"], cosigner_blocks=[names["eu-central"]], return_state=True
    )
    r = state.result()
    assert r["ledger_report"]["ok"], r["ledger_report"]["problems"]
    assert r["ledger_report"]["signed_by"] == {"1": ["us-east", "eu-central"]}
    (doc,) = list_rounds(open_store(specs[0]), "acme")
    assert [s["key_id"] for s in [doc["signature"], *doc["signatures"]]] == [keys["us-east"].id, keys["eu-central"].id]
    summary = next(a for a in artifacts_of(state.state_details.flow_run_id) if a.key == "federation-summary")
    assert "Who signed each round" in summary.data and "| 1 | us-east, eu-central |" in summary.data
    # the same ledger under a threshold of three: the round (and the head) lack ap-south
    r3 = lora_federation("acme", specs, adapters, record_lineage=False, trust_block=names["us-east"], cosigner_blocks=[names["eu-central"]],
                         trust_threshold=3)
    assert r3["recorded"] == "already" and not r3["ledger_report"]["ok"]
    assert any("2 of 3 (us-east, eu-central; ap-south missing), 3 needed" in p for p in r3["ledger_report"]["problems"])
    # ap-south too: three of three
    r3 = lora_federation("acme", specs, adapters, record_lineage=False, trust_block=names["us-east"],
                         cosigner_blocks=[names["eu-central"], names["ap-south"]], trust_threshold=3)
    assert r3["ledger_report"]["ok"] and r3["ledger_report"]["signed_by"] == {"1": list(CLUSTERS)}
