"""Data snapshots: a table (a pandas DataFrame, a Parquet or a CSV file) stored like any snapshot.

A data snapshot is an ordinary Concord snapshot of one file, so it is chunked, deduplicated,
replicated and verified like weights are. Its id is the snapshot's Merkle root: a hash over every
byte of the file, so the same content always gets the same id and any changed row gets a new one.
The file is snapshotted under a fixed name (``data.parquet`` or ``data.csv``) so the id depends on
the content and its format only, never on where the file happened to live.

A DataFrame is written to Parquet deterministically (no index, fixed compression, one writer), so
registering the same frame twice gives the same id. Next to the snapshot, a small document
``datasets/<id>.json`` records what a reader needs without loading the data: rows, columns, dtypes,
format, name and the BLAKE3 digest of the file. The ref ``data/<name>`` points at the latest
snapshot registered under that name, with its history.

pandas and pyarrow are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from concord.errors import DataFormatError, DataSnapshotNotFoundError, DriftConfigError, ManifestError
from concord.hashing import is_digest
from concord.progress import Progress
from concord.stores.base import Store, validate_segment

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

DATA_NAMESPACE = "data"
DOCUMENT_PREFIX = "datasets"
DOCUMENT_FORMAT = "concord/dataset@1"
#: Parquet settings that make a DataFrame's file a pure function of its content
PARQUET_COMPRESSION = "zstd"
PARQUET_COMPRESSION_LEVEL = 3
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
_READ_BLOCK = 1 << 20


@dataclass(frozen=True)
class DataSnapshot:
    """What Concord knows about one registered table, without loading it."""

    id: str  # the snapshot's Merkle root
    name: str
    format: str  # "parquet" | "csv"
    path: str  # the file's name inside the snapshot
    rows: int
    columns: tuple[str, ...]
    schema: dict[str, str] = field(hash=False)  # column → pandas dtype
    bytes: int
    digest: str  # BLAKE3 of the file's bytes
    store: str  # URI of the store it was read from or written to

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["columns"] = list(self.columns)
        d["schema"] = dict(self.schema)
        return d


def document_key(snapshot_id: str) -> str:
    return f"{DOCUMENT_PREFIX}/{_check_id(snapshot_id)}.json"


def file_digest(path: str | os.PathLike) -> str:
    """The BLAKE3 digest of a file's bytes, read in blocks (never whole)."""
    from blake3 import blake3

    h = blake3()
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            h.update(block)
    return h.hexdigest()


def write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write ``df`` so that equal frames give byte-identical files (index dropped)."""
    df.to_parquet(
        path,
        engine="pyarrow",
        index=False,
        compression=PARQUET_COMPRESSION,
        compression_level=PARQUET_COMPRESSION_LEVEL,
    )


def _check_id(snapshot_id: str) -> str:
    if not is_digest(snapshot_id):
        raise ValueError(
            f"data snapshot id must be 64 lowercase hex characters (the snapshot root that "
            f"register_data returned), got {snapshot_id!r}"
        )
    return snapshot_id


def _format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    fmt = FORMATS.get(ext)
    if fmt is None:
        raise DataFormatError(path, f"unknown data format {ext or '(no extension)'!r}")
    return fmt


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """A parquet or CSV file as a DataFrame (the format from the extension)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise DataFormatError(path, "no such file")
    return _read(path, _format_of(path))


def _read(path: str, fmt: str) -> pd.DataFrame:
    import pandas as pd

    try:
        if fmt == "parquet":
            return pd.read_parquet(path, engine="pyarrow")
        return pd.read_csv(path)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DataFormatError(path, f"cannot read it as {fmt} ({exc})") from exc


#: bytes of a file (CSV text, or decoded parquet values) read per batch by :func:`table_batches`
BATCH_BYTES = 16 << 20


