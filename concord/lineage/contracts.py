"""Schema contracts: a versioned great-expectations suite plus the column schema it implies.

A :class:`Contract` names each column it promises (type, whether it must be present and non-null,
numeric bounds, the allowed values of a label column) and may carry further great-expectations
expectation configurations verbatim. From that it builds the great-expectations ``ExpectationSuite``
(:meth:`Contract.suite_dict`), validates a pandas DataFrame against it (:func:`validate`), and
decides whether a new version keeps every table valid under the old one valid (:func:`compatible`).

Contracts live in any store as small immutable documents, ``contracts/<name>/<version>.json``;
a saved version never changes (:func:`save_contract` refuses), so ``name@version`` and the
contract's :meth:`~Contract.digest` (BLAKE3 of its canonical JSON) name the same thing everywhere.

Neither pandas nor great-expectations is imported at module import: both are imported inside the
functions that need them (importing great-expectations takes seconds). Validation runs in one
ephemeral great-expectations context per process, with analytics and progress bars off.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from concord.errors import ContractConflictError, ContractError, ContractNotFoundError
from concord.hashing import canonical_json
from concord.stores.base import Store, validate_segment

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "COLUMN_TYPES",
    "ColumnSpec",
    "CompatResult",
    "Contract",
    "Failure",
    "ValidationResult",
    "compatible",
    "contract_key",
    "infer_contract",
    "list_contracts",
    "load_contract",
    "save_contract",
    "validate",
]

FORMAT = "concord/contract@1"
DOCUMENT_PREFIX = "contracts"
COLUMN_TYPES = ("boolean", "integer", "float", "string", "category", "datetime")
#: type changes that keep every value valid: (old, new)
WIDENINGS = frozenset({("integer", "float"), ("category", "string")})
NUMERIC_TYPES = ("integer", "float")
LABEL_TYPES = ("string", "category")

_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_NULLABLE_INTS = (
    "Int8Dtype", "Int16Dtype", "Int32Dtype", "Int64Dtype",
    "UInt8Dtype", "UInt16Dtype", "UInt32Dtype", "UInt64Dtype",
)
_FLOATS = ("float16", "float32", "float64", "Float32Dtype", "Float64Dtype")
#: our types → the pandas dtype names ``expect_column_values_to_be_in_type_list`` is given.
#: Python type names ("int", "str", ...) let great-expectations check an object column value by
#: value. A float column accepts integers (integer → float is a widening).
TYPE_LISTS: dict[str, tuple[str, ...]] = {
    "boolean": ("bool", "BooleanDtype"),
    "integer": _INTS + _NULLABLE_INTS + ("int",),
    "float": _FLOATS + ("float",) + _INTS + _NULLABLE_INTS + ("int",),
    "string": ("str", "StringDtype"),
    "category": ("category",),
    "datetime": ("datetime64[s]", "datetime64[ms]", "datetime64[us]", "datetime64[ns]", "Timestamp"),
}

_COLUMN_KEYS = ("name", "type", "required", "min", "max", "allowed")
_CONTRACT_KEYS = ("format", "name", "version", "description", "columns", "extra_expectations")
_EXPECTATION_KEYS = frozenset({"type", "kwargs", "meta", "notes", "description", "severity"})
_REF_HELP = "Pass 'name@VERSION' (e.g. 'penguins@2'), 'name' (its latest version) or a path to a .json file."
_KEY = re.compile(r"^contracts/([^/]+)/([1-9][0-9]*)\.json$")
_EXAMPLES = 5
_RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": _EXAMPLES}
#: what pandas' infer_dtype says of an object column → our type
_OBJECT_KINDS = {
    "string": "string",
    "empty": "string",
    "boolean": "boolean",
    "integer": "integer",
    "floating": "float",
    "mixed-integer-float": "float",
}


# --------------------------------------------------------------------------- the contract


def _bound(value: Any, where: str, which: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(where, f"{which} must be a number or null, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ContractError(where, f"{which} must be finite, got {value!r}")
    return out


@dataclass(frozen=True)
class ColumnSpec:
    """One column a contract promises.

    ``required`` means the column must exist and hold no nulls; an optional column may be absent,
    and when present its non-null values must still satisfy the rest. ``min``/``max`` (inclusive)
    apply to integer and float columns, ``allowed`` (the permitted values) to string and category
    columns. Bounds are kept as floats and ``allowed`` as a sorted tuple without repeats, so equal
    specs have equal JSON and equal digests.
    """

    name: str
    type: str
    required: bool = True
    min: float | None = None
    max: float | None = None
    allowed: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ContractError("contract column", f"a name must be a non-empty string, got {self.name!r}")
        where = f"contract column {self.name!r}"
        if self.type not in COLUMN_TYPES:
            raise ContractError(where, f"unknown type {self.type!r}; use one of {', '.join(COLUMN_TYPES)}")
        if not isinstance(self.required, bool):
            raise ContractError(where, f"required must be true or false, got {self.required!r}")
        lo, hi = _bound(self.min, where, "min"), _bound(self.max, where, "max")
        if (lo is not None or hi is not None) and self.type not in NUMERIC_TYPES:
            raise ContractError(where, f"min/max apply to integer and float columns, not {self.type}")
        if lo is not None and hi is not None and lo > hi:
            raise ContractError(where, f"min {lo} is greater than max {hi}")
        object.__setattr__(self, "min", lo)
        object.__setattr__(self, "max", hi)
        if self.allowed is not None:
            if self.type not in LABEL_TYPES:
                raise ContractError(where, f"allowed applies to string and category columns, not {self.type}")
            if isinstance(self.allowed, str) or not isinstance(self.allowed, (list, tuple, set, frozenset)):
                raise ContractError(where, f"allowed must be a list of strings, got {self.allowed!r}")
            if not all(isinstance(v, str) for v in self.allowed):
                raise ContractError(where, "allowed must hold strings only")
            if not self.allowed:
                raise ContractError(where, "allowed is empty; use null for no constraint on the values")
            object.__setattr__(self, "allowed", tuple(sorted(set(self.allowed))))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "required": self.required,
            "min": self.min,
            "max": self.max,
            "allowed": list(self.allowed) if self.allowed is not None else None,
        }

    def expectations(self) -> list[dict]:
        """The great-expectations expectation configurations this column stands for."""
        col = self.name
        out: list[dict] = []
        if self.required:
            out.append({"type": "expect_column_to_exist", "kwargs": {"column": col}})
        out.append(
            {
                "type": "expect_column_values_to_be_in_type_list",
                "kwargs": {"column": col, "type_list": list(TYPE_LISTS[self.type])},
            }
        )
        if self.required:
            out.append({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": col}})
        if self.min is not None or self.max is not None:
            kwargs: dict[str, Any] = {"column": col}
            if self.min is not None:
                kwargs["min_value"] = self.min
            if self.max is not None:
                kwargs["max_value"] = self.max
            out.append({"type": "expect_column_values_to_be_between", "kwargs": kwargs})
        if self.allowed is not None:
            kwargs = {"column": col, "value_set": list(self.allowed)}
            out.append({"type": "expect_column_values_to_be_in_set", "kwargs": kwargs})
        return out


def _check_expectation(e: Any, where: str, i: int) -> dict:
    if not isinstance(e, dict):
        raise ContractError(where, f"extra expectation #{i} must be an object, got {type(e).__name__}")
    unknown = set(e) - _EXPECTATION_KEYS
    if unknown:
        raise ContractError(
            where,
            f"extra expectation #{i} has unknown keys {sorted(unknown)}; allowed: {sorted(_EXPECTATION_KEYS)}",
        )
    if not isinstance(e.get("type"), str) or not e["type"].startswith("expect_"):
        raise ContractError(where, f"extra expectation #{i} needs a 'type' naming an expectation (expect_...)")
    if not isinstance(e.get("kwargs"), dict):
        raise ContractError(where, f"extra expectation #{i} ({e['type']}) needs 'kwargs', an object")
    try:  # a private, JSON-shaped copy: the caller's dict can change later, the contract cannot
        return json.loads(json.dumps(e, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ContractError(where, f"extra expectation #{i} ({e['type']}) is not plain JSON ({exc})") from exc


@dataclass(frozen=True)
class Contract:
    """A versioned schema: columns, plus further great-expectations expectations kept verbatim."""

    name: str
    version: int
    columns: tuple[ColumnSpec, ...]
    description: str = ""
    extra_expectations: tuple[dict, ...] = field(default=(), hash=False)

    def __post_init__(self) -> None:
        try:
            validate_segment(self.name, "contract name")
        except ValueError as exc:
            raise ContractError(
                "contract", f"invalid name {self.name!r}",
                "Use letters, digits, '.', '_' or '-' (at most 128 characters, not starting with '.').",
            ) from exc
        if self.name.endswith(".json"):
            raise ContractError("contract", f"invalid name {self.name!r}: it ends in .json, as file paths do")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ContractError(f"contract {self.name}", f"version must be an integer >= 1, got {self.version!r}")
        where = f"contract {self.ref}"
        if not isinstance(self.columns, (list, tuple)) or not all(isinstance(c, ColumnSpec) for c in self.columns):
            raise ContractError(where, "columns must be a sequence of ColumnSpec")
        folded = [c.name.casefold() for c in self.columns]
        dupes = sorted({c.name for c, f in zip(self.columns, folded) if folded.count(f) > 1})
        if dupes:
            raise ContractError(
                where, f"column names {dupes} repeat (ignoring case, as great-expectations matches them)",
                "Give each column a name of its own.",
            )
        if not isinstance(self.description, str):
            raise ContractError(where, "description must be a string")
        if not isinstance(self.extra_expectations, (list, tuple)):
            raise ContractError(where, "extra_expectations must be a list of expectation configurations")
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(
            self, "extra_expectations",
            tuple(_check_expectation(e, where, i) for i, e in enumerate(self.extra_expectations)),
        )

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)

    def expectations(self) -> list[dict]:
        """Every expectation configuration of the suite, columns first, in order."""
        out = [e for c in self.columns for e in c.expectations()]
        out.extend(json.loads(json.dumps(e)) for e in self.extra_expectations)
        return out

    def suite_dict(self) -> dict:
        """The great-expectations ``ExpectationSuite`` as JSON (``gx.ExpectationSuite(**d)`` reads it)."""
        return {
            "name": self.ref,
            "expectations": self.expectations(),
            "suite_parameters": {},
            "meta": {"concord": {"format": FORMAT, "contract": self.ref, "digest": self.digest()}},
            "notes": self.description or None,
        }

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "columns": [c.to_dict() for c in self.columns],
            "extra_expectations": [json.loads(json.dumps(e)) for e in self.extra_expectations],
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes | str) -> Contract:
        """Read a contract document, checking every field; :class:`ContractError` says what is wrong."""
        from concord.documents import MAX_SMALL_DOCUMENT_BYTES, load_json_document

        where = "contract document"
        doc = load_json_document(
            data, where, max_bytes=MAX_SMALL_DOCUMENT_BYTES, expect=None, error=lambda problem: ContractError(where, problem)
        )
        if not isinstance(doc, dict):
            raise ContractError(where, f"expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT:
            raise ContractError(where, f"format is {doc.get('format')!r}, expected {FORMAT!r}")
        unknown = set(doc) - set(_CONTRACT_KEYS)
        if unknown:
            raise ContractError(where, f"unknown keys {sorted(unknown)}; allowed: {list(_CONTRACT_KEYS)}")
        for key in ("name", "version", "columns"):
            if key not in doc:
                raise ContractError(where, f"missing {key!r}")
        if not isinstance(doc["columns"], list):
            raise ContractError(where, "'columns' must be a list")
        columns = []
        for i, col in enumerate(doc["columns"]):
            if not isinstance(col, dict):
                raise ContractError(where, f"column #{i} must be an object, got {type(col).__name__}")
            unknown = set(col) - set(_COLUMN_KEYS)
            if unknown:
                raise ContractError(
                    where, f"column #{i} has unknown keys {sorted(unknown)}; allowed: {list(_COLUMN_KEYS)}"
                )
            if "name" not in col or "type" not in col:
                raise ContractError(where, f"column #{i} needs a 'name' and a 'type'")
            columns.append(ColumnSpec(**col))
        extra = doc.get("extra_expectations", [])
        if not isinstance(extra, list):
            raise ContractError(where, "'extra_expectations' must be a list")
        return cls(
            name=doc["name"],
            version=doc["version"],
            columns=tuple(columns),
            description=doc.get("description", ""),
            extra_expectations=tuple(extra),
        )

    def digest(self) -> str:
        """BLAKE3 of the canonical JSON (sorted keys, no spaces) of :meth:`to_dict`: the identity."""
        from blake3 import blake3

        return blake3(canonical_json(self.to_dict())).hexdigest()


# --------------------------------------------------------------------------- inference


def _pandas():
    import pandas as pd

    return pd


def _infer_type(series: pd.Series, name: str) -> str:
    pd = _pandas()
    ptypes = pd.api.types
    dtype = series.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        return "category"
    if ptypes.is_bool_dtype(dtype):
        return "boolean"
    if ptypes.is_integer_dtype(dtype):
        return "integer"
    if ptypes.is_float_dtype(dtype):
        return "float"
    if ptypes.is_datetime64_any_dtype(dtype):
        return "datetime"
    if isinstance(dtype, pd.StringDtype):
        return "string"
    if ptypes.is_object_dtype(dtype):
        kind = ptypes.infer_dtype(series, skipna=True)
        if kind in _OBJECT_KINDS:
            return _OBJECT_KINDS[kind]
        raise ContractError(
            f"column {name!r}", f"its values are of mixed or unsupported kinds ({kind})",
            "Cast it to one type first (astype, pd.to_numeric, pd.to_datetime), or leave it out of the frame.",
        )
    raise ContractError(
        f"column {name!r}", f"dtype {dtype} has no contract type ({', '.join(COLUMN_TYPES)})",
        "Cast it to one of those first, or leave it out of the frame.",
    )


def _float_below(value: Any) -> float:
    """``value`` as a float no greater than it (an integer beyond 2**53 may round up)."""
    out = float(value)
    if isinstance(value, int) and out > value:
        out = math.nextafter(out, -math.inf)
    return out


def _float_above(value: Any) -> float:
    out = float(value)
    if isinstance(value, int) and out < value:
        out = math.nextafter(out, math.inf)
    return out


def infer_contract(
    df: pd.DataFrame,
    name: str,
    version: int = 1,
    *,
    bounds: bool = True,
    categories_max: int = 20,
    description: str = "",
) -> Contract:
    """The contract ``df`` itself satisfies.

    Types come from the dtypes (object columns by their values); a column is required when it has
    no nulls; integer and float columns get their observed min and max (with ``bounds``); string
    and category columns with at most ``categories_max`` distinct values get those as ``allowed``.
    """
    pd = _pandas()
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"infer_contract needs a pandas DataFrame, got {type(df).__name__}")
    where = f"contract {name}@{version}"
    if df.columns.duplicated().any():
        dupes = sorted({str(c) for c in df.columns[df.columns.duplicated()]})
        raise ContractError(where, f"the frame repeats columns {dupes}", "Rename them first.")
    specs = []
    for col in df.columns:
        if not isinstance(col, str):
            raise ContractError(where, f"column {col!r} is not named by a string", "Rename it.")
        series = df[col]
        ctype = _infer_type(series, col)
        values = series.dropna()
        spec: dict[str, Any] = {"name": col, "type": ctype, "required": bool(series.notna().all())}
        if bounds and ctype in NUMERIC_TYPES and len(values):
            lo, hi = values.min(), values.max()
            lo, hi = (lo.item() if hasattr(lo, "item") else lo), (hi.item() if hasattr(hi, "item") else hi)
            if math.isfinite(float(lo)):
                spec["min"] = _float_below(lo)
            if math.isfinite(float(hi)):
                spec["max"] = _float_above(hi)
        if ctype in LABEL_TYPES and categories_max > 0:
            distinct = pd.unique(values.astype(object))
            if 1 <= len(distinct) <= categories_max and all(isinstance(v, str) for v in distinct):
                spec["allowed"] = tuple(distinct)
        specs.append(ColumnSpec(**spec))
    return Contract(name=name, version=version, columns=tuple(specs), description=description)


# --------------------------------------------------------------------------- storage


def contract_key(name: str, version: int) -> str:
    return f"{DOCUMENT_PREFIX}/{name}/{version}.json"


def save_contract(store: Store, contract: Contract) -> str:
    """Save ``contract`` as ``contracts/<name>/<version>.json``; return that key.

    Saving the same content again is a no-op. A version already saved with different content is
    never overwritten: :class:`~concord.errors.ContractConflictError` asks for a new version.
    """
    key = contract_key(contract.name, contract.version)
    if store.put_document(key, contract.to_json()):
        return key
    existing = store.get_document(key)
    try:
        saved_digest = Contract.from_json(existing).digest() if existing is not None else "missing"
    except ContractError:
        saved_digest = "unreadable"
    if saved_digest == contract.digest():
        return key
    raise ContractConflictError(store.uri, contract.ref, saved_digest, contract.digest())


def _saved(store: Store) -> list[tuple[str, int]]:
    out = []
    for key in store.list_documents(DOCUMENT_PREFIX):
        m = _KEY.match(key)
        if m:
            out.append((m.group(1), int(m.group(2))))
    return sorted(out)


def list_contracts(store: Store) -> list[str]:
    """Every saved contract as ``name@version``, by name then version."""
    return [f"{n}@{v}" for n, v in _saved(store)]


def _is_path(ref: str) -> bool:
    return ref.endswith(".json") or "/" in ref or os.sep in ref


def load_contract(store: Store, ref: str | os.PathLike) -> Contract:
    """The contract ``ref`` names: ``'name@3'``, ``'name'`` (its latest version) or a .json file path."""
    if isinstance(ref, os.PathLike) or _is_path(str(ref)):
        path = os.fspath(ref)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError as exc:
            raise ContractNotFoundError(os.path.dirname(os.path.abspath(path)), path) from exc
        return Contract.from_json(data)
    name, sep, version_text = ref.partition("@")
    try:
        validate_segment(name, "contract name")
    except ValueError as exc:
        raise ContractError(f"contract reference {ref!r}", "not a valid name", _REF_HELP) from exc
    if sep:
        if not version_text.isdigit() or int(version_text) < 1:
            raise ContractError(f"contract reference {ref!r}", "the version must be an integer >= 1", _REF_HELP)
        version = int(version_text)
    else:
        versions = [v for n, v in _saved(store) if n == name]
        if not versions:
            raise ContractNotFoundError(store.uri, ref, list_contracts(store))
        version = max(versions)
    data = store.get_document(contract_key(name, version))
    if data is None:
        raise ContractNotFoundError(store.uri, f"{name}@{version}", list_contracts(store))
    contract = Contract.from_json(data)
    if (contract.name, contract.version) != (name, version):
        raise ContractError(
            f"contract {name}@{version} in {store.uri}",
            f"the document there holds {contract.ref}",
            "The store is damaged or was edited by hand: save each contract with save_contract.",
        )
    return contract


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Failure:
    """One expectation a table did not meet."""

    expectation: str
    column: str | None
    details: str

    def to_dict(self) -> dict:
        return {"expectation": self.expectation, "column": self.column, "details": self.details}


@dataclass(frozen=True)
class ValidationResult:
    """A table checked against a contract: ``success``, and each failing expectation in ``failures``."""

    contract: str  # name@version
    success: bool
    failures: tuple[Failure, ...]
    evaluated: int  # expectations evaluated

    def to_dict(self) -> dict:
        return {
            "contract": self.contract,
            "success": self.success,
            "evaluated": self.evaluated,
            "failures": [f.to_dict() for f in self.failures],
        }


_GX_LOCK = threading.RLock()
_GX: dict[str, Any] = {}


def _gx():
    """``(great_expectations, batch definition)`` of this process's one ephemeral context."""
    with _GX_LOCK:
        if _GX.get("pid") != os.getpid():  # a forked child builds its own
            os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
            import great_expectations as gx
            from great_expectations.data_context.types.base import (
                DataContextConfig,
                InMemoryStoreBackendDefaults,
                ProgressBarsConfig,
            )

            config = DataContextConfig(
                store_backend_defaults=InMemoryStoreBackendDefaults(),
                analytics_enabled=False,
                progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
            )
            context = gx.get_context(project_config=config, mode="ephemeral")
            batch_definition = (
                context.data_sources.add_pandas("concord")
                .add_dataframe_asset("frame")
                .add_batch_definition_whole_dataframe("whole")
            )
            _GX.update(pid=os.getpid(), gx=gx, context=context, batch_definition=batch_definition)
        return _GX["gx"], _GX["batch_definition"]


