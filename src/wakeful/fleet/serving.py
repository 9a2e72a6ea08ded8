"""A uvicorn server for wakeful's HTTP services (the API, the remote hand): it says when it
listens and on which port, and a SIGINT / SIGTERM ends it normally (exit status 0, resources
closed) instead of uvicorn re-raising the signal once it has shut down. ``server_config``
bounds what a client can hold: request headers have a deadline, open connections a cap, and
asyncio's accept-error log line a rate (decision 0034)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

_cap_log = logging.getLogger("wakeful.fleet.serving")


class ReadyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()

    @property
    def port(self) -> int:
        return int(self.servers[0].sockets[0].getsockname()[1])


DEFAULT_HEADER_TIMEOUT = 10.0
"""Seconds a connection may take to send a request's headers (from its first byte, or from
its opening) before it is closed: a client that never finishes them would hold a connection
and its file descriptor forever (uvicorn times out idle keep-alive connections only)."""
DEFAULT_MAX_CONNECTIONS = 2048
FD_RESERVE = 128
"""File descriptors kept out of the connection cap: the store, logs, the listening sockets,
the wake and live channels."""
ACCEPT_ERROR = "socket.accept() out of system resource"
CAP_WARNING = "closed a new connection: the open ones are at the cap"
THROTTLE_SECONDS = 10.0


def _soft_fd_limit() -> int | None:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not a POSIX system
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def accept_backlog() -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one burst
    before any of them is seen by the protocol (and can be closed by the cap): uvicorn's
    2048, lowered to an eighth of the soft ``RLIMIT_NOFILE`` (at least 64)."""
    soft = _soft_fd_limit()
    return 2048 if soft is None else max(64, min(2048, soft // 8))


def connection_cap(requested: int = DEFAULT_MAX_CONNECTIONS) -> int:
    """``requested``, lowered so the open connections cannot use up the process's file
    descriptors: the soft ``RLIMIT_NOFILE`` less ``FD_RESERVE`` and less one accept burst
    (``accept_backlog``), but not under 16."""
    if requested < 1:
        raise ValueError("max_connections must be positive")
    soft = _soft_fd_limit()
    if soft is None:
        return requested
    return min(requested, max(16, soft - FD_RESERVE - accept_backlog()))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request headers and a cap on the server's
    open connections: a connection over the cap is closed as soon as it is accepted, one
    that has not sent complete headers ``header_timeout`` seconds after it opened (or after
    the first byte of its next request) is closed. Build one with ``guarded_protocol``."""

    header_timeout = DEFAULT_HEADER_TIMEOUT
    max_connections = DEFAULT_MAX_CONNECTIONS
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            _cap_log.warning(CAP_WARNING + " (%d, max_connections)", self.max_connections)
            transport.abort()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        pipelined, _ = self.conn.trailing_data
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE and pipelined:
            self._arm()  # the next request's bytes came with the last one and are incomplete

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.transport.close()


def guarded_protocol(
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> type[GuardedH11Protocol]:
    """A ``GuardedH11Protocol`` class with these limits (``max_connections`` lowered by
    ``connection_cap``), for ``uvicorn.Config(http=...)``."""
    if not header_timeout > 0:
        raise ValueError("header_timeout must be positive")
    attributes = {
        "header_timeout": header_timeout,
        "max_connections": connection_cap(max_connections),
    }
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attributes)


def server_config(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    **options: Any,
) -> uvicorn.Config:
    """The uvicorn configuration of a wakeful HTTP service: ``GuardedH11Protocol`` with
    these limits, no lifespan, and the accept-error log line throttled
    (``throttle_accept_errors``). ``options`` go to ``uvicorn.Config``."""
    throttle_accept_errors()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(header_timeout, max_connections),
        backlog=accept_backlog(),
        lifespan="off",
        **options,
    )


class Throttle(logging.Filter):
    """Lets through at most one record per ``every`` seconds among those whose message
    starts with ``prefix``; the next one let through says how many were dropped. Other
    records pass."""

    def __init__(
        self,
        prefix: str,
        every: float = THROTTLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.prefix = prefix
        self.every = every
        self.clock = clock
        self.dropped = 0
        self._last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or not record.msg.startswith(self.prefix):
            return True
        now = self.clock()
        if self._last is not None and now - self._last < self.every:
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = (
                f"{record.getMessage()}\n({self.dropped} more like it in the last "
                f"{now - (self._last or now):.0f} s were not logged)"
            )
            record.args = None
        self._last, self.dropped = now, 0
        return True


def throttle_accept_errors() -> None:
    """Install (once) a ``Throttle`` on the lines a flood of connections makes: asyncio's
    ``socket.accept() out of system resource`` (logged with a traceback at every accept
    attempt once the process is out of file descriptors, millions of lines), the accept
    retries it schedules that fail once the server has closed, and the cap's warning."""
    for name, prefix in (
        ("asyncio", ACCEPT_ERROR),
        ("asyncio", "Exception in callback BaseSelectorEventLoop._start_serving"),
        (_cap_log.name, CAP_WARNING),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, Throttle) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(Throttle(prefix))


def accept_throttle() -> Throttle:
    """The installed ``Throttle`` of the accept error (installing it if needed)."""
    throttle_accept_errors()
    return next(
        f
        for f in logging.getLogger("asyncio").filters
        if isinstance(f, Throttle) and f.prefix == ACCEPT_ERROR
    )
