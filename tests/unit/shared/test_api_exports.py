"""What ``import concord`` exports: every name resolves, is documented and typed, and the import
itself loads none of them."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import concord


def test_every_exported_name_resolves_and_is_listed_by_dir():
    assert concord.__all__ == sorted(set(concord.__all__))
    assert set(concord.__all__) <= set(dir(concord))
    for name in concord.__all__:
        assert getattr(concord, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'no_such_verb'"):
        concord.no_such_verb  # noqa: B018


@pytest.mark.parametrize("name", concord.__all__)
def test_every_exported_name_has_a_docstring_of_its_own(name):
    obj = getattr(concord, name)
    doc = obj.__doc__ or ""
    # a dataclass without a docstring gets its signature as one: that documents nothing
    assert doc.strip() and not doc.startswith(f"{obj.__name__}("), f"concord.{name} has no docstring"


@pytest.mark.parametrize("name", [n for n in concord.__all__ if inspect.isfunction(getattr(concord, n))])
def test_every_exported_function_is_typed(name):
    sig = inspect.signature(getattr(concord, name))
    untyped = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert untyped == [], f"concord.{name}: parameters without a type: {untyped}"
    assert sig.return_annotation is not inspect.Signature.empty, f"concord.{name} has no return type"


def test_every_verb_is_exported_and_the_verbs_are_functions():
    from concord.api import VERBS

    assert set(VERBS) <= set(concord.__all__)
    assert all(inspect.isfunction(getattr(concord, v)) for v in VERBS)


def test_import_concord_loads_nothing_it_exports():
    code = "import sys, concord; print(sorted(m for m in sys.modules if m.startswith('concord.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
