"""An HTTP proxy of the tests' own, on 127.0.0.1 in front of an S3 endpoint (moto_server), that
injects the faults a real network and a real S3 produce: a connection reset in the middle of a
response body, a body cut short, bursts of 503 answers, and slow answers.

    with FaultProxy(moto_url) as proxy:
        proxy.add(Fault("reset", every=3, path=r"/chunks/"))   # every 3rd GET of a chunk breaks off
        ...                                                    # point AWS_ENDPOINT_URL at proxy.url
        proxy.clear()

Each :class:`Fault` counts the requests it matches (method and a regex on the path) and hits
``burst`` of every ``every`` of them (``every=1``: each one, a permanent fault). The proxy reads
each answer whole from upstream, then sends it on, or breaks it as the fault says.
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
_UPSTREAM_TIMEOUT = 30.0
_SERVICE_UNAVAILABLE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Fault:
    """``kind``: ``reset`` (half the body, then a TCP reset), ``cut`` (half the body, then a clean
    close), ``503`` (a ServiceUnavailable answer instead of forwarding) or ``delay`` (``seconds``
    before the answer). It hits ``burst`` consecutive requests of every ``every`` it matches."""

    kind: str
    every: int = 1
    burst: int = 1
    path: str = ""
    method: str = "GET"
    seconds: float = 0.2
    seen: int = 0
    hits: int = 0
    _pattern: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in ("reset", "cut", "503", "delay"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if not 1 <= self.burst <= self.every:
            raise ValueError("burst must be between 1 and every")
        self._pattern = re.compile(self.path)

    def strikes(self, method: str, path: str) -> bool:
        """Count the request if it matches; True if this one is hit (call under the proxy's lock)."""
        if method != self.method or not self._pattern.search(path):
            return False
        self.seen += 1
        hit = (self.seen - 1) % self.every >= self.every - self.burst
        self.hits += hit
        return hit


class FaultProxy:
    """A threaded HTTP/1.1 proxy on 127.0.0.1 forwarding to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port or 80)
        self.faults: list[Fault] = []
        self.requests = 0
        #: ``(method, path with query)`` of every request forwarded, in arrival order
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FaultProxy:  # noqa: PYI034 (never subclassed)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def add(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def _pick(self, method: str, path: str) -> Fault | None:
        with self._lock:
            self.requests += 1
            self.log.append((method, path))
            hit = None
            for f in self.faults:  # every fault counts the request, the first one hit acts
                if f.strikes(method, path) and hit is None:
                    hit = f
            return hit

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes | None:
                """The whole request body, or None when the client went away before sending it
                all: a real server never stores half a body (S3 aborts such an upload), so
                neither does this proxy forward one."""
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    parts = []
                    while True:
                        line = self.rfile.readline()
                        if not line:
                            return None
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        part = self.rfile.read(size)
                        if len(part) < size:
                            return None
                        parts.append(part)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                return body if len(body) == length else None

            def _forward(self) -> None:
                body = self._body()
                if body is None:
                    self.close_connection = True
                    return
                fault = proxy._pick(self.command, self.path)
                if fault is not None and fault.kind == "503":
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(_SERVICE_UNAVAILABLE)))
                    self.end_headers()
                    self.wfile.write(_SERVICE_UNAVAILABLE)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=_UPSTREAM_TIMEOUT)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                    status, reason, answer_headers = answer.status, answer.reason, answer.getheaders()
                finally:
                    conn.close()
                if fault is not None and fault.kind == "delay":
                    time.sleep(fault.seconds)
                self.send_response(status, reason)
                length = None
                for k, v in answer_headers:
                    if k.lower() in _HOP_BY_HOP or k.lower() == "content-length":
                        if k.lower() == "content-length":
                            length = v
                        continue
                    self.send_header(k, v)
                # a HEAD answer names the object's length and has no body
                self.send_header("Content-Length", length if self.command == "HEAD" and length else str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if fault is not None and fault.kind in ("reset", "cut") and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    if fault.kind == "reset":  # SO_LINGER 0: close sends RST, not FIN
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def finish(self) -> None:
                try:
                    super().finish()
                except OSError:
                    pass  # the connection was broken on purpose

        return Handler
