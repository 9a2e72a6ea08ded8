"""Transactions of several round trips are bounded: a client paused (SIGSTOP) inside one does
not hold the thread's row lock for as long as the pause lasts (issue 35, item 3)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import psycopg_pool
import pytest

from tests.nats_server import stopped
from tests.postgres_support import ROOT, SCHEMA, Databases, open_test_store
from tests.sqlite_support import wait_until
from wakeful.errors import InvalidInput
from wakeful.store.postgres import migrations
from wakeful.store.postgres.connection import Conn

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

IDLE = 1.0
"""The paused child's ``idle_in_transaction_timeout``."""
MARGIN = 4.0
"""Slack for a loaded machine on top of ``IDLE``: without the bound the claim waits forever."""


async def _backend_state(dsn: str, pid: int) -> str | None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))
        row = await cur.fetchone()
        return None if row is None else str(row[0])


def _pausing_child(dsn: str, thread_id: str) -> subprocess.Popen[str]:
    """``tests.postgres_child pause-drop``: it stops itself inside its drop commit."""
    args = ["pause-drop", dsn, "-", "paused-holder", thread_id, str(IDLE)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.postgres_child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_a_claim_behind_a_client_paused_inside_a_drop_commit_takes_over_within_the_bound(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    child = _pausing_child(dsn, "t1")
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        assert line, child.stderr.read() if child.stderr else ""
        backend = json.loads(line)["paused"]
        await asyncio.to_thread(wait_until, lambda: stopped(child.pid), 10, "the SIGSTOP")
        # the paused client's transaction: the commit function ran, the row lock is held
        assert await _backend_state(dsn, backend) == "idle in transaction"
        store = await open_test_store(dsn)
        try:
            snap = await store.read("t1")
            assert snap is not None and snap.claim is not None and snap.version == 3
            expires = snap.claim.expires_at
            deadline = time.monotonic() + 10
            while await store.clock_now() <= expires:  # the lease runs out (server time)
                assert time.monotonic() < deadline, "the child's lease did not expire"
                await asyncio.sleep(0.05)
            started = time.monotonic()
            claim = await asyncio.wait_for(store.claim("t1", "successor", 30), IDLE + MARGIN)
            waited = time.monotonic() - started
            assert (claim.holder, claim.token) == ("successor", 2)
            assert waited < IDLE + MARGIN
            # the paused commit rolled back: nothing of it is stored, its session is gone
            after = await store.read("t1")
            assert after is not None and after.version == 3
            history = [cp.id for cp, _ in await store.checkpoints("t1")]
            assert history == ["cp-2", "cp-1", "cp-0"]
            assert await _backend_state(dsn, backend) is None
        finally:
            await store.close()
        os.kill(child.pid, signal.SIGCONT)
        out, err = await asyncio.to_thread(child.communicate, timeout=30)
        assert child.returncode == 0, err
        # the paused client learns it lost the transaction: retryable, nothing applied
        assert json.loads(out.strip().splitlines()[-1]) == {"error": "StoreUnavailable"}
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=10)  # reaps it and closes the pipes


async def _setting(conn: Conn) -> str:
    cur = await conn.execute("SHOW idle_in_transaction_session_timeout")
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def test_every_transaction_of_several_round_trips_carries_the_bound(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    # a caller's pool whose connections are not in autocommit: every call is a transaction
    # (the statement, then the COMMIT)
    pool: psycopg_pool.AsyncConnectionPool[Conn] = psycopg_pool.AsyncConnectionPool(
        dsn, min_size=1, max_size=1, open=False
    )
    await pool.open(wait=True)
    try:
        store = await open_test_store(dsn, pool=pool, idle_in_transaction_timeout=2.5)
        try:
            assert await store._db.run(_setting) == "2500ms"
        finally:
            await store.close()
    finally:
        await pool.close()

    async def inside(conn: Conn) -> tuple[str, str]:
        async with store._db.transaction(conn):
            bounded = await _setting(conn)
        return bounded, await _setting(conn)

    store = await open_test_store(dsn, idle_in_transaction_timeout=1.5)
    try:
        # SET LOCAL: the bound ends with the transaction and never stays on the session
        bounded, after = await store._db.run(inside)
        assert bounded == "1500ms" and after != "1500ms"
    finally:
        await store.close()
    store = await open_test_store(dsn, idle_in_transaction_timeout=0)
    try:  # 0: the server's own setting, untouched
        inner, outer = await store._db.run(inside)
        assert inner == outer
    finally:
        await store.close()
    with pytest.raises(InvalidInput, match="idle_in_transaction_timeout"):
        await open_test_store(dsn, idle_in_transaction_timeout=-1)
    # the migrations' transaction (here a savepoint of an outer one, to look inside it)
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with conn, conn.transaction():
        await migrations.apply(conn, SCHEMA, dsn, 3.0)
        assert await _setting(conn) == "3s"
