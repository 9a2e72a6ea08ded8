"""Schedule firing (issue 38 item 4, decision 0044): how late ticks are fired when many are
due, on PostgreSQL and SQLite, and what batching changed.

Run ``python -m benchmarks.schedules [--schedules 10000] [--firers 2] [--rounds 2]
[--every 30] [--ab 2000] [--dsn URL] [--no-spread] [--no-sqlite]``.

1. **Batched against one by one** (PostgreSQL, in this process, one firer): ``--ab``
   interval schedules all due now, fired by ``fire_page`` until none is due, once through the
   store's batches (``TickStore``) and once through a wrapper that hides them (decision
   0038's path: a read, an enqueue and a compare-and-set per tick); the seconds each took.
   Measured back to back, so the ratio holds on a loaded machine.
2. **Due at once** (PostgreSQL): ``--schedules`` interval schedules (``every`` seconds,
   default overlap ``skip`` and catch-up ``latest``), each tick on a thread of its own, all
   due at the same tick. ``--firers`` firing loops run as the workers run them
   (``wakeful.fleet.firing.firing_task``), each in a process of its own with its own store,
   waiting for that tick by the store's clock. A tick's lateness is its dispatch's
   ``created_at`` (the store's clock at the enqueue) minus the tick; the figures are the p50,
   the p99 and the last of each round. Before the next round every fired dispatch is marked
   ``done`` (no worker runs them), so the firers also read which previous runs are
   unfinished, as they do in steady state.
3. **Spread over a minute** (PostgreSQL, ``--no-spread`` to skip): as many cron schedules
   with a seconds field (``S * * * * *``, ``S`` = their number modulo 60), so that the same
   number is due in one minute, one second's share at a time; one minute measured.
4. **SQLite**: ``--sqlite-schedules`` due at once, one firer in this process.

The firers' CPU time (user and system, of their processes) is reported per tick. Schedules
are written with one ``executemany`` (the public API would take minutes for 10,000); they
are the rows ``wakeful.schedule`` writes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result
from wakeful import open_store
from wakeful.fleet.firing import firing_task
from wakeful.fleet.firing_ahead import prepare_ahead
from wakeful.fleet.schedules import fire_page
from wakeful.fleet.ticks import next_tick
from wakeful.fleet.wake import NoWake
from wakeful.records import Schedule
from wakeful.store import schedule_rows
from wakeful.store.firings import AheadStore
from wakeful.store.sqlite import SqliteStore

SCHEMA = "wakeful"
LEAD = 3.0
_US = timedelta(microseconds=1)
"""Seconds at least between setting a round up and its tick."""
Late = tuple[list[float], list[float] | None]
"""Lateness by ``created_at``, and by visibility (claimable) where measured."""


def _schedules(count: int, every: float, tick: datetime) -> list[Schedule]:
    return [
        Schedule(
            name=f"s{i:05d}",
            target="echo",
            every=every,
            input={"n": i},
            thread_template="{name}-{tick}",
            next_fire_at=tick,
            revision=1,
        )
        for i in range(count)
    ]


def _tick_after(now: datetime, every: float) -> datetime:
    """The first tick at least ``LEAD`` seconds after ``now``."""
    probe = Schedule(name="p", target="t", every=every, thread="t")
    tick = next_tick(probe, now + timedelta(seconds=LEAD))
    assert tick is not None
    return tick


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p * len(ordered)) - 1))]


# ----------------------------------------------------------------------------- PostgreSQL


def _pg_setup(dsn: str, count: int, every: float) -> datetime:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        now = conn.execute(f"SELECT {SCHEMA}.store_now()").fetchone()[0]  # type: ignore[index]
        tick = _tick_after(now.astimezone(UTC), every)
        rows = [
            (s.name, None, False, tick, 1, schedule_rows.encode(s).decode())
            for s in _schedules(count, every, tick)
        ]
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {SCHEMA}.schedules (name, tenant, paused, next_fire_at, revision,"
                f" created_at, updated_at, body) VALUES (%s, %s, %s, %s, %s, now(), now(), %s)",
                rows,
            )
    return tick


def _pg_lateness(dsn: str, tick: datetime, count: int, deadline: float) -> Late | None:
    """Each tick's lateness in seconds once all ``count`` are fired (``None``: not by the
    deadline): by its ``created_at`` (the store's clock when the firing transaction began),
    and by when it became visible to another session, i.e. claimable (the store's clock at
    the first poll, every 20 ms, that counted it: committed by then)."""
    import psycopg

    label = tick.strftime("%Y-%m-%dT%H:%M:%S")
    pattern = f"sched:%:{label}%"
    visible: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                f"SELECT extract(epoch FROM clock_timestamp() - %s), count(*)"
                f" FROM {SCHEMA}.dispatches WHERE dispatch_id LIKE %s",
                (tick, pattern),
            ).fetchone()
            assert row is not None
            seen, total = float(row[0]), int(row[1])
            visible.extend([seen] * (total - len(visible)))
            if total >= count:
                rows = conn.execute(
                    f"SELECT extract(epoch FROM created_at - %s) FROM {SCHEMA}.dispatches"
                    f" WHERE dispatch_id LIKE %s",
                    (tick, pattern),
                ).fetchall()
                # the next round's overlap check finds these runs ended (only the rows not
                # done yet: rewriting every earlier round's rows loaded the server)
                conn.execute(
                    f"UPDATE {SCHEMA}.dispatches SET status = 'done' WHERE status <> 'done'"
                )
                return [float(r[0]) for r in rows], visible
            time.sleep(0.02)
    return None


def _pg_insert(dsn: str, schedules: list[Schedule]) -> None:
    import psycopg

    rows = [
        (s.name, None, False, s.next_fire_at, 1, schedule_rows.encode(s).decode())
        for s in schedules
    ]
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {SCHEMA}.schedules (name, tenant, paused, next_fire_at, revision,"
            f" created_at, updated_at, body) VALUES (%s, %s, %s, %s, %s, now(), now(), %s)",
            rows,
        )


def _pg_now(dsn: str) -> datetime:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT {SCHEMA}.store_now()").fetchone()
        assert row is not None
        now: datetime = row[0]
        return now.astimezone(UTC)


def _spread(dsn: str, count: int) -> tuple[datetime, datetime]:
    """``count`` cron schedules, ``count / 60`` due at each second of the next minute (and
    every minute after): the first tick and the last of that minute."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:  # the at-once ones stop ticking
        conn.execute(f"UPDATE {SCHEMA}.schedules SET paused = true")
    start = _pg_now(dsn) + timedelta(seconds=LEAD)
    minute = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    made = []
    for i in range(count):
        s = Schedule(
            name=f"m{i:05d}",
            target="echo",
            cron=f"{i % 60} * * * * *",
            input={"n": i},
            thread_template="{name}-{tick}",
            revision=1,
        )
        made.append(msgspec.structs.replace(s, next_fire_at=next_tick(s, minute - _US)))
    _pg_insert(dsn, made)
    return minute, minute + timedelta(seconds=59)


def _pg_spread_lateness(dsn: str, count: int, deadline: float) -> list[float] | None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute(
                f"SELECT dispatch_id, created_at FROM {SCHEMA}.dispatches"
                f" WHERE dispatch_id LIKE 'sched:m%'"
            ).fetchall()
            if len(rows) >= count:
                return [(at - _tick_of(ident)).total_seconds() for ident, at in rows]
            time.sleep(0.2)
    return None


def _tick_of(dispatch_id: str) -> datetime:
    label = dispatch_id.split(":", 2)[2]
    return datetime.fromisoformat(label.replace("Z", "+00:00"))


class _OneByOne:
    """A store without its batches (``TickStore`` hidden): decision 0038's firing path."""

    _HIDDEN = frozenset(
        (
            "fire_schedules",
            "unfinished_runs",
            "next_schedule_due",
            "to_prepare",
            "prepare_ticks",
            "fire_prepared",
        )
    )

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name in self._HIDDEN:
            raise AttributeError(name)
        return getattr(self._inner, name)


async def _fire_all(store: object, count: int) -> float:
    started = time.perf_counter()
    fired = 0
    while fired < count:
        page = await fire_page(store, limit=1000)  # type: ignore[arg-type]
        fired += len(page.created)
        if page.due == 0:
            break
    assert fired == count, (fired, count)
    return time.perf_counter() - started


async def _ab(dsn: str, count: int) -> tuple[float, float, float]:
    """Seconds to fire ``count`` due schedules prepared ahead (decision 0055; the preparing
    is not timed), in batches, then one by one."""
    async with open_store(dsn) as store:
        assert isinstance(store, AheadStore)
        seconds = []
        for prefix, firer in (("p", store), ("a", store), ("b", _OneByOne(store))):
            # hourly, due since the hour began: each fires that tick (catch-up "latest")
            hour = (await store.store_now()).replace(minute=0, second=0, microsecond=0)
            due = [
                msgspec.structs.replace(s, name=f"{prefix}{s.name}")
                for s in _schedules(count, 3600.0, hour)
            ]
            await asyncio.to_thread(_pg_insert, dsn, due)
            if prefix == "p":
                while await prepare_ahead(store, ahead=0, limit=1000) > 0:
                    pass
            seconds.append(await _fire_all(firer, count))
        return seconds[0], seconds[1], seconds[2]


def _postgres(args: argparse.Namespace, out: Collector) -> None:
    if args.ab:
        db = Database(args.dsn, f"wakeful_bench_sched_ab_{uuid.uuid4().hex[:8]}").create()
        try:
            asyncio.run(_migrate(db.dsn))
            ahead, batched, one_by_one = asyncio.run(_ab(db.dsn, args.ab))
        finally:
            db.drop()
        label = f"PostgreSQL, one firer, {args.ab:,} due now"
        out.add(f"{label}: prepared ahead, fired set-based", ahead, "s", higher_is_better=False)
        out.add(f"{label}: fired in batches", batched, "s", higher_is_better=False)
        out.add(
            f"{label}: fired one by one (decision 0038)", one_by_one, "s", higher_is_better=False
        )
        print(
            f"{label}: prepared ahead {ahead:.2f} s, batches {batched:.2f} s, "
            f"one by one {one_by_one:.2f} s "
            f"({one_by_one / batched:.1f}x)",
            flush=True,
        )
    db = Database(args.dsn, f"wakeful_bench_sched_{uuid.uuid4().hex[:8]}").create()
    firers: list[subprocess.Popen[bytes]] = []
    try:
        asyncio.run(_migrate(db.dsn))
        tick = _pg_setup(db.dsn, args.schedules, args.every)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        for _ in range(args.firers):
            firers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.schedules", "--fire", db.dsn], env=env
                )
            )
        _rounds(
            out,
            f"PostgreSQL, {args.firers} firer(s)",
            args,
            args.schedules,
            tick,
            lambda t, deadline: _pg_lateness(db.dsn, t, args.schedules, deadline),
        )
        if args.spread:
            first, last = _spread(db.dsn, args.schedules)
            wait = (last - datetime.now(UTC)).total_seconds()
            late = _pg_spread_lateness(db.dsn, args.schedules, time.monotonic() + wait + 30)
            label = f"PostgreSQL, {args.firers} firer(s), {args.schedules:,} due in one minute"
            if late is None:
                out.skip(f"{label}: p99 firing lateness", "s", "not all fired within 30 s")
            else:
                p50, p99 = _percentile(late, 0.5), _percentile(late, 0.99)
                out.add(f"{label}: p50 firing lateness", p50, "s", higher_is_better=False)
                out.add(
                    f"{label}: p99 firing lateness",
                    p99,
                    "s",
                    higher_is_better=False,
                    anchor="limit",
                    anchor_samples=1.0,
                    target=1.0,
                    note="issue 38: p99 <= 1 s with 10k schedules due in the same minute",
                )
                print(
                    f"{label} ({first:%H:%M:%S}-{last:%H:%M:%S}): lateness p50 {p50:.3f} s, "
                    f"p99 {p99:.3f} s, last {max(late):.3f} s",
                    flush=True,
                )
    finally:
        for p in firers:
            p.send_signal(signal.SIGTERM)
        for p in firers:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        db.drop()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = used.ru_utime + used.ru_stime
    ticks = args.schedules * (args.rounds + (1 if args.spread else 0))
    out.add(
        f"PostgreSQL firers' CPU per tick ({args.firers} firer(s))",
        cpu / ticks * 1e3,
        "ms",
        higher_is_better=False,
        note="user + system time of the firer processes (Python), over every tick fired",
    )
    print(f"PostgreSQL firers' CPU: {cpu:.2f} s, {cpu / ticks * 1e3:.3f} ms per tick", flush=True)


