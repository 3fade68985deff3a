"""Reference profiles (concord.audit.profile): the file format (round trip, damaged and hostile
files refused, nothing unpickled), audits against a profile equal to audits against the raw
reference, merged partition profiles equal to the whole table's, stored profiles of data snapshots."""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile

import numpy as np
import pandas as pd
import pytest
from palmerpenguins import load_penguins

from concord.audit.drift import TableBatches, data_drift, data_drift_batches
from concord.audit.profile import (
    PROFILE_FORMAT,
    TableProfile,
    merge,
    profile_drift,
    profile_table,
    store_profile,
    stored_profile,
)
from concord.errors import DriftConfigError, ProfileError
from concord.stores import LocalDirStore


def shapes(n: int, seed: int, *, shift: float = 0.0, scale: float = 1.0, moved: float = 0.0) -> pd.DataFrame:
    """Columns of several shapes: normal, lognormal, Student-t (3), 5 categories, 1,000 Zipf
    categories, with ``shift`` (in σ) and ``scale`` on the numeric ones and ``moved`` of the
    categorical mass moved from the first category to the last."""
    rng = np.random.default_rng(seed)
    cats = rng.choice(list("abcde"), n, p=[0.4, 0.25, 0.15, 0.1, 0.1])
    move = rng.random(n) < moved / 0.4
    cats = np.where((cats == "a") & move, "e", cats)
    zipf = np.minimum(rng.zipf(1.3, n), 1000)
    zipf = np.where(move & (zipf == 1), 999, zipf)
    normal = rng.standard_normal(n) * scale + shift
    logn = np.exp(rng.standard_normal(n) * 0.5)
    logn = (logn - logn.mean()) * scale + logn.mean() + shift * 0.53
    t3 = rng.standard_t(3, n) * scale + shift * math.sqrt(3)
    with_nulls = np.where(rng.random(n) < 0.05, np.nan, normal)
    return pd.DataFrame({
        "normal": normal, "lognormal": logn, "t3": t3, "five": cats,
        "zipf": pd.Series(zipf).map(lambda z: f"z{z}").to_numpy(), "nulls": with_nulls,
        "count": rng.poisson(3, n),
    })


def batches(df: pd.DataFrame, rows: int = 7_000) -> TableBatches:
    return TableBatches.of_frame(df, rows=rows)


def same_sides(a: TableProfile, b: TableProfile) -> None:
    assert (a.rows, a.columns, a.sample_size, a.max_labels, dict(a.source)) == (b.rows, b.columns, b.sample_size, b.max_labels, dict(b.source))
    for name in a.columns:
        x, y = a.column(name), b.column(name)
        assert (x.other_labels, x.other_count, x.other_singletons) == (y.other_labels, y.other_count, y.other_singletons)
        for f in ("dtype", "rows", "family", "size", "kind", "sampled", "low", "high", "mean", "m2"):
            assert getattr(x.side, f) == getattr(y.side, f), (name, f)
        if x.side.values is None:
            assert y.side.values is None
        else:
            assert x.side.values.dtype == y.side.values.dtype == np.float64
            np.testing.assert_array_equal(x.side.values, y.side.values)
        if x.side.counts is None:
            assert y.side.counts is None
        else:
            pd.testing.assert_series_equal(x.side.counts, y.side.counts, check_index_type=False, check_names=False)


# --------------------------------------------------------------------------- the format


