"""The older checkpoint formats: legacy (non-zip) ``torch.save`` files and GGUF v1.

Each is built for real (torch.save with ``_use_new_zipfile_serialization=False``; a GGUF v1 file
written by its layout: 32-bit counts, lengths and dimensions), then: a next step that changes 10%
of the tensors adds at most 1.02x their bytes, ``concord diff`` names exactly those tensors, restore
gives the same bytes; and files that only claim the format (truncated, lengths past the end,
absurd counts, pickles that would run a command) are snapshotted as one opaque part, with nothing
in them imported or called.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch

from concord.cli import main
from concord.snapshots.diff import diff_manifests
from concord.snapshots.formats import file_layout
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot

N_TENSORS = 20
CHANGED = ["layers.3.weight", "layers.15.weight"]  # 10% of the tensors


def _state(changed=()) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    sd = {f"layers.{i}.weight": torch.randn(128, 512, generator=g) for i in range(N_TENSORS)}
    for name in changed:
        sd[name] = sd[name] * 1.5
    return sd


def _legacy_save(obj, path: Path, protocol: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    return path


def _layout(path: Path):
    with open(path, "rb") as f:
        return file_layout(f, path.stat().st_size, str(path), path.name)


def _restores_the_same(store, manifest, source: Path, out: Path) -> None:
    restore(store, manifest, out)
    for p in source.rglob("*"):
        if p.is_file():
            assert (out / p.relative_to(source)).read_bytes() == p.read_bytes(), p


def _next_step_is_cut_at_its_tensors(tmp_path: Path, store, a: Path, b: Path, file: str, changed: list[str], changed_bytes: int, capsys) -> None:
    """What a next step adds and what diff says of it, through the library and the CLI."""
    first = snapshot(a, store, ref="ckpt/run")
    second = snapshot(b, store, ref="ckpt/run")
    assert 0 < second.new_bytes <= 1.02 * changed_bytes, (second.new_bytes, changed_bytes)
    d = diff_manifests(first.manifest, second.manifest)
    # a legacy archive may write the storages in another order: those tensors moved, not changed
    assert {c.tensor for c in d.changes if c.kind != "moved"} == set(changed)
    assert {c.kind for c in d.changes if c.tensor not in changed} <= {"moved"}
    capsys.readouterr()
    assert main(["diff", str(store.root), "ckpt/run~1", "ckpt/run"]) == 0
    shown = capsys.readouterr().out
    assert all(f"{file} :: {n}" in shown for n in changed), shown
    _restores_the_same(store, second.manifest, b, tmp_path / "out2")
    _restores_the_same(store, first.manifest, a, tmp_path / "out1")


# --------------------------------------------------------------------------- legacy torch.save


def test_a_legacy_torch_save_next_step_adds_only_the_changed_tensors(tmp_path, stores, capsys):
    a = _legacy_save(_state(), tmp_path / "a" / "model.pt").parent
    b = _legacy_save(_state(CHANGED), tmp_path / "b" / "model.pt").parent
    kind, layout = _layout(b / "model.pt")
    assert kind == "torch"
    tensors = {name: (dtype, shape, off, n) for k, name, off, n, dtype, shape in layout if k == "tensor"}
    assert set(tensors) == set(_state())
    raw = (b / "model.pt").read_bytes()
    for name, (dtype, shape, off, n) in tensors.items():  # each part is exactly that tensor's bytes
        assert (dtype, shape) == ("F32", (128, 512))
        assert raw[off : off + n] == _state(CHANGED)[name].numpy().tobytes()
    assert sum(entry[3] for entry in layout) == len(raw)
    _next_step_is_cut_at_its_tensors(tmp_path, stores[0], a, b, "model.pt", CHANGED, len(CHANGED) * 128 * 512 * 4, capsys)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_legacy_torch_save_names_a_bare_storage_by_its_key(tmp_path, protocol):
    """A storage saved on its own (no tensor names it), in pickles of any protocol torch writes;
    nested and shared tensors are named as in a zip archive (test_checkpoint_formats.py runs that
    test on both)."""
    obj = {"bare": torch.ones(6, dtype=torch.int16).untyped_storage(), "w": torch.ones(3)}
    path = _legacy_save(obj, tmp_path / "ckpt.pth", protocol)
    kind, layout = _layout(path)
    assert kind == "torch"
    assert [(name, dtype, shape) for k, name, _, _, dtype, shape in layout if k == "tensor"] == [("w", "F32", (3,))]
    bare = [(name, n) for k, name, _, n, _, _ in layout if k == "data"]
    assert len(bare) == 1 and bare[0][0].startswith("data/") and bare[0][1] == 12
    assert sum(entry[3] for entry in layout) == path.stat().st_size


# --------------------------------------------------------------------------- GGUF v1


def _s32(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def _write_gguf_v1(path: Path, tensors: dict[str, tuple[int, list[int], bytes]]) -> None:
    """A GGUF v1 file: u32 counts, string and array lengths and dimensions; default alignment 32."""
    kv = [
        _s32("general.architecture") + struct.pack("<I", 8) + _s32("llama"),
        _s32("tokenizer.ggml.tokens") + struct.pack("<III", 9, 8, 3) + b"".join(_s32(t) for t in "abc"),
        _s32("tokenizer.ggml.scores") + struct.pack("<III", 9, 6, 3) + struct.pack("<fff", 0.5, 0.25, 0.125),
        _s32("llama.context_length") + struct.pack("<II", 4, 2048),
    ]
    infos, data = [], b""
    for name, (gtype, dims, raw) in tensors.items():
        infos.append(_s32(name) + struct.pack(f"<I{len(dims)}I", len(dims), *dims) + struct.pack("<IQ", gtype, len(data)))
        data += raw + b"\0" * (-len(raw) % 32)
    head = b"GGUF" + struct.pack("<III", 1, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + b"\0" * (-len(head) % 32) + data)


def _v1_tensors(changed=frozenset()) -> dict[str, tuple[int, list[int], bytes]]:
    out = {}
    for i in range(N_TENSORS):
        name = f"blk.{i}.attn_q.weight"
        g = torch.Generator().manual_seed(i + (500 if name in changed else 0))
        if i % 2:  # Q4_0: blocks of 32 elements in 18 bytes
            out[name] = (2, [512, 64], torch.randint(0, 256, (512 * 64 // 32 * 18,), generator=g, dtype=torch.uint8).numpy().tobytes())
        else:
            out[name] = (1, [512, 60], torch.randn(512 * 60, generator=g).half().numpy().tobytes())
    return out


def test_a_gguf_v1_file_is_cut_at_its_tensors(tmp_path, stores, capsys):
    changed = ["blk.4.attn_q.weight", "blk.13.attn_q.weight"]
    _write_gguf_v1(tmp_path / "a" / "model.gguf", _v1_tensors())
    _write_gguf_v1(tmp_path / "b" / "model.gguf", _v1_tensors(set(changed)))
    kind, layout = _layout(tmp_path / "a" / "model.gguf")
    assert kind == "gguf"
    tensors = {name: (dtype, shape, n) for k, name, _, n, dtype, shape in layout if k == "tensor"}
    assert len(tensors) == N_TENSORS
    assert tensors["blk.0.attn_q.weight"] == ("F16", (60, 512), 512 * 60 * 2)
    assert tensors["blk.1.attn_q.weight"] == ("Q4_0", (64, 512), 512 * 64 // 32 * 18)
    changed_bytes = sum(len(_v1_tensors()[n][2]) for n in changed)
    _next_step_is_cut_at_its_tensors(tmp_path, stores[0], tmp_path / "a", tmp_path / "b", "model.gguf", changed, changed_bytes, capsys)


# --------------------------------------------------------------------------- hostile files


class _Shell:
    """Loading this runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _legacy_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def _pickles(*values) -> bytes:
    return b"".join(pickle.dumps(v, protocol=2) for v in values)


