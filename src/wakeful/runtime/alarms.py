"""The embedded ``Runtime``'s timer for its own runs' sleeps (``ctx.sleep``).

A run started or resumed by a ``Runtime`` without a worker releases its claim when it falls
asleep (its sleep is committed: another process may wake it). The runtime that ran it then
waits until the wake time and resumes it, so ``handle.result()`` returns how the run ended
after its sleeps. If the thread moved on meanwhile (woken elsewhere, cancelled), the sleep's
outcome is returned as it was. A process that stopped while its run slept continues it with
``wake_due`` once it is due."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from wakeful.runtime.results import RunOutcome
from wakeful.runtime.sleeps import wake_answers, wake_at

if TYPE_CHECKING:
    from wakeful.runtime.graph import CompiledGraph
    from wakeful.runtime.handle import RunHandle
    from wakeful.runtime.runtime import Runtime

Then = Callable[[RunOutcome], Awaitable[RunOutcome]]


def alarm(runtime: Runtime, graph: CompiledGraph) -> Then:
    """What follows a run's outcome in ``handle.result()``: its wake-up, if it sleeps."""

    async def then(outcome: RunOutcome) -> RunOutcome:
        if outcome.wake_at is None:
            return outcome
        delay = (outcome.wake_at - runtime.clock.now()).total_seconds()
        if delay > 0:
            await runtime.sleep(delay)
        snap = await runtime.store.read(outcome.thread_id)
        asleep = snap.checkpoint if snap is not None else None
        if asleep is None or asleep.run_id != outcome.run_id or wake_at(asleep) is None:
            return outcome
        handle = await runtime.resume(
            outcome.thread_id,
            graph,
            wake_answers(asleep, runtime.clock.now()),
            tenant=asleep.tenant,
        )
        return await handle.result()  # its own alarm follows a further sleep

    return then


async def wake_due(runtime: Runtime, thread_id: str, graph: CompiledGraph) -> RunHandle | None:
    """Continue the thread's sleeping run if its wake time has come (by ``runtime.clock``):
    what a process restarted after its ``Runtime`` fell asleep with a run calls (a run a
    worker leased is woken by the workers instead). ``None`` when the thread has no run
    asleep, or it is not due yet."""
    snap = await runtime.store.read(thread_id)
    asleep = snap.checkpoint if snap is not None else None
    waking = wake_at(asleep)
    if asleep is None or waking is None or waking > runtime.clock.now():
        return None
    return await runtime.resume(
        thread_id, graph, wake_answers(asleep, runtime.clock.now()), tenant=asleep.tenant
    )


__all__ = ["alarm", "wake_due"]