@dataclass(frozen=True)
class TableBatches:
    """A table read batch by batch, so that its size does not matter.

    ``columns`` are its column names, in order. ``read(names, as_text)`` yields DataFrames of
    consecutive rows holding some or all of the columns ``names`` (others are ignored): every value
    of every column asked for is in exactly one of them, each column's in row order (a CSV reader
    yields blocks of rows with every column, a parquet reader one column of some row groups at a
    time); it can be called more than once, each time from the start. ``as_text`` asks for the values as
    the text they were written as, where the format has it (CSV); elsewhere it may be ignored.
    :func:`table_batches` reads parquet and CSV files this way; :meth:`of_frame` slices a DataFrame.
    The drift audit (:func:`concord.audit.drift.data_drift_batches`) reads its tables this way.
    """

    columns: tuple[str, ...]
    read: Callable[[Sequence[str], bool], Iterable[pd.DataFrame]]

    @classmethod
    def of_frame(cls, df: pd.DataFrame, rows: int = 1 << 16, which: str = "table") -> TableBatches:
        """``df`` in slices of ``rows`` rows."""
        by_name = columns_by_name(df, which)

        def read(names: Sequence[str], as_text: bool = False) -> Iterable[pd.DataFrame]:
            import pandas as pd

            frame = pd.DataFrame({n: by_name[n] for n in names}, index=df.index)
            for start in range(0, len(frame), rows):
                yield frame.iloc[start : start + rows]

        return cls(tuple(by_name), read)


def columns_by_name(df: Any, which: str) -> dict[str, pd.Series]:
    """``df``'s columns by name (as text); :class:`~concord.errors.DriftConfigError` naming
    ``which`` when it is not a DataFrame or two columns share a name."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise DriftConfigError(
            which,
            f"is a {type(df).__name__}, not a pandas DataFrame",
            "Pass a DataFrame (read a parquet or CSV file with concord.lineage.data.read_table).",
        )
    by_name: dict[str, pd.Series] = {}
    for i, label in enumerate(df.columns):
        name = str(label)
        if name in by_name:
            raise DriftConfigError(which, f"two columns are named {name!r}", "Rename one of them.")
        by_name[name] = df.iloc[:, i]
    return by_name


def _arrow_frame(table: Any) -> pd.DataFrame:
    """A pyarrow table of one column as ``to_pandas`` makes it; an integer or float column without
    nulls wraps its numpy values (without a copy when it is one chunk), skipping pandas' conversion."""
    import pyarrow as pa

    column = table.column(0)
    kind = column.type
    if table.num_columns != 1 or column.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or pa.types.is_float16(kind):
        return table.to_pandas()
    values = column.to_numpy()
    written = (table.schema.pandas_metadata or {}).get("columns") or []
    if any(c.get("numpy_type") != str(values.dtype) for c in written if c.get("field_name", c.get("name")) == table.column_names[0]):
        return table.to_pandas()  # pandas wrote it with another dtype (e.g. a nullable Int64)
    import pandas as pd

    return pd.DataFrame({table.column_names[0]: values}, copy=False)


