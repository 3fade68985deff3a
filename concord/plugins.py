"""Named extensions the core finds without importing them: ``NAME:REST`` text resolved through an
entry point group (the ``blocks`` package registers ``block`` for stores, trust and tier
policies), or through a function registered at run time. The core never imports Prefect."""

from __future__ import annotations

from collections.abc import Callable


def split_prefix(text: str) -> tuple[str, str] | None:
    """``('block', 'NAME')`` for ``block:NAME``; None for a path (``C:\\x`` and ``a:b/c``, with a
    one-letter or non-identifier part before the colon, are paths)."""
    name, sep, rest = text.partition(":")
    if sep and len(name) > 1 and name.isidentifier():
        return name, rest
    return None


class Plugins:
    """The functions of one entry point group, by name: registered, or loaded once on first use."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._fns: dict[str, Callable] = {}

    def register(self, name: str, fn: Callable) -> None:
        self._fns[name] = fn

    def _entry_points(self):
        from importlib.metadata import entry_points

        return entry_points(group=self.group)

    def get(self, name: str) -> Callable | None:
        fn = self._fns.get(name)
        if fn is None:
            ep = next((e for e in self._entry_points() if e.name == name), None)
            if ep is not None:
                fn = self._fns[name] = ep.load()
        return fn

    def has(self, name: str) -> bool:
        """Whether ``name`` is known, without loading it."""
        return name in self._fns or any(e.name == name for e in self._entry_points())

    def copy(self) -> Plugins:
        """Another registry of the same group holding what this one holds (for a test's own)."""
        other = Plugins(self.group)
        other._fns.update(self._fns)
        return other

    def names(self) -> list[str]:
        return sorted(set(self._fns) | {e.name for e in self._entry_points()})


__all__ = ["Plugins", "split_prefix"]
