"""What a worker records when a newer submission rolls the thread's busy run back
(``if_busy="rollback"``, docs/busy-threads.md): the run ends ``interrupted``, and its
ending commit is a *branch* back to where the thread was before the run started, so its
head, state and messages are what they were then while everything the run committed stays
readable as an abandoned branch (decision 0036: nothing is destroyed). The event
``run.rolled_back`` lists the run's tool calls that took effect, for an operator to
compensate.

"Before the run started" is the thread's head just before the run's first commit: the
parent of its first checkpoint, or, when that first commit was itself a branch (a run
started ``from_checkpoint``), the head that branch left (``Branch.old_head``). A run that
started on an empty thread has no such checkpoint: the rollback then branches from the
run's first checkpoint (where the thread's log begins), keeping no messages, with an empty
state, so the next run starts as on a new thread."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from wakeful.errors import InvalidState, NotFound
from wakeful.records import (
    Checkpoint,
    Commit,
    EventDraft,
    Message,
    PendingWrite,
    ThreadSnapshot,
)
from wakeful.runtime.context import idempotency_key
from wakeful.runtime.history import message_count_at
from wakeful.store.contract import Store

if TYPE_CHECKING:
    from wakeful.fleet.registry import Registry

log = logging.getLogger("wakeful.fleet")

TOOK_EFFECT = ("ok", "error", "indeterminate", "unknown")
"""Tool call outcomes that may have changed something outside the thread (``invalid`` and
``denied`` calls never ran). ``unknown``: a call recorded as started (``replay="never"``)
whose outcome the fenced run could not commit."""
_PAGE = 500


@dataclass(frozen=True)
class RollbackPoint:
    """Where a rollback takes the thread: the new branch's fork point (``branch_from``),
    the state, frontier and message count it returns to, and ``before``, the checkpoint id
    the thread's head was before the run started (``None``: the run started on an empty
    thread)."""

    branch_from: str
    before: str | None
    state: Any
    frontier: list[dict[str, Any]]
    messages: int
    first_count: int
    """The message count as of the run's first checkpoint (where its own messages end)."""


async def rollback_point(store: Store, snap: ThreadSnapshot, latest: Checkpoint) -> RollbackPoint:
    """Where rolling back ``latest``'s run (the head of ``snap``) takes the thread.
    ``InvalidState`` when it cannot be known (retention removed the checkpoint before the
    run, or it has no message count): the caller then only interrupts the run."""
    thread_id = snap.thread_id
    first_id = latest.id
    for segment in await store.runs(thread_id, limit=1):
        if segment.run_id == latest.run_id and segment.last_id == latest.id:
            first_id = segment.first_id
    first = await store.get_checkpoint(thread_id, first_id)
    if first is None:
        raise InvalidState("checkpoint", first_id, "gone", "retention removed it")
    recorded = first.checkpoint.metadata.get("messages")
    first_count = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else 0
    made = [b for b in await store.branches(thread_id) if b.checkpoint_id == first_id]
    before_id = made[-1].old_head if made else first.checkpoint.parent
    if before_id is None:
        return RollbackPoint(first_id, None, {}, [], 0, first_count)
    before = await store.get_checkpoint(thread_id, before_id)
    if before is None:
        raise InvalidState(
            "checkpoint", before_id, "gone", "retention removed the checkpoint before the run"
        )
    kept = await message_count_at(store, thread_id, before, snap)
    cp = before.checkpoint
    return RollbackPoint(before_id, before_id, cp.state, list(cp.frontier), kept, first_count)


