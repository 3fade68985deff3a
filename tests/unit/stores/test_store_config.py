"""A store's configuration: compressed and encrypted stores hold the same snapshots as plain ones."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from toy_checkpoints import SMALL_CHUNK, files_equal, fine_tune

from concord.cli import main
from concord.errors import IntegrityError, StoreConfigError, StoreKeyError, UnknownEncodingError
from concord.hashing import chunk_id
from concord.snapshots.gc import collect_garbage
from concord.snapshots.refs import load_manifest
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot
from concord.snapshots.sync import replicate
from concord.snapshots.verify import verify
from concord.stores import LocalDirStore, codec
from concord.stores.base import chunk_key
from concord.stores.cipher import new_key
from concord.stores.config import CONFIG_KEY, KEY_FILE_ENV, configure, read_config

KEY = bytes(range(32))


def _store(path: Path, compress: str = "none", encrypt: bool = False) -> LocalDirStore:
    s = LocalDirStore(path)
    if encrypt:
        s.unlock(KEY)
    if compress != "none" or encrypt:
        configure(s, compress=compress, encrypt=encrypt)
    return s


@pytest.fixture
def kinds(tmp_path):
    """A plain, a compressed (auto), a zstd and an encrypted (auto) store."""
    return {
        "plain": _store(tmp_path / "plain"),
        "auto": _store(tmp_path / "auto", "auto"),
        "zstd": _store(tmp_path / "zstd", "zstd"),
        "sealed": _store(tmp_path / "sealed", "auto", encrypt=True),
    }


# ---------------------------------------------------------------------------- the codec


@pytest.mark.parametrize("dtype,np_type", [("BF16", np.uint16), ("F16", np.float16), ("F32", np.float32), ("F64", np.float64)])
def test_byte_planes_round_trip_every_width_with_a_tail(dtype, np_type):
    rng = np.random.default_rng(1)
    values = (rng.standard_normal(5000) * 0.02).astype(np.float32)
    raw = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes() if dtype == "BF16" else values.astype(np_type).tobytes()
    for data in (raw, raw + b"\x01\x02\x03"):  # a chunk cut mid-element keeps its tail
        frame = codec.encode(data, "auto", dtype)
        assert frame[0] == codec.PLANES and len(frame) < len(data)
        assert codec.decode(frame, len(data)) == data
        assert codec.decode(frame) == data  # the frame states its own size too


def test_incompressible_bytes_and_empty_chunks_are_stored_raw():
    noise = os.urandom(50_000)
    for mode, dtype in (("zstd", None), ("auto", "BF16"), ("auto", None)):
        frame = codec.encode(noise, mode, dtype)
        assert frame[0] == codec.RAW and frame[1:] == noise
        assert codec.decode(frame) == noise
    assert codec.decode(codec.encode(b"", "auto", "F32")) == b""


def test_a_frame_that_does_not_decode_is_a_frame_error():
    frame = codec.encode(b"\x00" * 10_000, "zstd")
    with pytest.raises(codec.FrameError):
        codec.decode(frame[:-4], 10_000)
    with pytest.raises(codec.FrameError, match="unknown encoding byte 0x7f"):
        codec.decode(b"\x7fabc")


def _plane_modes(frame: bytes) -> list[int]:
    """The mode byte (0 raw, 1 zstd) of each plane of a byte-plane frame."""
    width, pos, modes = frame[1], 2, []
    for _ in range(width):
        mode, length = codec._PLANE_HEAD.unpack_from(frame, pos)
        modes.append(mode)
        pos += codec._PLANE_HEAD.size + length
    return modes


def test_a_plane_is_compressed_only_when_a_sample_of_it_shrinks():
    rng = np.random.default_rng(2)
    weights = (rng.standard_normal(400_000) * 0.02).astype(np.float32)
    bf16 = (weights.view(np.uint32) >> 16).astype(np.uint16)
    frame = codec.encode(bf16.tobytes(), "auto", "BF16")
    # the mantissa plane (low byte) is close to random: kept raw; the exponent plane is coded
    assert _plane_modes(frame) == [0, 1]
    # fp32 widened from bf16: its two low planes are zeros (coded); its third holds 7 mantissa
    # bits and the exponent's lowest bit (random: raw); its top one sign and exponent (coded)
    widened = (bf16.astype(np.uint32) << 16).tobytes()
    frame = codec.encode(widened, "auto", "F32")
    assert _plane_modes(frame) == [1, 1, 0, 1]
    assert codec.decode(frame) == widened and len(frame) < 0.4 * len(widened)


#: 96 bf16 weights and a one-byte tail, as the 0x02 (rotated byte planes) frame earlier versions
#: of Concord wrote for them; stores written then still hold such frames
ROTATED_FRAME = bytes.fromhex(
    "020200600000009c86672329453ab6439740d2143133c6b92b37a72d359f629aeb9d61fd28f53941095a0955207f"
    "25204e918ebcfb1838a546f2898678efbe5db4d6bb0a2f4c857b012676b105a6472fff9ac2ade347f2198fce3d03"
    "6de3237eacfbb6bd58c57e013c00000028b52ffd20609d010002c60b0dd0153a2949b937210f0080680106cfc115"
    "9e36dfe6e2f83f977345293bea9745f2f8778523edcde3c69abaec1b100021"
)
ROTATED_RAW = bytes.fromhex(
    "ce37c33bb3bb91bc14bca2bc9d3adb3c21bc4bbc203ce93b0a3b98bc19ba633cdcbc15bc1bbdd3bc16bd9abbcfbc"
    "b13b4d3b75bb4ebd30bc7eba143bfabc1cbca0bc84bcad3c84bc2aba903c3fbc12bb103ba73ac8bcc73ade3cfdbc"
    "8c3c1c3b52bc233d793cc4bcc33a3c3c77bb5f3caeba5a3ceb3c5dbc853b17bc263bc2bc3dbc80bb933cbb3cd8bc"
    "82bc533c23bd17bcffbacd3c613cd6bbf1bba3bbf93c0cbcc7bbe73b1ebb81bbb6bc71b911bcbf3c563cfdb95b3c"
    "debbac3ce2b83f3c21"
)


def test_rotated_byte_plane_frames_of_earlier_versions_still_decode():
    assert ROTATED_FRAME[0] == codec.ROTATED_PLANES
    assert codec.decode(ROTATED_FRAME) == ROTATED_RAW
    assert bytes(codec.decode_view(ROTATED_FRAME[0], ROTATED_FRAME[1:], len(ROTATED_RAW))) == ROTATED_RAW
    # every width: a 0x02 frame is the 0x03 frame of the elements rotated left by one bit
    rng = np.random.default_rng(4)
    values = (rng.standard_normal(3000) * 0.02).astype(np.float64)
    for dtype, kind in (("BF16", np.uint16), ("F16", np.uint16), ("F32", np.uint32), ("F64", np.uint64)):
        bits = 8 * np.dtype(kind).itemsize
        if dtype == "BF16":
            a = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            a = values.astype({"F16": np.float16, "F32": np.float32, "F64": np.float64}[dtype]).view(kind)
        rotated = ((a << kind(1)) | (a >> kind(bits - 1))).tobytes() + b"\x05"
        frame = bytearray(codec.encode(rotated, "auto", dtype))
        assert frame[0] == codec.PLANES
        frame[0] = codec.ROTATED_PLANES
        assert codec.decode(bytes(frame)) == a.tobytes() + b"\x05"


def test_views_hold_the_same_bytes_as_copies():
    rng = np.random.default_rng(3)
    data = (rng.standard_normal(100_000) * 0.02).astype(np.float32).tobytes()
    for mode, dtype in (("auto", "F32"), ("zstd", None), ("none", None)):
        frame = codec.encode(data, mode, dtype)
        assert bytes(codec.encode_view(data, mode, dtype)) == frame
        assert bytes(codec.decode_view(frame[0], memoryview(frame)[1:])) == data


def test_a_frame_claiming_more_bytes_than_any_chunk_or_than_it_holds_is_refused():
    import zstandard

    huge = zstandard.ZstdCompressor().compress(b"\x00" * (codec.MAX_RAW_BYTES + 1))
    with pytest.raises(codec.FrameError, match="more than any chunk"):
        codec.decode(bytes((codec.ZSTD,)) + huge)
    frame = codec.encode(b"\x00" * 10_000, "zstd")
    with pytest.raises(codec.FrameError, match="more than 9000 bytes"):
        codec.decode(frame, 9_000)
    with pytest.raises(codec.FrameError, match="decodes to 10000 bytes, 11000 expected"):
        codec.decode(frame, 11_000)


def test_reads_on_many_threads_each_get_their_own_chunk(tmp_path):
    """A chunk read is a view of a per-thread buffer: threads never see each other's bytes."""
    from concurrent.futures import ThreadPoolExecutor

    store = _store(tmp_path / "s", "auto", encrypt=True)
    rng = np.random.default_rng(4)
    chunks = [(rng.standard_normal(20_000 + i) * 0.02).astype(np.float32).tobytes() for i in range(24)]
    ids = [chunk_id(c) for c in chunks]
    for cid, c in zip(ids, chunks):
        store.put_chunk(cid, c, dtype="F32")

    def read(i: int) -> bool:
        return all(bytes(store.read_chunk(ids[j])) == chunks[j] for j in (i, (i + 7) % 24, i))

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(read, range(24)))


