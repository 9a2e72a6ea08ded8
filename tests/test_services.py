"""The services the fleet tests rely on answer, with the features wakeful uses."""

from __future__ import annotations

import pytest

from tests.services import nats_url, postgres_dsn


@pytest.mark.asyncio
async def test_postgres_answers_and_supports_skip_locked_and_notify() -> None:
    psycopg = pytest.importorskip("psycopg")
    dsn = postgres_dsn()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("select current_setting('server_version_num')::int")
        row = await cur.fetchone()
        assert row is not None and row[0] >= 120000, "PostgreSQL 12 or newer is required"
        await conn.execute("listen wakeful_probe")
        await conn.execute("notify wakeful_probe, 'x'")
        got = []
        async for note in conn.notifies(timeout=5, stop_after=1):
            got.append(note.payload)
        assert got == ["x"]


@pytest.mark.asyncio
async def test_nats_answers_with_jetstream() -> None:
    nats = pytest.importorskip("nats")
    nc = await nats.connect(nats_url(), connect_timeout=5, max_reconnect_attempts=0)
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
    finally:
        await nc.close()