def table_batches(path: str | os.PathLike, *, batch_bytes: int = BATCH_BYTES) -> TableBatches:
    """A parquet or CSV file as :class:`TableBatches`: read batch by batch, about
    ``batch_bytes`` at a time, so that memory does not grow with the file.

    Parquet: consecutive row groups, one column at a time (pyarrow), typed as :func:`read_table`
    types them. CSV: ``pandas.read_csv`` in blocks of rows, each block typed on its own as
    :func:`read_table` types the whole file; a column asked for ``as_text`` is read as text.
    The columns are known at once (the parquet footer, the CSV header); a file that is not there or
    cannot be read is a :class:`~concord.errors.DataFormatError`, raised here or while reading.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise DataFormatError(path, "no such file")
    fmt = _format_of(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
            columns = tuple(str(c) for c in pf.schema_arrow.empty_table().to_pandas().columns)
        except (ValueError, OSError) as exc:
            raise DataFormatError(path, f"cannot read it as parquet ({exc})") from exc

        def read(names, as_text=False):
            rows = max(1024, batch_bytes // 64)  # about 2 MB of float64 per column read
            try:
                pf = pq.ParquetFile(path)
                # consecutive row groups of about ``rows`` rows, one column at a time: a column
                # chunk is contiguous in the file, and pyarrow keeps what it decoded until the end
                # of the row groups it was given, so this bounds memory by ``batch_bytes``
                groups, group, count = [], [], 0
                for i in range(pf.metadata.num_row_groups):
                    group.append(i)
                    count += pf.metadata.row_group(i).num_rows
                    if count >= rows:
                        groups.append(group)
                        group, count = [], 0
                if group:
                    groups.append(group)
                for group in groups:
                    for name in names:
                        yield _arrow_frame(pf.read_row_groups(group, columns=[name], use_threads=False))
            except (ValueError, OSError) as exc:
                raise DataFormatError(path, f"cannot read it as parquet ({exc})") from exc

        return TableBatches(columns, read)

    import pandas as pd

    try:
        columns = tuple(str(c) for c in pd.read_csv(path, nrows=0).columns)
    except (ValueError, OSError) as exc:
        raise DataFormatError(path, f"cannot read it as csv ({exc})") from exc
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    line = max(1, len(head) // max(1, head.count(b"\n")))  # bytes per row, about

    def read(names, as_text=False):
        rows = max(1024, batch_bytes // line)
        wanted = list(names)
        # every column parsed, as read_table parses them (``usecols`` would let a row with too many
        # fields through), then only those asked for kept
        try:
            with pd.read_csv(path, chunksize=rows, dtype=str if as_text else None) as reader:
                for block in reader:
                    yield block[wanted] if len(wanted) < block.shape[1] else block
        except (ValueError, OSError) as exc:
            raise DataFormatError(path, f"cannot read it as csv ({exc})") from exc

    return TableBatches(columns, read)


@contextmanager
def data_file(store: Store, snapshot_id: str, *, progress: Progress | None = None) -> Iterator[tuple[str, DataSnapshot]]:
    """The file of a data snapshot, restored (every chunk verified) into a temporary folder that is
    removed on leaving: ``(path, info)``."""
    info = data_info(store, snapshot_id)
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.restore import restore

    manifest = load_manifest(store, snapshot_id)
    with tempfile.TemporaryDirectory(prefix="concord-data-") as tmp:
        out = os.path.join(tmp, "data")
        restore(store, manifest, out, progress=progress)
        path = os.path.join(out, info.path)
        if not os.path.isfile(path):
            raise DataSnapshotNotFoundError(store.uri, snapshot_id)
        yield path, info


def _describe(path: str, fmt: str) -> tuple[int, tuple[str, ...], dict[str, str]]:
    """Rows, columns and dtypes of a table file (Parquet from its footer, without reading the data)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
            empty = pf.schema_arrow.empty_table().to_pandas()
            rows = pf.metadata.num_rows
        except (ValueError, OSError) as exc:
            raise DataFormatError(path, f"cannot read it as parquet ({exc})") from exc
    else:
        empty = _read(path, fmt)
        rows = len(empty)
    columns = tuple(str(c) for c in empty.columns)
    if len(set(columns)) != len(columns):
        raise DataFormatError(path, "two columns have the same name; rename them")
    return rows, columns, {str(c): str(t) for c, t in empty.dtypes.items()}


