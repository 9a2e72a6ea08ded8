"""Statements with a deadline on a dedicated connection (a LISTEN connection, a wake's
notifier) whose server may be frozen or whose network may have gone silent.

A psycopg query cancelled by a timeout asks the server to cancel it and waits for the
answer: against a server that does not answer that costs up to ten more seconds. Here the
connection is closed under the statement instead: psycopg notices at its next poll (every
0.1 s) and fails the statement, and the caller reconnects."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import sql

PROBE_TIMEOUT = 2.0
"""Seconds a health probe (``SELECT 1``) may take before its connection counts as dead."""

CLOSE_GRACE = 1.0
"""Seconds to wait for the statement to fail once its connection is closed under it."""


async def execute_within(
    conn: psycopg.AsyncConnection[Any],
    query: str | sql.Composed,
    params: tuple[Any, ...] | None,
    timeout: float,
) -> None:
    """Run ``query`` on ``conn``, answered within ``timeout`` seconds, or raise
    ``psycopg.OperationalError`` with ``conn`` closed (also when the caller is cancelled
    while waiting: a connection with a statement in flight is not reusable)."""
    statement = asyncio.ensure_future(conn.execute(query, params))
    try:
        done, _ = await asyncio.wait({statement}, timeout=timeout)
    finally:
        if not statement.done():
            await conn.close()
            await asyncio.wait({statement}, timeout=CLOSE_GRACE)
            if statement.done() and not statement.cancelled():
                statement.exception()  # retrieved: the closed connection failed it
    if statement not in done:
        raise psycopg.OperationalError(
            f"the server did not answer within {timeout:.1f} s; the connection was closed"
        )
    statement.result()


async def probe(conn: psycopg.AsyncConnection[Any], timeout: float = PROBE_TIMEOUT) -> None:
    """``SELECT 1`` within ``timeout`` seconds (see ``execute_within``)."""
    await execute_within(conn, "SELECT 1", None, timeout)


__all__ = ["PROBE_TIMEOUT", "execute_within", "probe"]
