"""Reference profiles: a reference table read once, kept small, audited against many times.

:func:`profile_table` reads a table in one streaming pass (:class:`~concord.lineage.data.TableBatches`)
and keeps, per column, exactly what the drift rule takes of a reference (the reference
``_Side`` of :mod:`concord.audit.drift`):

* numeric columns: the exact count, nulls, smallest and largest value, mean and M2 (sum of
  squared deviations), and the sorted values, all of them up to ``sample_size`` (default
  :data:`~concord.audit.drift.SAMPLE_SIZE`) and above that a seeded uniform sample of that many,
  kept as float64 (the very sample the streamed audit draws);
* categorical columns: exact label counts, at most ``max_labels`` (default
  :data:`MAX_PROFILE_LABELS`) of them, the most frequent; beyond that the rest is kept as one
  "(other)" bucket: its values, its distinct labels and how many occur once.

A profile audits like its table: :func:`profile_drift` (also ``data_drift`` and
``data_drift_batches`` given a profile as the reference) reads the current table in one pass. A
current column of at most the sample size is kept whole and compared as the streamed audit of the
raw reference compares it (the same report); a larger one is neither sampled nor sorted but
counted on a fine grid of the profile's sample (:mod:`concord.audit.binned`): the same counts,
moments and PSI as that audit, KS, Wasserstein and Brown–Forsythe from the grid, within the bounds
``docs/drift.md`` states. A
profile is a zip archive (:meth:`TableProfile.to_bytes`): ``profile.json`` (format
:data:`PROFILE_FORMAT`) and, per column, raw little-endian arrays and a JSON list of labels, each
named with its length and BLAKE3 digest. Nothing in it is executed or unpickled; every member is
checked on reading (:meth:`TableProfile.from_bytes`), and anything amiss is a
:class:`~concord.errors.ProfileError` naming the file.

:func:`merge` combines profiles of a table's parts (counts added, samples redrawn in proportion to
each part's count). :func:`store_profile` keeps a data snapshot's profile in its store, as a
snapshot of its own under the ref ``profiles/<data snapshot id>``; :func:`stored_profile` finds it.

numpy and pandas are imported inside the functions that need them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from concord.audit.drift import SAMPLE_SIZE, DriftReport, DriftThresholds, TableBatches, _read_sides, _seed, _Side
from concord.errors import DriftConfigError, ProfileError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from concord.stores.base import Store

__all__ = [
    "MAX_PROFILE_LABELS",
    "PROFILE_FORMAT",
    "PROFILE_NAMESPACE",
    "PROFILE_SUFFIX",
    "ColumnProfile",
    "TableProfile",
    "is_profile_file",
    "merge",
    "profile_drift",
    "profile_ref",
    "profile_table",
    "store_profile",
    "stored_profile",
]

PROFILE_FORMAT = "concord/profile@1"
#: the file extension ``concord audit profile --out`` suggests, and the one an audit input is read as a profile by
PROFILE_SUFFIX = ".profile"
#: categorical columns: labels a profile keeps one by one (the most frequent); the others are one "(other)" bucket
MAX_PROFILE_LABELS = 100_000
#: refs of stored profiles: ``profiles/<data snapshot id>``
PROFILE_NAMESPACE = "profiles"
#: the file a stored profile's snapshot holds
PROFILE_FILE = "reference.profile"
#: a profile file is refused above this size (far above any profile: 500,000 float64 values are 4 MB a column)
MAX_PROFILE_BYTES = 4 << 30
_INDEX = "profile.json"
_MAX_INDEX_BYTES = 64 << 20
_MAX_COLUMNS = 100_000
_FAMILIES = ("number", "datetime", "timedelta", "label")
_KINDS = ("numeric", "categorical")
#: how a numeric column's values member is laid out: "plain" (little-endian float64, stored; what
#: profiles are written with) or "byte-shuffled" (the 8 bytes of the values grouped by position, deflated)
_VALUE_LAYOUTS = ("plain", "byte-shuffled")
#: the layout profiles are written with
VALUES_LAYOUT = _VALUE_LAYOUTS[0]
#: fields of a side that are arrays or label counts, kept as members of their own; the rest are JSON scalars
_ARRAY_FIELDS = ("values", "counts")
#: fields of a side only the current side of a streamed audit has
_CURRENT_ONLY = ("edges", "bin_counts", "grid", "grid_counts", "grid_sums")
#: a fixed timestamp in every member, so that the same profile is always the same bytes
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass
class _TruncatedSide(_Side):
    """A categorical reference side whose rarest labels a profile pooled: ``counts`` ends with the
    "(other)" label holding their values; ``singleton_count`` counts the labels seen once, the pooled
    ones included."""

    singleton_count: int = 0

    @property
    def singletons(self) -> int | None:
        return self.singleton_count


@dataclass(frozen=True)
class ColumnProfile:
    """One column of a profile: the reference side the drift rule takes, and what was pooled.

    ``side`` is the column as :mod:`concord.audit.drift` reads a reference (numeric: sorted float64
    ``values``, a uniform sample when ``sampled``; categorical: ``counts``, most frequent first).
    ``other_labels``, ``other_count`` and ``other_singletons``: categorical columns with more than
    the profile's ``max_labels`` labels, the distinct labels pooled as "(other)", their values and
    how many of them occur once (all 0 when every label is kept).
    """

    name: str
    side: _Side
    other_labels: int = 0
    other_count: int = 0
    other_singletons: int = 0

    @property
    def truncated(self) -> bool:
        return self.other_labels > 0

    @property
    def other_label(self) -> str:
        """The label of the pooled bucket: one no kept label has."""
        base = f"(other: {self.other_labels:,} categories beyond the profile)"
        kept = set(self.side.counts.index) if self.side.counts is not None else set()
        label = base
        while label in kept:
            label += " "
        return label

    def reference_side(self) -> _Side:
        """The column as the drift rule takes a reference: the side itself, or, when labels were
        pooled, a side whose counts end with the "(other)" bucket."""
        if not self.truncated:
            return self.side
        import pandas as pd

        s = self.side
        counts = pd.concat([s.counts, pd.Series([self.other_count], index=[self.other_label], dtype="int64")])
        counts = counts.sort_index(kind="stable").sort_values(ascending=False, kind="stable")
        kept_singletons = int((s.counts.to_numpy() == 1).sum())
        scalars = {f.name: getattr(s, f.name) for f in dataclasses.fields(_Side) if f.name != "counts"}
        return _TruncatedSide(**scalars, counts=counts, singleton_count=kept_singletons + self.other_singletons)

    def fold_current(self, cur: _Side) -> _Side:
        """The current side with every label this profile pooled (or never kept) counted in its
        "(other)" bucket, so that both sides pool alike: a label beyond the kept ones cannot be told
        from a new one."""
        if not self.truncated or cur.counts is None or cur.family != "label":
            return cur
        import pandas as pd

        kept = cur.counts.index.isin(self.side.counts.index)
        pooled = int(cur.counts[~kept].sum())
        counts = cur.counts[kept]
        if pooled:
            counts = pd.concat([counts, pd.Series([pooled], index=[self.other_label], dtype="int64")])
        counts = counts.sort_index(kind="stable").sort_values(ascending=False, kind="stable")
        return dataclasses.replace(cur, counts=counts)


@dataclass(frozen=True)
class TableProfile:
    """A reference table, profiled (:func:`profile_table`): its rows, its columns in order, and each
    column's :class:`ColumnProfile`.

    ``sample_size``: numeric values kept per column at most (None: all); ``max_labels``: labels kept
    per categorical column; ``source``: where the table came from (``label``, ``kind``, ``name``,
    ``id`` of a data snapshot), as given. It takes the reference's place in
    :func:`profile_drift` (and in ``data_drift`` / ``data_drift_batches``).
    """

    rows: int
    columns: tuple[str, ...]
    profiles: Mapping[str, ColumnProfile] = field(repr=False)
    sample_size: int | None = SAMPLE_SIZE
    max_labels: int = MAX_PROFILE_LABELS
    source: Mapping[str, Any] = field(default_factory=dict)

    def column(self, name: str) -> ColumnProfile:
        try:
            return self.profiles[name]
        except KeyError:
            raise KeyError(f"no column {name!r} in this profile; it has {', '.join(self.columns)}") from None

    # -------------------------------------------------------------- what the drift rule takes

    def reference_sides(self, names: Sequence[str]) -> tuple[int, dict[str, _Side]]:
        """The reference's rows and its sides of ``names`` (those the profile has), as
        ``data_drift_batches`` reads them from a table."""
        return self.rows, {n: self.profiles[n].reference_side() for n in names if n in self.profiles}

    def fold_current(self, sides: Mapping[str, _Side]) -> dict[str, _Side]:
        """The current sides, each categorical one pooled as its column's profile pooled the reference."""
        return {n: (self.profiles[n].fold_current(s) if n in self.profiles else s) for n, s in sides.items()}

    # -------------------------------------------------------------- summary

    def summary(self) -> dict:
        """What a report says about the profile: rows, columns, sizes, where it came from."""
        cols = []
        for name in self.columns:
            c = self.profiles[name]
            s = c.side
            kept = int(s.values.size) if s.values is not None else (len(s.counts) if s.counts is not None else 0)
            cols.append({
                "column": name, "kind": s.kind, "values": s.size, "nulls": s.nulls, "kept": kept,
                "sampled": bool(s.sampled), "other_labels": c.other_labels,
            })
        return {
            "format": PROFILE_FORMAT, "rows": self.rows, "sample_size": self.sample_size,
            "max_labels": self.max_labels, "source": dict(self.source), "columns": cols,
        }

    # -------------------------------------------------------------- the file format

    def to_bytes(self) -> bytes:
        """The profile as a zip archive: ``profile.json`` and each column's arrays (see the module)."""
        import numpy as np
        from blake3 import blake3

        buf = io.BytesIO()
        index_cols = []
        with zipfile.ZipFile(buf, "w") as zf:

            def put(member: str, data: bytes, compress: bool = True) -> dict:
                info = zipfile.ZipInfo(member, date_time=_ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
                zf.writestr(info, data, compresslevel=1 if compress else None)
                return {"member": member, "bytes": len(data), "digest": blake3(data).hexdigest()}

            for i, name in enumerate(self.columns):
                c = self.profiles[name]
                s = c.side
                entry: dict[str, Any] = {"name": name}
                for f in dataclasses.fields(_Side):
                    if f.name in _ARRAY_FIELDS or f.name in _CURRENT_ONLY:
                        continue
                    value = _plain(getattr(s, f.name))
                    if value is not None and not isinstance(value, (bool, int, float, str)):
                        raise TypeError(f"profile: field {f.name!r} of column {name!r} is a {type(value).__name__}, not a JSON scalar")
                    entry[f.name] = value
                if s.values is not None:
                    # stored as they are, not deflated: read every night, the values are taken
                    # straight from the archive's bytes (a store compresses its chunks itself)
                    values = np.ascontiguousarray(s.values, dtype="<f8")
                    entry["values"] = put(f"columns/{i}/values.f8", values.tobytes(), compress=False) | {"count": int(values.size), "layout": VALUES_LAYOUT}
                if s.counts is not None:
                    labels = [str(x) for x in s.counts.index]
                    counts = np.ascontiguousarray(s.counts.to_numpy(), dtype="<i8")
                    entry["labels"] = put(f"columns/{i}/labels.json", json.dumps(labels, ensure_ascii=False).encode()) | {"count": len(labels)}
                    entry["counts"] = put(f"columns/{i}/counts.i8", counts.tobytes()) | {"count": int(counts.size)}
                entry["other"] = {"labels": c.other_labels, "count": c.other_count, "singletons": c.other_singletons}
                index_cols.append(entry)
            index = {
                "format": PROFILE_FORMAT,
                "rows": self.rows,
                "sample_size": self.sample_size,
                "max_labels": self.max_labels,
                "source": {k: _plain(v) for k, v in self.source.items()},
                "columns": index_cols,
            }
            put(_INDEX, json.dumps(index, indent=1, sort_keys=True, ensure_ascii=False).encode())
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "(bytes)") -> TableProfile:
        """A profile from :meth:`to_bytes`'s bytes, every member checked; anything else is a
        :class:`~concord.errors.ProfileError` naming ``where``."""
        return _read_profile(data, where)

    def save(self, path: str | os.PathLike) -> int:
        """Write the profile to ``path`` at once (a temporary name, then a rename); its size in bytes."""
        from concord.files import atomic_write

        data = self.to_bytes()
        atomic_write(path, data)
        return len(data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TableProfile:
        """The profile in the file ``path`` (:meth:`from_bytes`)."""
        where = os.path.abspath(os.fspath(path))
        try:
            with open(where, "rb") as f:
                data = f.read(MAX_PROFILE_BYTES + 1)
        except OSError as exc:
            raise ProfileError(where, f"cannot be read ({exc.strerror or exc})") from exc
        return cls.from_bytes(data, where)


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


# --------------------------------------------------------------------------- reading a profile file


def _read_profile(data: bytes, where: str) -> TableProfile:
    from concord.documents import load_json_document

    def fail(problem: str) -> ProfileError:
        return ProfileError(where, problem)

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise fail(f"is a {type(data).__name__}, not bytes")
    if len(data) > MAX_PROFILE_BYTES:
        raise fail(f"is larger than {MAX_PROFILE_BYTES} bytes")
    data = data if isinstance(data, bytes) else bytes(data)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise fail(f"is not a profile (not a zip archive: {exc})") from exc
    names = [i.filename for i in infos]
    if len(names) != len(set(names)):
        raise fail("holds two members of the same name")
    if len(infos) > 3 * _MAX_COLUMNS + 1:
        raise fail(f"holds {len(infos)} members, more than any profile")
    for info in infos:
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise fail(f"member {info.filename!r} is compressed with method {info.compress_type}, which a profile never uses")
    by_name = {i.filename: i for i in infos}

    def member(ref: Any, what: str, max_bytes: int) -> bytes:
        from blake3 import blake3

        if not isinstance(ref, dict) or not isinstance(ref.get("member"), str):
            raise fail(f"{what}: no member named")
        info = by_name.get(ref["member"])
        if info is None:
            raise fail(f"{what}: member {ref['member']!r} is missing")
        size = ref.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= max_bytes or info.file_size != size:
            raise fail(f"{what}: member {ref['member']!r} is {info.file_size} bytes, not the {size!r} its index says")
        raw = _stored_member(data, info) if info.compress_type == zipfile.ZIP_STORED else None
        if raw is None:
            try:
                with zf.open(info) as f:
                    raw = f.read(size + 1)
            except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError) as exc:  # a CRC that does not match, a cut member
                raise fail(f"{what}: member {ref['member']!r} is damaged ({exc})") from exc
        if len(raw) != size or blake3(raw).hexdigest() != ref.get("digest"):
            raise fail(f"{what}: member {ref['member']!r} does not match its digest (damaged or altered)")
        return raw

    if _INDEX not in by_name:
        raise fail(f"is not a profile (no {_INDEX} in the archive)")
    info = by_name[_INDEX]
    if info.file_size > _MAX_INDEX_BYTES:
        raise fail(f"{_INDEX} is {info.file_size} bytes, more than any profile's")
    try:
        with zf.open(info) as f:
            raw_index = f.read(_MAX_INDEX_BYTES + 1)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError) as exc:
        raise fail(f"{_INDEX} is damaged ({exc})") from exc
    index = load_json_document(raw_index, where, max_bytes=_MAX_INDEX_BYTES, error=fail)
    fmt = index.get("format") if isinstance(index, dict) else None
    if fmt != PROFILE_FORMAT:
        raise fail(f"has format {fmt!r}, not {PROFILE_FORMAT!r} (made by another version of Concord, or not a profile)")
    rows = _count(index.get("rows"), "rows", fail)
    sample_size = index.get("sample_size")
    if sample_size is not None:
        sample_size = _count(sample_size, "sample_size", fail, least=2)
    max_labels = _count(index.get("max_labels"), "max_labels", fail, least=1)
    source = index.get("source") or {}
    if not isinstance(source, dict) or not all(isinstance(v, (str, int, float, bool, type(None))) for v in source.values()):
        raise fail("source is not an object of plain values")
    cols = index.get("columns")
    if not isinstance(cols, list) or len(cols) > _MAX_COLUMNS:
        raise fail("columns is not a list of at most 100,000 columns")
    profiles: dict[str, ColumnProfile] = {}
    for entry in cols:
        c = _read_column(entry, rows, member, fail)
        if c.name in profiles:
            raise fail(f"two columns are named {c.name!r}")
        profiles[c.name] = c
    return TableProfile(
        rows=rows, columns=tuple(profiles), profiles=profiles, sample_size=sample_size, max_labels=max_labels,
        source={str(k): v for k, v in source.items()},
    )


