"""A worker process of a copy between folder stores (:func:`concord.snapshots.sync.fan_out`).

Run by its parent as ``python -m concord.snapshots.copyworker``, never by hand. It reads frames
from standard input and answers each on standard output; a frame is 8 bytes of length
(big-endian) and a pickle that the parent process made (nothing a user or a checkpoint provides
is ever unpickled here):

1. ``(source, targets, overwrite)``: the stores, as their settings (see ``Store.__getstate__``).
2. Then any number of ``(jobs, dtypes)``: chunk ids, each with the indexes of the targets that
   lack it; answered with ``(tallies, failed, done)``: per target (chunks, bytes as stored, raw
   bytes) written, the targets that failed (their share is copied again by the parent, which
   then sees and reports the error), and the bytes done. Every target that did not fail is
   flushed before the answer, so what the parent is told was written is on disk.
3. ``None``, or the end of the input: it exits.
"""

from __future__ import annotations

import sys


def main() -> int:
    from concord.snapshots.sync import copy_jobs, read_frame, write_frame

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    first = read_frame(inp)
    if first is None:
        return 0
    source, targets, overwrite = first  # type: ignore[misc]
    while (frame := read_frame(inp)) is not None:
        jobs, dtypes = frame  # type: ignore[misc]
        write_frame(out, copy_jobs(source, targets, jobs, overwrite, dtypes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
