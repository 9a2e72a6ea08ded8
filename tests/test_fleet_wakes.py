"""Wake signals: a notify wakes a wait (here or in another object), a wait without one times
out, bursts coalesce, and a lost connection is recovered without raising."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
import pytest_asyncio

from tests.services import nats_url, postgres_dsn
from wakeful.errors import InvalidInput
from wakeful.fleet.natswake import NatsWake
from wakeful.fleet.pgwake import PostgresWake
from wakeful.fleet.wake import LocalWake, NoWake, WakeWaiter
from wakeful.ids import new_id

# --------------------------------------------------------------------------- local


@pytest.mark.asyncio
async def test_local_wake_notify_wait_timeout_and_coalescing() -> None:
    wake = LocalWake()
    started = time.monotonic()
    assert await wake.wait(0.05) is False
    assert time.monotonic() - started >= 0.04
    waiter = asyncio.create_task(wake.wait(10))
    await asyncio.sleep(0)
    started = time.monotonic()
    await wake.notify()
    assert await waiter is True
    assert time.monotonic() - started < 2
    for _ in range(5):
        await wake.notify()
    assert await wake.wait(1) is True
    assert await wake.wait(0.05) is False, "a burst wakes once"
    await wake.close()


@pytest.mark.asyncio
async def test_no_wake_only_times_out() -> None:
    wake = NoWake()
    await wake.notify()
    assert await wake.wait(0.01) is False
    await wake.close()


# --------------------------------------------------------------------------- postgres


@pytest_asyncio.fixture
async def pg_channel() -> AsyncIterator[tuple[str, str]]:
    dsn = postgres_dsn()
    yield dsn, f"wake_{new_id()}"


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_notify_wakes_another_objects_wait(pg_channel: tuple[str, str]) -> None:
    dsn, channel = pg_channel
    async with PostgresWake(dsn, channel) as waiter, PostgresWake(dsn, channel) as notifier:
        await waiter.listen()
        waiting = asyncio.create_task(waiter.wait(10))
        started = time.monotonic()
        await notifier.notify()
        assert await waiting is True
        assert time.monotonic() - started < 2


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_wait_without_notify_times_out(pg_channel: tuple[str, str]) -> None:
    dsn, channel = pg_channel
    async with PostgresWake(dsn, channel) as waiter, PostgresWake(dsn, "other_" + channel) as other:
        await waiter.listen()
        await other.notify()  # another channel does not wake this one
        started = time.monotonic()
        assert await waiter.wait(0.2) is False
        assert 0.15 <= time.monotonic() - started < 2


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_burst_coalesces_and_buffers_between_waits(
    pg_channel: tuple[str, str],
) -> None:
    dsn, channel = pg_channel
    async with PostgresWake(dsn, channel) as waiter, PostgresWake(dsn, channel) as notifier:
        await waiter.listen()
        for _ in range(5):
            await notifier.notify()
        # Sent while nobody waited: buffered, so the next wait returns at once, and once.
        started = time.monotonic()
        assert await waiter.wait(10) is True
        assert time.monotonic() - started < 2
        assert await waiter.wait(0.2) is False, "one wait per batch"
        await waiter.notify()  # its own notify wakes it too
        assert await waiter.wait(10) is True


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_listener_killed_reconnects_on_a_later_wait(
    pg_channel: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    dsn, channel = pg_channel
    async with PostgresWake(dsn, channel) as waiter, PostgresWake(dsn, channel) as notifier:
        await waiter.listen()
        killed = waiter.listener_pid
        assert killed is not None
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (killed,))
        woken = False
        deadline = time.monotonic() + 15
        with caplog.at_level(logging.WARNING, logger="wakeful.fleet.pgwake"):
            while not woken and time.monotonic() < deadline:
                await notifier.notify()
                woken = await waiter.wait(0.5)  # never raises for the lost connection
        assert woken, "a notify after the reconnect wakes a wait"
        assert waiter.listener_pid not in (None, killed)
        assert any("lost" in r.getMessage() for r in caplog.records)


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_close_interrupts_a_wait_and_unreachable_server_does_not_raise(
    pg_channel: tuple[str, str],
) -> None:
    dsn, channel = pg_channel
    waiter = PostgresWake(dsn, channel)
    await waiter.listen()
    waiting = asyncio.create_task(waiter.wait(30))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await waiter.close()
    assert await waiting is False
    assert time.monotonic() - started < 2
    assert await waiter.wait(5) is False, "a closed wake returns at once"
    await waiter.close()

    dead = PostgresWake("postgresql://postgres@127.0.0.1:1/postgres", channel)
    started = time.monotonic()
    await dead.notify()  # dropped, logged
    await dead.notify()  # dropped at once during the backoff
    assert time.monotonic() - started < 5
    started = time.monotonic()
    assert await dead.wait(0.3) is False
    assert time.monotonic() - started >= 0.25
    await dead.close()


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_a_cancelled_wait_leaves_the_wake_usable(
    pg_channel: tuple[str, str],
) -> None:
    dsn, channel = pg_channel
    async with PostgresWake(dsn, channel) as waiter, PostgresWake(dsn, channel) as notifier:
        await waiter.listen()
        waiting = asyncio.create_task(waiter.wait(30))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await notifier.notify()
        assert await waiter.wait(10) is True


def test_postgres_channel_must_be_an_identifier() -> None:
    for bad in ("", "Upper", "has space", "x;drop", "a" * 64, "1abc"):
        with pytest.raises(InvalidInput):
            PostgresWake("postgresql://unused", bad)


# --------------------------------------------------------------------------- nats


@pytest.mark.nats
@pytest.mark.asyncio
async def test_nats_notify_wakes_another_objects_wait() -> None:
    url, subject = nats_url(), f"wakeful.test.{new_id()}"
    async with NatsWake(url, subject) as waiter, NatsWake(url, subject) as notifier:
        await waiter.listen()
        waiting = asyncio.create_task(waiter.wait(10))
        started = time.monotonic()
        await notifier.notify()
        assert await waiting is True
        assert time.monotonic() - started < 2


@pytest.mark.nats
@pytest.mark.asyncio
async def test_nats_wait_without_notify_times_out_and_bursts_coalesce() -> None:
    url, subject = nats_url(), f"wakeful.test.{new_id()}"
    async with NatsWake(url, subject) as waiter, NatsWake(url, subject) as notifier:
        started = time.monotonic()
        assert await waiter.wait(0.2) is False
        assert 0.15 <= time.monotonic() - started < 2
        for _ in range(5):
            await notifier.notify()
        # All five delivered before anyone waits: they coalesce into exactly one wake.
        deadline = time.monotonic() + 10
        while waiter.received < 5:
            assert time.monotonic() < deadline, f"{waiter.received} of 5 wakes arrived"
            await asyncio.sleep(0.01)
        assert waiter.received == 5
        assert await waiter.wait(10) is True
        assert await waiter.wait(0.2) is False


@pytest.mark.nats
@pytest.mark.asyncio
async def test_nats_close_is_clean_and_interrupts_a_wait() -> None:
    url, subject = nats_url(), f"wakeful.test.{new_id()}"
    waiter = NatsWake(url, subject)
    await waiter.listen()
    waiting = asyncio.create_task(waiter.wait(30))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await waiter.close()
    assert await waiting is False
    assert time.monotonic() - started < 2
    assert await waiter.wait(5) is False
    await waiter.notify()  # a no-op once closed
    await waiter.close()  # idempotent


@pytest.mark.asyncio
async def test_nats_unreachable_server_does_not_raise() -> None:
    dead = NatsWake("nats://127.0.0.1:1", "wakeful.test.dead")
    started = time.monotonic()
    assert await dead.wait(0.3) is False
    assert time.monotonic() - started >= 0.25
    started = time.monotonic()
    await dead.notify()  # dropped, logged
    await dead.notify()  # dropped at once during the backoff
    assert time.monotonic() - started < 3
    await dead.close()


def test_nats_subject_must_be_literal() -> None:
    for bad in ("", "a.*", "a.>", "a..b", "has space", ".a"):
        with pytest.raises(InvalidInput):
            NatsWake("nats://unused", bad)


@pytest.mark.asyncio
async def test_a_waiter_ends_at_a_nudge_before_or_during_its_wait_and_keeps_the_wake_wait() -> None:
    wake = LocalWake()
    waiter = WakeWaiter(wake)
    waiter.nudge()
    assert await asyncio.wait_for(waiter.wait(60), 5) is True, "a nudge before: at once"
    waiting = asyncio.ensure_future(waiter.wait(60))
    await asyncio.sleep(0)
    assert not waiting.done()
    waiter.nudge()
    assert await asyncio.wait_for(waiting, 5) is True, "a nudge during the wait ends it"
    await wake.notify()  # lands in the wake wait the nudge cut short: not lost
    assert await asyncio.wait_for(waiter.wait(60), 5) is True
    started = time.monotonic()
    assert await waiter.wait(0.02) is False, "nothing: the wait times out"
    assert time.monotonic() - started < 5
    await waiter.close()
