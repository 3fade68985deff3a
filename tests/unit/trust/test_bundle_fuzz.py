"""Whatever sits where a signature should be, reading it ends in one clear error, never another
exception: damaged bytes, crafted JSON, a FIFO in the store."""

from __future__ import annotations

import base64
import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from concord.errors import ConcordError, SignatureFormatError
from concord.trust import load_policy, load_signing_key, sign_root, signature_key
from concord.trust.bundle import BUNDLE_MEDIA_TYPE, PAYLOAD_TYPE, parse_bundle

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=20,
)


def _bundle(payload: object) -> bytes:
    return json.dumps(
        {
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": "a" * 64}},
            "dsseEnvelope": {
                "payload": base64.b64encode(json.dumps(payload).encode()).decode(),
                "payloadType": PAYLOAD_TYPE,
                "signatures": [{"sig": "AAAA", "keyid": ""}],
            },
        }
    ).encode()


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300) | JSONISH.map(lambda d: json.dumps(d).encode()) | JSONISH.map(_bundle))
def test_any_document_parses_or_is_one_signature_format_error(data):
    try:
        parse_bundle(data, "fuzzed.sig")
    except SignatureFormatError as exc:
        assert isinstance(exc, ValueError) and "\n" not in str(exc) and "fuzzed.sig" in str(exc)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=4000), flip=st.integers(min_value=0, max_value=4000))
def test_a_damaged_stored_signature_never_counts_and_never_escapes(signed_store_doc, cut, flip):
    store, root, policy, good = signed_store_doc
    bad = bytearray(good[: cut % len(good)] if cut % 3 else good)
    if bad:
        bad[flip % len(bad)] ^= 0x20
    store.put_document(signature_key(root, policy.key_ids[0]), bytes(bad), overwrite=True)
    v = policy.report(store, root)
    if v.trusted:  # only the envelope's unsigned dressing changed: what is signed, and the signature, are intact
        then, now = parse_bundle(good, "good"), parse_bundle(bytes(bad), "bad")
        assert (now.payload, now.signature) == (then.payload, then.signature)
    else:
        assert policy.key_ids[0] in v.problems


def test_a_fifo_where_a_signature_should_be_is_a_problem_not_a_hang(snap, keydir, tmp_path):
    store, root = snap
    policy = load_policy(str(keydir / "alice.pub.pem"))
    path = tmp_path / "c1" / signature_key(root, policy.key_ids[0])
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    v = policy.report(store, root)
    assert not v.trusted and policy.key_ids[0] in v.problems


import pytest  # noqa: E402


@pytest.fixture
def signed_store_doc(snap, keydir):
    store, root = snap
    policy = load_policy(str(keydir / "alice.pub.pem"))
    _, data = sign_root(store, root, load_signing_key(keydir / "alice.pem"))
    assert isinstance(data, bytes) and not isinstance(data, ConcordError)
    return store, root, policy, data
