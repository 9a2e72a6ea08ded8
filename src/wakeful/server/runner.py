"""Running the API with uvicorn: ``serve`` (blocking, for the command line) and
``run_server`` (a coroutine)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from wakeful.fleet.livechannels import open_live
from wakeful.fleet.registry import Registry
from wakeful.fleet.serving import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    ReadyServer,
    server_config,
)
from wakeful.fleet.wake import Wake
from wakeful.redact import install_redaction
from wakeful.server.app import (
    DEFAULT_BODY_TIMEOUT,
    close_feeds,
    close_streams,
    create_app,
    open_streams,
)
from wakeful.server.auth import load_tokens
from wakeful.store import open_store

TokenSource = Mapping[str, str] | str | os.PathLike[str] | None


class Server(ReadyServer):
    """Ends the app's event streams when it shuts down (otherwise an open SSE connection
    would hold the shutdown until the graceful timeout)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        open_streams(self.config.app)
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        close_streams(self.config.app)
        await super().shutdown(sockets)
        await close_feeds(self.config.app)
        if "wakeful.server.langgraph_api" in sys.modules:  # LangGraph is an optional extra
            await sys.modules["wakeful.server.langgraph_api"].close_langgraph(self.config.app)


def resolve_tokens(tokens: TokenSource) -> dict[str, str]:
    """A mapping as given; a path: a JSON token file; ``None``: ``WAKEFUL_TOKENS``."""
    if isinstance(tokens, Mapping):
        return dict(tokens)
    return load_tokens(tokens)


async def run_server(
    store_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    tokens: TokenSource = None,
    registry: Registry | None = None,
    wake: Wake | None = None,
    log_level: str = "info",
    graceful_seconds: int = 10,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    on_ready: Callable[[str, int], None] | None = None,
    stop: asyncio.Event | None = None,
    live: str = "none",
    live_url: str | None = None,
    allowed_hosts: Iterable[str] = (),
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    store_options: Mapping[str, Any] | None = None,
    langgraph_runs: str = "server",
) -> None:
    """Open the store (with ``store_options``, e.g. a PostgreSQL store's ``wake_url``),
    serve the API until uvicorn stops (SIGINT / SIGTERM, or ``stop`` is
    set), close the store. ``port=0`` picks a free port; ``on_ready(host, port)`` is called
    once listening. Open event streams end at shutdown (clients resume with
    ``Last-Event-ID``). A request body that has not arrived after ``body_timeout`` seconds
    is answered 408. Log lines (uvicorn's access log included) have credentials redacted.
    ``live`` names the channel model deltas arrive on (``none``, ``postgres``, ``nats``;
    ``wakeful.fleet.livechannels.open_live``) at ``live_url``. ``allowed_hosts``: see
    ``create_app``. A connection that has not sent its request headers within
    ``header_timeout`` seconds is closed, and at most ``max_connections`` are open at once
    (fewer when the process's file descriptor limit is lower; ``wakeful.fleet.serving``).
    ``langgraph_runs``: see ``create_app``."""
    table = resolve_tokens(tokens)
    channel = open_live(live, live_url)
    async with open_store(store_url, **dict(store_options or {})) as store:
        app = create_app(
            store,
            registry,
            table,
            wake=wake,
            body_timeout=body_timeout,
            live=channel,
            allowed_hosts=allowed_hosts,
            langgraph_runs=langgraph_runs,
        )
        config = server_config(
            app,
            host=host,
            port=port,
            header_timeout=header_timeout,
            max_connections=max_connections,
            log_level=log_level,
            timeout_graceful_shutdown=graceful_seconds,
        )
        install_redaction()  # again: uvicorn's logging setup may have replaced its loggers'
        server = Server(config)
        serving = asyncio.create_task(server.serve())
        ready = asyncio.create_task(server.ready.wait())
        await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if server.started and on_ready is not None:
            on_ready(host, server.port)
        if stop is not None:
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            server.should_exit = True
        await serving
        if channel is not None:
            await channel.close()


def serve(
    store_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    tokens: TokenSource = None,
    registry: Registry | None = None,
    log_level: str = "info",
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    on_ready: Callable[[str, int], None] | None = None,
    live: str = "none",
    live_url: str | None = None,
    allowed_hosts: Iterable[str] = (),
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    store_options: Mapping[str, Any] | None = None,
    langgraph_runs: str = "server",
) -> None:
    """Blocking: serve the API over the store at ``store_url`` (``wakeful serve``)."""
    asyncio.run(
        run_server(
            store_url,
            host=host,
            port=port,
            tokens=tokens,
            registry=registry,
            log_level=log_level,
            body_timeout=body_timeout,
            on_ready=on_ready,
            live=live,
            live_url=live_url,
            allowed_hosts=allowed_hosts,
            header_timeout=header_timeout,
            max_connections=max_connections,
            store_options=store_options,
            langgraph_runs=langgraph_runs,
        )
    )


__all__ = ["Server", "resolve_tokens", "run_server", "serve"]
