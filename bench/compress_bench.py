"""Compression and encryption at rest: what a store configuration costs and saves.

Four tables, all ratios from one run:

1. Codec, on real weights: all-MiniLM-L6-v2 as shipped (fp32) and cast to bf16, the demo's three
   PEFT LoRA adapters on it (fp32), and the first tensors of the benchmark checkpoint (random bf16,
   LLaMA-shaped). Each is cut into 4 MiB chunks as a snapshot cuts it and encoded as an ``auto``
   store encodes it (byte planes, then zstd). Stored bytes against raw bytes (targets: bf16 ≤ 0.72,
   fp32 ≤ 0.87), and against the two other candidates measured on the same chunks: plain zstd
   (level 3) and the ``zipnn`` package (its byte mode, ``bytearray_dtype`` set to the dtype), whose
   round trip is checked byte for byte. Encode and decode speeds in the notes.
2. The benchmark checkpoint (2.1 GB of bf16 by default): snapshot into a compressed (``auto``) and
   an encrypted store against a plain store (targets ≤ 2.5× and ≤ 1.3×), restore from each
   against the plain store (≤ 1.5× and ≤ 1.3×), and the decode speed of the compressed chunks on
   two threads (≥ 1 GB/s). Each case starts from an empty store or output folder; cases are timed
   in interleaved rounds after a warm-up.
3. Delta sync of the 5% fine-tune between two compressed stores: bytes sent against the raw bytes
   of the chunks that changed (≤ 0.75×).
4. Ten checkpoints of a LoRA run tiered hot (keep 2), warm (keep 4) and cold (every one), all in
   folders, once with every tier plain and once with ``cold: {compress: auto}``: total stored bytes
   against the plain tiers, and the cold tier against its compressed floor (each distinct chunk
   once, encoded). The base of this table is smaller (0.3 GB; 0.1 GB with ``--quick``).
"""

from __future__ import annotations

import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import (
    GB,
    MB,
    Case,
    Options,
    Row,
    Table,
    Target,
    ensure_checkpoint,
    ensure_finetuned,
    fresh_dir,
    log,
    race,
    remove,
    settle,
    times_note,
    warm,
)

CHUNK = 4 * 1024 * 1024
KEY = bytes(range(32))
#: bytes of the benchmark checkpoint's tensors the codec table reads
CODEC_SAMPLE = 256 * MB
TIER_BASE_GB, TIER_BASE_QUICK_GB = 0.3, 0.1
TIER_NS = "bench-compress"
TARGETS = {"BF16": 0.72, "F32": 0.87}


def run(opts: Options) -> list[Table]:
    work = fresh_dir(opts.work_dir / "compress")
    base = ensure_checkpoint(opts.data_dir, opts.size_gb)
    tables = [_codec_table(base, work)]
    tables.append(_checkpoint_table(opts, base, work))
    tables.append(_delta_table(opts, base, work))
    tables.append(_tier_table(opts, work))
    remove(work)
    return tables


# --------------------------------------------------------------------------- 1. codec


def _tensor_bytes(path: Path, limit: int | None = None) -> dict[str, bytes]:
    """dtype → the concatenated bytes of the file's floating tensors (up to ``limit`` per dtype)."""
    import json

    out: dict[str, bytearray] = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        start = 8 + n
        for name, t in header.items():
            if name == "__metadata__" or t["dtype"] not in ("BF16", "F16", "F32"):
                continue
            buf = out.setdefault(t["dtype"], bytearray())
            if limit is not None and len(buf) >= limit:
                continue
            a, b = t["data_offsets"]
            f.seek(start + a)
            buf += f.read(b - a)
    return {k: bytes(v) for k, v in out.items()}


def _samples(base, work: Path) -> list[tuple[str, str, bytes]]:
    """(label, dtype, bytes) of the real weights the codec is measured on."""
    import torch
    from safetensors.torch import load_file

    from demo._common import model_folder

    minilm = model_folder() / "model.safetensors"
    fp32 = _tensor_bytes(minilm)["F32"]
    bf16 = b"".join(
        t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        for t in load_file(str(minilm)).values()
        if t.is_floating_point()
    )
    out = [("MiniLM fp32", "F32", fp32), ("MiniLM bf16", "BF16", bf16)]
    try:
        out.append(("demo LoRA adapters fp32", "F32", _adapters(work)))
    except ImportError as exc:  # transformers or peft missing: said, not hidden
        log(f"LoRA adapters skipped ({exc})")
    out.append(("bench checkpoint bf16", "BF16", _tensor_bytes(base.file, CODEC_SAMPLE)["BF16"][:CODEC_SAMPLE]))
    return out


