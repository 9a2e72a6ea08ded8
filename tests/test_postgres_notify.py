"""The PostgreSQL store's notifications: sent after the write returned (never inside its
transaction), coalesced by one task per store, sent only while a listener announces itself,
dropped on failure without touching the writer, flushed on close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import Databases, open_test_store
from tests.runtime_support import eventually
from wakeful.records import Commit, Event, EventDraft
from wakeful.store.postgres import PostgresStore, notify
from wakeful.store.postgres.connection import channel_name

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

CHANNEL = channel_name("wakeful")


@contextlib.asynccontextmanager
async def _listening(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        await conn.execute(notify.LISTENER_PRESENCE_SQL, (CHANNEL,))
        yield conn
    finally:
        await conn.close()


async def _received(conn: psycopg.AsyncConnection[tuple[object, ...]], want: set[str]) -> set[str]:
    got: set[str] = set()
    async for note in conn.notifies(timeout=10):
        got.add(note.payload)
        if want <= got:
            break
    return got


async def _subscribed(
    reader: PostgresStore, thread_id: str, after: int
) -> asyncio.Task[list[Event]]:
    """A ``wait_events`` task of ``reader``, returned once LISTEN is up and the task waits
    (only a waiter already subscribed proves that a notification or a re-check woke it)."""
    assert await reader.listener.ready(10)
    waiter = asyncio.create_task(reader.wait_events(thread_id, after, timeout=60))
    await eventually(lambda: reader.listener.waiting(thread_id) == 1)
    return waiter


async def test_no_schema_function_notifies(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'wakeful' AND p.prosrc ILIKE '%pg_notify%'"
        )
        assert await cur.fetchall() == []


async def test_commits_and_deletes_are_announced_after_they_return(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        async with _listening(dsn) as conn:
            claim = await store.claim("t1", "w", 60)
            await store.commit("t1", Commit(token=claim.token))  # no events: no notification
            await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="a"),)))
            _, receipt = await store.claim_and_commit(
                "t2", "w", 60, Commit(token=0, events=(EventDraft(type="b"),), release=True)
            )
            assert receipt.events == (1,)
            await store.delete_thread("t3")  # nothing to delete: no notification
            await store.delete_thread("t1")
            assert await _received(conn, {"t1", "t2"}) == {"t1", "t2"}
    finally:
        await store.close()


async def test_a_commit_through_another_store_wakes_a_waiter(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    # Polling so slow that only the notification can wake the waiter in time.
    reader = await open_test_store(dsn, poll_interval=120)
    writer = await open_test_store(dsn)
    try:
        claim = await writer.claim("t1", "w", 60)
        waiter = await _subscribed(reader, "t1", after=0)
        await writer.commit("t1", Commit(token=claim.token, events=(EventDraft(type="a"),)))
        events = await asyncio.wait_for(waiter, 10)
        assert [e.type for e in events] == ["a"]
    finally:
        await reader.close()
        await writer.close()


async def test_concurrent_commits_are_coalesced(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn, pool_size=8)
    threads = [f"t{i}" for i in range(16)]
    try:
        async with _listening(dsn) as conn:
            claims = {t: await store.claim(t, "w", 60) for t in threads}

            async def writer(thread_id: str) -> None:
                for i in range(10):
                    commit = Commit(
                        token=claims[thread_id].token, events=(EventDraft(type=f"e{i}"),)
                    )
                    await store.commit(thread_id, commit)

            await asyncio.gather(*(writer(t) for t in threads))
            await store.notifier.flush()
            assert await _received(conn, set(threads)) == set(threads)
            assert store.notifier.rounds < 160, "every commit cost its own notification"
    finally:
        await store.close()


async def test_a_failed_notification_is_dropped_and_never_raised(
    pg_databases: Databases,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn, poll_interval=120)
    monkeypatch.setattr(notify, "FAILURE_PAUSE", 0.01)
    try:
        claim = await store.claim("t1", "w", 60)
        monkeypatch.setattr(
            notify, "NOTIFY_SQL", "SELECT 1 / 0 WHERE %(channel)s <> ALL(%(ids)s::text[])"
        )
        # a waiter of the same store is woken at once, notification or not
        waiter = asyncio.create_task(store.wait_events("t1", 0, timeout=60))
        await eventually(lambda: store.listener.waiting("t1") == 1)
        with caplog.at_level(logging.WARNING, logger="wakeful.store.postgres.notify"):
            await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="a"),)))
            assert [e.type for e in await asyncio.wait_for(waiter, 10)] == ["a"]
            await store.notifier.flush()
        assert store.notifier.sent == 0 and store.notifier.pending == 0
        assert "dropped" in caplog.text
        monkeypatch.undo()
        async with _listening(dsn) as conn:
            await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="b"),)))
            assert await _received(conn, {"t1"}) == {"t1"}
    finally:
        await store.close()


async def test_close_sends_what_is_pending(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    async with _listening(dsn) as conn:
        claim = await store.claim("t1", "w", 60)
        await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="a"),)))
        await store.close()
        assert await _received(conn, {"t1"}) == {"t1"}
        await store.close()  # idempotent


async def test_nothing_is_sent_while_nobody_listens_and_a_new_listener_is_noticed(
    pg_databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = await pg_databases.clone()
    monkeypatch.setattr(notify, "PRESENCE_RECHECK", 3600.0)
    store = await open_test_store(dsn)
    try:
        claim = await store.claim("t1", "w", 60)
        # a bare LISTEN that does not announce itself: the store finds nobody present
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as bare:
            await bare.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
            for i in range(20):
                commit = Commit(token=claim.token, events=(EventDraft(type=f"e{i}"),))
                await store.commit("t1", commit)
                await store.notifier.flush()
            assert store.notifier.rounds == 1, "one round found nobody listening"
            assert store.notifier.sent == 0 and store.notifier.unheard == 20
            assert [n async for n in bare.notifies(timeout=0.2)] == []
        # a listener that announces itself is noticed at the next look
        monkeypatch.setattr(notify, "PRESENCE_RECHECK", 0.0)
        async with _listening(dsn) as conn:
            await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))
            assert await _received(conn, {"t1"}) == {"t1"}
            await store.notifier.flush()
            assert store.notifier.sent == 1
    finally:
        await store.close()


async def test_a_listener_rechecks_commits_made_while_a_notifier_believed_nobody_listened(
    pg_databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = await pg_databases.clone()
    monkeypatch.setattr(notify, "PRESENCE_RECHECK", 1.0)
    writer = await open_test_store(dsn)
    # Polling so slow that only the listener's second re-check can wake the waiter in time.
    reader = await open_test_store(dsn, poll_interval=120)
    try:
        claim = await writer.claim("t1", "w", 60)
        await writer.commit("t1", Commit(token=claim.token, events=(EventDraft(type="a"),)))
        await writer.notifier.flush()
        assert (writer.notifier.rounds, writer.notifier.unheard) == (1, 1), "nobody listened"
        waiter = await _subscribed(reader, "t1", after=1)
        # the writer still believes nobody listens: no notification goes out for this one
        await writer.commit("t1", Commit(token=claim.token, events=(EventDraft(type="b"),)))
        events = await asyncio.wait_for(waiter, 10)
        assert [e.type for e in events] == ["b"]
        assert writer.notifier.sent == 0 and writer.notifier.unheard == 2
    finally:
        await reader.close()
        await writer.close()