# ---------------------------------------------------------------------------- roots and restores


def test_every_store_kind_holds_the_same_root_and_restores_identically(kinds, ckpt, tmp_path):
    roots = {name: snapshot(ckpt, s, chunk_size=SMALL_CHUNK, ref="m").root for name, s in kinds.items()}
    assert len(set(roots.values())) == 1
    for name, s in kinds.items():
        out = tmp_path / f"out-{name}"
        restore(s, load_manifest(s, roots[name]), out)
        assert files_equal(ckpt, out), name
        assert verify(s).ok, name
    size = {name: sum(n for _, n, _ in s.iter_chunk_stats()) for name, s in kinds.items()}
    assert size["auto"] < size["zstd"] < size["plain"]  # byte planes beat plain zstd on weights


def test_sync_both_ways_between_plain_compressed_and_encrypted(kinds, ckpt, tmp_path):
    names = list(kinds)
    for i, a in enumerate(names):  # each kind snapshots, then syncs to the next (around the ring)
        src, dst = kinds[a], kinds[names[(i + 1) % len(names)]]
        ft = fine_tune(ckpt, tmp_path / f"ft-{a}", ["layers.0.attn.q.weight"], delta=0.01 * (i + 1))
        root = snapshot(ft, src, chunk_size=SMALL_CHUNK, ref=f"from-{a}").root
        (r,) = replicate(src, [dst], ref=f"from-{a}")
        assert r.root == root and r.chunks_sent > 0 and r.raw_bytes_sent > 0
        out = tmp_path / f"back-{a}"
        restore(dst, load_manifest(dst, root), out)
        assert files_equal(ft, out)
    for s in kinds.values():
        assert verify(s).ok


