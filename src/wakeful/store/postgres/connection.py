"""The connection pool, the schema's rendered statements, and running a call with the
driver's errors translated and transient conflicts retried.

Every store operation is one call of ``Database.run`` with one short function of a pooled
connection: one statement (most writes are one call of a schema function, so one round trip
and one transaction) or a few reads. Connections are in autocommit mode; a statement is its
own transaction.

A transaction over several round trips (``Database.transaction``: a commit with
``drop_checkpoints``, the migrations, every call on a caller's pool that is not in
autocommit) first bounds itself with ``SET LOCAL idle_in_transaction_session_timeout``: a
client paused, hung or cut off between two of its statements would otherwise sit ``idle in
transaction`` holding its row locks for as long as the pause lasts, and every claim of the
thread would wait behind it. ``SET LOCAL`` (not a session ``SET`` or a startup option) so that
the bound holds behind PgBouncer in transaction mode, which neither passes startup options
nor keeps a session's settings on one server connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import random
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from wakeful.errors import InvalidInput, StoreClosed, StoreUnavailable
from wakeful.store.postgres import pooler
from wakeful.store.postgres.translate import (
    connect_error,
    is_disconnect,
    is_transient,
    refusal,
    unavailable,
)

T = TypeVar("T")
Conn = psycopg.AsyncConnection[TupleRow]
Params = Sequence[Any] | Mapping[str, Any] | None

DEFAULT_SCHEMA = "wakeful"
MAX_TRANSIENT_RETRIES = 8
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT = 5.0
"""Seconds a transaction of the store may sit idle between two of its statements before the
server ends the session (and with it the transaction and its locks): see ``bound_idle``."""
_BOUND_IDLE = "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,47}")


ROTATE_AFTER = 30.0
"""Seconds an idle pooled connection may go unused before the pool hands it out ahead of the
most recently used one, so that no connection goes stale behind a busy one."""


class WarmPool(psycopg_pool.AsyncConnectionPool[Conn]):
    """psycopg_pool's pool, handing out the most recently used idle connection first.

    psycopg_pool takes idle connections round robin, so a sequential caller meets a
    different server process at every call, each with cold caches: with 16 connections a
    sequential commit measured about 1,150 µs against about 790 µs on the warm one. Here the
    connection used last goes out again, unless the least recently used one has been idle for
    more than ``ROTATE_AFTER`` seconds (or was never handed out): that one goes first. So
    while there is traffic, every connection still carries a call about every
    ``ROTATE_AFTER`` seconds, and none sits unused for long behind a busy one (where a
    firewall's idle timeout could cut it unnoticed).

    This overrides ``_get_ready_connection``, an internal of psycopg_pool (3.2 and 3.3: it
    runs under the pool's lock and takes ``_pool[0]``). Should a later version change that,
    the override reorders nothing and the pool keeps its own order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handed_out: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()

    async def _get_ready_connection(self, timeout: float | None) -> Conn | None:
        idle = getattr(self, "_pool", None)
        now = time.monotonic()
        if isinstance(idle, collections.deque) and len(idle) > 1:
            coldest = self._handed_out.get(idle[0])
            if coldest is not None and now - coldest <= ROTATE_AFTER:
                idle.rotate(1)  # the most recently returned connection to the front
        conn = await super()._get_ready_connection(timeout)
        if conn is not None:
            self._handed_out[conn] = now
        return conn


def check_schema(schema: object) -> str:
    """A schema name: lower-case letters, digits and ``_``, at most 48 characters, not
    starting with a digit or ``pg_``. Quoted with ``psycopg.sql.Identifier`` wherever used."""
    if not isinstance(schema, str) or _SCHEMA.fullmatch(schema) is None:
        raise InvalidInput(
            "schema", f"{str(schema)[:60]!r} must match [a-z_][a-z0-9_]* (at most 48 characters)"
        )
    if schema.startswith("pg_"):
        raise InvalidInput("schema", "names starting with pg_ are reserved by PostgreSQL")
    return schema


def channel_name(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which commits of ``schema`` announce their thread."""
    return f"wakeful:{schema}"


def render(template: str, conn: Conn | None, schema: str) -> str:
    """``template`` with ``@schema@`` and ``@channel@`` filled in, properly quoted."""
    ident = sql.Identifier(schema).as_string(conn)
    channel = sql.Literal(channel_name(schema)).as_string(conn)
    return template.replace("@schema@", ident).replace("@channel@", channel)


def no_nul(field: str, value: str) -> str:
    """``value``, refused if it holds NUL: free text is stored in a ``text`` column as is,
    and PostgreSQL text cannot hold NUL characters (JSON escapes them)."""
    if "\x00" in value:
        raise InvalidInput(field, "must not contain NUL characters")
    return value


async def bound_idle(conn: Conn, seconds: float) -> None:
    """Bound the transaction ``conn`` is in: if the client leaves it idle (between two
    statements) for more than ``seconds``, the server terminates the session, which rolls the
    transaction back and releases its locks; the client's next statement then fails with
    SQLSTATE 25P03 (``StoreUnavailable``). ``SET LOCAL``: it ends with the transaction and
    never leaks into a session a pooler hands to someone else. ``0`` leaves the server's
    setting alone."""
    if seconds > 0:
        await conn.execute(_BOUND_IDLE, (f"{max(1, math.ceil(seconds * 1000))}ms",))


def utc(value: datetime) -> datetime:
    """A timestamptz from the driver (in the session's time zone) as UTC."""
    return value.astimezone(UTC)


def utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def big(value: int) -> int:
    """``value`` if it fits a bigint, else -1 (a token or version that never matches)."""
    return value if value < 2**63 else -1


REFUSAL_RETRIES = (0.2, 0.5, 1.0)
"""Pauses before trying again when a reached server refused the session: a refusal that
outlasts them is reported as permanent (``StoreRefused``)."""


async def probe(conninfo: str, timeout: float) -> None:
    """Open and close one connection before a pool is opened, so that a server that cannot
    be reached, or refuses the login, is reported once with its reason (``StoreUnavailable``
    or ``StoreRefused``) instead of after the pool's retries, one log line each."""
    for delay in (*REFUSAL_RETRIES, None):
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(conninfo, autocommit=True), timeout
            )
        except (psycopg.Error, TimeoutError) as exc:
            reached = await server_reachable(conninfo, timeout)
            if reached and delay is not None:
                # a server at its connection limit or starting up refuses for a moment only
                await asyncio.sleep(delay)
                continue
            raise connect_error(exc, describe_server(conninfo), reached) from None
        await conn.close()
        return


def describe_server(conninfo: str) -> str:
    """``host:port/dbname`` of ``conninfo``, without credentials."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "PostgreSQL (unparseable URL)"
    host = params.get("host") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    return f"PostgreSQL at {host}:{port}/{params.get('dbname') or ''}"


async def server_reachable(conninfo: str, timeout: float) -> bool:
    """Whether any server named by ``conninfo`` accepts a TCP or Unix socket connection."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return False
    hosts = str(params.get("host") or os.environ.get("PGHOST") or "").split(",")
    ports = str(params.get("port") or os.environ.get("PGPORT") or "5432").split(",")
    for i, host in enumerate(hosts):
        port = ports[i] if i < len(ports) else ports[-1]
        try:
            if not host or host.startswith("/"):
                path = f"{host or '/var/run/postgresql'}/.s.PGSQL.{port}"
                opening = asyncio.open_unix_connection(path)
            else:
                opening = asyncio.open_connection(host, int(port))
            _, writer = await asyncio.wait_for(opening, min(timeout, 5.0))
        except (OSError, TimeoutError, ValueError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


class Database:
    """A pool of connections to one schema. ``run`` is the only way statements are sent."""

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Conn],
        *,
        owns_pool: bool,
        schema: str,
        conninfo: str,
        timeout: float,
        idle_timeout: float = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
    ) -> None:
        self.pool = pool
        self.owns_pool = owns_pool
        self.schema = schema
        self.conninfo = conninfo
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        """Seconds a transaction of several round trips may sit idle (``bound_idle``)."""
        self.closed = False
        self.pooler: pooler.Pooler | None = None
        """What sits between the store and the server, found at opening (``None``: a
        caller's pool, not probed)."""
        self._sql: dict[str, str] = {}
        self._pool_check: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls,
        conninfo: str,
        *,
        schema: str,
        pool: psycopg_pool.AsyncConnectionPool[Any] | None,
        pool_size: int,
        pool_min_size: int | None,
        timeout: float,
        idle_timeout: float = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
        prepare_threshold: int | str | None = "auto",
    ) -> Database:
        """Open a pool of ``pool_size`` connections (``pool_min_size`` kept open), or use the
        caller's ``pool``, which is then never closed by the store. ``prepare_threshold``:
        psycopg's (executions before a statement is prepared on the server; ``None``:
        never); ``"auto"``: never behind a transaction pooler (``pooler.detect``), else
        psycopg's default."""
        if pool is not None:
            return cls(
                pool,
                owns_pool=False,
                schema=schema,
                conninfo=conninfo,
                timeout=timeout,
                idle_timeout=idle_timeout,
            )
        await probe(conninfo, timeout)
        try:
            found = await pooler.detect(conninfo, timeout)
        except (psycopg.Error, TimeoutError):  # a hint only: the pool's own errors follow
            found = pooler.Pooler(pooler.UNKNOWN, None, None)
        kwargs: dict[str, Any] = {"autocommit": True}
        if prepare_threshold == "auto":
            if found.transaction_pooling:
                kwargs["prepare_threshold"] = None
        else:
            kwargs["prepare_threshold"] = prepare_threshold
        min_size = pool_size if pool_min_size is None else pool_min_size
        owned: psycopg_pool.AsyncConnectionPool[Conn] = WarmPool(
            conninfo,
            min_size=min_size,
            max_size=pool_size,
            open=False,
            timeout=timeout,
            name=f"wakeful-{schema}",
            kwargs=kwargs,
        )
        try:
            await owned.open(wait=True, timeout=timeout)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            await owned.close()
            raise StoreUnavailable(
                f"PostgreSQL did not accept connections within {timeout} s ({exc})"
            ) from exc
        db = cls(
            owned,
            owns_pool=True,
            schema=schema,
            conninfo=conninfo,
            timeout=timeout,
            idle_timeout=idle_timeout,
        )
        db.pooler = found
        return db

    def sql(self, template: str) -> str:
        """The statement for ``template`` in this schema (rendered once, then cached)."""
        found = self._sql.get(template)
        if found is None:
            found = self._sql[template] = render(template, None, self.schema)
        return found

    async def run(self, op: Callable[[Conn], Awaitable[T]], *, idempotent: bool = False) -> T:
        """Run ``op`` on a pooled connection and translate what the driver raises.

        A transient conflict (deadlock, serialization failure, lost unique race) rolled the
        transaction back, so ``op`` runs again, up to ``MAX_TRANSIENT_RETRIES`` times. A
        lost connection is ``StoreUnavailable``; an ``idempotent`` op (a read) is first tried
        once more on another connection, since the pool may have handed out one that died
        while idle (after a server restart)."""
        transient = reconnects = 0
        while True:
            if self.closed:
                raise StoreClosed()
            try:
                if not self.owns_pool:  # a caller's pool may hand out connections not in
                    # autocommit: the connection's context commits what op did
                    async with self.connection() as conn:
                        return await op(conn)
                # The store's own autocommit connections: getconn/putconn, without the
                # connection's context, whose exit is a commit() (a lock and a wait) with
                # nothing to do; putconn still rolls back or closes a connection that a
                # failed op left in a transaction or mid-statement.
                conn = await self.pool.getconn(timeout=self.timeout)
                try:
                    return await op(conn)
                finally:
                    await self.pool.putconn(conn)
            except psycopg_pool.PoolClosed as exc:
                if self.closed:
                    raise StoreClosed() from None
                raise unavailable(exc) from exc
            except psycopg.Error as exc:
                refused = refusal(exc)
                if refused is not None:
                    raise refused from None
                if is_transient(exc):
                    transient += 1
                    if transient > MAX_TRANSIENT_RETRIES:
                        raise unavailable(exc) from exc
                    await asyncio.sleep(random.uniform(0, 0.002 * 2**transient))
                    continue
                if not is_disconnect(exc):
                    raise
                self._recheck_pool()
                if idempotent and reconnects == 0 and not isinstance(exc, psycopg_pool.PoolTimeout):
                    reconnects += 1
                    continue
                raise unavailable(exc) from exc

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A pooled connection in the pool's context, which commits at the exit what was
        done on it. On a connection not in autocommit (a caller's pool) what is done and
        that COMMIT are two round trips of one transaction: it is bounded first
        (``bound_idle``)."""
        async with self.pool.connection(timeout=self.timeout) as conn:
            if not conn.autocommit:
                await bound_idle(conn, self.idle_timeout)
            yield conn

    @contextlib.asynccontextmanager
    async def transaction(self, conn: Conn) -> AsyncIterator[None]:
        """A transaction of several round trips on ``conn``, bounded by ``bound_idle``."""
        async with conn.transaction():
            await bound_idle(conn, self.idle_timeout)
            yield

    async def fetchone(self, template: str, params: Params, *, idempotent: bool = False) -> Any:
        """The first row of one statement, or ``None``."""
        query = self.sql(template)

        async def op(conn: Conn) -> Any:
            cur = await conn.execute(query, params)
            return await cur.fetchone()

        return await self.run(op, idempotent=idempotent)

    async def fetchall(
        self, template: str, params: Params, *, idempotent: bool = False
    ) -> list[TupleRow]:
        query = self.sql(template)

        async def op(conn: Conn) -> list[TupleRow]:
            cur = await conn.execute(query, params)
            return await cur.fetchall()

        return await self.run(op, idempotent=idempotent)

    async def execute(self, template: str, params: Params) -> int:
        """Run one statement; returns its row count."""
        query = self.sql(template)

        async def op(conn: Conn) -> int:
            cur = await conn.execute(query, params)
            return cur.rowcount

        return await self.run(op)

    def _recheck_pool(self) -> None:
        """After a lost connection, test the idle ones in the background so that a restarted
        server costs one failed call per store, not one per pooled connection."""
        if self._pool_check is None or self._pool_check.done():
            self._pool_check = asyncio.get_running_loop().create_task(self._check())

    async def _check(self) -> None:
        try:
            await self.pool.check()
        except Exception:  # the pool reconnects on its own; this was only a hint
            return

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._pool_check is not None and not self._pool_check.done():
            self._pool_check.cancel()
            await asyncio.gather(self._pool_check, return_exceptions=True)
        if self.owns_pool:
            await self.pool.close()
