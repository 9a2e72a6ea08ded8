"""``WakefulSaver``: LangGraph's ``BaseCheckpointSaver`` over any wakeful store.

Storage: each LangGraph thread is the wakeful thread of the same id (``codec``); each saver
mutation is one fenced, atomic wakeful commit appending one record (``index``), except that
``put`` and ``put_writes`` calls arriving together share one (``appends``). Reads fold
the records into a ``ThreadIndex`` kept per thread (least recently used first out) and
trusted while this saver holds the thread's claim; otherwise one ``read`` tells whether it
is still current and only newer records are fetched.

Fencing (``fencing=``): ``"auto"`` (default) claims a thread when a run starts and keeps the
claim renewed while the thread is in use; ``"hold"`` writes only inside ``saver.hold``;
``"off"`` claims and releases inside every write (one atomic step), for a single process.
In every mode a write prepared against a view of the thread another writer has changed since
is refused with ``VersionConflict``: histories of two processes never interleave; and a run
started while another run of this process (another task or thread) is in the thread gets
``ThreadBusy`` (``runs``). ``delete_for_runs``, ``copy_thread`` and ``prune`` live in
``maintenance``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from wakeful.errors import InvalidInput, InvalidState, StaleClaim, VersionConflict
from wakeful.ids import check_id
from wakeful.langgraph.appends import Append, Appends, Batch, fail
from wakeful.langgraph.bridge import LoopThread
from wakeful.langgraph.codec import ValueCodec, store_thread_id, valid_id
from wakeful.langgraph.fencing import FencingAPI
from wakeful.langgraph.holds import Holds, default_holder, not_held
from wakeful.langgraph.index import (
    PAGE,
    Entry,
    ThreadIndex,
    catch_up,
    given,
    record_state,
    write_items,
)
from wakeful.langgraph.maintenance import Built
from wakeful.langgraph.runs import RUN_MARKER, Owner, RunDisplaced, Runs, pregel_loop
from wakeful.langgraph.tickets import interrupt_tickets
from wakeful.langgraph.tuples import checkpoint_tuple
from wakeful.records import Checkpoint as Record
from wakeful.records import Claim, Commit
from wakeful.store import open_store
from wakeful.store.contract import Store
from wakeful.store.listing import is_internal_thread

Fencing = Literal["auto", "hold", "off"]
LOCK_STRIPES = 256


class WakefulSaver(FencingAPI):
    """A LangGraph checkpointer with wakeful's guarantees: fenced writers, atomic fsynced
    commits, recovery after a crash. Use it as ``graph.compile(checkpointer=saver)``."""

    def __init__(
        self,
        store: Store,
        *,
        fencing: Fencing = "auto",
        holder: str | None = None,
        ttl: float = 30.0,
        renew_every: float = 10.0,
        idle_release: float = 30.0,
        serde: SerializerProtocol | None = None,
        allow_pickle: bool = False,
        cache_threads: int = 256,
    ) -> None:
        """``store``: any wakeful store (``open_store``). ``fencing``: see the module doc.
        ``holder``: the name other processes see in ``ThreadBusy``. ``ttl`` and
        ``renew_every``: the claim's lease and its renewal period. ``idle_release``: how
        long an automatic claim outlives the last saver call on its thread. ``serde``:
        LangGraph's serializer protocol (default ``JsonPlusSerializer`` without pickle;
        plain JSON values are then stored as themselves). ``allow_pickle``: accept the
        ``pickle`` type from a serializer that falls back to it (off: such values are
        refused; without ``serde`` it makes the default serializer fall back to pickle).
        ``cache_threads``: how many thread indexes stay in memory."""
        plain_json = serde is None
        if serde is None and allow_pickle:
            serde = JsonPlusSerializer(pickle_fallback=True)
        super().__init__(serde=serde)
        if fencing not in ("auto", "hold", "off"):
            raise InvalidInput("fencing", "must be 'auto', 'hold' or 'off'")
        self.store = store
        self.fencing: Fencing = fencing
        self.holder = check_id("holder", holder or default_holder())
        self.codec = ValueCodec(self.serde, plain_json=plain_json, allow_pickle=allow_pickle)
        self._holds = Holds(store, ttl, renew_every, idle_release)
        self._runs = Runs(self.holder, idle_release, cache_threads)
        self._appends = Appends(self._flush)
        self._build_writes = functools.partial(write_items, self.codec.encode)  # made once
        self._cache: OrderedDict[str, ThreadIndex] = OrderedDict()
        self._fenced: dict[str, StaleClaim | VersionConflict] = {}
        """Threads whose run was fenced: writes raise this until a new run starts."""
        self._tenants: dict[str, str] = {}
        """The tenant of threads written under an adopted claim (``adopt``): their records
        name it (a tenant's thread takes only checkpoints of its tenant)."""
        self._cache_threads = max(1, cache_threads)
        self._locks: list[asyncio.Lock] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owned_store = False
        self._loop_thread: LoopThread | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------ opening

    @classmethod
    @asynccontextmanager
    async def from_url(cls, url: str, **options: Any) -> AsyncIterator[WakefulSaver]:
        """``async with WakefulSaver.from_url("sqlite:///app.db") as saver``: opens the
        store (any URL ``open_store`` takes), and on exit releases the saver's claims and
        closes the store. ``options`` are the constructor's, plus ``clock``."""
        clock = options.pop("clock", None)
        async with open_store(url, clock=clock) as store:
            saver = cls(store, **options)
            try:
                yield saver
            finally:
                await saver.aclose()

    @classmethod
    @contextmanager
    def from_url_sync(cls, url: str, **options: Any) -> Iterator[WakefulSaver]:
        """``with WakefulSaver.from_url_sync(url) as saver``: for synchronous programs
        (``graph.invoke``); the store runs on an event loop in a background thread."""
        runner = LoopThread()
        try:
            saver = runner.call(cls._open_owned(url, options))
            saver._loop_thread = runner
            try:
                yield saver
            finally:
                runner.call(saver.aclose())
        finally:
            runner.stop()

    @classmethod
    async def _open_owned(cls, url: str, options: dict[str, Any]) -> WakefulSaver:
        clock = options.pop("clock", None)
        store = await open_store(url, clock=clock)
        saver = cls(store, **options)
        saver._owned_store = True
        return saver

    async def aclose(self) -> None:
        """Release every claim this saver holds (and close the store if it opened it)."""
        await self._holds.release_all()
        if self._owned_store:
            await self.store.close()

    # ------------------------------------------------------------ async API

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        run = RUN_MARKER in config["configurable"]
        return await self._get_tuple(config, asyncio.current_task(), run and pregel_loop(1))

    async def _get_tuple(
        self, config: RunnableConfig, owner: Owner, loop: Any
    ) -> CheckpointTuple | None:
        """``aget_tuple`` for a caller ``owner`` (the task of ``ainvoke``, the thread of a
        synchronous ``invoke``): a graph run's first read starts the run (``runs``);
        ``loop``: LangGraph's loop that made the read, if found."""
        conf = config["configurable"]
        thread = self._bind(store_thread_id(conf["thread_id"]))
        ns = conf.get("checkpoint_ns", "")
        if RUN_MARKER in conf:
            await self._run_starts(conf["thread_id"], thread, (conf[RUN_MARKER], owner, loop), ns)
        idx = await self._view(thread)
        # ``latest`` names every namespace's newest checkpoint, even in a partial index
        checkpoint_id = get_checkpoint_id(config) or idx.latest.get(ns)
        if not checkpoint_id or idx.foreign:
            return None
        entry = idx.checkpoints.get((ns, checkpoint_id))
        if entry is None and not idx.complete:  # an older checkpoint: fold the whole thread
            idx = await self._complete(thread)
            entry = idx.checkpoints.get((ns, checkpoint_id))
        if entry is None:
            return None
        return self._tuple(conf["thread_id"], idx, entry)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        conf = config["configurable"] if config else {}
        ns = conf.get("checkpoint_ns")
        if ns and RUN_MARKER in conf:
            # A subgraph's first read of a replay (LangGraph's ``ReplayState``) is a
            # ``list`` of its namespace, not a ``get_tuple``: it joins the run all the same,
            # or its writes would be refused as another run's.
            lg_thread = conf["thread_id"]
            run = (conf[RUN_MARKER], asyncio.current_task(), None)
            await self._run_starts(lg_thread, self._bind(store_thread_id(lg_thread)), run, ns)
        only_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        async for lg_thread, idx in self._threads(conf.get("thread_id")):
            keys = sorted(idx.checkpoints, key=lambda k: k[1], reverse=True)
            for key in keys:
                if left is not None and left <= 0:
                    return
                entry = idx.checkpoints[key]
                if (ns is not None and key[0] != ns) or (only_id and key[1] != only_id):
                    continue
                if before_id is not None and key[1] >= before_id:
                    continue
                if filter and not all(
                    entry.metadata(self._metadata).get(k) == v for k, v in filter.items()
                ):
                    continue
                if left is not None:
                    left -= 1
                yield self._tuple(lg_thread, idx, entry)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._put(config, checkpoint, metadata, asyncio.current_task())

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        caller: Owner,
    ) -> RunnableConfig:
        """``aput`` for a ``caller`` (the task of ``aput``, the thread of a synchronous
        ``put``): a write outside a run is refused while another's run occupies the
        thread (``Runs.check``)."""
        conf = config["configurable"]
        lg_thread, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        body: dict[str, Any] = dict(checkpoint)
        values = body.pop("channel_values", None) or {}
        versions = body.get("channel_versions", {})
        cid = checkpoint["id"]
        meta = get_checkpoint_metadata(config, metadata)
        encode = self.codec.encode
        item = {
            "k": "c",
            "ns": ns,
            "id": cid,
            "parent": conf.get("checkpoint_id"),
            "checkpoint": encode(body, "checkpoint {!r}", cid),
            "values": {
                k: encode(v, "checkpoint {!r} channel {!r}", cid, k)
                for k, v in values.items()
                if k in versions
            },
            "metadata": encode(meta, "checkpoint {!r} metadata", cid),
        }
        thread = self._bind(store_thread_id(lg_thread))
        self._runs.check(thread, lg_thread, conf.get(RUN_MARKER), caller)
        await self._appends.add(
            thread, lg_thread, given, [item], meta.get("run_id"), self._token(thread)
        )
        return {
            "configurable": {
                "thread_id": lg_thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._put_writes(config, writes, task_id, task_path, asyncio.current_task())

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
        caller: Owner,
    ) -> None:
        """``aput_writes`` for a ``caller`` (as ``_put``)."""
        conf = config["configurable"]
        ns, cid = conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
        encoded = [
            (WRITES_IDX_MAP.get(channel, i), channel, value)
            for i, (channel, value) in enumerate(writes)
        ]
        lg_thread = conf["thread_id"]
        thread = self._bind(store_thread_id(lg_thread))
        self._runs.check(thread, lg_thread, conf.get(RUN_MARKER), caller)
        await self._appends.add(
            thread,
            lg_thread,
            self._build_writes,
            (ns, cid, task_id, task_path, encoded),
            None,
            self._token(thread),
        )

    async def adelete_thread(self, thread_id: str) -> None:
        thread = self._bind(store_thread_id(thread_id))
        async with self._lock(thread):
            self._holds.forget(thread)
            self._cache.pop(thread, None)
            self._fenced.pop(thread, None)
            self._runs.end(thread)
            await self.store.delete_thread(thread)

    # ------------------------------------------------------------ internals

    async def _run_starts(
        self, lg_thread: str, thread: str, run: tuple[Any, Owner, Any], ns: str
    ) -> None:
        """A graph run reads its thread first: refuse it if another run of this process
        occupies the thread (``ThreadBusy``), claim the thread now (``auto``), before any
        node runs, or refuse the run (``hold`` without a hold). A subgraph's read (``ns``)
        joins the run that occupies the thread. ``run``: its runtime, owner and loop."""
        runtime, owner, loop = run
        async with self._lock(thread):
            if ns:
                self._refuse_fenced(thread)
                self._runs.join(thread, runtime)
            else:
                self._runs.refuse_busy(thread, lg_thread, runtime, owner)
                self._fenced.pop(thread, None)
            hold = self._holds.get(thread)
            if hold is None or hold.lost is not None:
                self._holds.forget(thread)
                if self.fencing == "hold":
                    raise not_held(lg_thread)
                if self.fencing == "auto":
                    claim = await self.store.claim(thread, self.holder, self._holds.ttl)
                    self._holds.start(claim, explicit=False)
                    await self._claimed_view(thread, claim)
            if not ns:
                self._runs.start(thread, runtime, owner, loop)

    def _refuse_fenced(self, thread: str) -> None:
        """Raise the refusal of a run whose claim was taken over or whose write was refused
        (every later write of it gets it, and so does a subgraph starting in it: claiming
        the thread again would let the fenced run write on). A new run (a root read) or
        ``release`` ends the fenced state."""
        hold = self._holds.get(thread)
        if hold is not None and hold.lost is not None:
            self._holds.forget(thread)
            self._fenced[thread] = hold.lost
        if thread in self._fenced:
            raise self._fenced[thread]

    async def _claimed_view(self, thread: str, claim: Claim) -> ThreadIndex:
        """The thread's index right after this saver claimed it. Tokens are positive and
        each is greater than every one issued for the thread before (deletes included), and
        every commit runs under one: token 1 is the thread's first claim ever, so nothing
        was ever committed to it and the (empty) index needs no read (a new LangGraph
        thread, the common case, costs its run one store call less)."""
        if claim.token == 1:
            return self._remember(thread, ThreadIndex())
        return await self._view(thread, trust_hold=False)

    def _token(self, thread: str) -> int | None:
        """The claim a write of ``thread`` is made under now (``Appends.add``)."""
        hold = self._holds.get(thread)
        return None if hold is None else hold.token

    def _bind(self, thread: str) -> str:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return thread

    def _lock(self, thread: str) -> asyncio.Lock:
        if self._locks is None:
            self._locks = [asyncio.Lock() for _ in range(LOCK_STRIPES)]
        # str hashes differ between processes but not within one: all a stripe needs
        return self._locks[hash(thread) % LOCK_STRIPES]

    def _metadata(self, item: dict[str, Any]) -> dict[str, Any]:
        decoded = self.codec.decode(item["metadata"], f"metadata of {item['id']!r}")
        return decoded if isinstance(decoded, dict) else {}

    def _remember(self, thread: str, idx: ThreadIndex) -> ThreadIndex:
        self._cache[thread] = idx
        self._cache.move_to_end(thread)
        while len(self._cache) > self._cache_threads:
            self._cache.popitem(last=False)
        return idx

    async def _view(self, thread: str, *, trust_hold: bool = True) -> ThreadIndex:
        """The thread's index, current as of this call (or as of this saver's own last
        write while it holds the thread: nobody else can have written)."""
        cached = self._cache.get(thread)
        hold = self._holds.get(thread)
        self._holds.touch(thread)
        if cached is not None and trust_hold and hold is not None and hold.lost is None:
            self._cache.move_to_end(thread)
            return cached
        snap = await self.store.read(thread)
        if cached is not None and snap is not None and cached.version == snap.version:
            self._cache.move_to_end(thread)
            return cached
        return self._remember(thread, await catch_up(self.store, snap, cached))

    async def _complete(self, thread: str) -> ThreadIndex:
        """``_view``, holding every checkpoint and write of the thread (a partial index is
        folded anew from the whole history, and stays cached until a write trims it)."""
        idx = await self._view(thread)
        if idx.complete:
            return idx
        snap = await self.store.read(thread)
        return self._remember(thread, await catch_up(self.store, snap, None, complete=True))

    async def _threads(self, lg_thread: str | None) -> AsyncIterator[tuple[str, ThreadIndex]]:
        """(LangGraph thread id, index) of one thread, or of every LangGraph thread."""
        if lg_thread is not None:
            idx = await self._complete(self._bind(store_thread_id(lg_thread)))
            if not idx.foreign and not idx.is_empty():
                yield lg_thread, idx
            return
        after: str | None = None
        while True:
            page = await self.store.list_threads(after=after, limit=PAGE)
            for summary in page:
                if is_internal_thread(summary.thread_id):
                    continue  # the fleet's own (a webhook delivery): never a LangGraph thread
                idx = await self._complete(self._bind(summary.thread_id))
                if not idx.foreign and not idx.is_empty() and idx.thread_id is not None:
                    yield idx.thread_id, idx
            if len(page) < PAGE:
                return
            after = page[-1].thread_id

    def _tuple(self, lg_thread: str, idx: ThreadIndex, entry: Entry) -> CheckpointTuple:
        return checkpoint_tuple(self.codec, lg_thread, idx, entry, self._metadata)

    async def _flush(
        self, thread: str, lg_thread: str, take: Callable[[str, Batch], Batch], batch: Batch
    ) -> None:
        lock = self._lock(thread)
        await lock.acquire()  # not ``async with``: two coroutine objects less per commit
        try:
            appends = take(thread, batch)
            idx = await self._writable(thread, lg_thread)
            if not idx.complete and any(idx.lacks_writes_of(a.arg) for a in appends):
                idx = await self._complete(thread)
            items: list[dict[str, Any]] = []
            answered: list[Append] = []
            run_id = None
            hold = self._holds.get(thread)
            for append in appends:
                if append.done.done():  # its caller was cancelled before it was built
                    continue
                if hold is not None and append.token not in (None, hold.token):
                    # prepared under an earlier claim of this process (``adopt`` took a
                    # newer one since): its run no longer owns the thread
                    fail(append.done, RunDisplaced(lg_thread))
                    continue
                try:
                    built = append.build(idx, append.arg)
                except Exception as exc:  # this caller's own refusal (a value the codec refuses)
                    fail(append.done, exc)
                    continue
                items.extend(built or ())
                run_id = run_id if run_id is not None else append.run_id
                answered.append(append)
            if items:
                await self._commit_record(thread, lg_thread, idx, items, [], run_id)
            for append in answered:
                if not append.done.done():
                    append.done.set_result(None)
        finally:
            lock.release()

    async def _write(self, lg_thread: str, build: Callable[[ThreadIndex], Built]) -> None:
        """Commit one record built from the thread's current index, fenced (on its own:
        a rewrite's drops are computed from exactly the records the index holds)."""
        thread = self._bind(store_thread_id(lg_thread))
        async with self._lock(thread):
            idx = await self._writable(thread, lg_thread)
            if not idx.complete:
                idx = await self._complete(thread)
            built = build(idx)
            if built is not None:
                await self._commit_record(thread, lg_thread, idx, built[0], built[1], None)

    async def _writable(self, thread: str, lg_thread: str) -> ThreadIndex:
        """The index a write builds on, or the refusal every write of the thread gets now
        (a fenced run, ``hold`` mode without a hold, a foreign thread). Under the lock."""
        self._refuse_fenced(thread)
        if self.fencing == "hold" and self._holds.get(thread) is None:
            raise not_held(lg_thread)
        cached = self._cache.get(thread)
        idx = cached if cached is not None else await self._view(thread)
        if idx.foreign:
            raise InvalidState(
                "thread",
                lg_thread,
                "a wakeful runtime thread",
                "it holds records that are not a LangGraph saver's; use another thread id",
            )
        return idx

    async def _commit_record(
        self,
        thread: str,
        lg_thread: str,
        idx: ThreadIndex,
        items: list[dict[str, Any]],
        drop: list[str],
        run_id: Any,
    ) -> None:
        """Commit one record, fenced: under this saver's hold on the thread, or claiming it
        in the same step (``claim_and_commit``: no hold yet, or ``fencing="off"``, which
        also releases). The commit is built once with its token (no copy per commit)."""
        # The caller's objects: the store validates a detached copy before its first await,
        # and the index folds copies (``ThreadIndex.fold``).
        state = record_state(lg_thread, items, drop, idx.head_after(items, drop))
        record = Record(
            id=f"lgr-{os.urandom(16).hex()}",  # 128 random bits, as uuid4 (cheaper)
            parent=idx.latest_record,
            run_id=run_id if isinstance(run_id, str) and valid_id(run_id) else "langgraph",
            status="suspended",
            state=state,
            created_at=datetime.now(UTC),
            tenant=self._tenants.get(thread),
            metadata=interrupt_tickets(self.codec.decode, items),  # interrupts are tickets
        )
        hold = self._holds.get(thread)
        off = self.fencing == "off"
        commit = Commit(
            token=0 if off or hold is None else hold.token,
            checkpoint=record,
            expected_version=idx.version,
            drop_checkpoints=tuple(drop),
            release=off,
        )
        try:
            if off:
                _, receipt = await self.store.claim_and_commit(
                    thread, self.holder, self._holds.ttl, commit
                )
            elif hold is None:
                claim, receipt = await self.store.claim_and_commit(
                    thread, self.holder, self._holds.ttl, commit
                )
                self._holds.start(claim, explicit=False)
            else:
                receipt = await self.store.commit(thread, commit)
        except (StaleClaim, VersionConflict) as exc:
            # The run that prepared this write is behind the thread: none of its later
            # writes may land either (a new run, or ``hold``, starts afresh).
            self._holds.forget(thread)
            self._cache.pop(thread, None)
            self._fenced[thread] = exc
            raise
        idx.fold(record.id, state)
        idx.trim()
        idx.version = receipt.version
        self._remember(thread, idx)
