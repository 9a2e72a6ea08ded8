"""What a worker does with a run whose version left (issue 40, decision 0035 "Versions").

A dispatch that continues a run is pinned to the version the run started on; when no worker
of that version has been alive for the pin grace, ``release_pins`` (``PinReleaser``, in
every worker, no leader) unpins it with ``released_from`` naming the version. Its claimant,
a worker of another version, applies the run's target's ``on_version_change``:

- ``continue``: the run goes on on this code (a changed graph structure is allowed: the
  policy says the new code can take it), after a ``run.version_changed`` event;
- ``fail``: the run ends ``failed`` with a reason naming both versions;
- ``hold``: ``run.held`` is recorded and the dispatch is quarantined for an operator
  (``wakeful quarantine requeue`` runs it on the current code, ``purge`` drops it).

The event names the versions and the policy: never a silent ``GraphChanged``, and a run is
moved once, not retried."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from wakeful.background import StopSignal
from wakeful.errors import InvalidState, NotFound, WakefulError
from wakeful.fleet.attempts import UNFINISHED, Settled
from wakeful.fleet.registry import Target
from wakeful.fleet.wakeups import wake
from wakeful.records import (
    Checkpoint,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    Lease,
    Outcome,
    Retry,
    ThreadSnapshot,
)
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.sleeps import wake_at

if TYPE_CHECKING:
    from wakeful.fleet.worker import Worker

log = logging.getLogger("wakeful.fleet")

DEFAULT_PIN_GRACE = 600.0
"""Seconds without a live worker of a version before its pinned runs move (10 min)."""


async def version_change(
    worker: Worker, lease: Lease, latest: Checkpoint | None
) -> Outcome | Settled | RunHandle | None:
    """The outcome of a leased ``released_from`` dispatch under its run's policy, or
    ``None`` when there is no unfinished run to move (the worker handles it as usual)."""
    d, claim = lease.dispatch, lease.claim
    if latest is None or latest.status not in UNFINISHED or d.kind == "cancel":
        return None
    assert worker._runtime is not None
    if d.released_from is None:  # moved here by an operator, or by an earlier policy
        return await _carry_on(worker, lease, latest, worker.registry.for_checkpoint(latest))
    data: dict[str, Any] = {
        "from": d.released_from,
        "to": worker.version,
        "started_on": latest.metadata.get("version"),
        "dispatch_id": d.dispatch_id,
        "run_id": latest.run_id,
    }
    try:
        target = worker.registry.for_checkpoint(latest)
        policy = target.version_policy(latest)
    except NotFound as missing:
        target, policy = None, "fail"
        data["reason"] = f"version {worker.version} has no such target ({missing})"
    data["policy"] = policy
    if policy == "fail":
        data.setdefault(
            "reason",
            f"run {latest.run_id} started on version {data['started_on']}; its workers "
            f"(version {d.released_from}) are gone and version {worker.version}'s policy is fail",
        )
        worker._endings[d.dispatch_id] = f"failed: {data['reason']}"
        await worker._terminate(claim, latest, "failed", "run.failed", data, settle=d.dispatch_id)
        return Settled(Done())
    if policy == "hold":
        await _event(worker, lease, "run.held", data)
        await worker.store.settle(d.dispatch_id, claim.token, Retry(0.0, "held: version left"))
        # InvalidState: another worker leased it meanwhile, and holds it in turn
        with contextlib.suppress(InvalidState):
            await worker.store.quarantine(d.dispatch_id)
        worker._endings[d.dispatch_id] = f"held: version {d.released_from} left"
        return Settled(Done())
    assert target is not None
    await _event(worker, lease, "run.version_changed", data)
    return await _carry_on(worker, lease, latest, target)


async def _carry_on(
    worker: Worker, lease: Lease, latest: Checkpoint, target: Target
) -> RunHandle | None:
    """Resume or recover the run on this worker's code, its graph structure allowed to
    differ from the one the run recorded (the move said this code may take it)."""
    d, claim = lease.dispatch, lease.claim
    assert worker._runtime is not None
    if latest.status != "running" and wake_at(latest) is not None:  # asleep, and due
        registry = worker.registry
        return await wake(worker._runtime, registry, lease, latest, lease.snapshot, True)
    if d.kind == "resume" and latest.status == "suspended":
        payload = d.payload if isinstance(d.payload, dict) else {}
        return await worker._runtime.resume(
            claim.thread_id, target.graph, dict(payload.get("answers") or {}),
            tenant=latest.tenant, claim=claim, resumed_by=d.dispatch_id,
            snapshot=lease.snapshot, dispatch_id=d.dispatch_id, allow_graph_change=True,
        )  # fmt: skip
    if latest.status == "running":
        return await worker._runtime.recover(
            claim.thread_id, target.graph, tenant=latest.tenant, claim=claim,
            snapshot=lease.snapshot, dispatch_id=d.dispatch_id, allow_graph_change=True,
        )  # fmt: skip
    return None


async def wake_or_move(
    worker: Worker, lease: Lease, asleep: Checkpoint, snap: ThreadSnapshot | None
) -> Outcome | Settled | RunHandle:
    """Wake the run asleep at ``asleep`` (its own dispatch, due again); when the run's
    version left or the run was moved (``moved_here``), under ``version_change`` instead:
    a sleep does not let a run change code silently."""
    if moved_here(lease.dispatch, asleep, worker.version):
        moved = await version_change(worker, lease, asleep)
        if moved is not None:
            return moved
    return await wake(worker._runtime, worker.registry, lease, asleep, snap)


def moved_here(d: Dispatch, latest: Checkpoint | None, version: str | None) -> bool:
    """Whether a lease of ``d`` by a worker of ``version`` continues a run that started on
    other code: a released pin (its policy applies), or a dispatch pinned to ``version``
    for a run that started on another version (``migrate_runs``, or the continuation of a
    run an earlier policy moved): the run continues with its graph allowed to change."""
    if d.released_from is not None:
        return True
    if latest is None or version is None or d.pinned_version != version:
        return False
    started_on = latest.metadata.get("version")
    return started_on is not None and started_on != version


async def _event(worker: Worker, lease: Lease, event_type: str, data: dict[str, Any]) -> None:
    """Record the move, once per dispatch: a later attempt of the same dispatch (a retry
    after a failed continuation) gets the first one's receipt, not a second event."""
    commit = Commit(
        token=lease.claim.token,
        events=(EventDraft(type=event_type, data=data, run_id=data["run_id"]),),
        operation_id=f"{lease.dispatch.dispatch_id}:{event_type}",
    )
    await worker.store.commit(lease.claim.thread_id, commit)