#: a zip member's local header: signature, then fixed fields; the name's and the extra field's lengths at 26 and 28
_LOCAL_HEADER = 30
_LOCAL_SIGNATURE = b"PK\x03\x04"


def _stored_member(data: bytes, info: zipfile.ZipInfo) -> memoryview | None:
    """A stored (not compressed) member's bytes, a view of the archive's (no copy; its digest is
    checked by the caller); None when its local header is not where the directory says (read it
    through zipfile, which says what is wrong)."""
    start = info.header_offset
    head = data[start : start + _LOCAL_HEADER]
    if len(head) != _LOCAL_HEADER or head[:4] != _LOCAL_SIGNATURE:
        return None
    name_len = int.from_bytes(head[26:28], "little")
    extra_len = int.from_bytes(head[28:30], "little")
    if data[start + _LOCAL_HEADER : start + _LOCAL_HEADER + name_len] != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
        return None
    begin = start + _LOCAL_HEADER + name_len + extra_len
    if begin + info.file_size > len(data):
        return None
    return memoryview(data)[begin : begin + info.file_size]


def _count(value: Any, what: str, fail, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise fail(f"{what} is {value!r}, not a whole number >= {least}")
    return value


def _read_column(entry: Any, rows: int, member, fail) -> ColumnProfile:
    import math

    import numpy as np
    import pandas as pd

    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise fail("a column without a name")
    name = entry["name"]

    def bad(problem: str) -> ProfileError:
        return fail(f"column {name!r}: {problem}")

    scalars: dict[str, Any] = {}
    for f in dataclasses.fields(_Side):
        if f.name in _ARRAY_FIELDS or f.name in _CURRENT_ONLY or f.name not in entry:
            continue
        value = entry[f.name]
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise bad(f"{f.name} is not a plain value")
        scalars[f.name] = value
    if not isinstance(scalars.get("dtype"), str) or len(scalars["dtype"]) > 200:
        raise bad("dtype is not a text")
    if _count(scalars.get("rows"), "rows", bad) != rows:
        raise bad(f"has {scalars.get('rows')} rows, the table {rows}")
    size = _count(scalars.get("size", 0), "size", bad)
    if size > rows:
        raise bad(f"has {size} values in {rows} rows")
    family = scalars.get("family")
    if family is not None and family not in _FAMILIES:
        raise bad(f"family {family!r} is not one of {', '.join(_FAMILIES)}")
    if scalars.get("kind") not in _KINDS:
        raise bad(f"kind {scalars.get('kind')!r} is not numeric or categorical")
    if (family is None) != (size == 0):
        raise bad("has values but no family, or a family but no values")
    for key in ("low", "high", "mean", "m2"):
        v = scalars.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise bad(f"{key} is {v!r}, not a finite number")
    other = entry.get("other") or {"labels": 0, "count": 0, "singletons": 0}
    if not isinstance(other, dict):
        raise bad("other is not an object")
    other_labels = _count(other.get("labels"), "other labels", bad)
    other_count = _count(other.get("count"), "other count", bad)
    other_singletons = _count(other.get("singletons"), "other singletons", bad)
    if not (other_singletons <= other_labels <= other_count) or (other_labels == 0) != (other_count == 0):
        raise bad("its pooled labels do not add up")

    side = _Side(**scalars)
    if family in ("number", "datetime", "timedelta"):
        ref = entry.get("values")
        n = _count((ref or {}).get("count"), "values count", bad, least=1)
        layout = ref.get("layout")
        if layout not in _VALUE_LAYOUTS:
            raise bad(f"values layout {layout!r} is unknown (a profile has {' or '.join(_VALUE_LAYOUTS)})")
        raw = member(ref, f"column {name!r} values", 8 * n)
        if len(raw) != 8 * n:
            raise bad(f"holds {len(raw)} bytes of values, not {8 * n}")
        if layout == "plain":
            values = np.frombuffer(raw, dtype="<f8").astype(np.float64, copy=False)
        else:  # byte-shuffled: the bytes grouped by position, as profiles were first written
            values = np.frombuffer(raw, dtype=np.uint8).reshape(8, n).T.copy().view("<f8").ravel().astype(np.float64, copy=False)
        if not np.isfinite(values).all() or (n > 1 and (values[1:] < values[:-1]).any()):
            raise bad("its values are not sorted finite numbers")
        if n > size or (n < size) != bool(side.sampled):
            raise bad(f"keeps {n} of {size} values but says sampled={side.sampled}")
        if side.low is None or side.high is None or side.low > values[0] or side.high < values[-1]:
            raise bad("its smallest or largest value lies inside its values")
        if not side.sampled and (side.low != values[0] or side.high != values[-1]):
            raise bad("its smallest or largest value is not its values'")
        if other_labels:
            raise bad("a numeric column with pooled labels")
        side.values = values
    elif family == "label":
        ref = entry.get("labels")
        k = _count((ref or {}).get("count"), "labels count", bad, least=1)
        from concord.documents import load_json_document

        raw = member(ref, f"column {name!r} labels", _MAX_INDEX_BYTES)
        labels = load_json_document(raw, f"column {name!r} labels", max_bytes=_MAX_INDEX_BYTES, error=bad, expect=list)
        if not isinstance(labels, list) or len(labels) != k or not all(isinstance(x, str) for x in labels) or len(set(labels)) != k:
            raise bad(f"its labels are not {k} distinct texts")
        cref = entry.get("counts")
        if _count((cref or {}).get("count"), "counts count", bad) != k:
            raise bad("has as many counts as labels")
        counts = np.frombuffer(member(cref, f"column {name!r} counts", 8 * k), dtype="<i8").astype(np.int64)
        if counts.size != k or (counts < 1).any() or (k > 1 and (np.diff(counts) > 0).any()):
            raise bad("its counts are not positive, most frequent first")
        if int(counts.sum()) + other_count != size:
            raise bad(f"its counts add up to {int(counts.sum()) + other_count}, not its {size} values")
        side.counts = pd.Series(counts, index=pd.Index(labels, dtype=object))
    elif entry.get("values") is not None or entry.get("labels") is not None:
        raise bad("has values but no family")
    return ColumnProfile(name, side, other_labels, other_count, other_singletons)


# --------------------------------------------------------------------------- making profiles


def _check_sample_size(sample_size: Any) -> int | None:
    if sample_size is not None and (isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 2):
        raise DriftConfigError(
            "sample_size", f"must be a whole number >= 2 or None, got {sample_size!r}", f"Use the default, {SAMPLE_SIZE}."
        )
    return sample_size


def _as_batches(table: Any, which: str) -> TableBatches:
    if isinstance(table, TableBatches):
        return table
    if type(table).__name__ == "DataFrame":
        return TableBatches.of_frame(table, which=which)
    raise DriftConfigError(
        which, f"is a {type(table).__name__}, not TableBatches", "Read files with concord.lineage.data.table_batches."
    )


def _pooled(name: str, side: _Side, max_labels: int) -> ColumnProfile:
    """A column's profile: its side, with all but its ``max_labels`` most frequent labels pooled."""
    if side.counts is None or len(side.counts) <= max_labels:
        return ColumnProfile(name, side)
    rest = side.counts.iloc[max_labels:]
    kept = dataclasses.replace(side, counts=side.counts.iloc[:max_labels].copy())
    return ColumnProfile(name, kept, len(rest), int(rest.sum()), int((rest.to_numpy() == 1).sum()))


def profile_table(
    table: TableBatches | pd.DataFrame,
    *,
    columns: Sequence[str] | None = None,
    sample_size: int | None = SAMPLE_SIZE,
    max_labels: int = MAX_PROFILE_LABELS,
    source: Mapping[str, Any] | None = None,
) -> TableProfile:
    """The profile of ``table`` (read batch by batch, in one pass; a DataFrame is sliced), of its
    ``columns`` (default all).

    Numeric columns keep their exact count, range, mean and M2, and their values: all of them up
    to ``sample_size``, above it a uniform sample of that many drawn from a generator seeded by the
    column's name (the same sample the streamed audit draws: an audit against the profile gives
    its report). ``None`` keeps every value. Categorical columns keep their ``max_labels`` most
    frequent labels' exact counts and pool the rest. ``source`` is recorded as given (where the
    table came from). Memory: the samples, plus each categorical column's distinct labels while
    it is read.
    """
    sample_size = _check_sample_size(sample_size)
    if isinstance(max_labels, bool) or not isinstance(max_labels, int) or max_labels < 1:
        raise DriftConfigError("max_labels", f"must be a whole number >= 1, got {max_labels!r}", f"Use the default, {MAX_PROFILE_LABELS}.")
    batches = _as_batches(table, "table")
    if len(set(batches.columns)) != len(batches.columns):
        dup = next(c for c in batches.columns if batches.columns.count(c) > 1)
        raise DriftConfigError("table", f"two columns are named {dup!r}", "Rename one of them.")
    if columns is None:
        names = list(batches.columns)
    else:
        names = list(dict.fromkeys(str(c) for c in columns))
        unknown = [n for n in names if n not in batches.columns]
        if unknown:
            raise DriftConfigError("columns", f"{', '.join(map(repr, unknown))} is not in the table", f"Choose among {', '.join(batches.columns)}.")
    rows, sides = _read_sides(batches, names, sample_size, {})
    return TableProfile(
        rows=rows, columns=tuple(names), profiles={n: _pooled(n, sides[n], max_labels) for n in names},
        sample_size=sample_size, max_labels=max_labels, source=dict(source or {}),
    )


def merge(a: TableProfile, b: TableProfile, *more: TableProfile) -> TableProfile:
    """One profile of the table whose parts ``a``, ``b`` (and ``more``) profile.

    Counts, nulls and label counts are added, ranges widened, means and M2 combined exactly.
    Numeric samples: when the parts keep every value and together hold at most the sample size,
    all of them (the whole table's profile exactly); else a uniform sample of the sample size is
    drawn from the parts' samples, from each as many as a uniform sample of the whole would hold
    (hypergeometric in the parts' counts), with a generator seeded by the column's name and the
    counts. Labels beyond ``max_labels`` are pooled again; a label one part pooled keeps only the
    count the other parts kept of it (exact whenever no part pooled any label). A column numeric
    in one part and categorical in another is refused. The parts must have the same columns.
    """
    out = _merge_two(a, b)
    for p in more:
        out = _merge_two(out, p)
    return out


def _merge_two(a: TableProfile, b: TableProfile) -> TableProfile:
    for p in (a, b):
        if not isinstance(p, TableProfile):
            raise DriftConfigError("merge", f"got a {type(p).__name__}, not a TableProfile", "Pass profiles made by profile_table.")
    if set(a.columns) != set(b.columns):
        only = sorted(set(a.columns) ^ set(b.columns))
        raise DriftConfigError("merge", f"the parts' columns differ ({', '.join(only)})", "Profile every part with the same columns.")
    sizes = [s for s in (a.sample_size, b.sample_size) if s is not None]
    sample_size = max(sizes) if sizes else None
    max_labels = max(a.max_labels, b.max_labels)
    profiles = {n: _merge_column(a.profiles[n], b.profiles[n], sample_size, max_labels) for n in a.columns}
    source = dict(a.source) if a.source == b.source else {}
    return TableProfile(a.rows + b.rows, a.columns, profiles, sample_size, max_labels, source)


def _merge_column(a: ColumnProfile, b: ColumnProfile, sample_size: int | None, max_labels: int) -> ColumnProfile:
    import numpy as np

    from concord.audit.drift import combine_moments

    sa, sb = a.side, b.side
    if sa.family and sb.family and sa.family != sb.family:
        raise DriftConfigError(
            "merge", f"column {a.name!r} is {sa.family} in one part and {sb.family} in another",
            "Profile the whole table at once (its values are then compared as text), or fix the part.",
        )
    dtype = sa.dtype if sa.dtype == sb.dtype else _common_dtype(sa.dtype, sb.dtype)
    family = sa.family or sb.family
    base = sa if sa.family else sb
    side = _Side(dtype=dtype, rows=sa.rows + sb.rows, family=family, size=sa.size + sb.size, kind=base.kind if family else sa.kind)
    if family == "label":
        merged = _pooled(a.name, dataclasses.replace(side, counts=_add_counts(sa.counts, sb.counts)), max_labels)
        if not (a.truncated or b.truncated):
            return merged
        return ColumnProfile(
            a.name, merged.side,
            merged.other_labels + a.other_labels + b.other_labels,
            merged.other_count + a.other_count + b.other_count,
            merged.other_singletons + a.other_singletons + b.other_singletons,
        )
    if family is None:
        return ColumnProfile(a.name, side)
    parts = [s for s in (sa, sb) if s.size]
    side.low = min(s.low for s in parts)
    side.high = max(s.high for s in parts)
    if "mean" in {f.name for f in dataclasses.fields(_Side)}:
        side.mean, side.m2 = combine_moments(sa.size, sa.mean, sa.m2, sb.size, sb.mean, sb.m2)
    exact = all(not s.sampled for s in parts)
    if exact and (sample_size is None or side.size <= sample_size):
        values = np.concatenate([s.values for s in parts])
    else:
        k = side.size if sample_size is None else min(sample_size, side.size)
        if len(parts) == 1:
            from_a = k if parts[0] is sa else 0
        else:
            rng = np.random.default_rng([0x5EED, _seed(a.name), sa.size, sb.size])
            from_a = int(rng.hypergeometric(sa.size, sb.size, k))
        rng = np.random.default_rng([0x5EED, _seed(a.name), sa.size, sb.size, 1])
        taken = []
        for s, n in ((sa, from_a), (sb, k - from_a)):
            if n and s.values is not None:
                n = min(n, s.values.size)
                taken.append(s.values[np.sort(rng.choice(s.values.size, n, replace=False))] if n < s.values.size else s.values)
        values = np.concatenate(taken)
    values = np.sort(values, kind="stable")
    side.values, side.sampled = values, values.size < side.size
    return ColumnProfile(a.name, side)


def _common_dtype(x: str, y: str) -> str:
    import numpy as np

    try:
        return str(np.result_type(np.dtype(x), np.dtype(y)))
    except TypeError:
        return "object"


def _add_counts(x: pd.Series | None, y: pd.Series | None) -> pd.Series:
    import pandas as pd

    parts = [c for c in (x, y) if c is not None]
    counts = parts[0] if len(parts) == 1 else pd.concat(parts).groupby(level=0, sort=False).sum()
    return counts.sort_index(kind="stable").sort_values(ascending=False, kind="stable").astype("int64")


# --------------------------------------------------------------------------- auditing against a profile


def profile_drift(
    profile: TableProfile,
    current: TableBatches | pd.DataFrame,
    *,
    columns: Sequence[str] | None = None,
    thresholds: DriftThresholds | None = None,
    bins: int | None = None,
    history: Mapping[str, Sequence[str]] | None = None,
    sample_size: int | None = SAMPLE_SIZE,
    **options: Any,
) -> DriftReport:
    """The drift of ``current`` (read in one pass) from the reference ``profile`` profiles, with
    the profile having kept as many values per column as ``sample_size``: a current column of at most
    ``sample_size`` values gives the report :func:`~concord.audit.drift.data_drift_batches` gives
    against the raw reference; a larger one is counted on a grid of the profile's sample instead
    of sampled (see the module). A DataFrame ``current`` is read whole (``sample_size=None``: every
    value kept and compared) unless ``sample_size`` is given."""
    from concord.audit.drift import DEFAULT_BINS, data_drift_batches

    if not isinstance(profile, TableProfile):
        raise DriftConfigError("reference", f"is a {type(profile).__name__}, not a TableProfile", "Load it with TableProfile.load.")
    return data_drift_batches(
        profile, _as_batches(current, "current"), columns=columns, thresholds=thresholds,
        bins=DEFAULT_BINS if bins is None else bins, history=history, sample_size=sample_size, **options,
    )


# --------------------------------------------------------------------------- profiles in a store


def profile_ref(data_id: str) -> str:
    """The ref of a data snapshot's stored profile: ``profiles/<data snapshot id>``."""
    from concord.hashing import is_digest

    if not is_digest(data_id):
        raise DriftConfigError("data snapshot", f"{data_id!r} is not a snapshot id (64 hex)", "Give the data snapshot's id.")
    return f"{PROFILE_NAMESPACE}/{data_id}"


def store_profile(store: Store, data_id: str, profile: TableProfile) -> str:
    """Keep ``profile`` as the profile of the data snapshot ``data_id`` of ``store``: a snapshot of
    one file (:data:`PROFILE_FILE`) under the ref ``profiles/<data_id>`` (its history keeps the
    profiles before). Returns the profile snapshot's root."""
    import tempfile

    from concord.snapshots.snapshot import snapshot

    ref = profile_ref(data_id)
    with tempfile.TemporaryDirectory(prefix="concord-profile-") as tmp:
        folder = os.path.join(tmp, "profile")
        os.mkdir(folder)
        profile.save(os.path.join(folder, PROFILE_FILE))
        result = snapshot(folder, store, ref=ref, message=f"reference profile of data snapshot {data_id[:12]}")
    return result.root


def stored_profile(store: Store, data_id: str) -> tuple[str, TableProfile] | None:
    """``(root, profile)`` of the data snapshot ``data_id``'s stored profile, None if it has none.
    The profile's file is read from its chunks, each verified against its id (no copy on disk). A
    stored profile that cannot be read (or profiles another snapshot) is a ProfileError."""
    from concord.snapshots.refs import load_manifest

    ref = store.read_ref(profile_ref(data_id))
    if ref is None:
        return None
    where = f"{profile_ref(data_id)} in {store.uri}"
    entry = load_manifest(store, ref.root).by_path.get(PROFILE_FILE)
    if entry is None:
        raise ProfileError(where, f"its snapshot {ref.root[:12]} holds no {PROFILE_FILE}")
    if entry.size > MAX_PROFILE_BYTES:
        raise ProfileError(where, f"its {PROFILE_FILE} is {entry.size} bytes, more than any profile")
    data = b"".join(store.get_chunk(cid) for part in sorted(entry.parts, key=lambda p: p.offset) for cid in part.chunk_ids())
    if len(data) != entry.size:
        raise ProfileError(where, f"its chunks hold {len(data)} bytes, not the {entry.size} of {PROFILE_FILE}")
    profile = TableProfile.from_bytes(data, where)
    if profile.source.get("id") not in (None, data_id):
        raise ProfileError(where, f"profiles data snapshot {profile.source.get('id')}, not {data_id}")
    return ref.root, profile


def is_profile_file(spec: str | os.PathLike) -> bool:
    """Whether an audit input names a profile file: a file ending in :data:`PROFILE_SUFFIX`."""
    text = os.fspath(spec).strip()
    return text.lower().endswith(PROFILE_SUFFIX) and os.path.isfile(text)

