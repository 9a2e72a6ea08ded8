"""What a ``message`` dispatch runs: its target and input, from the payload (a message from
outside) or from the thread's inbox (a message relayed from another thread, or the spawn of
a child run: ``wakeful.fleet.joins``)."""

from __future__ import annotations

from typing import Any

from wakeful.errors import InvalidInput
from wakeful.fleet.joins import parent_gone, spawn_metadata
from wakeful.fleet.registry import Registry, Target
from wakeful.records import Checkpoint
from wakeful.runtime.children import spawn_of
from wakeful.store.contract import Store


async def message_input(
    store: Store,
    registry: Registry,
    thread_id: str,
    latest: Checkpoint | None,
    payload: dict[str, Any],
    metadata: dict[str, Any] | None = None,
) -> tuple[Target | None, Any, tuple[str, ...]]:
    """The target (named in the payload, else the one ``latest`` records), the input and
    the inbox message ids the run consumes. ``(None, None, ())`` when the relayed message
    is no longer in the inbox (an earlier delivery consumed it). A spawn's envelope names
    the target and the input; ``metadata`` (when given) gets the child's parent link, and
    a child whose parent's run was cancelled before it started is refused
    (``InvalidInput``)."""
    named = payload.get("target")
    if payload.get("external"):
        target = registry.get(str(named)) if named else registry.for_checkpoint(latest)
        return target, payload.get("payload"), ()
    message_id = str(payload.get("message_id"))
    waiting = {m.message_id: m for m in await store.inbox(thread_id)}
    if message_id not in waiting:
        return None, None, ()
    body = waiting[message_id].payload
    spawn = spawn_of(body)
    if spawn is None:
        target = registry.get(str(named)) if named else registry.for_checkpoint(latest)
        return target, body, (message_id,)
    gone = await parent_gone(store, spawn)
    if gone is not None:
        raise InvalidInput("spawn", gone)
    if metadata is not None:
        metadata.update(spawn_metadata(body))
    return registry.get(str(spawn["target"])), spawn.get("input"), (message_id,)


async def start_input(
    store: Store, registry: Registry, payload: dict[str, Any], metadata: dict[str, Any]
) -> tuple[Target, Any]:
    """The target and input of a ``start`` dispatch. A child spawned with a busy-thread
    policy is one (``wakeful.runtime.children.enqueue_spawn``): its envelope gives
    ``metadata`` the parent link, and a child whose parent's run was cancelled before it
    started is refused (``InvalidInput``), as for a relayed spawn."""
    spawn = spawn_of(payload)
    if spawn is not None:
        gone = await parent_gone(store, spawn)
        if gone is not None:
            raise InvalidInput("spawn", gone)
        metadata.update(spawn_metadata(payload))
    return registry.get(str(payload.get("target"))), payload.get("input")


__all__ = ["message_input", "start_input"]
