"""What an audit reads, named the way a person types it, and how an audit is named after it.

An input is a ``.parquet`` or ``.csv`` file, a data snapshot id (64 hex) or a ``data/<name>`` ref
in a data store (:func:`load_table` reads it whole, :func:`open_table` opens it for reading in
batches, :func:`stream_drift` computes the drift of two open tables). A reference may also be a
profile (:mod:`concord.audit.profile`): a ``.profile`` file, or the profile stored beside a data
snapshot, which :func:`open_reference` uses in the table's place (and can make and store). :func:`check_contract` makes
the contract section of a table, :func:`model_holders` and :func:`store_labels` find and name the
replicas of a model version. :func:`spec_name` and :func:`audit_name` name an audit after its inputs.

pandas and great-expectations are imported inside the functions that need them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from concord.audit.drift import DriftReport
from concord.errors import DataFormatError, DriftConfigError
from concord.hashing import is_digest
from concord.stores.base import NAME_SEGMENT

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from concord.audit.drift import TableBatches
    from concord.audit.profile import TableProfile
    from concord.lineage.contracts import Contract
    from concord.stores.base import Store

__all__ = [
    "INPUT_HELP",
    "PROFILE_MODES",
    "OpenProfile",
    "OpenTable",
    "TableSource",
    "audit_name",
    "check_contract",
    "load_table",
    "model_holders",
    "names_snapshot",
    "open_reference",
    "open_table",
    "slug",
    "spec_name",
    "store_labels",
    "stream_drift",
]

INPUT_HELP = "Give a .parquet or .csv file, a data snapshot id (64 hex) or a data/<name> ref in the data store."
#: how an audit takes a data snapshot's stored profile: use it when there is one, also make and
#: store it when there is none (the reference is then read once, as without a profile), or never
PROFILE_MODES = ("use", "create", "off")


@dataclass(frozen=True)
class TableSource:
    """Where a table of an audit came from."""

    spec: str  # as given
    kind: str  # "file" | "snapshot" | "profile" (a profile file)
    name: str  # file name without extension, or the data snapshot's name
    path: str | None = None  # the file, for a file
    id: str | None = None  # the snapshot id, for a snapshot
    store: str | None = None  # the store's URI, for a snapshot
    #: the reference profile the audit took the table's place: its stored snapshot's root, or the
    #: BLAKE3 of a profile file's bytes; None when the table itself was read
    profile: str | None = None
    #: a local copy of that profile to log with the audit (a profile file, or one made tonight)
    profile_file: str | None = None

    @property
    def label(self) -> str:
        """How reports name it: the file's name, or ``name@<id prefix>``."""
        if self.kind in ("file", "profile"):
            return os.path.basename(self.path or self.spec)
        return f"{self.name}@{(self.id or '')[:12]}"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"label": self.label}


_DATA_REF = re.compile(rf"^data/{NAME_SEGMENT}(~[0-9]+)?$")


def names_snapshot(text: str) -> bool:
    """A data snapshot id, or a ``data/<name>[~N]`` ref that is not a table file's path."""
    from concord.lineage.data import FORMATS

    if is_digest(text):
        return True
    if not _DATA_REF.match(text) or os.path.exists(text):
        return False
    return os.path.splitext(text.partition("~")[0])[1].lower() not in FORMATS


def _resolve(spec, which: str, store):
    """``(text, (snapshot id, info) or None, absolute file path or None)`` for an audit input,
    with the checks both ways of reading it share; errors are :class:`DriftConfigError`."""
    text = os.fspath(spec).strip()
    if not text:
        raise DriftConfigError(which, "is empty", INPUT_HELP)
    if names_snapshot(text):
        if store is None:
            raise DriftConfigError(which, f"{text!r} names a data snapshot but no data store was given", "Pass the store that holds it.")
        from concord.lineage.data import data_info
        from concord.snapshots.refs import resolve_root

        try:
            snapshot_id = resolve_root(store, text)
            info = data_info(store, snapshot_id)
        except (KeyError, ValueError) as exc:
            raise DriftConfigError(which, f"no data snapshot {text!r} in {store.uri} ({' '.join(str(exc).split())})", INPUT_HELP) from exc
        return text, (snapshot_id, info), None
    path = os.path.abspath(text)
    if not os.path.isfile(path):
        what = "a folder, not a table" if os.path.isdir(path) else "no such file"
        raise DriftConfigError(which, f"{path}: {what}", INPUT_HELP)
    return text, None, path


