"""Schedule ticks prepared ahead and fired set-based on PostgreSQL (issue 38 item 4, decision
0055, migration 0025): a prepared tick fires as the firer in Python would have fired it (the
same dispatch and schedule rows); two concurrent firers split 5,000 ticks due at one instant
and store each once; the overlap and catch-up policies hold (a busy schedule is skipped or
left waiting, a preparation the clock went past is not used); a tenant's refusal, a
changed schedule and a paused one are handled as before; the firing loop prepares what is
due soon and fires it when due.

Each test runs in a fresh database whose store clock is frozen (``freeze_clock``) and set
explicitly, so two databases can fire at the very same instant."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import SCHEMA, Databases, freeze_clock, open_test_store
from wakeful.fleet.client import submit
from wakeful.fleet.firing import firing_task
from wakeful.fleet.firing_ahead import prepare, prepare_ahead
from wakeful.fleet.firing_batch import schedule_dispatch_id
from wakeful.fleet.schedules import fire_due, fire_page, schedule
from wakeful.fleet.wake import NoWake
from wakeful.records import Schedule
from wakeful.store import schedule_rows
from wakeful.store.firings import AheadStore
from wakeful.store.postgres import PostgresStore

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

T0 = datetime(2026, 12, 8, 8, 59, 30, tzinfo=UTC)
"""The frozen clock at the start of each test: 30 s before 09:00 UTC."""


async def _set_clock(dsn: str, at: datetime) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {}.test_clock SET at = %s").format(sql.Identifier(SCHEMA)), (at,)
        )


async def _db(pg_databases: Databases) -> str:
    dsn = await pg_databases.clone()
    await freeze_clock(dsn)
    await _set_clock(dsn, T0)
    return dsn


async def _prepare_all(store: PostgresStore) -> int:
    total = 0
    while (stored := await prepare_ahead(store, ahead=3600, limit=1000)) > 0:
        total += stored
    return total


async def _rows(dsn: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every dispatch and schedule as stored, without what only the preparation writes."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT dispatch_id, thread_id, kind, payload::jsonb, priority, available_at,"
            " max_attempts, status, created_at, tenant, owner, if_busy, queued_behind, fair_tag"
            f" FROM {SCHEMA}.dispatches ORDER BY dispatch_id"
        )
        dispatches = await cur.fetchall()
        cur = await conn.execute(
            # the columns win over the body for the fields dropped from it (schedule_rows)
            "SELECT name, tenant, paused, next_fire_at, revision, updated_at, body::jsonb"
            " - 'next_fire_at' - 'revision' - 'created_at' - 'updated_at' - 'paused'"
            f" FROM {SCHEMA}.schedules ORDER BY name"
        )
        schedules = await cur.fetchall()
        cur = await conn.execute(
            f"SELECT thread_id, tenant, present FROM {SCHEMA}.threads ORDER BY thread_id"
        )
        threads = await cur.fetchall()
    return dispatches + threads, schedules


async def _same_rows(one: str, other: str) -> None:
    mine, theirs = await _rows(one), await _rows(other)
    for rows, others in zip(mine, theirs, strict=True):
        assert len(rows) == len(others)
        for a, b in zip(rows, others, strict=True):  # column by column
            assert a == b


async def _define(store: PostgresStore) -> None:
    """A mix: cron in a time zone with a dated template, an interval on a busy thread, a
    tenant's schedules, overlap allow, a seconds cron. (Two schedules on one thread are left
    out: the firer in Python enqueues their ticks in a random order.)"""
    await submit(store, "shared", "g", tenant="acme", dispatch_id="busy")  # busy thread
    await schedule(
        store,
        "digest",
        "0 10 * * *",
        target="digest",
        input={"k": [1, 2.5, "é"]},
        thread_template="digest-{date}-{time}",
        timezone="Europe/Paris",
    )
    await schedule(store, "a1", target="g", every=60, thread="shared", tenant="acme")
    await schedule(store, "a2", target="g", every=60, thread="solo", overlap="allow")
    await schedule(store, "t1", target="g", every=60, thread_template="t-{tick}", tenant="t")
    await schedule(store, "t2", target="g", every=60, thread_template="u-{tick}", tenant="t")
    await schedule(store, "sec", "0 * * * * *", target="g", thread="sec", catch_up="all")
    await schedule(store, "e1", target="g", every=60, thread="eq", overlap="enqueue")


async def test_a_prepared_tick_fires_as_the_firer_in_python_would(
    pg_databases: Databases,
) -> None:
    ahead_dsn, python_dsn = await _db(pg_databases), await _db(pg_databases)
    ahead = await open_test_store(ahead_dsn)
    python = await open_test_store(python_dsn)
    try:
        assert isinstance(ahead, AheadStore)
        for store in (ahead, python):
            await _define(store)
        assert await _prepare_all(ahead) == 7
        nine = T0 + timedelta(seconds=30)
        for dsn in (ahead_dsn, python_dsn):
            await _set_clock(dsn, nine)
        fired = await ahead.fire_prepared(100)
        assert fired.taken == 7 and fired.waiting == 0 and fired.refused == []
        assert len(fired.created) == 7
        assert await fire_due(ahead) == []  # nothing left for the firer in Python
        by_python = await fire_due(python)
        assert sorted(d.dispatch_id for d in by_python) == sorted(
            d.dispatch_id for d in fired.created
        )
        await _same_rows(ahead_dsn, python_dsn)
        statuses = {d.dispatch_id: (d.status, d.queued_behind) for d in fired.created}
        a1, a2 = schedule_dispatch_id("a1", nine), schedule_dispatch_id("a2", nine)
        assert statuses[a1] == ("queued", "busy") and statuses[a2] == ("pending", None)
        # 09:01: the 09:00 runs have not run; a1 (skip) passes over its tick, e1 (enqueue)
        # waits, a2 (allow) and the others fire (digest's next tick is tomorrow's)
        assert await _prepare_all(ahead) == 6
        for dsn in (ahead_dsn, python_dsn):
            await _set_clock(dsn, nine + timedelta(seconds=60))
        second = await ahead.fire_prepared(100)
        assert (second.taken, second.waiting) == (6, 1)
        assert await fire_due(ahead) == []
        by_python = await fire_due(python)
        assert sorted(d.dispatch_id for d in by_python) == sorted(
            d.dispatch_id for d in second.created
        )
        await _same_rows(ahead_dsn, python_dsn)
    finally:
        await ahead.close()
        await python.close()


async def _insert(dsn: str, count: int, tick: datetime) -> None:
    rows = []
    for i in range(count):
        s = Schedule(
            name=f"s{i:05d}",
            target="echo",
            every=60.0,
            input={"n": i},
            thread_template="{name}-{tick}",
            next_fire_at=tick,
            revision=1,
        )
        rows.append((s.name, tick, schedule_rows.encode(s).decode()))
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        conn.cursor() as cur,
    ):
        await cur.executemany(
            f"INSERT INTO {SCHEMA}.schedules (name, tenant, paused, next_fire_at, revision,"
            " created_at, updated_at, body) VALUES (%s, NULL, false, %s, 1, now(), now(), %s)",
            rows,
        )


async def test_two_firers_split_5000_ticks_due_at_one_instant_and_store_each_once(
    pg_databases: Databases,
) -> None:
    dsn = await _db(pg_databases)
    nine = T0 + timedelta(seconds=30)
    await _insert(dsn, 5000, nine)
    one, two = await open_test_store(dsn), await open_test_store(dsn)
    try:
        # both prepare (each its own order), then both fire as the firing loop does
        prepared = await asyncio.gather(
            prepare_ahead(one, ahead=60, limit=1000, salt="a"),
            prepare_ahead(two, ahead=60, limit=1000, salt="b"),
        )
        assert sum(prepared) >= 1000
        assert await _prepare_all(one) + sum(prepared) >= 5000
        await _set_clock(dsn, nine)

        async def firer(store: PostgresStore, collect: bool) -> tuple[int, int]:
            created = taken = 0
            while True:
                page = await fire_page(store, limit=1000, collect=collect)
                assert len(page.created) == (page.fired if collect else 0)
                created += page.fired
                taken += page.taken
                if page.taken < 1000:
                    return created, taken

        # one collects the dispatches it created, the other (as the firing loop) counts them
        results = await asyncio.gather(firer(one, True), firer(two, False))
        assert sum(c for c, _ in results) == 5000, results
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(
                f"SELECT count(*), count(DISTINCT dispatch_id), count(DISTINCT thread_id),"
                f" min(status), max(status) FROM {SCHEMA}.dispatches"
            )
            assert await cur.fetchone() == (5000, 5000, 5000, "pending", "pending")
            cur = await conn.execute(
                f"SELECT count(*) FROM {SCHEMA}.schedules WHERE revision = 2 AND next_fire_at = %s",
                (nine + timedelta(seconds=60),),
            )
            assert await cur.fetchone() == (5000,)
        assert await fire_due(one, limit=1000) == []
        s = await one.get_schedule("s00042")
        assert s is not None and s.fired == 1 and s.last_tick == nine
        assert s.last_dispatch_id == schedule_dispatch_id("s00042", nine)
    finally:
        await one.close()
        await two.close()


async def test_overlap_policies_hold_when_fired_set_based(pg_databases: Databases) -> None:
    dsn = await _db(pg_databases)
    store = await open_test_store(dsn)
    try:
        for overlap in ("skip", "enqueue", "allow"):
            await schedule(store, overlap, target="g", every=60, thread=overlap, overlap=overlap)
        nine = T0 + timedelta(seconds=30)
        await _prepare_all(store)
        await _set_clock(dsn, nine)
        first = await store.fire_prepared(10)
        assert first.taken == 3 and len(first.created) == 3  # nothing ran before
        # the 09:00 runs are still pending at 09:01
        assert await _prepare_all(store) == 3
        await _set_clock(dsn, nine + timedelta(seconds=60))
        second = await store.fire_prepared(10)
        assert (second.taken, second.waiting) == (3, 1)
        assert [d.dispatch_id for d in second.created] == [
            schedule_dispatch_id("allow", nine + timedelta(seconds=60))
        ]
        assert second.created[0].status == "queued"
        assert second.created[0].queued_behind == schedule_dispatch_id("allow", nine)
        skip = await store.get_schedule("skip")
        assert skip is not None and skip.next_fire_at == nine + timedelta(seconds=120)
        assert skip.last_tick == nine and skip.fired == 1
        # the waiting one waits for its previous run, looked at again a second later
        waiting = await store.get_schedule("enqueue")
        assert waiting is not None and waiting.waiting_since == nine + timedelta(seconds=60)
        assert waiting.next_fire_at == nine + timedelta(seconds=61)
        assert prepare(waiting).tick is None  # a waiting schedule is never prepared
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                f"UPDATE {SCHEMA}.dispatches SET status = 'done' WHERE dispatch_id = %s",
                (schedule_dispatch_id("enqueue", nine),),
            )
        await _set_clock(dsn, nine + timedelta(seconds=61))
        # the previous run ended: the firer in Python fires the tick that waited
        assert [d.dispatch_id for d in await fire_due(store)] == [
            schedule_dispatch_id("enqueue", nine + timedelta(seconds=60))
        ]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("catch_up", "every", "late", "fired"),
    [("all", 60, 330, [3, 4, 5]), ("latest", 60, 330, [5]), ("skip", 3600, 90, [])],
    ids=["all", "latest", "skip"],
)
async def test_a_preparation_the_clock_went_past_is_not_used(
    pg_databases: Databases, catch_up: str, every: int, late: int, fired: list[int]
) -> None:
    """Firers back ``late`` seconds after the 09:00 tick: past the next tick (all, latest)
    or past the 60 s a skipped tick may be late (skip), the preparation is not used; the
    firer in Python catches up as the policy says."""
    dsn = await _db(pg_databases)
    store = await open_test_store(dsn)
    try:
        await schedule(
            store,
            "c",
            target="g",
            every=every,
            thread_template="c-{tick}",
            catch_up=catch_up,  # type: ignore[arg-type]
            max_catch_up=3,
        )
        assert await _prepare_all(store) == 1
        nine = T0 + timedelta(seconds=30)
        await _set_clock(dsn, nine + timedelta(seconds=late))
        ahead = await store.fire_prepared(10)
        assert ahead.taken == 0 and ahead.created == []
        created = await fire_due(store)
        want = [schedule_dispatch_id("c", nine + timedelta(seconds=60 * k)) for k in fired]
        assert [d.dispatch_id for d in created] == want
        s = await store.get_schedule("c")
        assert s is not None and s.next_fire_at is not None
        assert s.next_fire_at > nine + timedelta(seconds=late)
    finally:
        await store.close()


async def test_refused_changed_and_paused_schedules_are_handled_as_before(
    pg_databases: Databases,
) -> None:
    dsn = await _db(pg_databases)
    store = await open_test_store(dsn)
    try:
        await submit(store, "theirs", "g", tenant="other")
        await schedule(store, "mine", target="g", every=60, thread="theirs", tenant="me")
        await schedule(store, "changed", target="g", every=60, thread_template="x-{tick}")
        await schedule(store, "paused", target="g", every=60, thread_template="p-{tick}")
        await schedule(store, "bind", target="g", every=60, thread="fresh", tenant="me")
        assert await _prepare_all(store) == 4
        changed = await store.get_schedule("changed")
        assert changed is not None
        assert await store.put_schedule(
            msgspec.structs.replace(changed, input={"v": 2}), changed.revision
        )
        paused = await store.get_schedule("paused")
        assert paused is not None
        assert await store.put_schedule(
            msgspec.structs.replace(paused, paused=True), paused.revision
        )
        nine = T0 + timedelta(seconds=30)
        await _set_clock(dsn, nine)
        fired = await store.fire_prepared(10)
        assert fired.taken == 2 and fired.refused == [schedule_dispatch_id("mine", nine)]
        assert [d.dispatch_id for d in fired.created] == [schedule_dispatch_id("bind", nine)]
        assert fired.created[0].tenant == "me"
        thread = await store.read("fresh")
        assert thread is None or thread.tenant in (None, "me")
        mine = await store.get_schedule("mine")
        assert mine is not None and mine.next_fire_at == nine + timedelta(seconds=60)
        # the changed schedule fires in Python, under its new definition; the paused not
        [tick] = await fire_due(store)
        assert tick.dispatch_id == schedule_dispatch_id("changed", nine)
        assert tick.payload["input"] == {"v": 2}
    finally:
        await store.close()


async def test_the_firing_loop_prepares_what_is_due_soon_and_fires_it(
    pg_databases: Databases,
) -> None:
    dsn = await _db(pg_databases)
    store = await open_test_store(dsn)
    task = firing_task(store, NoWake(), 0.05, page=10)
    try:
        for i in range(25):  # more than a page: the loop prepares page after page
            name = f"s{i:02d}"
            await schedule(store, name, target="g", every=60, thread_template="{tick}-{name}")
        task.start()
        prepared = f"SELECT count(*) FROM {SCHEMA}.schedules WHERE prepared_revision = revision"
        assert await _poll(dsn, prepared, 25)
        nine = T0 + timedelta(seconds=30)
        await _set_clock(dsn, nine)
        fired = f"SELECT count(*) FROM {SCHEMA}.dispatches WHERE created_at = %s"
        assert await _poll(dsn, fired, 25, nine)
        # and prepares the next ticks at once (due within 60 s)
        assert await _poll(dsn, prepared, 25)
        s = await store.get_schedule("s07")
        assert s is not None and s.revision == 2 and s.fired == 1
    finally:
        task.signal.set()
        await task.stop()
        await store.close()


async def _poll(dsn: str, query: str, want: int, *params: object) -> bool:
    """Whether ``query``'s count reaches ``want`` within 20 s."""
    deadline = asyncio.get_running_loop().time() + 20
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while asyncio.get_running_loop().time() < deadline:
            row = await (await conn.execute(query, params or None)).fetchone()
            if row is not None and row[0] >= want:
                return True
            await asyncio.sleep(0.05)
    return False
