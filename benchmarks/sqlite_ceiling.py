"""The fastest fenced group commit SQLite allows in this stack: the bound of the 8-writer
target (``benchmarks.sqlite_store``, issue 22, decision 0022).

``sqlite_store`` measures wakeful's commits from 8 concurrent writers against
``SqliteSaver.put`` from 8 threads. Each writer waits for its commit to be durable before it
makes the next, so at most 8 commits can share a transaction's fsync, and SQLite holds its one
write lock through that fsync: nothing can write while a group is made durable. What any store
must then spend per group is its statements inside the lock, one fsync, and (with ``sqlite3``
kept off the event loop, as the stack requires) a hand-off to the writer thread and one back.

``OffLoopCeiling`` does exactly that and nothing more, in the shape every such store has: 8
asyncio tasks each encode a checkpoint (msgspec), queue it with a future and await it; the
writes of one event-loop iteration go to a writer thread as one group; the thread runs, in one
``BEGIN IMMEDIATE`` transaction, for each commit the three statements a fenced commit cannot do
without (read the thread's claim token and head, refuse a stale token, insert the checkpoint
keyed by position and by id, move the head), commits with ``synchronous=FULL`` and wakes the
loop once. No validation, no events, receipts, tenants, run segments or error translation, and
narrower rows than wakeful's: it does less than a store that keeps the contract, so its rate is
an upper bound on any such store's.

``OffLoopCeiling(validation=...)`` adds a check of each commit before it is queued:

- ``"types"``: the least check of a commit's types there is (one msgspec encode and one
  typed decode of the ``Commit``; no NaN or infinity check, no id checks, no sizes), the
  checkpoint's JSON encoded on its own so that the writer parses nothing;
- ``"contract"``: what the contract makes every store do to a commit it is handed before it may
  write it, as wakeful does it (``encode_commit``: types, ids, sizes, no NaN or infinity,
  depth), the checkpoint's JSON then cut from that one encoding on the writer thread, as the
  store does.

``OnLoopCeiling`` runs the same statements on the event loop's own thread, 8 per transaction,
with no hand-off: what the 8 writers would get if the loop blocked on SQLite (the stack forbids
it: every fsync would stall every other task of the process). It shows what the hand-off costs.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from benchmarks.common import bench_checkpoint
from wakeful.records import Checkpoint, Commit
from wakeful.store.validate import EncodedCommit, encode_commit

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS threads (thread_id TEXT PRIMARY KEY, token INTEGER, "
    "version INTEGER NOT NULL, latest_pos INTEGER NOT NULL, latest_id TEXT)",
    "CREATE TABLE IF NOT EXISTS checkpoints (thread_id TEXT NOT NULL, pos INTEGER NOT NULL, "
    "checkpoint_id TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (thread_id, pos), "
    "UNIQUE (thread_id, checkpoint_id))",
)
_HEAD = "SELECT token, version, latest_pos FROM threads WHERE thread_id = ?"
_INSERT = "INSERT INTO checkpoints (thread_id, pos, checkpoint_id, body) VALUES (?, ?, ?, ?)"
_MOVE = "UPDATE threads SET version = ?, latest_pos = ?, latest_id = ? WHERE thread_id = ?"
_TOKEN = 1

_encode = msgspec.json.Encoder().encode
_COMMIT = msgspec.json.Decoder(Commit)

Validation = Literal["none", "types", "contract"]


class StaleToken(Exception):
    """The thread's claim token is not the commit's (never raised by the benchmark's own
    writers: the check is there because a fenced commit must make it)."""


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    for statement in _SCHEMA:
        conn.execute(statement)
    return conn


def _commit(conn: sqlite3.Connection, thread_id: str, checkpoint_id: str, body: str) -> None:
    """One fenced commit's statements (inside the caller's transaction)."""
    token, version, pos = conn.execute(_HEAD, (thread_id,)).fetchone()
    if token != _TOKEN:
        raise StaleToken(thread_id)
    conn.execute(_INSERT, (thread_id, pos + 1, checkpoint_id, body))
    conn.execute(_MOVE, (version + 1, pos + 1, checkpoint_id, thread_id))


def _add_threads(conn: sqlite3.Connection, names: list[str]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO threads (thread_id, token, version, latest_pos) VALUES (?, ?, 0, 0)",
        [(name, _TOKEN) for name in names],
    )
    conn.execute("COMMIT")


_Item = tuple[str, str, "str | EncodedCommit", "asyncio.Future[None]"]


def _deliver(outcomes: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    for future, error in outcomes:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _plain(thread_id: str, cp: Checkpoint) -> str:
    return _encode(cp).decode()


def _typed(thread_id: str, cp: Checkpoint) -> str:
    _COMMIT.decode(_encode(Commit(token=_TOKEN, checkpoint=cp)))
    return _encode(cp).decode()


def _contract(thread_id: str, cp: Checkpoint) -> EncodedCommit:
    return encode_commit(thread_id, Commit(token=_TOKEN, checkpoint=cp))


_BODIES: dict[Validation, Callable[[str, Checkpoint], str | EncodedCommit]] = {
    "none": _plain,
    "types": _typed,
    "contract": _contract,
}


class OffLoopCeiling:
    """The minimal fenced group commit with ``sqlite3`` on a writer thread (module docstring)."""

    def __init__(self, path: Path, *, validation: Validation = "none") -> None:
        self._conn = _connect(path)
        self._body = _BODIES[validation]

    def close(self) -> None:
        self._conn.close()

    def _writer(self, groups: queue.SimpleQueue[list[_Item] | None]) -> None:
        conn = self._conn
        while (group := groups.get()) is not None:
            loop = group[0][3].get_loop()
            try:
                outcomes = self._transaction(conn, group)
            except BaseException as exc:  # a driver error fails the group, loudly, not a hang
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                outcomes = [(future, exc) for _, _, _, future in group]
            loop.call_soon_threadsafe(_deliver, outcomes)

    @staticmethod
    def _transaction(
        conn: sqlite3.Connection, group: list[_Item]
    ) -> list[tuple[asyncio.Future[None], BaseException | None]]:
        outcomes: list[tuple[asyncio.Future[None], BaseException | None]] = []
        conn.execute("BEGIN IMMEDIATE")
        for thread_id, checkpoint_id, body, future in group:
            if isinstance(body, EncodedCommit):
                text = body.checkpoint_text()
                assert text is not None
                body = text
            try:
                _commit(conn, thread_id, checkpoint_id, body)
            except StaleToken as exc:  # raised before it wrote: nothing to roll back
                outcomes.append((future, exc))
            else:
                outcomes.append((future, None))
        conn.execute("COMMIT")
        return outcomes

    async def seconds(self, tag: str, writers: int, each: int, state: dict[str, Any]) -> float:
        """Seconds for ``writers`` tasks each making ``each`` commits to its own thread."""
        names = [f"{tag}-{w}" for w in range(writers)]
        _add_threads(self._conn, names)
        groups: queue.SimpleQueue[list[_Item] | None] = queue.SimpleQueue()
        thread = threading.Thread(target=self._writer, args=(groups,), daemon=True)
        thread.start()
        loop = asyncio.get_running_loop()
        pending: list[_Item] = []

        def flush() -> None:
            groups.put(pending[:])
            pending.clear()

        make_body = self._body

        async def commits(thread_id: str) -> None:
            parent = None
            for _ in range(each):
                cp = bench_checkpoint(parent, state)
                body = make_body(thread_id, cp)
                future: asyncio.Future[None] = loop.create_future()
                if not pending:
                    loop.call_soon(flush)
                pending.append((thread_id, cp.id, body, future))
                await future
                parent = cp.id

        try:
            start = time.perf_counter()
            await asyncio.gather(*(commits(name) for name in names))
            return time.perf_counter() - start
        finally:
            groups.put(None)
            await asyncio.to_thread(thread.join)


class OnLoopCeiling:
    """The same statements on the calling thread, ``writers`` commits a transaction."""

    def __init__(self, path: Path) -> None:
        self._conn = _connect(path)

    def close(self) -> None:
        self._conn.close()

    async def seconds(self, tag: str, writers: int, each: int, state: dict[str, Any]) -> float:
        """As ``OffLoopCeiling.seconds``, every statement and fsync blocking the event loop."""
        names = [f"{tag}-{w}" for w in range(writers)]
        _add_threads(self._conn, names)
        conn = self._conn
        parents: list[str | None] = [None] * writers
        start = time.perf_counter()
        for _ in range(each):
            conn.execute("BEGIN IMMEDIATE")
            for w, name in enumerate(names):
                cp = bench_checkpoint(parents[w], state)
                _commit(conn, name, cp.id, _encode(cp).decode())
                parents[w] = cp.id
            conn.execute("COMMIT")
        return time.perf_counter() - start


Ceiling = OffLoopCeiling | OnLoopCeiling

CEILINGS: tuple[tuple[str, str, str, str], ...] = (
    (
        "ceiling",
        "fenced group commit ceiling, {w} writers, off the event loop",
        "fenced group commit ceiling, {w} writers",
        "raw sqlite3, 3 statements a commit, 8 a fsync: an upper bound on any fenced store",
    ),
    (
        "typed",
        "the same ceiling with each commit's types checked (encode, typed decode), {w} writers",
        "  the same, commits' types checked",
        "the least check of a commit's types there is: no NaN, id or size checks",
    ),
    (
        "validated",
        "the same ceiling with each commit validated (encode_commit), {w} writers",
        "  the same, commits validated as the contract asks",
        "what the contract makes every store do with a commit before it may write it",
    ),
    (
        "on-loop",
        "the same ceiling on the event loop (not allowed: blocks the loop), {w} writers",
        "  the same on the event loop (not allowed)",
        "",
    ),
)
"""Each ceiling's key, its result's name and its printed label (``{w}``: the writers), and
its result's note."""


def open_ceilings(directory: Path) -> dict[str, Ceiling]:
    """Every ceiling of ``CEILINGS`` by key, each on its own file in ``directory``."""
    return {
        "ceiling": OffLoopCeiling(directory / "ceiling-off-loop.db"),
        "typed": OffLoopCeiling(directory / "ceiling-typed.db", validation="types"),
        "validated": OffLoopCeiling(directory / "ceiling-validated.db", validation="contract"),
        "on-loop": OnLoopCeiling(directory / "ceiling-on-loop.db"),
    }
