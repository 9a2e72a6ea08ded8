"""A worker's side of durable sleep (``wakeful.runtime.sleeps``): the lease of a sleeping
run's dispatch, due again by the store's clock, wakes the run."""

from __future__ import annotations

from wakeful.fleet.registry import Registry
from wakeful.records import Checkpoint, Lease, ThreadSnapshot
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.runtime import Runtime
from wakeful.runtime.sleeps import wake_answers


async def wake(
    runtime: Runtime | None,
    registry: Registry,
    lease: Lease,
    asleep: Checkpoint,
    snap: ThreadSnapshot | None,
    allow_graph_change: bool = False,
) -> RunHandle:
    """Resume the run asleep at ``asleep`` under the lease's claim, answering its due
    sleeps (by the runtime's clock); the run settles the lease's dispatch when it ends,
    suspends or sleeps again. ``allow_graph_change``: the run was moved to this code
    (``wakeful.fleet.deploys``)."""
    assert runtime is not None, "the worker's runtime exists once it has registered"
    target = registry.for_checkpoint(asleep)
    return await runtime.resume(
        lease.claim.thread_id,
        target.graph,
        wake_answers(asleep, runtime.clock.now()),
        tenant=asleep.tenant,
        claim=lease.claim,
        snapshot=snap,
        dispatch_id=lease.dispatch.dispatch_id,
        allow_graph_change=allow_graph_change,
    )


__all__ = ["wake"]