class PinReleaser:
    """Every quarter of the worker's ``pin_grace`` (at most 30 s), release the pins of
    versions gone for ``pin_grace`` (``DispatchQueue.release_pins``), in bounded batches.
    Every worker runs it (no leader; a second releaser finds nothing to do)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.pin_grace = worker.pin_grace
        self.interval = max(min(worker.pin_grace / 4, 30.0), 0.05)

    async def run(self, signal: StopSignal) -> None:
        while not await signal.pause(self.interval):
            try:
                released = await self.worker.store.release_pins(self.pin_grace)
            except WakefulError as exc:
                log.warning("releasing the pins of departed versions failed: %s", exc)
                continue
            for d in released:
                log.info(
                    "dispatch %s: version %s has no live worker; its pin was released",
                    d.dispatch_id,
                    d.released_from,
                    extra={"dispatch_id": d.dispatch_id, "version": d.released_from},
                )
            if len(released) == 100:
                self.worker.wake_local()


def claim_options(version: str | None, only_thread: str | None) -> dict[str, Any]:
    """The keyword arguments of a worker's ``claim_next``."""
    options: dict[str, Any] = {"version": version}
    if only_thread is not None:
        options["thread_id"] = only_thread
    return options


__all__ = [
    "DEFAULT_PIN_GRACE",
    "PinReleaser",
    "claim_options",
    "moved_here",
    "version_change",
    "wake_or_move",
]
