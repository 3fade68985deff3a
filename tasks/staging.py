"""Staging: the download of a checkpoint announced under an S3 prefix, before it is taken in.

A thin wrapper over :func:`concord.snapshots.staging.stage`, retried when S3 does not answer (a
checkpoint is many GB: a dropped connection should not fail the run). The folder it stages into
belongs to the flow, which holds it with :func:`concord.snapshots.staging.staging_folder` around
everything that reads it, so it is removed whatever happens; each attempt starts from it empty.
"""

from __future__ import annotations

from dataclasses import asdict

from prefect import task

from concord_pipelines.tasks.common import RETRIED, named_by
from concord_pipelines.tasks.progress import PrefectProgress, run_logger


@task(name="stage-checkpoint", task_run_name=named_by("stage", "source"), **RETRIED)
def stage_checkpoint_task(source: str, into: str) -> dict:
    """Download every object under the S3 prefix ``source`` into the folder ``into``.

    Returns ``StagedCheckpoint`` as a dict: ``{source, path, staged, files, bytes}``. An object
    replaced while it is staged, a key that would leave ``into`` or an empty prefix fail at once;
    an endpoint that does not answer is retried.
    """
    from concord.snapshots.staging import empty_folder, stage

    empty_folder(into)  # a retry starts over: nothing half-downloaded stays
    staged = stage(source, into, progress=PrefectProgress(key="checkpoint-staging"))
    run_logger().info("staged %s: %d object(s), %d bytes into %s", source, staged.files, staged.bytes, staged.path)
    return asdict(staged)
