"""``LeanConn``, the pool's connection class: its socket stays registered with the event loop
between round trips, and is never left registered when nobody waits on it and it turns
readable, when a wait is interrupted, when the server ends the connection, or when it
closes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import pq

from tests.postgres_support import dsn_for
from tests.runtime_support import eventually
from wakeful.store.postgres.connection import Database
from wakeful.store.postgres.lean import LeanConn

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


@pytest_asyncio.fixture
async def conn() -> AsyncIterator[LeanConn]:
    connection = await LeanConn.connect(dsn_for("postgres"), autocommit=True)
    try:
        yield connection
    finally:
        await connection.close()


def _watching(conn: LeanConn) -> bool:
    return conn.watching  # (a call: mypy does not narrow it between statements)


async def _one(conn: LeanConn, query: str, params: Any = None) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def test_socket_registered_once_across_round_trips(
    conn: LeanConn, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    added: list[int] = []
    add_reader = loop.add_reader

    def counting(fd: Any, callback: Any, *args: Any) -> None:
        added.append(fd)
        add_reader(fd, callback, *args)

    monkeypatch.setattr(loop, "add_reader", counting)
    for i in range(20):
        assert await _one(conn, "SELECT %s::int", (i,)) == i
    async with conn.transaction():
        assert await _one(conn, "SELECT 2") == 2
    assert added == [conn.pgconn.socket]
    assert _watching(conn)
    fd = conn.pgconn.socket
    await conn.close()
    assert not _watching(conn)
    assert not loop.remove_reader(fd)  # nothing left registered for the closed descriptor


async def test_cancelled_statement_is_cancelled_on_the_server(conn: LeanConn) -> None:
    await _one(conn, "SELECT 1")
    pid = conn.info.backend_pid
    task = asyncio.create_task(conn.execute("SELECT pg_sleep(60)"))
    async with await psycopg.AsyncConnection.connect(dsn_for("postgres"), autocommit=True) as a:

        async def sleeping() -> bool:
            cur = await a.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active'"
                " AND query LIKE 'SELECT pg_sleep%%'",
                (pid,),
            )
            return await cur.fetchone() is not None

        await eventually(sleeping)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 10
    assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert not _watching(conn)
    assert await _one(conn, "SELECT 3") == 3  # the same session, usable
    assert conn.info.backend_pid == pid


async def test_idle_connection_ended_by_the_server_is_unregistered(conn: LeanConn) -> None:
    loop = asyncio.get_running_loop()
    await _one(conn, "SELECT 1")
    assert _watching(conn)
    fd = conn.pgconn.socket
    async with await psycopg.AsyncConnection.connect(dsn_for("postgres"), autocommit=True) as a:
        await a.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    # the socket turns readable while nobody waits: the callback stops watching it
    await eventually(lambda: not _watching(conn))
    with pytest.raises(psycopg.OperationalError):
        await conn.execute("SELECT 1")
    assert not _watching(conn)
    assert not loop.remove_reader(fd)


async def test_large_statement_waits_for_writing(conn: LeanConn) -> None:
    text = "x" * (16 * 1024 * 1024)  # more than the socket's buffer: libpq waits to write
    assert await _one(conn, "SELECT length(%s)", (text,)) == len(text)
    assert await _one(conn, "SELECT 4") == 4
    assert _watching(conn)


async def test_error_leaves_connection_usable_and_unregistered(conn: LeanConn) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        await conn.execute("SELECT 1 / 0")
    assert not _watching(conn)
    assert await _one(conn, "SELECT 5") == 5


async def test_store_pool_hands_out_lean_connections() -> None:
    db = await Database.connect(
        dsn_for("postgres"),
        schema="wakeful",
        pool=None,
        pool_size=1,
        pool_min_size=None,
        timeout=10,
    )
    try:

        async def kind(c: psycopg.AsyncConnection[Any]) -> bool:
            return isinstance(c, LeanConn) and await _one(c, "SELECT 6") == 6

        assert await db.run(kind)
    finally:
        await db.close()
