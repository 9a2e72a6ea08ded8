"""What a node sees while it runs: its fencing token, a deterministic idempotency key,
interrupts, and event emission."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol

import msgspec

from wakeful.records import EventDraft, Message, OutboxEntry
from wakeful.runtime.claims import Progress
from wakeful.store.contract import ThreadStore


class Ticket(msgspec.Struct, frozen=True, kw_only=True):
    """An open question a suspended run waits on. Answer it with ``Runtime.resume``."""

    id: str
    task_id: str
    node: str
    question: Any
    schema: Any = None


class Interrupt(Exception):
    """Raised inside a node by ``ctx.interrupt`` when its ticket has no answer yet. The task
    stops; the run suspends at the barrier."""

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        super().__init__(f"interrupted: ticket {ticket.id}")


def idempotency_key(thread_id: str, run_id: str, step: int, task_id: str) -> str:
    """Deterministic per thread, run, superstep and task: the same task recovered in another
    process gets the same key, so a system that deduplicates sees one request."""
    raw = f"{thread_id}\x00{run_id}\x00{step}\x00{task_id}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


class TaskServices(Protocol):
    """What the execution offers a running task."""

    store: ThreadStore

    async def history(self) -> list[Message]: ...

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
        self._answers = answers
        self.patches: tuple[str, ...] = tuple(patches)
        """The patches the run's code declared when it started (``patched``)."""
        self._interrupts = 0
        self._emit_live = emit_live
        self._wants_live = wants_live
        self._services = services
        self._progress = progress if progress is not None else Progress()
        self.events: list[EventDraft] = []
        self.messages: list[Message] = []
        self.outbox: list[OutboxEntry] = []
        self.committed_callbacks: list[Callable[[], Awaitable[None]]] = []

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
        ticket_id = f"{self.task_id}-i{self._interrupts}"
        if ticket_id in self._answers:
            return self._answers[ticket_id]
        raise Interrupt(
            Ticket(
                id=ticket_id, task_id=self.task_id, node=self.node, question=question, schema=schema
            )
        )

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