def _adapters(work: Path) -> bytes:
    """The demo's three PEFT LoRA adapters on MiniLM (ranks 4, 8, 16), their tensors' bytes."""
    from transformers import AutoModel

    from demo._common import model_folder, quiet_training
    from demo.federation import make_adapter

    with quiet_training():
        model = AutoModel.from_pretrained(str(model_folder()))
        data = b""
        for i, (r, alpha) in enumerate(((4, 8), (8, 16), (16, 16))):
            folder = make_adapter(model, work / f"adapter-{r}", r, alpha, seed=i)
            data += _tensor_bytes(folder / "adapter_model.safetensors")["F32"]
    return data


def _zipnn(data: bytes, dtype: str) -> tuple[int, float, float, bool] | None:
    """(stored bytes, encode s, decode s, byte-exact round trip) with zipnn, or None without it."""
    try:
        import zipnn
    except ImportError:
        return None
    z = zipnn.ZipNN(bytearray_dtype={"BF16": "bfloat16", "F32": "float32", "F16": "float16"}[dtype], threads=1)
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    t0 = time.perf_counter()
    packed = [z.compress(c) for c in chunks]
    t1 = time.perf_counter()
    back = [bytes(z.decompress(p)) for p in packed]
    t2 = time.perf_counter()
    return sum(map(len, packed)), t1 - t0, t2 - t1, back == chunks


def _rotated(chunks: list[bytes], dtype: str) -> tuple[int, float, float]:
    """(stored bytes, encode s, decode s) of the byte planes of elements rotated left by one bit
    first (frame 0x02, what earlier versions wrote): the sign leaves the exponent's plane."""
    import numpy as np

    from concord.stores import codec

    kind = {2: np.uint16, 4: np.uint32, 8: np.uint64}[codec.PLANE_WIDTH[dtype]]
    bits = 8 * np.dtype(kind).itemsize
    t0 = time.perf_counter()
    frames = []
    for c in chunks:
        n = len(c) // np.dtype(kind).itemsize
        a = np.frombuffer(c, dtype=kind, count=n)
        frame = bytearray(codec.encode(((a << kind(1)) | (a >> kind(bits - 1))).tobytes() + c[n * a.itemsize :], "auto", dtype))
        if frame[0] == codec.PLANES:
            frame[0] = codec.ROTATED_PLANES
        frames.append(bytes(frame))
    t1 = time.perf_counter()
    back = [codec.decode(f, len(c)) for f, c in zip(frames, chunks)]
    t2 = time.perf_counter()
    if back != chunks:
        raise RuntimeError("rotated byte planes did not give the bytes back")
    return sum(map(len, frames)), t1 - t0, t2 - t1


def _codec_table(base, work: Path) -> Table:
    from concord.stores import codec

    table = Table("compress: stored bytes / raw bytes on real weights (4 MiB chunks, one thread)")
    notes = []
    for label, dtype, data in _samples(base, work):
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        t0 = time.perf_counter()
        frames = [codec.encode(c, "auto", dtype) for c in chunks]
        t1 = time.perf_counter()
        back = [codec.decode(f, len(c)) for f, c in zip(frames, chunks)]
        t2 = time.perf_counter()
        if back != chunks:
            raise RuntimeError(f"{label}: the byte-plane codec did not give the bytes back")
        ours = sum(map(len, frames))
        plain_zstd = sum(len(codec.encode(c, "zstd")) for c in chunks)
        raw = len(data)
        target = TARGETS.get(dtype)
        table.add(Row(f"{label}: byte planes + zstd", ours / MB, raw / MB, "MB", target and Target("ratio", "<=", target), "raw"))
        table.add(Row(f"{label}: against plain zstd-3", ours / MB, plain_zstd / MB, "MB", None, "zstd"))
        rot = _rotated(chunks, dtype)
        table.add(Row(f"{label}: against rotated planes", ours / MB, rot[0] / MB, "MB", None, "rotated, 0x02"))
        z = _zipnn(data, dtype)
        if z is not None:
            table.add(Row(f"{label}: against zipnn", ours / MB, z[0] / MB, "MB", None, "zipnn" + ("" if z[3] else ", not byte-exact")))
        notes.append(
            f"{label} ({raw / MB:.0f} MB): byte planes {ours / raw:.3f}× at {raw / (t1 - t0) / MB:.0f} MB/s encode, "
            f"{raw / (t2 - t1) / MB:.0f} MB/s decode; rotated planes {rot[0] / raw:.3f}× at "
            f"{raw / rot[1] / MB:.0f} / {raw / rot[2] / MB:.0f} MB/s (its encode time includes the rotation); zstd-3 {plain_zstd / raw:.3f}×"
            + (
                f"; zipnn {z[0] / raw:.3f}× at {raw / z[1] / MB:.0f} / {raw / z[2] / MB:.0f} MB/s, round trip "
                + ("byte-exact" if z[3] else "NOT byte-exact")
                if z is not None
                else "; zipnn not installed"
            )
        )
    table.notes = notes + [
        "ZipNN (2024) reports about 0.67× on bf16 models and 17% better than zstd; the issue measured plain zstd "
        "on these MiniLM weights at 0.78× (bf16) and 0.91× (fp32), byte grouping at 0.71× and 0.84×",
    ]
    return table


