"""A worker's run of a start dispatch submitted ``from_checkpoint`` (``submit(...,
from_checkpoint=...)``): ``Runtime.replay`` under the lease (docs/time-travel.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wakeful.errors import GraphChanged, InvalidInput, InvalidState, NotFound, RunInProgress
from wakeful.fleet.attempts import Settled
from wakeful.fleet.registry import Target
from wakeful.fleet.webhooks import run_metadata
from wakeful.records import Claim, Done, Message, Outcome, ThreadSnapshot
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.runtime import Runtime

Note = Callable[[Claim, str, dict[str, Any], str | None], Awaitable[None]]
"""The worker's ``_note``: record an event (and settle the dispatch ``Done`` with it)."""


@dataclass(frozen=True, slots=True)
class Start:
    """A leased start dispatch, as the worker prepared it."""

    dispatch_id: str
    claim: Claim
    snapshot: ThreadSnapshot | None
    payload: dict[str, Any]
    target: Target
    state: dict[str, Any]
    messages: Sequence[Message]
    run_id: str
    tenant: str | None
    version: str | None = None
    """The worker's code version, recorded by the run (``wakeful.fleet.versions``)."""


async def replay_dispatch(
    runtime: Runtime | None, note: Note, start: Start
) -> Outcome | Settled | RunHandle:
    """Replay from the payload's ``from_checkpoint``: with the payload's ``input`` when it
    is not ``None`` (prepared by the target: a new turn from ``START``, an agent's user
    message appended), else continuing the checkpoint's frontier. A refusal that retrying
    cannot change (the checkpoint is gone, the thread's run is unfinished, another graph
    version, a bad input) is recorded and settles the dispatch."""
    assert runtime is not None
    checkpoint_id = start.payload.get("from_checkpoint")
    claim = start.claim
    try:
        if not isinstance(checkpoint_id, str):
            raise InvalidInput("from_checkpoint", "must be a checkpoint id")
        no_input = start.payload.get("input") is None
        keep = start.payload.get("keep_messages")
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool)):
            raise InvalidInput("keep_messages", "must be a count")
        return await runtime.replay(
            claim.thread_id,
            start.target.graph,
            checkpoint_id,
            None if no_input else start.state,
            messages=() if no_input else start.messages,
            keep_messages=keep,
            tenant=start.tenant,
            run_id=start.run_id,
            claim=claim,
            snapshot=start.snapshot,
            dispatch_id=start.dispatch_id,
            metadata=run_metadata(start.payload, start.target, start.version),
        )
    except (NotFound, RunInProgress, GraphChanged, InvalidState, InvalidInput) as refused:
        await note(claim, "dispatch.refused", {"reason": str(refused)}, start.dispatch_id)
        return Settled(Done())


__all__ = ["Start", "replay_dispatch"]
