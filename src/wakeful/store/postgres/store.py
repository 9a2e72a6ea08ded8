"""``PostgresStore``: the whole store contract over PostgreSQL, for a fleet of hosts.

Time is the server's: claims, leases, availability and retention are judged by
``<schema>.store_now()``, which is ``now()``, the start of the writing transaction. The
``clock`` argument of ``open_store`` is accepted and ignored.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, Self

import psycopg_pool

from wakeful.clock import Clock
from wakeful.errors import UnsupportedStore
from wakeful.ids import check_count, check_seconds
from wakeful.records import Event
from wakeful.store.postgres import migrations, serverinfo
from wakeful.store.postgres.connection import (
    DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
    DEFAULT_SCHEMA,
    Conn,
    Database,
    channel_name,
    check_schema,
    utc,
)
from wakeful.store.postgres.firing import FiringOps
from wakeful.store.postgres.group import GroupCommit
from wakeful.store.postgres.limits import LimitOps
from wakeful.store.postgres.listen import Listener
from wakeful.store.postgres.messaging import MessagingOps, PostgresStreamCheckpoints
from wakeful.store.postgres.notify import Notifier
from wakeful.store.postgres.pooler import Pooler
from wakeful.store.postgres.queue import QueueOps
from wakeful.store.postgres.renewals import GroupRenew
from wakeful.store.postgres.schedules import ScheduleOps
from wakeful.store.postgres.serverinfo import ServerReport
from wakeful.store.postgres.threads import COMMIT, ThreadOps

DEFAULT_POOL_SIZE = 10
DEFAULT_POOL_TIMEOUT = 10.0
DEFAULT_POLL_INTERVAL = 1.0
OPTIONS = (
    "pool",
    "pool_size",
    "pool_min_size",
    "pool_timeout",
    "schema",
    "migrate",
    "poll_interval",
    "idle_in_transaction_timeout",
    "wake_url",
    "prepare_threshold",
)


class PostgresStore(ThreadOps, QueueOps, MessagingOps, LimitOps, ScheduleOps, FiringOps):
    """The store contract (``wakeful.store.contract.Store``) on PostgreSQL. Open it with
    ``open_store("postgresql://...")`` or ``open_postgres_store``."""

    def __init__(
        self,
        db: Database,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        wake_url: str | None = None,
    ) -> None:
        self._db = db
        self._poll_interval = poll_interval
        # LISTEN needs a session of its own: behind a transaction pooler only a direct URL
        # can carry it; without one, wait_events polls (pooler.py).
        pooled = db.pooler is not None and db.pooler.transaction_pooling
        self._listener = Listener(
            wake_url or db.conninfo,
            channel_name(db.schema),
            enabled=wake_url is not None or not pooled,
        )
        self._notifier = Notifier(db, channel_name(db.schema), local=self._listener.wake)
        self._stream = PostgresStreamCheckpoints(db)
        self._group = GroupCommit(db, COMMIT)
        self._renewals = GroupRenew(db)

    @property
    def schema(self) -> str:
        return self._db.schema

    @property
    def closed(self) -> bool:
        return self._db.closed

    @property
    def conninfo(self) -> str:
        """The URL or DSN the store was opened with (it may hold credentials)."""
        return self._db.conninfo

    @property
    def pooler(self) -> Pooler | None:
        """What opening found between the store and the server (``None`` with a caller's
        pool): ``pooler.mode`` is ``none``, ``session`` or ``transaction``."""
        return self._db.pooler

    @property
    def stream_checkpoints(self) -> PostgresStreamCheckpoints:
        return self._stream

    @property
    def group_commit(self) -> GroupCommit:
        """Concurrent commits sent together (for operations and tests)."""
        return self._group

    @property
    def listener(self) -> Listener:
        """The LISTEN connection behind ``wait_events`` (for operations and tests)."""
        return self._listener

    @property
    def notifier(self) -> Notifier:
        """The task that sends this store's notifications (for operations and tests)."""
        return self._notifier

    async def clock_now(self) -> datetime:
        """The store's clock: what ``store_now()`` reads on the server right now."""
        row = await self._db.fetchone("SELECT @schema@.store_now()", None, idempotent=True)
        return utc(row[0])

    async def server_report(self) -> ServerReport:
        """The server's role, replication, the pooler found at opening and the clock skew
        between this host and the server (``serverinfo``; one statement)."""
        mode = self._db.pooler.mode if self._db.pooler is not None else "unknown"

        async def op(conn: Conn) -> ServerReport:
            return await serverinfo.inspect(conn, mode, self._listener.enabled)

        return await self._db.run(op, idempotent=True)

    async def wait_events(
        self, thread_id: str, after_seq: int = 0, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        """``events_after``, or wait for a commit through any store on this database
        (LISTEN/NOTIFY, sent after each commit; a commit through this store wakes at once),
        re-checking by seq at least every ``poll_interval`` seconds."""
        timeout = check_seconds("timeout", timeout, allow_zero=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        found = await self.events_after(thread_id, after_seq, limit)
        if found or timeout == 0:
            return found
        # Listening before the next check means no commit after it can go unheard.
        await self._listener.ready(min(timeout, self._poll_interval))
        while True:
            waiter = self._listener.subscribe(thread_id)
            try:
                if self._db.closed:
                    return []
                found = await self.events_after(thread_id, after_seq, limit)
                remaining = deadline - loop.time()
                if found or remaining <= 0:
                    return found
                await asyncio.wait({waiter}, timeout=min(remaining, self._poll_interval))
            finally:
                self._listener.unsubscribe(thread_id, waiter)

    async def close(self) -> None:
        """Send what is still to be notified (best effort, bounded), stop listening and close
        the pool (unless the caller passed it in). Idempotent."""
        await self._group.close()
        await self._renewals.close()
        await self._notifier.close()
        await self._stream.close()
        await self._listener.close()
        await self._db.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_postgres_store(
    url: str,
    *,
    clock: Clock | None = None,
    pool: psycopg_pool.AsyncConnectionPool[Any] | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    pool_min_size: int | None = None,
    pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    schema: str = DEFAULT_SCHEMA,
    migrate: bool = True,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    idle_in_transaction_timeout: float = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
    wake_url: str | None = None,
    prepare_threshold: int | str | None = "auto",
    **unknown: object,
) -> PostgresStore:
    """Open the store in ``schema`` of the database at ``url`` (a libpq URL or DSN).

    - ``pool``: use this ``psycopg_pool.AsyncConnectionPool`` (autocommit connections
      recommended) instead of opening one; the store never closes it.
    - ``pool_size`` / ``pool_min_size``: the store's own pool (``pool_min_size`` connections
      kept open, default all of them).
    - ``pool_timeout``: seconds to wait for a connection before ``StoreUnavailable``.
    - ``migrate``: apply pending migrations (under an advisory lock) before use; with
      ``False`` a schema that is not at the latest version is refused.
    - ``poll_interval``: ``wait_events`` re-checks at least this often, whatever
      LISTEN/NOTIFY does.
    - ``idle_in_transaction_timeout``: seconds a transaction of several round trips (a
      commit with ``drop_checkpoints``, the migrations, any call on a ``pool`` that is not in
      autocommit) may sit idle before the server ends its session and releases its locks
      (``SET LOCAL idle_in_transaction_session_timeout``); ``0`` leaves the server's setting.
    - ``wake_url``: the URL of the LISTEN connection behind ``wait_events`` (default: ``url``).
      Behind a transaction pooler (PgBouncer's ``pool_mode = transaction``) give the server's
      own address here: a pooler cannot carry LISTEN. Without it there, ``wait_events`` polls.
    - ``prepare_threshold``: psycopg's, for the store's own pool (``None``: never prepare);
      ``"auto"`` (default) turns preparing off when opening finds a transaction pooler.

    ``clock`` is ignored: time is the server's ``now()``.
    """
    del clock  # the server's clock judges time
    if unknown:
        raise UnsupportedStore(
            migrations.describe(url),
            f"unknown option(s) {sorted(unknown)}; the PostgreSQL store takes {OPTIONS}",
        )
    schema = check_schema(schema)
    poll_interval = check_seconds("poll_interval", poll_interval)
    idle_in_transaction_timeout = check_seconds(
        "idle_in_transaction_timeout", idle_in_transaction_timeout, allow_zero=True
    )
    pool_timeout = check_seconds("pool_timeout", pool_timeout)
    if wake_url is not None and not isinstance(wake_url, str):
        raise UnsupportedStore(migrations.describe(url), "wake_url must be a PostgreSQL URL")
    if prepare_threshold != "auto" and prepare_threshold is not None:
        prepare_threshold = check_count("prepare_threshold", prepare_threshold, maximum=10**6)
    pool_size = check_count("pool_size", pool_size, minimum=1, maximum=1000)
    if pool_min_size is not None:
        pool_min_size = check_count("pool_min_size", pool_min_size, maximum=pool_size)
    db = await Database.connect(
        url,
        schema=schema,
        pool=pool,
        pool_size=pool_size,
        pool_min_size=pool_min_size,
        timeout=pool_timeout,
        idle_timeout=idle_in_transaction_timeout,
        prepare_threshold=prepare_threshold,
    )
    try:

        async def prepare(conn: Conn) -> int:
            if migrate:
                return await migrations.apply(conn, schema, url, idle_in_transaction_timeout)
            return await migrations.check(conn, schema, url)

        await db.run(prepare)
    except BaseException:
        await db.close()
        raise
    return PostgresStore(db, poll_interval=poll_interval, wake_url=wake_url)


__all__ = ["PostgresStore", "open_postgres_store"]
