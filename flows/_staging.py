"""A checkpoint as a local folder for the part of a flow that reads it.

snapshot-and-replicate and tier-checkpoints take a finished checkpoint from a folder on the worker
or from an ``s3://bucket/prefix``. An S3 checkpoint is downloaded by the retried
``stage-checkpoint`` task into a temporary folder the flow holds around everything that reads it,
and removed on leaving the block, whatever happened (a failed download included).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

from concord.snapshots.staging import StagedCheckpoint, staging_folder
from concord_pipelines.tasks import stage_checkpoint_task


@contextmanager
def staged(source: str) -> Iterator[dict]:
    """``{source, path, staged, files, bytes}`` of the checkpoint ``source``, to read from ``path``:
    a local folder as it is (``staged`` False), an S3 prefix downloaded into a temporary folder."""
    with staging_folder(source) as into:
        if into is None:
            yield asdict(StagedCheckpoint(source=source, path=source, staged=False))
        else:
            yield stage_checkpoint_task(source, into)
