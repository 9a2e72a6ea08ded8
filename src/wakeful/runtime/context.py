"""What a node sees while it runs: its fencing token, a deterministic idempotency key,
interrupts, and event emission."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from wakeful.clock import Clock, SystemClock
from wakeful.errors import InvalidInput
from wakeful.records import Checkpoint, EventDraft, Message, OutboxEntry, PendingWrite
from wakeful.runtime import children
from wakeful.runtime.children import ChildOutcome, ChildRun
from wakeful.runtime.claims import Progress, Sleep
from wakeful.store.contract import ThreadStore

if TYPE_CHECKING:
    from wakeful.runtime.graph import NodeSpec


class Ticket(msgspec.Struct, frozen=True, kw_only=True):
    """An open question a suspended run waits on. Answer it with ``Runtime.resume``."""

    id: str
    task_id: str
    node: str
    question: Any
    schema: Any = None


class Interrupt(Exception):
    """Raised inside a node by ``ctx.interrupt`` when its ticket has no answer yet. The task
    stops; the run suspends at the barrier. A subgraph node raises one for all the tickets
    of its child superstep, with the pending writes (its progress) that the suspended
    checkpoint must carry so that the resumed run continues inside the subgraph."""

    def __init__(self, ticket: Ticket, *more: Ticket, carry: tuple[PendingWrite, ...] = ()) -> None:
        self.ticket = ticket
        self.tickets = (ticket, *more)
        self.carry = carry
        super().__init__(f"interrupted: tickets {[t.id for t in self.tickets]}")


SLEEP_SCHEMA = "wakeful.sleep"
"""The ``schema`` of a sleep's ticket (``ctx.sleep``): the wake-up answers it, not a person."""


def sleep_ticket_wake(ticket: Ticket) -> datetime | None:
    """When the sleep ``ticket`` stands for ends, or ``None`` if it is not a sleep's."""
    if ticket.schema != SLEEP_SCHEMA or not isinstance(ticket.question, dict):
        return None
    until = ticket.question.get("sleep_until")
    return datetime.fromisoformat(until) if isinstance(until, str) else None


def idempotency_key(thread_id: str, run_id: str, step: int, task_id: str) -> str:
    """Deterministic per thread, run, superstep and task: the same task recovered in another
    process gets the same key, so a system that deduplicates sees one request."""
    raw = f"{thread_id}\x00{run_id}\x00{step}\x00{task_id}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


class TaskServices(Protocol):
    """What the execution offers a running task."""

    store: ThreadStore
    checkpoint: Checkpoint
    writes: dict[str, PendingWrite]

    @property
    def sleep(self) -> Sleep: ...

    async def history(self) -> list[Message]: ...

    async def commit_writes(
        self,
        writes: tuple[PendingWrite, ...],
        events: tuple[EventDraft, ...] = (),
        messages: tuple[Message, ...] = (),
        outbox: tuple[OutboxEntry, ...] = (),
        now: bool = False,
    ) -> None: ...

    async def commit_mark(self, task_id: str, node: str, name: str) -> None: ...

    def has_mark(self, task_id: str, name: str) -> bool: ...


