"""Inbox, outbox relay and stream checkpoints on PostgreSQL (DESIGN §3.4-§3.5).

The relay delivers one staged entry per transaction (the schema's ``relay_one``): append to
the target's inbox unless that ``message_id`` was ever delivered there, enqueue the target's
``message`` dispatch, delete the staged entry. A crash can only happen before or after that
transaction, so there is no half-delivered state to recover from; concurrent relays take
different entries (``SKIP LOCKED``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from wakeful.background import BackgroundTask, StopSignal
from wakeful.errors import StoreClosed, StreamCheckpointError, WakefulError
from wakeful.ids import check_count, check_id
from wakeful.records import InboxMessage, StreamCheckpoint
from wakeful.store import streamputs
from wakeful.store.postgres import codec
from wakeful.store.postgres.codec import Int8Array, TextArray, Utf8Array
from wakeful.store.postgres.connection import Database, big, utc
from wakeful.store.validate import check_discard

_INBOX = """
SELECT message_id, correlation_id, payload, revision, at, source_thread
  FROM @schema@.inbox WHERE thread_id = %s AND NOT consumed ORDER BY revision
"""
_RELAY_ONE = "SELECT @schema@.relay_one()"
# By run alone (the contract's get): stream_checkpoints_by_run. A run belongs to one thread,
# so this is one row; were one run id put from two threads (two rows, the key being
# (thread_id, run_id) since migration 0024), the newest is the run's checkpoint.
_STREAM_GET = """
SELECT body, updated_at FROM @schema@.stream_checkpoints WHERE run_id = %s
 ORDER BY updated_at DESC LIMIT 1
"""
_STREAM_PUTS = """
WITH async_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
SELECT @schema@.put_stream_checkpoint(t.run_id, t.thread_id, t.token, t.body, t.updated_at)
  FROM async_commit,
       unnest(%b::text[], %b::text[], %b::bigint[], %b::text[], %b::timestamptz[])
         WITH ORDINALITY AS t(run_id, thread_id, token, body, updated_at, n)
 ORDER BY t.n
"""
# Binary parameters (%b): psycopg escapes a text array in text format element by element
# with a regular expression (1.6 s of client CPU in a profile of the N = 1,000 benchmark).
MAX_PUTS = 500
"""Stream-checkpoint puts (or discards) written by one statement at most."""
_STREAM_DELETE = "DELETE FROM @schema@.stream_checkpoints WHERE run_id = %s"
# Each row's own condition (StreamCheckpointStore.discard): that turn's checkpoint, written
# under a token not above the discarding attempt's. task_id and token are in the body.
_STREAM_DISCARDS = """
WITH async_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM @schema@.stream_checkpoints s
 USING async_commit,
       unnest(%b::text[], %b::text[], %b::bigint[]) AS t(run_id, task_id, token)
 WHERE s.run_id = t.run_id
   AND s.body::jsonb ->> 'task_id' = t.task_id
   AND (s.body::jsonb ->> 'token')::bigint <= t.token
