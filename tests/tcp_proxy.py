"""A loopback TCP proxy a test controls, to make a shared server look frozen or a network
go silent without touching the server.

- ``freeze()``: nothing is forwarded any more, in either direction, on any connection (new
  ones are accepted and then hang), as with a SIGSTOPped server; ``thaw()`` forwards what
  was held back and carries on.
- ``blackhole()``: the connections open now never forward another byte and are never
  closed (a peer that vanished without a reset); new connections work normally.
"""

from __future__ import annotations

import asyncio
import contextlib


class _Pair:
    __slots__ = ("dead", "writers")

    def __init__(self) -> None:
        self.dead = False
        self.writers: list[asyncio.StreamWriter] = []


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_host:upstream_port`` in this event loop."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.accepted = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._pairs: list[_Pair] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def blackhole(self) -> None:
        for pair in self._pairs:
            pair.dead = True

    def upstream_ports(self) -> list[int]:
        """The local ports of the open connections to the upstream server (its view of
        them, e.g. ``pg_stat_activity.client_port``)."""
        ports = []
        for pair in self._pairs:
            upstream = pair.writers[1]
            if not upstream.is_closing():
                ports.append(int(upstream.get_extra_info("sockname")[1]))
        return ports

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        pair = _Pair()
        pair.writers = [writer, up_writer]
        self._pairs.append(pair)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, pair: _Pair
    ) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                if pair.dead:
                    continue  # swallowed: the other side hears nothing, not even a close
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        if not pair.dead:
            for writer in pair.writers:
                writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._flowing.set()
        for pair in self._pairs:
            for writer in pair.writers:
                writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            await self._server.wait_closed()


__all__ = ["TcpProxy"]