# --------------------------------------------------------------------------- 2. checkpoint


def _store(path: Path, compress: str = "none", encrypt: bool = False):
    from concord.stores import LocalDirStore
    from concord.stores.config import configure

    store = LocalDirStore(path)
    if encrypt:
        store.unlock(KEY)
    if compress != "none" or encrypt:
        configure(store, compress=compress, encrypt=encrypt)
    return store


def _checkpoint_table(opts: Options, base, work: Path) -> Table:
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore
    from concord.snapshots.snapshot import snapshot

    warm(base.file)
    kinds = {"plain": ("none", False), "compressed": ("auto", False), "encrypted": ("none", True)}
    dirs = {k: work / f"ckpt-{k}" for k in kinds}

    def fresh(kind: str):
        def before() -> None:
            remove(dirs[kind])
            _store(dirs[kind], *kinds[kind])
            settle()

        return before

    snaps = race(
        opts.runs,
        *[Case(f"snapshot into {k}", lambda k=k: snapshot(base.folder, _open(dirs[k], k), ref="m"), before=fresh(k)) for k in kinds],
        wait_idle=opts.wait_idle,
    )
    roots = {c.label.rsplit(" ", 1)[-1]: c.result.root for c in snaps}
    if len(set(roots.values())) != 1:
        raise RuntimeError(f"the stores hold different roots: {roots}")
    out = work / "restored"

    def clear() -> None:
        remove(out)
        settle()

    restores = race(
        opts.runs,
        *[Case(f"restore from {k}", lambda k=k: restore(_open(dirs[k], k), load_manifest(_open(dirs[k], k), roots[k]), out), before=clear) for k in kinds],
        wait_idle=opts.wait_idle,
    )
    decode_s, decoded = _decode_speed(_open(dirs["compressed"], "compressed"))
    stored = {k: sum(n for _, n, _ in _open(dirs[k], k).iter_chunk_stats()) for k in kinds}
    t = {c.label: c.best for c in snaps + restores}
    table = Table(f"compress: {base.size / GB:.2f} GB bf16 checkpoint into compressed and encrypted stores")
    table.add(Row("snapshot into compressed (auto)", t["snapshot into compressed"], t["snapshot into plain"], "s", Target("ratio", "<=", 2.5), "plain store"))
    table.add(Row("restore from compressed", t["restore from compressed"], t["restore from plain"], "s", Target("ratio", "<=", 1.5), "plain store"))
    table.add(Row("decode of compressed chunks, 2 threads", decoded / decode_s / GB, None, "GB/s", Target("value", ">=", 1.0)))
    table.add(
        Row(
            "snapshot into encrypted (AES-256-GCM)",
            t["snapshot into encrypted"],
            t["snapshot into plain"],
            "s",
            Target("ratio", "<=", 1.3),
            "plain store",
        )
    )
    table.add(Row("restore from encrypted", t["restore from encrypted"], t["restore from plain"], "s", Target("ratio", "<=", 1.3), "plain store"))
    table.add(Row("stored bytes, compressed", stored["compressed"] / GB, stored["plain"] / GB, "GB", None, "plain store"))
    table.notes = [
        "every snapshot starts from an empty store, every restore from an empty folder; the same root in all three stores",
        "decode: every chunk of the compressed store read, then decoded on 2 threads (reading not timed)",
        times_note(snaps + restores),
    ]
    remove(out)
    for d in dirs.values():
        remove(d)
    return table


def _open(path: Path, kind: str):
    from concord.stores import LocalDirStore

    store = LocalDirStore(path)
    if kind == "encrypted":
        store.unlock(KEY)
    return store


def _decode_speed(store) -> tuple[float, int]:
    """(seconds, raw bytes) to decode every stored chunk of ``store`` on two threads."""
    from concord.stores.base import chunk_key

    enc = store.encoding()
    blobs = [(name, store._get_object(chunk_key(name))) for name, _, _ in store.iter_chunk_stats()]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        sizes = list(pool.map(lambda nb: len(enc.decode_chunk(nb[0], nb[1])), blobs))
    return time.perf_counter() - t0, sum(sizes)


# --------------------------------------------------------------------------- 3. delta sync


