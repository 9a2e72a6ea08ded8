"""Whether a connection pooler sits between wakeful and PostgreSQL, and in which mode.

Behind a pooler in **transaction** mode (PgBouncer's ``pool_mode = transaction``) one client
connection's transactions run on whichever server connection is free, so nothing may
outlive a transaction: no server-side prepared statements (PgBouncer before 1.21 does not
track them; psycopg prepares a statement after ``prepare_threshold`` executions), no
``LISTEN`` (notifications reach whichever client holds that server connection next), no
session advisory lock. The store therefore disables prepared statements there and listens
through a direct URL (``wake_url``) or not at all (``wait_events`` then polls).

``detect`` tells the modes apart from the server's answers alone (PgBouncer speaks the
server's protocol and adds no parameter of its own): it opens two client connections and
asks each for ``pg_backend_pid()`` a few times. Two live client connections answered by one
server process, or one client connection by two, is a transaction (or statement) pooler. The
port the server says it listens on (``inet_server_port()``) differing from the port connected
to is a proxy in session mode (or a forwarded port). Anything else is a direct connection.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import psycopg

DIRECT = "none"
TRANSACTION = "transaction"
PROXY = "session"
UNKNOWN = "unknown"

_ROUNDS = 3


@dataclass(frozen=True)
class Pooler:
    """What ``detect`` found. ``mode``: ``none`` (a direct connection), ``session`` (a
    proxy or session pooler: the server listens on another port than the one connected to),
    ``transaction`` (server connections are shared between client connections), or
    ``unknown`` (the probe itself failed)."""

    mode: str
    server_port: int | None
    connected_port: int | None

    @property
    def transaction_pooling(self) -> bool:
        return self.mode == TRANSACTION

    def describe(self) -> str:
        if self.mode == TRANSACTION:
            return "a transaction pooler (server connections shared between client connections)"
        if self.mode == PROXY:
            return (
                f"a proxy or session pooler (connected to port {self.connected_port}, the "
                f"server listens on {self.server_port})"
            )
        return "none (a direct connection)"


async def detect(conninfo: str, timeout: float = 10.0) -> Pooler:
    """Probe the server at ``conninfo`` with two short connections (never prepared)."""
    seen: list[set[int]] = [set(), set()]
    server_port: int | None = None
    connected: int | None = None
    conns: list[psycopg.AsyncConnection[tuple[object, ...]]] = []
    try:
        for _ in range(2):
            conns.append(
                await asyncio.wait_for(
                    psycopg.AsyncConnection.connect(
                        conninfo, autocommit=True, prepare_threshold=None
                    ),
                    timeout,
                )
            )
        for _ in range(_ROUNDS):
            for i, conn in enumerate(conns):
                cur = await conn.execute("SELECT pg_backend_pid(), inet_server_port()")
                row = await cur.fetchone()
                assert row is not None
                seen[i].add(int(str(row[0])))
                server_port = None if row[1] is None else int(str(row[1]))
        connected = _port(conns[0])
    finally:
        for conn in conns:
            await conn.close()
    if seen[0] & seen[1] or len(seen[0]) > 1 or len(seen[1]) > 1:
        mode = TRANSACTION
    elif server_port is not None and connected is not None and server_port != connected:
        mode = PROXY
    else:
        mode = DIRECT
    return Pooler(mode, server_port, connected)


def _port(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> int | None:
    try:
        return int(conn.info.port)
    except (TypeError, ValueError):
        return None
