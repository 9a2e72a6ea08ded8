"""``RunHandle``: a run executing in this process, as ``Runtime.start``, ``resume`` and
``recover`` return it."""

from __future__ import annotations

import asyncio
import contextlib

from wakeful.records import Checkpoint
from wakeful.runtime.alarms import Then
from wakeful.runtime.loop import Execution
from wakeful.runtime.results import RunOutcome


class RunHandle:
    """A run in this process. ``result()`` waits for it; ``cancel()`` stops it and records
    it as cancelled; ``status`` is running, suspended, completed, failed, cancelled or
    fenced."""

    def __init__(self, execution: Execution, then: Then | None = None) -> None:
        """``then``: what follows the run's outcome before ``result()`` returns it (the
        embedded runtime's wake-up of a sleeping run, ``wakeful.runtime.alarms``)."""
        self._execution = execution
        run = execution.run() if then is None else _followed(execution, then)
        self._task: asyncio.Task[RunOutcome] = asyncio.create_task(
            run, name=f"run:{execution.thread_id}"
        )

    @property
    def run_id(self) -> str:
        return self._execution.run_id

    @property
    def thread_id(self) -> str:
        return self._execution.thread_id

    @property
    def status(self) -> str:
        return self._execution.status

    @property
    def checkpoint(self) -> Checkpoint:
        """The run's latest checkpoint as this process committed it (its ending one once
        the run has ended)."""
        return self._execution.checkpoint

    @property
    def token(self) -> int:
        return self._execution.claim.token

    @property
    def renewals(self) -> int:
        return self._execution.renewals

    @property
    def settled(self) -> bool:
        """The run's ending commit also settled its dispatch (see ``dispatch_id``)."""
        return self._execution.claim_ended and self._execution.settle_dispatch is not None

    async def result(self) -> RunOutcome:
        """The outcome (``completed`` or ``suspended``); raises ``RunFailed``,
        ``RunCancelled`` or ``CheckpointWriteFailed`` for the other endings. Cancelling the
        caller does not cancel the run (as ``asyncio.shield`` would not; this waits with
        one future and one callback, where a shield makes two of each per call)."""
        task = self._task
        if not task.done():
            waiter = task.get_loop().create_future()

            def wake(_task: object) -> None:
                if not waiter.done():
                    waiter.set_result(None)

            task.add_done_callback(wake)
            try:
                await waiter
            except BaseException:
                task.remove_done_callback(wake)
                raise
        return task.result()

    async def cancel(self) -> None:
        """Stop the run and wait until it has recorded ``cancelled`` (if it still can)."""
        if not self._task.done():
            self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task

    def done(self) -> bool:
        return self._task.done()

    def yield_run(self) -> None:
        """Ask the run to stop at its next superstep boundary without recording an ending
        (``result()`` then raises ``RunYielded``): for a process shutting down gracefully."""
        self._execution.yield_requested = True


async def _followed(execution: Execution, then: Then) -> RunOutcome:
    return await then(await execution.run())


__all__ = ["RunHandle"]
