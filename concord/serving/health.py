"""The health gate a checkout runs after its flip: a shell command, or an HTTP GET that must answer 2xx.

The command runs with ``CONCORD_CHECKOUT_PATH`` (the link) and ``CONCORD_CHECKOUT_ROOT`` (the root
it now names) in its environment, so a check can ask the serving process which version it loaded.
A gate may be tried several times (``attempts``, ``interval`` seconds apart): a serving process
that reloads on a signal needs a moment before it answers for the new version.

Each attempt is bounded by ``timeout`` as a whole. A URL has that long for its whole answer (its
status line and headers; a server that drips bytes runs out of it like one that says nothing). A
command runs in a session of its own with its output in files, not pipes, so it is judged by its
own exit, whatever it leaves running in the background; when it runs out of time, or the checkout
is interrupted, its whole process group is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO
from urllib.parse import urlsplit

#: the last characters of a failing command's output kept in the error
_TAIL = 300


@dataclass(frozen=True)
class HealthCheck:
    """The gate a checkout runs after its flip: a shell command (``cmd``) or a GET of ``url``, each
    attempt within ``timeout`` seconds; a failed gate flips back."""

    cmd: str | None = None
    url: str | None = None
    timeout: float = 60.0
    attempts: int = 1
    interval: float = 2.0

    def __post_init__(self) -> None:
        if (self.cmd is None) == (self.url is None):
            raise ValueError("a health check is a command or a URL: give exactly one of them")
        if self.url is not None and not (self.url.startswith(("http://", "https://")) and urlsplit(self.url).hostname):
            raise ValueError(f"health URL {self.url!r} must start with http:// or https:// and name a host")
        if self.attempts < 1 or self.timeout <= 0 or self.interval < 0:
            raise ValueError("a health check needs attempts >= 1, a positive timeout and an interval >= 0")

    def describe(self) -> str:
        return self.cmd if self.cmd is not None else f"GET {self.url}"

    def run(self, path: str, root: str, *, started: Callable[[int], None] | None = None) -> str | None:
        """None when the version is healthy, else what failed (after every attempt). ``started``
        is told the process group of each command run (so a killed checkout's re-run can end it)."""
        problem = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.interval)
            problem = self._command(self.cmd, path, root, started) if self.cmd is not None else self._get(self.url or "")
            if problem is None:
                return None
        return problem

    def _command(self, cmd: str, path: str, root: str, started: Callable[[int], None] | None) -> str | None:
        env = dict(os.environ, CONCORD_CHECKOUT_PATH=path, CONCORD_CHECKOUT_ROOT=root)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                cmd, shell=True, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )
            try:
                if started is not None:
                    started(proc.pid)
                code = proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                return f"no answer within {self.timeout:g} s (the command and what it started were killed)"
            finally:
                if proc.returncode is None:  # out of time, or the checkout interrupted
                    kill_group(proc.pid)
                    proc.wait()
            if code == 0:
                return None
            tail = _tail(err) or _tail(out)
        return f"exit status {code}" + (f": {tail}" if tail else "")

    def _get(self, url: str) -> str | None:
        """GET the URL within ``timeout`` for the whole answer: a timer shuts the socket when it
        runs out, so no read outlives it however slowly the bytes come."""
        import http.client
        import socket

        parts = urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname or "", parts.port, timeout=self.timeout)  # a host: __post_init__ checked
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(self.timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                         headers={"Connection": "close"})
            if expired.is_set():
                raise TimeoutError
            code = conn.getresponse().status
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set() or isinstance(exc, TimeoutError):
                return f"{self.url} gave no whole answer within {self.timeout:g} s"
            return f"{self.url} did not answer: {exc or type(exc).__name__}"
        finally:
            timer.cancel()
            conn.close()
        if expired.is_set():
            return f"{self.url} gave no whole answer within {self.timeout:g} s"
        return None if 200 <= code < 300 else f"{self.url} answered HTTP {code}"


def _tail(f: IO[bytes]) -> str:
    """The last characters of what a command wrote to ``f`` (only the end of the file is read)."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - 4 * _TAIL))
    return f.read().decode("utf-8", "replace").strip()[-_TAIL:]


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group ``pgid`` (gone already: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