def load_table(spec: str | os.PathLike, store: Store | None = None, *, which: str = "table") -> tuple[pd.DataFrame, TableSource]:
    """The table ``spec`` names, and where it came from.

    ``spec`` is a ``.parquet``/``.csv`` file, a data snapshot id, or a ``data/<name>`` ref
    (``data/<name>~1`` for the one before) in ``store``. ``which`` ("reference", "current")
    names the input in errors, which are :class:`~concord.errors.DriftConfigError` (a
    ``ValueError``) and say what to give instead.
    """
    text, snapshot, path = _resolve(spec, which, store)
    if snapshot is not None:
        from concord.lineage.data import load_data

        snapshot_id, info = snapshot
        df = load_data(store, snapshot_id)
        return df, TableSource(spec=text, kind="snapshot", name=info.name, id=snapshot_id, store=store.uri)
    from concord.lineage.data import read_table

    try:
        df = read_table(path)
    except DataFormatError as exc:
        raise DriftConfigError(which, f"{path}: {exc.problem}", "Give a .parquet or .csv file (the format comes from the extension).") from exc
    name = os.path.splitext(os.path.basename(path))[0]
    return df, TableSource(spec=text, kind="file", name=name, path=path)


@dataclass(frozen=True)
class OpenTable:
    """A table an audit reads in batches (:func:`open_table`): where it came from, its file and format."""

    source: TableSource
    path: str
    format: str  # "parquet" | "csv"

    def batches(self, batch_bytes: int | None = None) -> TableBatches:
        """The table read about ``batch_bytes`` at a time (default ``concord.lineage.data.BATCH_BYTES``)."""
        from concord.lineage.data import BATCH_BYTES, table_batches

        return table_batches(self.path, batch_bytes=batch_bytes or BATCH_BYTES)

    def read(self) -> pd.DataFrame:
        """The whole table (for what needs it whole: a contract's validation)."""
        from concord.lineage.data import read_table

        return read_table(self.path)


@contextmanager
def open_table(spec: str | os.PathLike, store: Store | None = None, *, which: str = "table") -> Iterator[OpenTable]:
    """The table ``spec`` names, as :func:`load_table` takes it, without reading it: a file as it is,
    a data snapshot restored (every chunk verified) into a temporary folder removed on leaving.
    Errors are :func:`load_table`'s."""
    text, snapshot, path = _resolve(spec, which, store)
    if snapshot is not None:
        from concord.lineage.data import data_file

        snapshot_id, _ = snapshot
        with data_file(store, snapshot_id) as (path, info):
            yield OpenTable(TableSource(spec=text, kind="snapshot", name=info.name, id=snapshot_id, store=store.uri), path, info.format)
        return
    from concord.lineage.data import FORMATS

    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        ext = os.path.splitext(path)[1].lower()
        raise DriftConfigError(
            which, f"{path}: unknown data format {ext or '(no extension)'!r}", "Give a .parquet or .csv file (the format comes from the extension)."
        )
    name = os.path.splitext(os.path.basename(path))[0]
    yield OpenTable(TableSource(spec=text, kind="file", name=name, path=path), path, fmt)


def stream_drift(
    reference: OpenTable | OpenProfile,
    current: OpenTable,
    *,
    which: tuple[str, str] = ("reference", "current"),
    batch_bytes: int | None = None,
    **options: Any,
) -> DriftReport:
    """:func:`~concord.audit.drift.data_drift_batches` of two open tables, read about ``batch_bytes`` at a
    time (options: columns, thresholds, bins, history, sample_size); a file that turns out
    unreadable is a :class:`DriftConfigError` naming the input. A reference :class:`OpenProfile`
    stands for its table: only the current table is read."""
    from concord.audit.drift import data_drift_batches

    tables = []
    for label, table in zip(which, (reference, current)):
        if isinstance(table, OpenProfile):
            tables.append(table.profile)
            continue
        try:
            tables.append(table.batches(batch_bytes))
        except DataFormatError as exc:
            raise DriftConfigError(label, f"{table.path}: {exc.problem}", "Give a .parquet or .csv file (the format comes from the extension).") from exc
    try:
        return data_drift_batches(tables[0], tables[1], **options)
    except DataFormatError as exc:
        label = which[0] if exc.source == getattr(reference, "path", None) else which[1]
        raise DriftConfigError(label, f"{exc.source}: {exc.problem}", "Give a .parquet or .csv file (the format comes from the extension).") from exc



