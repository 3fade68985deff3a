"""Real stores that count what they are asked, the requests a real S3 client sends, and a
sampler of the threads alive, for the tests of fan-out (folder and S3 targets) and of what
garbage collection reads."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def s3_requests(store) -> Iterator[Counter]:
    """Count, by operation (``GetObject``, ``ListObjectsV2``, ...), the requests the boto3 client
    of the S3 store ``store`` sends to its bucket while the block runs, from every thread."""
    counts: Counter = Counter()
    lock = threading.Lock()
    client = store._client()

    def count(params, model, **_) -> None:
        if params.get("Bucket") == store.bucket:
            with lock:
                counts[model.name] += 1

    client.meta.events.register("before-parameter-build.s3", count)
    try:
        yield counts
    finally:
        client.meta.events.unregister("before-parameter-build.s3", count)


def unindexed_deltas(store) -> list[str]:
    """The delta chunks of ``store`` (read from their heads) that its delta index does not name
    with their base: none may be, wherever a writer or a collection was stopped."""
    index = store.delta_index()
    assert index is not None, "the store's delta index is not marked whole"
    pairs = {(name, base) for name, base, _ in index.values()}
    heads = {name: store.chunk_base(name) for name, _, _ in store.iter_chunk_stats()}
    return [name for name, base in heads.items() if base is not None and (name, base) not in pairs]


def stale_delta_entries(store) -> list[str]:
    """Entries of ``store``'s delta index whose chunk is there but is not (or no longer) a delta
    of the base the entry names: a chunk written over whole (a repair) must take them with it."""
    index = store.delta_index()
    assert index is not None, "the store's delta index is not marked whole"
    heads = {name: store.chunk_base(name) for name, _, _ in store.iter_chunk_stats()}
    return [key for key, (name, base, _) in index.items() if name in heads and heads[name] != base]
