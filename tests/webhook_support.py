"""A webhook receiver on loopback for the webhook tests: a real HTTP server in a thread that
records every request (headers, body) and answers the statuses it is given, in order (then
200). ``hold_first``: the first request's answer waits until ``release()`` (or forever: the
test SIGKILLs the sender meanwhile)."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    statuses: list[int] = field(default_factory=list)
    hold_first: bool = False
    requests: list[Received] = field(default_factory=list)
    url: str = ""
    _release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def release(self) -> None:
        self._release.set()

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            self.requests.append(Received(headers, body, time.time()))
            first = len(self.requests) == 1
            status = self.statuses.pop(0) if self.statuses else 200
        if first and self.hold_first:
            self._release.wait(60)
        return status


@contextmanager
def receiver(
    statuses: list[int] | None = None,
    *,
    hold_first: bool = False,
    tls: tuple[Path, Path] | None = None,
) -> Iterator[Receiver]:
    """A running receiver at ``Receiver.url`` (``http://127.0.0.1:<port>/hook?token=x``);
    with ``tls`` (certificate and key files), an https one at ``https://localhost:<port>``."""
    got = Receiver(list(statuses or []), hold_first)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            status = got.handle(headers, body)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    got.url = f"http://127.0.0.1:{server.server_address[1]}/hook?token=x"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        got.url = f"https://localhost:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        got.release()
        server.shutdown()
        server.server_close()


async def until(check: Callable[[], object], what: str, deadline: float = 20.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate for ``localhost`` it signed (``openssl``): the CA
    file, the certificate and its key."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=wakeful test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=localhost")  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=DNS:localhost\n")
    sign = ["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-extfile", "san.cnf"]
    openssl("x509", "-req", "-in", "server.csr", *sign, "-out", "server.pem", "-days", "2")
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"
