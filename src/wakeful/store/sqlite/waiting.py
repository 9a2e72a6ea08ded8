"""Waking ``wait_events`` callers for commits made anywhere on the database file.

Commits through the same store object wake their waiters at once (``notify``). Commits by
any other connection (a sibling store object, another process) are seen by polling
``PRAGMA data_version`` on a dedicated connection every ``interval`` seconds, and only
while somebody waits: the pragma's value changes whenever another connection committed.
When it changed (or a waiter just arrived), one query reads the last event number of each
awaited thread, and the waiters whose thread has events past their cursor are woken. The
check is on state, not on edges, so a commit racing a waiter's registration cannot be
missed: it is seen by the next poll at the latest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3

from wakeful.errors import WakefulError
from wakeful.store.sqlite import reads
from wakeful.store.sqlite.connection import Database

_CHUNK = 500


class Watcher:
    def __init__(self, db: Database, interval: float) -> None:
        self._db = db
        self._interval = interval
        self._waiters: dict[str, dict[asyncio.Future[None], int]] = {}
        self._fresh = False
        self._task: asyncio.Task[None] | None = None

    def register(self, thread_id: str, after_seq: int) -> asyncio.Future[None]:
        """A future that completes once the thread (probably) has events after ``after_seq``;
        ``forget`` it when done waiting."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(thread_id, {})[future] = after_seq
        self._fresh = True
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name="wakeful-sqlite-watch")
        return future

    def forget(self, thread_id: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(thread_id)
        if waiters is not None:
            waiters.pop(future, None)
            if not waiters:
                del self._waiters[thread_id]

    def notify(self, thread_id: str) -> None:
        """Wake every waiter on ``thread_id`` (a commit through this store just landed)."""
        for future in self._waiters.get(thread_id, {}):
            if not future.done():
                future.set_result(None)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._waiters.clear()

    async def _run(self) -> None:
        version: int | None = None
        while self._waiters:
            if not self._fresh:
                await asyncio.sleep(self._interval)
                if not self._waiters:
                    return
            force, self._fresh = self._fresh, False
            thread_ids = list(self._waiters)
            try:
                version, heads = await self._db.watch(
                    functools.partial(_poll, version=version, force=force, thread_ids=thread_ids)
                )
            except WakefulError:
                # The store is closing or the file is unreachable for a moment: waiters
                # still return at their timeout, and the next poll tries again.
                await asyncio.sleep(self._interval)
                continue
            for thread_id, last_seq in heads.items():
                for future, after_seq in self._waiters.get(thread_id, {}).items():
                    if last_seq > after_seq and not future.done():
                        future.set_result(None)


def _poll(
    conn: sqlite3.Connection, version: int | None, force: bool, thread_ids: list[str]
) -> tuple[int, dict[str, int]]:
    now = int(conn.execute("PRAGMA data_version").fetchone()[0])
    if now == version and not force:
        return now, {}
    heads: dict[str, int] = {}
    for start in range(0, len(thread_ids), _CHUNK):
        heads.update(reads.last_seqs(conn, thread_ids[start : start + _CHUNK]))
    return now, heads
