"""Tensor-aware chunking of the formats training jobs write: DCP, torch.save archives, GGUF
(legacy torch.save files and GGUF v1: test_legacy_checkpoint_formats.py).

Each format is built for real (torch.save, torch.distributed.checkpoint.save, a GGUF file written
by the spec), then: a next step that changes 10% of the tensors adds at most 1.02x their bytes,
diff names exactly those tensors, restore gives the same bytes; and files that only claim the
format (truncated, offsets past the end or overlapping, pickles that would run a command) are
snapshotted as opaque files without anything in them being executed.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from concord.cli import main
from concord.hashing import chunk_id
from concord.snapshots.diff import diff_manifests
from concord.snapshots.formats import file_layout
from concord.snapshots.formats.common import Unreadable
from concord.snapshots.formats.safepickle import Call, Global, read
from concord.snapshots.manifest import (
    DEFAULT_CHUNK_SIZE,
    Manifest,
    make_file,
    make_part,
)
from concord.snapshots.restore import restore
from concord.snapshots.snapshot import snapshot

N_TENSORS = 20
NUMEL = 64 * 1024  # 256 KiB of float32 each
CHANGED = ["layer.3.weight", "layer.15.weight"]  # 10% of the tensors


def _state(changed: list[str] = ()) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    sd = {f"layer.{i}.weight": torch.randn(256, NUMEL // 256, generator=g) for i in range(N_TENSORS)}
    for name in changed:
        sd[name] = sd[name] + 1.0
    return sd


def _changed_bytes() -> int:
    return len(CHANGED) * NUMEL * 4


def _torch_save(folder: Path, sd) -> Path:
    folder.mkdir(parents=True)
    torch.save(sd, folder / "model.pt")
    return folder


def _dcp_save(folder: Path, sd) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=str(folder))
    return folder


def _layout(path: Path):
    with open(path, "rb") as f:
        return file_layout(f, path.stat().st_size, str(path), path.name)


def _assert_restores(store, manifest: Manifest, source: Path, out: Path) -> None:
    restore(store, manifest, out)
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == files
    for rel in files:
        assert (out / rel).read_bytes() == (source / rel).read_bytes(), rel


def _next_step(tmp_path: Path, stores, save):
    a = save(tmp_path / "step1", _state())
    b = save(tmp_path / "step2", _state(CHANGED))
    first = snapshot(a, stores[0], ref="ckpt/run")
    second = snapshot(b, stores[0], ref="ckpt/run")
    return a, b, first, second


@pytest.mark.parametrize(
    "save, file, kind",
    [(_torch_save, "model.pt", "torch"), (_dcp_save, "__0_0.distcp", "dcp")],
    ids=["torch.save", "dcp"],
)
def test_next_step_adds_only_the_changed_tensors(tmp_path, stores, save, file, kind, capsys):
    a, b, first, second = _next_step(tmp_path, stores, save)
    entry = second.manifest.by_path[file]
    assert entry.kind == kind
    tensors = {p.name: p for p in entry.tensors}
    assert set(tensors) == set(_state())
    assert {(p.dtype, p.shape) for p in tensors.values()} == {("F32", (256, NUMEL // 256))}
    raw = (b / file).read_bytes()
    for p in entry.parts:  # every part's chunks start at its first byte
        spans = list(p.chunk_spans(DEFAULT_CHUNK_SIZE))
        assert not spans or spans[0][1] == p.offset
        for cid, off, n in spans:
            assert chunk_id(raw[off : off + n]) == cid
    for name, t in tensors.items():  # a tensor part holds exactly that tensor's bytes
        want = _state(CHANGED)[name].numpy().tobytes()
        assert raw[t.offset : t.offset + t.length] == want

    assert 0 < second.new_bytes <= 1.02 * _changed_bytes(), (second.new_bytes, _changed_bytes())
    d = diff_manifests(first.manifest, second.manifest)
    assert {(c.file, c.tensor) for c in d.changes if c.file == file} == {(file, n) for n in CHANGED}

    capsys.readouterr()
    assert main(["diff", str(stores[0].root), first.root, second.root]) == 0
    shown = capsys.readouterr().out
    assert all(f"{file} :: {n}" in shown for n in CHANGED), shown
    assert "layer.4.weight" not in shown

    _assert_restores(stores[0], second.manifest, b, tmp_path / "out2")
    _assert_restores(stores[0], first.manifest, a, tmp_path / "out1")


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_torch_save_names_nested_and_shared_tensors(tmp_path, zipped):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    obj = {
        "model": {"embed.weight": w, "head.weight": w, "norm": torch.ones(5, dtype=torch.bfloat16)},
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(7, dtype=torch.float64)}}, "param_groups": [{"lr": 0.1}]},
        "step": torch.tensor(3),
        "view": torch.arange(10)[2:5],
        "param": torch.nn.Parameter(torch.ones(2, 2)),
    }
    torch.save(obj, tmp_path / "ckpt.pth", _use_new_zipfile_serialization=zipped)
    kind, layout = _layout(tmp_path / "ckpt.pth")
    assert kind == "torch"
    found = {name: (dtype, shape) for k, name, _, _, dtype, shape in layout if k == "tensor"}
    assert found == {
        "model.embed.weight, model.head.weight": ("F32", (3, 4)),
        "model.norm": ("BF16", (5,)),
        "optimizer.state.0.exp_avg": ("F64", (7,)),
        "step": ("I64", ()),
        "view": ("I64", (10,)),  # a view saves its whole storage: the storage's flat shape
        "param": ("F32", (2, 2)),
    }
    assert sum(entry[3] for entry in layout) == (tmp_path / "ckpt.pth").stat().st_size


def _gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _write_gguf(path: Path, tensors: dict[str, tuple[int, list[int], bytes]], alignment: int = 32, *, overlap: bool = False) -> None:
    """A GGUF v3 file by the spec: header, key-values, tensor infos, aligned data."""
    kv = [
        _gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string("llama"),
        _gguf_string("general.alignment") + struct.pack("<II", 4, alignment),
        _gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + b"".join(_gguf_string(t) for t in "abc"),
        _gguf_string("llama.rope.scale") + struct.pack("<If", 6, 1.5),
    ]
    infos, data, offset = [], b"", 0
    for name, (gtype, dims, raw) in tensors.items():
        infos.append(
            _gguf_string(name)
            + struct.pack("<I", len(dims))
            + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", gtype, 0 if overlap else offset)
        )
        pad = -len(raw) % alignment
        data += raw + b"\0" * pad
        offset += len(raw) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    head += b"\0" * (-len(head) % alignment)
    path.write_bytes(head + data)


def _gguf_tensors(changed: set[str] = frozenset()) -> dict[str, tuple[int, list[int], bytes]]:
    out = {}
    for i in range(N_TENSORS):
        name = f"blk.{i}.ffn.weight"
        seed = i + (1000 if name in changed else 0)
        if i % 2:  # Q8_0: blocks of 32 elements in 34 bytes
            out[name] = (
                8,
                [256, 256],
                torch.randint(
                    0, 256, (256 * 256 // 32 * 34,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
                )
                .numpy()
                .tobytes(),
            )
        else:
            out[name] = (0, [256, 250], torch.randn(250 * 256, generator=torch.Generator().manual_seed(seed)).numpy().tobytes())
    return out


def test_gguf_is_cut_at_its_tensors(tmp_path, stores, capsys):
    changed = {"blk.3.ffn.weight", "blk.14.ffn.weight"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _write_gguf(tmp_path / "a" / "model.gguf", _gguf_tensors())
    _write_gguf(tmp_path / "b" / "model.gguf", _gguf_tensors(changed))
    kind, layout = _layout(tmp_path / "a" / "model.gguf")
    assert kind == "gguf"
    tensors = {name: (dtype, shape, length) for k, name, _, length, dtype, shape in layout if k == "tensor"}
    assert tensors["blk.0.ffn.weight"] == ("F32", (250, 256), 250 * 256 * 4)
    assert tensors["blk.1.ffn.weight"] == ("Q8_0", (256, 256), 256 * 256 // 32 * 34)
    assert len(tensors) == N_TENSORS

    first = snapshot(tmp_path / "a", stores[0])
    second = snapshot(tmp_path / "b", stores[0])
    changed_bytes = sum(len(_gguf_tensors(changed)[n][2]) for n in changed)
    assert 0 < second.new_bytes <= 1.02 * changed_bytes
    d = diff_manifests(first.manifest, second.manifest)
    assert {c.tensor for c in d.changes} == changed
    _assert_restores(stores[0], second.manifest, tmp_path / "b", tmp_path / "out")


def test_other_files_keep_their_blob_roots(tmp_path, stores):
    """Files of no checkpoint format, or not the format their extension says, are cut as before."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"hidden": 8}))
    (src / "tokenizer.bin").write_bytes(os.urandom(3000))  # a .bin that is no zip
    (src / "model.gguf").write_bytes(b"not a gguf at all")
    (src / "opt.pt").write_bytes(b"")
    r = snapshot(src, stores[0])
    files = []
    for p in sorted(src.iterdir()):
        raw = p.read_bytes()
        ids = [chunk_id(raw[i : i + DEFAULT_CHUNK_SIZE]) for i in range(0, len(raw), DEFAULT_CHUNK_SIZE)]
        files.append(make_file(p.name, len(raw), "blob", [make_part("data", "", 0, len(raw), ids)]))
    assert r.root == Manifest.build(DEFAULT_CHUNK_SIZE, files).root
    assert {f.kind for f in r.manifest.files} == {"blob"}
    again = Manifest.from_json(r.manifest.to_json(), expected_root=r.root)
    assert again.root == r.root


