"""The checkpoint watcher: a long-running process that announces completed checkpoints to Prefect.

    python -m concord_pipelines.deployments.watcher --watch runs/llama --watch s3://bucket/runs/mistral \\
        [--state FILE] [--interval S] [--marker COMPLETE] [--settle S] [--model NAME] [--once]

Every ``--interval`` seconds it scans the watched folders and S3 prefixes
(:class:`concord.snapshots.watch.Watcher`: checkpoints as ``<watched>/<model>/<step>/``, or
``<watched>/<step>/`` for one model named after the watched folder) and emits one ``concord.checkpoint.created`` event per checkpoint
that became complete, about the resource ``concord.checkpoint.<model>/<name>``, with the
announcement as payload. The event id is derived from the checkpoint's path and fingerprint, so
a duplicate emission (a state file lost, two watchers) carries the same id and is recognisable
downstream. Each announcement is also printed to stdout as one JSON line; with no Prefect API
configured (``PREFECT_API_URL``), that is all it does (a warning says so).

``--once`` scans once (waiting out the settle time for S3 checkpoints seen for the first time)
and exits. SIGTERM and SIGINT stop the loop after the current scan.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import uuid
from typing import Any

from concord.errors import ConcordError
from concord.snapshots.watch import Announcement, Watcher

log = logging.getLogger("concord.watcher")

#: namespace of the event ids: uuid5(EVENT_NAMESPACE, "<path>\n<fingerprint>")
EVENT_NAMESPACE = uuid.UUID("6f1c4c2e-3b7e-5d0a-9c51-7a2f0e0c9b31")
DEFAULT_STATE = os.path.join(".concord", "watcher-state.json")


def event_id(a: Announcement) -> uuid.UUID:
    """The same checkpoint with the same content always gets the same event id."""
    return uuid.uuid5(EVENT_NAMESPACE, f"{a.path}\n{a.fingerprint}")


def event_of(a: Announcement) -> dict[str, Any]:
    """The keyword arguments of ``emit_event`` for an announcement."""
    from concord_pipelines.tasks import events

    resource = events.checkpoint(a.model, a.name)
    resource.update({"concord.store": a.store, "concord.path": a.path})
    return {
        "event": events.CHECKPOINT_CREATED,
        "resource": resource,
        "related": [events.store(a.source, role="source")],
        "payload": a.to_dict(),
        "id": event_id(a),
    }


def emit(a: Announcement) -> str | None:
    """Send the announcement; the id of the event sent, or None where events are not delivered
    (no Prefect API configured: a temporary server would hear them, and nobody would listen)."""
    from prefect.events import emit_event
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return None
    sent = emit_event(**event_of(a))
    return str(sent.id) if sent is not None else None


def announce(found: list[Announcement]) -> None:
    for a in found:
        sent = emit(a)
        log.info(
            "%s checkpoint %s/%s (step %s, %d files, %d bytes) at %s%s",
            "changed" if a.changed else "new",
            a.model,
            a.name,
            a.step,
            a.files,
            a.bytes,
            a.path,
            f"; event {sent}" if sent else "; no Prefect API to send the event to",
        )
        print(json.dumps(dict(a.to_dict(), event_id=str(event_id(a)))), flush=True)


def run(watcher: Watcher, *, interval: float, once: bool, stop: threading.Event) -> None:
    if once:
        found = watcher.scan()
        if watcher.pending:  # S3 checkpoints seen for the first time: look again once settled
            stop.wait(watcher.settle_seconds)
            found += watcher.scan()
        announce(found)
        return
    while not stop.is_set():
        try:
            announce(watcher.scan())
        except ConcordError as exc:  # a store unreachable for a while: say so and try again
            log.error("scan failed: %s", exc)
        stop.wait(interval)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m concord_pipelines.deployments.watcher", description=__doc__.split("\n\n")[0])
    p.add_argument("--watch", action="append", required=True, metavar="PATH_OR_S3_PREFIX",
                   help="a folder or s3://bucket/prefix whose subfolders are checkpoints (repeatable)")
    p.add_argument("--state", default=DEFAULT_STATE, help=f"what was announced, kept across restarts (default {DEFAULT_STATE})")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between scans (default 30)")
    p.add_argument("--marker", default="COMPLETE",
                   help="completion marker file written last by the trainer; '' to rely on stable sizes (default COMPLETE)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds files must stay unchanged without a marker (default 2)")
    p.add_argument("--model", default=None, help="model name in the announcements (default: the folder each checkpoint sits in: "
                        "<watched>/<model>/<step>/, or the watched folder for <watched>/<step>/)")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)")
    p.add_argument("--once", action="store_true", help="scan once and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.interval <= 0:
        log.error("--interval must be positive, got %s", args.interval)
        return 2
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        log.info("%s: stopping after the current scan", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        watcher = Watcher(
            args.watch,
            state_path=args.state,
            marker=args.marker or None,
            settle_seconds=args.settle,
            model=args.model,
            endpoint_url=args.endpoint_url,
        )
    except (ConcordError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    log.info("watching %s (state %s)", ", ".join(watcher.sources), watcher.state_path)
    if not os.environ.get("PREFECT_API_URL"):
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            log.warning("no Prefect API configured (PREFECT_API_URL): events are not sent, only printed, and nothing is triggered")
    try:
        run(watcher, interval=args.interval, once=args.once, stop=stop)
    except ConcordError as exc:
        log.error("%s", exc)
        return 1
    finally:
        watcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