"""


class MessagingOps:
    """The inbox/outbox half of ``PostgresStore``."""

    _db: Database

    async def inbox(self, thread_id: str) -> list[InboxMessage]:
        check_id("thread_id", thread_id)
        rows = await self._db.fetchall(_INBOX, (thread_id,), idempotent=True)
        return [codec.inbox_message(row) for row in rows]

    async def relay_outbox(self, limit: int = 100) -> int:
        limit = check_count("limit", limit, minimum=1)
        handled = 0
        while handled < limit:
            (delivered,) = await self._db.fetchone(_RELAY_ONE, None)
            if not delivered:
                break
            handled += 1
        return handled


class PostgresStreamCheckpoints:
    """Stream checkpoints in a table, fenced by the thread's current claim. Every failure,
    storage included, is a ``StreamCheckpointError``.

    Puts are grouped, as the SQLite store groups its writes: a put waits in a queue, and one
    task writes everything queued with one statement (one transaction, one round trip, one
    pooled connection at a time), each row fenced on its own and answered on its own. So
    checkpoints of many runs never hold more than one connection, and the runs' commits
    (their ending commits above all) do not queue behind them. The transaction commits
    asynchronously (``synchronous_commit`` off, for it alone): a stream checkpoint is
    best-effort by contract, and only a crash of the server itself can lose an acknowledged
    one, which then costs a restarted stream, never conversation history. Discards (the
    end of every turn) are grouped the same way, by the same task, after the puts queued
    with them: many runs ending together cost a few statements, not one each."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._queue: list[streamputs.Queued] = []
        self._discards: list[tuple[tuple[str, str, int, int], asyncio.Future[None]]] = []
        """(run id, task id, token, the puts queued before it), in arrival order."""
        self._puts_queued = 0
        self._puts_written = 0
        """Puts ever queued and ever taken from the queue: a discard goes only after every put
        queued before it (one overtaking a put of its run would let that put land afterwards
        and leave a stream checkpoint behind a committed turn)."""
        self._writer: BackgroundTask | None = None
        self.statements = 0
        """Statements that wrote puts (for tests and benchmarks)."""
        self.discard_statements = 0
        """Statements that wrote discards (for tests and benchmarks)."""

    async def get(self, run_id: str) -> StreamCheckpoint | None:
        _checked_run_id(run_id)
        try:
            row = await self._db.fetchone(_STREAM_GET, (run_id,), idempotent=True)
        except Exception as exc:  # every failure is reported the one documented way
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc
        if row is None:
            return None
        checkpoint = codec.STREAM.decode(row[0])
        if checkpoint.updated_at is None:
            checkpoint = msgspec.structs.replace(checkpoint, updated_at=utc(row[1]))
        return checkpoint

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        await self.put_soon(checkpoint)

    def put_soon(self, checkpoint: StreamCheckpoint) -> asyncio.Future[None]:
        """``put`` as a future (``wakeful.store.streamputs``): validated and queued now,
        raising as ``put`` does; the future ends as the awaited ``put`` would."""
        done = streamputs.enqueue(self._queue, checkpoint, self._db.closed)
        self._puts_queued += 1
        self._start_writer()
        return done

    async def discard(self, run_id: str, task_id: str, token: int) -> None:
        check_discard(run_id, task_id, token)
        if self._db.closed:
            raise StreamCheckpointError(run_id, "storage", "the store is closed")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._discards.append(((run_id, task_id, big(token), self._puts_queued), done))
        self._start_writer()
        try:
            await done
        except Exception as exc:
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc

    def _start_writer(self) -> None:
        if self._writer is None or not self._writer.running:
            self._writer = BackgroundTask("wakeful-stream-puts", self._write)
            self._writer.start()

    async def _write(self, signal: StopSignal) -> None:
        """Write what is queued, batch after batch, until both queues are empty (or
        stopped: what is left then fails as the store closing)."""
        while (self._queue or self._discards) and not signal.is_set():
            if self._discards and self._discards[0][0][3] <= self._puts_written:
                await self._write_discards()
            elif self._queue:
                await self._write_puts()
        self._fail_queued()

    async def _write_puts(self) -> None:
        batch, self._queue = self._queue[:MAX_PUTS], self._queue[MAX_PUTS:]
        self._puts_written += len(batch)
        # Each row's fencing check locks its thread row: in thread id order, as grouped
        # renewals and commits do, so a batch never deadlocks with one of theirs (stable:
        # one run's puts keep their order).
        batch.sort(key=lambda item: item[0].checkpoint.thread_id)
        rows = [e.checkpoint for e, _ in batch]
        params = (
            TextArray([c.run_id for c in rows]),
            TextArray([c.thread_id for c in rows]),
            Int8Array([big(c.token) for c in rows]),
            Utf8Array([e.body for e, _ in batch]),
            [c.updated_at for c in rows],
        )
        try:
            found = await self._db.fetchall(_STREAM_PUTS, params)
        except Exception as exc:
            streamputs.fail(batch, exc)
            return
        self.statements += 1
        for item, (stored,) in zip(batch, found, strict=True):
            streamputs.answer(item, stored)

    async def _write_discards(self) -> None:
        ready = 0  # the discards whose earlier puts are all written (a prefix: arrival order)
        while ready < min(len(self._discards), MAX_PUTS):
            if self._discards[ready][0][3] > self._puts_written:
                break
            ready += 1
        batch, self._discards = self._discards[:ready], self._discards[ready:]
        keys = [key for key, _ in batch]
        params = (
            TextArray([k[0] for k in keys]),
            TextArray([k[1] for k in keys]),
            Int8Array([k[2] for k in keys]),
        )
        try:
            await self._db.execute(_STREAM_DISCARDS, params)
        except Exception as exc:
            _fail(batch, exc)
            return
        self.discard_statements += 1
        for _, done in batch:
            if not done.done():
                done.set_result(None)

    def _fail_queued(self) -> None:
        queued, self._queue = self._queue, []
        self._puts_written += len(queued)
        discards, self._discards = self._discards, []
        streamputs.fail(queued, StoreClosed())
        _fail(discards, StoreClosed())

    async def close(self) -> None:
        """Stop the writer (bounded, see ``wakeful.background``); queued puts fail."""
        if self._writer is not None:
            await self._writer.stop()
            self._writer = None
        self._fail_queued()

    async def delete(self, run_id: str) -> None:
        _checked_run_id(run_id)
        try:
            await self._db.execute(_STREAM_DELETE, (run_id,))
        except Exception as exc:
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc


def _fail(batch: list[tuple[Any, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, done in batch:
        if not done.done():
            done.set_exception(exc)


def _checked_run_id(run_id: str) -> str:
    try:
        return check_id("run_id", run_id)
    except WakefulError as exc:
        raise StreamCheckpointError(str(run_id)[:40], "invalid", str(exc)) from exc
