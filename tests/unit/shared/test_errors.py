"""Every error class Concord raises survives a pickle round-trip (a task runner such as Dask pickles
what a worker raised) with its type, message and attributes, keeps a credential hidden, and carries
the CLI exit status of its kind."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import concord
import concord.errors as errors
from concord.errors import ConcordError
from concord.redact import redact

SECRET = "hunter2-very-secret"
CREDENTIAL_URL = f"http://alice:{SECRET}@minio.internal:9000/bucket"


def _import_every_concord_module() -> None:
    for info in pkgutil.walk_packages(concord.__path__, "concord."):
        if not info.name.endswith(".__main__"):  # a module that runs the CLI
            importlib.import_module(info.name)


def _all_classes() -> list[type]:
    _import_every_concord_module()
    found: dict[str, type] = {}
    todo = [ConcordError]
    while todo:
        cls = todo.pop()
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        todo.extend(cls.__subclasses__())
    exported = [getattr(errors, name) for name in errors.__all__]
    for cls in exported:
        found.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    return [found[k] for k in sorted(found) if found[k].__module__.startswith("concord")]


CLASSES = _all_classes()


def _value(name: str, annotation: object, index: int):
    """A plausible value for parameter ``name``: the first string one carries a credential URL."""
    text = str(annotation)
    if "bool" in text:
        return True
    if "float" in text or name in ("waited", "seconds"):
        return 2.5
    if "int" in text and "str" not in text:
        return 7
    if "dict" in text or name == "failures":
        return {"s3://bucket/b": errors.StoreUnreachableError("s3://bucket/b", "connection reset")}
    if "tuple" in text:
        return ("k1", "k2")
    if "list" in text:
        return ["one", "two"]
    if name == "mark":
        return None
    return CREDENTIAL_URL if index == 0 else f"{name}-value"


def make(cls: type) -> BaseException:
    """An instance of ``cls`` built through its own ``__init__`` with plausible arguments."""
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    args, kwargs = [], {}
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            args.append(f"{cls.__name__} at {CREDENTIAL_URL} failed")
        elif p.kind is p.VAR_KEYWORD:
            continue
        elif p.default is not p.empty:
            continue
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = _value(p.name, p.annotation, i)
        else:
            args.append(_value(p.name, p.annotation, i))
    if cls.__name__ == "ReplicationError":
        args[0] = []  # the results that completed
    return cls(*args, **kwargs)


def _comparable(value: object) -> object:
    if isinstance(value, BaseException):
        return (type(value), str(value))
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_comparable(v) for v in value)
    return redact(value) if isinstance(value, str) else value


def test_the_walk_finds_the_errors_of_every_area():
    names = {c.__name__ for c in CLASSES}
    assert len(CLASSES) >= len(errors.__all__)
    # errors raised outside concord.errors are Concord errors too
    assert {"FrameError", "SealError", "YAMLRefused", "StoreKeyFileError"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_pickle_round_trip(cls):
    exc = make(cls)
    data = pickle.dumps(exc)
    back = pickle.loads(data)
    assert type(back) is cls
    assert str(back) == str(exc) and back.args == exc.args
    assert {k: _comparable(v) for k, v in back.__dict__.items()} == {
        k: _comparable(v) for k, v in exc.__dict__.items()
    }
    assert back.exit_code == exc.exit_code
    # a credential in an argument never shows, and never travels in the pickle
    assert SECRET not in str(exc) and SECRET not in str(back)
    assert SECRET.encode() not in data


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_is_a_concord_error_with_a_known_exit_code(cls):
    assert issubclass(cls, ConcordError)
    assert cls.exit_code in (1, 10, 11, 12, 13, 14, 15)


def test_a_pickled_error_keeps_notes_and_a_rebuilt_one_still_raises():
    exc = errors.RefNotFoundError("s3://bucket/p", "models/m")
    exc.add_note("on worker 3")
    back = pickle.loads(pickle.dumps(exc))
    assert back.__notes__ == ["on worker 3"]
    with pytest.raises(errors.RefNotFoundError, match="no ref 'models/m'") as caught:
        raise back
    assert isinstance(caught.value, KeyError) and caught.value.ref == "models/m"


@pytest.mark.parametrize(
    "code, names",
    [
        (10, ["StoreNotFoundError", "RefNotFoundError", "ManifestNotFoundError", "ChunkNotFoundError",
              "SourceNotFoundError", "CheckpointNotFoundError", "DataSnapshotNotFoundError", "ContractNotFoundError",
              "AdapterNotFoundError", "ModelCardNotFoundError", "OciNotFoundError"]),
        (11, ["StoreLockedError", "CheckoutBusyError"]),
        (12, ["StoreKeyError", "KeyPasswordError", "StoreKeyFileError"]),
        (13, ["UntrustedRootError", "SignatureError"]),
        (14, ["StoreUnreachableError", "OciRegistryUnreachableError", "LineageUnreachableError"]),
        (15, ["IntegrityError", "UnknownEncodingError", "FrameError", "SealError", "ManifestError", "OciDigestMismatchError"]),
        (1, ["ConcordError", "StoreError", "DocumentError", "PolicyError", "TrustPolicyError", "KeyFileError"]),
    ],
)
def test_exit_codes_of_each_kind(code, names):
    by_name = {c.__name__: c for c in CLASSES}
    assert {n: by_name[n].exit_code for n in names} == {n: code for n in names}
