"""The types ``import concord`` exports are typed on their public surface, as its functions are
(mypy checks the verbs and the errors strictly in ``make test``; this checks the classes they return)."""

from __future__ import annotations

import inspect

import pytest

import concord

CLASSES = [
    n
    for n in concord.__all__
    if inspect.isclass(getattr(concord, n)) and not issubclass(getattr(concord, n), BaseException)
]


def _untyped(cls: type) -> list[str]:
    """The public methods and properties of ``cls`` (its own, not inherited) with a parameter or
    return value that has no annotation."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if not inspect.isfunction(func):
            continue
        sig = inspect.signature(func)
        params = list(sig.parameters.values())[1:]  # self or cls
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        missing = [p.name for p in params if p.annotation is inspect.Parameter.empty and p.kind not in variadic]
        if sig.return_annotation is inspect.Signature.empty and name != "__init__":
            missing.append("return")
        if missing:
            out.append(f"{name}: {', '.join(missing)}")
    return out


def test_the_exported_classes_are_found():
    assert {"Store", "SnapshotResult", "TrustPolicy", "Lineage"} <= set(CLASSES)


@pytest.mark.parametrize("name", CLASSES)
def test_every_public_method_of_an_exported_class_is_typed(name):
    assert _untyped(getattr(concord, name)) == [], f"concord.{name} has untyped members"


def test_an_untyped_method_is_caught():
    class Loose:
        def to_dict(self, full=False):
            return {}

    assert _untyped(Loose) == ["to_dict: full, return"]
