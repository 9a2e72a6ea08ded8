"""The worker: claims dispatches, runs each under its lease's thread claim, settles.

Recovery reads the thread, never the queue: a redelivered dispatch whose run the thread
already shows finished is settled without running anything; one whose run is still running
is recovered (reusing every finished task); exhausted work is terminalised as
``indeterminate`` exactly once (one lease at a time)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wakeful.background import BackgroundTask, StopSignal
from wakeful.backoff import backoff_delay
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
)
from wakeful.fleet import deploys, joins
from wakeful.fleet.attempts import (
    UNFINISHED,
    Settled,
    ending_commit,
    fenced_ending,
    foreign_tenant,
    log_end,
    log_fields,
    run_of,
    settle_done,
)
from wakeful.fleet.busy import cancel_ending, coalesced_inputs
from wakeful.fleet.client import tenant_of
from wakeful.fleet.deploys import DEFAULT_PIN_GRACE, PinReleaser
from wakeful.fleet.endings import account
from wakeful.fleet.firing import firing_task
from wakeful.fleet.gather import ClaimGather
from wakeful.fleet.heartbeats import beat
from wakeful.fleet.inputs import message_input, start_input
from wakeful.fleet.live import LiveChannel, PublishingHub
from wakeful.fleet.observe import WorkerObserver, WorkerStats
from wakeful.fleet.registry import Registry
from wakeful.fleet.relay import RelayLoop
from wakeful.fleet.replays import Start, replay_dispatch
from wakeful.fleet.selfrun import TARGETS_KEY, Job
from wakeful.fleet.starts import StartGate
from wakeful.fleet.versions import worker_version
from wakeful.fleet.wake import NoWake, Wake, WakeWaiter
from wakeful.fleet.webhooks import WebhookConfig, deliver, run_metadata
from wakeful.ids import check_id
from wakeful.metrics import Metrics
from wakeful.records import (
    Awaiting,
    Checkpoint,
    Claim,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    Lease,
    Message,
    Outcome,
    RetentionPolicy,
    Retry,
    ThreadSnapshot,
)
from wakeful.runtime.claims import ClaimPolicy
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.results import RunOutcome
from wakeful.runtime.runtime import Runtime
from wakeful.runtime.sleeps import attempts_spent, wake_at
from wakeful.runtime.webhooks import is_webhook_thread, with_webhook
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.fleet")

ADMIT_SLICE = 32
"""Leases started per event-loop iteration at most: a started run's first step (up to its
admission commit) is fixed Python work, and 1,000 of them in one iteration stalled the loop
for as long."""


@dataclass
class Worker:
    """``Worker(store, registry, concurrency, claims=ClaimPolicy(...), wake=...)``.

    ``poll_interval`` is the floor: the queue is polled at least that often whatever the
    wake signal does; the worker's signals to itself (a slot freed up, a stop) are local and
    never go through the wake. ``relay`` runs the outbox relay and the sweeper in this worker
    when it wins the election (``RelayLoop``), and fires due schedule ticks (``firing``)."""

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
    live: LiveChannel | None = None
    """Where the runs' model deltas are published for stream servers in other processes
    (``wakeful.fleet.live``); the caller opens and closes it."""
    claim_gather: float = 0.002
    """Under a backlog, how long a freed slot may wait for others (``wakeful.fleet.gather``)."""
    only_thread: str | None = None
    """Lease only this thread's dispatches (``wakeful run``: the work of every other thread
    is left to the workers that serve it)."""
    version: str | None = None
    """This worker's code version; default: ``wakeful.fleet.versions.code_version``."""
    pin_grace: float = DEFAULT_PIN_GRACE
    """Seconds without a live worker of a version before its runs move (``fleet.deploys``)."""
    webhooks: WebhookConfig = field(default_factory=WebhookConfig.from_env)
    """How this worker delivers run webhooks (``wakeful.fleet.webhooks``)."""

    def __post_init__(self) -> None:
        check_id("worker_id", self.worker_id)
        if self.only_thread is not None:
            check_id("only_thread", self.only_thread)
        self.version = worker_version(self.version, self.registry, self.metrics)
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not self.claim_gather >= 0:
            raise ValueError("claim_gather must be >= 0 (at most poll_interval is used)")
        self._stopping = asyncio.Event()
        self._running: dict[str, tuple[asyncio.Task[None], RunHandle | None]] = {}
        self._handles: dict[str, RunHandle] = {}
        self._endings: dict[str, str] = {}
        """dispatch id -> how its work ended (for the log line that closes the dispatch)"""
        self._shared: dict[str, Any] = {TARGETS_KEY: self.registry.self_running}  # Job.shared
        self._self_run: set[str] = set()  # dispatches a self-running target runs now
        self._waiter = WakeWaiter(self.wake)
        self._gather = ClaimGather(self.claim_gather, self.concurrency, self._stopping)
        self.identity: Any = None
        self.holder = self.worker_id
        self._runtime: Runtime | None = None
        self._ready = asyncio.Event()
        self._starts = StartGate(self)
        self.metrics.register_worker()
        self._observe = WorkerObserver(self.store, self.metrics, self.registry, self.clock)
        for target in self.registry.targets():
            if target.agent is not None and target.agent.metrics is None:
                target.agent.metrics = self.metrics

    async def started(self) -> Runtime:
        """Wait until the worker has registered; its runtime (for live event subscriptions)."""
        await self._ready.wait()
        assert self._runtime is not None
        return self._runtime

    # ---------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Register, then claim and run work until ``stop()``."""
        self.identity = await self.store.register_worker(self.worker_id, version=self.version)
        self.holder = f"{self.worker_id}.g{self.identity.generation}"
        self._runtime = Runtime(
            self.store, self.claims, self.clock, holder=self.holder, metrics=self.metrics
        )
        if self.live is not None:
            self._runtime.live = PublishingHub(self.live)
        self._ready.set()
        # Each stops on its own signal, in bounded time (wakeful.background).
        background = [BackgroundTask("heartbeat", self._heartbeat, logger=log)]
        background.append(BackgroundTask("pins", PinReleaser(self).run, logger=log))
        background.append(BackgroundTask("starts", self._starts.run, logger=log))
        if self.relay:
            relay = RelayLoop(self.store, self.holder, self.claims, self.wake, self.retention)
            background.append(BackgroundTask("relay", relay.run, logger=log))
            background.append(firing_task(self.store, self.wake, self.poll_interval))
        for task in background:
            task.start()
        try:
            await self._claim_loop()
        finally:
            for task in background:
                task.signal.set()
            for task in background:
                await task.stop()
            await self._waiter.close()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop claiming; let running work finish within ``grace`` seconds, then ask the
        rest to stop at their next checkpoint (they are retried elsewhere); then record the
        stop in the worker registry (``retire_worker``)."""
        self._stopping.set()
        self._waiter.nudge()
        tasks = [t for t, _ in self._running.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            if pending:
                for handle in self._handles.values():
                    handle.yield_run()
                for did in list(self._self_run):  # stopped now; recovered elsewhere after
                    if (running := self._running.get(did)) is not None:  # its lease lapses
                        running[0].cancel()
                await asyncio.wait(pending, timeout=grace)
        if self.identity is not None:
            try:  # listings then show this incarnation stopped, not expired
                await self.store.retire_worker(self.identity)
            except WakefulError as exc:
                log.warning("recording the worker's stop failed: %s", exc)

    @property
    def busy(self) -> int:
        return len(self._running)

    async def _heartbeat(self, signal: StopSignal) -> None:
        interval = max(self.claims.ttl / 3, 0.05)
        await beat(self.store, self.identity, interval, self._stopping, signal, self._superseded)

    def _superseded(self) -> None:
        self._stopping.set()
        self._waiter.nudge()

    async def _claim_loop(self) -> None:
        only = self._starts.options  # take_starts changes as versions come and go
        while not self._stopping.is_set():
            free = await self._gather.hold(lambda: self.concurrency - self.busy, self._waiter)
            leases: list[Lease] = []
            polled = (time.time_ns(), 0)
            if free > 0:
                try:
                    leases = await self._observe.calls.timed(
                        "claim_next",
                        functools.partial(
                            self.store.claim_next, self.holder, self.claims.ttl, free, **only
                        ),
                    )
                except WakefulError as exc:
                    log.warning("claiming work failed: %s", exc)
                self.stats.polls += 1
            self._gather.claimed(free, len(leases))
            polled = (polled[0], time.time_ns())
            for started, lease in enumerate(leases):
                if started and started % ADMIT_SLICE == 0:
                    await asyncio.sleep(0)  # the ones started so far take their first step
                self.stats.claimed += 1
                self.metrics.leases.inc()
                did = lease.dispatch.dispatch_id
                task = asyncio.create_task(self._handle(lease, polled), name=f"dispatch:{did}")
                self._running[did] = (task, None)
                task.add_done_callback(self._on_done(did))
            if (leases and self.busy < self.concurrency) or self._stopping.is_set():
                continue  # there may be more (or the worker stopped while holding)
            await self._waiter.wait(self.poll_interval)
        if self._running:
            await asyncio.wait([t for t, _ in self._running.values()])

    def _on_done(self, dispatch_id: str) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._finished(dispatch_id)

    def _finished(self, dispatch_id: str) -> None:
        self._running.pop(dispatch_id, None)
        self._handles.pop(dispatch_id, None)
        self._endings.pop(dispatch_id, None)
        self._self_run.discard(dispatch_id)
        if not self._stopping.is_set():
            self.wake_local()

    def wake_local(self) -> None:
        """A slot freed up: look for more work now (locally; no network involved)."""
        self._waiter.nudge()

    # ---------------------------------------------------------------- one dispatch

    async def _handle(self, lease: Lease, polled: tuple[int, int] = (0, 0)) -> None:
        with self._observe.dispatch(lease, polled) as attempt:
            attempt.outcome = await self._attempt(lease)

    async def _attempt(self, lease: Lease) -> str:
        """Run and settle one lease; how it ended (``done``, ``awaiting``, ``retry``,
        ``fenced``)."""
        d, claim = lease.dispatch, lease.claim
        # the fields are built only for a line written (``log_end`` builds them if INFO is
        # turned on meanwhile)
        fields = log_fields(d) if log.isEnabledFor(logging.INFO) else {}
        started = time.monotonic()
        if fields:
            log.info(
                "dispatch %s started: %s on thread %s (attempt %d of %d)",
                d.dispatch_id,
                fields["target"],
                d.thread_id,
                d.attempts,
                d.max_attempts,
                extra=fields,
            )
        try:
            outcome = await self._execute(lease)
            if isinstance(outcome, RunHandle):
                # followed here, not in the frames that started it: a worker holds a thousand
                # runs for their whole length, and two frames less is about 1 KB each
                outcome = await self._follow(d.dispatch_id, outcome)
        except (CheckpointWriteFailed, StaleClaim) as exc:
            return await self._fenced(d, fields, started, f"a newer owner has it ({exc})")
        except RunYielded:
            outcome = Retry(0.0, "the worker shut down; recovering elsewhere")
        except Exception as exc:
            outcome = Retry(self._backoff(d.attempts), f"{type(exc).__name__}: {exc}")
        try:
            if not isinstance(outcome, Settled):  # else the run's last commit settled it
                settled = outcome
                await self._observe.calls(
                    "settle",
                    lambda: self.store.settle(d.dispatch_id, claim.token, settled),
                    d.thread_id,
                )
        except StaleClaim:
            return await self._fenced(d, fields, started, "settled by a newer owner")
        ending = self._endings.pop(d.dispatch_id, None)
        return account(log, self.stats, self.metrics, d, fields, started, outcome, ending)

    def _backoff(self, attempts: int) -> float:
        return backoff_delay(attempts, self.retry_backoff, self.max_retry_backoff, jitter=0.25)

    async def _fenced(
        self, d: Dispatch, fields: dict[str, Any], started: float, otherwise: str
    ) -> str:
        """Count and log an attempt whose claim was taken (cancelled, or a newer owner)."""
        self.stats.fenced += 1
        self.metrics.stale_claims.inc()
        fence, why = await fenced_ending(self.store, d.dispatch_id, otherwise)
        log_end(log, d, fields, started, fence, why)
        return "fenced"

    async def _execute(self, lease: Lease) -> Outcome | Settled | RunHandle:
        d, claim = lease.dispatch, lease.claim
        if d.kind == "message" and is_webhook_thread(d.thread_id):  # a POST, not a run
            return await deliver(self.store, lease, self.webhooks, self.clock, self.metrics)
        payload = d.payload if isinstance(d.payload, dict) else {}
        # the thread as read when the lease was granted, else (an older store) read it now
        snap = lease.snapshot if lease.snapshot is not None else await self.store.read(d.thread_id)
        submitter = tenant_of(d)
        if snap is not None and submitter is not None and foreign_tenant(snap, submitter):
            # Work queued before the thread was bound to another tenant (an older store's
            # queue, or a deletion in between): nothing of it may reach the owner's thread,
            # not even a refusal event naming it. Retrying cannot help.
            log.warning("dispatch %s belongs to another tenant than its thread", d.dispatch_id)
            return Done()
        latest = snap.checkpoint if snap is not None else None
        if (runner := self.registry.self_runner(d, latest)) is not None:  # a LangGraph graph
            job = Job(self.store, lease, self.holder, self.claims, self.clock, self.live)
            job.shared = self._shared
            self._self_run.add(d.dispatch_id)
            return await runner.run_dispatch(job)
        owned_run = run_of(d.dispatch_id, d.kind, payload, latest)
        if owned_run is not None and owned_run.status != "running":
            if wake_at(owned_run) is not None:  # asleep, and due by the store's clock
                return await deploys.wake_or_move(self, lease, owned_run, snap)
            await joins.wake_parent(self.store, self.wake, d.thread_id, owned_run)  # a child's
            # The run ended or suspended before an earlier owner could settle: the thread says
            # what happened, whatever the budget (a redelivery never records a second ending).
            return Awaiting() if owned_run.status == "suspended" else Done()
        if lease.exhausted and attempts_spent(d, owned_run):
            self.stats.exhausted += 1
            self.metrics.exhausted.inc()
            run = owned_run.run_id if owned_run is not None else "no run"
            reason = f"all {d.max_attempts} attempts were spent; {run} is recorded indeterminate"
            log.warning(
                "dispatch %s is indeterminate: %s",
                d.dispatch_id,
                reason,
                extra={**log_fields(d), "outcome": "indeterminate", "reason": reason},
            )
            self._endings[d.dispatch_id] = f"indeterminate ({reason})"
            data = {"dispatch_id": d.dispatch_id, "max_attempts": d.max_attempts}
            await self._terminate(
                claim, owned_run, "indeterminate", "run.indeterminate", data,
                operation_id=f"{d.dispatch_id}:exhausted", settle=d.dispatch_id,
            )  # fmt: skip
            return Settled(Done())
        if d.kind == "cancel":  # the run ends cancelled, or interrupted (and rolled back)
            unfinished = latest if latest is not None and latest.status in UNFINISHED else None
            end = await cancel_ending(self.store, d.thread_id, unfinished, payload, self.registry)
            self._endings[d.dispatch_id] = end.log
            child = await joins.before_ending(self.store, self.wake, d.thread_id, unfinished)
            settle = None if child else d.dispatch_id  # a child's: settled after the wake-up
            ending = end.commit(claim.token, unfinished, self.clock.now(), settle)
            ending = with_webhook(d.thread_id, ending)  # the run's ending, or nothing
            await self._observe.calls(
                "commit", lambda: self.store.commit(d.thread_id, ending), d.thread_id
            )
            await joins.wake_parent(self.store, self.wake, d.thread_id, ending.checkpoint)
            return Done() if child else Settled(Done())
        if deploys.moved_here(d, latest, self.version) and (
            moved := await deploys.version_change(self, lease, latest)
        ):
            return moved
        if owned_run is not None:
            log.info(
                "dispatch %s: recovering run %s from checkpoint %s (attempt %d of %d)",
                d.dispatch_id,
                owned_run.run_id,
                owned_run.id,
                d.attempts,
                d.max_attempts,
                extra={**log_fields(d), "run_id": owned_run.run_id, "checkpoint_id": owned_run.id},
            )
            return await self._continue(d.dispatch_id, claim, owned_run, snap)
        if d.kind == "resume":
            return await self._resume(d.dispatch_id, claim, snap, payload, submitter)
        return await self._start(
            d.dispatch_id, d.kind, claim, snap, payload, submitter, d.coalesced
        )

    async def _start(
        self,
        dispatch_id: str,
        kind: str,
        claim: Claim,
        snap: ThreadSnapshot | None,
        payload: dict[str, Any],
        tenant: str | None,
        coalesced: tuple[str, ...] = (),
    ) -> Outcome | Settled | RunHandle:
        assert self._runtime is not None
        latest = snap.checkpoint if snap is not None else None
        run_id = str(payload.get("run_id") or f"run-{dispatch_id}")
        consume: tuple[str, ...] = ()
        spawned: dict[str, Any] = {}  # a child run's parent link
        try:
            if kind == "message":
                target, input, consume = await message_input(
                    self.store, self.registry, claim.thread_id, latest, payload, spawned
                )
                if target is None:
                    return Done()  # already consumed by an earlier delivery
            else:
                target, input = await start_input(self.store, self.registry, payload, spawned)
            # one run answers every submission coalesced into it, inputs in submit order
            inputs = [input, *await coalesced_inputs(self.store, coalesced)]
            spawned.update(await joins.coalesced_parents(self.store, coalesced))
            state, messages = target.prepare_coalesced(inputs, run_id)
        except (NotFound, TypeError, ValueError) as refused:
            # an unknown target or an input the target cannot take: retrying cannot help
            now, reason = self.clock.now(), str(refused)
            await joins.refused_spawn(self.store, self.wake, claim, snap, payload, reason, now)
            await self._note(claim, "dispatch.refused", {"reason": str(refused)}, dispatch_id)
            return Settled(Done())
        relayed = kind == "message" and not payload.get("external")
        if relayed:  # relayed between threads: the target thread's tenant (a child: its parent's)
            tenant = joins.relayed_tenant(snap, spawned, tenant)
        if kind == "start" and "from_checkpoint" in payload:
            start = Start(
                dispatch_id, claim, snap, payload, target, state, messages, run_id, tenant,
                self.version,
            )  # fmt: skip
            return await replay_dispatch(self._runtime, self._note, start)
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
                metadata={**run_metadata(payload, target, self.version), **spawned},
            )
        except RunInProgress as busy:
            if kind == "message":
                return Retry(self._backoff(1), str(busy))  # the message waits in the inbox
            await self._note(claim, "dispatch.refused", {"reason": str(busy)}, dispatch_id)
            return Settled(Done())
        return handle

    async def _resume(
        self,
        dispatch_id: str,
        claim: Claim,
        snap: ThreadSnapshot | None,
        payload: dict[str, Any],
        tenant: str | None,
    ) -> Outcome | Settled | RunHandle:
        assert self._runtime is not None
        latest = snap.checkpoint if snap is not None else None
        answers = await joins.resume_answers(self.store, latest, payload)
        if answers is None:  # a child's wake-up with nothing left to answer
            return Done()
        if latest is None or latest.status != "suspended":
            reason = {"reason": "the thread is not suspended"}
            await self._note(claim, "dispatch.refused", reason, dispatch_id)
            return Settled(Done())
        target = self.registry.for_checkpoint(latest)
        return await self._runtime.resume(
            claim.thread_id,
            target.graph,
            answers,
            tenant=tenant,
            claim=claim,
            resumed_by=dispatch_id,
            snapshot=snap,
            dispatch_id=dispatch_id,
        )

    async def _continue(
        self, dispatch_id: str, claim: Claim, latest: Checkpoint, snap: ThreadSnapshot | None
    ) -> Outcome | Settled | RunHandle:
        """The dispatch's running run was admitted before (this is a redelivery)."""
        assert self._runtime is not None
        target = self.registry.for_checkpoint(latest)
        return await self._runtime.recover(
            claim.thread_id,
            target.graph,
            tenant=latest.tenant,
            claim=claim,
            snapshot=snap,
            dispatch_id=dispatch_id,
        )

    async def _follow(self, dispatch_id: str, handle: RunHandle) -> Outcome | Settled:
        self._handles[dispatch_id] = handle
        ending: Outcome
        wake_at = None  # a failed run does not sleep
        try:
            outcome: RunOutcome = await handle.result()
            ending = Awaiting() if outcome.status == "suspended" else Done()
            wake_at = outcome.wake_at
            asleep = f" until {wake_at.isoformat()}" if wake_at else ""
            self._endings[dispatch_id] = f"run {outcome.run_id} {outcome.status}{asleep}"
        except RunFailed as failed:
            ending = Done()  # recorded as failed on the thread
            self._endings[dispatch_id] = f"run {failed.run_id} failed: {failed.error}"
        except RunInterrupted as exc:
            return Retry(self._backoff(1), str(exc))
        await joins.wake_parent(self.store, self.wake, handle.thread_id, handle.checkpoint)
        return Settled(ending, wake_at) if handle.settled else ending

    async def _terminate(
        self,
        claim: Claim,
        latest: Checkpoint | None,
        status: Any,
        event_type: str,
        data: dict[str, Any],
        operation_id: str | None = None,
        settle: str | None = None,
        messages: tuple[Message, ...] = (),
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Record a terminal status for the thread's unfinished run (if any) with an event
        for observers, under the lease's claim. With only an event to record, ``operation_id``
        makes a redelivered attempt return the first one's receipt instead of a second
        event. ``settle``: the dispatch settled ``Done`` by the same commit. ``messages``
        and ``metadata`` go with the ending checkpoint. A child's end wakes its parent."""
        commit = ending_commit(
            claim.token, latest, status, event_type, data, self.clock.now(),
            operation_id=operation_id, settle=settle, messages=messages, metadata=metadata,
        )  # fmt: skip
        commit = with_webhook(claim.thread_id, commit)
        await self._observe.calls(
            "commit", lambda: self.store.commit(claim.thread_id, commit), claim.thread_id
        )
        await joins.wake_parent(self.store, self.wake, claim.thread_id, commit.checkpoint)

    async def _note(
        self, claim: Claim, event_type: str, data: dict[str, Any], settle: str | None = None
    ) -> None:
        """An event for observers naming the dispatch; ``settle``: it settles ``Done``."""
        if settle is not None:
            data = {**data, "dispatch_id": settle}
            self._endings[settle] = f"{event_type}: {data.get('reason')}"
        commit = Commit(
            token=claim.token,
            events=(EventDraft(type=event_type, data=data),),
            settle=settle_done(settle),
        )
        await self._observe.calls(
            "commit", lambda: self.store.commit(claim.thread_id, commit), claim.thread_id
        )


__all__ = ["Worker", "WorkerStats"]
