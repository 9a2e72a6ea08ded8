"""One run's execution: Pregel supersteps under a fenced claim.

Each superstep runs its frontier's tasks concurrently (bounded). A finished task's result is
committed as a pending write against the current checkpoint, so recovery reuses it. At the
barrier the results are applied in frontier order through the reducers and the next
checkpoint is committed. A run that learns its claim is gone (from a commit or a renewal)
stops at the start of its next superstep and records nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from wakeful.clock import Clock
from wakeful.errors import (
    CheckpointWriteFailed,
    RunCancelled,
    RunFailed,
    RunInterrupted,
    RunStalled,
    RunYielded,
    StaleClaim,
    WakefulError,
)
from wakeful.metrics import Metrics
from wakeful.records import (
    Awaiting,
    Checkpoint,
    Claim,
    Commit,
    Done,
    EventDraft,
    Message,
    OutboxEntry,
    PendingWrite,
    Retry,
    RunStatus,
    Settle,
)
from wakeful.runtime.children import spawn_ids, spawns_committed, spawns_of
from wakeful.runtime.claims import ClaimPolicy, Progress, Renewer, Sleep
from wakeful.runtime.context import Interrupt, NodeContext, Ticket, call_node
from wakeful.runtime.durability import Writer, make_writer
from wakeful.runtime.events import LiveHub
from wakeful.runtime.graph import CompiledGraph
from wakeful.runtime.results import (
    RunOutcome,
    TaskResult,
    frontier_entries,
    reused,
    successor,
    task_value,
)
from wakeful.runtime.sleeps import asleep_until, sleep_ending, sleep_metadata, suspension_event
from wakeful.runtime.spans import in_attempt, reused_task, step_span, task_span
from wakeful.runtime.taskwrites import TaskWrites
from wakeful.runtime.webhooks import with_webhook
from wakeful.store.contract import ThreadStore
from wakeful.telemetry import NO_SPAN, SpanLike, StoreCalls

log = logging.getLogger("wakeful.runtime")

HISTORY_PAGE = 1000
"""Messages read per call when a task asks for the thread's history."""


