"""``FileStore``: the whole store contract over an in-memory projection, persisted to an
fsynced, group-committed log.

Durability and visibility: every mutation is applied to the projection first (planning and
applying happen without an ``await``, which is what makes each operation atomic), then its
log line joins the pending batch. One flusher task hands each batch to the store's IO thread,
which writes it and fsyncs once; only then does any caller of that batch get its answer and
only then are ``wait_events`` waiters woken. A reader in the same process may therefore
briefly see a mutation whose fsync is still pending; nothing is acknowledged before it is
durable.

If an append cannot be made durable (``EIO``, ``ENOSPC``, ...) the store truncates the log
back to its last durable length, rebuilds the projection from disk and fails every caller
of that batch, and of every record applied after it, with ``StoreUnavailable``; those
mutations are not visible afterwards nor after a reopen. Until the rebuild has succeeded
every operation raises ``StoreUnavailable`` (a later call retries the rebuild), so no reader
sees a mutation that failed.

Before each append (and each compaction) the IO thread checks that the root's lock file is
still the one this store locked (``RootLock.verify``, one ``stat``). If it was removed or
replaced, the store writes nothing more: that batch and everything after it fail with
``StoreUnavailable`` and so does every later operation, until the store is closed and the
root opened again (decision 0033).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from wakeful.clock import Clock
from wakeful.errors import StoreUnavailable
from wakeful.store.buckets import ProcessBuckets
from wakeful.store.diskfull import full_disk
from wakeful.store.file.chain import encode_committed, encode_mutation
from wakeful.store.file.codec import STREAM_DIR
from wakeful.store.file.iothread import IOThread
from wakeful.store.file.lock import LockLost, RootLock
from wakeful.store.file.root import Compaction, Loaded, load_root
from wakeful.store.file.snapshot import encode_state
from wakeful.store.file.stream import FileStreamCheckpoints
from wakeful.store.memory import InjectedCrash
from wakeful.store.projected import ProjectedStore
from wakeful.store.projection import Committed, Mutation, State

logger = logging.getLogger("wakeful.store.file")

DEFAULT_COMPACT_BYTES = 64 * 1024 * 1024

_Waiter = asyncio.Future[None]
_R = TypeVar("_R")


@dataclasses.dataclass(frozen=True)
class LogStats:
    """Counters since open: ``appends`` batches written (one fsync each) holding ``records``
    records and ``bytes`` bytes; ``compactions`` done; the current log ``generation`` and
    its durable ``log_size``."""

    appends: int
    records: int
    bytes: int
    compactions: int
    generation: int
    log_size: int


class FileStore(ProjectedStore, ProcessBuckets):
    """A store in one directory, owned by one opener at a time. Open it with
    ``open_store("file:///abs/dir")``. ``crash_at(point)`` arms a one-shot injected crash
    for tests: ``relay.after_append``, ``log.after_write``, ``log.after_fsync`` and every
    name in ``wakeful.store.file.root.COMPACTION_STEPS``. A crash inside the log machinery
    stops the store as if its process had died: no further IO, every waiting caller gets
    the ``InjectedCrash``; close it and open the root again."""

    def __init__(
        self,
        root: Path,
        lock: RootLock,
        loaded: Loaded,
        clock: Clock | None = None,
        compact_bytes: int | None = DEFAULT_COMPACT_BYTES,
    ) -> None:
        super().__init__(clock)
        self._root = root
        self._lock = lock
        self._state = loaded.state
        self._log = loaded.writer
        self._log.fault = self._fault
        self._snapshot_size = loaded.snapshot_size
        self._compact_bytes = compact_bytes
        self._compact_floor = 0
        self._io = IOThread(f"wakeful-file-store:{root}")
        self._pending: list[tuple[bytes, _Waiter]] = []
        self._inflight: list[_Waiter] = []
        self._compact_waiters: list[_Waiter] = []
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._reloading: asyncio.Task[bool] | None = None
        self._broken: str | None = None
        self._dead: InjectedCrash | None = None
        self._lost: str | None = None
        self._released = False
        self._armed: set[str] = set()
        self._armed_lock = threading.Lock()
        self._counts = [0, 0, 0, 0]  # appends, records, bytes, compactions
        self._stream = FileStreamCheckpoints(self, root / STREAM_DIR)

    # ------------------------------------------------------------ public extras

    @property
    def root(self) -> Path:
        return self._root

    @property
    def stream_checkpoints(self) -> FileStreamCheckpoints:
        return self._stream

    @property
    def stats(self) -> LogStats:
        appends, records, size, compactions = self._counts
        return LogStats(appends, records, size, compactions, self._log.generation, self._log.size)

    async def compact(self) -> None:
        """Write a snapshot of the whole state and start a fresh log, now. Waits for it.
        Raises ``StoreUnavailable`` if it failed (nothing acknowledged is lost then)."""
        self._open()
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        self._compact_waiters.append(waiter)
        self._kick()
        await waiter

    def crash_at(self, point: str) -> None:
        with self._armed_lock:
            self._armed.add(point)

    async def delete_thread(self, thread_id: str) -> None:
        """Also removes the thread's stream checkpoints."""
        await super().delete_thread(thread_id)
        try:
            await self._stream.drop_thread(thread_id)
        except OSError as exc:
            advice = full_disk(exc) or "the disk must be writable"
            raise StoreUnavailable(
                f"thread {thread_id!r} was deleted but its stream checkpoints could not be "
                f"removed ({exc}); {advice}, then call delete_thread again"
            ) from exc

    async def close(self) -> None:
        """Refuse new operations, let pending records reach the disk (their callers get their
        answers), then release the log, the IO thread and the lock. Idempotent."""
        await super().close()
        self._stream.close()
        if self._flusher is not None and self._dead is None:
            self._wake.set()
            with contextlib.suppress(Exception):
                await self._flusher
        if self._reloading is not None:
            await self._reloading
        if not self._released:
            self._released = True
            try:
                if self._io.started:
                    await self._io.run(self._log.close)
                else:  # nothing was ever written: no IO can be in flight
                    self._log.close()
            except OSError as exc:
                logger.warning("%s: closing the log failed: %s", self._root, exc)
            self._io.stop()
            self._lock.release()

    # ------------------------------------------------------------ ProjectedStore hooks

    def _fault(self, point: str) -> None:
        if not self._armed:  # the common case, twice per append: no lock needed to see it
            return
        with self._armed_lock:
            if point not in self._armed:
                return
            self._armed.discard(point)
        raise InjectedCrash(point)

    def _open(self) -> State:
        state = super()._open()
        if self._dead is not None:
            raise StoreUnavailable(
                f"the file store at {self._root} stopped at an injected crash ({self._dead}); "
                f"close it and open the root again"
            )
        if self._lost is not None:
            raise StoreUnavailable(self._lost)
        if self._broken is not None:
            self._start_reload()
            raise StoreUnavailable(self._broken)
        return state

    async def _persist(self, record: Mutation) -> None:
        await self._enqueue(encode_mutation(record))

    async def _persist_commit(self, record: Committed, commit_body: bytes) -> None:
        await self._enqueue(encode_committed(record, commit_body))

    async def _enqueue(self, body: bytes) -> None:
        # This runs right after the record was applied, before any other task: the pending
        # order is the apply order, which is the order replay needs.
        # A live flusher runs on the running loop (one store serves one loop: its wake-up
        # event binds to it), so its loop spares a get_running_loop (a getpid system call).
        flusher = self._flusher
        loop = (
            flusher.get_loop()
            if flusher is not None and not flusher.done()
            else asyncio.get_running_loop()
        )
        waiter: _Waiter = loop.create_future()
        self._pending.append((body, waiter))
        self._kick()
        await waiter

    # ------------------------------------------------------------ group commit

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush_loop(), name=f"wakeful-file-flusher:{self._root}"
            )
        self._wake.set()

    async def _flush_loop(self) -> None:
        """The only writer: takes everything pending as one batch, one write and one fsync,
        then acknowledges the whole batch; repeats while there is work."""
        try:
            await self._flush_until_closed()
        except Exception as exc:  # a bug; still, no caller may be left waiting forever
            logger.exception("%s: the log flusher failed", self._root)
            victims, self._inflight = self._inflight + self._compact_waiters, []
            self._compact_waiters = []
            await self._recover(victims, exc, "write the commit log")

    async def _flush_until_closed(self) -> None:
        while self._dead is None and self._lost is None:
            compact = self._compaction_due()
            if not self._pending and not compact:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._pending = self._pending, []
            self._inflight = [w for _, w in batch]
            requesters: list[_Waiter] = []
            body = None
            if compact:
                # The state is now exactly what is durable plus this batch, and nothing
                # reaches the log until the switch is over: the snapshot holds no more and
                # no less than the log it replaces once the batch is written.
                requesters, self._compact_waiters = self._compact_waiters, []
                self._inflight += requesters
                body = encode_state(self._state)
            if batch and not await self._append(batch):
                _fail(requesters, lambda: StoreUnavailable("compaction skipped: an append failed"))
            elif body is not None:
                await self._compact(body, requesters)
            self._inflight = []
        lost = self._lost
        _fail(
            [w for _, w in self._pending],
            lambda: _crash(self._dead) if lost is None else StoreUnavailable(lost),
        )
        self._pending = []

    def _compaction_due(self) -> bool:
        if self._broken is not None or self._dead is not None or self._lost is not None:
            return False
        if self._compact_waiters:
            return True
        if self._compact_bytes is None or self._closed:
            return False
        threshold = max(self._compact_bytes, self._snapshot_size, self._compact_floor)
        return self._log.size >= threshold

    async def _append(self, batch: list[tuple[bytes, _Waiter]]) -> bool:
        bodies = [body for body, _ in batch]
        waiters = [w for _, w in batch]

        def durable(written: int) -> None:
            # Runs on the loop in the callback that delivers the IO thread's success: the
            # batch is durable, so its callers are answered there and then. A sequential
            # caller's next commit is then pending when this task resumes, and goes to the
            # IO thread in the same loop iteration (two iterations per commit, not four).
            self._counts[0] += 1
            self._counts[1] += len(batch)
            self._counts[2] += written
            _succeed(waiters)

        try:
            # Chained and framed here, on the loop (the log does not move while no append is
            # in flight, and this task is the only one that appends): the IO thread then
            # holds the GIL only around its system calls, instead of for the chaining of a
            # whole batch while the loop validates the next one (16 writers: 11-26 % less
            # CPU per commit; a sequential commit did not change; decision 0005).
            log, loop = self._log, self._flusher.get_loop() if self._flusher else None
            write = functools.partial(log.write, log.prepare(bodies))
            await self._io.run(functools.partial(self._locked, write), durable, loop)
        except InjectedCrash as crash:
            self._die(crash, waiters)
            return False
        except LockLost as lost:
            self._lose(lost, waiters)
            return False
        except Exception as exc:
            await self._recover(waiters, exc, "append to the commit log")
            return False
        return True

    def _locked(self, write: Callable[[], _R]) -> _R:
        """``write()`` once the lock file is verified to be ours (on the IO thread)."""
        self._lock.verify()
        return write()

    async def _compact(self, body: bytes, requesters: list[_Waiter]) -> None:
        compaction = Compaction(self._root, body, self._log.generation + 1, self._fault)
        try:
            writer = await self._io.run(functools.partial(self._locked, compaction.run))
        except InjectedCrash as crash:
            self._die(crash, requesters)
            return
        except LockLost as lost:
            self._lose(lost, requesters)
            return
        except Exception as exc:
            if compaction.committed:
                # The new snapshot is installed: the old log must never be appended to again,
                # so rebuild from disk (which finishes the switch) as after a failed append.
                await self._recover([], exc, "switch to the compacted log")
            else:
                logger.warning("%s: compaction failed, the log is unchanged: %s", self._root, exc)
                self._compact_floor = self._log.size + (self._compact_bytes or 0)
            advice = full_disk(exc)
            detail = f"compaction of {self._root} failed ({exc})" + (
                f"; {advice} (nothing acknowledged is lost; the log grows until a compaction "
                f"succeeds)"
                if advice
                else ""
            )
            _fail(requesters, lambda: StoreUnavailable(detail))
            return
        old, self._log = self._log, writer
        self._snapshot_size = len(body)
        self._compact_floor = writer.size + 1  # never again before the next append
        self._counts[3] += 1
        try:
            await self._io.run(old.close)
        except OSError as exc:
            logger.warning("%s: closing the previous log failed: %s", self._root, exc)
        logger.info("%s: compacted into snapshot generation %d", self._root, writer.generation)
        _succeed(requesters)

    # ------------------------------------------------------------ failures

    async def _recover(self, victims: list[_Waiter], exc: Exception, action: str) -> None:
        """An append (or log switch) failed: fail ``victims`` and everything applied after
        them, once the log is cut back and the projection rebuilt from disk."""
        victims = victims + [w for _, w in self._pending]
        self._pending = []
        advice = full_disk(exc)
        remedy = (
            f"{advice[0].upper()}{advice[1:]}"
            if advice
            else "Restore writable disk space or permissions"
        )
        detail = (
            f"could not {action} durably at {self._root} ({exc}); the mutation was not "
            f"applied and will not appear after a reopen. {remedy}, then retry through the "
            f"caller's normal commit policy"
        )
        self._broken = detail
        logger.error("%s: %s", self._root, detail)
        await self._start_reload()
        _fail(victims, lambda: StoreUnavailable(detail))

    def _start_reload(self) -> asyncio.Task[bool]:
        if self._reloading is None or self._reloading.done():
            self._reloading = asyncio.get_running_loop().create_task(self._reload())
        return self._reloading

    async def _reload(self) -> bool:
        """Cut the log back to its durable length and rebuild the projection from disk, in
        place (tasks holding the ``State`` object see the rebuilt one). False (and the store
        stays unavailable) if the disk still fails; a later operation retries."""
        old = self._log

        def work() -> Loaded:
            self._lock.verify()
            if not old.closed:
                old.truncate_to_durable()
                old.close()
            return load_root(self._root, self._fault)

        try:
            loaded = await self._io.run(work)
        except LockLost as lost:
            self._lose(lost, [])
            return False
        except Exception as exc:
            logger.error("%s: rebuilding from disk failed, will retry: %s", self._root, exc)
            return False
        for f in dataclasses.fields(State):
            setattr(self._state, f.name, getattr(loaded.state, f.name))
        self._log = loaded.writer
        self._snapshot_size = loaded.snapshot_size
        self._broken = None
        logger.warning("%s: rebuilt the projection from disk", self._root)
        return True

    def _die(self, crash: InjectedCrash, victims: list[_Waiter]) -> None:
        """An injected crash inside the log machinery: behave like a dead process (no more
        IO, nothing cleaned up); every waiting caller gets the crash."""
        self._dead = crash
        victims = victims + [w for _, w in self._pending] + self._compact_waiters
        self._pending, self._compact_waiters = [], []
        logger.error("%s: stopped at injected crash %s", self._root, crash)
        _fail(victims, lambda: _crash(crash))

    def _lose(self, lost: LockLost, victims: list[_Waiter]) -> None:
        """The lock file was removed or replaced: write nothing more (another opener may own
        the root now); every waiting caller, and every later operation, is refused."""
        self._lost = (
            f"{lost}; this store stopped writing so that two owners never append to one log "
            f"(a mutation it could not write is not applied). Never remove the lock file of "
            f"an open store: close this store and open the root again"
        )
        victims = victims + [w for _, w in self._pending] + self._compact_waiters
        self._pending, self._compact_waiters = [], []
        self._broken = None
        logger.error("%s: %s", self._root, self._lost)
        detail = self._lost
        _fail(victims, lambda: StoreUnavailable(detail))


def _crash(crash: InjectedCrash | None) -> InjectedCrash:
    return InjectedCrash(*(crash.args if crash is not None else ("crashed",)))


def _succeed(waiters: list[_Waiter]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


def _fail(waiters: list[_Waiter], error: Callable[[], BaseException]) -> None:
    """Fail each of ``waiters`` with a fresh exception from ``error``."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(error())
