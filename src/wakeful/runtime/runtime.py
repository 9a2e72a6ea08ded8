"""The runtime: admission (claim, then the run's first commit), start, resume, recover,
delete, run handles and subscriptions."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from wakeful import telemetry
from wakeful.clock import Clock, SystemClock
from wakeful.errors import (
    GraphChanged,
    InvalidInput,
    NothingToRecover,
    NotSuspended,
    RunInProgress,
    StoreUnavailable,
    TenantMismatch,
    UnknownTicket,
    VersionConflict,
)
from wakeful.ids import check_id, check_optional_id
from wakeful.metrics import Metrics
from wakeful.records import (
    Checkpoint,
    Claim,
    Commit,
    Event,
    EventDraft,
    Message,
    PendingWrite,
    ThreadSnapshot,
)
from wakeful.runtime import travel
from wakeful.runtime.admission import Admission
from wakeful.runtime.alarms import alarm
from wakeful.runtime.claims import ClaimPolicy, Sleep
from wakeful.runtime.durability import DURABILITIES, commit_retrying
from wakeful.runtime.events import LiveEvent, LiveHub, subscribe
from wakeful.runtime.graph import CompiledGraph
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.loop import Execution
from wakeful.runtime.spans import begin_run, link_crashed, store_calls, traced_metadata
from wakeful.store.contract import ThreadStore
from wakeful.telemetry import NO_SPAN, SpanLike

if TYPE_CHECKING:
    from wakeful.metrics import Metrics


T = TypeVar("T")
_Resumption = tuple[Checkpoint, Checkpoint, tuple[PendingWrite, ...]]
"""The suspended checkpoint, the resuming checkpoint and the writes carried into it."""

ADMISSION_ATTEMPTS = 5
"""How often ``start`` re-reads a thread that changed between its read and its claim."""


class Runtime:
    """Runs graphs on a store under fenced claims.

    ``holder`` names this runtime in claims (default: a fresh id). ``sleep`` is how node
    retries wait between attempts and ``renew_sleep`` how the renewal task waits between
    renewals (tests pass controllable ones). ``metrics``: record store-write latency there
    (a worker passes its own) and count runs found stalled (``ClaimPolicy.stall_after``)."""

    def __init__(
        self,
        store: ThreadStore,
        claims: ClaimPolicy | None = None,
        clock: Clock | None = None,
        *,
        holder: str | None = None,
        sleep: Sleep = asyncio.sleep,
        renew_sleep: Sleep = asyncio.sleep,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.claims = claims or ClaimPolicy()
        self.clock = clock or SystemClock()
        self.holder = check_id("holder", holder) if holder else f"rt-{uuid.uuid4().hex[:16]}"
        self.sleep = sleep
        self.renew_sleep = renew_sleep
        self.live = LiveHub()

    # ---------------------------------------------------------------- admission

    async def _admit(
        self,
        thread_id: str,
        tenant: str | None,
        claim: Claim | None = None,
        snapshot: ThreadSnapshot | None = None,
    ) -> tuple[Claim, ThreadSnapshot | None]:
        """Check the tenant, claim the thread (unless the caller passes the claim it holds,
        as a worker does with a lease), and read the thread under the claim (unless the
        caller passes the snapshot it read under that claim)."""
        check_id("thread_id", thread_id)
        check_optional_id("tenant", tenant)
        if claim is not None and claim.thread_id != thread_id:
            raise InvalidInput("claim", f"is a claim on {claim.thread_id!r}, not {thread_id!r}")
        owned = claim is None
        if claim is None:
            # the tenant is checked before anything else, and before claiming
            _check_tenant(thread_id, await self.store.read(thread_id), tenant)
            claim = await self.store.claim(thread_id, self.holder, self.claims.ttl, tenant=tenant)
        try:
            snap = snapshot if snapshot is not None else await self.store.read(thread_id)
            _check_tenant(thread_id, snap, tenant)
        except BaseException:
            await self._give_back(thread_id, claim, owned)
            raise
        return claim, snap

    async def _give_back(self, thread_id: str, claim: Claim, owned: bool) -> None:
        """After a refusal: release a claim this runtime took; a caller's claim stays
        with the caller."""
        if owned:
            await self.store.release(thread_id, claim.token)

    def _execute(
        self,
        graph: CompiledGraph,
        thread_id: str,
        claim: Claim,
        checkpoint: Checkpoint,
        writes: tuple[PendingWrite, ...],
        durability: str,
        release: bool,
        dispatch_id: str | None = None,
        attempt: SpanLike = NO_SPAN,
        recovered_at: str | None = None,
        admission: Admission | None = None,
        trace: dict[str, str] | None = None,
        *,
        admitted: bool = False,
        message_count: int | None = None,
    ) -> RunHandle:
        """``admission``: the run is new, admitted by this attempt (``start``). ``trace``:
        the attempt's context as already injected (default: injected here). The run's task
        makes ``attempt`` current itself (``in_attempt``)."""
        if trace is None:
            trace = telemetry.inject(attempt) if attempt is not NO_SPAN else {}
        return RunHandle(
            Execution(
                store=self.store,
                graph=graph,
                thread_id=thread_id,
                claim=claim,
                checkpoint=checkpoint,
                writes={w.task_id: w for w in writes if w.checkpoint_id == checkpoint.id},
                durability=durability,
                policy=self.claims,
                clock=self.clock,
                sleep=self.sleep,
                renew_sleep=self.renew_sleep,
                live=self.live,
                release_claim=release,
                settle_dispatch=None if release else dispatch_id,
                attempt=attempt,
                trace=trace,
                calls=store_calls(self.store, self.metrics),
                metrics=self.metrics,
                recovered_at=recovered_at,
                admitted=admitted or admission is not None,
                history_seed=admission.history if admission is not None else None,
                message_count=message_count,
            ),
            then=alarm(self, graph) if release else None,  # a worker's lease wakes its runs
        )

    async def start(
        self,
        thread_id: str,
        graph: CompiledGraph,
        input: Mapping[str, Any] | None = None,
        *,
        durability: str = "sync",
        tenant: str | None = None,
        run_id: str | None = None,
        messages: Sequence[Message] = (),
        consume: Sequence[str] = (),
        claim: Claim | None = None,
        snapshot: ThreadSnapshot | None = None,
        dispatch_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunHandle:
        """Claim the thread and start a new run with ``input`` applied to the thread's state
        through the reducers; ``messages`` are appended to the thread in the run's first
        commit, which also consumes the inbox messages ``consume``. Refused with
        ``ThreadBusy`` while another claim is live and with ``RunInProgress`` while the last
        run is unfinished.

        Without ``claim``, the claim and the run's first commit are one atomic write
        (``claim_and_commit``) checked against the thread as read just before it, and the
        run's ending commit releases the claim.

        ``claim``: run under a claim the caller already holds (a worker's lease); the caller
        then keeps it at the end (and settles) instead of the runtime releasing it.
        ``snapshot``: with ``claim``, the thread as the caller read it under that claim.
        ``dispatch_id``: with ``claim``, the leased dispatch that the run's ending commit
        settles in the same atomic step (``Done`` when the run completes or fails,
        ``Awaiting`` when it suspends; ``RunHandle.settled`` tells whether it did).
        ``metadata``: more JSON the run's checkpoints carry (a worker records the target
        name); the runtime's own keys (``graph``, ``step`` ...) take precedence."""
        if durability not in DURABILITIES:
            raise InvalidInput("durability", f"must be one of {DURABILITIES}")
        run_id = check_id("run_id", run_id) if run_id else f"run-{uuid.uuid4().hex}"
        check_optional_id("dispatch_id", dispatch_id)
        admission = Admission(graph, input, durability, tenant, run_id, messages, consume, metadata)
        attempt = begin_run("start", thread_id, graph.name, run_id)
        admission.trace = telemetry.inject(attempt) if attempt is not NO_SPAN else {}
        try:
            with telemetry.use(attempt):
                if claim is None:

                    def build(snap: ThreadSnapshot | None) -> tuple[Checkpoint, Commit]:
                        return admission.build(thread_id, snap, self.clock)

                    claim, first = await self._claim_with_commit(thread_id, tenant, build)
                    owned = True
                else:
                    claim, snap = await self._admit(thread_id, tenant, claim, snapshot)
                    first, commit = admission.build(thread_id, snap, self.clock, claim.token)
                    await self._commit(thread_id, commit)
                    owned = False
        except BaseException as exc:
            telemetry.finish(attempt, exc)
            raise
        return self._execute(
            graph,
            thread_id,
            claim,
            first,
            (),
            durability,
            owned,
            dispatch_id,
            attempt,
            admission=admission,
            trace=admission.trace,
        )

    async def recover(
        self,
        thread_id: str,
        graph: CompiledGraph,
        *,
        durability: str | None = None,
        tenant: str | None = None,
        allow_graph_change: bool = False,
        claim: Claim | None = None,
        snapshot: ThreadSnapshot | None = None,
        dispatch_id: str | None = None,
    ) -> RunHandle:
        """Continue a running run whose process died, once its claim has expired (until
        then ``ThreadBusy``). Pending writes are read after the claim is granted and every
        finished task's result is reused. ``claim``, ``snapshot`` and ``dispatch_id`` as for
        ``start``."""
        owned = claim is None
        attempt = begin_run("recover", thread_id, graph.name)
        try:
            with telemetry.use(attempt):
                claim, snap = await self._admit(thread_id, tenant, claim, snapshot)
                try:
                    latest, mode = await self._recovery(
                        thread_id, graph, snap, claim, durability, allow_graph_change, attempt
                    )
                except BaseException:
                    await self._give_back(thread_id, claim, owned)
                    raise
        except BaseException as exc:
            telemetry.finish(attempt, exc)
            raise
        assert snap is not None
        return self._execute(
            graph,
            thread_id,
            claim,
            latest,
            snap.writes,
            mode,
            owned,
            dispatch_id,
            attempt,
            recovered_at=latest.id,
            message_count=snap.message_count,
        )

    async def _recovery(
        self,
        thread_id: str,
        graph: CompiledGraph,
        snap: ThreadSnapshot | None,
        claim: Claim,
        durability: str | None,
        allow_graph_change: bool,
        attempt: SpanLike,
    ) -> tuple[Checkpoint, str]:
        """Check that the thread has a run to recover and record ``run.recovered``; the
        checkpoint to continue from and the durability mode."""
        latest = snap.checkpoint if snap is not None else None
        if latest is None or latest.status != "running":
            raise NothingToRecover(thread_id, latest.status if latest else None)
        self._check_graph(thread_id, latest, graph, allow_graph_change)
        attempt.set_attribute("wakeful.run.id", latest.run_id)
        link_crashed(attempt, latest.metadata)
        mode = durability or str(latest.metadata.get("durability", "sync"))
        event = EventDraft(
            type="run.recovered",
            data={"holder": self.holder, "reused": len(snap.writes) if snap else 0},
            run_id=latest.run_id,
        )
        await self._commit(
            thread_id,
            Commit(
                token=claim.token,
                events=(event,),
                operation_id=f"{latest.id}:recovered:{claim.token}",
            ),
        )
        return latest, mode

    async def resume(
        self,
        thread_id: str,
        graph: CompiledGraph,
        answers: Mapping[str, Any],
        *,
        durability: str | None = None,
        tenant: str | None = None,
        allow_graph_change: bool = False,
        claim: Claim | None = None,
        resumed_by: str | None = None,
        snapshot: ThreadSnapshot | None = None,
        dispatch_id: str | None = None,
    ) -> RunHandle:
        """Answer some or all open tickets of a suspended run and continue it. Tasks that
        finished before the suspension are not run again. ``claim`` as for ``start`` (without
        it, the claim and the resuming commit are one atomic write, as in ``start``);
        ``resumed_by`` (a dispatch id) is recorded in the run's checkpoints so a redelivered
        resume can tell it was already applied. ``dispatch_id`` as for ``start``."""
        attempt = begin_run("resume", thread_id, graph.name)
        trace = telemetry.inject(attempt) if attempt is not NO_SPAN else {}
        try:
            with telemetry.use(attempt):
                if claim is None:

                    def build(snap: ThreadSnapshot | None) -> tuple[_Resumption, Commit]:
                        return self._resumption(
                            thread_id, snap, graph, answers, allow_graph_change, resumed_by, trace
                        )

                    claim, (latest, resumed, carried) = await self._claim_with_commit(
                        thread_id, tenant, build
                    )
                    owned = True
                else:
                    claim, snap = await self._admit(thread_id, tenant, claim, snapshot)
                    (latest, resumed, carried), commit = self._resumption(
                        thread_id, snap, graph, answers, allow_graph_change, resumed_by, trace
                    )
                    await self._commit(
                        thread_id, msgspec.structs.replace(commit, token=claim.token)
                    )
                    owned = False
        except BaseException as exc:
            telemetry.finish(attempt, exc)
            raise
        attempt.set_attribute("wakeful.run.id", latest.run_id)
        mode = durability or str(latest.metadata.get("durability", "sync"))
        return self._execute(
            graph,
            thread_id,
            claim,
            resumed,
            carried,
            mode,
            owned,
            dispatch_id,
            attempt,
            trace=trace,
        )

    def _resumption(
        self,
        thread_id: str,
        snap: ThreadSnapshot | None,
        graph: CompiledGraph,
        answers: Mapping[str, Any],
        allow_graph_change: bool,
        resumed_by: str | None,
        trace: dict[str, str],
    ) -> tuple[_Resumption, Commit]:
        """The suspended checkpoint, the resuming one and the carried writes, and the commit
        (token 0) that resumes the run, from the thread as read. Raises the refusals."""
        latest = snap.checkpoint if snap is not None else None
        if snap is None or latest is None or latest.status != "suspended":
            raise NotSuspended(thread_id, latest.status if latest else None)
        self._check_graph(thread_id, latest, graph, allow_graph_change)
        open_ids = {t["id"] for t in latest.metadata.get("tickets", [])}
        unknown = sorted(set(answers) - open_ids)
        if unknown:
            raise UnknownTicket(thread_id, unknown)
        ordinal = int(latest.metadata.get("ordinal", 0)) + 1
        merged = {**latest.metadata.get("answers", {}), **dict(answers)}
        resumed = msgspec.structs.replace(
            latest,
            id=f"{latest.run_id}-c{ordinal}",
            parent=latest.id,
            status="running",
            created_at=self.clock.now(),
            metadata=traced_metadata(
                {
                    **latest.metadata,
                    "ordinal": ordinal,
                    "answers": merged,
                    "tickets": [],
                    "messages": snap.message_count,
                    **({"resumed_by": resumed_by} if resumed_by else {}),
                },
                trace,
            ),
        )
        carried = tuple(msgspec.structs.replace(w, checkpoint_id=resumed.id) for w in snap.writes)
        event = EventDraft(
            type="run.resumed", data={"answered": sorted(answers)}, run_id=latest.run_id
        )
        commit = Commit(
            token=0, checkpoint=resumed, writes=carried, events=(event,), operation_id=resumed.id
        )
        return (latest, resumed, carried), commit

    async def _claim_with_commit(
        self,
        thread_id: str,
        tenant: str | None,
        build: Callable[[ThreadSnapshot | None], tuple[T, Commit]],
    ) -> tuple[Claim, T]:
        """An admission as one write: read the thread, ``build`` the first commit from it
        (token 0; ``build`` raises the refusals), then ``claim_and_commit`` it checked against
        the version read, reading again if the thread moved in between.

        A refusal judged from the read first tries a claim, so that a live claim's
        ``ThreadBusy`` comes first, as it would for an admission that claims first."""
        check_id("thread_id", thread_id)
        check_optional_id("tenant", tenant)
        for _attempt in range(ADMISSION_ATTEMPTS):
            snap = await self.store.read(thread_id)
            _check_tenant(thread_id, snap, tenant)
            try:
                built, commit = build(snap)
            except (RunInProgress, NotSuspended, UnknownTicket, GraphChanged):
                probe = await self.store.claim(thread_id, self.holder, self.claims.ttl)
                await self.store.release(thread_id, probe.token)
                raise
            version = snap.version if snap is not None else 0
            commit = msgspec.structs.replace(commit, expected_version=version)
            try:
                claim = await self._claim_and_commit(thread_id, commit)
            except VersionConflict:
                continue  # the thread moved between the read and the claim: read again
            return claim, built
        raise StoreUnavailable(
            f"thread {thread_id!r} changed under {ADMISSION_ATTEMPTS} admissions in a row"
        )

    async def _claim_and_commit(self, thread_id: str, commit: Commit) -> Claim:
        calls = store_calls(self.store, self.metrics)
        ttl = self.claims.ttl
        if calls is None:
            claim, _ = await self.store.claim_and_commit(thread_id, self.holder, ttl, commit)
        else:
            claim, _ = await calls(
                "claim_and_commit",
                lambda: self.store.claim_and_commit(thread_id, self.holder, ttl, commit),
                thread_id,
            )
        return claim

    async def _commit(self, thread_id: str, commit: Commit) -> None:
        """An admission's commit under a claim the caller holds (observed, retried)."""
        calls = store_calls(self.store, self.metrics)
        await commit_retrying(self.store, thread_id, commit, calls)

    async def replay(
        self,
        thread_id: str,
        graph: CompiledGraph,
        checkpoint_id: str,
        input: Mapping[str, Any] | None = None,
        *,
        messages: Sequence[Message] = (),
        keep_messages: int | None = None,
        durability: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
        allow_graph_change: bool = False,
        claim: Claim | None = None,
        snapshot: ThreadSnapshot | None = None,
        dispatch_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunHandle:
        """Start a new run from the earlier checkpoint ``checkpoint_id`` (time travel): its
        state, the messages as of it and its frontier; from a checkpoint that is not the
        head it branches the thread, keeping the abandoned checkpoints readable. Refused
        with ``ThreadBusy`` while a run is live. See ``wakeful.runtime.travel.replay``."""
        return await travel.replay(
            self,
            thread_id,
            graph,
            checkpoint_id,
            input,
            messages=messages,
            keep_messages=keep_messages,
            durability=durability,
            tenant=tenant,
            run_id=run_id,
            allow_graph_change=allow_graph_change,
            claim=claim,
            snapshot=snapshot,
            dispatch_id=dispatch_id,
            metadata=metadata,
        )

    async def update_state(
        self,
        thread_id: str,
        graph: CompiledGraph,
        values: Mapping[str, Any],
        *,
        as_node: str | None = None,
        checkpoint_id: str | None = None,
        tenant: str | None = None,
        allow_graph_change: bool = False,
    ) -> Checkpoint:
        """Commit a checkpoint whose state is ``values`` applied through the reducers to the
        head's (or ``checkpoint_id``'s, which branches) state, as if ``as_node`` had
        returned them. Refused with ``ThreadBusy`` while a run is live. See
        ``wakeful.runtime.travel.update_state``."""
        return await travel.update_state(
            self,
            thread_id,
            graph,
            values,
            as_node=as_node,
            checkpoint_id=checkpoint_id,
            tenant=tenant,
            allow_graph_change=allow_graph_change,
        )

    async def delete_thread(self, thread_id: str, *, tenant: str | None = None) -> None:
        """Delete the thread and everything in it; refused with ``ThreadBusy`` while a run
        holds it."""
        claim, _ = await self._admit(thread_id, tenant)
        del claim  # deletion drops the claim with everything else
        await self.store.delete_thread(thread_id)

    def subscribe(
        self, thread_id: str, after_seq: int = 0, *, live: bool = True
    ) -> AsyncIterator[Event | LiveEvent]:
        """Durable events after ``after_seq`` (from the store, so also those committed by
        other processes) and this process's live events, in one async iterator."""
        check_id("thread_id", thread_id)
        return subscribe(self.store, self.live, thread_id, after_seq, live=live)

    @staticmethod
    def _check_graph(thread_id: str, latest: Checkpoint, graph: CompiledGraph, allow: bool) -> None:
        recorded = latest.metadata.get("fingerprint")
        if recorded != graph.fingerprint and not allow:
            raise GraphChanged(thread_id, recorded, graph.fingerprint)


def _check_tenant(thread_id: str, snap: ThreadSnapshot | None, tenant: str | None) -> None:
    """A thread whose tenant is fixed (by a commit, or by queued work of a tenant) runs
    only for that tenant; the store refuses the rest again, atomically."""
    if snap is not None and snap.tenant_bound and snap.tenant != tenant:
        raise TenantMismatch(thread_id)
