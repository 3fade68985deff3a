"""Is a checkpoint folder finished? The one readiness check the watcher and tier add share.

A trainer writes a checkpoint over seconds or minutes; taking it half-written would snapshot a
torn file. Complete means: the marker file exists (when one is named); no file has a temporary
suffix; every ``.safetensors`` file is whole; and, without a marker, nothing changed over a short
settle time. The folder is walked as a snapshot walks it (links followed, no folder twice).
"""

from __future__ import annotations

import os
import re
import time

from concord.errors import CheckpointNotReadyError, SafetensorsError, SourceNotFoundError

PARTIAL_SUFFIXES = (".tmp", ".part", ".partial", ".incomplete", ".lock")


def _scan(path: str) -> dict[str, tuple[int, int]]:
    """Size and time of every file under ``path``, walked as a snapshot walks it (links followed,
    no folder twice: :func:`concord.snapshots.walk.walk_files`)."""
    from concord.snapshots.walk import walk_files

    out = {}
    for rel, full in walk_files(path):
        try:
            st = os.stat(full)
        except FileNotFoundError:
            continue  # removed while we looked: the next scan sees the change
        out[rel] = (st.st_size, st.st_mtime_ns)
    return out


def checkpoint_ready(path: str | os.PathLike, *, marker: str | None = None, settle_seconds: float = 2.0, sleep=time.sleep) -> dict:
    """Raise :class:`CheckpointNotReadyError` unless the checkpoint folder is complete.

    Complete means: the marker file exists (when the policy names one); no file has a partial
    suffix; every ``.safetensors`` file is whole (header valid, data as long as it claims); and,
    without a marker, no file changed size or time over ``settle_seconds``. Returns the scan.
    """
    from concord.snapshots.safetensors_header import read_header

    src = os.path.abspath(os.fspath(path))
    if not os.path.exists(src):
        raise SourceNotFoundError(src)
    if not os.path.isdir(src):
        raise CheckpointNotReadyError(src, "a checkpoint is a folder; this is a file")
    if marker and not os.path.isfile(os.path.join(src, marker)):
        raise CheckpointNotReadyError(src, f"no completion marker {marker!r} in it yet")
    first = _scan(src)
    if not first or (marker and set(first) == {marker}):
        raise CheckpointNotReadyError(src, "the folder holds no files yet")
    partial = sorted(p for p in first if p.endswith(PARTIAL_SUFFIXES))
    if partial:
        raise CheckpointNotReadyError(src, f"{partial[0]} looks half-written (temporary suffix)")
    for rel, (size, _) in first.items():
        if rel.endswith(".safetensors"):
            full = os.path.join(src, rel)
            try:
                with open(full, "rb") as f:
                    read_header(f, size, full)
            except SafetensorsError as exc:
                raise CheckpointNotReadyError(src, f"{rel} is not a whole safetensors file yet ({exc.problem})") from None
    if not marker and settle_seconds > 0:
        sleep(settle_seconds)
        second = _scan(src)
        changed = sorted(set(first) ^ set(second)) or sorted(p for p in first if first[p] != second.get(p))
        if changed:
            raise CheckpointNotReadyError(src, f"{changed[0]} changed within {settle_seconds:g} s (still being written)")
    return first


def checkpoint_time(scan: dict[str, tuple[int, int]]) -> float:
    """When a checkpoint was written: the modification time of its newest file."""
    return max(mtime for _, mtime in scan.values()) / 1e9


def step_of(name: str) -> int | None:
    m = re.search(r"(\d+)$", name)
    return int(m.group(1)) if m else None



__all__ = ["PARTIAL_SUFFIXES", "checkpoint_ready", "checkpoint_time", "step_of"]
