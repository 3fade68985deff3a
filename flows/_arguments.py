"""Checks of the parameters of the flows a new-checkpoint event starts, made before any store is
touched. When a run is started by an event its parameters are templated from the watcher's
payload, so a malformed payload must fail the run at once, with every problem named together.

Each ``*_problems`` function returns the problems it found as sentences (empty: none); a flow
collects them and raises its :class:`BadArguments` subclass once. Nothing here reads a store.
"""

from __future__ import annotations

import os

from concord.snapshots.staging import is_s3, s3_checkpoint_problem
from concord.stores.address import FOLDER, StoreAddress

#: the completion marker the checkpoint watcher waits for; on its own it is no checkpoint
MARKER = "COMPLETE"


class BadArguments(ValueError):
    """A flow was given parameters it cannot run with (typically a malformed
    ``concord.checkpoint.created`` payload templated into them); nothing was touched."""

    flow = "the flow"
    #: the payload fields the flow's trigger templates into its parameters
    payload_fields = "path"
    #: what to run it with by hand
    fix = "valid parameters"

    def __init__(self, problems: list[str], *, event: bool = False):
        self.problems = list(problems)
        self.event = event
        if event:
            hint = (
                f"An event started this run: the payload the checkpoint watcher sent ({self.payload_fields}) "
                f"does not fit; fix what the watcher watches, or run it again by hand with {self.fix}."
            )
        else:
            hint = (
                f"If an event started this run, check the payload the checkpoint watcher sent "
                f"({self.payload_fields}); otherwise run it again with {self.fix}."
            )
        super().__init__(f"{self.flow} refused its parameters before touching any store: " + "; ".join(self.problems) + ". " + hint)


def unrendered(value: object) -> bool:
    """True for a trigger template the event did not fill in (``{{ event.payload.path }}``)."""
    return isinstance(value, str) and ("{{" in value or "}}" in value or "{%" in value)


def started_by_event(*values: object) -> bool:
    """True when an automation (an event trigger) created this flow run, or a value is still an
    unrendered template (which only a trigger leaves)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    key = getattr(getattr(ctx, "flow_run", None), "idempotency_key", None) or ""
    return key.startswith("automation ") or any(unrendered(v) for v in values)


def _has_files(folder: str) -> bool:
    from concord.snapshots.walk import walk_files

    return any(rel.rsplit("/", 1)[-1] != MARKER for rel, _ in walk_files(folder))


def checkpoint_problems(value: object, what: str, *, relative: bool, need_files: bool) -> list[str]:
    """The problems of a checkpoint to take in: an ``s3://bucket/prefix`` (staged on the worker)
    or a folder on this worker. ``relative`` allows a relative path that exists here (relative
    to the working folder); ``need_files`` refuses a folder holding nothing but a marker."""
    if value in (None, ""):
        return [f"{what} is empty: give a checkpoint folder or an s3://bucket/prefix"]
    if not isinstance(value, str):
        return [f"{what} must be a folder path or an s3:// URI, got {type(value).__name__} {value!r}"]
    if unrendered(value):
        return [f"{what} {value!r} is a template the event did not fill in (no such payload field)"]
    if is_s3(value):
        problem = s3_checkpoint_problem(value)
        return [f"{what} {value!r} {problem}"] if problem else []
    if "://" in value:
        return [f"{what} {value!r} must be a local folder or an s3:// URI"]
    if not os.path.isabs(value) and not relative:
        return [f"{what} must be an absolute local folder path or an s3:// URI, got {value!r}"]
    if not os.path.exists(value):
        kind = "a relative path that does not exist" if not os.path.isabs(value) else "not a folder"
        return [f"{what} {value!r} is {kind} on this worker"]
    if not os.path.isdir(value):
        return [f"{what} {value!r} is a file, not a checkpoint folder"]
    if need_files and not _has_files(value):
        return [f"{what} {value!r} holds no checkpoint files"]
    return []


def ref_problems(value: object, what: str = "ref") -> list[str]:
    from concord.errors import InvalidNameError
    from concord.stores import canonical_ref

    if value in (None, ""):
        return [f"{what} is empty: give the ref to move, e.g. models/llama"]
    if unrendered(value):
        return [f"{what} {value!r} is a template the event did not fill in"]
    try:
        canonical_ref(value)
    except InvalidNameError:
        return [
            f"{what} {value!r} is not a ref name: 'namespace/name' (e.g. models/llama), each part of "
            "letters, digits, '.', '_' or '-', not starting with '.'"
        ]
    return []


def _store(spec: object, what: str) -> tuple[StoreAddress | None, list[str]]:
    """The store address ``spec`` names, or None and its problems (no store is opened)."""
    if unrendered(spec):
        return None, [f"{what} {spec!r} is a template the event did not fill in"]
    try:
        address = StoreAddress.parse(spec)
    except ValueError as exc:
        return None, [f"{what} {spec!r} is not a store address ({str(exc).split('. ')[0]})"]
    if address.kind == FOLDER and os.path.isfile(address.path):
        return None, [f"{what} {spec!r} is a file, not a store folder"]
    return address, []


def store_problems(spec: object, what: str) -> list[str]:
    """The problems of a store address: a folder, file:///path, s3://bucket/prefix or block:NAME."""
    return _store(spec, what)[1]


def targets_problems(targets: object, store: object) -> list[str]:
    """The problems of the replication targets: each a store, none twice, none the primary."""
    if not isinstance(targets, (list, tuple)) or not targets:
        return ["targets is empty: give the store of every other cluster"]
    problems: list[str] = []
    primary = _store(store, "store")[0] if isinstance(store, str) else None
    seen: dict[str, str] = {}
    for i, t in enumerate(targets):
        address, found = _store(t, f"targets[{i}]")
        problems += found
        if found:
            continue
        ident = address.identity
        if primary is not None and ident == primary.identity:
            problems.append(f"targets[{i}] {t!r} is the primary store itself; list only the other clusters' stores")
        elif ident in seen:
            problems.append(f"targets[{i}] {t!r} is the same store as {seen[ident]!r}; list each cluster once")
        seen.setdefault(ident, t)
    return problems
