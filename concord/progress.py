"""Progress reporting that callers inject: a terminal bar, a Prefect artifact, or nothing.

Core functions take ``progress: Progress | None``. They call ``start`` once per phase with the
total number of bytes, ``advance`` from any thread as bytes are done, and ``close`` at the end.
Set ``CONCORD_NO_PROGRESS=1`` to silence terminal bars.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Protocol


class Progress(Protocol):
    def start(self, total: int, desc: str) -> None: ...

    def advance(self, n: int) -> None: ...

    def close(self) -> None: ...


class NullProgress:
    def start(self, total: int, desc: str) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class TqdmProgress:
    """A byte-counting bar on stderr (one per phase); silent when stderr is not a terminal."""

    def __init__(self, *, disable: bool | None = None) -> None:
        if disable is None:
            disable = bool(os.environ.get("CONCORD_NO_PROGRESS")) or not sys.stderr.isatty()
        self.disable = disable
        self._bar = None
        self._lock = threading.Lock()

    def start(self, total: int, desc: str) -> None:
        self.close()
        if self.disable:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=False)

    def advance(self, n: int) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def ensure(progress: Progress | None) -> Progress:
    return progress if progress is not None else NullProgress()
