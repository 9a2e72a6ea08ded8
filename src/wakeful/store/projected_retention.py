"""Retention over the projection (``ThreadStore.prune`` of the memory and file stores)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from wakeful.records import PruneReport, RetentionPolicy

if TYPE_CHECKING:
    from wakeful.store.projection import State


def prune_state(state: State, policy: RetentionPolicy, now: datetime) -> PruneReport:
    """Apply ``policy`` at time ``now``; deterministic, so replay gives the same result."""
    checkpoints = events = receipts = dispatches = 0
    for t in state.threads.values():
        removable = len(t.history) - 1
        drop = 0
        if policy.keep_checkpoints is not None:
            drop = max(drop, len(t.history) - max(policy.keep_checkpoints, 1))
        if policy.checkpoint_max_age is not None:
            cutoff = now - timedelta(seconds=policy.checkpoint_max_age)
            aged = 0
            while aged < removable and t.history[aged][1] < cutoff:
                aged += 1
            drop = max(drop, aged)
        drop = min(drop, max(removable, 0))
        if drop:
            t.keep_history(t.history[drop:])
        checkpoints += drop

        floor = t.floor
        if policy.keep_events is not None:
            floor = max(floor, t.next_seq - max(policy.keep_events, 0))
        if policy.event_max_age is not None:
            cutoff = now - timedelta(seconds=policy.event_max_age)
            aged_floor = t.floor
            for event in t.events:
                if event.at >= cutoff:
                    break
                aged_floor = event.seq + 1
            floor = max(floor, aged_floor)
        if floor > t.floor:
            events += floor - t.floor
            del t.events[: floor - t.floor]  # as a ``Compacted`` record does
            t.floor = floor

        if policy.receipt_max_age is not None:
            cutoff = now - timedelta(seconds=policy.receipt_max_age)
            old = [op for op, (_, _, at) in t.receipts.items() if at < cutoff]
            for op in old:
                del t.receipts[op]
            receipts += len(old)

    if policy.settled_dispatch_max_age is not None:
        cutoff = now - timedelta(seconds=policy.settled_dispatch_max_age)
        old_ids = [
            d.dispatch_id
            for d in state.dispatches.values()
            if d.status == "done" and d.updated_at is not None and d.updated_at < cutoff
        ]
        for did in old_ids:
            state._drop_dispatch(did)
        dispatches = len(old_ids)
    return PruneReport(
        checkpoints=checkpoints, events=events, receipts=receipts, dispatches=dispatches
    )