@dataclass(frozen=True)
class OpenProfile:
    """A reference audited through its profile (:func:`open_reference`): where the table came from
    (``source.profile`` names the profile) and the profile itself."""

    source: TableSource
    profile: TableProfile
    created: bool = False  # made from the table tonight (and stored, when ``source.profile`` is set)


@contextmanager
def open_reference(
    spec: str | os.PathLike,
    store: Store | None = None,
    *,
    profile: str = "use",
    sample_size: int | None = None,
    batch_bytes: int | None = None,
    profile_store: Store | None = None,
) -> Iterator[OpenTable | OpenProfile]:
    """The reference ``spec`` names, opened the cheapest way: a ``.profile`` file as the profile
    it holds; a data snapshot through the profile stored beside it (``profiles/<id>``, without
    reading the table) unless ``profile`` is "off"; else as :func:`open_table` opens it. With
    ``profile="create"``, a data snapshot without a stored profile is profiled as it is read (one
    pass, as the audit reads it anyway) and the profile stored beside it; a store that refuses
    the write leaves the audit as it is, with the profile used from memory. ``sample_size``: the
    numeric values a new profile keeps per column (default the audit's). With ``profile_store``
    (the nightly audit's registry), a table file's profile is kept there too, keyed by the BLAKE3
    of the file's bytes (``profiles/<digest>``): the file is hashed each time, never parsed, and a
    file whose bytes changed is profiled anew.
    """
    from concord.audit.profile import is_profile_file

    if profile not in PROFILE_MODES:
        raise DriftConfigError("profile", f"is {profile!r}", f"Choose one of {', '.join(PROFILE_MODES)}.")
    text = os.fspath(spec).strip()
    if is_profile_file(text):
        yield _profile_file(text)
        return
    if profile != "off" and names_snapshot(text) and store is not None:
        from concord.audit.profile import stored_profile

        _, (snapshot_id, info), _ = _resolve(spec, "reference", store)
        found = stored_profile(store, snapshot_id)
        if found is not None:
            root, prof = found
            yield OpenProfile(TableSource(spec=text, kind="snapshot", name=info.name, id=snapshot_id, store=store.uri, profile=root), prof)
            return
    if profile != "off" and profile_store is not None and not names_snapshot(text):
        yield from _file_profile(spec, profile_store, profile, sample_size, batch_bytes)
        return
    with open_table(spec, store, which="reference") as ref:
        if profile != "create" or ref.source.kind != "snapshot":
            yield ref
            return
        yield _create_profile(ref, store, sample_size, batch_bytes)


def _file_profile(spec, store: Store, profile: str, sample_size: int | None, batch_bytes: int | None) -> Iterator[OpenTable | OpenProfile]:
    """A table file as :func:`open_reference` opens it with a ``profile_store``: its stored profile,
    else the file (profiled and stored with "create")."""
    from concord.audit.profile import stored_profile
    from concord.lineage.data import file_digest

    with open_table(spec, None, which="reference") as ref:
        digest = file_digest(ref.path)
        found = stored_profile(store, digest)
        if found is not None:
            from dataclasses import replace

            root, prof = found
            yield OpenProfile(replace(ref.source, profile=root), prof)
        elif profile == "create":
            yield _create_profile(ref, store, sample_size, batch_bytes, key=digest)
        else:
            yield ref


def _profile_file(path: str) -> OpenProfile:
    from blake3 import blake3

    from concord.audit.profile import TableProfile

    path = os.path.abspath(path)
    prof = TableProfile.load(path)
    with open(path, "rb") as f:
        digest = blake3(f.read()).hexdigest()
    name = str(prof.source.get("name") or os.path.splitext(os.path.basename(path))[0])
    return OpenProfile(TableSource(spec=path, kind="profile", name=name, path=path, id=prof.source.get("id"), profile=digest, profile_file=path), prof)


