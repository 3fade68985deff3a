"""Run a command, pass its output through line by line, and never stay silent long.

    python3 tools/heartbeat.py [--every 8] [--label WHAT] -- COMMAND [ARG ...]

When the command prints nothing for ``--every`` seconds (default 8), a line ``  ... still WHAT
(1 min 12 s)`` says it is still at work; its exit status is the command's. ``make install`` runs
pip through it. Only the standard library: it runs before the virtual environment exists.
"""

from __future__ import annotations

import argparse
import queue
import subprocess
import sys
import threading
import time


def _took(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def run(command: list[str], *, every: float = 8.0, label: str = "at work", out=sys.stdout) -> int:
    """Run ``command`` (stderr into stdout), print each of its lines, and a heartbeat line after
    ``every`` seconds without one; the command's exit status."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", bufsize=1)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or ():
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    t0 = last = time.monotonic()
    while True:
        try:
            line = lines.get(timeout=max(0.1, every - (time.monotonic() - last)))
        except queue.Empty:
            print(f"  ... still {label} ({_took(time.monotonic() - t0)})", file=out, flush=True)
            last = time.monotonic()
            continue
        if line is None:
            break
        out.write(line)
        out.flush()
        last = time.monotonic()
    return proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="heartbeat", description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=float, default=8.0, help="seconds of silence before a heartbeat line (default 8)")
    p.add_argument("--label", default="at work", help="what the heartbeat line says is still going on")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --")
    return run(command, every=args.every, label=args.label)


if __name__ == "__main__":
    sys.exit(main())