Measure = Callable[[datetime, float], "Late | None"]


def _rounds(
    out: Collector,
    label: str,
    args: argparse.Namespace,
    count: int,
    tick: datetime,
    measure: Measure,
) -> None:
    p50s: list[float] = []
    p99s: list[float] = []
    lasts: list[float] = []
    seen50s: list[float] = []
    seen99s: list[float] = []
    for r in range(args.rounds):
        wait = (tick - datetime.now(UTC)).total_seconds()
        deadline = time.monotonic() + max(wait, 0) + args.every * 0.9
        measured = measure(tick, deadline)
        if measured is None:
            out.skip(f"{label}: p99 firing lateness", "s", "not all fired within the interval")
            print(f"{label}, round {r + 1}: not all {count:,} fired in time", flush=True)
            return
        late, visible = measured
        p50s.append(_percentile(late, 0.5))
        p99s.append(_percentile(late, 0.99))
        lasts.append(max(late))
        seen = ""
        if visible:
            seen50s.append(_percentile(visible, 0.5))
            seen99s.append(_percentile(visible, 0.99))
            seen = f"; claimable p50 {seen50s[-1]:.3f} s, p99 {seen99s[-1]:.3f} s"
        print(
            f"{label}, round {r + 1}: {len(late):,} ticks due at once, lateness p50 "
            f"{p50s[-1]:.3f} s, p99 {p99s[-1]:.3f} s, last {lasts[-1]:.3f} s{seen}",
            flush=True,
        )
        tick += timedelta(seconds=args.every)
    n = f"{count:,} due at once"
    out.add(f"{label}, {n}: p50 firing lateness", p50s, "s", higher_is_better=False)
    if label.startswith("PostgreSQL"):  # the bound is the fleet's (PostgreSQL)
        out.add(
            f"{label}, {n}: p99 firing lateness",
            p99s,
            "s",
            higher_is_better=False,
            anchor="limit",
            anchor_samples=1.0,
            target=1.0,
            note="issue 38: p99 <= 1 s with 10k schedules due in the same minute",
        )
    else:
        out.add(f"{label}, {n}: p99 firing lateness", p99s, "s", higher_is_better=False)
    out.add(f"{label}, {n}: last tick fired after", lasts, "s", higher_is_better=False)
    if seen99s:
        out.add(f"{label}, {n}: p50 lateness until claimable", seen50s, "s", higher_is_better=False)
        out.add(
            f"{label}, {n}: p99 lateness until claimable",
            seen99s,
            "s",
            higher_is_better=False,
            note="tick to the first poll (every 20 ms) that sees the dispatch committed",
        )


