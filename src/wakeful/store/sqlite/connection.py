"""One SQLite database file: its connections, the OS threads that use them, the pragmas, and
the translation of driver errors into wakeful's error hierarchy.

No ``sqlite3`` call runs on the event loop:

- one writer connection, used only by its own thread. Every write job runs inside a
  ``BEGIN IMMEDIATE`` transaction that holds SQLite's write lock from its first statement,
  so all of a job's checks and changes see one state no other connection (or process) can
  change underneath them. Jobs that queue up while a transaction runs are group-committed:
  those queued before its last job finished join it, the rest form the next transaction,
  which runs them one after another (a refused job rolls back only itself:
  a savepoint per job when one refused job had changed rows, ``_Writer._transaction``), and
  one ``COMMIT`` (one fsync of the WAL) makes them durable together. No job is
  acknowledged before that ``COMMIT`` returned. A store object belongs to the event loop
  that uses it (like every asyncio object);
- a small pool of reader connections, each used by one pool thread at a time; every read
  job is one read transaction, so it sees one consistent snapshot and never waits for the
  writer (WAL lets readers and one writer proceed together);
- one watch connection that only reads ``PRAGMA data_version`` for ``wait_events``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from wakeful.errors import (
    CorruptStore,
    InvalidInput,
    StoreClosed,
    StoreUnavailable,
    UnsupportedStore,
)
from wakeful.store.diskfull import NO_SPACE, full_disk
from wakeful.store.sqlite.migrations import Migration, migrate

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], T]

MAX_BATCH = 64
"""At most this many queued write jobs share one transaction."""


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A connection in autocommit mode (we issue ``BEGIN`` ourselves) with the per-connection
    pragmas. ``synchronous=FULL`` fsyncs the WAL at every commit, so an acknowledged write
    survives power loss, not only a process crash."""
    conn = sqlite3.connect(
        path,
        timeout=busy_timeout,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=256,
    )
    try:
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA temp_store = MEMORY")
    except BaseException:
        conn.close()
        raise
    return conn


def translate(exc: BaseException, path: str, busy_timeout: float) -> BaseException:
    """The domain error for a driver error; anything else is returned unchanged."""
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc):
            return StoreUnavailable(
                f"SQLite database {path} stayed locked by another connection for longer than "
                f"busy_timeout ({busy_timeout} s)"
            )
        if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
            return CorruptStore(path, None, None, f"SQLite reports {name}: {exc}")
        return StoreUnavailable(
            f"SQLite error on {path}: {exc} ({name or type(exc).__name__}){full_advice(exc)}"
        )
    if isinstance(exc, OverflowError):
        return InvalidInput("value", f"an integer is outside SQLite's 64-bit range: {exc}")
    return exc


def full_advice(exc: BaseException) -> str:
    """``"; <cause>: <action>"`` when ``exc`` says the disk is full (SQLite's
    ``SQLITE_FULL``, which its unix VFS reports for ``ENOSPC``, or an ``OSError`` with
    ``ENOSPC``/``EDQUOT``), else ``""``. (SQLite reports ``EDQUOT`` as a plain
    ``SQLITE_IOERR_WRITE``: its errno is not passed on.)"""
    name = getattr(exc, "sqlite_errorname", "") or ""
    advice = NO_SPACE if name.startswith("SQLITE_FULL") else full_disk(exc)
    return f"; {advice}" if advice else ""


@dataclass
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


def _deliver(outcomes: list[tuple[_Job, bool, Any]]) -> None:
    """Hand a batch's outcomes to their waiting callers (runs on their event loop)."""
    for job, ok, value in outcomes:
        if job.future.done():
            continue
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)


