"""Sparse byte planes (mode 2): a delta's XOR keeps a plane of mostly zero bytes as the steps
between its non-zero bytes and their values, and decodes to the same bytes against either base;
deltas written before the mode existed still decode (docs/deltas.md)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_config import _plane_modes as plane_modes

from concord.stores import codec

BASE_ID = "ab" * 32

#: 256 bf16 weights and their update by 1e-3 of their mean size, and the delta of the update as
#: Concord wrote it before sparse planes (both planes zstd); stores written then still hold such frames
BASE = bytes.fromhex(
    "ce37c33bb3bb91bc14bca2bc9d3adb3c21bc4bbc203ce93b0a3b98bc19ba633cdcbc15bc1bbdd3bc16bd9abbcfbc"
    "b13b4d3b75bb4ebd30bc7eba143bfabc1cbca0bc84bcad3c84bc2aba903c3fbc12bb103ba73ac8bcc73ade3cfdbc"
    "8c3c1c3b52bc233d793cc4bcc33a3c3c77bb5f3caeba5a3ceb3c5dbc853b17bc263bc2bc3dbc80bb933cbb3cd8bc"
    "82bc533c23bd17bcffbacd3c613cd6bbf1bba3bbf93c0cbcc7bbe73b1ebb81bbb6bc71b911bcbf3c563cfdb95b3c"
    "debbac3ce2b83f3cd3bce33b0abd26bdc7bb93bc573b373d88bc4cbc863b213c67bb86bb663c2a3ca9bccfba393a"
    "acbcaa3b8cbc9f3c7c3bea3a41bc1bbb23bdb9bced3b2ebd8a3c0fbd773c8abc7f3c2b3bfbbccc3cec3cacbab3bb"
    "51bb9fbcb33c31bc86ba81bc4dbcd1bccd3c49bb9e3c8b3963bcd6bb37bc2639f5bbc4bbe1bc84bc073d5bbcacbc"
    "dd3be63ceebc88bb4fbc10bd703cf5b9bb3a76bc153c30bc3bbbb5bcc7bcda3c26bcbf3b31ba10bc26bc4e3cc5bb"
    "46bbe939c03c5e3cfa3b38bce2bc9b3c9e3c38bb313c803c883c963c15bcf83cccbc8d3c213c8f3c193df33cbbbc"
    "0abd853ca6bc82b9893c06bd2cbda93b683aa1bb4a3a8cbcf7bc5abb9fbc06bd253ca0ba053ca2bc57bca3bc91bc"
    "803b80bce93bde3b253de4bc913ceaba93b9edbc16bc733cd8bad43abebbbd3ce1b934bd62bc21bd85bd2dbcda3c"
    "773ac0bc9abc"
)
FT = bytes.fromhex(
    "2c38c33bb3bb91bc14bca2bc9e3adb3c21bc4bbc203cea3b083b98bc19ba633cdcbc15bc1bbdd3bc16bd9bbbcfbc"
    "b13b4d3b76bb4ebd30bc79ba143bfabc1cbca0bc84bcad3c84bc26ba913c3fbc12bb103ba63ac8bcc73ade3cfdbc"
    "8c3c1b3b52bc233d793cc4bcc23a3c3c77bb5f3cafba5a3ceb3c5dbc843b17bc253bc2bc3ebc80bb933cbb3cd8bc"
    "82bc533c23bd17bcfbbacd3c613cd6bbf1bba4bbf93c0bbcc7bbe73b1cbb81bbb6bc53b911bcbe3c553cfcb95b3c"
    "debbac3cfcb83f3cd3bce33b0abd26bdc7bb93bc573b373d88bc4cbc863b213c68bb86bb653c2a3ca9bcceba383a"
    "acbcaa3b8cbc9f3c7e3bea3a41bc1cbb23bdb9bced3b2ebd8a3c0ebd783c8abc7f3c2c3bfbbccc3cec3cafbab4bb"
    "50bb9fbcb43c31bc89ba82bc4dbcd1bccd3c48bb9e3c823963bcd5bb37bc0939f5bbc4bbe1bc84bc073d5cbcacbc"
    "dc3be63ceebc88bb4fbc10bd713cffb9bd3a76bc143c30bc3bbbb5bcc7bcda3c26bcbe3b36ba10bc26bc4e3cc5bb"
    "47bbe139c03c5e3cfb3b38bce2bc9b3c9e3c37bb313c803c883c963c15bcf83cccbc8d3c213c8e3c193df33cbbbc"
    "0abd853ca6bc8ab9893c06bd2cbda93b653aa0bb473a8cbcf8bc5bbb9fbc06bd253ca0ba053ca2bc57bca3bc91bc"
    "7e3b80bce83bdf3b253de4bc913cebba88b9edbc16bc733cd6bad23abebbbc3ce8b934bd62bc21bd85bd2ebcda3c"
    "763ac0bc9abc"
)
OLD_DELTA = bytes.fromhex(
    "abababababababababababababababababababababababababababababababab0302018000000028b52ffd600000"
    "b50300124a131bb025690c0c64499224499224211503e59289b5d8b6b60d2b9b4c01eb1e516370822e4d9489923f"
    "8a3ef4a35f8d80ea7091facaa9d9e7a2b3f496c235355c3ce70177751d5d82f3aec57e1f1110003805808b430984"
    "812e108d15b073c881b3069a00bc0295c55159ba6463aa4180e50c2801011300000028b52ffd6000004d0000100f"
    "0001007b0a6001"
)


def _plane_modes(payload: bytes) -> list[int]:
    """The mode of each plane of the byte-plane frame that follows a delta's base id."""
    frame = payload[codec.BASE_ID_BYTES :]
    assert frame[0] == codec.PLANES
    return plane_modes(frame)


