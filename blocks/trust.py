"""A Prefect block for trust: the public keys a deployment trusts, and the key it signs with.

:meth:`TrustBlock.get_policy` builds the core's :class:`~concord.trust.TrustPolicy` from the
trusted public keys (PEM text); :meth:`TrustBlock.get_signing_key` builds the
:class:`~concord.trust.SigningKey` from a Prefect ``Secret`` block holding the deployment's PEM
private key (unwrapped only there, never logged). A deployment given a trust block signs every
snapshot it takes (when the block has a signing key) and refuses an untrusted root before it
touches a target (when the block has trusted keys).

The command line reaches a saved block as ``--trust block:NAME`` (:func:`trusted_keys_of_block`,
the ``concord.trust_sources`` entry point) and ``--key block:NAME`` (:func:`signing_key_of_block`,
the ``concord.signing_key_sources`` entry point).
"""

from __future__ import annotations

from collections.abc import Callable

from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from pydantic import Field, SecretStr, field_validator

from concord.errors import ConcordError, KeyFileError, KeyPasswordError, TrustPolicyError
from concord_pipelines.blocks.api import load_block, where_blocks_live

__all__ = ["TrustBlock", "load_trust_block", "signing_key_of_block", "trusted_keys_of_block"]

_DOCUMENTATION_URL = "https://docs.prefect.io/v3/concepts/blocks"


class TrustBlock(Block):
    """Who a deployment trusts, and how it signs.

    Attributes:
        trusted_keys: PEM text of each trusted public key (ECDSA P-256, P-384 or P-521).
        key_names: A name per trusted key (the cluster holding it), in the same order; optional.
        threshold: How many distinct trusted keys must sign a root or a federation round.
        signing_key: A Secret block holding this deployment's PEM private key.
        signing_key_password: The private key's password, if it has one.
    """

    _block_type_name = "Concord Trust"
    _description = "Trusted public keys (a trust policy) and the signing key of a Concord deployment."
    _documentation_url = _DOCUMENTATION_URL
    # no logo: a remote image does not load where the UI has no internet, and Prefect accepts only
    # http(s) addresses (no data: URI); the UI shows its own block icon instead
    _logo_url = None

    trusted_keys: list[str] = Field(
        default_factory=list,
        description=(
            "PEM text of each trusted public key (`openssl ec -in KEY.pem -pubout`, or KEY.pub.pem from "
            "`concord keys generate`). With any, roots no trusted key signed are refused."
        ),
    )
    key_names: list[str] = Field(
        default_factory=list,
        description="A name for each trusted key, in the same order (e.g. its cluster: us-east); empty to name them by number.",
    )
    threshold: int = Field(
        default=1, ge=1,
        description="How many distinct trusted keys must have signed a root (or a federation round) for it to be trusted.",
    )
    signing_key: Secret | None = Field(
        default=None,
        description="A Secret block holding the PEM private key this deployment signs every snapshot with.",
    )
    signing_key_password: SecretStr | None = Field(
        default=None, description="The signing key's password, if it is password-protected."
    )

    @field_validator("trusted_keys")
    @classmethod
    def _check_keys(cls, keys: list[str]) -> list[str]:
        from concord.trust import public_key_from_pem

        for i, pem in enumerate(keys):
            public_key_from_pem(pem.encode(), f"trusted key {i + 1} of the block")  # refused now, not at run time
        return keys

    def get_policy(self):
        """The trust policy of the trusted keys; a block that lists none is a
        :class:`~concord.errors.TrustPolicyError` (an empty list is never "no policy")."""
        from concord.trust import TrustPolicy

        where = f"block {self._block_document_name or 'TrustBlock'}"
        if not self.trusted_keys:
            raise TrustPolicyError(
                where, "the block lists no trusted key",
                "Add the public keys (PEM) to trust to its trusted_keys, or do not name it where a trust policy is read",
            )
        return TrustPolicy.from_pems(self.trusted_keys, where, self.threshold, self.key_names or None)

    def get_signing_key(self):
        """The deployment's signing key, or None when the block has none."""
        from concord.trust import signing_key_from_pem

        if self.signing_key is None:
            return None
        password = self.signing_key_password.get_secret_value() if self.signing_key_password is not None else None
        pem = str(self.signing_key.get()).encode()
        return signing_key_from_pem(pem, f"signing key of block {self._block_document_name or 'TrustBlock'}", password)


def load_trust_block(name: str) -> TrustBlock:
    """The saved trust block ``name`` (a bare name, or ``block:NAME``)."""
    return _load(name, TrustPolicyError)


def _load(name: str, error: Callable[..., ConcordError]) -> TrustBlock:
    """``TrustBlock.load(name)``; ``error(where, problem, fix)`` for a missing block or an API
    that does not answer."""
    name = name.removeprefix("block:").strip() if isinstance(name, str) else ""
    where = f"block:{name}"
    if not name:
        raise error(where, "no block name given", "Write block:NAME, the name of a saved Concord Trust block")
    try:
        block = load_block(TrustBlock, name, where)
    except ValueError as exc:
        raise error(where, f"the saved block cannot be loaded ({' '.join(str(exc).split())[:200]})", "Save it again") from None
    if block is None:
        raise error(
            where,
            f"there is no {TrustBlock.get_block_type_slug()} block named {name!r} in {where_blocks_live()}",
            f"Create it with `TrustBlock(trusted_keys=[PEM, ...], signing_key=Secret.load(...)).save({name!r})` or in the Prefect UI "
            "after `prefect block register -m concord_pipelines.blocks.trust`, or check PREFECT_API_URL",
        )
    return block


def trusted_keys_of_block(name: str):
    """The trust policy of the saved block ``name`` (what ``--trust block:NAME`` trusts): its
    trusted keys, their names and its threshold; one line naming the block when it lists none."""
    block = _load(name, TrustPolicyError)
    if not block.trusted_keys:
        raise TrustPolicyError(
            f"block:{block._block_document_name or name}",
            "the block lists no trusted key",
            "Add the public keys (PEM) to trust to its trusted_keys, or give PEM paths instead",
        )
    return block.get_policy()


def signing_key_of_block(name: str):
    """The signing key of the saved block ``name`` (what ``--key block:NAME`` signs with): its
    Secret's PEM, opened with the block's password. Never printed or logged."""
    block = _load(name, KeyFileError)
    where = f"block:{block._block_document_name or name}"
    if block.signing_key is None:
        raise KeyFileError(
            where,
            "the block has no signing key",
            "Set its signing_key to a Secret block holding the PEM private key (`concord keys generate KEY.pem`), "
            "or give --key KEY.pem",
        )
    try:
        return block.get_signing_key()
    except KeyPasswordError as exc:
        raise KeyFileError(
            where,
            "its signing key is protected by a password the block " + ("does not open" if exc.given else "does not hold"),
            "Set the block's signing_key_password to the key's password",
        ) from None
