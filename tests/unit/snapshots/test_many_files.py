"""Snapshots of many small files: bounded open files, local errors named as local, and manifests
of 100,000 files read back with the roots they always had."""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from concord.errors import SourceChangedError
from concord.hashing import (
    FILE,
    PART,
    SNAPSHOT,
    canonical_json,
    chunk_id,
    flat_canonical_json,
)
from concord.snapshots.manifest import (
    FORMAT,
    PART_KINDS,
    Manifest,
    file_meta,
    file_meta_json,
    make_file,
    make_part,
    part_meta,
    part_meta_json,
)
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

CHUNK = 64 * 1024


# --------------------------------------------------------------------------- an independent Merkle root


def _node(tag: bytes, meta: dict, children: list[str]) -> str:
    """The node hash as the format defines it, written out from its definition here."""
    m = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return blake3(tag + struct.pack("<I", len(m)) + m + b"".join(bytes.fromhex(c) for c in children)).hexdigest()


def _independent_root(chunk_size: int, files: list[dict]) -> str:
    """The root of a manifest document, computed from its definition (never Concord's code)."""
    file_hashes = []
    for f in sorted(files, key=lambda f: f["path"]):
        part_hashes = []
        for p in f["parts"]:
            meta = {"kind": p["kind"], "name": p["name"], "length": p["length"]}
            if p["kind"] == "tensor":
                meta |= {"dtype": p["dtype"], "shape": p["shape"]}
            cids = [p["chunks"][i : i + 64] for i in range(0, len(p["chunks"]), 64)]
            part_hashes.append(_node(PART, meta, cids))
        file_hashes.append(_node(FILE, {"path": f["path"], "size": f["size"], "kind": f["kind"]}, part_hashes))
    return _node(SNAPSHOT, {"format": FORMAT, "chunk_size": chunk_size}, file_hashes)


def _cid(i: int) -> str:
    return blake3(i.to_bytes(8, "little", signed=True)).hexdigest()


def _many_files(n: int) -> list:
    """``n`` file entries of every shape a snapshot makes: one-chunk blobs, empty files,
    multi-chunk blobs, safetensors files with a header and tensors, names with quotes, spaces,
    non-ASCII letters and emoji."""
    names = ["plain", 'quo"te', "sp ace", "ünïcødé", "emoji-\U0001f600", "br[a]ce{s}"]
    out = []
    for i in range(n):
        folder = f"shard-{i // 1000:03d}"
        name = f"{folder}/{names[i % len(names)]}-{i:06d}"
        if i % 97 == 0:  # a safetensors file: header + two tensors
            h, t1, t2 = 24, 2 * 3 * 4, CHUNK * 2 + 10
            parts = [
                make_part("header", "", 0, h, [_cid(i)]),
                make_part("tensor", f"layer.{i}.weight", h, t1, [_cid(i + 1)], "F32", (2, 3)),
                make_part("tensor", f"layer.{i}.bias \u00e9", h + t1, t2, [_cid(i + 2), _cid(i + 3), _cid(i + 4)], "U8", (t2,)),
            ]
            out.append(make_file(name + ".safetensors", h + t1 + t2, "safetensors", parts))
        elif i % 31 == 0:
            out.append(make_file(name + ".empty", 0, "blob", [make_part("data", "", 0, 0, [])]))
        elif i % 13 == 0:
            size = 3 * CHUNK + 1 + i % 1000
            out.append(make_file(name, size, "blob", [make_part("data", "", 0, size, [_cid(i), _cid(-i), _cid(i + n), _cid(i + 2 * n)])]))
        else:
            size = 50_000 + i % 1000
            out.append(make_file(name, size, "blob", [make_part("data", "", 0, size, [_cid(i)])]))
    return out


def test_a_manifest_of_100000_files_keeps_the_root_its_definition_gives_and_reads_back():
    manifest = Manifest.build(CHUNK, _many_files(100_000))
    data = manifest.to_json()
    doc = json.loads(data)
    assert manifest.root == _independent_root(CHUNK, doc["files"])
    back = Manifest.from_json(data, expected_root=manifest.root)
    assert back == manifest and back.root == manifest.root
    assert back.n_files == 100_000 and back.n_tensors == 2 * len(range(0, 100_000, 97))
    # read without verifying: the same objects
    assert Manifest.from_json(data, expected_root=manifest.root, verify=False) == manifest