def _decodes_against_both_bases(delta: bytes, base: bytes, data: bytes, dtype: str) -> None:
    whole = codec.encode(base, "auto", dtype)
    assert bytes(codec.decode_delta(delta, whole[0], memoryview(whole)[1:], len(data))) == data
    assert bytes(codec.decode_delta(delta, codec.RAW, base)) == data  # a node's own bytes of the base
    assert bytes(codec.decode_delta(delta, codec.RAW, base, len(data), transient=True)) == data


def _fine_tune(n: int, rel: float, seed: int = 0) -> tuple[bytes, bytes]:
    """``n`` bf16 weights and the same moved by ``rel`` of their mean size (a full fine-tune)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(n) * 0.02).astype(np.float32)
    moved = w + rel * np.abs(w).mean() * rng.standard_normal(n).astype(np.float32)
    return tuple((v.view(np.uint32) >> 16).astype(np.uint16).tobytes() for v in (w, moved))  # type: ignore[return-value]


def test_a_small_updates_xor_keeps_its_planes_sparse_smaller_and_decodes_against_either_base():
    base, ft = _fine_tune(1 << 20, 1e-3)  # one 2 MiB chunk
    delta = codec.encode_delta(ft, base, BASE_ID, "BF16")
    assert _plane_modes(delta) == [codec.PLANE_SPARSE, codec.PLANE_SPARSE]
    xor = (np.frombuffer(base, np.uint16) ^ np.frombuffer(ft, np.uint16)).tobytes()
    dense = bytes.fromhex(BASE_ID) + bytes(codec.encode_view(xor, "auto", "BF16", sparse=False))
    assert len(delta) < 0.85 * len(dense)  # the steps and values code closer to the plane's entropy
    _decodes_against_both_bases(delta, base, ft, "BF16")
    # a plane mostly of non-zero bytes (a large update's low plane) stays a zstd or raw plane
    base, ft = _fine_tune(1 << 18, 1e-1, seed=1)
    delta = codec.encode_delta(ft, base, BASE_ID, "BF16")
    assert _plane_modes(delta)[0] != codec.PLANE_SPARSE
    _decodes_against_both_bases(delta, base, ft, "BF16")


def test_a_delta_written_before_sparse_planes_still_decodes():
    assert _plane_modes(OLD_DELTA) == [codec.PLANE_ZSTD, codec.PLANE_ZSTD]
    assert codec.delta_base(OLD_DELTA) == BASE_ID
    _decodes_against_both_bases(OLD_DELTA, BASE, FT, "BF16")
    # today's delta of the same pair decodes to the same bytes
    _decodes_against_both_bases(codec.encode_delta(FT, BASE, BASE_ID, "BF16"), BASE, FT, "BF16")


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5000),
    entries=st.lists(st.tuples(st.integers(0, 4999), st.integers(1, 255)), max_size=60),
    dtype=st.sampled_from(["BF16", "F16", "F32", "F64"]),
)
def test_any_sparse_xor_decodes_exactly_long_gaps_and_an_empty_plane_too(n, entries, dtype):
    width = codec.PLANE_WIDTH[dtype]
    rng = np.random.default_rng(n)
    base = rng.integers(0, 256, n * width + 1, dtype=np.uint8)  # and a one-byte tail
    xor = np.zeros_like(base)
    for at, value in entries:  # scattered bytes, gaps of any length (a filler every 255 elements)
        xor[(at % n) * width + at % width] = value
    data = (base ^ xor).tobytes()
    _decodes_against_both_bases(codec.encode_delta(data, base.tobytes(), BASE_ID, dtype), base.tobytes(), data, dtype)


def test_gaps_longer_than_a_step_and_a_plane_of_zeros_stay_sparse():
    n = 1 << 18
    base = np.random.default_rng(5).integers(0, 1 << 16, n, dtype=np.uint16)
    xor = np.zeros(n, np.uint16)
    xor[[0, 300, 301, 70_000, n - 1]] = [1, 0x80, 3, 0x0F, 0xFF]  # low bytes only: the high plane is all zero
    data = (base ^ xor).tobytes()
    delta = codec.encode_delta(data, base.tobytes(), BASE_ID, "BF16")
    assert _plane_modes(delta) == [codec.PLANE_SPARSE, codec.PLANE_SPARSE]
    assert len(delta) < 400
    _decodes_against_both_bases(delta, base.tobytes(), data, "BF16")
    # with a tail (the last len % 2 bytes, kept raw in the XOR)
    delta = codec.encode_delta(data + b"\x05", base.tobytes() + b"\x07", BASE_ID, "BF16")
    assert _plane_modes(delta) == [codec.PLANE_SPARSE, codec.PLANE_SPARSE]
    _decodes_against_both_bases(delta, base.tobytes() + b"\x07", data + b"\x05", "BF16")


def _sparse_frame(n: int, steps: list[int], values: list[int]) -> bytes:
    """A byte-plane frame of 2-byte elements whose low plane is sparse as given (the high one zeros)."""
    pc = codec._planes_compressor()
    s, v = pc.compress(bytes(steps)), pc.compress(bytes(values))
    body = codec._SPARSE_HEAD.pack(n, len(steps), len(s)) + s + v
    high = bytes(n)
    return (
        bytes((codec.PLANES, 2))
        + codec._PLANE_HEAD.pack(codec.PLANE_SPARSE, len(body))
        + body
        + codec._PLANE_HEAD.pack(codec.PLANE_RAW, n)
        + high
    )


def test_a_sparse_plane_that_says_more_than_it_holds_is_a_frame_error():
    good = _sparse_frame(100, [1, 5, 90], [7, 8, 0])
    assert codec.planes_size(good[1:]) == 200
    out = bytes(codec.decode_view(codec.PLANES, good[1:]))
    assert out[0] == 7 and out[2 * 5] == 8 and sum(out) == 15
    with pytest.raises(codec.FrameError, match="outside its 100 elements"):
        codec.decode_view(codec.PLANES, _sparse_frame(100, [50, 60], [1, 1])[1:], 200)
    with pytest.raises(codec.FrameError, match="outside"):
        codec.decode_view(codec.PLANES, _sparse_frame(100, [0, 3], [1, 1])[1:], 200)  # a step of 0 first
    with pytest.raises(codec.FrameError, match="entries where"):
        codec.decode_view(codec.PLANES, _sparse_frame(100, [1, 2], [1, 1])[1:], 300)  # of another length
    with pytest.raises(codec.FrameError):
        codec.decode_view(codec.PLANES, good[1:30], 200)  # cut short
