"""Weight drift across replicas: Merkle shortcuts, flipped tensors, bf16 replicas, ULPs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.audit.replicas import ULP_MAX, compare_replicas, compare_tensors, replicas_of, ulp_distance
from concord.errors import ReplicaConfigError
from concord.snapshots.manifest import Manifest
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

REF = "models/toy"
FLIPPED = "layers.1.attn.q.weight"


class CountingStore(LocalDirStore):
    """A folder store that counts the chunks read from it."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.chunks_read = 0

    def get_chunk(self, cid: str, *, verify: bool = True) -> bytes:
        self.chunks_read += 1
        return super().get_chunk(cid, verify=verify)


def variant(src: Path, dst: Path, change) -> Path:
    """A copy of checkpoint ``src`` whose state dict went through ``change`` (in place)."""
    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    change(sd)
    (dst / "model.safetensors").unlink()
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def to_bf16(sd: dict) -> None:
    for name, t in list(sd.items()):
        if t.dtype == torch.float32:
            sd[name] = t.to(torch.bfloat16)


def nudge(sd: dict, name: str, ulps: int, index: int = 7) -> None:
    """Move one element of ``sd[name]`` by ``ulps`` ULPs of its dtype (away from zero)."""
    bits = {2: torch.int16, 4: torch.int32}[sd[name].element_size()]
    flat = sd[name].reshape(-1).view(bits).clone()
    flat[index] += ulps
    sd[name] = flat.view(sd[name].dtype).reshape(sd[name].shape)


def clusters(tmp_path: Path, *folders: Path | None, chunk_size: int = SMALL_CHUNK, cls=LocalDirStore) -> dict:
    """One store per folder (None: a store without the ref), each holding its folder as REF."""
    out = {}
    for i, folder in enumerate(folders):
        store = cls(tmp_path / f"cluster{i}")
        if folder is not None:
            snapshot(folder, store, ref=REF, chunk_size=chunk_size)
        out[f"c{i}"] = (store, REF)
    return out


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "base")


def n_tensors(folder: Path) -> int:
    return len(load_file(str(folder / "model.safetensors")))


def json_safe(report) -> dict:
    doc = report.to_dict()
    return json.loads(json.dumps(doc, allow_nan=False))


# --------------------------------------------------------------------------- Merkle shortcuts


def test_identical_replicas_are_settled_by_root_without_reading_a_chunk(tmp_path, base):
    reps = clusters(tmp_path, base, base, base, cls=CountingStore)
    for store, _ in reps.values():
        store.chunks_read = 0
    report = compare_replicas(reps)
    assert report.ok and report.severity == "ok" and report.reference == "c0"
    assert all(r.identical for r in report.replicas)
    assert report.replica("c1").finding == "identical: same root as the reference"
    assert [s.chunks_read for s, _ in reps.values()] == [0, 0, 0]
    doc = json_safe(report)
    assert doc["ok"] is True and [r["cluster"] for r in doc["replicas"]] == ["c0", "c1", "c2"]
    assert doc["replicas"][1]["tensors_compared"] is None  # nothing was opened


def test_replicas_of_labels_by_store_uri(tmp_path, base):
    stores = [LocalDirStore(tmp_path / n) for n in ("a", "b")]
    for s in stores:
        snapshot(base, s, ref=REF, chunk_size=SMALL_CHUNK)
    reps = replicas_of(stores, REF)
    assert list(reps) == [s.uri for s in stores] and reps[stores[0].uri] == (stores[0], REF)
    assert compare_replicas(reps).ok
    with pytest.raises(ReplicaConfigError, match="listed twice"):
        replicas_of([stores[0], stores[0]], REF)


def test_another_chunk_size_is_identical_content(tmp_path, base):
    reps = clusters(tmp_path, base, base)
    store = LocalDirStore(tmp_path / "big-chunks")
    snapshot(base, store, ref=REF, chunk_size=2 * SMALL_CHUNK)
    reps["big"] = (store, REF)
    r = compare_replicas(reps).replica("big")
    assert r.root != reps["c0"][0].read_ref(REF).root
    assert r.identical and r.severity == "ok" and r.tensors_failed == 0
    assert "another chunk size" in r.finding and r.files_differing == ()


# --------------------------------------------------------------------------- flipped tensors