async def undone_tool_calls(
    store: Store,
    thread_id: str,
    latest: Checkpoint,
    after: int,
    writes: tuple[PendingWrite, ...],
    registry: Registry | None,
) -> list[dict[str, Any]]:
    """The tool calls of ``latest``'s run that took effect, in the order they were recorded:
    its tool result messages (the head's view after message ``after``) whose outcome is in
    ``TOOK_EFFECT``, then each task of the latest checkpoint's frontier that recorded
    ``mark("started")`` and no result (outcome ``unknown``). Each names the tool, its call
    id, idempotency key, replay policy (``None`` when unknown) and outcome."""
    calls: list[dict[str, Any]] = []
    keys: set[str] = set()
    while True:
        page = await store.messages(thread_id, after, _PAGE)
        for m in page:
            if m.role == "tool" and m.run_id == latest.run_id:
                key = m.id.removeprefix("m-").removesuffix("-r")
                keys.add(key)
                outcome = m.metadata.get("outcome")
                if outcome in TOOK_EFFECT:
                    calls.append(_call(m, key, registry, latest))
        if len(page) < _PAGE:
            break
        after += len(page)
    step = int(latest.metadata.get("step", 0))
    tasks = {str(t.get("id")): t for t in latest.frontier if isinstance(t, dict)}
    for write in writes:
        task_id = write.task_id.removesuffix(".mark.started")
        if write.checkpoint_id != latest.id or task_id == write.task_id:
            continue
        key = idempotency_key(thread_id, latest.run_id, step, task_id)
        if key in keys:
            continue  # its result is recorded above
        arg = tasks.get(task_id, {}).get("arg")
        call = arg if isinstance(arg, dict) and write.node == "tool" else {}
        name = str(call.get("name") or write.node)
        calls.append(
            {
                "tool": name,
                "call_id": call.get("id"),
                "idempotency_key": key,
                "replay": _replay(registry, latest, name) if call else None,
                "outcome": "unknown",
            }
        )
    return calls


def _call(m: Message, key: str, registry: Registry | None, latest: Checkpoint) -> dict[str, Any]:
    name = str(m.metadata.get("tool"))
    replay = m.metadata.get("replay") or _replay(registry, latest, name)
    return {
        "tool": name,
        "call_id": m.tool_call_id,
        "idempotency_key": key,
        "replay": replay,
        "outcome": m.metadata.get("outcome"),
    }


def _replay(registry: Registry | None, latest: Checkpoint, name: str) -> str | None:
    """The replay policy of the run's agent's tool ``name`` (for results recorded before
    tool messages carried it), or ``None`` when the worker does not know it."""
    if registry is None:
        return None
    try:
        target = registry.get(str(latest.metadata.get("target")))
    except NotFound:
        return None
    tool = target.agent.tools.get(name) if target.agent is not None else None
    return tool.replay if tool is not None else None


def rollback_commit(
    token: int,
    latest: Checkpoint,
    point: RollbackPoint,
    data: dict[str, Any],
    now: datetime,
    settle: Any,
) -> Commit:
    """The commit that ends ``latest``'s run ``interrupted`` on a new branch from
    ``point``: its checkpoint has the state, frontier and message count from before the run
    (``metadata.rolled_back`` names the abandoned head and the checkpoint returned to),
    with the ``run.rolled_back`` event ``data``. Idempotent by the checkpoint's id."""
    ordinal = int(latest.metadata.get("ordinal", 0)) + 1
    checkpoint = Checkpoint(
        id=f"{latest.run_id}-c{ordinal}",
        parent=point.branch_from,
        run_id=latest.run_id,
        status="interrupted",
        state=point.state,
        created_at=now,
        tenant=latest.tenant,
        frontier=point.frontier,
        metadata={
            **latest.metadata,
            "ordinal": ordinal,
            "ended_by": "run.rolled_back",
            "source": "rollback",
            "nodes": [],
            "messages": point.messages,
            "tickets": [],
            "rolled_back": {"abandoned": latest.id, "returned_to": point.before},
        },
    )
    return Commit(
        token=token,
        checkpoint=checkpoint,
        events=(EventDraft(type="run.rolled_back", data=data, run_id=latest.run_id),),
        operation_id=f"{checkpoint.id}:end",
        settle=settle,
        branch_from=point.branch_from,
        branch_messages=point.messages,
    )


__all__ = ["TOOK_EFFECT", "RollbackPoint", "rollback_commit", "rollback_point", "undone_tool_calls"]
