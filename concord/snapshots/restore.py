"""Restore a snapshot into a folder whose files are byte-identical to the originals.

Everything is written into a temporary sibling folder, every chunk verified as it is read, and
the folder is renamed into place only when complete: the destination either does not exist or
holds the whole snapshot. A ``check_root`` (a trust policy's) runs before anything is written
and may name SHA-256 digests the files must have, checked before the rename. Manifest paths that would leave the folder, or that hold a control
character (which ``concord snapshot`` never records), are refused before any byte is written.
"""

from __future__ import annotations

import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Mapping

from concord.errors import RestoreTargetError, UnsafePathError
from concord.files import OpenFiles
from concord.snapshots.manifest import Manifest, safe_relpath
from concord.progress import Progress, ensure
from concord.stores.base import Store
from concord.text import control_char


@dataclass(frozen=True)
class RestoreResult:
    root: str
    files: int
    bytes: int
    path: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _check_sha256(folder: str, expected: Mapping[str, str], root: str, where: str) -> None:
    """Refuse a restore whose files do not have the SHA-256 a signature lists for them."""
    import hashlib

    from concord.errors import IntegrityError

    for rel, digest in sorted(expected.items()):
        h = hashlib.sha256()
        with open(os.path.join(folder, *safe_relpath(rel).split("/")), "rb") as fh:
            while block := fh.read(8 * 1024 * 1024):
                h.update(block)
        if h.hexdigest() != digest:
            raise IntegrityError(f"{rel} of {root} from {where} (checked against its signature; nothing restored)", f"SHA-256 {digest}", h.hexdigest())


def _target_paths(manifest: Manifest, base: str) -> list[str]:
    out = []
    real_base = os.path.realpath(base)
    for f in manifest.files:
        rel = safe_relpath(f.path)
        if control_char(rel) is not None:
            raise UnsafePathError(f.path, "it holds a control character, and restore never creates such a name "
                                  "(it could forge terminal output); rename the file at its source and snapshot it again")
        full = os.path.realpath(os.path.join(real_base, *rel.split("/")))
        if os.path.commonpath([full, real_base]) != real_base or full == real_base:
            raise UnsafePathError(f.path, "it resolves outside the restore folder")
        out.append(full)
    return out


#: a check of a root before it is restored (a trust policy's ``restore_check``): raises to refuse
#: it; may return the SHA-256 (hex) some files must have, checked before the final rename
RootCheck = Callable[[Store, str], "Mapping[str, str] | None"]


def restore(
    store: Store,
    manifest: Manifest,
    out_dir: str | os.PathLike,
    *,
    progress: Progress | None = None,
    check_root: RootCheck | None = None,
) -> RestoreResult:
    out = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise RestoreTargetError(out)
    expected = check_root(store, manifest.root) if check_root is not None else None
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.concord-tmp-{uuid.uuid4().hex[:12]}")
    os.mkdir(tmp)
    prog = ensure(progress)
    files = OpenFiles(os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        paths = _target_paths(manifest, tmp)
        prog.start(manifest.total_bytes, "restore")
        jobs = []
        for f, path in zip(manifest.files, paths):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.truncate(f.size)
            for p in f.parts:
                for cid, offset, length in p.chunk_spans(manifest.chunk_size):
                    jobs.append((path, cid, offset, length))

        def write(job) -> None:
            path, cid, offset, length = job
            data = store.read_chunk(cid, verify=True)  # transient: written at once
            if len(data) != length:
                from concord.errors import IntegrityError

                raise IntegrityError(f"chunk {cid} in {store.uri}", f"{length} bytes", f"{len(data)} bytes")
            files.write(path, data, offset)
            prog.advance(length)

        with ThreadPoolExecutor(store.parallelism, thread_name_prefix="concord-restore") as pool:
            for _ in pool.map(write, jobs):
                pass
        files.close()
        if expected:
            _check_sha256(tmp, expected, manifest.root, store.uri)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.rename(tmp, out)
    finally:
        files.close()
        prog.close()
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return RestoreResult(manifest.root, manifest.n_files, manifest.total_bytes, out)