@pytest.mark.parametrize(
    "flip",
    [
        pytest.param(lambda t: t.reshape(-1)[123].neg_(), id="sign"),
        pytest.param(lambda t: t.reshape(-1).view(torch.int32)[123].bitwise_xor_(1), id="lowest-bit"),
    ],
)
def test_a_flipped_tensor_is_found_by_name_and_nothing_else_fails(tmp_path, base, flip):
    flipped = variant(base, tmp_path / "flipped", lambda sd: flip(sd[FLIPPED]))
    report = compare_replicas(clusters(tmp_path, base, base, flipped))
    assert report.severity == "critical" and not report.ok
    assert report.replica("c1").severity == "ok"
    r = report.replica("c2")
    assert r.severity == "critical" and r.priority == "P0" and not r.identical
    assert r.tensors_failed == 1 and FLIPPED in r.finding
    assert r.tensors_compared == n_tensors(base)
    assert r.tensors_identical_by_hash == n_tensors(base) - 1
    worst = r.worst[0]
    assert worst.tensor == FLIPPED and worst.file == "model.safetensors" and not worst.ok
    assert worst.dtype_reference == worst.dtype_replica == "F32"
    assert worst.differing_share == pytest.approx(1 / (384 * 96))
    assert worst.max_ulp >= 1 and worst.max_abs_diff > 0
    assert len(r.worst) == 1  # every other tensor was settled by its hash
    assert r.files_differing == r.tensors_missing == r.tensors_extra == ()
    doc = json_safe(report)["replicas"][2]
    assert doc["worst"][0]["tensor"] == FLIPPED and doc["tensors_failed"] == 1
    assert set(doc["worst"][0]) >= {
        "tensor", "file", "dtype_reference", "dtype_replica", "shape", "max_ulp", "mean_ulp",
        "max_abs_diff", "differing_share", "allclose", "ok",
    }


