"""Archive storage on a real moto_server: stores in GLACIER, and restores held "in progress".

moto moves a restore through ``None → IN_PROGRESS → RESTORED`` with its state manager (model
``s3::keyrestore``); by default every step happens at once, so a restore is complete as soon as
it is requested. In ``manual`` mode a key takes one step when its tick count reaches ``times``
(and the count starts again). The count goes up with every request that touches the key, by
:data:`TICKS_PER_REQUEST` (moto looks the key up once for its authorization check and once for
the operation): a HEAD, a GET, and also a repeated RestoreObject. Before its first step the status
is ``None``, which moto reports as a finished restore (``ongoing-request="false"``); so to hold a
restore in progress, :func:`hold_restores_in_progress` sets ``times=1``, requests the restore,
reads each key once (→ IN_PROGRESS), then sets ``times`` so high that it never completes (or so
that it completes after a given number of reads).

The state manager is global to the server: tests that use it need a moto_server of their own
(the ``archive_moto_server`` fixture), or they would change restores in every other test.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from concord.stores.base import chunk_key
from concord.stores.s3 import S3ObjectStore

RESTORE_MODEL = "s3::keyrestore"
#: how much one request to a key advances its tick count in moto
TICKS_PER_REQUEST = 2
#: a tick count no test reaches: the restore stays in progress
FOREVER = 10**9


def archive_store(endpoint: str, storage_class: str = "GLACIER") -> S3ObjectStore:
    """An S3ObjectStore writing chunks in ``storage_class``, on a fresh bucket at ``endpoint``."""
    store = S3ObjectStore(
        f"concord-archive-{uuid.uuid4().hex[:12]}",
        f"tier-{uuid.uuid4().hex[:8]}",
        endpoint_url=endpoint,
        create_bucket=True,
        storage_class=storage_class,
    )
    store.list_refs()  # the bucket exists from here on
    return store


def _post(endpoint: str, path: str, body: dict) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/state-manager/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (200, 201), f"moto state manager {path}: HTTP {response.status}"


def set_restore_transition(endpoint: str, times: int) -> None:
    """From now on, a restore takes one step each ``times`` ticks of its key."""
    _post(endpoint, "set-transition", {"model_name": RESTORE_MODEL, "transition": {"progression": "manual", "times": times}})


def unset_restore_transition(endpoint: str) -> None:
    """Back to moto's default: restores complete at once (the next read of a key sees it done)."""
    _post(endpoint, "unset-transition", {"model_name": RESTORE_MODEL})


@contextmanager
def manual_restores(endpoint: str, times: int) -> Iterator[None]:
    """Restores step every ``times`` ticks inside the block; always back to the default after."""
    try:
        set_restore_transition(endpoint, times)
        yield
    finally:
        unset_restore_transition(endpoint)


def read_each(store: S3ObjectStore, ids: list[str]) -> None:
    """HEAD each chunk once, straight through the store's client (one read each, as moto counts
    them), without going through the store's own reading code."""
    client = store._client()
    for cid in ids:
        key = chunk_key(cid)
        client.head_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}" if store.prefix else key)


@contextmanager
def hold_restores_in_progress(
    endpoint: str, store: S3ObjectStore, ids: list[str], *, reads: int | None = None, days: int = 1
) -> Iterator[None]:
    """Request restores of ``ids`` and keep them in progress inside the block.

    The chunks must be in an archive class and never restored before (moto cannot take a key
    back to the start). With ``reads=None`` the restores stay in progress until the block ends;
    with ``reads=N`` each chunk is seen restoring by its next N reads (HEAD, GET or another
    restore request) and restored from the one after. Either way restores complete at once
    again after the block, and a chunk still in progress then completes on its next read.
    """
    if reads is not None and reads < 0:
        raise ValueError(f"reads must be 0 or more, got {reads!r}")
    with manual_restores(endpoint, times=1):
        store.request_restore(ids, days=days)
        read_each(store, ids)  # None → IN_PROGRESS, tick count back to 0
        set_restore_transition(endpoint, FOREVER if reads is None else TICKS_PER_REQUEST * reads + 1)
        yield