class _Writer:
    """The writer connection and its thread (see the module docstring).

    Jobs arrive in groups: everything the event loop submitted during one of its iterations
    is queued as one list, and the thread takes every queued group (up to ``MAX_BATCH`` jobs)
    into one transaction, and before its ``COMMIT`` the groups queued while it ran. Outcomes
    go back with one wake-up of each caller's event loop per transaction, so the callers
    resume together and their next writes form the next group.
    """

    def __init__(self, path: str, busy_timeout: float) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._queue: queue.SimpleQueue[list[_Job] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopping = False
        self._stop_seen = False
        # A daemon, so a store the program forgot to close cannot keep the interpreter alive;
        # a transaction cut short at exit is rolled back by SQLite, and nothing unfinished
        # was acknowledged.
        self._thread = threading.Thread(target=self._run, name="wakeful-sqlite-writer", daemon=True)
        self._conn: sqlite3.Connection | None = None
        self._setup: Callable[[sqlite3.Connection], Any] | None = None
        self.ready: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.transactions = 0
        """Write transactions committed (for benchmarks: each holds a group of writes)."""

    def start(self, setup: Callable[[sqlite3.Connection], Any]) -> None:
        self._setup = setup
        self._thread.start()

    def submit(self, jobs: list[_Job]) -> None:
        with self._lock:
            if self._stopping:
                raise StoreClosed()
            self._queue.put(jobs)

    def stop(self) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._queue.put(None)

    def join(self) -> None:
        if self._thread.is_alive():
            self._thread.join()

    def _error(self, exc: BaseException) -> BaseException:
        return translate(exc, self._path, self._busy_timeout)

    def _run(self) -> None:
        try:
            self._conn = connect(self._path, self._busy_timeout)
            assert self._setup is not None
            self.ready.set_result(self._setup(self._conn))
        except BaseException as exc:
            self.ready.set_exception(self._error(exc))
            self._shutdown()
            return
        while not self._stop_seen:
            group = self._queue.get()
            if group is None:
                break
            batch = list(group)
            self._take_queued(batch)
            self._run_batch(batch)
        self._shutdown()

    def _take_queued(self, batch: list[_Job]) -> bool:
        """Move the groups queued by now into ``batch`` (up to ``MAX_BATCH`` jobs) without
        waiting, skipping jobs whose caller stopped waiting; whether any job was added."""
        added = False
        while len(batch) < MAX_BATCH and not self._stop_seen:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                self._stop_seen = True
                break
            for job in more:
                if not job.future.cancelled():
                    batch.append(job)
                    added = True
        return added

    def _shutdown(self) -> None:
        # Jobs queued after the stop sentinel never run: fail them rather than leave their
        # callers waiting forever.
        while True:
            try:
                group = self._queue.get_nowait()
            except queue.Empty:
                break
            if group is not None:
                self._send([(job, False, StoreClosed()) for job in group])
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _send(self, outcomes: list[tuple[_Job, bool, Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, bool, Any]]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        for loop, mine in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the caller's loop is already closed
                loop.call_soon_threadsafe(_deliver, mine)

    def _run_batch(self, batch: list[_Job]) -> None:
        conn = self._conn
        assert conn is not None
        # A caller that stopped waiting before its job started does not get it run.
        jobs = [job for job in batch if not job.future.cancelled()]
        if not jobs:
            return
        outcomes = self._transaction(conn, jobs, isolate=False)
        if outcomes is None:
            # A refused job had already changed rows: run the group again from a clean
            # state, each job in its own savepoint so that a refusal rolls back only itself.
            outcomes = self._transaction(conn, jobs, isolate=True)
        assert outcomes is not None
        self._send(outcomes)

    def _transaction(
        self, conn: sqlite3.Connection, jobs: list[_Job], *, isolate: bool
    ) -> list[tuple[_Job, bool, Any]] | None:
        """Run ``jobs`` in one transaction and commit it; their outcomes.

        Without ``isolate`` (the first attempt) no job gets a savepoint: most refusals are
        raised by a job's checks before it writes anything, and a job that raised leaving
        ``total_changes`` as it was (and not through a driver error) changed nothing to roll
        back. When a refused job of a group did change rows, the transaction is rolled back
        whole and ``None`` returned, so that the caller runs the group again with
        ``isolate`` (a savepoint per job): no job's outcome is sent before its transaction
        committed, so running a job twice is running it once, later. This saves two
        statements per job of a group, i.e. two of the writer's GIL hand-offs."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            return [(job, False, self._error(exc)) for job in jobs]
        alone = len(jobs) == 1
        guard = isolate and not alone
        outcomes: list[tuple[_Job, bool, Any]] = []
        index = -1
        while True:
            index += 1
            if index == len(jobs):
                # Jobs queued while this group ran join it before its COMMIT, so that one
                # fsync serves more of them. Not on a rerun (it runs the same jobs), nor
                # after a lone job's refusal (the ROLLBACK below is what undoes it).
                if isolate or (alone and not outcomes[0][1]):
                    break
                if not self._take_queued(jobs):
                    break
                alone = False
            job = jobs[index]
            if guard:
                conn.execute("SAVEPOINT job")
            before = conn.total_changes
            try:
                result = job.fn(conn)
            except BaseException as exc:
                outcomes.append((job, False, self._error(exc)))
                if not conn.in_transaction:
                    # SQLite rolled the whole transaction back (I/O error, disk full):
                    # nothing of this batch was applied.
                    lost = StoreUnavailable(
                        f"a write to {self._path} was rolled back: {exc}{full_advice(exc)}"
                    )
                    outcomes = [(j, False, lost if ok else r) for j, ok, r in outcomes]
                    outcomes += [(j, False, lost) for j in jobs[index + 1 :]]
                    break
                if guard:
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                elif not alone and (conn.total_changes != before or isinstance(exc, sqlite3.Error)):
                    try:
                        conn.execute("ROLLBACK")
                    except BaseException as failed:  # nothing of the group is committed
                        lost = StoreUnavailable(
                            f"a write to {self._path} failed: {failed}{full_advice(failed)}"
                        )
                        return [(j, False, lost) for j in jobs]
                    return None
            else:
                if guard:
                    conn.execute("RELEASE job")
                outcomes.append((job, True, result))
        if conn.in_transaction:
            try:
                if alone and not outcomes[0][1]:
                    conn.execute("ROLLBACK")
                else:
                    conn.execute("COMMIT")
                    self.transactions += 1
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                outcomes = [(j, False, self._error(exc) if ok else r) for j, ok, r in outcomes]
        return outcomes


class _Readers:
    """Reader connections, created on demand, at most one per pool thread at a time."""

    def __init__(self, path: str, busy_timeout: float, size: int) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=size, thread_name_prefix="wakeful-sqlite-read"
        )
        self._idle: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one read transaction (called on a pool thread)."""
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            try:
                conn = connect(self._path, self._busy_timeout)
            except BaseException as exc:
                raise translate(exc, self._path, self._busy_timeout) from exc
            with self._lock:
                self._all.append(conn)
        try:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")
        except (sqlite3.Error, OverflowError) as exc:
            raise translate(exc, self._path, self._busy_timeout) from exc
        finally:
            self._idle.put(conn)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()


class Database:
    """One database file: ``write`` and ``read`` run a job on the right connection off the
    event loop; ``watch`` runs a job on the watch connection."""

    def __init__(self, path: str, url: str, busy_timeout: float, readers: int) -> None:
        self.path = path
        self.url = url
        self.busy_timeout = busy_timeout
        self._writer = _Writer(path, busy_timeout)
        self._readers = _Readers(path, busy_timeout, readers)
        self._watch_conn: sqlite3.Connection | None = None
        self._pending: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        self._closed = False

    @property
    def transactions(self) -> int:
        """Write transactions committed so far (each holds a group of writes)."""
        return self._writer.transactions

    @classmethod
    async def open(
        cls,
        path: str,
        url: str,
        *,
        busy_timeout: float,
        readers: int,
        migrations: list[Migration],
        now_us: Callable[[], int],
    ) -> Database:
        db = cls(path, url, busy_timeout, readers)

        def setup(conn: sqlite3.Connection) -> None:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise UnsupportedStore(
                    url,
                    f"SQLite could not switch {path} to WAL mode (it reports {mode!r}); the "
                    f"file must be on a local file system",
                )
            migrate(conn, url, migrations, now_us())

        db._writer.start(setup)
        try:
            await asyncio.wrap_future(db._writer.ready)
        except BaseException:
            await db.close()
            raise
        return db

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside a write transaction; returns once it is durable."""
        if self._closed:
            raise StoreClosed()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            # Writes submitted during this iteration of the loop go to the writer together.
            pending = self._pending[loop] = []
            loop.call_soon(self._flush, loop)
        pending.append(_Job(fn, loop, future))
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        jobs = self._pending.pop(loop, None)
        if not jobs:
            return
        try:
            self._writer.submit(jobs)
        except StoreClosed:
            _deliver([(job, False, StoreClosed()) for job in jobs])

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside one read transaction on a reader connection."""
        if self._closed:
            raise StoreClosed()
        try:
            future = self._readers.executor.submit(self._readers.run, fn)
        except RuntimeError:
            raise StoreClosed() from None
        return await asyncio.wrap_future(future)

    async def watch(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the watch connection (one caller at a time: the store's watcher)."""
        if self._closed:
            raise StoreClosed()

        def job() -> T:
            try:
                if self._watch_conn is None:
                    self._watch_conn = connect(self.path, self.busy_timeout)
                return fn(self._watch_conn)
            except (sqlite3.Error, OverflowError) as exc:
                raise translate(exc, self.path, self.busy_timeout) from exc

        try:
            future = self._readers.executor.submit(job)
        except RuntimeError:
            raise StoreClosed() from None
        return await asyncio.wrap_future(future)

    async def close(self) -> None:
        """Finish queued writes, then close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for loop in list(self._pending):
            self._flush(loop)
        self._writer.stop()
        await asyncio.to_thread(self._writer.join)
        await asyncio.to_thread(self._readers.close)
        if self._watch_conn is not None:
            self._watch_conn.close()
            self._watch_conn = None