def test_a_profile_round_trips_through_its_bytes_and_the_same_profile_is_the_same_bytes(tmp_path):
    df = shapes(30_000, 1)
    df.loc[::7, "five"] = None
    p = profile_table(batches(df), sample_size=10_000, source={"label": "t.parquet", "kind": "file"})
    data = p.to_bytes()
    assert data == profile_table(batches(df), sample_size=10_000, source={"label": "t.parquet", "kind": "file"}).to_bytes()
    back = TableProfile.from_bytes(data, "t.profile")
    same_sides(p, back)
    assert back.column("normal").side.sampled and back.column("normal").side.values.size == 10_000
    assert back.column("five").side.nulls == len(range(0, 30_000, 7))
    size = p.save(tmp_path / "t.profile")
    same_sides(TableProfile.load(tmp_path / "t.profile"), p)
    # bounded: 10,000 values a numeric column, however many rows
    assert size < 6 * 10_000 * 8
    with zipfile.ZipFile(tmp_path / "t.profile") as zf:
        index = json.loads(zf.read("profile.json"))
    assert index["format"] == PROFILE_FORMAT and [c["name"] for c in index["columns"]] == list(df.columns)


def test_values_are_stored_plain_and_profiles_of_the_byte_shuffled_layout_still_read(tmp_path):
    """Numeric values are stored (not deflated) little-endian float64, read without a copy; a
    profile written with the first layout (bytes grouped by position, deflated) reads the same."""
    p = profile_table(batches(shapes(5_000, 3)), sample_size=2_000)
    data = p.to_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = [i for i in zf.infolist() if i.filename.endswith("/values.f8")]
        index = json.loads(zf.read("profile.json"))
        assert infos and all(i.compress_type == zipfile.ZIP_STORED for i in infos)
        np.testing.assert_array_equal(np.frombuffer(zf.read(infos[0]), "<f8"), p.column("normal").side.values)
    assert {c["values"]["layout"] for c in index["columns"] if c.get("values")} == {"plain"}
    back = TableProfile.from_bytes(data)
    assert not back.column("normal").side.values.flags.writeable  # a view of the archive's bytes
    same_sides(back, p)

    def shuffled(name, raw):
        if name.endswith("/values.f8"):
            return np.frombuffer(raw, np.uint8).reshape(-1, 8).T.tobytes()
        if name == "profile.json":
            doc = json.loads(raw)
            for c in doc["columns"]:
                if c.get("values"):
                    c["values"]["layout"] = "byte-shuffled"
            return json.dumps(doc).encode()
        return raw

    old = _rewrite(_rewrite(data, shuffled), _fix_digests)
    same_sides(TableProfile.from_bytes(old, "old.profile"), p)
    unknown = _rewrite(data, _index_edit(lambda doc: doc["columns"][0]["values"].update(layout="pickled")))
    with pytest.raises(ProfileError, match="values layout 'pickled' is unknown"):
        TableProfile.from_bytes(unknown, "x.profile")


