"""Trust in the pipelines, on a real temporary Prefect server: a deployment's trust block signs
every snapshot it takes (``concord.snapshot.signed``), its trusted keys refuse a forged root
before any target is touched, verify-store reports signatures, the nightly audit's replica
section flags an unsigned root."""

from __future__ import annotations

import uuid

import pytest

from concord.errors import UntrustedRootError
from concord.snapshots.snapshot import snapshot
from concord.stores import open_store
from concord.trust import generate_key, signature_ids
from concord_pipelines.flows.replicate import replicate_snapshot, snapshot_and_replicate
from concord_pipelines.flows.snapshot import restore_snapshot
from concord_pipelines.flows.verify import verify_store

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

REF = "models/tiny"


@pytest.fixture
def trust_block(tmp_path) -> tuple[str, str]:
    """A saved Concord Trust block (signing key in a Secret block, its public key trusted): (name, key id)."""
    from prefect.blocks.system import Secret

    from concord_pipelines.blocks.trust import TrustBlock

    key = generate_key(tmp_path / "keys" / "deploy.pem")
    name = f"trust-{uuid.uuid4().hex[:8]}"
    Secret(value=(tmp_path / "keys" / "deploy.pem").read_text()).save(f"{name}-key")
    TrustBlock(
        trusted_keys=[(tmp_path / "keys" / "deploy.pub.pem").read_text()], signing_key=Secret.load(f"{name}-key")
    ).save(name)
    return name, key.id


def test_a_deployment_signs_its_snapshots_and_refuses_a_forged_root(checkpoints, store_dirs, trust_block, events_about, tmp_path):
    from concord_pipelines.tasks.audit import audit_replicas_task

    us, eu, ap = store_dirs["us-east"], store_dirs["eu-central"], store_dirs["ap-south"]
    name, key_id = trust_block
    r = snapshot_and_replicate(str(checkpoints("v1")), us, [eu], REF, chunk_size_mib=1, trust_block=name)
    root = r["snapshot"]["root"]
    assert r["snapshot"]["signed_by"] == [key_id]
    assert signature_ids(open_store(eu), root) == [key_id]  # the signature travelled with the sync
    (signed,) = events_about("concord.snapshot.signed", f"concord.snapshot.{root}")
    assert signed.payload["key_id"] == key_id and signed.payload["store"] == us

    # someone who can write eu snapshots their own model under the ref: valid chunks, no signature
    forged = snapshot(checkpoints("evil", changed={"embed.weight": 1.0}), open_store(eu), ref=REF).root
    state = replicate_snapshot(eu, [ap], REF, trust_block=name, return_state=True)
    assert state.is_failed()
    with pytest.raises(UntrustedRootError, match=forged):
        state.result()
    assert open_store(ap).read_ref(REF) is None and not list(open_store(ap).iter_manifests())
    state = restore_snapshot(eu, REF, str(tmp_path / "out"), trust_block=name, return_state=True)
    assert state.is_failed() and not (tmp_path / "out").exists()
    ok = restore_snapshot(us, REF, str(tmp_path / "out"), trust_block=name)
    assert ok["root"] == root

    v = verify_store(eu, REF, trust_block=name)
    quorum = v["signatures"][0].pop("quorum")
    assert quorum.startswith("0 of 1 (none; ") and quorum.endswith(" missing), 1 needed"), quorum
    assert v["signatures"] == [{"root": forged, "store": eu, "signed_by": [], "trusted": False, "trusted_by": None, "problems": {}, "threshold": 1}]
    audit = audit_replicas_task(REF, [us, eu], trust_block=name)
    assert audit["severity"] == "critical"
    assert [(x["cluster"], x["trusted"]) for x in audit["replicas"]] == [("us-east", True), ("eu-central", False)]


def test_a_federation_round_is_signed_by_the_deployments_key(tmp_path, store_dirs, trust_block):
    from test_federation_flow import write_adapter

    from concord.federation.ledger import list_rounds
    from concord_pipelines.flows.federation import lora_federation

    name, key_id = trust_block
    specs = [store_dirs["us-east"], store_dirs["eu-central"]]
    for i, spec in enumerate(specs):
        snapshot(write_adapter(tmp_path / "adapters" / str(i), seed=i, r=4, alpha=8), open_store(spec), ref=f"acme/adapter-{i}")
    r = lora_federation("acme", specs, ["adapter-0", "adapter-1"], record_lineage=False, trust_block=name)
    assert r["ledger_report"]["ok"]
    (doc,) = list_rounds(open_store(specs[0]), "acme")
    assert doc["signature"]["key_id"] == key_id


def test_tiering_signs_every_tier_and_restore_checkpoint_refuses_an_unsigned_copy(tmp_path, trust_block):
    from test_tier_flows import make_checkpoint, write_policy

    from concord_pipelines.flows.tiering import restore_checkpoint_flow, tier_checkpoints

    name, key_id = trust_block
    policy = write_policy(tmp_path / "policy.yaml", tmp_path / "tiers", f"run-{uuid.uuid4().hex[:8]}")
    signed = make_checkpoint(tmp_path / "ckpts" / "step-100", 100, 1_700_000_000)
    unsigned = make_checkpoint(tmp_path / "ckpts" / "step-200", 200, 1_700_000_060)
    r = tier_checkpoints(policy, checkpoint_dir=str(signed), pin_promoted=False, trust_block=name)
    root = r["added"]["root"]
    assert r["added"]["signed"]["key_id"] == key_id
    assert all(signature_ids(open_store(str(tmp_path / "tiers" / t)), root) == [key_id] for t in ("hot", "warm", "cold"))
    tier_checkpoints(policy, checkpoint_dir=str(unsigned), pin_promoted=False)  # a deployment without a key
    ok = restore_checkpoint_flow(policy, "step-100", str(tmp_path / "out1"), tier="cold", trust_block=name)
    assert ok["root"] == root
    state = restore_checkpoint_flow(policy, "step-200", str(tmp_path / "out2"), trust_block=name, return_state=True)
    assert state.is_failed() and not (tmp_path / "out2").exists()
    with pytest.raises(UntrustedRootError):
        state.result()
