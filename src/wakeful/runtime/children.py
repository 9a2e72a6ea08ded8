"""Child runs (``NodeContext.spawn`` / ``join``): what a spawn records, how a child's
thread and run are named, and how a parent reads a child's outcome.

A spawn is an outbox entry of the parent's commit (``Commit.outbox``): the relay delivers
it to the child's thread once (by its message id) and enqueues the ``message`` dispatch
that starts the child, so a crash between deciding and recording cannot lose or double it.
Every id is derived from the parent's thread, run, superstep, task and the spawn's call
position: a node that runs again spawns the same child. A ``join`` that finds its child
unfinished suspends the parent on a ticket of schema ``JOIN_SCHEMA``; the child's end
enqueues a ``resume`` of the parent (``wakeful.fleet.joins``) that answers it with the
child's outcome (``outcome_of``). See docs/composition.md and decision 0046."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import msgspec

from wakeful.errors import ChildFailed, DispatchConflict, InvalidInput
from wakeful.ids import MAX_ID_LENGTH, check_id
from wakeful.records import (
    IF_BUSY,
    TERMINAL_STATUSES,
    Checkpoint,
    Dispatch,
    EventDraft,
    IfBusy,
    OutboxEntry,
)
from wakeful.store.contract import DispatchQueue, ThreadStore

JOIN_SCHEMA = "wakeful.join"
"""The ``schema`` of a join's ticket: the child's end answers it, not a person."""
SPAWN_KEY = "wakeful.spawn"
"""The key of a spawn's envelope in the payload of its outbox entry (and inbox message)."""


_WATCHERS: set[Callable[[], None]] = set()


