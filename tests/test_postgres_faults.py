"""Faults against the PostgreSQL store: a server restart under load, a backend killed in the
middle of a commit, a lost LISTEN connection. Assertions are about facts: what was
acknowledged is there, nothing partial is visible, no event is missed or seen twice."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from tests.postgres_support import Databases, open_test_store
from tests.private_pg import start_private_server
from wakeful.errors import StaleClaim, StoreUnavailable
from wakeful.records import Checkpoint, Commit, Event, EventDraft, Message, OutboxEntry
from wakeful.store.postgres import threads
from wakeful.store.postgres.listen import APPLICATION_NAME

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def _poll(query: str, dsn: str, params: tuple[object, ...], deadline: float = 20.0) -> int:
    """Poll ``query`` (returning one pid) until it yields a row; returns the pid."""
    limit = time.monotonic() + deadline
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        while time.monotonic() < limit:
            cur = await admin.execute(query, params)
            row = await cur.fetchone()
            if row is not None:
                return int(row[0])
            await asyncio.sleep(0.01)
    raise AssertionError(f"nothing matched within {deadline} s: {query}")


async def _terminate(dsn: str, pid: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _checkpoint(id: str, parent: str | None) -> Checkpoint:
    from datetime import UTC, datetime

    return Checkpoint(
        id=id, parent=parent, run_id="run-1", status="running", state={"cp": id},
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip


async def test_backend_killed_mid_commit_leaves_nothing_partial(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        source = await store.claim("t-source", "src", 60)
        entry = OutboxEntry(message_id="m-1", target_thread="t-target", payload={"x": 1})
        await store.commit("t-source", Commit(token=source.token, outbox=(entry,)))
        assert await store.relay_outbox() == 1
        claim = await store.claim("t-target", "worker", 60)
        await store.commit(
            "t-target",
            Commit(
                token=claim.token,
                checkpoint=_checkpoint("cp-1", None),
                events=(EventDraft(type="first"),),
            ),
        )
        big = Commit(
            token=claim.token,
            operation_id="run-1:2",
            checkpoint=_checkpoint("cp-2", "cp-1"),
            events=tuple(EventDraft(type=f"e{i}") for i in range(3)),
            messages=(Message(id="msg-a", role="user"), Message(id="msg-b", role="assistant")),
            consume=("m-1",),
        )
        # Hold the inbox row: the commit writes its checkpoint, events and messages, then
        # waits on this lock while consuming, with its transaction open.
        async with await psycopg.AsyncConnection.connect(dsn) as blocker:
            await blocker.execute(
                "SELECT 1 FROM wakeful.inbox WHERE thread_id = 't-target' FOR UPDATE"
            )
            pending = asyncio.create_task(store.commit("t-target", big))
            pid = await _poll(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE %s",
                dsn,
                ("%commit(%",),
            )
            await _terminate(dsn, pid)
            with pytest.raises(StoreUnavailable):
                await pending
            snap = await store.read("t-target")
            assert snap is not None and snap.version == 1
            assert snap.checkpoint is not None and snap.checkpoint.id == "cp-1"
            assert snap.message_count == 0 and snap.last_seq == 1
            assert [e.type for e in await store.events_after("t-target")] == ["first"]
            assert await store.messages("t-target") == []
            assert [m.message_id for m in await store.inbox("t-target")] == ["m-1"]
            assert [cp.id for cp, _ in await store.checkpoints("t-target")] == ["cp-1"]
            await blocker.rollback()
        receipt = await store.commit("t-target", big)
        assert (receipt.version, receipt.events) == (2, (2, 3, 4))
        assert await store.commit("t-target", big) == receipt
        assert await store.inbox("t-target") == []
        assert [m.id for m in await store.messages("t-target")] == ["msg-a", "msg-b"]
    finally:
        await store.close()


async def test_a_lost_listener_connection_is_reestablished_and_misses_nothing(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    # Polling so slow that only LISTEN/NOTIFY (or the reconnect) can wake the waiter in time.
    reader = await open_test_store(dsn, poll_interval=120)
    writer = await open_test_store(dsn)
    try:
        claim = await writer.claim("t1", "writer", 120)
        assert await reader.listener.ready(10)
        pid = await _poll(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s",
            dsn,
            (APPLICATION_NAME,),
        )
        waiter = asyncio.create_task(reader.wait_events("t1", 0, timeout=60))
        await asyncio.sleep(0)
        await _terminate(dsn, pid)
        # committed while the listener may be down: the reconnect makes waiters re-check
        await writer.commit("t1", Commit(token=claim.token, events=(EventDraft(type="a"),)))
        events = await asyncio.wait_for(waiter, 30)
        assert [e.type for e in events] == ["a"]
        limit = time.monotonic() + 20
        while reader.listener.connects < 2 or not reader.listener.listening:
            assert time.monotonic() < limit, "the listener did not reconnect"
            await asyncio.sleep(0.01)
        again = asyncio.create_task(reader.wait_events("t1", 1, timeout=60))
        await asyncio.sleep(0)
        await writer.commit("t1", Commit(token=claim.token, events=(EventDraft(type="b"),)))
        assert [e.type for e in await asyncio.wait_for(again, 30)] == ["b"]
    finally:
        await reader.close()
        await writer.close()


@pytest.mark.slow
async def test_server_restart_while_committing() -> None:
    # A server of the test's own: restarting the shared one would cut its other users.
    server = await asyncio.to_thread(start_private_server)
    dsn = server.url
    writer = await open_test_store(dsn, pool_timeout=2.0)
    reader = await open_test_store(dsn, pool_timeout=2.0, poll_interval=0.5)
    acked: dict[int, tuple[int, ...]] = {}
    seen: list[Event] = []
    failures: list[str] = []
    restarted = asyncio.Event()
    finished = asyncio.Event()
    try:
        claim = await writer.claim("t1", "writer", 600)

        async def commit_loop() -> None:
            i = after_restart = 0
            while after_restart < 20:
                i += 1
                commit = Commit(
                    token=claim.token,
                    operation_id=f"run-1:{i}",
                    events=(EventDraft(type="tick", data=i),),
                )
                while True:  # the same operation until acknowledged: a retry is safe
                    try:
                        receipt = await writer.commit("t1", commit)
                        break
                    except StoreUnavailable as exc:
                        failures.append(str(exc))
                        await asyncio.sleep(0.05)
                acked[i] = receipt.events
                if restarted.is_set():
                    after_restart += 1
            finished.set()

        async def listen_loop() -> None:
            after = 0
            while not (finished.is_set() and after >= max(s for e in acked.values() for s in e)):
                try:
                    events = await reader.wait_events("t1", after, timeout=1)
                except StoreUnavailable:
                    await asyncio.sleep(0.05)
                    continue
                seen.extend(events)
                if events:
                    after = events[-1].seq

        writing = asyncio.create_task(commit_loop())
        listening = asyncio.create_task(listen_loop())
        limit = time.monotonic() + 30
        while len(acked) < 20:
            assert time.monotonic() < limit and not writing.done()
            await asyncio.sleep(0.01)
        await asyncio.to_thread(server.restart)
        restarted.set()
        await asyncio.wait_for(writing, 90)
        await asyncio.wait_for(listening, 60)

        assert failures, "the outage was not noticed by the writer"
        stored = await writer.events_after("t1", 0, 10_000)
        assert [e.seq for e in stored] == list(range(1, len(acked) + 1)), "nothing lost or doubled"
        assert [e.data for e in stored] == sorted(acked)
        for i, seqs in acked.items():
            assert [stored[s - 1].data for s in seqs] == [i]
        assert [e.seq for e in seen] == [e.seq for e in stored], "the waiter missed nothing"
        assert reader.listener.connects >= 2
    finally:
        await writer.close()
        await reader.close()
        await asyncio.to_thread(server.node.remove)


async def test_a_stale_retry_whose_receipt_read_fails_is_still_refused(
    pg_databases: Databases,
) -> None:
    # PostgreSQL reads the receipt a refused retry carries after the refusal, in a second
    # statement: when that read fails the caller still gets the plain refusal, never the
    # read's StoreUnavailable (which would invite another retry).
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        claim = await store.claim("t", "holder-a", 60)
        commit = Commit(
            token=claim.token,
            operation_id="op-1",
            checkpoint=_checkpoint("c1", None),
            events=(EventDraft(type="e"),),
        )
        receipt = await store.commit("t", commit)
        await store.cancel("t", "taken away")  # a newer epoch: the token is stale
        with pytest.raises(StaleClaim) as refused:
            await store.commit("t", commit)
        assert refused.value.applied_receipt == receipt
        fetchone = store._db.fetchone

        async def receipts_unreachable(template: str, params: object, **kw: object) -> object:
            if template is threads._OPERATION:
                raise StoreUnavailable("PostgreSQL: the receipt read was lost")
            return await fetchone(template, params, **kw)  # type: ignore[arg-type]

        store._db.fetchone = receipts_unreachable  # type: ignore[method-assign]
        with pytest.raises(StaleClaim) as plain:
            await store.commit("t", commit)
        assert plain.value.applied_receipt is None and plain.value.current is None
        store._db.fetchone = fetchone  # type: ignore[method-assign]
        assert await store.operation("t", "op-1") == receipt
        snap = await store.read("t")
        assert snap is not None and snap.version == receipt.version
    finally:
        await store.close()