def register_data(
    source: str | os.PathLike | pd.DataFrame,
    store: Store,
    *,
    name: str,
    progress: Progress | None = None,
) -> DataSnapshot:
    """Snapshot a table into ``store`` and point the ref ``data/<name>`` at it."""
    validate_segment(name, "data snapshot name")
    with tempfile.TemporaryDirectory(prefix="concord-data-") as tmp:
        staged = os.path.join(tmp, "snapshot")
        os.mkdir(staged)
        if _is_dataframe(source):
            fmt = "parquet"
            path = os.path.join(staged, "data.parquet")
            write_parquet(source, path)
        else:
            src = os.path.abspath(os.fspath(source))
            if not os.path.isfile(src):
                raise DataFormatError(src, "no such file (a folder is not a table)")
            fmt = _format_of(src)
            # snapshot the file under a fixed name, through a link: the id is the content's alone
            path = os.path.join(staged, f"data.{fmt}")
            os.symlink(src, path)
        # the user's file is read where it is, so that an error names it, not the link to it
        shown = path if _is_dataframe(source) else src
        rows, columns, schema = _describe(shown, fmt)
        digest = file_digest(shown)
        size = os.path.getsize(shown)

        from concord.errors import SourceChangedError
        from concord.snapshots.snapshot import snapshot

        try:
            result = snapshot(staged, store, ref=f"{DATA_NAMESPACE}/{name}", message=f"data {name}", progress=progress)
        except SourceChangedError as exc:
            if exc.path != path:
                raise
            raise SourceChangedError(shown) from None
    snap = DataSnapshot(
        id=result.root,
        name=name,
        format=fmt,
        path=os.path.basename(path),
        rows=rows,
        columns=columns,
        schema=schema,
        bytes=size,
        digest=digest,
        store=store.uri,
    )
    # immutable like the snapshot it describes: a second registration of the same bytes keeps it
    store.put_document(document_key(snap.id), json.dumps(_document(snap), indent=1, sort_keys=True).encode())
    return snap


def _document(snap: DataSnapshot) -> dict:
    return {
        "kind": DOCUMENT_FORMAT,
        "id": snap.id,
        "name": snap.name,
        "format": snap.format,
        "path": snap.path,
        "rows": snap.rows,
        "columns": list(snap.columns),
        "schema": dict(snap.schema),
        "bytes": snap.bytes,
        "digest": snap.digest,
    }


def _is_dataframe(obj) -> bool:
    # no pandas import just to answer "is this a DataFrame?"
    return type(obj).__name__ == "DataFrame" and hasattr(obj, "to_parquet")


def data_info(store: Store, snapshot_id: str) -> DataSnapshot:
    """The recorded facts about a data snapshot (rows, columns, dtypes, digest), without its data."""
    raw = store.get_document(document_key(snapshot_id))
    if raw is None:
        raise DataSnapshotNotFoundError(store.uri, snapshot_id)
    from concord.documents import MAX_SMALL_DOCUMENT_BYTES, load_json_document

    where = f"{document_key(snapshot_id)} in {store.uri}"
    doc = load_json_document(
        raw, where, max_bytes=MAX_SMALL_DOCUMENT_BYTES,
        error=lambda problem: ManifestError(where, f"unreadable dataset document ({problem})"),
    )
    try:
        if doc.get("kind") != DOCUMENT_FORMAT or doc.get("id") != snapshot_id:
            raise ValueError("unknown format or id mismatch")
        return DataSnapshot(
            id=snapshot_id,
            name=str(doc["name"]),
            format=str(doc["format"]),
            path=str(doc["path"]),
            rows=int(doc["rows"]),
            columns=tuple(str(c) for c in doc["columns"]),
            schema={str(k): str(v) for k, v in doc["schema"].items()},
            bytes=int(doc["bytes"]),
            digest=str(doc["digest"]),
            store=store.uri,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{document_key(snapshot_id)} in {store.uri}", f"unreadable dataset document ({exc})") from exc


def load_data(store: Store, snapshot_id: str, *, progress: Progress | None = None) -> pd.DataFrame:
    """The table of a data snapshot, restored (every chunk verified) into a temporary folder and read."""
    with data_file(store, snapshot_id, progress=progress) as (path, info):
        return _read(path, info.format)
