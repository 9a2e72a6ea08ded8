"""Group commit: the concurrent commits of one store sent together, in one round trip and
one transaction, each with its own fencing check and its own outcome.

A commit that finds nothing ahead of it goes out at once: at the event loop's next turn,
when the task that sends it first runs, together with the commits queued during the same
turn (runs woken by one event reach their commits in one turn), and alone, as one call of
``commit()``, if there are none (a sequential writer pays nothing for the grouping). While
``MAX_IN_FLIGHT`` calls are out, later commits wait in a queue; as soon as a call returns,
everything queued (up to ``MAX_BATCH``) goes out as one call of ``commit_many()``
(migration 0006). So the batch grows with the load by itself, and no commit ever waits for
a timer.

Inside ``commit_many`` (migration 0009) a batch of commits to distinct threads without
pending writes, messages, outbox entries or consumed inbox ids is judged and written
set-based, a fixed three statements per batch; any other batch runs each commit through
the same ``commit()`` as a single call, in a block of its own (a subtransaction). Either way
a refused commit writes nothing and comes back as its row's SQLSTATE and DETAIL (those
``commit()`` raises), which the caller raises as the contract's error (``StaleClaim``,
``VersionConflict``, ...), while the others are written. Everything else (a lost
connection, a deadlock, a bug) fails the whole call, so every commit in it fails the way a
single call would have: a transient error is retried by ``Database.run`` (the transaction
rolled back, nothing was written); ``StoreUnavailable`` reaches each caller, whose commit may
or may not have been applied, exactly as for a single call (retry with the same operation
id). Acknowledged means durable: each caller hears back only after the transaction that
holds its commit has committed.

A batch's commits are sent in thread id order (stable: commits to one thread keep their
order), so two processes' batches always lock thread rows in the same order and cannot
deadlock on each other. A caller that is cancelled while its commit is queued or out does
not withdraw it: like a single call cut off mid-flight, it may or may not be applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from wakeful.store.postgres.codec import ARRAYS, Int4Array, TextArray
from wakeful.store.postgres.connection import Conn, Database
from wakeful.store.postgres.translate import refused

MAX_BATCH = 32
"""Commits per ``commit_many`` call at most: a batch that takes the per-commit path runs each
in a subtransaction, and PostgreSQL keeps up to 64 of a transaction's subtransactions in
shared memory before every other session's snapshots get slower."""
MAX_IN_FLIGHT = 1
"""Commit calls of one store on the server at once; later commits queue for the next. One:
a set-based batch costs the server less per commit than single calls (decision 0022,
second round); with subtransactions per commit (version 6) two were better."""

_SCALARS_BEFORE = (
    "text",  # thread
    "int8",  # token
    "text",  # operation
    "text",  # payload hash
    "int8",  # expected version
    "text",  # checkpoint id
    "text",  # parent
    "text",  # tenant
    "text",  # status
    "text",  # checkpoint body
)
_LISTS = (3, 1, 2, 4, 1)
"""The list parameters after the scalars, in groups that share one count: writes (tasks,
checkpoints, bodies), events, messages (ids, bodies), outbox (ids, targets, correlations,
payloads), consumed inbox ids."""
_SCALARS_AFTER = ("bool", "text", "text", "float8", "text")
"""release, settled dispatch, its status, delay and error."""
_LIST_WIDTH = sum(_LISTS)


def _statement() -> str:
    args = [f"%b::{kind}[]" for kind in _SCALARS_BEFORE]
    for width in _LISTS:
        args.append("%b::int4[]")
        args.extend("%b::text[]" for _ in range(width))
    args.extend(f"%b::{kind}[]" for kind in _SCALARS_AFTER)
    return (
        "SELECT o_replayed, o_version, o_checkpoint, o_first_seq, o_event_count, o_code, "
        f"o_detail FROM @schema@.commit_many({', '.join(args)})"
    )


COMMIT_MANY = _statement()