def _rewrite(data: bytes, change) -> bytes:
    """The archive with its members passed through ``change(name, bytes) -> bytes | None`` (None drops it)."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info in src.infolist():
            new = change(info.filename, src.read(info))
            if new is not None:
                zf.writestr(info.filename, new)
    return out.getvalue()


def _index_edit(edit):
    def change(name, raw):
        if name != "profile.json":
            return raw
        doc = json.loads(raw)
        edit(doc)
        return json.dumps(doc).encode()

    return change


class _Boom:
    """Unpickling this would create a file: no profile reader may ever do it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _damaged_cases(tmp_path):
    marker = tmp_path / "unpickled"
    boom = pickle.dumps(_Boom(str(marker)))

    def numeric(doc):
        return next(c for c in doc["columns"] if c["name"] == "normal")

    def labels(doc):
        return next(c for c in doc["columns"] if c["name"] == "five")

    def unsorted(name, raw):
        if name.endswith("/values.f8") and b"" != raw:
            return np.frombuffer(raw, "<f8")[::-1].tobytes()
        return raw

    return marker, [
        ("not a zip", lambda d: b"PAR1 not a profile", "not a zip archive"),
        ("cut short", lambda d: d[: len(d) // 2], "not a zip archive"),
        ("no index", lambda d: _rewrite(d, lambda n, r: None if n == "profile.json" else r), "no profile.json"),
        (
            "another format",
            lambda d: _rewrite(d, _index_edit(lambda doc: doc.update(format="concord/profile@9"))),
            "concord/profile@9",
        ),
        (
            "a byte flipped",
            lambda d: _rewrite(
                d, lambda n, r: r if not n.endswith("values.f8") else r[:100] + bytes([r[100] ^ 1]) + r[101:]
            ),
            "does not match its digest",
        ),
        (
            "a pickle for values",
            lambda d: _rewrite(d, lambda n, r: boom if n.endswith("0/values.f8") else r),
            "bytes, not the",
        ),
        (
            "a pickle for the index",
            lambda d: _rewrite(d, lambda n, r: boom if n == "profile.json" else r),
            "not valid JSON",
        ),
        ("unsorted values", lambda d: _rewrite(_rewrite(d, unsorted), _fix_digests), "not sorted finite numbers"),
        (
            "more values than rows",
            lambda d: _rewrite(d, _index_edit(lambda doc: numeric(doc).update(size=numeric(doc)["size"] + 1))),
            "values in 2000 rows",
        ),
        (
            "counts that do not add up",
            lambda d: _rewrite(d, _index_edit(lambda doc: labels(doc).update(size=labels(doc)["size"] - 1))),
            "its counts add up to",
        ),
        (
            "sampled with every value kept",
            lambda d: _rewrite(d, _index_edit(lambda doc: numeric(doc).update(sampled=True))),
            "says sampled=True",
        ),
        (
            "a huge declared size",
            lambda d: _rewrite(d, _index_edit(lambda doc: numeric(doc)["values"].update(count=10**12))),
            "bytes of values, not 8000000000000",
        ),
        ("rows beyond 2**63", lambda d: _rewrite(d, _index_edit(lambda doc: doc.update(rows=10**30))), "too large"),
        (
            "a column twice",
            lambda d: _rewrite(d, _index_edit(lambda doc: doc["columns"].append(doc["columns"][0]))),
            "two columns are named",
        ),
        (
            "an unknown family",
            lambda d: _rewrite(d, _index_edit(lambda doc: numeric(doc).update(family="pickle"))),
            "family 'pickle'",
        ),
    ]


#: the digests of the members _fix_digests has seen, for the profile.json that follows them
_MEMBER_DIGESTS: dict[str, str] = {}


def _fix_digests(name, raw):
    """Re-sign members after a change, so that the content checks (not the digests) are what refuse."""
    from blake3 import blake3

    if name != "profile.json":
        _MEMBER_DIGESTS[name] = blake3(raw).hexdigest()
        return raw
    doc = json.loads(raw)
    for c in doc["columns"]:
        for key in ("values", "labels", "counts"):
            if c.get(key) and c[key]["member"] in _MEMBER_DIGESTS:
                c[key]["digest"] = _MEMBER_DIGESTS[c[key]["member"]]
    return json.dumps(doc).encode()


def test_damaged_or_hostile_files_are_refused_naming_the_file_and_nothing_is_unpickled(tmp_path):
    data = profile_table(shapes(2_000, 2)).to_bytes()
    marker, cases = _damaged_cases(tmp_path)
    for what, damage, message in cases:
        bad = damage(data)
        path = tmp_path / "bad.profile"
        path.write_bytes(bad)
        with pytest.raises(ProfileError) as err:
            TableProfile.load(path)
        text = str(err.value)
        assert message in text, (what, text)
        assert str(path) in text and "concord audit profile" in text and "\n" not in text, what
        assert err.value.exit_code == 15
    assert not marker.exists()
    # a member compressed with a method a profile never uses (bzip2 bombs, say) is refused unread
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_BZIP2) as zf:
        zf.writestr("profile.json", "{}")
    with pytest.raises(ProfileError, match="compressed with method 12"):
        TableProfile.from_bytes(out.getvalue(), "x.profile")
    # the good bytes still read
    assert TableProfile.from_bytes(data).rows == 2_000


# --------------------------------------------------------------------------- auditing against a profile


CASES = {
    "no drift": {},
    "mean +0.5σ": {"shift": 0.5},
    "scale x1.5": {"scale": 1.5},
    "mass moved": {"moved": 0.15},
}


def _grid_bound(profile: TableProfile, name: str, current: pd.Series) -> float:
    """The largest share of one bin of the column's grid, on either side: how far below the exact
    KS statistic the grid's may be."""
    from concord.audit.binned import grid_of
    from concord.audit.drift import DEFAULT_BINS, quantile_edges

    r = profile.column(name).side.values
    c = current.dropna().to_numpy(dtype=np.float64)
    grid = grid_of(r, quantile_edges(r, DEFAULT_BINS))
    shares = [grid.count(x)[0] / x.size for x in (r, c)]
    return float(max(s.max() for s in shares))


@pytest.mark.parametrize("case", list(CASES))
def test_an_audit_against_a_profile_gives_the_streamed_audits_severities(case):
    """A current table of more values per column than the sample size, counted on the profile's
    grid: the raw streamed audit's severities, its counts' statistics and exact moments to the
    bit, and KS and Wasserstein those of the profile's sample against every current value, within
    the grid's bound (not sampled)."""
    from concord.audit.drift import _ks_wasserstein

    n, k = 40_000, 8_000
    ref, cur = shapes(n, 10), shapes(n, 11, **CASES[case])
    raw = data_drift_batches(batches(ref), batches(cur), sample_size=k, history={"normal": ["warning"]})
    # the same batches as the streamed audit reads (a file's are): the same reference sample
    profile = TableProfile.from_bytes(profile_table(batches(ref), sample_size=k).to_bytes())
    against = profile_drift(profile, batches(cur), sample_size=k, history={"normal": ["warning"]})
    assert against.severities() == raw.severities(), (against.severities(), raw.severities())
    assert against.histograms() == raw.histograms()
    exact_keys = ("psi", "kl", "js", "chi2", "chi2_pvalue", "new_share", "mean_shift", "scale_ratio", "n_reference", "n_current")
    for x, y in zip(against.columns, raw.columns):
        assert {key: getattr(x, key) for key in exact_keys} == {key: getattr(y, key) for key in exact_keys}, x.column
    for name in ("normal", "lognormal", "t3", "nulls", "count"):
        col = against.column(name)
        assert col.sampled and "counted on" in col.finding
        every = np.sort(cur[name].dropna().to_numpy(dtype=np.float64))
        ks, _, w = _ks_wasserstein(profile.column(name).side.values, every)
        assert ks - _grid_bound(profile, name, cur[name]) - 1e-12 <= col.ks <= ks + 1e-12, name
        assert w * 0.95 - 1e-9 <= col.wasserstein <= w * (1 + 1e-9) + 1e-12, name
    assert data_drift_batches(profile, batches(cur), sample_size=k).severities() == data_drift_batches(batches(ref), batches(cur), sample_size=k).severities()
    # against the exact audit of both whole tables: the same severities here, the statistics
    # within the reference sample's error (KS: the DKW bound, alpha 1e-9) and the grid's
    exact = data_drift(ref, cur, history={"normal": ["warning"]})
    assert against.severities() == exact.severities(), (against.severities(), exact.severities())
    for name in ("normal", "lognormal", "t3"):
        bound = math.sqrt(math.log(2 / 1e-9) / (2 * k)) + _grid_bound(profile, name, cur[name])
        assert abs(against.column(name).ks - exact.column(name).ks) <= bound
    if case == "no drift":
        assert against.severity == "ok"
    else:
        assert against.severity != "ok"


def test_a_current_table_within_the_sample_size_is_compared_value_for_value():
    """Up to the sample size a current column is kept whole, as the streamed audit keeps it: the
    raw streamed audit's report exactly."""
    ref, cur = shapes(20_000, 12), shapes(6_000, 13, shift=0.3)
    profile = profile_table(batches(ref), sample_size=8_000)
    against = profile_drift(profile, batches(cur), sample_size=8_000)
    assert against.to_dict() == data_drift_batches(batches(ref), batches(cur), sample_size=8_000).to_dict()
    assert "counted on" not in against.column("normal").finding


def test_penguins_against_profiles():
    df = load_penguins()
    adelie, gentoo = df[df.species == "Adelie"], df[df.species == "Gentoo"]
    idx = np.random.default_rng(0).permutation(len(df))
    half_a, half_b = df.iloc[idx[: len(df) // 2]], df.iloc[idx[len(df) // 2 :]]
    for ref, cur in ((adelie, gentoo), (half_a, half_b)):
        profile = TableProfile.from_bytes(profile_table(ref).to_bytes())
        # every value is kept at this size: exactly the whole-table report
        assert data_drift(profile, cur).to_dict() == data_drift(ref, cur).to_dict()
        assert profile_drift(profile, cur).to_dict() == data_drift(ref, cur).to_dict()
    profile = profile_table(adelie)
    report = data_drift(profile, gentoo)
    assert report.severity == "critical" and report.column("body_mass_g").severity == "critical"
    assert data_drift(profile_table(half_a), half_b).severity == "ok"


def test_a_column_with_more_labels_than_the_profile_keeps_pools_the_rest_on_both_sides():
    n = 60_000
    ref, same, moved = shapes(n, 20), shapes(n, 21), shapes(n, 22, moved=0.2)
    profile = TableProfile.from_bytes(profile_table(ref, max_labels=40).to_bytes())
    z = profile.column("zipf")
    assert len(z.side.counts) == 40 and z.truncated
    assert z.other_labels == ref.zipf.nunique() - 40
    assert int(z.side.counts.sum()) + z.other_count == n
    assert z.other_singletons == int((ref.zipf.value_counts() == 1).sum())
    side = z.reference_side()
    assert side.singletons == int((ref.zipf.value_counts() == 1).sum()) and int(side.counts.sum()) == n
    quiet = profile_drift(profile, same)
    full = data_drift(ref, same)
    assert quiet.column("zipf").severity == full.column("zipf").severity
    assert quiet.column("zipf").new_share == 0.0  # unseen rare labels are pooled, never "new"
    assert profile_drift(profile, moved).column("zipf").severity == data_drift(ref, moved).column("zipf").severity != "ok"
    assert profile.column("five").other_labels == 0  # few labels: every one kept


def test_profile_options_are_checked():
    df = shapes(100, 3)
    with pytest.raises(DriftConfigError, match="sample_size"):
        profile_table(df, sample_size=1)
    with pytest.raises(DriftConfigError, match="max_labels"):
        profile_table(df, max_labels=0)
    with pytest.raises(DriftConfigError, match="'nope' is not in the table"):
        profile_table(df, columns=["nope"])
    with pytest.raises(DriftConfigError, match="not TableBatches"):
        profile_table([1, 2, 3])
    with pytest.raises(DriftConfigError, match="not a TableProfile"):
        profile_drift(df, df)
    p = profile_table(df, columns=["normal", "five"])
    assert p.columns == ("normal", "five")
    # a column the current table lacks, one only it has, one of another type: findings, as from a table
    r = profile_drift(p, df.drop(columns="five").assign(normal=df.five))
    assert {c.column: c.severity for c in r.columns}["five"] == "critical"
    assert "type changed" in r.column("normal").finding


# --------------------------------------------------------------------------- merging partition profiles


def test_profiles_of_a_tables_parts_merge_into_the_whole_tables_profile():
    n, k = 90_000, 10_000
    whole = shapes(n, 30)
    whole["time"] = np.arange(n, dtype=np.float64)  # parts differ: a time-ordered column
    parts = [whole.iloc[:20_000], whole.iloc[20_000:55_000], whole.iloc[55_000:]]
    merged = merge(*(profile_table(batches(p), sample_size=k) for p in parts))
    full = profile_table(batches(whole), sample_size=k)
    assert merged.rows == full.rows == n and merged.columns == full.columns
    for name in whole.columns:
        m, f = merged.column(name).side, full.column(name).side
        assert (m.size, m.nulls, m.family, m.kind, m.dtype) == (f.size, f.nulls, f.family, f.kind, f.dtype), name
        if f.counts is not None:  # label counts: exact
            pd.testing.assert_series_equal(m.counts, f.counts, check_names=False, check_index_type=False)
            continue
        assert (m.low, m.high) == (f.low, f.high)
        assert m.mean == pytest.approx(f.mean, rel=1e-9, abs=1e-9) and m.m2 == pytest.approx(f.m2, rel=1e-9)
        assert m.sampled and m.values.size == k and np.all(np.diff(m.values) >= 0)
        # both are uniform samples of the same column: their CDFs within the DKW bound (alpha 1e-9 each)
        grid = np.quantile(whole[name].dropna().to_numpy(), np.linspace(0.01, 0.99, 99))
        cdf = lambda v, grid=grid: np.searchsorted(v, grid, side="right") / v.size  # noqa: E731
        assert np.abs(cdf(m.values) - cdf(f.values)).max() <= 2 * math.sqrt(math.log(2 / 1e-9) / (2 * k)), name
    # merged from the parts (the merge is seeded): the same severities as the whole's profile
    for kwargs in ({}, {"shift": 0.5}, {"moved": 0.15}):
        cur = shapes(n, 31, **kwargs)
        cur["time"] = np.arange(n, dtype=np.float64) + (n * 0.1 if kwargs else 0)
        assert profile_drift(merged, batches(cur), sample_size=k).severities() == profile_drift(full, batches(cur), sample_size=k).severities()
    again = merge(*(profile_table(batches(p), sample_size=k) for p in parts))
    assert again.to_bytes() == merged.to_bytes()
    # parts that keep every value merge into exactly the whole's values
    small = merge(profile_table(whole.iloc[:300]), profile_table(whole.iloc[300:1000]))
    exact = profile_table(whole.iloc[:1000])
    for name in whole.columns:
        if exact.column(name).side.values is not None:
            np.testing.assert_array_equal(small.column(name).side.values, exact.column(name).side.values)
    # the same report, but for the rounding of the combined means (Chan's update of the parts' moments)
    for x, y in zip(profile_drift(small, whole.iloc[1000:3000]).to_dict()["columns"], profile_drift(exact, whole.iloc[1000:3000]).to_dict()["columns"]):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], float):
                assert x[key] == pytest.approx(y[key], rel=1e-9, abs=1e-12), (x["column"], key)
            elif key not in ("finding", "effect"):
                assert x[key] == y[key], (x["column"], key)


def test_merge_refuses_parts_that_do_not_fit():
    df = shapes(500, 4)
    with pytest.raises(DriftConfigError, match="columns differ"):
        merge(profile_table(df), profile_table(df.drop(columns="t3")))
    with pytest.raises(DriftConfigError, match="number in one part and label in another"):
        merge(profile_table(df), profile_table(df.assign(normal=df.five)))
    truncated = merge(profile_table(df, max_labels=5), profile_table(shapes(500, 5), max_labels=5))
    z = truncated.column("zipf")
    assert int(z.side.counts.sum()) + z.other_count == 1000 and len(z.side.counts) == 5


# --------------------------------------------------------------------------- stored beside a data snapshot


def test_a_data_snapshots_profile_is_stored_beside_it_and_found_again(tmp_path):
    from concord.lineage.data import register_data

    store = LocalDirStore(tmp_path / "registry")
    df = shapes(3_000, 6)
    snap = register_data(df, store, name="shapes")
    assert stored_profile(store, snap.id) is None
    profile = profile_table(df, source={"kind": "snapshot", "id": snap.id, "name": "shapes"})
    root = store_profile(store, snap.id, profile)
    assert store.read_ref(f"profiles/{snap.id}").root == root
    found_root, found = stored_profile(store, snap.id)
    assert found_root == root
    same_sides(found, profile)
    # a profile of another snapshot under this one's ref is refused
    other = register_data(shapes(100, 7), store, name="other")
    store_profile(store, other.id, profile)
    with pytest.raises(ProfileError, match=f"profiles data snapshot {snap.id}, not {other.id}"):
        stored_profile(store, other.id)
    # a stored profile that is damaged, or not there, is one line naming the ref and the store
    from concord.snapshots.snapshot import snapshot

    for name, content in (("reference.profile", b"PK\x03\x04 not a profile"), ("other.txt", b"x")):
        folder = tmp_path / f"bad-{name}"
        folder.mkdir()
        (folder / name).write_bytes(content)
        snapshot(folder, store, ref=f"profiles/{other.id}")
        problem = "is not a profile" if name == "reference.profile" else "its snapshot .* holds no reference.profile"
        with pytest.raises(ProfileError, match=f"profiles/{other.id} in {store.uri}: {problem}"):
            stored_profile(store, other.id)


def test_a_profile_stored_in_an_s3_store_is_read_back_and_audits_like_the_raw_reference(s3_store):
    """On S3 (a real moto_server): the first night profiles the reference data snapshot and stores
    the profile beside it; it reads back from its verified chunks, equal to the one made; the next
    night audits against it alone and gives the raw reference's report."""
    from concord.audit.nightly import nightly_drift
    from concord.lineage.data import register_data

    ref, cur = shapes(4_000, 11), shapes(3_000, 12, shift=0.3, moved=0.1)
    snap = register_data(ref, s3_store, name="ref")
    register_data(cur, s3_store, name="cur")
    assert stored_profile(s3_store, snap.id) is None
    first = nightly_drift("data/ref", "data/cur", s3_store, draw_plots=False, profile="create")
    assert first["reference"]["profile"] is not None and first["reference"]["kind"] == "snapshot"
    root, found = stored_profile(s3_store, snap.id)
    assert s3_store.read_ref(f"profiles/{snap.id}").root == root == first["reference"]["profile"]
    assert found.rows == 4_000 and found.source["id"] == snap.id
    same_sides(found, profile_table(ref, source=dict(found.source)))
    # the stored profile's file is an ordinary snapshot in the bucket: every chunk there, verified on reading
    from concord.snapshots.refs import load_manifest

    entry = load_manifest(s3_store, root).by_path["reference.profile"]
    ids = [cid for part in entry.parts for cid in part.chunk_ids()]
    assert ids and s3_store.has_chunks(ids) == set(ids)
    night = nightly_drift("data/ref", "data/cur", s3_store, draw_plots=False, profile="use")
    raw = nightly_drift("data/ref", "data/cur", s3_store, draw_plots=False, profile="off")
    assert night["reference"]["profile"] == root and raw["reference"]["profile"] is None
    assert {c["column"]: c["severity"] for c in night["drift"]["columns"]} == {c["column"]: c["severity"] for c in raw["drift"]["columns"]}
    assert night["drift"]["severity"] == raw["drift"]["severity"] == "critical"
    for x, y in zip(night["drift"]["columns"], raw["drift"]["columns"]):
        assert x["column"] == y["column"] and x["pvalue_adjusted"] == pytest.approx(y["pvalue_adjusted"], rel=1e-9, abs=1e-300)
        assert x["effect"] == y["effect"]
    # and an audit against the profile read back from S3 directly
    assert profile_drift(found, cur).severities() == {c["column"]: c["severity"] for c in raw["drift"]["columns"]}