def test_a_manifest_written_by_hand_as_earlier_versions_wrote_it_still_reads():
    # keys in another order, spaces after separators, indented: JSON as any writer may have left it
    files = [{"path": "a/b.bin", "size": 3, "kind": "blob", "hash": None,
              "parts": [{"kind": "data", "name": "", "offset": 0, "length": 3, "chunks": _cid(1), "hash": None}]}]
    p = files[0]["parts"][0]
    p["hash"] = _node(PART, {"kind": "data", "name": "", "length": 3}, [p["chunks"]])
    files[0]["hash"] = _node(FILE, {"path": "a/b.bin", "size": 3, "kind": "blob"}, [p["hash"]])
    root = _independent_root(CHUNK, files)
    doc = {"files": files, "chunk_size": CHUNK, "root": root, "format": FORMAT}
    m = Manifest.from_json(json.dumps(doc, indent=2).encode(), expected_root=root)
    assert m.root == root and m.files[0].parts[0].chunk_ids() == [_cid(1)]


_meta_values = st.one_of(
    st.text(max_size=8), st.integers(-(2**70), 2**70), st.none(), st.booleans(), st.floats(allow_nan=False),
    st.lists(st.integers(-5, 2**40), max_size=4), st.lists(st.text(max_size=3), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(meta=st.dictionaries(st.text(max_size=6), _meta_values, max_size=6))
def test_the_quick_node_metadata_is_the_canonical_json_byte_for_byte(meta):
    assert flat_canonical_json(meta) == canonical_json(meta)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(PART_KINDS), name=st.text(max_size=10), length=st.integers(0, 2**63 - 1),
    dtype=st.sampled_from(["F32", "BF16", "U8"]), shape=st.lists(st.integers(0, 2**20), max_size=4),
    path=st.text(min_size=1, max_size=12), fkind=st.sampled_from(["blob", "safetensors", "dcp"]),
)
def test_part_and_file_metadata_templates_are_their_canonical_json(kind, name, length, dtype, shape, path, fkind):
    shape = tuple(shape) if kind == "tensor" else None
    dtype = dtype if kind == "tensor" else None
    assert part_meta_json(kind, name, length, dtype, shape) == canonical_json(part_meta(kind, name, length, dtype, shape))
    assert file_meta_json(path, length, fkind) == canonical_json(file_meta(path, length, fkind))


# --------------------------------------------------------------------------- many files, few open


def test_open_files_keep_at_most_their_limit_open_and_close_each_file_after_its_last_piece(tmp_path):
    import threading

    from concord.files import OpenFiles

    paths = [str(tmp_path / f"f{i}") for i in range(200)]
    files = OpenFiles(os.O_WRONLY | os.O_CREAT, limit=8, fsync=True)
    for p in paths:
        files.expect(p, 4)
    order = [(i, k) for k in range(4) for i in range(len(paths))]  # every file's pieces far apart
    random.Random(3).shuffle(order)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not order:
                    return
                i, k = order.pop()
            files.write(paths[i], bytes([i % 256]) * 100, k * 100)
            files.done(paths[i])

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert files.peak <= 8 and files.fds == {}  # every file closed once its last piece was done
    files.close()
    assert all(open(p, "rb").read() == bytes([i % 256]) * 400 for i, p in enumerate(paths))


FILES = 3000
#: the open-file limit the commands run under: far fewer than the files
NOFILE = 128
REF = "models/many"


def _make_folder(base: Path, n: int) -> Path:
    """``n`` small files in nested folders: random bytes of 0 to 6,000 bytes, some empty, some
    the same as another (one chunk named by two files), some of several chunks."""
    rng = random.Random(25)
    src = base / "many"
    for i in range(n):
        folder = src / f"part-{i % 17:02d}" / f"sub-{i % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        if i % 101 == 0:
            data = b""
        elif i % 53 == 0:
            data = b"the same bytes in several files\n" * 10
        elif i % 499 == 0:
            data = rng.randbytes(3 * CHUNK + 17)  # several chunks of one file
        else:
            data = rng.randbytes(rng.randrange(1, 6000))
        (folder / f"file-{i:05d}.dat").write_bytes(data)
    return src


def _limits(nofile: int | None = None, fsize: int | None = None, no_dac_override: bool = False):
    """What runs in the child before the command: lower limits; drop root's power to write
    where the permissions refuse it (root ignores them otherwise)."""

    def apply() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if no_dac_override and os.geteuid() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, out of the bounding set for the exec
                if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return apply


def concord(*argv: str, cwd: Path, **limits) -> subprocess.CompletedProcess:
    env = dict(os.environ, CONCORD_NO_PROGRESS="1", CONCORD_HOME=str(cwd / "home"))
    return subprocess.run(
        [sys.executable, "-m", "concord.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True,
        preexec_fn=_limits(**limits), timeout=600, check=False,
    )


def _same_tree(a: Path, b: Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b and len(files_a) == FILES
    different = [str(r) for r in files_a if (a / r).read_bytes() != (b / r).read_bytes()]
    assert different == []


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("many")
    _make_folder(base, FILES)
    return base


@pytest.mark.timeout(900)
def test_every_command_works_on_3000_files_under_an_open_file_limit_of_128(many, tmp_path):
    src, store = many / "many", tmp_path / "store"

    def ok(r):
        return (r.returncode, r.stderr) == (0, "")

    r = concord("snapshot", str(src), "--store", str(store), "--ref", REF, cwd=tmp_path, nofile=NOFILE)
    assert ok(r), r.stderr
    # again, over the same store: every chunk is there already (a re-hash)
    r = concord("snapshot", str(src), "--store", str(store), "--ref", REF, cwd=tmp_path, nofile=NOFILE)
    assert ok(r) and "new in" in r.stdout and ": 0 chunks" in r.stdout, r.stdout + r.stderr

    r = concord("restore", str(store), "--ref", REF, str(tmp_path / "out"), cwd=tmp_path, nofile=NOFILE)
    assert ok(r), r.stderr
    _same_tree(src, tmp_path / "out")

    r = concord("checkout", str(store), "--ref", REF, str(tmp_path / "serve" / "current"), cwd=tmp_path, nofile=NOFILE)
    assert ok(r), r.stderr
    _same_tree(src, tmp_path / "serve" / "current")

    r = concord("sync", str(store), str(tmp_path / "replica"), "--ref", REF, cwd=tmp_path, nofile=NOFILE)
    assert ok(r), r.stderr
    for s in (store, tmp_path / "replica"):
        r = concord("verify", str(s), cwd=tmp_path, nofile=NOFILE)
        assert ok(r) and " 0 missing, 0 corrupt" in r.stdout, r.stdout + r.stderr
    r = concord("restore", str(tmp_path / "replica"), "--ref", REF, str(tmp_path / "out2"), cwd=tmp_path, nofile=NOFILE)
    assert ok(r), r.stderr
    _same_tree(src, tmp_path / "out2")


def _one_local_line(r: subprocess.CompletedProcess, path: Path) -> str:
    err = r.stderr.strip()
    assert r.returncode != 0 and err.count("\n") == 0, r.stderr
    assert str(path) in err and "Traceback" not in err
    assert "credentials" not in err and "AWS_" not in err and "bucket" not in err
    return err


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("small")
    (base / "src" / "d").mkdir(parents=True)
    (base / "src" / "d" / "weights.dat").write_bytes(random.Random(1).randbytes(200_000))
    (base / "src" / "config.json").write_text('{"layers": 2}')
    r = concord("snapshot", str(base / "src"), "--store", str(base / "store"), "--ref", REF, cwd=base)
    assert r.returncode == 0, r.stderr
    for p in [base, *base.rglob("*")]:  # readable by the child that may not override permissions
        p.chmod(0o755 if p.is_dir() else 0o644)
    return base / "store"


@pytest.mark.parametrize("command", ["restore", "checkout"])
def test_an_output_folder_that_cannot_be_written_is_one_line_naming_it(small_store, tmp_path, command):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        target = locked / ("out" if command == "restore" else "current")
        r = concord(command, str(small_store), "--ref", REF, str(target), cwd=tmp_path, no_dac_override=True)
        err = _one_local_line(r, locked)
        assert "Permission denied" in err and "a problem of this machine" in err
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o755)


def test_a_file_the_output_disk_cannot_take_is_one_line_naming_it(small_store, tmp_path):
    out = tmp_path / "out"
    r = concord("restore", str(small_store), "--ref", REF, str(out), cwd=tmp_path, fsize=64 * 1024)
    err = _one_local_line(r, out / "d" / "weights.dat")
    assert "File too large" in err and not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # the temporary folder is gone


# --------------------------------------------------------------------------- one queue across files


class _MeetingStore(LocalDirStore):
    """A real store whose first ``parties`` chunk writes wait until all of them are under way at
    once: only a snapshot that keeps that many chunks of different files in flight gets past."""

    def __init__(self, path, parties: int) -> None:
        super().__init__(path)
        self.barrier = threading.Barrier(parties, timeout=60)
        self.calls = 0
        self.lock = threading.Lock()

    def put_chunk_from_file(self, cid, fd, offset, length, data, **kw):
        with self.lock:
            self.calls += 1
            first = self.calls <= self.barrier.parties
        if first:
            self.barrier.wait()  # BrokenBarrierError after 60 s: fewer were in flight
        return super().put_chunk_from_file(cid, fd, offset, length, data, **kw)


def test_small_files_keep_every_worker_busy_at_once(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    for i in range(40):  # one chunk each
        (src / f"shard-{i:03d}.dat").write_bytes(os.urandom(1000 + i))
    store = _MeetingStore(tmp_path / "s", parties=4)
    r = snapshot(src, store, chunk_size=CHUNK, workers=4)
    assert r.files == 40 and r.new_chunks == 40 and not store.barrier.broken


def test_a_small_file_changing_during_the_snapshot_is_refused_and_its_chunks_taken_back(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    for i in range(30):
        (src / f"shard-{i:03d}.dat").write_bytes(os.urandom(2000))
    target = src / "shard-017.dat"

    class Racing(LocalDirStore):
        def put_chunk_from_file(self, cid, fd, offset, length, data, **kw):
            wrote = super().put_chunk_from_file(cid, fd, offset, length, data, **kw)
            if os.fstat(fd).st_ino == target.stat().st_ino and target.stat().st_size == 2000:
                with open(target, "ab") as f:
                    f.write(b"a writer that has not finished")
            return wrote

    store = Racing(tmp_path / "s")
    with pytest.raises(SourceChangedError, match="changed while"):
        snapshot(src, store, chunk_size=CHUNK, ref="x")
    held = set(store.iter_chunks())
    assert chunk_id(target.read_bytes()[:2000]) not in held
    assert list(store.iter_manifests()) == [] and store.read_ref("x") is None


def test_a_small_file_rewritten_in_place_keeps_its_time_yet_every_chunk_holds_the_bytes_hashed(tmp_path):
    """A writer that rewrites a small file between its read and its chunks' store, and puts its
    size and time back, cannot make a chunk whose bytes are not its name: a small file's chunks
    are stored from the very bytes hashed, and the root is that of the bytes read."""
    src = tmp_path / "shards"
    src.mkdir()
    sizes = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5]
    first = {}
    for i, size in enumerate(sizes):
        first[f"shard-{i}.dat"] = os.urandom(size)
        (src / f"shard-{i}.dat").write_bytes(first[f"shard-{i}.dat"])

    class Rewriting(LocalDirStore):
        def put_chunk_from_file(self, cid, fd, offset, length, data, **kw):
            path = os.readlink(f"/proc/self/fd/{fd}")
            st = os.stat(path)
            with open(path, "r+b") as f:  # new bytes, same size
                f.write(os.urandom(st.st_size))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same time
            return super().put_chunk_from_file(cid, fd, offset, length, data, **kw)

    store = Rewriting(tmp_path / "s")
    r = snapshot(src, store, chunk_size=CHUNK, ref="x")
    for cid in store.iter_chunks():
        store.get_chunk(cid)  # checks the bytes against the name
    expected = [
        {"path": name, "size": len(data), "kind": "blob", "parts": [{"kind": "data", "name": "", "length": len(data),
         "chunks": "".join(chunk_id(data[at : at + CHUNK]) for at in range(0, len(data), CHUNK))}]}
        for name, data in first.items()
    ]
    assert r.root == _independent_root(CHUNK, expected) and r.new_chunks == 0 + 1 + 1 + 1 + 2 + 4


def test_the_names_a_format_claims_are_those_its_reader_looks_at():
    from concord.snapshots.formats import _kind, claims
    from concord.snapshots.safetensors_header import looks_like_safetensors

    for name in ["m.safetensors", "M.SafeTensors", "__0_0.distcp", "q.gguf", "w.pt", "w.pth", "pytorch_model.bin",
                 "last.ckpt", "shard.dat", "config.json", "tokenizer.model", "dir.pt/file", "x.safetensors.part"]:
        assert claims(name) == (looks_like_safetensors(name) or _kind(name) is not None), name


def test_a_re_snapshot_encodes_the_manifest_only_when_the_store_lacks_it(tmp_path, monkeypatch):
    src = tmp_path / "shards"
    src.mkdir()
    for i in range(20):
        (src / f"shard-{i:03d}.dat").write_bytes(os.urandom(3000))
    store = LocalDirStore(tmp_path / "s")
    first = snapshot(src, store, chunk_size=CHUNK, ref="x")
    encoded = []
    real = Manifest.to_json
    monkeypatch.setattr(Manifest, "to_json", lambda self: encoded.append(self.root) or real(self))
    again = snapshot(src, store, chunk_size=CHUNK, ref="x")
    assert again.root == first.root and again.new_chunks == 0 and encoded == []
    (src / "shard-000.dat").rename(src / "renamed.dat")  # no new chunk, a new root
    moved = snapshot(src, store, chunk_size=CHUNK, ref="x")
    assert moved.new_chunks == 0 and encoded == [moved.root]
    assert Manifest.from_json(store.get_manifest_bytes(moved.root), expected_root=moved.root).n_files == 20
    assert store.read_ref("x").root == moved.root
