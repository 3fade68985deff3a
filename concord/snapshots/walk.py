"""The one walk of a checkpoint folder: symlinks followed, no directory walked twice.

Snapshots, the readiness check of ``concord tier add`` and the checkpoint watcher all list a
folder's files through :func:`walk_files`, so they agree on what a checkpoint holds.

Symlinks are followed, files and folders alike: a Hugging Face cache is made of links (each file
of ``snapshots/<rev>/`` points into ``blobs/``, and folders may be links too), and a checkpoint
folder is often a link to where the trainer wrote it.

**No real directory is walked twice.** Each directory walked is remembered by its
``(st_dev, st_ino)``. A symlink to a directory already walked, or to one of its own ancestors
(a loop, which ``os.walk(followlinks=True)`` would follow forever, listing the same files again
at every turn while its memory grows), is **skipped**, not refused: everything under it is
already in the walk under its first path, so skipping loses no byte, whereas refusing would make
a harmless ``latest -> step-100`` link, or a stray link to ``..``, stop every snapshot of the
folder. Real folders are walked before any symlinked one, so a folder's files keep their real
path whatever the order of the names: ``a -> z`` never makes ``z/w.bin`` appear as ``a/w.bin``.
Skipped links are logged (logger ``concord.walk``) and can be collected with ``skipped``.

Every real directory is listed once at most, so the walk ends on any tree, loops included.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import deque
from collections.abc import Iterator

log = logging.getLogger("concord.walk")


def walk_files(root: str | os.PathLike, *, skipped: list[str] | None = None) -> Iterator[tuple[str, str]]:
    """``(relative posix path, path)`` of every regular file under the folder ``root``
    (symlinks followed; see the module's docstring), folders in name order.

    Broken links, sockets and other non-regular entries are left out. A folder that vanishes
    or cannot be listed while the walk runs is left out too (the callers look again later, or
    fail on what they then cannot open). ``skipped`` collects the relative paths of the folder
    links that were not followed because their folder is walked already.
    """
    for rel, path, _ in walk_sized(root, skipped=skipped):
        yield rel, path


def walk_sized(root: str | os.PathLike, *, skipped: list[str] | None = None) -> Iterator[tuple[str, str, int]]:
    """:func:`walk_files` with each file's size as the walk found it (no ``stat`` of its own)."""
    base = os.fspath(root)
    try:
        st = os.stat(base)
    except OSError:
        return
    seen = {(st.st_dev, st.st_ino)}
    # real folders first (depth first, in name order), then each link to a folder, in the order
    # found; a link's subfolders go to the front of their own queue again
    real: list[str] = [""]
    links: deque[str] = deque()
    while real or links:
        if real:
            rel = real.pop()
        else:
            rel = links.popleft()
            try:
                st = os.stat(os.path.join(base, rel))
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                if skipped is not None:
                    skipped.append(rel)
                log.info("not following %s: it leads to a folder already walked", rel)
                continue
            seen.add(key)
        folder = os.path.join(base, rel) if rel else base
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subfolders = []
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_link = entry.is_symlink()
                st = entry.stat(follow_symlinks=True)
            except OSError:
                continue  # a broken link, or removed while we looked
            if stat.S_ISDIR(st.st_mode):
                if is_link:
                    links.append(child)
                elif (st.st_dev, st.st_ino) not in seen:  # a bind mount can loop too
                    seen.add((st.st_dev, st.st_ino))
                    subfolders.append(child)
            elif stat.S_ISREG(st.st_mode):
                yield child, entry.path, st.st_size
        real.extend(reversed(subfolders))
