"""What a worker does for the busy-thread policies (issue 36, docs/busy-threads.md): the
ending of a run that a newer submission interrupted (``if_busy="interrupt"``), and the
inputs of the submissions one run answers together (``if_busy="coalesce"``).

The store decides both (``DispatchQueue.enqueue``): an interrupt is a ``cancel`` dispatch
whose payload names the interrupting dispatch (``interrupted_by``); a coalesced run's
dispatch lists the others (``Dispatch.coalesced``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from wakeful.errors import InvalidState, StreamCheckpointError
from wakeful.fleet.attempts import ending_commit, settle_done
from wakeful.fleet.rollback import (
    RollbackPoint,
    rollback_commit,
    rollback_point,
    undone_tool_calls,
)
from wakeful.records import Checkpoint, Commit, Message
from wakeful.store.contract import Store

if TYPE_CHECKING:
    from wakeful.fleet.registry import Registry

log = logging.getLogger("wakeful.fleet")


def interrupter_of(payload: dict[str, Any]) -> str | None:
    """The dispatch that interrupted the thread's run, for a cancel dispatch made by an
    ``interrupt`` submission; ``None`` for an ordinary cancel."""
    named = payload.get("interrupted_by")
    return named if isinstance(named, str) else None


async def interruption(
    store: Store, thread_id: str, latest: Checkpoint | None, interrupter: str, reason: str
) -> tuple[dict[str, Any], dict[str, Any], tuple[Message, ...]]:
    """What the ending of an interrupted run records besides its ``interrupted`` status:
    the event data of ``run.interrupted`` (the interrupting dispatch and run, the tickets
    it superseded, the partial reply), the checkpoint metadata (a suspended run's open
    tickets closed as ``superseded``), and the messages (the model turn that was streaming,
    as far as its stream checkpoint got, as an assistant message marked
    ``metadata.interrupted``)."""
    new = await store.get_dispatch(interrupter)
    new_run = f"run-{interrupter}"
    if new is not None and isinstance(new.payload, dict):
        new_run = str(new.payload.get("run_id") or new_run)
    data: dict[str, Any] = {
        "reason": reason,
        "interrupted_by": interrupter,
        "interrupted_by_run": new_run,
    }
    metadata: dict[str, Any] = {}
    messages: tuple[Message, ...] = ()
    if latest is None or latest.status not in ("running", "suspended"):
        return data, metadata, messages
    raw = latest.metadata.get("tickets", [])
    tickets = [t.get("id") for t in raw if isinstance(t, dict)] if isinstance(raw, list) else []
    if tickets:
        data["superseded_tickets"] = tickets
        metadata = {"tickets": [], "superseded_tickets": tickets}
    partial = await _partial_reply(store, thread_id, latest.run_id)
    if partial is not None:
        data["partial_reply"] = partial.id
        messages = (partial,)
    return data, metadata, messages


@dataclass(frozen=True)
class CancelEnding:
    """How a claimed ``cancel`` dispatch ends the thread's unfinished run: ``cancelled``,
    or ``interrupted`` when an ``if_busy="interrupt"`` submission asked for it, or
    ``interrupted`` and rolled back (``rollback``: where to) for ``if_busy="rollback"``."""

    status: str
    event: str
    data: dict[str, Any]
    metadata: dict[str, Any] | None = None
    messages: tuple[Message, ...] = ()
    rollback: RollbackPoint | None = None

    @property
    def log(self) -> str:
        return f"{self.status} ({self.data.get('reason')})"

    def commit(
        self, token: int, unfinished: Checkpoint | None, now: datetime, settle: str | None
    ) -> Commit:
        """The ending commit under claim ``token``, settling dispatch ``settle`` ``Done``
        (``None``: the caller settles it)."""
        if self.rollback is not None and unfinished is not None:
            return rollback_commit(
                token, unfinished, self.rollback, self.data, now, settle_done(settle)
            )
        return ending_commit(
            token, unfinished, self.status, self.event, self.data, now,
            settle=settle, messages=self.messages, metadata=self.metadata,
        )  # fmt: skip


async def cancel_ending(
    store: Store,
    thread_id: str,
    unfinished: Checkpoint | None,
    payload: dict[str, Any],
    registry: Registry | None = None,
) -> CancelEnding:
    """What a cancel dispatch (``payload``) records for ``unfinished`` (the thread's
    running or suspended run, or ``None``). ``registry``: the worker's, to name the replay
    policy of a rolled-back run's tool calls recorded without it."""
    reason = str(payload.get("reason", "cancelled"))
    interrupter = interrupter_of(payload)
    if interrupter is None:
        return CancelEnding("cancelled", "run.cancelled", {"reason": reason})
    data, metadata, messages = await interruption(store, thread_id, unfinished, interrupter, reason)
    if payload.get("rollback") is not True:
        return CancelEnding("interrupted", "run.interrupted", data, metadata, messages)
    snap = await store.read(thread_id)
    if unfinished is None or snap is None:
        # nothing of the busy run was committed (it had not started): nothing to undo
        return CancelEnding("interrupted", "run.rolled_back", {**data, "tool_calls": []})
    data.pop("partial_reply", None)  # undone with the rest of the run
    try:
        point = await rollback_point(store, snap, unfinished)
    except InvalidState as cannot:
        log.warning("run %s is only interrupted, not rolled back: %s", unfinished.run_id, cannot)
        data["not_rolled_back"] = str(cannot)
        return CancelEnding("interrupted", "run.interrupted", data, metadata, messages)
    data["tool_calls"] = await undone_tool_calls(
        store, thread_id, unfinished, point.first_count, snap.writes, registry
    )
    data["returned_to"] = point.before
    data["abandoned"] = unfinished.id
    return CancelEnding("interrupted", "run.rolled_back", data, rollback=point)


async def _partial_reply(store: Store, thread_id: str, run_id: str) -> Message | None:
    """The run's unfinished model turn as a message, from its stream checkpoint (best
    effort: none stored, or the store cannot say, is no partial reply)."""
    checkpoints = getattr(store, "stream_checkpoints", None)
    if checkpoints is None:
        return None
    try:
        turn = await checkpoints.get(run_id)
    except StreamCheckpointError as exc:
        log.warning("run %s: its partial reply is lost (%s)", run_id, exc)
        return None
    if turn is None or turn.thread_id != thread_id or not turn.partial_text:
        return None
    return Message(
        id=f"m-{run_id}-interrupted",
        role="assistant",
        content=turn.partial_text,
        run_id=run_id,
        metadata={"interrupted": True, "model": turn.model, "stream_message_id": turn.message_id},
    )


async def coalesced_inputs(store: Store, dispatch_ids: tuple[str, ...]) -> list[Any]:
    """The inputs of the submissions a coalesced run answers besides its own, in submit
    order (a start's ``input``, an external message's ``payload``); one the store no
    longer holds (purged) is skipped."""
    inputs = []
    for dispatch_id in dispatch_ids:
        d = await store.get_dispatch(dispatch_id)
        if d is None or not isinstance(d.payload, dict):
            log.warning("coalesced submission %s is gone; its input is skipped", dispatch_id)
            continue
        inputs.append(d.payload.get("payload" if d.kind == "message" else "input"))
    return inputs


__all__ = ["coalesced_inputs", "interrupter_of", "interruption"]
