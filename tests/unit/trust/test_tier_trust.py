"""``tier restore`` under a trust policy: an unsigned copy is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from concord.errors import UntrustedRootError
from concord.tiering.engine import TierState, add_checkpoint
from concord.tiering.policy import TierPolicy
from concord.tiering.restore import restore_checkpoint
from concord.trust import load_policy, load_signing_key, sign_root


def policy_doc(tmp_path: Path) -> dict:
    return {
        "namespace": "run1",
        "hot": {"store": str(tmp_path / "hot"), "keep": 1},
        "warm": {"store": str(tmp_path / "warm"), "keep": 2, "media": "nas"},
        "cold": {"store": str(tmp_path / "cold"), "media": "tape", "offsite": True},
        "ready": {"settle": 0},
    }


@pytest.fixture
def tiers(tmp_path: Path, model: Path) -> TierPolicy:
    policy = TierPolicy.from_dict(policy_doc(tmp_path))
    assert add_checkpoint(policy, model, "step-1", gc=False).sweep.ok
    return policy


def test_tier_restore_refuses_an_unsigned_copy_and_restores_a_signed_one(tiers, keydir, tmp_path, capsys):
    trust = load_policy(str(keydir / "alice.pub.pem"))
    out = tmp_path / "out"
    with pytest.raises(UntrustedRootError, match="not signed by a trusted key"):
        restore_checkpoint(tiers, "step-1", out, check_root=trust.restore_check)
    assert not out.exists()
    hot = tiers.tier("hot").open()
    root = TierState.read(tiers).held["hot"]["step-1"]
    sign_root(hot, root, load_signing_key(keydir / "alice.pem"))
    r = restore_checkpoint(tiers, "step-1", out, check_root=trust.restore_check)
    assert r.root == root and (out / "config.json").exists()
    # at the command line, the warm copy (not signed there) is refused in one line
    import json

    from concord.cli import main

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(json.dumps(policy_doc(tmp_path)))  # JSON is YAML
    code = main(["tier", "restore", "step-1", str(tmp_path / "out2"), "--tier", "warm", "--policy", str(policy_file), "--trust", str(keydir / "alice.pub.pem")])
    err = capsys.readouterr().err
    assert code == 13 and err.count("\n") == 1 and "not signed by a trusted key" in err and not (tmp_path / "out2").exists()