def _delta_table(opts: Options, base, work: Path) -> Table:
    from concord.snapshots.snapshot import snapshot
    from concord.snapshots.sync import replicate

    ft = ensure_finetuned(base, opts.data_dir, fraction=0.05)
    a, b = _store(work / "delta-a", "auto"), _store(work / "delta-b", "auto")
    snapshot(base.folder, a, ref="m")
    replicate(a, [b], ref="m")
    new = snapshot(ft.folder, a, ref="m")
    (r,) = replicate(a, [b], ref="m")
    table = Table("compress: delta sync of the 5% fine-tune between two compressed stores")
    table.add(Row("bytes sent vs changed raw bytes", r.bytes_sent / MB, new.new_bytes / MB, "MB", Target("ratio", "<=", 0.75), "changed chunks, raw"))
    table.add(Row("bytes sent vs changed tensors", r.bytes_sent / MB, ft.changed_bytes / MB, "MB", None, "changed tensors, raw"))
    table.notes = [
        f"{r.chunks_sent} chunks moved as stored (same encoding: decoded and hashed on arrival), standing for "
        f"{r.raw_bytes_sent / MB:.1f} MB raw",
    ]
    remove(work / "delta-a")
    remove(work / "delta-b")
    return table


# --------------------------------------------------------------------------- 4. tiers


def _tier_table(opts: Options, work: Path) -> Table:
    from bench.tier_bench import CHECKPOINTS, HOT_KEEP, MARKER, WARM_KEEP, write_checkpoint
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.sync import chunk_dtypes
    from concord.tiering import TierPolicy, add_checkpoint

    size = TIER_BASE_QUICK_GB if opts.quick else TIER_BASE_GB
    base = ensure_checkpoint(opts.data_dir, size)
    run_dir = work / "tier-run"
    folders = [write_checkpoint(run_dir / f"step-{s:04d}", base, s) for s in range(1, CHECKPOINTS + 1)]
    totals, cold_floor = {}, 0
    for label, cold_compress in (("plain", None), ("cold auto", "auto")):
        root = fresh_dir(work / f"tiers-{label.replace(' ', '-')}")
        cold = {"store": str(root / "cold"), "media": "tape", "offsite": True}
        if cold_compress:
            cold["compress"] = cold_compress
        policy = TierPolicy.from_dict(
            {
                "namespace": TIER_NS,
                "hot": {"store": str(root / "hot"), "keep": HOT_KEEP},
                "warm": {"store": str(root / "warm"), "keep": WARM_KEEP, "media": "nas"},
                "cold": cold,
                "gc_grace": "0s",
                "ready": {"marker": MARKER, "settle": "0s"},
            },
            source="compress benchmark",
        )
        stores = {spec.tier: spec.open() for spec in policy.tiers}
        for step, folder in enumerate(folders, 1):
            add_checkpoint(policy, folder, folder.name, step=step, stores=stores)
        totals[label] = {t: sum(n for _, n, _ in s.iter_chunk_stats()) for t, s in stores.items()}
        if cold_compress:
            s = stores["cold"]
            dtypes: dict[str, str | None] = {}
            for name in s.list_refs():
                m = load_manifest(s, s.read_ref(name).root)
                dtypes.update(dict.fromkeys(m.chunk_lengths()))
                dtypes.update(chunk_dtypes(m))
            enc = s.encoding()
            cold_floor = sum(len(enc.encode_chunk(c, s.get_chunk(c), dt)) for c, dt in dtypes.items())
        log(f"tiered {CHECKPOINTS} checkpoints ({label}): {sum(totals[label].values()) / GB:.3f} GB stored")
        remove(root)
    remove(run_dir)
    plain, packed = totals["plain"], totals["cold auto"]
    table = Table(f"compress: {CHECKPOINTS} LoRA checkpoints ({base.size / GB:.2f} GB base) tiered, cold compressed (auto)")
    table.add(Row("all tiers, cold auto vs all plain", sum(packed.values()) / GB, sum(plain.values()) / GB, "GB", None, "today's tiers"))
    table.add(Row("cold tier, auto vs plain", packed["cold"] / GB, plain["cold"] / GB, "GB", None, "plain cold"))
    table.add(
        Row(
            "cold tier vs its compressed floor",
            packed["cold"] / GB,
            cold_floor / GB,
            "GB",
            Target("ratio", "<=", 1.001),
            "each distinct chunk once, encoded",
        )
    )
    table.notes = [
        "the tiers are folders here (the byte counts are the stores' chunk objects; S3 would hold the same objects)",
        "dtype hints reach the cold tier through sync (from the manifest), so its tensors are coded as byte planes "
        "though the hot tier that snapshotted them is plain",
    ]
    return table