def batch_params(batch: Sequence[Sequence[object]]) -> list[object]:
    """``commit_many``'s parameters for commits given as ``commit()``'s parameters (thread,
    token, then ``threads._COMMIT_ARGS``): one array per scalar, and each list (a
    ``TextArray`` or None) flattened beside its per-commit counts. A list parameter that is
    empty everywhere is NULL. Each array goes typed (``codec.PgArray``): psycopg dumps it in
    one pass."""
    columns = list(zip(*batch, strict=True))
    params: list[object] = [array(columns[i]) for i, array in enumerate(_BEFORE_ARRAYS)]
    at = len(_BEFORE_ARRAYS)
    for width in _LISTS:
        params.append(Int4Array([0 if v is None else len(v.items) for v in columns[at]]))
        for j in range(at, at + width):
            flat = [item for v in columns[j] if v is not None for item in v.items]
            params.append(TextArray(flat) if flat else None)
        at += width
    params.extend(array(columns[at + i]) for i, array in enumerate(_AFTER_ARRAYS))
    return params


_BEFORE_ARRAYS = tuple(ARRAYS[kind] for kind in _SCALARS_BEFORE)
_AFTER_ARRAYS = tuple(ARRAYS[kind] for kind in _SCALARS_AFTER)


class _Queued:
    __slots__ = ("future", "params")

    def __init__(self, params: Sequence[object], future: asyncio.Future[Any]) -> None:
        self.params = params
        self.future = future


class GroupCommit:
    """The store's commits (``commit()``'s statement ``single`` and its parameters), grouped
    while others are in flight (see the module)."""

    def __init__(self, db: Database, single: str) -> None:
        self._db = db
        self._single = single
        self._queue: list[_Queued] = []
        self._flights: set[asyncio.Task[None]] = set()
        self._starting: set[asyncio.Task[None]] = set()  # flights yet to take their batch
        self.batches = 0
        """``commit_many`` calls made (for tests and operations)."""
        self.grouped = 0
        """Commits sent in those calls."""

    async def commit(self, params: Sequence[object]) -> Any:
        """``commit()``'s output row for these parameters, or its refusal raised."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(params, future))
        self._launch()
        return await future

    def _launch(self) -> None:
        # A flight takes its batch when its task first runs (the loop's next turn), not
        # here: commits queued in the meantime (the other runs woken by the same event, each
        # reaching its commit in the same turn) go with it instead of waiting for it to land.
        while len(self._queue) > MAX_BATCH * len(self._starting) and (
            len(self._flights) < MAX_IN_FLIGHT
        ):
            flight = asyncio.get_running_loop().create_task(self._fly())
            self._flights.add(flight)
            self._starting.add(flight)
            flight.add_done_callback(self._landed)

    def _landed(self, flight: asyncio.Task[None]) -> None:
        self._flights.discard(flight)
        self._starting.discard(flight)  # (one cancelled before it ran)
        self._launch()

    async def _fly(self) -> None:
        self._starting.discard(asyncio.current_task())
        batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        if not batch:  # an earlier flight of the same turn took them all
            return
        try:
            if len(batch) == 1:
                row = await self._db.fetchone(self._single, batch[0].params)
                _resolve(batch[0].future, row)
                return
            batch.sort(key=lambda q: str(q.params[0]))  # lock order: thread id
            rows = await self._db.run(_many(self._db.sql(COMMIT_MANY), batch))
            self.batches += 1
            self.grouped += len(batch)
        except BaseException as exc:  # every commit of the call fails the same way
            for queued in batch:
                if not queued.future.done():
                    queued.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for queued, (*row, code, detail) in zip(batch, rows, strict=True):
            if code is None:
                _resolve(queued.future, tuple(row))
            elif not queued.future.done():
                error = refused(code, detail)
                assert error is not None  # commit_many only reports WK refusals
                queued.future.set_exception(error)

    async def close(self) -> None:
        """Wait for the calls in flight (and the commits queued behind them)."""
        while self._flights:
            await asyncio.gather(*self._flights, return_exceptions=True)


def _many(query: str, batch: list[_Queued]) -> Any:
    params = batch_params([q.params for q in batch])

    async def op(conn: Conn) -> list[Any]:
        cur = await conn.execute(query, params)
        return await cur.fetchall()

    return op


def _resolve(future: asyncio.Future[Any], row: Any) -> None:
    if not future.done():
        future.set_result(row)