def _fmt(value: Any) -> str:
    if hasattr(value, "item"):  # numpy scalars print as np.float64(...) otherwise
        value = value.item()
    return repr(value) if isinstance(value, str) else str(value)


def _exception_message(info: Any) -> str | None:
    """The message of an exception GX caught, whether it reports one or one per metric."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for value in info.values():
        if isinstance(value, dict) and value.get("raised_exception"):
            return str(value.get("exception_message"))
    return None


def _describe(kind: str, result: dict, exception: Any) -> str:
    message = _exception_message(exception)
    if message is not None:
        return f"could not be evaluated: {message}"
    if kind == "expect_column_to_exist":
        return "the column is missing"
    if "unexpected_count" in result:
        n, total = result["unexpected_count"], result.get("element_count")
        if kind == "expect_column_values_to_not_be_null":
            return f"{n} of {total} values are null"
        checked = total - result.get("missing_count", 0) if isinstance(total, int) else total
        text = f"{n} of {checked} non-null values unexpected"
        if result.get("unexpected_percent") is not None:
            text += f" ({result['unexpected_percent']:.2f}%)"
        examples = list(result.get("partial_unexpected_list") or [])[:_EXAMPLES]
        if examples:
            text += ", e.g. " + ", ".join(_fmt(v) for v in examples)
        return text
    if "observed_value" in result:
        return f"observed {result['observed_value']}"
    return json.dumps(result, default=str)[:300] if result else "not met"


def _gx_view(df: pd.DataFrame, contract: Contract) -> pd.DataFrame:
    """``df`` as great-expectations sees it: same values, dtypes it can name.

    GX 1.x builds the dtypes it compares against from names and default constructors, so it can
    never match pandas' ``str`` dtype (a ``StringDtype`` with NaN as missing value), nor a
    timezone-aware datetime. Such columns are handed over as object columns (GX then checks each
    value's type) and as UTC wall-clock datetimes. A category column under a ``string`` contract
    is handed over as its values.
    """
    pd = _pandas()
    view = df.copy(deep=False)
    for spec in contract.columns:
        if spec.name not in df.columns:
            continue
        series = df[spec.name]
        dtype = series.dtype
        if isinstance(dtype, pd.StringDtype):
            view[spec.name] = series.astype(object)
        elif isinstance(dtype, pd.DatetimeTZDtype):
            view[spec.name] = series.dt.tz_convert(None)
        elif isinstance(dtype, pd.CategoricalDtype) and spec.type != "category":
            view[spec.name] = series.astype(object)
    return view


def _ambiguous_columns(contract: Contract, df: pd.DataFrame) -> tuple[Failure, ...]:
    """Failures for the contract's columns that the frame holds under several names.

    great-expectations looks a column up ignoring case and takes the first match, so with both
    ``Mass`` and ``mass`` in a frame it could check the wrong one. Nothing is evaluated then.
    """
    groups: dict[str, list[str]] = {}
    for col in df.columns:
        groups.setdefault(str(col).casefold(), []).append(str(col))
    named = {c.name for c in contract.columns}
    for e in contract.extra_expectations:
        if isinstance(e["kwargs"].get("column"), str):
            named.add(e["kwargs"]["column"])
    failures = []
    for name in sorted(named):
        same = groups.get(name.casefold(), [])
        if len(same) > 1:
            failures.append(
                Failure(
                    "distinct_column_names", name,
                    f"the data has {len(same)} columns named {', '.join(repr(c) for c in same)}; "
                    "great-expectations matches names ignoring case, so rename all but one",
                )
            )
    return tuple(failures)


def validate(contract: Contract, df: pd.DataFrame) -> ValidationResult:
    """Run the contract's suite on ``df`` with great-expectations; each unmet expectation is a :class:`Failure`.

    A required column that is missing fails ``expect_column_to_exist`` (its other expectations are
    not evaluated); a missing optional column is fine. Only the category type check runs here
    rather than in great-expectations, which cannot name a categorical dtype with categories.
    """
    pd = _pandas()
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"validate needs a pandas DataFrame, got {type(df).__name__}")
    ambiguous = _ambiguous_columns(contract, df)
    if ambiguous:
        return ValidationResult(contract.ref, False, ambiguous, 0)

    # (expectation config, evaluated locally?) in suite order
    plan: list[tuple[dict, bool]] = []
    for spec in contract.columns:
        present = spec.name in df.columns
        for e in spec.expectations():
            if not present and e["type"] != "expect_column_to_exist":
                continue
            local = spec.type == "category" and e["type"] == "expect_column_values_to_be_in_type_list"
            plan.append((e, local))
    plan.extend((json.loads(json.dumps(e)), False) for e in contract.extra_expectations)

    outcomes: dict[int, Failure | None] = {}
    for i, (e, local) in enumerate(plan):
        if local:
            dtype = df[e["kwargs"]["column"]].dtype
            if isinstance(dtype, pd.CategoricalDtype):
                outcomes[i] = None
            else:
                outcomes[i] = Failure(e["type"], e["kwargs"]["column"], f"dtype {dtype}, expected category")

    remote = [(i, e) for i, (e, local) in enumerate(plan) if not local]
    if remote:
        gx, batch_definition = _gx()
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        expectations = []
        for i, e in remote:
            config = dict(e, meta={**(e.get("meta") or {}), "concord_index": i})
            try:
                expectations.append(ExpectationConfiguration(**config).to_domain_obj())
            except Exception as exc:  # GX raises its own types, pydantic's, TypeError...
                raise ContractError(
                    f"contract {contract.ref}", f"great-expectations rejects {e['type']} {e['kwargs']} ({exc})"
                ) from exc
        suite = gx.ExpectationSuite(name=contract.ref, expectations=expectations)
        with _GX_LOCK:
            batch = batch_definition.get_batch(batch_parameters={"dataframe": _gx_view(df, contract)})
            run = batch.validate(suite, result_format=_RESULT_FORMAT)
        for res in run.results:
            config = res.expectation_config
            i = config.meta["concord_index"]
            if res.success:
                outcomes[i] = None
            else:
                e = plan[i][0]
                details = _describe(e["type"], res.result or {}, res.exception_info)
                outcomes[i] = Failure(e["type"], e["kwargs"].get("column"), details)
        missing = [i for i, _ in remote if i not in outcomes]
        if missing:  # every expectation handed over reports back; anything else is a bug
            raise RuntimeError(f"great-expectations gave no result for {len(missing)} expectation(s) of {contract.ref}")

    failures = tuple(f for i, f in sorted(outcomes.items()) if f is not None)
    return ValidationResult(contract.ref, not failures, failures, len(outcomes))


# --------------------------------------------------------------------------- compatibility


@dataclass(frozen=True)
class CompatResult:
    """Whether contract ``new`` is backward compatible with ``old``; ``breaking`` lists what breaks."""

    old: str
    new: str
    compatible: bool
    breaking: tuple[str, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "old": self.old,
            "new": self.new,
            "compatible": self.compatible,
            "breaking": list(self.breaking),
            "notes": list(self.notes),
        }


def _values(values: Any) -> str:
    return ", ".join(repr(v) for v in sorted(values))


def _compare_column(o: ColumnSpec, n: ColumnSpec, breaking: list[str], notes: list[str]) -> None:
    col = f"column {o.name!r}"
    if o.type != n.type:
        if (o.type, n.type) in WIDENINGS:
            notes.append(f"{col}: type widened from {o.type} to {n.type}")
        else:
            breaking.append(f"{col}: type changed from {o.type} to {n.type}")
    if o.required != n.required:
        if n.required:
            breaking.append(f"{col}: now required (was optional)")
        else:
            notes.append(f"{col}: now optional (was required)")
    for which, tighter in (("min", lambda a, b: b > a), ("max", lambda a, b: b < a)):
        a, b = getattr(o, which), getattr(n, which)
        if a == b:
            continue
        if b is None:
            notes.append(f"{col}: {which} {a} removed")
        elif a is None:
            breaking.append(f"{col}: {which} {b} added (there was none)")
        elif tighter(a, b):
            breaking.append(f"{col}: {which} {'raised' if which == 'min' else 'lowered'} from {a} to {b}")
        else:
            notes.append(f"{col}: {which} {'lowered' if which == 'min' else 'raised'} from {a} to {b}")
    if o.allowed != n.allowed:
        if n.allowed is None:
            notes.append(f"{col}: allowed values constraint removed")
        elif o.allowed is None:
            breaking.append(f"{col}: allowed values added ({_values(n.allowed)}; there were none)")
        else:
            removed, added = set(o.allowed) - set(n.allowed), set(n.allowed) - set(o.allowed)
            if removed:
                breaking.append(f"{col}: allowed values removed: {_values(removed)}")
            if added:
                notes.append(f"{col}: allowed values added: {_values(added)}")


def _describe_expectation(e: dict) -> str:
    column = e.get("kwargs", {}).get("column")
    where = f" on column {column!r}" if isinstance(column, str) else ""
    kwargs = {k: v for k, v in e.get("kwargs", {}).items() if k != "column"}
    return f"expectation {e['type']}{where} {json.dumps(kwargs, sort_keys=True)}"


def compatible(old: Contract, new: Contract) -> CompatResult:
    """Whether every table valid under ``old`` stays valid under ``new``, and if not, why.

    Breaking: a removed column, a new required column, optional → required, a type change other
    than integer → float or category → string, a bound added or tightened, an allowed value
    removed or an allowed set added, an extra expectation that ``old`` did not have. Each breaking
    change is one line naming the column and the change; relaxations are listed as notes.
    """
    breaking: list[str] = []
    notes: list[str] = []
    if old.name != new.name:
        notes.append(f"comparing contracts of different names ({old.name} and {new.name})")
    new_columns = {c.name: c for c in new.columns}
    old_names = {c.name for c in old.columns}
    for o in old.columns:
        n = new_columns.get(o.name)
        if n is None:
            breaking.append(f"column {o.name!r}: removed (consumers that read it would break)")
        else:
            _compare_column(o, n, breaking, notes)
    for n in new.columns:
        if n.name in old_names:
            continue
        if n.required:
            breaking.append(f"column {n.name!r}: added as required (data valid under {old.ref} may lack it)")
        else:
            notes.append(f"column {n.name!r}: added as optional")
    old_extra = {canonical_json(e) for e in old.extra_expectations}
    new_extra = {canonical_json(e) for e in new.extra_expectations}
    for e in new.extra_expectations:
        if canonical_json(e) not in old_extra:
            breaking.append(f"{_describe_expectation(e)}: added")
    for e in old.extra_expectations:
        if canonical_json(e) not in new_extra:
            notes.append(f"{_describe_expectation(e)}: removed")
    return CompatResult(old.ref, new.ref, not breaking, tuple(breaking), tuple(notes))
