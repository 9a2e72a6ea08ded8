"""What a ``message`` dispatch runs: its target and input, from the payload (a message from
outside) or from the thread's inbox (a message relayed from another thread)."""

from __future__ import annotations

from typing import Any

from wakeful.fleet.registry import Registry, Target
from wakeful.records import Checkpoint
from wakeful.store.contract import Store


async def message_input(
    store: Store,
    registry: Registry,
    thread_id: str,
    latest: Checkpoint | None,
    payload: dict[str, Any],
) -> tuple[Target | None, Any, tuple[str, ...]]:
    """The target (named in the payload, else the one ``latest`` records), the input and
    the inbox message ids the run consumes. ``(None, None, ())`` when the relayed message
    is no longer in the inbox (an earlier delivery consumed it)."""
    named = payload.get("target")
    target = registry.get(str(named)) if named else registry.for_checkpoint(latest)
    if payload.get("external"):
        return target, payload.get("payload"), ()
    message_id = str(payload.get("message_id"))
    waiting = {m.message_id: m for m in await store.inbox(thread_id)}
    if message_id not in waiting:
        return None, None, ()
    return target, waiting[message_id].payload, (message_id,)


__all__ = ["message_input"]
