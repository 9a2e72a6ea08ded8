"""A uvicorn server for wakeful's HTTP services (the API, the remote hand): it says when it
listens and on which port, and a SIGINT / SIGTERM ends it normally (exit status 0, resources
closed) instead of uvicorn re-raising the signal once it has shut down."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn


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