def test_same_encoding_moves_encoded_bytes_and_reports_both_sizes(tmp_path, ckpt):
    a, b = _store(tmp_path / "a", "auto"), _store(tmp_path / "b", "auto")
    snapshot(ckpt, a, chunk_size=SMALL_CHUNK, ref="m")
    (r,) = replicate(a, [b], ref="m")
    assert r.bytes_sent < r.raw_bytes_sent  # what crossed is compressed
    assert r.bytes_sent == sum(n for _, n, _ in b.iter_chunk_stats())
    assert sorted(a.iter_chunk_stats()) != [] and {c for c, _, _ in a.iter_chunk_stats()} == set(b.iter_chunks())


# ---------------------------------------------------------------------------- encryption at rest


def test_an_encrypted_store_holds_no_weight_bytes_tensor_names_or_chunk_ids(tmp_path, ckpt):
    s = _store(tmp_path / "sealed", "none", encrypt=True)
    root = snapshot(ckpt, s, chunk_size=SMALL_CHUNK, ref="m").root
    ids = set(load_manifest(s, root).chunk_lengths())
    weights = (ckpt / "model.safetensors").read_bytes()
    probes = [weights[-4096:-3072], (ckpt / "tokenizer.txt").read_bytes()[:512], b"layers.0.attn.q.weight", b"hidden_size"]
    blobs = [p.read_bytes() for p in (tmp_path / "sealed").rglob("*") if p.is_file()]
    names = {p.name for p in (tmp_path / "sealed").rglob("*")}
    assert not any(probe in blob for probe in probes for blob in blobs)
    assert not ids & names  # object names are keyed hashes, not the chunk ids
    assert len(list(s.iter_chunk_stats())) == len(ids)  # yet identical chunks are stored once


def test_no_key_or_a_wrong_key_is_refused_and_writes_nothing(tmp_path, ckpt, monkeypatch):
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    _store(tmp_path / "sealed", encrypt=True)
    before = sorted(str(p) for p in (tmp_path / "sealed").rglob("*"))
    for key in (None, new_key()):
        s = LocalDirStore(tmp_path / "sealed")
        if key is not None:
            s.unlock(key)
        with pytest.raises(StoreKeyError, match="no key was given" if key is None else "is not this store's key"):
            snapshot(ckpt, s, chunk_size=SMALL_CHUNK, ref="m")
    assert sorted(str(p) for p in (tmp_path / "sealed").rglob("*")) == before