@dataclass(slots=True)  # its ~30 fields would need a 1.6 KB dict per run
class Execution(TaskWrites):
    store: ThreadStore
    graph: CompiledGraph
    thread_id: str
    claim: Claim
    checkpoint: Checkpoint
    writes: dict[str, PendingWrite]
    durability: str
    policy: ClaimPolicy
    clock: Clock
    sleep: Sleep
    renew_sleep: Sleep
    live: LiveHub
    release_claim: bool = True
    settle_dispatch: str | None = None
    """The leased dispatch this run settles with its ending commit (a worker's run)."""
    claim_ended: bool = False
    """The ending commit also ended the claim (``release`` or ``settle``)."""
    attempt: SpanLike = NO_SPAN
    """This attempt's span (started at admission; ``run`` makes it current and ends it)."""
    trace: dict[str, str] = field(default_factory=dict)
    """The attempt's W3C trace context, recorded in each checkpoint it commits."""
    calls: StoreCalls | None = None
    recovered_at: str | None = None
    """The checkpoint a recovery continued from: its tasks may have started before."""
    admitted: bool = False
    """``checkpoint`` is a new run's first, committed by this attempt (``NodeContext.fresh``)."""
    history_seed: list[Message] | None = None
    """The thread's messages as of ``checkpoint`` if known (``history()`` then reads none)."""
    message_count: int | None = None
    """How many messages the thread's view has now (default: as ``checkpoint`` records in
    ``metadata["messages"]``); each checkpoint this run commits records its count."""
    status: str = "running"
    yield_requested: bool = False
    fence: BaseException | None = None
    metrics: Metrics | None = None
    progress: Progress = field(default_factory=Progress)
    """Signs of life the renewer reads (``ClaimPolicy.stall_after``)."""
    _history: list[Message] | None = None
    _entry: str = field(init=False)
    _writer: Writer = field(init=False)
    _renewer: Renewer = field(init=False)
    _task: asyncio.Task[Any] | None = None

    def __post_init__(self) -> None:
        self._entry = self.checkpoint.id
        if self.message_count is None:
            self.message_count = int(self.checkpoint.metadata.get("messages", 0))
        # the claim is held: only this run's own commits add messages (``_recorded``)
        self._history = None if self.history_seed is None else list(self.history_seed)
        self._writer = make_writer(
            self.durability, self.store, self.thread_id, self.checkpoint.id, self.calls
        )
        self._renewer = Renewer(
            self.store,
            self.thread_id,
            self.claim.token,
            self.policy,
            self._fenced,
            self.renew_sleep,
            self.progress,
            self._stalled,
        )

    @property
    def run_id(self) -> str:
        return self.checkpoint.run_id

    @property
    def renewals(self) -> int:
        return self._renewer.renewals

    # ------------------------------------------------------------ task services

    async def history(self) -> list[Message]:
        if self._history is None:
            await self._writer.flush()
            loaded: list[Message] = []
            while True:  # a short page is the last: no read of an empty one to learn that
                page = await self.store.messages(self.thread_id, len(loaded), HISTORY_PAGE)
                loaded += page
                if len(page) < HISTORY_PAGE:
                    break
            self._history = loaded
        return list(self._history)

    def _recorded(self, messages: tuple[Message, ...]) -> None:
        assert self.message_count is not None
        self.message_count += len(messages)
        if self._history is not None:
            self._history.extend(messages)

    def _fenced(self, cause: BaseException) -> None:
        if self.fence is None:
            self.fence = cause

    async def _stalled(self, idle: float) -> None:
        """The renewer found the run stuck and renews no more, so another worker takes the
        run over once the claim expires: say so durably and in metrics, and stop this run
        (fenced: it records nothing more)."""
        cause = RunStalled(self.thread_id, self.run_id, idle)
        log.warning("%s", cause)
        self._fenced(cause)
        if self.metrics is not None:
            self.metrics.stalled_runs.inc()
        event = EventDraft(type="run.stalled", data={"idle_seconds": idle}, run_id=self.run_id)
        operation = f"{self.checkpoint.id}:stalled:{self.claim.token}"
        try:
            commit = Commit(token=self.claim.token, events=(event,), operation_id=operation)
            await self.store.commit(self.thread_id, commit)
        except Exception as exc:  # the event is a report; the takeover happens regardless
            log.warning("recording that run %s stalled failed: %s", self.run_id, exc)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _check(self) -> None:
        cause = self.fence or self._writer.failure
        if cause is not None:
            self.fence = cause
            self.status = "fenced"
            raise CheckpointWriteFailed(self.thread_id, self.run_id, cause)

    async def _check_yield(self) -> None:
        if self.yield_requested:
            await self._writer.flush()
            self._check()
            self.status = "yielded"
            raise RunYielded(self.thread_id, self.run_id)

    async def run(self) -> RunOutcome:
        """The run to its end; inside the attempt's span, which ends with it (failed only
        when the run failed or was fenced)."""
        if self.attempt is NO_SPAN:
            return await self._run()
        return await in_attempt(self.attempt, self._run, lambda: self.status)

    async def _run(self) -> RunOutcome:
        self._task = asyncio.current_task()
        self._renewer.start()
        release = self.release_claim
        try:
            return await self._loop()
        except CheckpointWriteFailed:
            release = False
            raise
        except asyncio.CancelledError:
            if isinstance(self.fence, RunStalled):
                release = False
                self.status = "fenced"
                raise CheckpointWriteFailed(self.thread_id, self.run_id, self.fence) from None
            if self.fence is None and self._writer.failure is None:
                await self._end("cancelled", "run.cancelled", {})
                self.status = "cancelled"
                raise RunCancelled(self.thread_id, self.run_id) from None
            raise
        finally:
            await self._renewer.stop()
            await self._writer.close()
            if release and not self.claim_ended:
                try:
                    await self.store.release(self.thread_id, self.claim.token)
                except Exception as exc:  # the claim expires on its own
                    log.warning("releasing %s failed: %s", self.thread_id, exc)

    async def _loop(self) -> RunOutcome:
        traced = self.attempt is not NO_SPAN
        while True:
            self.progress.moved()
            self._check()
            await self._check_yield()
            cp = self.checkpoint
            step = int(cp.metadata.get("step", 0))
            with step_span(step, len(cp.frontier)) if traced else contextlib.nullcontext():
                outcome = await self._superstep(cp, step, traced)
            if outcome is not None:
                return outcome

    async def _superstep(self, cp: Checkpoint, step: int, traced: bool) -> RunOutcome | None:
        """One superstep (tasks, barrier, commit); the outcome if the run ends or suspends."""
        if step >= self.graph.max_steps:
            error = f"step limit of {self.graph.max_steps} supersteps reached"
            await self._end("failed", "run.failed", {"error": error})
            raise RunFailed(self.thread_id, self.run_id, error)
        results = await self._run_frontier(cp, step, traced)
        self._check()
        tickets = tuple(t for r in results for t in r.tickets)
        if tickets:
            return await self._suspend(cp, results, tickets)
        failed = [r for r in results if r.error is not None]
        if failed and all(r.transient for r in failed):
            await self._writer.flush()
            self._check()
            self.status = "interrupted"
            raise RunInterrupted(self.thread_id, self.run_id, str(failed[0].error))
        if failed:
            error = f"node {failed[0].entry['node']!r} failed: {failed[0].error}"
            await self._end("failed", "run.failed", {"error": error})
            raise RunFailed(self.thread_id, self.run_id, error)
        try:
            state, tasks = self.graph.barrier(
                cp.state, [(r.entry["node"], r.updates) for r in results]
            )
        except Exception as exc:
            error = f"barrier of step {step} failed: {exc}"
            await self._end("failed", "run.failed", {"error": error})
            raise RunFailed(self.thread_id, self.run_id, error) from exc
        status: RunStatus = "running" if tasks else "completed"
        messages = tuple(m for r in results for m in r.messages)
        nested = {path: ran for r in results for path, ran in r.subgraphs.items()}
        nxt = self._next_checkpoint(
            cp,
            status,
            state,
            frontier_entries(step + 1, tasks),
            len(messages),
            step=step + 1,
            subgraphs=nested,
        )
        carried = tuple(e for r in results for e in r.events)
        outbox = tuple(o for r in results for o in r.outbox)
        callbacks = tuple(c for r in results for c in r.callbacks)
        if not tasks:
            await self._commit_now(
                nxt,
                EventDraft(type="run.completed", run_id=self.run_id, checkpoint_id=nxt.id),
                events=carried,
                messages=messages,
                outbox=outbox,
                ending=Done(),
            )
            await self._run_callbacks(callbacks)
            self.status = "completed"
            return RunOutcome(
                thread_id=self.thread_id, run_id=self.run_id, status="completed", state=state
            )
        event = EventDraft(
            type="step.completed", data={"step": step}, run_id=self.run_id, checkpoint_id=nxt.id
        )
        try:
            await self._writer.submit(
                self._commit(nxt, events=(*carried, event), messages=messages, outbox=outbox)
            )
        except StaleClaim as exc:  # taken over: the run stops as fenced, as at its other commits
            self._fenced(exc)
            self._check()
        self._recorded(messages)
        self.checkpoint, self.writes = nxt, {}
        await self._run_callbacks(callbacks)
        return None

    # ---------------------------------------------------------------- tasks

    async def _run_frontier(self, cp: Checkpoint, step: int, traced: bool) -> list[TaskResult]:
        answers, frontier = dict(cp.metadata.get("answers", {})), cp.frontier
        if len(frontier) == 1 and not traced and frontier[0]["id"] not in self.writes:
            # one task: no closure, semaphore or task (frames that live as long as the run)
            return [await self._run_task(cp, step, frontier[0], answers)]
        limit = asyncio.Semaphore(self.graph.max_concurrency)

        async def one(entry: dict[str, Any]) -> TaskResult:
            recorded = self.writes.get(entry["id"])
            if recorded is not None:
                if traced:
                    reused_task(entry, step)
                return reused(entry, recorded)
            async with limit:
                if not traced:
                    return await self._run_task(cp, step, entry, answers)
                with task_span(entry, step) as span:
                    result = await self._run_task(cp, step, entry, answers)
                    if result.error is not None:
                        span.set_attribute("wakeful.task.error", result.error)
                    return result

        if len(frontier) == 1:  # in place: no task, future and context per superstep
            return [await one(frontier[0])]
        return list(await asyncio.gather(*(one(e) for e in frontier)))

    async def _run_task(
        self, cp: Checkpoint, step: int, entry: dict[str, Any], answers: dict[str, Any]
    ) -> TaskResult:
        spec = self.graph.nodes[entry["node"]]
        emit_live = functools.partial(
            self.live.emit, asyncio.get_running_loop(), self.thread_id, self.run_id
        )
        wants_live = functools.partial(self.live.wants, self.thread_id)
        attempt = 0
        self.progress.moved()
        while True:
            attempt += 1
            ctx = NodeContext(
                thread_id=self.thread_id,
                run_id=self.run_id,
                step=step,
                task_id=entry["id"],
                node=spec.name,
                fencing_token=self.claim.token,
                answers=answers,
                emit_live=emit_live,
                wants_live=wants_live,
                clock=self.clock,
                services=self,
                arg=entry.get("arg"),
                sent=bool(entry.get("sent")),
                progress=self.progress,
                recovered=cp.id == self.recovered_at,
                fresh=self.admitted or cp.id != self._entry,
                patches=cp.metadata.get("patches") or (),
            )
            try:
                updates = await call_node(spec, entry, cp.state, ctx)
                break
            except Interrupt as interrupt:  # its spawns go with the suspension (a join's)
                spawned, spawns = spawns_of(ctx.events, ctx.outbox)
                return TaskResult(
                    entry, tickets=interrupt.tickets, carry=interrupt.carry,
                    events=spawned, outbox=spawns,
                )  # fmt: skip
            except Exception as exc:
                retry = spec.retry
                if (
                    retry is None
                    or attempt >= retry.max_attempts
                    or not isinstance(exc, retry.retry_on)
                ):
                    return TaskResult(
                        entry,
                        error=f"{type(exc).__name__}: {exc}",
                        transient=bool(getattr(exc, "retryable", False))
                        and isinstance(exc, WakefulError),
                    )
                with self.progress.wait():
                    await self.sleep(retry.delay(attempt))
        self.progress.moved()
        done = EventDraft(
            type="task.completed",
            data={"node": spec.name, "step": step, "updates": updates},
            run_id=self.run_id,
            checkpoint_id=cp.id,
            task_id=entry["id"],
        )
        messages, callbacks = tuple(ctx.messages), tuple(ctx.committed_callbacks)
        outbox = tuple(ctx.outbox)
        if len(cp.frontier) == 1:
            # The barrier commit follows at once and carries this result in its checkpoint:
            # a separate pending write would only cost one more durable commit.
            return TaskResult(
                entry,
                updates=updates,
                events=(*ctx.events, done),
                messages=messages,
                outbox=outbox,
                callbacks=callbacks,
                subgraphs=ctx.subgraphs,
            )
        result = TaskResult(entry, updates=updates, subgraphs=ctx.subgraphs)
        write = PendingWrite(
            checkpoint_id=cp.id, task_id=entry["id"], node=spec.name, value=task_value(result)
        )
        try:
            await self._writer.submit(
                Commit(
                    token=self.claim.token,
                    writes=(write,),
                    events=(*ctx.events, done),
                    messages=messages,
                    outbox=outbox,
                    operation_id=f"{cp.id}:{entry['id']}",
                )
            )
        except Exception as exc:
            self._fenced(exc)
            return result
        self._recorded(messages)
        await self._run_callbacks(callbacks)
        return result

    async def _run_callbacks(self, callbacks: tuple[Callable[[], Awaitable[None]], ...]) -> None:
        if not callbacks:
            return
        if self.durability != "sync":
            await self._writer.flush()
        for callback in callbacks:
            try:
                await callback()
            except Exception as exc:
                log.warning("an after-commit callback of %s failed: %s", self.thread_id, exc)

    # ---------------------------------------------------------------- commits

    def _next_checkpoint(
        self,
        cp: Checkpoint,
        status: RunStatus,
        state: Any,
        frontier: list[Any],
        added: int = 0,
        **meta: Any,
    ) -> Checkpoint:
        """The checkpoint after ``cp``, whose commit appends ``added`` messages."""
        assert self.message_count is not None
        now = self.clock.now()
        return successor(
            cp, status, state, frontier, self.message_count + added, now, self.trace, meta
        )

    def _commit(
        self,
        checkpoint: Checkpoint,
        events: tuple[EventDraft, ...] = (),
        writes: tuple[PendingWrite, ...] = (),
        messages: tuple[Message, ...] = (),
        outbox: tuple[OutboxEntry, ...] = (),
    ) -> Commit:
        return Commit(
            token=self.claim.token,
            checkpoint=checkpoint,
            writes=writes,
            events=events,
            messages=messages,
            outbox=outbox,
            operation_id=checkpoint.id,
        )

    async def _commit_now(
        self,
        checkpoint: Checkpoint,
        event: EventDraft,
        writes: tuple[PendingWrite, ...] = (),
        events: tuple[EventDraft, ...] = (),
        messages: tuple[Message, ...] = (),
        outbox: tuple[OutboxEntry, ...] = (),
        ending: Done | Awaiting | Retry | None = None,
    ) -> None:
        """A synchronous commit. ``ending``: the run ends (or suspends) with it, so it also
        ends the claim in the same atomic step: settling the worker's dispatch with
        ``ending``, or releasing a claim this runtime took."""
        commit = self._commit(checkpoint, (*events, event), writes, messages, outbox)
        commit = with_webhook(self.thread_id, commit)  # stored with the ending, or not at all
        if isinstance(ending, Done) and "parent" in checkpoint.metadata:
            ending = None  # a child's end: its worker wakes the parent, then settles
        ends_claim = ending is not None and (self.settle_dispatch is not None or self.release_claim)
        if ending is not None and self.settle_dispatch is not None:
            settle = Settle(dispatch_id=self.settle_dispatch, outcome=ending)
            commit = msgspec.structs.replace(commit, settle=settle)
        elif ends_claim:
            commit = msgspec.structs.replace(commit, release=True)
        if ends_claim:
            await self._renewer.stop()  # no renewal may race the end of the claim
        try:
            await self._writer.commit_now(commit)
        except Exception as exc:
            self._fenced(exc)
            self._check()
        self.claim_ended = self.claim_ended or ends_claim
        self.progress.moved()
        self._recorded(messages)
        self.checkpoint = checkpoint

    async def _suspend(
        self, cp: Checkpoint, results: list[TaskResult], tickets: tuple[Ticket, ...]
    ) -> RunOutcome:
        wake_at = asleep_until(tickets)
        suspended = self._next_checkpoint(
            cp,
            "suspended",
            cp.state,
            list(cp.frontier),
            tickets=[msgspec.to_builtins(t) for t in tickets],
            answers=dict(cp.metadata.get("answers", {})),
            **sleep_metadata(cp, wake_at),
        )
        carried = tuple(
            PendingWrite(
                checkpoint_id=suspended.id,
                task_id=r.entry["id"],
                node=r.entry["node"],
                value=task_value(r),
            )
            for r in results
            if r.updates is not None
        ) + tuple(  # a subgraph's progress, so that resuming continues inside it
            msgspec.structs.replace(w, checkpoint_id=suspended.id) for r in results for w in r.carry
        )
        event = suspension_event(self.run_id, tickets, wake_at)
        ending = sleep_ending(wake_at, self.clock.now()) if self.settle_dispatch else Awaiting()
        outbox = tuple(o for r in results if r.tickets for o in r.outbox)
        events = tuple(e for r in results if r.tickets for e in r.events)
        ids = spawn_ids(events)  # relayed spawns and those enqueued with a busy policy
        if ids:  # the spawns a resumed task must not record again (``NodeContext.spawn``)
            spawned = [*cp.metadata.get("spawned", ()), *(o.message_id for o in outbox), *ids]
            suspended.metadata["spawned"] = sorted(set(spawned))
        await self._commit_now(suspended, event, carried, events, outbox=outbox, ending=ending)
        if outbox:
            spawns_committed()  # the children it joins start now, not at the relay's next step
        self.status = "suspended"
        return RunOutcome(
            thread_id=self.thread_id,
            run_id=self.run_id,
            status="suspended",
            state=cp.state,
            tickets=tickets,
            wake_at=wake_at,
        )

    async def _end(self, status: RunStatus, event_type: str, data: dict[str, Any]) -> None:
        cp = self.checkpoint
        final = self._next_checkpoint(cp, status, cp.state, list(cp.frontier), **data)
        # a failed run is settled done; a cancelled one leaves its dispatch to the canceller
        ending = Done() if status == "failed" else None
        await self._commit_now(
            final, EventDraft(type=event_type, data=data, run_id=self.run_id), ending=ending
        )
        self.status = status
