"""The verbs of ``import concord`` apply the CLI's defaults: the trust policy of
``CONCORD_TRUSTED_KEYS``, an encrypted store's key file, ``models/x~1`` history specs; and they
refuse arguments that name nothing, or two things, in one line."""

from __future__ import annotations

import pickle

import pytest

import concord
from concord.home import patched_environ


@pytest.fixture
def released(tmp_path, ckpt):
    """A folder store whose ref ``models/x`` has two versions, the newer signed; the public key."""
    from concord.trust import generate_key

    store = tmp_path / "store"
    first = concord.snapshot(ckpt, store, ref="models/x", progress=False)
    (ckpt / "config.json").write_text('{"changed": true}')
    second = concord.snapshot(ckpt, store, ref="models/x", progress=False)
    key = generate_key(tmp_path / "k.pem")
    concord.sign(store, tmp_path / "k.pem", ref="models/x", progress=False)
    return {"store": str(store), "pub": key.public.source, "first": first.root, "second": second.root, "dir": tmp_path}


def test_restore_reads_the_trust_policy_from_the_environment(released):
    out = released["dir"] / "out"
    with patched_environ({"CONCORD_TRUSTED_KEYS": released["pub"]}):
        with pytest.raises(concord.UntrustedRootError) as caught:
            concord.restore(released["store"], out / "old", ref="models/x~1", progress=False)
        assert caught.value.root == released["first"] and not (out / "old").exists()
        r = concord.restore(released["store"], out / "new", ref="models/x", progress=False)
    assert r.root == released["second"] and (out / "new" / "config.json").read_text() == '{"changed": true}'
    # with no policy in the environment nothing is checked, as in the CLI
    with patched_environ({}, ["CONCORD_TRUSTED_KEYS"]):
        assert (
            concord.restore(released["store"], out / "any", root=released["first"], progress=False).root
            == released["first"]
        )


def test_an_empty_trust_list_in_the_environment_is_an_error_not_no_policy(released):
    with patched_environ({"CONCORD_TRUSTED_KEYS": ""}):
        with pytest.raises(concord.TrustPolicyError, match="CONCORD_TRUSTED_KEYS"):
            concord.restore(released["store"], released["dir"] / "out", ref="models/x", progress=False)
        with pytest.raises(concord.TrustPolicyError):
            concord.checkout(released["store"], released["dir"] / "srv" / "current", ref="models/x", progress=False)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, d: concord.restore(s, d / "out", progress=False),
        lambda s, d: concord.restore(s, d / "out", ref="models/x", root="0" * 64, progress=False),
        lambda s, d: concord.checkout(s, d / "current", progress=False),
        lambda s, d: concord.sync(s, [d / "replica"], progress=False),
        lambda s, d: concord.sign(s, d / "k.pem", progress=False),
        lambda s, d: concord.verify(s, ref="models/x", root="0" * 64, progress=False),
    ],
)
def test_a_verb_given_nothing_to_act_on_or_two_things_says_so_in_one_line(released, call):
    with pytest.raises(concord.ApiArgumentError) as caught:
        call(released["store"], released["dir"])
    message = str(caught.value)
    assert message.startswith("concord.") and "ref=" in message and "\n" not in message
    assert caught.value.exit_code == 1 and str(pickle.loads(pickle.dumps(caught.value))) == message
    assert not (released["dir"] / "out").exists() and not (released["dir"] / "replica").exists()


def test_an_encrypted_store_opens_with_key_file_or_the_environment(tmp_path, ckpt):
    from concord.stores.config import configure, new_key_file

    key_path = tmp_path / "store.key"
    key = new_key_file(str(key_path), str(tmp_path / "vault"))
    configure(concord.open_store(tmp_path / "vault"), compress="none", encrypt=True, key=key)
    with pytest.raises(concord.StoreKeyError):
        with patched_environ({}, ["CONCORD_KEY_FILE"]):
            concord.snapshot(ckpt, str(tmp_path / "vault"), ref="models/x", progress=False)
    r = concord.snapshot(ckpt, str(tmp_path / "vault"), ref="models/x", key_file=key_path, progress=False)
    with patched_environ({"CONCORD_KEY_FILE": str(key_path)}):
        assert concord.verify(str(tmp_path / "vault"), ref="models/x", progress=False).ok
        assert concord.diff(str(tmp_path / "vault"), "models/x", r.root).same


def test_a_store_is_taken_as_a_store_an_address_or_the_text_typed(released):
    from pathlib import Path

    text = released["store"]
    for given in (text, Path(text), concord.StoreAddress.parse(text), concord.open_store(text)):
        r = concord.verify(given, ref="models/x~1", progress=False)
        assert r.ok and r.roots == (released["first"],)