def test_gc_in_an_encrypted_store_maps_live_chunks_to_their_keyed_names(tmp_path, ckpt):
    s = _store(tmp_path / "sealed", "auto", encrypt=True)
    keep = snapshot(ckpt, s, chunk_size=SMALL_CHUNK, ref="keep").root
    stray = os.urandom(5000)
    s.put_chunk(chunk_id(stray), stray)
    r = collect_garbage(s, grace_seconds=0, now=time.time() + 60)
    assert r.deleted_chunks == 1 and not s.has_chunks([chunk_id(stray)])
    out = tmp_path / "out"
    restore(s, load_manifest(s, keep), out)
    assert files_equal(ckpt, out)


# ---------------------------------------------------------------------------- bad input


def test_a_corrupt_encoded_chunk_is_found_by_verify_and_repaired_from_a_replica(tmp_path, ckpt):
    a, b = _store(tmp_path / "a", "auto"), _store(tmp_path / "b", "auto")
    root = snapshot(ckpt, a, chunk_size=SMALL_CHUNK, ref="m").root
    replicate(a, [b], ref="m")
    cid = load_manifest(a, root).files[0].parts[0].chunk_ids()[0]
    path = tmp_path / "a" / chunk_key(a.chunk_object_name(cid))
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises((UnknownEncodingError, IntegrityError)):
        a.get_chunk(cid)
    found = verify(a)
    assert cid in found.corrupt and not found.ok
    assert verify(a, repair_from=b).repaired and verify(a).ok


def test_an_unknown_encoding_byte_names_the_chunk(tmp_path):
    s = _store(tmp_path / "a", "zstd")
    data = b"weights" * 1000
    cid = chunk_id(data)
    s.put_chunk(cid, data)
    path = tmp_path / "a" / chunk_key(cid)
    path.write_bytes(b"\x7f" + path.read_bytes()[1:])
    with pytest.raises(UnknownEncodingError, match=rf"chunk {cid} in .*unknown encoding byte 0x7f"):
        s.get_chunk(cid)


def test_a_configuration_from_a_newer_concord_is_refused_with_its_version(tmp_path):
    s = _store(tmp_path / "a", "auto")
    doc = json.loads((tmp_path / "a" / CONFIG_KEY).read_text())
    (tmp_path / "a" / CONFIG_KEY).write_text(json.dumps({**doc, "version": 7}))
    with pytest.raises(StoreConfigError, match="version 7, written by a newer Concord"):
        LocalDirStore(tmp_path / "a").list_refs()
    with pytest.raises(StoreConfigError, match="version 7"):
        s.forget_encoding() or s.get_chunk("0" * 64)


def test_init_refuses_to_change_a_store_that_holds_snapshots(tmp_path, ckpt):
    plain = LocalDirStore(tmp_path / "plain")
    snapshot(ckpt, plain, chunk_size=SMALL_CHUNK, ref="m")
    with pytest.raises(StoreConfigError, match="already holds snapshots"):
        configure(plain, compress="auto")
    assert read_config(plain) is None
    s = _store(tmp_path / "auto", "auto")
    assert configure(s, compress="auto").compress == "auto"  # asking again changes nothing
    with pytest.raises(StoreConfigError, match="already configured"):
        configure(s, compress="zstd")


