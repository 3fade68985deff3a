"""The trust block without a server: Prefect's block standards, the policy and signing key it builds."""

from __future__ import annotations

import pytest
from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import ValidationError
from test_blocks import _OfflineLogoCheck

from concord.errors import KeyPasswordError, TrustPolicyError
from concord.trust import generate_key, load_public_key
from concord_pipelines import blocks
from concord_pipelines.blocks.trust import TrustBlock


class TestTrustBlockStandards(_OfflineLogoCheck, BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return TrustBlock


def test_the_block_builds_the_policy_and_the_signing_key(keydir, tmp_path):
    assert blocks.TrustBlock is TrustBlock and TrustBlock.get_block_type_slug() == "concord-trust"
    assert TrustBlock().get_signing_key() is None
    with pytest.raises(TrustPolicyError, match="lists no trusted key"):  # an empty list is never "no policy"
        TrustBlock().get_policy()
    b = TrustBlock(
        trusted_keys=[(keydir / "alice.pub.pem").read_text(), (keydir / "ossl.pub.pem").read_text()],
        signing_key=Secret(value=(keydir / "alice.pem").read_text()),
    )
    assert b.get_policy().key_ids == (load_public_key(keydir / "alice.pub.pem").id, load_public_key(keydir / "ossl.pub.pem").id)
    assert b.get_signing_key().id == load_public_key(keydir / "alice.pub.pem").id
    generate_key(tmp_path / "enc.pem", password="pw")
    locked = TrustBlock(signing_key=Secret(value=(tmp_path / "enc.pem").read_text()))
    with pytest.raises(KeyPasswordError, match="signing key of block"):
        locked.get_signing_key()
    assert TrustBlock(signing_key=locked.signing_key, signing_key_password="pw").get_signing_key().id == load_public_key(tmp_path / "enc.pub.pem").id


def test_a_key_that_is_not_a_public_key_is_refused_when_the_block_is_made():
    with pytest.raises(ValidationError, match="trusted key 1 of the block"):
        TrustBlock(trusted_keys=["not a key"])