# ----------------------------------------------------------------------------- SQLite


async def _sqlite(args: argparse.Namespace, out: Collector) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'sched.db'}"
        async with open_store(url) as opened:
            assert isinstance(opened, SqliteStore)
            store = opened
            now = await store.store_now()
            tick = _tick_after(now, args.every)
            for s in _schedules(args.sqlite_schedules, args.every, tick):
                await store.put_schedule(s)  # grouped by the writer: quick
            task = firing_task(store, NoWake(), 1.0)
            task.start()
            try:
                loop = asyncio.get_running_loop()

                def measure(t: datetime, deadline: float) -> Late | None:
                    late = asyncio.run_coroutine_threadsafe(
                        _sqlite_lateness(store, t, args.sqlite_schedules, deadline), loop
                    ).result()
                    return None if late is None else (late, None)

                await asyncio.to_thread(
                    _rounds, out, "SQLite, 1 firer", args, args.sqlite_schedules, tick, measure
                )
            finally:
                task.signal.set()
                await task.stop()


async def _sqlite_lateness(
    store: SqliteStore, tick: datetime, count: int, deadline: float
) -> list[float] | None:
    label = tick.strftime("%Y-%m-%dT%H:%M:%S")
    sql = "SELECT created_at FROM dispatches WHERE dispatch_id LIKE ?"
    while time.monotonic() < deadline:
        rows: list[tuple[int]] = await store._read(
            lambda c: c.execute(sql, (f"sched:%:{label}%",)).fetchall()
        )
        if len(rows) >= count:
            await store._write(lambda c, _: c.execute("UPDATE dispatches SET status = 'done'"))
            start = tick.timestamp() * 1e6
            return [(r[0] - start) / 1e6 for r in rows]
        await asyncio.sleep(0.05)
    return None