def test_cli_init_writes_a_key_once_and_commands_take_it(tmp_path, ckpt, capsys, monkeypatch):
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    store, key = tmp_path / "s", tmp_path / "store.key"
    assert main(["init", str(store), "--compress", "auto", "--encrypt", "--key-file", str(key), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["compress"] == "auto" and info["encryption"]["algorithm"] == "AES-256-GCM" and info["key_file_created"]
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert main(["snapshot", str(ckpt), "--store", str(store), "--ref", "m", "--key-file", str(key), "--json"]) == 0
    capsys.readouterr()
    assert main(["refs", str(store)]) == 12  # 12: wrong or missing key
    err = capsys.readouterr().err.strip()
    assert err.startswith("concord: error: store") and "is encrypted: no key was given" in err and "\n" not in err
    assert key.read_text().strip() not in err
    assert main(["restore", str(store), str(tmp_path / "out"), "--ref", "m", "--key-file", str(key)]) == 0
    assert files_equal(ckpt, tmp_path / "out")


def test_a_tier_policy_sets_compression_per_tier(tmp_path):
    from concord.errors import PolicyError
    from concord.tiering.policy import TierPolicy

    def policy(cold_compress):
        return TierPolicy.from_dict(
            {
                "hot": {"store": str(tmp_path / "hot"), "keep": 1},
                "warm": {"store": str(tmp_path / "warm"), "keep": 2, "media": "nas"},
                "cold": {"store": str(tmp_path / "cold"), "media": "tape", "offsite": True, "compress": cold_compress},
            },
            source="test",
        )

    p = policy("auto")
    assert p.cold.to_dict()["compress"] == "auto"
    assert read_config(p.cold.open()).compress == "auto" and read_config(p.hot.open()) is None
    from concord.tiering import tier_status

    assert tier_status(p)["encodings"] == {"hot": "plain", "warm": "plain", "cold": "compress auto"}
    with pytest.raises(PolicyError, match="cold.compress must be one of none, zstd, auto"):
        policy("brotli")
    with pytest.raises(StoreConfigError, match="already configured"):
        policy("zstd").cold.open()


def test_a_tier_policy_gives_each_tier_its_own_key(tmp_path, ckpt, monkeypatch):
    from concord.errors import PolicyError
    from concord.stores.cipher import Cipher, write_key_file
    from concord.tiering import add_checkpoint, load_policy, tier_status

    monkeypatch.delenv("CONCORD_KEY_FILE", raising=False)
    (tmp_path / "keys").mkdir()
    keys = {t: new_key() for t in ("warm", "cold")}
    for t, k in keys.items():
        write_key_file(str(tmp_path / "keys" / f"{t}.key"), k)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "namespace: run\n"
        "hot:  {store: tiers/hot, keep: 1}\n"
        "warm: {store: tiers/warm, keep: 2, media: nas, key_file: keys/warm.key}\n"
        "cold: {store: tiers/cold, media: tape, offsite: true, compress: auto, key_file: keys/cold.key}\n"
    )
    p = load_policy(str(policy_file))  # key files are relative to the policy file, like its folders
    assert p.cold.key_file == str(tmp_path / "keys" / "cold.key") and p.cold.to_dict()["key_file"] == p.cold.key_file
    r = add_checkpoint(p, ckpt, "step-1", step=1)
    assert all(r.new_bytes[t] > 0 for t in ("hot", "warm", "cold"))
    assert tier_status(p)["encodings"] == {"hot": "plain", "warm": "encrypted", "cold": "compress auto, encrypted"}
    for t, k in keys.items():  # each tier's store was made encrypted with its own key
        config = read_config(LocalDirStore(tmp_path / "tiers" / t))
        assert config.encryption["key_id"] == Cipher(k, bytes.fromhex(config.encryption["salt"])).key_id
    # the cold copy restores with the policy's key, and nothing else opens it
    from concord.tiering import restore_checkpoint

    out = restore_checkpoint(p, "step-1", tmp_path / "back", tier="cold")
    assert out.tier == "cold" and files_equal(ckpt, Path(out.path))
    with pytest.raises(StoreKeyError):
        LocalDirStore(tmp_path / "tiers" / "cold").encoding()
    # a wrong key names the store; an unreadable key file names the tier's key
    policy_file.write_text(policy_file.read_text().replace("keys/cold.key", "keys/warm.key"))
    with pytest.raises(StoreKeyError, match="not this store's key .*Fix cold.key_file"):
        tier_status(load_policy(str(policy_file)))
    policy_file.write_text(policy_file.read_text().replace("auto, key_file: keys/warm.key", "auto, key_file: keys/none.key"))
    with pytest.raises(PolicyError, match="cold.key_file: cannot read key file"):
        tier_status(load_policy(str(policy_file)))


def test_ledger_rounds_in_an_encrypted_store_are_sealed_and_still_verify(tmp_path):
    from concord.federation.ledger import append_round, verify_ledger

    s = _store(tmp_path / "sealed", encrypt=True)
    for i in range(3):
        append_round(s, "acme", {"method": "exact", "inputs": [f"adapter-secret-{i}"]})
    assert verify_ledger(s, "acme").ok and verify_ledger(s, "acme").rounds == 3
    blobs = b"".join(p.read_bytes() for p in (tmp_path / "sealed").rglob("*") if p.is_file())
    assert b"adapter-secret" not in blobs and b"exact" not in blobs


def test_an_encrypted_store_travels_to_a_task_runner_with_its_key_not_its_derived_keys(tmp_path, ckpt):
    import pickle

    s = _store(tmp_path / "sealed", "auto", encrypt=True)
    root = snapshot(ckpt, s, chunk_size=SMALL_CHUNK, ref="m").root
    copy = pickle.loads(pickle.dumps(s))
    assert copy._store_encoding is None and copy.read_ref("m").root == root