class NodeContext:
    """Passed to nodes that take a second parameter."""

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        step: int,
        task_id: str,
        node: str,
        fencing_token: int,
        answers: dict[str, Any],
        emit_live: Callable[[str, Any], None],
        services: TaskServices,
        arg: Any = None,
        progress: Progress | None = None,
        recovered: bool = False,
        fresh: bool = False,
        wants_live: Callable[[str], bool] | None = None,
        clock: Clock | None = None,
        sent: bool = False,
        path: str | None = None,
        patches: Collection[str] = (),
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.step = step
        self.task_id = task_id
        self.node = node
        self.fencing_token = fencing_token
        """The claim token this run writes under; pass it to a system that can fence."""
        self._key: str | None = None
        self.arg = arg
        self.recovered = recovered
        """The run was recovered at this task's superstep: an earlier attempt may have
        started this task (a tool then says it replayed the call)."""
        self.fresh = fresh
        """No earlier attempt can have started this task: it belongs to a checkpoint this
        attempt committed (a new run's first, or one after a barrier), not to the one a
        recovery or a resume continues from. So there is nothing of an earlier attempt to
        look for (a stream checkpoint of the agent's model turn)."""
        self.sent = sent
        """The task was started by a ``Send`` (so its node may run more than once in the
        superstep)."""
        self.path = path
        """For a task inside a subgraph: its node path (``research/plan``), which names its
        tickets; ``None`` at the top level (tickets are named by the task id)."""
        self._answers = answers
        self.patches: tuple[str, ...] = tuple(patches)
        """The patches the run's code declared when it started (``patched``)."""
        self._interrupts = 0
        self._sleeps = 0
        self._spawns = 0
        self._clock: Clock = clock or SystemClock()
        self._emit_live = emit_live
        self._wants_live = wants_live
        self._services = services
        self._progress = progress if progress is not None else Progress()
        self.events: list[EventDraft] = []
        self.messages: list[Message] = []
        self.outbox: list[OutboxEntry] = []
        self.committed_callbacks: list[Callable[[], Awaitable[None]]] = []
        self.subgraphs: dict[str, Any] = {}
        """Filled by a subgraph node: what ran inside it, by node path (``{"research":
        {"graph": ..., "steps": [[nodes], ...]}}``), recorded in the next checkpoint's
        ``metadata["subgraphs"]``."""

    @property
    def idempotency_key(self) -> str:
        """Deterministic per thread, run, superstep and task (``idempotency_key``); made
        when first asked for (most nodes never ask)."""
        if self._key is None:
            self._key = idempotency_key(self.thread_id, self.run_id, self.step, self.task_id)
        return self._key

    @property
    def store(self) -> ThreadStore:
        """The store the run writes to (read it; write only through the context)."""
        return self._services.store

    async def history(self) -> list[Message]:
        """The thread's conversation: committed messages and those this run has recorded,
        in order (not including this task's own ``append_message`` calls)."""
        return await self._services.history()

    def append_message(self, message: Message) -> None:
        """Append a message to the thread, atomically with this task's result."""
        self.messages.append(message)

    def send(
        self,
        target_thread: str,
        payload: Any,
        *,
        message_id: str | None = None,
        correlation_id: str | None = None,
    ) -> str:
        """Send a message to another thread: staged in this task's commit and delivered to
        the target's inbox exactly once by the relay. Returns the message id (by default
        deterministic for this task, so a re-run task sends the same message)."""
        ident = message_id or f"msg-{self.idempotency_key}-{len(self.outbox)}"
        self.outbox.append(
            OutboxEntry(
                message_id=ident,
                target_thread=target_thread,
                payload=payload,
                correlation_id=correlation_id,
            )
        )
        return ident

    async def mark(self, name: str) -> None:
        """Durably record that this task reached ``name`` (e.g. ``"started"``) before going
        on. A recovered task sees it with ``has_mark``. Needs ``sync`` or ``async``
        durability."""
        await self._services.commit_mark(self.task_id, self.node, name)

    def has_mark(self, name: str) -> bool:
        """Whether an earlier attempt of this task recorded ``mark(name)``."""
        return self._services.has_mark(self.task_id, name)

    def on_committed(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this task's result is durable (best effort: a crash in
        between skips it)."""
        self.committed_callbacks.append(callback)

    def interrupt(self, question: Any, schema: Any = None) -> Any:
        """Suspend the run with a ticket asking ``question``; returns the answer once the run
        is resumed with one. Tasks that finished in the same superstep are not run again."""
        self._interrupts += 1
        ticket_id = f"{self.path or self.task_id}-i{self._interrupts}"
        if ticket_id in self._answers:
            return self._answers[ticket_id]
        raise Interrupt(
            Ticket(
                id=ticket_id, task_id=self.task_id, node=self.node, question=question, schema=schema
            )
        )

    async def sleep(self, duration: timedelta | float) -> None:
        """Sleep durably for ``duration`` (a ``timedelta`` or seconds): the run commits,
        releases its claim and is woken when the time has come, by any worker (the store's
        clock decides; an embedded ``Runtime`` keeps a timer). No process waits meanwhile;
        the run shows ``sleeping`` with its wake time, and a cancel ends it.

        As with ``interrupt``, the node runs again from its start when the run wakes (this
        call then returns at once): keep what must happen once before the sleep in an
        earlier node, or behind ``mark``/``has_mark``."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise InvalidInput("duration", "must be a timedelta or seconds, 0 or more")
        await self.sleep_until(self._clock.now() + timedelta(seconds=seconds))

    async def sleep_until(self, when: datetime) -> None:
        """Sleep durably until ``when`` (timezone-aware); see ``sleep``."""
        if not isinstance(when, datetime) or when.utcoffset() is None:
            raise InvalidInput("when", "must be a timezone-aware datetime")
        self._sleeps += 1
        ticket_id = f"{self.path or self.task_id}-s{self._sleeps}"
        if ticket_id in self._answers:
            return
        question = {"sleep_until": when.isoformat()}
        raise Interrupt(
            Ticket(
                id=ticket_id,
                task_id=self.task_id,
                node=self.node,
                question=question,
                schema=SLEEP_SCHEMA,
            )
        )

    @property
    def clock(self) -> Clock:
        """The run's clock (what ``sleep`` measures from)."""
        return self._clock

    def next_sleep_answer(self) -> Any:
        """The answer of the sleep this task would take next (its wake time, ISO 8601) when
        the run was woken from it, else ``None``: what a task that must not run its work
        again after a sleep (an agent's tool call) checks first."""
        return self._answers.get(f"{self.path or self.task_id}-s{self._sleeps + 1}")

    async def spawn(
        self,
        target: str,
        input: Any = None,
        *,
        thread_id: str | None = None,
        if_busy: str = "enqueue",
        detached: bool = False,
    ) -> ChildRun:
        """Start a run of the registered ``target`` (a worker's ``Registry`` name) with
        ``input`` on a thread of its own: by default a new one,
        ``<this thread>:<node>:<digest>``. Recorded in this task's commit (an outbox entry
        the relay delivers once), so the child starts exactly once, after that commit; the
        same call of the same task (a task run again after a crash or a resume) returns the
        same child. Join it with ``join``/``join_all``, here or in a later node (the
        ``ChildRun`` is JSON: keep it in the state). Cancelling this run cancels the child
        while it runs, unless ``detached``. Needs a worker fleet (the relay and a worker
        whose registry has ``target``). ``if_busy``: what the child does when ``thread_id``
        is busy (docs/busy-threads.md): ``"enqueue"`` (wait, the default; recorded with this
        task's commit), or ``"reject"`` (``ThreadBusy`` raised here, nothing started),
        ``"interrupt"``, ``"rollback"``, ``"coalesce"``: these are decided against the
        thread as it is now, so the child's dispatch is enqueued at this call, idempotent by
        its derived id (docs/composition.md#busy-child-threads)."""
        policy = children.check_if_busy(if_busy)
        self._spawns += 1
        child = children.plan_child(
            parent_thread=self.thread_id,
            parent_run=self.run_id,
            step=self.step,
            task_id=self.task_id,
            node=self.node,
            position=self._spawns,
            target=target,
            thread_id=thread_id,
            detached=detached,
        )
        if child.spawn_id in self._services.checkpoint.metadata.get("spawned", ()):
            return child  # recorded by the suspension this task resumes from
        body = children.envelope(
            child, input, self.thread_id, self.run_id, self._services.checkpoint.tenant
        )
        if policy == "enqueue":
            self.outbox.append(
                OutboxEntry(
                    message_id=child.spawn_id,
                    target_thread=child.thread_id,
                    payload=body,
                    correlation_id=self.run_id,
                )
            )
        else:
            await children.enqueue_spawn(self.store, child, body, policy)
        self.emit("child.spawned", msgspec.to_builtins(child))
        return child

    async def join(self, child: ChildRun | dict[str, Any]) -> ChildOutcome:
        """Wait for ``child`` to end and return its outcome (final state; an agent's reply);
        raises ``ChildFailed`` if it failed, was cancelled or interrupted. While it runs the
        run suspends without its claim or a worker slot, and the child's end resumes it
        (this node then runs again from its start, and its spawns return the same
        children)."""
        (outcome,) = await self.join_all([child])
        return outcome

    async def join_all(self, runs: Collection[ChildRun | dict[str, Any]]) -> list[ChildOutcome]:
        """``join`` for several children: their outcomes in order once all have ended (the
        run suspends on every unfinished one at once). A child that ended other than
        completed raises ``ChildFailed``, the first in order, as soon as it is known."""
        answers: list[Any] = []
        waiting: list[Ticket] = []
        for raw in runs:
            child = ChildRun.of(raw)
            answer = self._answers.get(child.ticket_id)
            if answer is None:
                answer = await children.read_outcome(self.store, child.thread_id, child.run_id)
            if answer is None:
                waiting.append(
                    Ticket(
                        id=child.ticket_id,
                        task_id=self.task_id,
                        node=self.node,
                        question=children.join_question(child),
                        schema=children.JOIN_SCHEMA,
                    )
                )
            elif not isinstance(answer, dict) or answer.get("status") != "completed":
                children.result_of(answer)  # a failure is raised at once
            answers.append(answer)
        if waiting:
            raise Interrupt(*waiting)
        return [children.result_of(a) for a in answers]

    def child(
        self,
        *,
        task_id: str,
        node: str,
        path: str,
        answers: dict[str, Any],
        arg: Any,
        sent: bool,
        first: bool,
    ) -> NodeContext:
        """The context of a task inside a subgraph this task runs: the same run, claim and
        services, a namespaced task id and a node path. ``first``: the task belongs to the
        subgraph's superstep this attempt continues from (so an earlier attempt may have
        started it); later ones are fresh."""
        return NodeContext(
            thread_id=self.thread_id,
            run_id=self.run_id,
            step=self.step,
            task_id=task_id,
            node=node,
            fencing_token=self.fencing_token,
            answers=answers,
            emit_live=self._emit_live,
            services=self._services,
            arg=arg,
            progress=self._progress,
            recovered=self.recovered and first,
            fresh=self.fresh or not first,
            wants_live=self._wants_live,
            sent=sent,
            path=path,
            clock=self._clock,
            patches=self.patches,
        )

    @property
    def services(self) -> TaskServices:
        """What the execution offers this task (a subgraph commits its progress through it)."""
        return self._services

    def patched(self, change_id: str) -> bool:
        """Whether this run started on code that declared the patch ``change_id``
        (``Graph(..., patches=[...])``, ``Agent(..., patches=[...])``): take the new branch
        if so, the old one if not. The declared patches are recorded in the run's first
        checkpoint, so every attempt of the run (a recovery, a resume, on newer code) gets
        the same answer."""
        return change_id in self.patches

    def emit(self, type: str, data: Any = None) -> None:
        """A durable event, committed with this task's result (numbered by the store)."""
        self.events.append(
            EventDraft(type=type, data=data, run_id=self.run_id, task_id=self.task_id)
        )

    def report_progress(self) -> None:
        """Tell the runtime this task is making progress: a run keeps its claim renewed only
        while it makes progress or waits in ``waiting`` (see ``ClaimPolicy.stall_after``)."""
        self._progress.moved()

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        """``with ctx.waiting(): ...``: the task is known to be waiting (on a slow service,
        a model, a tool) for the block, however long it takes; the run's claim stays
        renewed meanwhile."""
        return self._progress.wait()

    def wants_live(self, type: str) -> bool:
        """Whether a live event of ``type`` would reach anybody now (a subscriber in this
        process, or a channel that forwards it); skip building one that would be dropped."""
        return self._wants_live is None or self._wants_live(type)

    def emit_live(self, type: str, data: Any = None) -> None:
        """A live event for this process's subscribers only; never stored."""
        self._emit_live(type, data)


async def call_node(spec: NodeSpec, entry: dict[str, Any], state: Any, ctx: NodeContext) -> Any:
    """Call a node with its input (the state, or the ``Send`` argument) and validate what it
    returns: a dict of JSON-encodable updates, or ``None``."""
    value = entry.get("arg") if entry.get("sent") else dict(state or {})
    args = (value, ctx) if spec.takes_ctx else (value,)
    if spec.is_async:
        updates = await spec.fn(*args)
    else:
        updates = await asyncio.to_thread(spec.fn, *args)
    if updates is None:
        return {}
    if not isinstance(updates, dict):
        raise TypeError(f"returned {type(updates).__name__}; return a dict of updates or None")
    try:
        return msgspec.json.decode(msgspec.json.encode(updates))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"returned updates that are not JSON: {exc}") from exc
