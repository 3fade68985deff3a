"""Where a path that came from outside (a manifest's file path, an object's key under an S3
checkpoint) is written on disk: one check for every writer (restore, checkout, staging), one message.

A path is written only if it is relative, '/'-separated, normalised (no empty, '.' or '..' segment;
:func:`~concord.snapshots.manifest.safe_relpath`) and holds no control character (a name that could
forge a terminal's output is never created). Under a folder that may hold links already (a checkout
resuming a partial version, a staging folder), each target is also resolved, and one that a link on
its way leads outside the folder is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from concord.errors import UnsafePathError
from concord.snapshots.manifest import safe_relpath
from concord.text import control_char

#: the one reason a name with a control character is refused, whoever would write it
CONTROL_REASON = (
    "it holds a control character, and Concord never creates such a name (it could forge terminal "
    "output); rename the file at its source and snapshot it again"
)
OUTSIDE_REASON = "it resolves outside the folder it is written into (through a link on its way)"


def relative_path(path: str, *, shown: str | None = None) -> str:
    """``path`` checked as a relative name that stays inside any folder it is written into.

    Args:
        path: a manifest's file path, or an object's key below its prefix.
        shown: what the error names instead of ``path`` (the whole S3 key, say).

    Raises:
        UnsafePathError: ``path`` is empty, absolute, not normalised, or holds a control character.
    """
    try:
        rel = safe_relpath(path)
    except UnsafePathError as exc:
        if shown is None:
            raise
        raise UnsafePathError(shown, exc.reason) from None
    if control_char(rel) is not None:
        raise UnsafePathError(path if shown is None else shown, CONTROL_REASON)
    return rel


def target_path(path: str, real_base: str, *, resolve: bool = False, shown: str | None = None) -> str:
    """Where ``path`` is written under the folder ``real_base`` (already resolved).

    Args:
        path: as for :func:`relative_path`.
        real_base: the folder, as :func:`os.path.realpath` gives it.
        resolve: follow links already in the folder; refuse a target they lead outside it.
            Not needed in a folder just made, where a checked relative path stays inside.
        shown: what the error names instead of ``path``.

    Raises:
        UnsafePathError: the path is not a safe relative name, or (``resolve``) leaves the folder.
    """
    rel = relative_path(path, shown=shown)
    if os.sep == "/":  # a checked relative path is already '/'-separated: joined as it is
        full = real_base + rel if real_base.endswith("/") else f"{real_base}/{rel}"
    else:
        full = os.path.join(real_base, *rel.split("/"))
    if not resolve:
        return full
    full = os.path.realpath(full)
    if full == real_base or os.path.commonpath([full, real_base]) != real_base:
        raise UnsafePathError(path if shown is None else shown, OUTSIDE_REASON)
    return full


def target_paths(paths: Iterable[str], base: str | os.PathLike[str], *, resolve: bool = False) -> list[str]:
    """:func:`target_path` of each of ``paths`` under ``base``, all checked before any is written."""
    real_base = os.path.realpath(base)
    return [target_path(p, real_base, resolve=resolve) for p in paths]
