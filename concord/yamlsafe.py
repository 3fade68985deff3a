"""YAML for small hand-written documents (tier policies, model card front matter), read safely.

``yaml.safe_load`` builds no arbitrary objects, but it does expand aliases: a few hundred bytes
of nested ``&a [*b, *b, ...]`` anchors describe billions of nodes (a "billion laughs" bomb) that
take minutes and gigabytes to walk, and as many characters to print in an error. A hand-written
policy or card never needs an alias, so :func:`load` refuses every anchor and alias, and a
document nested deeper than Python can follow is refused too, each with a :class:`YAMLRefused`
naming the line. Import this module only where YAML is read (it imports PyYAML).
"""

from __future__ import annotations

import yaml

from concord.errors import ConcordError

#: deepest nesting of lists and mappings a document may have
MAX_DEPTH = 64


class YAMLRefused(ConcordError, yaml.YAMLError):
    """The document uses a YAML feature these documents never need (anchors, aliases, deep nesting)."""

    def __init__(self, problem: str, mark=None) -> None:
        self.problem = problem
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        super().__init__(f"{where}{problem}")


class NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors (``&name``) and aliases (``*name``), so a
    document is never larger in memory than in its text, and nesting deeper than ``MAX_DEPTH``."""

    _depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise YAMLRefused(
                f"the alias *{event.anchor} is not allowed here (anchors and aliases are refused); "
                "write the value out in full",
                event.start_mark,
            )
        if getattr(event, "anchor", None) is not None:
            raise YAMLRefused(
                f"the anchor &{event.anchor} is not allowed here (anchors and aliases are refused); "
                "remove it and write values out in full",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLRefused(f"the document is nested more than {MAX_DEPTH} levels deep", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(text: str | bytes):
    """The one document in ``text``, like ``yaml.safe_load`` but without anchors, aliases or deep
    nesting (:class:`YAMLRefused`, a ``yaml.YAMLError``)."""
    loader = NoAliasLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
