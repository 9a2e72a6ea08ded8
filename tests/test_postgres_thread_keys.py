"""Migration 0024 (issue 41.4): the queue, the outbox and the stream checkpoints keyed by
thread id. A version-23 database with work in flight (a leased dispatch, a staged outbox
entry, a stream checkpoint) upgrades in place and that work goes on; the guarantees the old
keys gave and the contract states (one dispatch id across threads, one checkpoint per run)
still hold on the new keys."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from tests.postgres_support import Databases, open_test_store
from wakeful.errors import DispatchConflict
from wakeful.records import (
    Commit,
    Dispatch,
    Done,
    EventDraft,
    OutboxEntry,
    Settle,
    StreamCheckpoint,
)
from wakeful.store.postgres import latest_version, migrations
from wakeful.store.postgres.connection import render
from wakeful.store.validate import encode_stream_checkpoint

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

BEFORE = 23
"""The last version with the old keys."""


async def _version_23_database(dbs: Databases) -> str:
    dsn = await dbs.clone()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("DROP SCHEMA wakeful CASCADE")
        async with conn.transaction():
            await conn.execute("CREATE SCHEMA wakeful")
            await conn.execute(
                "CREATE TABLE wakeful.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, text in migrations.migrations()[:BEFORE]:
                await conn.execute(render(text, conn, "wakeful"))
                await conn.execute(
                    "INSERT INTO wakeful.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
    return dsn


async def test_a_version_23_database_upgrades_with_work_in_flight(
    pg_databases: Databases,
) -> None:
    assert latest_version() > BEFORE
    dsn = await _version_23_database(pg_databases)
    checkpoint = StreamCheckpoint(
        run_id="run-1", thread_id="t1", model="m", partial_text="Once upon", token=1,
        updated_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )  # fmt: skip
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # under version 23: a leased dispatch (its claim's token is 1), an entry staged by
        # t1 for t2 (source_thread, the column 0024 renames), t1's stream checkpoint
        await conn.execute(
            "SELECT dispatch_id"
            " FROM wakeful.enqueue('d-1', 't1', 'start', '{}', 0, NULL, 5, NULL, NULL)"
        )
        cur = await conn.execute("SELECT token FROM wakeful.claim_next('w', 60, 1)")
        assert await cur.fetchone() == (1,)
        await conn.execute(
            "INSERT INTO wakeful.outbox (source_thread, target_thread, message_id,"
            " correlation_id, payload, at) VALUES ('t1', 't2', 'm-1', 'c-1', '{\"n\": 1}', now())"
        )
        body = encode_stream_checkpoint(checkpoint).body.decode()
        cur = await conn.execute(
            "SELECT wakeful.put_stream_checkpoint('run-1', 't1', 1, %s, NULL)", (body,)
        )
        assert await cur.fetchone() == (True,)
    store = await open_test_store(dsn)
    try:
        assert await store.stream_checkpoints.get("run-1") == checkpoint
        assert await store.relay_outbox() == 1
        [message] = await store.inbox("t2")
        assert (message.message_id, message.source_thread, message.payload) == (
            "m-1",
            "t1",
            {"n": 1},
        )
        # the checkpoint again under the new key: replaced, one row for the run
        later = StreamCheckpoint(
            run_id="run-1", thread_id="t1", model="m", partial_text="Once upon a time",
            token=1, updated_at=datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC),
        )  # fmt: skip
        await store.stream_checkpoints.put(later)
        assert await store.stream_checkpoints.get("run-1") == later
        receipt = await store.commit(
            "t1",
            Commit(
                token=1,
                events=(EventDraft(type="done"),),
                settle=Settle(dispatch_id="d-1", outcome=Done()),
            ),
        )
        assert receipt.events == (1,)
        settled = await store.get_dispatch("d-1")
        assert settled is not None and settled.status == "done"
        # the id stays one dispatch across threads (dispatches_id)
        with pytest.raises(DispatchConflict):
            await store.enqueue(Dispatch(dispatch_id="d-1", thread_id="t2", kind="start"))
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM wakeful.stream_checkpoints")
        assert await cur.fetchone() == (1,)
        cur = await conn.execute("SELECT count(*) FROM wakeful.outbox")
        assert await cur.fetchone() == (0,)
        cur = await conn.execute("SELECT thread_id, count(*) FROM wakeful.dispatches GROUP BY 1")
        assert sorted(await cur.fetchall()) == [("t1", 1), ("t2", 1)]  # d-1, t2's message


async def test_a_thread_deleted_with_staged_entries_takes_them(pg_databases: Databases) -> None:
    """delete_thread (restated by 0024) finds the thread's staged entries by their key's
    thread_id: an entry not yet relayed goes with its thread and is never delivered."""
    store = await open_test_store(await pg_databases.clone())
    try:
        await store.enqueue(Dispatch(dispatch_id="d-1", thread_id="t1", kind="start"))
        [lease] = await store.claim_next("w", 60)
        await store.commit(
            "t1",
            Commit(
                token=lease.claim.token,
                outbox=(OutboxEntry(target_thread="t2", message_id="m-1", payload=1),),
            ),
        )
        await store.delete_thread("t1")
        assert await store.relay_outbox() == 0
        assert await store.inbox("t2") == []
    finally:
        await store.close()
