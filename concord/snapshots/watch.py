"""Watching folders and S3 prefixes for checkpoints that have finished being written.

A *source* is a local folder or an ``s3://bucket/prefix`` holding checkpoints in one of two
layouts, told apart subfolder by subfolder:

* ``<source>/<model>/<step>/``: a subfolder holding only folders is a model, and each of its
  subfolders a checkpoint of that model (``data/checkpoints/minilm/step-0100``);
* ``<source>/<step>/``: a subfolder holding files (its completion marker counts) is itself a
  checkpoint, of the model named after the source (``runs/llama/step-0100``: model ``llama``).

The model is thus always the name of the folder the checkpoint sits in (``model=`` overrides
it). :meth:`Watcher.scan` returns the checkpoints that became
complete since the last scan, as :class:`Announcement` records, and remembers them in a small
JSON state file (written atomically), so a restarted watcher does not announce them again.

Complete means, for a local folder, that :func:`~concord.snapshots.ready.checkpoint_ready`
passes (marker present, no half-written files, whole safetensors files, sizes stable). For an
S3 subfolder it means the completion marker object exists under it or, without a marker, that
at least one ``*.safetensors`` object exists and no object changed (size, ETag, LastModified)
between two scans at least ``settle_seconds`` apart.

A checkpoint is identified by its path and its *fingerprint*, a hash of its sorted
``(relative name, size)`` list (the marker left out). The same checkpoint is announced once; one
whose fingerprint changed under the same path is announced again with ``changed=True``.

This module is plain Python: the entry point that sends the announcements as Prefect events
lives with the deployments.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from concord.errors import CheckpointNotReadyError, WatchStateError
from concord.files import atomic_write
from concord.snapshots.ready import checkpoint_ready, step_of

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass(frozen=True)
class Announcement:
    """A checkpoint that has become complete (or changed since it was last announced)."""

    source: str
    store: str  # "local" or "s3"
    path: str  # the checkpoint folder, or its s3:// URI
    name: str
    step: int | None
    model: str
    bytes: int
    files: int
    fingerprint: str
    changed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fingerprint(entries: Iterable[tuple[str, int]]) -> str:
    """A stable hash of ``(relative name, size)`` pairs, whatever their order."""
    h = hashlib.sha256()
    for rel, size in sorted((str(r), int(s)) for r, s in entries):
        h.update(json.dumps([rel, size]).encode())
        h.update(b"\n")
    return h.hexdigest()


# --------------------------------------------------------------------------- state file


def _load_state(path: str) -> dict[str, dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise WatchStateError(path, f"cannot be read ({exc})") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise WatchStateError(path, f"not JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise WatchStateError(path, f"not a version {STATE_VERSION} watcher state object")
    announced = data.get("announced")
    if not isinstance(announced, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("fingerprint"), str) for v in announced.values()
    ):
        raise WatchStateError(path, "'announced' must map each checkpoint path to {'fingerprint': ...}")
    return announced


def _save_state(path: str, announced: dict[str, dict[str, Any]]) -> None:
    text = json.dumps({"version": STATE_VERSION, "announced": announced}, indent=1, sort_keys=True)
    atomic_write(path, text.encode("utf-8"), mode=0o600)


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class _Candidate:
    name: str
    path: str
    entries: dict[str, tuple]  # relative name -> (size, ...more to detect change)
    model: str = ""  # the folder the checkpoint sits in


class Watcher:
    """Find checkpoints that became complete under ``sources`` since the last scan."""

    def __init__(
        self,
        sources: list[str],
        *,
        state_path: str,
        marker: str | None = "COMPLETE",
        settle_seconds: float = 2.0,
        model: str | None = None,
        endpoint_url: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not sources:
            raise ValueError("give at least one folder or s3:// prefix to watch")
        if settle_seconds < 0:
            raise ValueError(f"settle_seconds must be zero or more, got {settle_seconds!r}")
        self.sources = [s if s.startswith("s3://") else os.path.abspath(os.path.expanduser(s)) for s in sources]
        self.state_path = os.fspath(state_path)
        self.marker = marker or None
        self.settle_seconds = float(settle_seconds)
        self.model = model
        self.endpoint_url = endpoint_url
        self._sleep = sleep
        self._clock = clock
        self._announced = _load_state(self.state_path)  # fails now, not at the first scan
        self._s3_seen: dict[str, tuple[tuple, float]] = {}  # path -> (listing, first seen)
        self._s3_stores: dict[str, Any] = {}

    @property
    def pending(self) -> int:
        """S3 checkpoints (without a marker) seen once and waiting for a second, settled look."""
        return len(self._s3_seen)

    def close(self) -> None:
        for store in self._s3_stores.values():
            store.close()
        self._s3_stores.clear()

    def scan(self) -> list[Announcement]:
        """The checkpoints newly complete (or changed) since the last scan; recorded as announced."""
        out: list[Announcement] = []
        for source in self.sources:
            if source.startswith("s3://"):
                out.extend(self._scan_s3(source))
            else:
                out.extend(self._scan_local(source))
        if out:
            for a in out:
                self._announced[a.path] = {
                    "fingerprint": a.fingerprint,
                    "name": a.name,
                    "model": a.model,
                    "announced_at": time.time(),
                }
            _save_state(self.state_path, self._announced)
        return out

    # ------------------------------------------------------------------ shared

    def _model_for(self, source: str, c: _Candidate | None = None) -> str:
        if self.model:
            return self.model
        if c is not None and c.model:
            return c.model
        if source.startswith("s3://"):
            from concord.stores.address import StoreAddress

            return StoreAddress.parse(source).name
        return os.path.basename(source.rstrip(os.sep)) or source

    def _content(self, entries: dict[str, tuple]) -> list[tuple[str, int]]:
        return [(rel, int(v[0])) for rel, v in entries.items() if rel != self.marker]

    def _announcement(self, source: str, kind: str, c: _Candidate, fp: str) -> Announcement:
        content = self._content(c.entries)
        previous = self._announced.get(c.path)
        return Announcement(
            source=source,
            store=kind,
            path=c.path,
            name=c.name,
            step=step_of(c.name),
            model=self._model_for(source, c),
            bytes=sum(size for _, size in content),
            files=len(content),
            fingerprint=fp,
            changed=previous is not None,
        )

    def _already(self, c: _Candidate) -> tuple[bool, str]:
        fp = fingerprint(self._content(c.entries))
        previous = self._announced.get(c.path)
        return previous is not None and previous["fingerprint"] == fp, fp

    # ------------------------------------------------------------------ local folders

    def _scan_local(self, source: str) -> list[Announcement]:
        try:
            found = _local_checkpoints(source)
        except FileNotFoundError:
            log.warning("watched folder %s does not exist (yet)", source)
            return []
        out = []
        for model, name, path in found:
            seen, _ = self._already(_Candidate(name, path, _list_local(path)))
            if seen:
                continue
            try:
                scan = checkpoint_ready(path, marker=self.marker, settle_seconds=self.settle_seconds, sleep=self._sleep)
            except CheckpointNotReadyError as exc:
                log.debug("not yet: %s", exc.reason)
                continue
            except FileNotFoundError:
                continue  # removed while we looked
            c = _Candidate(name, path, {rel.replace(os.sep, "/"): v for rel, v in scan.items()}, model)
            seen, fp = self._already(c)
            if not seen:
                out.append(self._announcement(source, "local", c, fp))
        return out

    # ------------------------------------------------------------------ S3 prefixes

    def _store(self, source: str):
        store = self._s3_stores.get(source)
        if store is None:
            from concord.stores.address import StoreAddress
            from concord.stores.s3 import S3ObjectStore

            address = StoreAddress.parse(source)
            store = self._s3_stores[source] = S3ObjectStore(address.bucket, address.prefix, endpoint_url=self.endpoint_url)
        return store

    def _scan_s3(self, source: str) -> list[Announcement]:
        store = self._store(source)
        base = f"{store.prefix}/" if store.prefix else ""
        client = store._client()

        def listed(prefix: str) -> tuple[list[str], bool]:
            """The sub-prefixes of ``prefix``, and whether an object sits right under it."""
            with store._translate("list", prefix or "/"):
                pages = list(client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix, Delimiter="/"))
            subs = [p["Prefix"] for page in pages for p in page.get("CommonPrefixes", ())]
            return subs, any(not o["Key"].endswith("/") for page in pages for o in page.get("Contents", ()))

        source_model = self._model_for(source)
        checkpoints: list[tuple[str, str]] = []  # (model, sub-prefix)
        for sub in sorted(listed(base)[0]):
            inner, has_object = listed(sub)
            if has_object:
                checkpoints.append((source_model, sub))
            else:
                checkpoints.extend((sub[len(base):].rstrip("/"), step) for step in sorted(inner))
        out = []
        now = self._clock()
        for model, sub in checkpoints:
            name = sub.rstrip("/").rsplit("/", 1)[-1]
            path = f"s3://{store.bucket}/{sub.rstrip('/')}"
            entries: dict[str, tuple] = {}
            with store._translate("list", sub):
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=sub):
                    for obj in page.get("Contents", ()):
                        if not obj["Key"].endswith("/"):
                            rel = obj["Key"][len(sub) :]
                            entries[rel] = (int(obj.get("Size", 0)), obj.get("ETag"), obj["LastModified"].isoformat())
            c = _Candidate(name, path, entries, model)
            seen, fp = self._already(c)
            if seen or not self._content(entries):
                self._s3_seen.pop(path, None)
                continue
            if self.marker:
                if self.marker in entries:
                    out.append(self._announcement(source, "s3", c, fp))
                continue
            if not any(rel.endswith(".safetensors") for rel in entries):
                self._s3_seen.pop(path, None)
                continue
            listing = tuple(sorted(entries.items()))
            before = self._s3_seen.get(path)
            if before is not None and before[0] == listing and now - before[1] >= self.settle_seconds:
                del self._s3_seen[path]
                out.append(self._announcement(source, "s3", c, fp))
            elif before is None or before[0] != listing:
                self._s3_seen[path] = (listing, now)
        return out


def _subfolders(path: str) -> tuple[list[str], bool]:
    """The visible subfolders of ``path``, sorted, and whether it holds a file of its own."""
    folders, has_file = [], False
    for e in os.scandir(path):
        if e.name.startswith("."):
            continue
        if e.is_dir():
            folders.append(e.name)
        else:
            has_file = True
    return sorted(folders), has_file


def _local_checkpoints(source: str) -> list[tuple[str, str, str]]:
    """``(model, name, path)`` of every checkpoint folder under ``source``, in either layout (see
    the module's docstring)."""
    out = []
    source_model = os.path.basename(source.rstrip(os.sep)) or source
    for name in _subfolders(source)[0]:
        path = os.path.join(source, name)
        try:
            inner, has_file = _subfolders(path)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while we looked
        if has_file:
            out.append((source_model, name, path))
        else:
            out.extend((name, step, os.path.join(path, step)) for step in inner)
    return out


def _list_local(path: str) -> dict[str, tuple]:
    """Size of every file under ``path``, walked as a snapshot walks it (links followed, no
    folder twice: :func:`concord.snapshots.walk.walk_files`)."""
    from concord.snapshots.walk import walk_files

    out: dict[str, tuple] = {}
    for rel, full in walk_files(path):
        try:
            size = os.stat(full).st_size
        except FileNotFoundError:
            continue
        out[rel] = (size,)
    return out