def watch_spawns(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` each time a run of this process has committed spawns its join
    waits for (a relay in this process delivers them at once instead of at its next
    step); returns what stops it."""
    _WATCHERS.add(callback)
    return lambda: _WATCHERS.discard(callback)


def spawns_committed() -> None:
    """A run of this process committed spawns it now waits for (``watch_spawns``)."""
    for callback in list(_WATCHERS):
        callback()


class ChildRun(msgspec.Struct, frozen=True, kw_only=True):
    """A child run as ``spawn`` returns it; JSON, so a node may keep it in the graph's state
    and join it in a later node."""

    thread_id: str
    run_id: str
    target: str
    spawn_id: str
    """The spawn's message id: the same for the same parent task and call position."""
    detached: bool = False

    @property
    def ticket_id(self) -> str:
        """The id of the ticket a ``join`` of this child suspends on."""
        return f"{self.spawn_id}-join"

    @classmethod
    def of(cls, value: Any) -> ChildRun:
        """``value`` as a ``ChildRun``: one, or its JSON form (from the graph's state)."""
        if isinstance(value, ChildRun):
            return value
        try:
            return msgspec.convert(value, cls)
        except msgspec.ValidationError as exc:
            raise InvalidInput("child", f"is not a child run from spawn: {exc}") from None


class ChildOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """A completed child run, as ``join`` returns it: its final ``state`` and, for an agent,
    its ``reply`` (the final answer's text)."""

    thread_id: str
    run_id: str
    status: str
    state: Any = None
    reply: str | None = None


def _digest(*parts: object) -> str:
    raw = "\x00".join(str(p) for p in parts).encode()
    return hashlib.sha256(raw).hexdigest()


def child_run_id(thread_id: str, spawn_id: str) -> str:
    """The run id of a child: the one a worker gives the run of the relayed spawn's
    ``message`` dispatch (``run-`` + the dispatch id every store derives from the target
    thread and the message id)."""
    digest = _digest(thread_id, spawn_id)[:40]
    return f"run-msg-{digest}"


def plan_child(
    *,
    parent_thread: str,
    parent_run: str,
    step: int,
    task_id: str,
    node: str,
    position: int,
    target: str,
    thread_id: str | None,
    detached: bool,
) -> ChildRun:
    """The child that the ``position``-th spawn of a task names: deterministic, so a task
    that runs again (after a crash, a resume) names the same child. The default thread id
    is ``<parent thread>:<node>:<12 hex digits>`` (``/`` is outside the id alphabet; the
    digest tells apart the children of different runs, steps and tasks of the node)."""
    check_id("target", target)
    key = _digest(parent_thread, parent_run, step, task_id, position)
    spawn_id = f"spawn-{key[:32]}"
    if thread_id is None:
        thread_id = f"{parent_thread}:{node}:{key[:12]}"
        if len(thread_id) > MAX_ID_LENGTH:
            raise InvalidInput(
                "thread_id",
                f"the default child thread id would be {len(thread_id)} characters long "
                f"(the limit is {MAX_ID_LENGTH}); pass thread_id= to spawn",
            )
    check_id("thread_id", thread_id)
    if thread_id == parent_thread:
        raise InvalidInput("thread_id", "a child run needs a thread of its own")
    return ChildRun(
        thread_id=thread_id,
        run_id=child_run_id(thread_id, spawn_id),
        target=target,
        spawn_id=spawn_id,
        detached=detached,
    )


def child_dispatch_id(child: ChildRun) -> str:
    """The id of the dispatch that starts ``child``: the relayed spawn's ``message``
    dispatch, or (a spawn with a busy-thread policy) the ``start`` dispatch the spawn
    enqueues itself; either way its run is ``child.run_id``."""
    return child_dispatch_id_of(child.run_id)


def check_if_busy(if_busy: str) -> IfBusy:
    """``if_busy`` of a spawn, checked (one of ``IF_BUSY``)."""
    if if_busy not in IF_BUSY:
        raise InvalidInput("if_busy", f"must be one of {sorted(IF_BUSY)}, not {if_busy!r}")
    return if_busy  # type: ignore[return-value]


async def enqueue_spawn(
    store: ThreadStore, child: ChildRun, body: dict[str, Any], if_busy: IfBusy
) -> None:
    """Start ``child`` now with a busy-thread policy other than ``enqueue``: a ``start``
    dispatch of the child's thread, its id derived from the spawn (a spawn repeated from
    the same task and call position finds it stored and changes nothing), its payload
    the target, the input, the child's run id and the spawn's envelope (``body``). The
    store applies the policy atomically: ``reject`` raises ``ThreadBusy`` (nothing
    stored), ``interrupt``/``rollback`` fence the busy run, ``coalesce`` waits to be
    folded with the thread's other ``coalesce`` starts."""
    if not isinstance(store, DispatchQueue):
        raise InvalidInput("if_busy", "a spawn with a busy-thread policy needs a fleet's store")
    spawn = body[SPAWN_KEY]
    parent = spawn["parent"]
    dispatch = Dispatch(
        dispatch_id=child_dispatch_id(child),
        thread_id=child.thread_id,
        kind="start",
        payload={
            "target": child.target,
            "input": spawn.get("input"),
            "run_id": child.run_id,
            SPAWN_KEY: spawn,
        },
        tenant=parent.get("tenant"),
        if_busy=if_busy,
    )
    try:
        await store.enqueue(dispatch)
    except DispatchConflict as conflict:
        if conflict.existing_id != dispatch.dispatch_id:
            raise
        # the same call position spawned first with another input (a task that is not
        # deterministic): the first spawn stands, as a relayed one's would


def envelope(
    child: ChildRun, input: Any, parent_thread: str, parent_run: str, tenant: str | None = None
) -> dict[str, Any]:
    """The payload of the spawn's outbox entry: what the child's worker starts. The parent
    link names the parent's tenant (when it has one): the child's thread gets it too."""
    parent = {"thread": parent_thread, "run_id": parent_run}
    if tenant is not None:
        parent["tenant"] = tenant
    return {
        SPAWN_KEY: {
            "target": child.target,
            "input": input,
            "parent": parent,
            "detached": child.detached,
        }
    }


def spawn_of(payload: Any) -> dict[str, Any] | None:
    """The spawn envelope of an inbox message's payload, or ``None``."""
    if isinstance(payload, dict):
        found = payload.get(SPAWN_KEY)
        if isinstance(found, dict) and isinstance(found.get("target"), str):
            return found
    return None


def spawns_of(
    events: list[EventDraft], outbox: list[OutboxEntry]
) -> tuple[tuple[EventDraft, ...], tuple[OutboxEntry, ...]]:
    """What an interrupted task keeps of its events and outbox: its spawns (their
    ``child.spawned`` events and outbox entries), which its run's suspension commits so
    that the child it joins exists. The rest is dropped, as before: the task runs again
    on resume and records it then."""
    return (
        tuple(e for e in events if e.type == "child.spawned"),
        tuple(o for o in outbox if spawn_of(o.payload) is not None),
    )


def spawn_ids(events: tuple[EventDraft, ...]) -> list[str]:
    """The spawn ids named by the ``child.spawned`` events among ``events``."""
    return [
        str(e.data["spawn_id"])
        for e in events
        if e.type == "child.spawned" and isinstance(e.data, dict) and "spawn_id" in e.data
    ]


def parent_of(checkpoint: Checkpoint | None) -> dict[str, Any] | None:
    """The parent link a child run records in its checkpoints (``metadata["parent"]``)."""
    if checkpoint is None:
        return None
    parent = checkpoint.metadata.get("parent")
    if isinstance(parent, dict) and isinstance(parent.get("thread"), str):
        return parent
    return None


def outcome_of(cp: Checkpoint) -> dict[str, Any] | None:
    """The answer a join ticket gets from the child's checkpoint ``cp``: its status, its
    final state (and reply) or its error; ``None`` while the run is unfinished."""
    if cp.status not in TERMINAL_STATUSES:
        return None
    answer: dict[str, Any] = {"status": cp.status, "thread_id": "", "run_id": cp.run_id}
    if cp.status == "completed":
        answer["state"] = cp.state
        graph = cp.metadata.get("graph")
        if isinstance(graph, str) and graph.startswith("agent:") and isinstance(cp.state, dict):
            answer["reply"] = cp.state.get("final")
    else:
        error = cp.metadata.get("error") or cp.metadata.get("ended_by")
        answer["error"] = str(error) if error is not None else None
    return answer


async def read_outcome(store: ThreadStore, thread_id: str, run_id: str) -> dict[str, Any] | None:
    """The outcome of run ``run_id`` on ``thread_id`` if it has ended, else ``None``. The
    thread's latest checkpoint, or (the thread moved on to a later run) the run's last. A
    child spawned with ``if_busy="coalesce"`` whose dispatch another run answered
    (``Dispatch.answered_by``) has the outcome of that run."""
    found = await _last_checkpoint(store, thread_id, run_id)
    if found is None:
        answered = await _answering_run(store, run_id)
        if answered is not None:
            found = await _last_checkpoint(store, thread_id, answered)
    if found is None:
        return None
    answer = outcome_of(found)
    if answer is not None:
        answer["thread_id"] = thread_id
    return answer


async def _last_checkpoint(store: ThreadStore, thread_id: str, run_id: str) -> Checkpoint | None:
    snap = await store.read(thread_id)
    latest = snap.checkpoint if snap is not None else None
    if latest is None:
        return None
    if latest.run_id == run_id:
        return latest
    for segment in await store.runs(thread_id, limit=100):
        if segment.run_id == run_id:
            entry = await store.get_checkpoint(thread_id, segment.last_id)
            return entry.checkpoint if entry is not None else None
    return None


async def _answering_run(store: ThreadStore, run_id: str) -> str | None:
    """The run that answered child run ``run_id``, when its start dispatch was coalesced
    into another one (only a spawn with a busy policy has a ``start`` dispatch named by
    its run id); else ``None``."""
    if not isinstance(store, DispatchQueue) or not run_id.startswith("run-msg-"):
        return None
    mine = await store.get_dispatch(child_dispatch_id_of(run_id))
    if mine is None or mine.kind != "start" or mine.answered_by is None:
        return None
    head = await store.get_dispatch(mine.answered_by)
    payload = head.payload if head is not None else None
    named = payload.get("run_id") if isinstance(payload, dict) else None
    return str(named) if named else f"run-{mine.answered_by}"


def child_dispatch_id_of(run_id: str) -> str:
    """The dispatch id that starts child run ``run_id`` (``child_dispatch_id``)."""
    return run_id.removeprefix("run-")


def result_of(answer: Any) -> ChildOutcome:
    """A join's answer as ``join`` returns it; ``ChildFailed`` unless it completed."""
    if not isinstance(answer, dict):
        raise InvalidInput("answer", "a join ticket's answer must be a child run's outcome")
    status = str(answer.get("status"))
    thread_id, run_id = str(answer.get("thread_id")), str(answer.get("run_id"))
    if status != "completed":
        error = answer.get("error")
        raise ChildFailed(thread_id, run_id, status, str(error) if error is not None else None)
    reply = answer.get("reply")
    return ChildOutcome(
        thread_id=thread_id,
        run_id=run_id,
        status=status,
        state=answer.get("state"),
        reply=reply if isinstance(reply, str) else None,
    )


def join_question(child: ChildRun) -> dict[str, Any]:
    """The question of a join's ticket: the child it waits for."""
    return {"join": {"thread": child.thread_id, "run_id": child.run_id, "target": child.target}}


__all__ = [
    "JOIN_SCHEMA",
    "SPAWN_KEY",
    "ChildOutcome",
    "ChildRun",
    "check_if_busy",
    "child_dispatch_id",
    "child_run_id",
    "enqueue_spawn",
    "envelope",
    "join_question",
    "outcome_of",
    "parent_of",
    "plan_child",
    "read_outcome",
    "result_of",
    "spawn_ids",
    "spawn_of",
    "spawns_committed",
    "spawns_of",
    "watch_spawns",
]
