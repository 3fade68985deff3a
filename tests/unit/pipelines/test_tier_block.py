"""The tier policy block without a server: Prefect's block standards, the policy it builds (checked
by the same rules as a YAML file), the round trip from a policy, and ``block:NAME``."""

from __future__ import annotations

import pickle

import cloudpickle
import pytest
import yaml
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import ValidationError
from test_blocks import _OfflineLogoCheck

from concord.errors import PolicyError
from concord.tiering.policy import TierPolicy, load_policy
from concord_pipelines import blocks
from concord_pipelines.blocks.tiers import TierPolicyBlock, load_policy_block


class TestTierPolicyBlockStandards(_OfflineLogoCheck, BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return TierPolicyBlock


def local_block(tmp_path, **fields) -> TierPolicyBlock:
    base = {
        "namespace": "llama-lora",
        "hot_store": str(tmp_path / "hot"),
        "warm_store": str(tmp_path / "warm"),
        "warm_media": "nas",
        "cold_store": str(tmp_path / "cold"),
        "cold_media": "tape",
        "cold_offsite": True,
    }
    return TierPolicyBlock(**{**base, **fields})


def test_package_exports_and_names() -> None:
    assert blocks.TierPolicyBlock is TierPolicyBlock and blocks.load_policy_block is load_policy_block
    assert TierPolicyBlock.get_block_type_name() == "Concord Tier Policy"
    assert TierPolicyBlock.get_block_type_slug() == "concord-tier-policy"


def test_the_block_builds_the_policy_a_yaml_file_would(tmp_path) -> None:
    block = local_block(
        tmp_path,
        hot_rto="1m",
        warm_keep=5,
        warm_rto="10m",
        cold_rto="12h",
        rpo="1h",
        pin=["step-100"],
        gc_grace="30m",
        ready_marker="COMPLETE",
        restore_tier="Bulk",
        restore_timeout="2d",
    )
    policy = block.get_policy()
    assert isinstance(policy, TierPolicy)
    assert (policy.hot.keep, policy.warm.keep, policy.cold.keep) == (2, 5, None)
    assert (policy.hot.rto_seconds, policy.warm.rto_seconds, policy.cold.rto_seconds) == (60, 600, 43200)
    assert (policy.rpo_seconds, policy.gc_grace_seconds, policy.marker, policy.pin) == (3600, 1800, "COMPLETE", ("step-100",))
    assert (policy.restore_tier, policy.restore_timeout_seconds) == ("Bulk", 2 * 86400)
    assert policy.cold.media_kind == "tape" and policy.cold.is_offsite

    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(block.to_policy_dict()))
    assert load_policy(path) == policy


def test_the_block_is_refused_by_the_policys_own_rules(tmp_path) -> None:
    block = local_block(tmp_path, hot_keep=4, warm_keep=2, cold_offsite=None, warm_media=None, cold_media=None)
    with pytest.raises(PolicyError) as info:
        block.get_policy()
    problems = info.value.problems
    assert any("warm.keep (2) is less than hot.keep (4)" in p for p in problems)
    assert any("same kind of media" in p for p in problems) and any("off-site" in p for p in problems)
    with pytest.raises(PolicyError, match="same store"):
        local_block(tmp_path, warm_store=str(tmp_path / "hot")).get_policy()
    with pytest.raises(PolicyError, match="storage_class applies only to s3"):
        local_block(tmp_path, warm_storage_class="STANDARD_IA").get_policy()


def test_s3_tiers_with_an_archive_cold_class(tmp_path) -> None:
    block = TierPolicyBlock(
        hot_store=str(tmp_path / "hot"),
        warm_store="s3://models/warm",
        warm_storage_class="STANDARD_IA",
        cold_store="s3://archive/cold",
        cold_storage_class="DEEP_ARCHIVE",
    )
    policy = block.get_policy()
    assert policy.cold.archive and policy.cold.media_kind == "archive" and policy.cold.is_offsite
    assert policy.warm.storage_class == "STANDARD_IA"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"warm_storage_class": "GLACIER"}, "warm_storage_class"),
        ({"cold_storage_class": "ARCHIVE"}, "cold_storage_class"),
        ({"restore_tier": "Fast"}, "restore_tier"),
        ({"cold_compress": "lz4"}, "cold_compress"),
        ({"hot_rto": "soon"}, "not a duration"),
        ({"gc_grace": ""}, "not a duration"),
        ({"hot_keep": 0}, "hot_keep"),
        ({"restore_days": 0}, "restore_days"),
        ({"hot_store": "  "}, "hot_store is empty"),
    ],
)
def test_fields_are_checked_as_they_are_filled_in(tmp_path, fields, message) -> None:
    with pytest.raises(ValidationError, match=message):
        local_block(tmp_path, **fields)


def test_durations_accept_numbers_and_blank_means_unset(tmp_path) -> None:
    block = local_block(tmp_path, hot_rto=90, warm_rto=3600, rpo="  ", ready_marker="")
    assert (block.hot_rto, block.warm_rto, block.rpo, block.ready_marker) == ("90s", "1h", None, None)
    assert block.get_policy().hot.rto_seconds == 90


def test_from_policy_round_trips(tmp_path) -> None:
    doc = {
        "namespace": "run-7",
        "hot": {"store": str(tmp_path / "h"), "keep_days": 1, "rto": "30s", "rpo": "15m"},
        "warm": {"store": "s3://b/warm", "keep_days": 7, "storage_class": "ONEZONE_IA"},
        "cold": {"store": "s3://b/cold", "storage_class": "GLACIER", "media": "tape", "compress": "auto", "rto": "1d"},
        "rpo": "2h",
        "pin": ["best"],
        "gc_grace": "6h",
        "ready": {"marker": "DONE", "settle": "5s"},
        "restore": {"days": 3, "tier": "Expedited", "timeout": "1h", "poll": "10s"},
    }
    policy = TierPolicy.from_dict(doc)
    block = TierPolicyBlock.from_policy(policy)
    assert (block.hot_keep, block.hot_keep_days, block.warm_keep_days) == (None, 1, 7)
    assert (block.hot_compress, block.cold_compress) == (None, "auto")
    assert block.get_policy() == policy
    assert block.get_policy().to_dict() == policy.to_dict()


def test_the_block_pickles(tmp_path) -> None:
    block = local_block(tmp_path)
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        assert loads(dumps(block)).get_policy() == block.get_policy()


def test_block_name_policies_go_through_the_entry_point(tmp_path, monkeypatch) -> None:
    saved = {"llama": local_block(tmp_path)}

    def fake_load(block_type, name, where, **kwargs):  # what blocks.api.load_block answers: the block, or None
        assert block_type is TierPolicyBlock and where == f"block:{name}"
        return saved.get(name)

    monkeypatch.setattr(blocks.tiers, "load_block", fake_load)
    assert load_policy("block:llama") == saved["llama"].get_policy()
    with pytest.raises(PolicyError, match="no concord-tier-policy block named 'nope'"):
        load_policy("block:nope")
    with pytest.raises(PolicyError, match="no block name"):
        load_policy_block("  ")
