"""Per-thread reusable buffers for the paths every chunk takes (read, decrypt, decode, encode, seal).

A fresh buffer of megabytes costs a page fault per page each time it is made: the allocator hands
memory that size back to the kernel when it is freed, and on a virtual machine a first touch of a
page costs several times a copy of it. A snapshot or restore of gigabytes spent most of its time on
that. Each thread keeps one buffer per purpose (a *slot*) and reuses it for every chunk, so the cost
is paid once per thread.

What :func:`buffer` returns is *transient*: it is overwritten by the next call with the same slot on
the same thread. Code that returns such a view says so, and its callers consume it (write, hash,
send) before asking for the next one; anything kept must be copied (``bytes(view)``).
"""

from __future__ import annotations

import threading

#: buffers up to this size are kept per thread; a larger request gets a fresh buffer every time
#: (bounds what a thread pins: a few slots of the default 4 MiB chunk, never of a 64 MiB one)
KEEP_BYTES = 16 * 1024 * 1024

_local = threading.local()


def buffer(slot: str, n: int) -> memoryview:
    """A writable view of ``n`` bytes, this thread's for ``slot`` until its next call (see module)."""
    if n > KEEP_BYTES:
        return memoryview(bytearray(n))
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    buf = pool.get(slot)
    if buf is None or len(buf) < n:
        buf = pool[slot] = bytearray(max(n, 64 * 1024))
    return memoryview(buf)[:n]


def array(slot: str, dtype, n: int):
    """A ``numpy`` array of ``n`` elements of ``dtype`` over this thread's ``slot`` (transient)."""
    import numpy as np

    kind = np.dtype(dtype)
    return np.frombuffer(buffer(slot, n * kind.itemsize), dtype=kind, count=n)


__all__ = ["KEEP_BYTES", "array", "buffer"]