def test_the_reference_tensor_is_read_once_for_every_replica_that_differs(tmp_path, base):
    flipped = variant(base, tmp_path / "flipped", lambda sd: sd[FLIPPED].reshape(-1)[0].neg_())
    reps = clusters(tmp_path, base, flipped, flipped, cls=CountingStore)
    for store, _ in reps.values():
        store.chunks_read = 0
    report = compare_replicas(reps)
    chunks = -(-384 * 96 * 4 // SMALL_CHUNK)
    assert [s.chunks_read for s, _ in reps.values()] == [chunks, chunks, chunks]
    assert [report.replica(c).worst[0].tensor for c in ("c1", "c2")] == [FLIPPED, FLIPPED]


class Recorder:
    def __init__(self) -> None:
        self.totals, self.done, self.closed = [], 0, 0

    def start(self, total: int, desc: str) -> None:
        self.totals.append(total)

    def advance(self, n: int) -> None:
        self.done += n

    def close(self) -> None:
        self.closed += 1


def test_progress_counts_every_byte_read(tmp_path, base):
    flipped = variant(base, tmp_path / "flipped", lambda sd: sd[FLIPPED].reshape(-1)[0].neg_())
    rec = Recorder()
    compare_replicas(clusters(tmp_path, base, flipped, flipped), progress=rec)
    assert rec.totals == [3 * 384 * 96 * 4] and rec.done == rec.totals[0] and rec.closed == 1


def test_top_limits_the_worst_list_and_failures_come_first(tmp_path, base):
    names = [f"layers.{i}.attn.q.weight" for i in range(3)]

    def change(sd):
        for i, n in enumerate(names):
            sd[n].reshape(-1)[: i + 1].neg_()  # 1, 2 and 3 elements flipped

    changed = variant(base, tmp_path / "changed", change)
    r = compare_replicas(clusters(tmp_path, base, changed), top=2).replica("c1")
    assert r.tensors_failed == 3 and len(r.worst) == 2
    assert all(not t.ok for t in r.worst)


# --------------------------------------------------------------------------- bf16 replicas


def test_a_bf16_replica_of_an_fp32_checkpoint_passes_within_one_ulp(tmp_path, base):
    bf16 = variant(base, tmp_path / "bf16", to_bf16)
    report = compare_replicas(clusters(tmp_path, base, bf16), max_ulps=1)
    assert report.ok, report.to_dict()
    r = report.replica("c1")
    assert r.severity == "ok" and not r.identical and r.tensors_failed == 0
    assert "F32→BF16" in r.finding
    converted = [t for t in r.worst if t.dtype_reference == "F32"]
    assert converted and all(t.dtype_replica == "BF16" and t.ok and t.allclose for t in converted)
    assert all(t.max_ulp <= 1 for t in r.worst)
    # the bf16 tensors of the checkpoint were bf16 on both sides: settled by hash
    assert r.tensors_identical_by_hash == sum(
        1 for t in load_file(str(base / "model.safetensors")).values() if t.dtype == torch.bfloat16
    )


def test_the_fp32_replica_of_a_bf16_reference_passes_too(tmp_path, base):
    bf16 = variant(base, tmp_path / "bf16", to_bf16)
    report = compare_replicas(clusters(tmp_path, bf16, base))
    assert report.ok
    t = report.replica("c1").worst[0]
    assert (t.dtype_reference, t.dtype_replica) == ("BF16", "F32") and "compared as BF16" in t.finding


def test_a_bf16_replica_two_ulps_off_fails_with_that_tensor_named(tmp_path, base):
    name = "layers.2.attn.q.weight"
    nudged = variant(base, tmp_path / "nudged", lambda sd: (to_bf16(sd), nudge(sd, name, 2)))
    report = compare_replicas(clusters(tmp_path, base, nudged), max_ulps=1)
    r = report.replica("c1")
    assert report.severity == r.severity == "critical"
    assert r.tensors_failed == 1 and name in r.finding
    worst = r.worst[0]
    assert worst.tensor == name and not worst.ok and worst.max_ulp == 2
    assert worst.allclose  # 2 ULP of bf16 is inside bf16's rtol: the ULP rule is the one that fails
    assert worst.differing_share == pytest.approx(1 / (384 * 96))
    assert "more than 1 ULP of BF16" in worst.finding
    assert all(t.ok for t in r.worst[1:])
    # one ULP off passes, and a looser max_ulps lets two through
    assert compare_replicas(clusters(tmp_path / "loose", base, nudged), max_ulps=2).ok
    one = variant(base, tmp_path / "one", lambda sd: (to_bf16(sd), nudge(sd, name, 1)))
    assert compare_replicas(clusters(tmp_path / "one-ulp", base, one)).ok


def test_noise_beyond_bf16_precision_fails_ulps_and_tolerances(tmp_path, base):
    name = "layers.0.attn.q.weight"

    def noisy(sd):
        g = torch.Generator().manual_seed(5)
        sd[name] = sd[name] * (1 + 0.05 * torch.randn(sd[name].shape, generator=g))
        to_bf16(sd)

    r = compare_replicas(clusters(tmp_path, base, variant(base, tmp_path / "noisy", noisy))).replica("c1")
    assert r.severity == "critical" and r.tensors_failed == 1
    worst = r.worst[0]
    assert worst.tensor == name and worst.max_ulp > 1 and worst.allclose is False
    assert 0.5 < worst.differing_share <= 1 and worst.mean_ulp > 1


# --------------------------------------------------------------------------- structure and findings


def test_a_missing_ref_or_snapshot_is_a_finding_not_a_crash(tmp_path, base):
    reps = clusters(tmp_path, base, None, base)
    reps["unknown-root"] = (reps["c0"][0], "ab" * 32)
    report = compare_replicas(reps)
    assert report.severity == "critical"
    missing = report.replica("c1")
    assert missing.severity == "critical" and missing.root is None and REF in missing.finding
    assert "concord refs" in missing.finding  # the error's fix travels with the finding
    assert report.replica("c2").identical and report.replica("c2").severity == "ok"
    unknown = report.replica("unknown-root")
    assert unknown.severity == "critical" and "no snapshot" in unknown.finding and not unknown.identical
    json_safe(report)


def test_the_same_root_in_a_store_that_lacks_it_is_not_identical(tmp_path, base):
    reps = clusters(tmp_path, base, None)
    root = reps["c0"][0].read_ref(REF).root
    report = compare_replicas({label: (store, root) for label, (store, _) in reps.items()})
    r = report.replica("c1")
    assert r.severity == "critical" and not r.identical and "no snapshot" in r.finding


def test_an_unreadable_reference_leaves_the_others_uncompared(tmp_path, base):
    report = compare_replicas(clusters(tmp_path, None, base))
    assert report.replica("c0").severity == "critical"
    other = report.replica("c1")
    assert other.severity == "warning" and "not compared" in other.finding


def test_a_missing_chunk_in_a_replica_is_a_finding(tmp_path, base):
    flipped = variant(base, tmp_path / "flipped", lambda sd: sd[FLIPPED].reshape(-1)[0].neg_())
    reps = clusters(tmp_path, base, flipped)
    store = reps["c1"][0]
    manifest = Manifest.from_json(store.get_manifest_bytes(store.read_ref(REF).root))
    part = manifest.by_path["model.safetensors"].by_key[("tensor", FLIPPED)]
    store.delete_chunk(part.chunk_ids()[1])
    r = compare_replicas(reps).replica("c1")
    assert r.severity == "critical" and r.worst[0].tensor == FLIPPED
    assert "unreadable in this replica" in r.worst[0].finding and "verify" in r.worst[0].finding


def test_differing_non_tensor_files_only_are_a_warning(tmp_path, base):
    other = tmp_path / "other"
    shutil.copytree(base, other)
    (other / "config.json").write_text(json.dumps({"hidden_size": 96, "layers": 4}))
    (other / "README.md").write_text("# toy\n")
    (other / "tokenizer.txt").unlink()
    r = compare_replicas(clusters(tmp_path, base, other)).replica("c1")
    assert r.severity == "warning" and r.priority == "P1"
    assert r.files_differing == ("config.json",)
    assert r.files_extra == ("README.md",) and r.files_missing == ("tokenizer.txt",)
    assert r.tensors_failed == 0 and r.tensors_identical_by_hash == n_tensors(base)
    assert "config.json" in r.finding


def test_missing_extra_and_reshaped_tensors_fail(tmp_path, base):
    def change(sd):
        del sd["layers.0.norm.weight"]
        sd["extra.bias"] = torch.zeros(4)
        sd["layers.1.attn.k.weight"] = sd["layers.1.attn.k.weight"].reshape(48, 192).contiguous()

    r = compare_replicas(clusters(tmp_path, base, variant(base, tmp_path / "v", change))).replica("c1")
    assert r.severity == "critical" and r.tensors_failed == 3
    assert r.tensors_missing == ("layers.0.norm.weight",) and r.tensors_extra == ("extra.bias",)
    by_name = {t.tensor: t for t in r.worst}
    assert by_name["layers.1.attn.k.weight"].shape_replica == (48, 192)
    assert "shape" in by_name["layers.1.attn.k.weight"].finding


def test_a_resharded_replica_pairs_tensors_by_name(tmp_path, base):
    other = tmp_path / "sharded"
    shutil.copytree(base, other)
    sd = load_file(str(base / "model.safetensors"))
    (other / "model.safetensors").unlink()
    names = sorted(sd)
    save_file({n: sd[n] for n in names[:5]}, str(other / "model-00001-of-00002.safetensors"))
    save_file({n: sd[n] for n in names[5:]}, str(other / "model-00002-of-00002.safetensors"))
    r = compare_replicas(clusters(tmp_path, base, other)).replica("c1")
    assert r.severity == "ok" and r.tensors_failed == 0 and not r.identical
    assert r.tensors_identical_by_hash == len(names)
    assert "other safetensors files" in r.finding


def test_options_are_checked_up_front(tmp_path, base):
    reps = clusters(tmp_path, base)
    with pytest.raises(ReplicaConfigError, match="no replicas"):
        compare_replicas({})
    with pytest.raises(ReplicaConfigError, match="reference 'nope'"):
        compare_replicas(reps, reference="nope")
    with pytest.raises(ReplicaConfigError, match="max_ulps"):
        compare_replicas(reps, max_ulps=-1)
    with pytest.raises(ReplicaConfigError, match="top"):
        compare_replicas(reps, top=0)
    with pytest.raises(ReplicaConfigError, match="pair"):
        compare_replicas({"c0": reps["c0"][0]})


def test_the_reference_can_be_named(tmp_path, base):
    flipped = variant(base, tmp_path / "flipped", lambda sd: sd[FLIPPED].reshape(-1)[0].neg_())
    report = compare_replicas(clusters(tmp_path, base, flipped, flipped), reference="c2")
    assert report.reference == "c2" and report.replica("c2").reference
    assert report.replica("c1").identical and report.replica("c0").worst[0].tensor == FLIPPED
    assert json_safe(report)["reference_root"] == report.replica("c2").root


# --------------------------------------------------------------------------- ULPs and tolerances


FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.mark.parametrize("dtype", FLOATS)
def test_adjacent_floats_are_one_ulp_apart(dtype):
    x = torch.tensor([1.0, -3.5, 1e-3, 0.0, 100.0], dtype=dtype)
    up = torch.nextafter(x, torch.full_like(x, float("inf")))
    assert ulp_distance(x, up).tolist() == [1] * 5
    assert ulp_distance(up, x).tolist() == [1] * 5
    down2 = torch.nextafter(torch.nextafter(x, -torch.ones_like(x) * 1e30), -torch.ones_like(x) * 1e30)
    assert ulp_distance(x, down2).tolist() == [2] * 5


@pytest.mark.parametrize("dtype", FLOATS)
def test_ulps_across_zero_and_signed_zeros(dtype):
    tiny = torch.nextafter(torch.zeros(1, dtype=dtype), torch.ones(1, dtype=dtype))
    assert ulp_distance(tiny, -tiny).item() == 2  # -d, 0, +d
    assert ulp_distance(torch.tensor([0.0], dtype=dtype), torch.tensor([-0.0], dtype=dtype)).item() == 0
    assert ulp_distance(tiny, torch.zeros(1, dtype=dtype)).item() == 1
    assert ulp_distance(-tiny, torch.tensor([-0.0], dtype=dtype)).item() == 1
    one = torch.ones(1, dtype=dtype)
    assert ulp_distance(one, -one).item() == 2 * ulp_distance(one, torch.zeros(1, dtype=dtype)).item()


@pytest.mark.parametrize("dtype", FLOATS)
def test_equal_values_are_zero_ulps_and_nans_are_equal_to_each_other(dtype):
    x = torch.tensor([1.5, -2.0, float("inf"), float("nan"), 1.0], dtype=dtype)
    y = torch.tensor([1.5, -2.0, float("inf"), float("nan"), float("nan")], dtype=dtype)
    assert ulp_distance(x, y).tolist() == [0, 0, 0, 0, ULP_MAX]
    # the largest finite value and infinity are adjacent: why the tolerances are checked as well
    big = torch.tensor([torch.finfo(dtype).max], dtype=dtype)
    assert ulp_distance(big, torch.tensor([float("inf")], dtype=dtype)).item() == 1


def test_one_ulp_to_infinity_is_not_close():
    reference = torch.tensor([torch.finfo(torch.bfloat16).max, 1.0])  # fp32, exactly representable in bf16
    replica = torch.tensor([float("inf"), 1.0], dtype=torch.bfloat16)
    r = compare_tensors(reference, replica, name="w")
    assert r.max_ulp == 1 and r.allclose is False and not r.ok
    assert r.max_abs_diff is None and "not finite" in r.finding


def test_float64_ulps_saturate_instead_of_overflowing():
    x = torch.tensor([1e300, 2.0, -2.0], dtype=torch.float64)
    y = torch.tensor([-1e300, -2.0, 2.0], dtype=torch.float64)
    d = ulp_distance(x, y).tolist()
    assert d[0] == ULP_MAX and d[1] == d[2] > 0


def test_ulp_distance_refuses_mixed_or_non_float_dtypes():
    with pytest.raises(ValueError, match="cast"):
        ulp_distance(torch.ones(2), torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float dtype"):
        ulp_distance(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [0.0, 1e-4, 1e-3, 1e-2, 0.1])
def test_allclose_agrees_with_torch_testing_defaults(low, scale):
    g = torch.Generator().manual_seed(3)
    reference = torch.randn(2000, generator=g)
    replica = (reference * (1 + scale * torch.randn(2000, generator=g))).to(low)
    result = compare_tensors(reference, replica)
    try:
        torch.testing.assert_close(replica, reference.to(low))  # torch's defaults for ``low``
        expected = True
    except AssertionError:
        expected = False
    assert result.allclose is expected
    assert result.ok is (expected and result.max_ulp <= 1)


def test_integer_tensors_compare_by_value():
    a = torch.arange(10, dtype=torch.int64)
    assert compare_tensors(a, a.to(torch.int32)).ok
    b = a.clone()
    b[3] = 99
    r = compare_tensors(a, b)
    assert not r.ok and r.max_ulp is None and r.differing_share == pytest.approx(0.1) and r.max_abs_diff == 96
    assert not compare_tensors(a.float(), a).ok  # float against integer: no numeric comparison