def _header() -> bytes:
    """The first three pickles of a legacy torch.save file, as torch writes them."""
    return _pickles(0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}})


def _first_count(raw: bytes, *storages: bytes) -> int:
    """The offset of the 8-byte count before the first in the file of these storages' bytes."""
    at = min(raw.index(s) for s in storages) - 8
    assert at > len(_header())
    return at


def _hostile_legacy(src: Path, marker: Path) -> list[str]:
    w, v = torch.arange(256, dtype=torch.float32), torch.full((64,), 3.0)
    good = _legacy_bytes({"w": w, "v": v})
    assert good.startswith(_header())
    first = _first_count(good, w.numpy().tobytes(), v.numpy().tobytes())
    cmd = f"touch {marker}"
    files = {
        "cut-in-pickles.pt": good[:100],
        "cut-in-storage.pt": good[: first + 8 + 100],
        "count-past-end.pt": good[:first] + struct.pack("<Q", 2**40) + good[first + 8 :],
        "count-absurd.pt": good[:first] + struct.pack("<Q", 2**64 - 1) + good[first + 8 :],
        "count-lies.pt": good[:first] + struct.pack("<Q", 255) + good[first + 8 :],  # one less than its id says
        "no-magic.pt": _pickles(12345) + good[len(_pickles(0x1950A86A20F9469CFC6C)) :],
        "run-a-command.pt": _header() + _pickles({"w": _Shell(cmd)}, []) + os.urandom(64),
        "run-a-command-first.pt": _pickles(_Shell(cmd)) + good,
        "keys-unnamed.pt": _header() + _pickles({"x": 1}, ["140000"]) + struct.pack("<Q", 4) + b"abcd",
        "keys-not-names.pt": _header() + _pickles({"x": 1}, [_Shell(cmd)]) + b"\0" * 16,
        "string-past-end.pt": _header() + b"\x80\x02X" + struct.pack("<I", 2**31) + b"abc",
        "bytes8-absurd.pt": _header() + b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"abc",
        "big-endian.pt": _pickles(0x1950A86A20F9469CFC6C, 1001, {"little_endian": False}) + good[len(_header()) :],
    }
    for name, raw in files.items():
        (src / name).write_bytes(raw)
    (src / "good.pt").write_bytes(good)
    return list(files)


