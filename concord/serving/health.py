"""The health gate a checkout runs after its flip: a shell command, or an HTTP GET that must answer 2xx.

The command runs with ``CONCORD_CHECKOUT_PATH`` (the link) and ``CONCORD_CHECKOUT_ROOT`` (the root
it now names) in its environment, so a check can ask the serving process which version it loaded.
A gate may be tried several times (``attempts``, ``interval`` seconds apart): a serving process
that reloads on a signal needs a moment before it answers for the new version.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

#: the last characters of a failing command's output kept in the error
_TAIL = 300


@dataclass(frozen=True)
class HealthCheck:
    cmd: str | None = None
    url: str | None = None
    timeout: float = 60.0
    attempts: int = 1
    interval: float = 2.0

    def __post_init__(self) -> None:
        if (self.cmd is None) == (self.url is None):
            raise ValueError("a health check is a command or a URL: give exactly one of them")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"health URL {self.url!r} must start with http:// or https://")
        if self.attempts < 1 or self.timeout <= 0 or self.interval < 0:
            raise ValueError("a health check needs attempts >= 1, a positive timeout and an interval >= 0")

    def describe(self) -> str:
        return self.cmd if self.cmd is not None else f"GET {self.url}"

    def run(self, path: str, root: str) -> str | None:
        """None when the version is healthy, else what failed (after every attempt)."""
        problem = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.interval)
            problem = self._once(path, root)
            if problem is None:
                return None
        return problem

    def _once(self, path: str, root: str) -> str | None:
        if self.cmd is not None:
            env = dict(os.environ, CONCORD_CHECKOUT_PATH=path, CONCORD_CHECKOUT_ROOT=root)
            try:
                done = subprocess.run(
                    self.cmd, shell=True, env=env, timeout=self.timeout, capture_output=True, text=True, errors="replace"
                )
            except subprocess.TimeoutExpired:
                return f"no answer within {self.timeout:g} s"
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip()[-_TAIL:]
                return f"exit status {done.returncode}" + (f": {tail}" if tail else "")
            return None
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as resp:  # noqa: S310 (http(s) only, checked above)
                code = resp.status
        except urllib.error.HTTPError as exc:
            code = exc.code
        except (urllib.error.URLError, OSError) as exc:
            return f"{self.url} did not answer: {getattr(exc, 'reason', exc)}"
        return None if 200 <= code < 300 else f"{self.url} answered HTTP {code}"
