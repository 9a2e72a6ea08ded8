"""The worker: claims dispatches, runs each under its lease's thread claim, settles.

Recovery reads the thread, never the queue: a redelivered dispatch whose run the thread
already shows finished is settled without running anything; one whose run is still running
is recovered (reusing every finished task); exhausted work is terminalised as
``indeterminate`` exactly once (one lease at a time)."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wakeful.background import STOP_TIMEOUT, BackgroundTask, StopSignal
from wakeful.clock import Clock, SystemClock
from wakeful.errors import (
    CheckpointWriteFailed,
    NotFound,
    RunFailed,
    RunInProgress,
    RunInterrupted,
    RunYielded,
    StaleClaim,
    WakefulError,
    WorkerSuperseded,
)
from wakeful.fleet.registry import Registry, Target
from wakeful.fleet.relay import RelayLoop
from wakeful.fleet.wake import NoWake, Wake
from wakeful.ids import check_id
from wakeful.metrics import Metrics
from wakeful.records import (
    Awaiting,
    Checkpoint,
    Claim,
    Commit,
    Done,
    EventDraft,
    Lease,
    Outcome,
    RetentionPolicy,
    Retry,
    Settle,
    ThreadSnapshot,
)
from wakeful.runtime.claims import ClaimPolicy
from wakeful.runtime.loop import RunOutcome
from wakeful.runtime.runtime import RunHandle, Runtime
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.fleet")

UNFINISHED = ("running", "suspended")
CLAIM_BATCH = 1000
"""Dispatches asked for per ``claim_next`` call at most."""


@dataclass
class WorkerStats:
    claimed: int = 0
    done: int = 0
    awaiting: int = 0
    retried: int = 0
    fenced: int = 0
    exhausted: int = 0
    polls: int = 0
    """Completed claim attempts (a test can wait for a worker to have looked)."""


@dataclass
class Worker:
    """``Worker(store, registry, concurrency, claims=ClaimPolicy(...), wake=...)``.

    ``poll_interval`` is the floor: the queue is polled at least that often whatever the
    wake signal does. ``relay`` runs the outbox relay and the sweeper in this worker when it
    wins the election (a claim on a well-known thread)."""

    store: Store
    registry: Registry
    concurrency: int = 4
    claims: ClaimPolicy = field(default_factory=ClaimPolicy)
    wake: Wake = field(default_factory=NoWake)
    worker_id: str = field(default_factory=lambda: f"worker-{uuid.uuid4().hex[:12]}")
    poll_interval: float = 1.0
    retry_backoff: float = 1.0
    max_retry_backoff: float = 60.0
    relay: bool = True
    retention: RetentionPolicy | None = None
    clock: Clock = field(default_factory=SystemClock)
    stats: WorkerStats = field(default_factory=WorkerStats)
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        check_id("worker_id", self.worker_id)
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._stopping = asyncio.Event()
        self._running: dict[str, tuple[asyncio.Task[None], RunHandle | None]] = {}
        self._handles: dict[str, RunHandle] = {}
        self._notifying: set[asyncio.Task[None]] = set()
        self.identity: Any = None
        self.holder = self.worker_id
        self._runtime: Runtime | None = None
        self._ready = asyncio.Event()
        for target in self.registry.targets():
            if target.agent is not None and target.agent.metrics is None:
                target.agent.metrics = self.metrics

    async def started(self) -> Runtime:
        """Wait until the worker has registered; its runtime (for subscriptions to this
        process's live events)."""
        await self._ready.wait()
        assert self._runtime is not None
        return self._runtime

    # ---------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Register, then claim and run work until ``stop()``."""
        self.identity = await self.store.register_worker(self.worker_id)
        self.holder = f"{self.worker_id}.g{self.identity.generation}"
        self._runtime = Runtime(
            self.store, self.claims, self.clock, holder=self.holder, metrics=self.metrics
        )
        self._ready.set()
        # Each stops on its own signal, in bounded time (wakeful.background).
        background = [BackgroundTask("heartbeat", self._heartbeat, logger=log)]
        if self.relay:
            relay = RelayLoop(self.store, self.holder, self.claims, self.wake, self.retention)
            background.append(BackgroundTask("relay", relay.run, logger=log))
        for task in background:
            task.start()
        try:
            await self._claim_loop()
        finally:
            for task in background:
                task.signal.set()
            for task in background:
                await task.stop()
            if self._notifying:
                await asyncio.wait(self._notifying, timeout=STOP_TIMEOUT)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop claiming; let running work finish within ``grace`` seconds, then ask the
        rest to stop at their next checkpoint (they are retried elsewhere)."""
        self._stopping.set()
        await self.wake.notify()
        tasks = [t for t, _ in self._running.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            if pending:
                for handle in self._handles.values():
                    handle.yield_run()
                await asyncio.wait(pending, timeout=grace)

    @property
    def busy(self) -> int:
        return len(self._running)

    async def _heartbeat(self, signal: StopSignal) -> None:
        interval = max(self.claims.ttl / 3, 0.05)
        while not self._stopping.is_set():
            if await signal.pause(interval) or self._stopping.is_set():
                return
            try:
                await self.store.heartbeat(self.identity)
            except WorkerSuperseded:
                log.error("worker %s was superseded by a newer registration", self.worker_id)
                self._stopping.set()
                await self.wake.notify()
            except WakefulError as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            # the stores take at most CLAIM_BATCH per call (SQLite and PostgreSQL): a larger
            # concurrency fills up over several calls (``continue`` below)
            free = min(self.concurrency - len(self._running), CLAIM_BATCH)
            leases: list[Lease] = []
            if free > 0:
                try:
                    leases = await self.store.claim_next(self.holder, self.claims.ttl, free)
                except WakefulError as exc:
                    log.warning("claiming work failed: %s", exc)
                self.stats.polls += 1
            for lease in leases:
                self.stats.claimed += 1
                self.metrics.leases.inc()
                did = lease.dispatch.dispatch_id
                task = asyncio.create_task(self._handle(lease), name=f"dispatch:{did}")
                self._running[did] = (task, None)
                task.add_done_callback(self._on_done(did))
            if leases and len(self._running) < self.concurrency:
                continue  # there may be more
            await self.wake.wait(self.poll_interval)
        if self._running:
            await asyncio.wait([t for t, _ in self._running.values()])

    def _on_done(self, dispatch_id: str) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._finished(dispatch_id)

    def _finished(self, dispatch_id: str) -> None:
        self._running.pop(dispatch_id, None)
        self._handles.pop(dispatch_id, None)
        if not self._stopping.is_set():
            self.wake_local()

    def wake_local(self) -> None:
        """A slot freed up: look for more work now."""
        task = asyncio.get_running_loop().create_task(self.wake.notify())
        self._notifying.add(task)  # kept until done: run() waits for them (bounded)
        task.add_done_callback(self._notifying.discard)

    # ---------------------------------------------------------------- one dispatch

    async def _handle(self, lease: Lease) -> None:
        d, claim = lease.dispatch, lease.claim
        try:
            outcome = await self._execute(lease)
        except (CheckpointWriteFailed, StaleClaim) as exc:
            self.stats.fenced += 1
            self.metrics.stale_claims.inc()
            log.info("dispatch %s was fenced (%s); a newer owner has it", d.dispatch_id, exc)
            return
        except RunYielded:
            outcome = Retry(0.0, "the worker shut down; recovering elsewhere")
        except Exception as exc:
            log.warning("dispatch %s failed: %s", d.dispatch_id, exc)
            outcome = Retry(self._backoff(d.attempts), f"{type(exc).__name__}: {exc}")
        try:
            if isinstance(outcome, Settled):
                outcome = outcome.outcome  # the run's last commit settled it
            else:
                await self.store.settle(d.dispatch_id, claim.token, outcome)
        except StaleClaim:
            self.stats.fenced += 1
            self.metrics.stale_claims.inc()
            return
        if isinstance(outcome, Retry):
            self.stats.retried += 1
            self.metrics.retries.inc()
            self.metrics.settles.inc(outcome="retry")
        elif isinstance(outcome, Awaiting):
            self.stats.awaiting += 1
            self.metrics.settles.inc(outcome="awaiting")
        else:
            self.stats.done += 1
            self.metrics.settles.inc(outcome="done")

    def _backoff(self, attempts: int) -> float:
        base = min(self.retry_backoff * 2 ** max(attempts - 1, 0), self.max_retry_backoff)
        return float(base * random.uniform(0.75, 1.25))

    async def _execute(self, lease: Lease) -> Outcome | Settled:
        d, claim = lease.dispatch, lease.claim
        payload = d.payload if isinstance(d.payload, dict) else {}
        # the thread as read when the lease was granted, else (an older store) read it now
        snap = lease.snapshot if lease.snapshot is not None else await self.store.read(d.thread_id)
        latest = snap.checkpoint if snap is not None else None
        owned_run = _owned_run(d.dispatch_id, d.kind, payload, latest)
        if owned_run is not None and owned_run.status != "running":
            # The run ended or suspended before an earlier owner could settle: the thread says
            # what happened, whatever the budget (a redelivery never records a second ending).
            return Awaiting() if owned_run.status == "suspended" else Done()
        if lease.exhausted:
            self.stats.exhausted += 1
            self.metrics.exhausted.inc()
            await self._terminate(
                claim,
                owned_run,
                "indeterminate",
                "run.indeterminate",
                {"dispatch_id": d.dispatch_id, "max_attempts": d.max_attempts},
                operation_id=f"{d.dispatch_id}:exhausted",
                settle=d.dispatch_id,
            )
            return Settled(Done())
        if d.kind == "cancel":
            reason = str(payload.get("reason", "cancelled"))
            unfinished = latest if latest is not None and latest.status in UNFINISHED else None
            await self._terminate(
                claim,
                unfinished,
                "cancelled",
                "run.cancelled",
                {"reason": reason},
                settle=d.dispatch_id,
            )
            return Settled(Done())
        if owned_run is not None:
            return await self._continue(d.dispatch_id, claim, owned_run, snap)
        if d.kind == "resume":
            return await self._resume(d.dispatch_id, claim, snap, payload)
        return await self._start(d.dispatch_id, d.kind, claim, snap, payload)

    async def _start(
        self,
        dispatch_id: str,
        kind: str,
        claim: Claim,
        snap: ThreadSnapshot | None,
        payload: dict[str, Any],
    ) -> Outcome | Settled:
        assert self._runtime is not None
        latest = snap.checkpoint if snap is not None else None
        run_id = str(payload.get("run_id") or f"run-{dispatch_id}")
        consume: tuple[str, ...] = ()
        try:
            if kind == "message":
                target, input, consume = await self._message_input(claim, latest, payload)
                if target is None:
                    return Done()  # already consumed by an earlier delivery
            else:
                target = self.registry.get(str(payload.get("target")))
                input = payload.get("input")
            state, messages = target.prepare(input, run_id)
        except (NotFound, TypeError, ValueError) as refused:
            # an unknown target or an input the target cannot take: retrying cannot help
            await self._note(claim, "dispatch.refused", {"reason": str(refused)}, dispatch_id)
            return Settled(Done())
        tenant = payload.get("tenant")
        if kind == "message" and not payload.get("external") and latest is not None:
            tenant = latest.tenant  # relayed between threads: the target thread's tenant
        try:
            handle = await self._runtime.start(
                claim.thread_id,
                target.graph,
                state,
                tenant=tenant,
                run_id=run_id,
                messages=messages,
                consume=consume,
                claim=claim,
                snapshot=snap,
                dispatch_id=dispatch_id,
            )
        except RunInProgress as busy:
            if kind == "message":
                return Retry(self._backoff(1), str(busy))  # the message waits in the inbox
            await self._note(claim, "dispatch.refused", {"reason": str(busy)}, dispatch_id)
            return Settled(Done())
        return await self._follow(dispatch_id, handle)

    async def _message_input(
        self, claim: Claim, latest: Checkpoint | None, payload: dict[str, Any]
    ) -> tuple[Target | None, Any, tuple[str, ...]]:
        graph_name = latest.metadata.get("graph") if latest is not None else None
        named = payload.get("target")
        target = self.registry.get(str(named)) if named else self.registry.for_graph(graph_name)
        if payload.get("external"):
            return target, payload.get("payload"), ()
        message_id = str(payload.get("message_id"))
        waiting = {m.message_id: m for m in await self.store.inbox(claim.thread_id)}
        if message_id not in waiting:
            return None, None, ()
        return target, waiting[message_id].payload, (message_id,)

    async def _resume(
        self,
        dispatch_id: str,
        claim: Claim,
        snap: ThreadSnapshot | None,
        payload: dict[str, Any],
    ) -> Outcome | Settled:
        assert self._runtime is not None
        latest = snap.checkpoint if snap is not None else None
        if latest is None or latest.status != "suspended":
            reason = {"reason": "the thread is not suspended"}
            await self._note(claim, "dispatch.refused", reason, dispatch_id)
            return Settled(Done())
        target = self.registry.for_graph(latest.metadata.get("graph"))
        handle = await self._runtime.resume(
            claim.thread_id,
            target.graph,
            dict(payload.get("answers") or {}),
            tenant=payload.get("tenant"),
            claim=claim,
            resumed_by=dispatch_id,
            snapshot=snap,
            dispatch_id=dispatch_id,
        )
        return await self._follow(dispatch_id, handle)

    async def _continue(
        self, dispatch_id: str, claim: Claim, latest: Checkpoint, snap: ThreadSnapshot | None
    ) -> Outcome | Settled:
        """The dispatch's running run was admitted before (this is a redelivery)."""
        assert self._runtime is not None
        target = self.registry.for_graph(latest.metadata.get("graph"))
        handle = await self._runtime.recover(
            claim.thread_id,
            target.graph,
            tenant=latest.tenant,
            claim=claim,
            snapshot=snap,
            dispatch_id=dispatch_id,
        )
        return await self._follow(dispatch_id, handle)

    async def _follow(self, dispatch_id: str, handle: RunHandle) -> Outcome | Settled:
        self._handles[dispatch_id] = handle
        ending: Outcome
        try:
            outcome: RunOutcome = await handle.result()
            ending = Awaiting() if outcome.status == "suspended" else Done()
        except RunFailed:
            ending = Done()  # recorded as failed on the thread
        except RunInterrupted as exc:
            return Retry(self._backoff(1), str(exc))
        return Settled(ending) if handle.settled else ending

    async def _terminate(
        self,
        claim: Claim,
        latest: Checkpoint | None,
        status: Any,
        event_type: str,
        data: dict[str, Any],
        operation_id: str | None = None,
        settle: str | None = None,
    ) -> None:
        """Record a terminal status for the thread's unfinished run (if any) with an event
        for observers, under the lease's claim. With only an event to record, ``operation_id``
        makes a redelivered attempt return the first one's receipt instead of a second
        event. ``settle``: the dispatch settled ``Done`` by the same commit."""
        checkpoint = None
        if latest is not None and latest.status in UNFINISHED:
            ordinal = int(latest.metadata.get("ordinal", 0)) + 1
            checkpoint = Checkpoint(
                id=f"{latest.run_id}-c{ordinal}",
                parent=latest.id,
                run_id=latest.run_id,
                status=status,
                state=latest.state,
                created_at=self.clock.now(),
                tenant=latest.tenant,
                frontier=list(latest.frontier),
                metadata={**latest.metadata, "ordinal": ordinal, "ended_by": event_type},
            )
        run_id = latest.run_id if latest is not None else None
        await self.store.commit(
            claim.thread_id,
            Commit(
                token=claim.token,
                checkpoint=checkpoint,
                events=(EventDraft(type=event_type, data=data, run_id=run_id),),
                operation_id=f"{checkpoint.id}:end" if checkpoint else operation_id,
                settle=_done(settle),
            ),
        )

    async def _note(
        self, claim: Claim, event_type: str, data: dict[str, Any], settle: str | None = None
    ) -> None:
        """An event for observers; ``settle``: the dispatch settled ``Done`` with it."""
        await self.store.commit(
            claim.thread_id,
            Commit(
                token=claim.token,
                events=(EventDraft(type=event_type, data=data),),
                settle=_done(settle),
            ),
        )


@dataclass(frozen=True)
class Settled:
    """An outcome already recorded by the commit that ended the work."""

    outcome: Outcome


def _done(dispatch_id: str | None) -> Settle | None:
    return None if dispatch_id is None else Settle(dispatch_id=dispatch_id, outcome=Done())


def _owned_run(
    dispatch_id: str, kind: str, payload: dict[str, Any], latest: Checkpoint | None
) -> Checkpoint | None:
    """The thread's latest checkpoint when it belongs to this dispatch's run: started by it
    (same run id) or resumed by it."""
    if latest is None:
        return None
    if kind in ("start", "message") and latest.run_id == (
        payload.get("run_id") or f"run-{dispatch_id}"
    ):
        return latest
    if kind == "resume" and latest.metadata.get("resumed_by") == dispatch_id:
        return latest
    return None


__all__ = ["Worker", "WorkerStats"]
