"""Real stores that count what they are asked, and a sampler of the threads alive, for the tests
of fan-out (folder and S3 targets)."""

from __future__ import annotations

import threading
from collections import Counter

from concord.stores import LocalDirStore


class CountingStore(LocalDirStore):
    """A real folder store that counts how often each chunk object is read."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reads: Counter = Counter()
        self._count = threading.Lock()

    def _counted(self, key: str) -> None:
        if key.startswith("chunks/"):
            with self._count:
                self.reads[key] += 1

    def _get_object(self, key: str):
        self._counted(key)
        return super()._get_object(key)

    def _read_object_transient(self, key: str):
        self._counted(key)
        return super()._read_object_transient(key)


class ThreadPeak:
    """The most threads alive at once while the ``with`` block runs, sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, threading.active_count())

    def __enter__(self) -> ThreadPeak:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