# --------------------------------------------------------------------------- hostile files


class _Shell:
    """Unpickling this runs a shell command: what a hostile checkpoint hides in data.pkl."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Exec:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        return (exec, (self.code,))


def _hostile_pickles(marker: Path) -> list[bytes]:
    cmd = f"touch {marker}"
    return [
        pickle.dumps({"layer.0.weight": _Shell(cmd)}, protocol=2),
        pickle.dumps(_Exec(f"open({str(marker)!r}, 'w').close()"), protocol=4),
        b"cos\nsystem\n(V" + cmd.encode() + b"\ntR.",  # protocol 0, by hand
        b"\x80\x02cbuiltins\neval\nq\x00X\x10\x00\x00\x00__import__('os')q\x01\x85q\x02Rq\x03.",
    ]


def _torch_zip(path: Path, pkl: bytes, storages: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)
        z.writestr("archive/version", "3\n")


def test_a_pickle_that_would_run_a_command_is_never_run(tmp_path, stores):
    marker = tmp_path / "ran"
    src = tmp_path / "src"
    src.mkdir()
    for i, pkl in enumerate(_hostile_pickles(marker)):
        _torch_zip(src / f"evil{i}.pt", pkl, {"0": os.urandom(4096)})
    torch.save(_state()["layer.0.weight"], src / "good.pt")
    dcp_dir = _dcp_save(src / "dcp", {"w": torch.ones(8)})
    (dcp_dir / ".metadata").write_bytes(_hostile_pickles(marker)[0])

    r = snapshot(src, stores[0])
    assert not marker.exists()
    for i in range(len(_hostile_pickles(marker))):  # cut at the zip's entries, named by them
        entry = r.manifest.by_path[f"evil{i}.pt"]
        assert entry.kind == "torch" and not entry.tensors
        assert ("data", "data/0") in entry.by_key
    assert r.manifest.by_path["dcp/__0_0.distcp"].kind == "blob"
    for pkl in _hostile_pickles(marker):
        tree = read(pkl)  # the walk gives inert records of what loading would call
        assert isinstance(tree, (dict, Call))
    assert not marker.exists()
    _assert_restores(stores[0], r.manifest, src, tmp_path / "out")
    assert not marker.exists()


def test_the_pickle_walk_refuses_what_it_cannot_follow():
    deep = 100_000  # hashing a tuple this deep would overflow the C stack and kill the process
    for bad in (
        b"",
        b"\x80\x02",
        b"\x80\x02]q\x00(K\x01.",
        b"\x80\x02\x82\x01.",
        b"\x80\x05\x97.",
        b"\x80\x02}]]s.",
        b"\x80\x02}K\x01" + b"\x85" * deep + b"K\x02s.",
        b"\x80\x02" + b"(" * deep + b"K\x01" + b"\x91" * deep + b".",
    ):
        with pytest.raises(Unreadable):
            read(bad)
    tree = read(pickle.dumps(Global("os", "system"), protocol=2))  # a dataclass instance, rebuilt inertly
    assert isinstance(tree, Call) and tree.func == Global("concord.snapshots.formats.safepickle", "Global")
    assert tree.attrs() == {"module": "os", "name": "system"}


def _corrupt(path: Path, how) -> None:
    raw = bytearray(path.read_bytes())
    path.write_bytes(bytes(how(raw)))


def _patched_metadata(folder: Path, fix) -> None:
    """Rewrite .metadata through torch itself (the test is the only one allowed to unpickle it)."""
    md = pickle.loads((folder / ".metadata").read_bytes())
    fix(md)
    (folder / ".metadata").write_bytes(pickle.dumps(md))


def _shift(md, delta: int) -> None:
    for info in md.storage_data.values():
        info.offset += delta


def _overlap(md) -> None:
    for info in md.storage_data.values():
        info.offset = 0


def _hostile_files(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    sd = {"a": torch.randn(64, 64), "b": torch.randn(32)}
    torch.save(sd, src / "cut.pt")
    _corrupt(src / "cut.pt", lambda raw: raw[: len(raw) // 2])  # truncated: no central directory
    torch.save(sd, src / "cd.pt")
    _corrupt(src / "cd.pt", lambda raw: raw.replace(b"PK\x01\x02", b"PK\x01\x03", 1))  # central entry damaged
    torch.save(sd, src / "big.pt")
    # every size field of the zip64 end record claims 2**62 bytes
    _corrupt(src / "big.pt", lambda raw: raw[: raw.rfind(b"PK\x06\x06") + 40] + struct.pack("<QQ", 2**62, 2**62) + raw[raw.rfind(b"PK\x06\x06") + 56 :])
    for name, fix in (("past", lambda md: _shift(md, 10**9)), ("overlap", _overlap)):
        _patched_metadata(_dcp_save(src / name, sd), fix)
    _dcp_save(src / "nometa", sd)
    (src / "nometa" / ".metadata").unlink()
    _write_gguf(src / "trunc.gguf", _gguf_tensors())
    _corrupt(src / "trunc.gguf", lambda raw: raw[: len(raw) - 1000])
    _write_gguf(src / "huge.gguf", _gguf_tensors())
    _corrupt(src / "huge.gguf", lambda raw: raw[:8] + struct.pack("<Q", 2**60) + raw[16:])  # tensor count
    _write_gguf(src / "overlap.gguf", _gguf_tensors(), overlap=True)  # every tensor at offset 0
    _write_gguf(src / "strlen.gguf", _gguf_tensors())
    _corrupt(src / "strlen.gguf", lambda raw: raw[:24] + struct.pack("<Q", 2**63) + raw[32:])  # first key's length
    return src


HOSTILE = [
    "cut.pt",
    "cd.pt",
    "big.pt",
    "past/__0_0.distcp",
    "overlap/__0_0.distcp",
    "nometa/__0_0.distcp",
    "trunc.gguf",
    "huge.gguf",
    "overlap.gguf",
    "strlen.gguf",
]


def test_damaged_or_lying_checkpoints_are_snapshotted_as_blobs(tmp_path, stores):
    src = _hostile_files(tmp_path)
    for rel in HOSTILE:
        kind, layout = _layout(src / rel)
        assert (kind, [entry[:2] for entry in layout]) == ("blob", [("data", "")]), rel
    r = snapshot(src, stores[0])
    assert all(r.manifest.by_path[rel].kind == "blob" for rel in HOSTILE)
    _assert_restores(stores[0], r.manifest, src, tmp_path / "out")


def test_a_dcp_record_written_raw_or_as_bytes_is_cut_at_its_records(tmp_path):
    """A .distcp whose tensor records hold raw bytes (the safetensors-style serialization)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    folder = tmp_path / "raw"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        writer = dcp.FileSystemWriter(str(folder), serialization_format=SerializationFormat.SAFETENSORS)
        dcp.save({"w": torch.arange(1024, dtype=torch.float32), "meta": {"epoch": 2}, "io": io.BytesIO(b"hello")}, storage_writer=writer)
    files = [p for p in folder.iterdir() if p.suffix == ".distcp"]
    assert files
    kinds = [_layout(p) for p in files]
    tensors = [(name, dtype, shape) for kind, layout in kinds for k, name, _, _, dtype, shape in layout if k == "tensor"]
    assert ("w", "F32", (1024,)) in tensors
    assert all(kind == "dcp" for kind, _ in kinds)


def test_a_dcp_written_by_several_threads_is_cut_in_every_file(tmp_path, stores):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_state(), storage_writer=dcp.FileSystemWriter(str(folder), thread_count=4))
    files = sorted(p.name for p in folder.glob("*.distcp"))
    assert len(files) > 1
    r = snapshot(folder, stores[0])
    assert {r.manifest.by_path[f].kind for f in files} == {"dcp"}
    names = [p.name for f in files for p in r.manifest.by_path[f].tensors]
    assert sorted(names) == sorted(_state())
    _assert_restores(stores[0], r.manifest, folder, tmp_path / "out")