def _hostile_gguf(src: Path) -> list[str]:
    _write_gguf_v1(src / "ok.gguf", _v1_tensors())
    raw = (src / "ok.gguf").read_bytes()
    key_len = 16  # magic, version, two u32 counts: then the first key's u32 length
    files = {
        "v1-truncated.gguf": raw[: len(raw) - 1000],
        "v1-tensor-count.gguf": raw[:8] + struct.pack("<I", 2**32 - 1) + raw[12:],
        "v1-kv-count.gguf": raw[:12] + struct.pack("<I", 2**32 - 1) + raw[16:],
        "v1-key-length.gguf": raw[:key_len] + struct.pack("<I", 2**32 - 1) + raw[key_len + 4 :],
        "v1-header-only.gguf": raw[:20],
        "v1-dims.gguf": raw.replace(_s32("blk.0.attn_q.weight") + struct.pack("<I", 2), _s32("blk.0.attn_q.weight") + struct.pack("<I", 2**31), 1),
    }
    for name, b in files.items():
        (src / name).write_bytes(b)
    return list(files)


def test_damaged_lying_or_hostile_files_are_one_opaque_part_and_nothing_runs(tmp_path, stores):
    marker = tmp_path / "ran"
    src = tmp_path / "src"
    src.mkdir()
    names = _hostile_legacy(src, marker) + _hostile_gguf(src)
    for name in names:
        kind, layout = _layout(src / name)
        assert (kind, [entry[:2] for entry in layout]) == ("blob", [("data", "")]), name
    assert not marker.exists()
    r = snapshot(src, stores[0])
    assert {r.manifest.by_path[n].kind for n in names} == {"blob"}
    assert [len(r.manifest.by_path[n].tensors) for n in ("good.pt", "ok.gguf")] == [2, N_TENSORS]  # what they were cut from
    _restores_the_same(stores[0], r.manifest, src, tmp_path / "out")
    assert not marker.exists()


@pytest.mark.parametrize("tail", [b"", os.urandom(40)], ids=["exact", "trailing-bytes"])
def test_a_legacy_file_with_a_large_pickle_is_read_past_the_first_window(tmp_path, tail, monkeypatch):
    """An object's pickle larger than the first window read (made small here: 64 KiB)."""
    from concord.snapshots.formats import torchlegacy

    monkeypatch.setattr(torchlegacy, "_WINDOW", 64 * 1024)
    sd = {f"module.{'x' * 200}.{i}": torch.full((4,), float(i)) for i in range(6000)}
    assert len(_legacy_bytes(sd)) > 8 * 64 * 1024  # two windows too short: 64 KiB, then 512 KiB
    path = tmp_path / "big.pt"
    path.write_bytes(_legacy_bytes(sd) + tail)
    kind, layout = _layout(path)
    assert kind == "torch"
    assert len([e for e in layout if e[0] == "tensor"]) == len(sd)
    assert sum(e[3] for e in layout) == path.stat().st_size