# ----------------------------------------------------------------------------- firer


async def _fire(dsn: str) -> None:
    """A worker's firing loop alone, until SIGTERM."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with open_store(dsn) as store:
        task = firing_task(store, NoWake(), 1.0)
        task.start()
        await stop.wait()
        task.signal.set()
        await task.stop()


async def _migrate(dsn: str) -> None:
    async with open_store(dsn):
        pass


def run(args: argparse.Namespace) -> list[Result]:
    out = Collector("schedules")
    _postgres(args, out)
    if args.sqlite:
        asyncio.run(_sqlite(args, out))
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.schedules")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--schedules", type=int, default=10_000, help="schedules due at once")
    parser.add_argument("--firers", type=int, default=2, help="firing processes (PostgreSQL)")
    parser.add_argument("--rounds", type=int, default=2, help="ticks measured (due at once)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between ticks")
    parser.add_argument("--ab", type=int, default=2000, help="due now: batched vs one by one")
    parser.add_argument("--no-spread", dest="spread", action="store_false")
    parser.add_argument(
        "--sqlite-schedules", type=int, default=2000, help="schedules due at once (SQLite)"
    )
    parser.add_argument("--no-sqlite", dest="sqlite", action="store_false")
    parser.add_argument("--fire", metavar="DSN", help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.fire:
        asyncio.run(_fire(args.fire))
        return []
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