def _create_profile(ref: OpenTable, store: Store, sample_size: int | None, batch_bytes: int | None, key: str | None = None) -> OpenProfile:
    import logging

    from concord.audit.drift import SAMPLE_SIZE
    from concord.audit.profile import profile_table, store_profile
    from concord.errors import ConcordError

    src = ref.source
    key = key or src.id  # a data snapshot's id, or a table file's BLAKE3
    try:
        batches = ref.batches(batch_bytes)
        prof = profile_table(
            batches,
            sample_size=SAMPLE_SIZE if sample_size is None else sample_size,
            source={"kind": src.kind, "id": key, "name": src.name, "label": src.label},
        )
    except DataFormatError as exc:
        raise DriftConfigError(
            "reference",
            f"{ref.path}: {exc.problem}",
            "Give a .parquet or .csv file (the format comes from the extension).",
        ) from exc
    root = None
    try:
        if src.kind == "file":
            from concord.lineage.data import file_digest

            if file_digest(ref.path) != key:  # the file changed while it was read: nothing to key it by
                raise OSError(f"{ref.path} changed while it was profiled")
        root = store_profile(store, key, prof)
    except (ConcordError, OSError) as exc:
        logging.getLogger(__name__).warning("profile of %s not stored in %s: %s", src.label, store.uri, " ".join(str(exc).split())[:300])
    from dataclasses import replace

    return OpenProfile(replace(src, profile=root), prof, created=True)


def check_contract(contract: Contract, df: pd.DataFrame) -> dict:
    """The contract section: ``{name, version, ref, digest, ok, evaluated, failed: [...]}``, each
    failed expectation as ``{expectation, column, details}``; ``severity`` is critical when any failed."""
    from concord.lineage.contracts import validate

    result = validate(contract, df)
    return {
        "name": contract.name,
        "version": contract.version,
        "ref": contract.ref,
        "digest": contract.digest(),
        "ok": result.success,
        "evaluated": result.evaluated,
        "failed": [f.to_dict() for f in result.failures],
        "severity": "ok" if result.success else "critical",
    }


def store_labels(specs: Sequence[str]) -> list[str]:
    """A cluster label per store spec: its short name (``data/stores/us-east`` → ``us-east``,
    ``s3://bucket/eu-central`` → ``eu-central``) when those are unique among ``specs``, else the
    addresses themselves (any credential in them hidden)."""
    from concord.stores.address import short_names

    return short_names(specs)


def model_holders(lineage: Any, name: str, version: str | int) -> dict:
    """The snapshot root of model version ``name``/``version`` (a number, or an alias such as
    ``champion``) and the stores lineage records as holding it (``held_by``; the store its
    source points into when none is recorded): ``{name, version, root, stores}``."""
    from concord.errors import LineageError

    text = str(version).strip()
    if not text.isdigit():
        try:
            text = str(lineage.client.get_model_version_by_alias(name, text).version)
        except Exception as exc:
            raise LineageError(f"model {name!r} has no version with alias {text!r} ({' '.join(str(exc).split())[:200]})") from exc
    info = lineage.model_lineage(name, text)
    stores = [h["store"] for h in info.get("replicas") or [] if h.get("store")]
    if not stores and info.get("store"):
        stores = [info["store"]]
    if not info.get("root") or not stores:
        raise LineageError(
            f"model version {name}/{text} records no snapshot root or no store holding it; "
            "register it with `concord model register NAME --store STORE --ref REF`"
        )
    return {"name": name, "version": text, "root": info["root"], "stores": stores}


def slug(text: str, limit: int = 80) -> str:
    """``text`` as a file or document name: runs of anything but letters, digits, ``._-`` become
    one ``-``, at most ``limit`` characters ("column" when nothing is left)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-")[:limit]
    return name or "column"


def spec_name(spec: str) -> str:
    """The short name of an input as given: a file's name without extension, a ``data/<name>``
    ref's name, the first 12 hex of a snapshot id, a store's last path segment."""
    text = str(spec).strip()
    if is_digest(text):
        return text[:12]
    if names_snapshot(text):
        return text[len("data/"):].partition("~")[0]
    return os.path.splitext(os.path.basename(text.rstrip("/")))[0] or text


def audit_name(*labels: str) -> str:
    """A document-safe name for an audit from what it compares (e.g. the two tables' names):
    readable, with a short hash of the exact text so different inputs never share a history."""
    from blake3 import blake3

    text = "--".join(str(x) for x in labels)
    return f"{slug(text, 100)}-{blake3(text.encode()).hexdigest()[:8]}"
