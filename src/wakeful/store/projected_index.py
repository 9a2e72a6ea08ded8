"""The derived queue indexes of the projection (``State``): kept in step with every
dispatch write, never persisted (a file store's snapshot rebuilds them).

- ``claimable``: the pending and leased dispatches in claim order;
- ``scheduled``: the ``scheduled`` dispatches by due time (the claim's due step, issue 38);
- ``slots``: per thread, the dispatches holding its run slot (``holds_slot``);
- ``queued``: per thread, its ``queued`` dispatches in enqueue order.
"""

from __future__ import annotations

import bisect
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from wakeful.records import Dispatch, PruneReport
from wakeful.store.fairness import FairTags
from wakeful.store.keyslots import KeySlots
from wakeful.store.mutations import Mutation
from wakeful.store.validate_queue import holds_slot

_K = TypeVar("_K", bound=tuple[Any, ...])

CLAIMABLE = frozenset(("pending", "leased"))
"""Statuses ``claim_next`` may lease from (pending once due, leased once the lease lapsed)."""
OPEN = frozenset(("scheduled", "waiting_key", "pending", "leased", "awaiting"))
"""Statuses a cancel of the thread retires (``open_by_thread``)."""


class QueueIndexes:
    """The index upkeep of ``State`` (a mixin: ``State`` declares the fields)."""

    dispatches: dict[str, Dispatch]
    dispatch_order: dict[str, int]
    dedupe: dict[str, str]
    open_by_thread: dict[str, set[str]]
    claimable: list[tuple[int, float, int, str]]
    scheduled: list[tuple[datetime, int, str]]
    slots: dict[str, set[str]]
    queued: dict[str, list[str]]
    epochs: dict[str, int]
    keys: KeySlots
    fair: FairTags

    def apply(self, record: Mutation) -> PruneReport | None:
        """Apply one record (``State.apply``)."""
        raise NotImplementedError

    def build_indexes(self) -> None:
        """Derive every index from ``dispatches`` (a state read from a snapshot)."""
        self.claimable = sorted(
            self._claim_key(d) for d in self.dispatches.values() if d.status in CLAIMABLE
        )
        self.scheduled = sorted(
            self._due_key(d) for d in self.dispatches.values() if d.status == "scheduled"
        )
        for d in sorted(self.dispatches.values(), key=lambda d: self.dispatch_order[d.dispatch_id]):
            self.keys.gate(None, d)  # the key's limit: its latest dispatch's
            self._index_slot(None, d)

    def slot_holder(self, thread_id: str) -> Dispatch | None:
        """The earliest dispatch holding the thread's run slot, if any."""
        held = self.slots.get(thread_id)
        if not held:
            return None
        return self.dispatches[min(held, key=self.dispatch_order.__getitem__)]

    def _claim_key(self, d: Dispatch) -> tuple[int, float, int, str]:
        return (-d.priority, d.fair_tag, self.dispatch_order[d.dispatch_id], d.dispatch_id)

    def _due_key(self, d: Dispatch) -> tuple[datetime, int, str]:
        assert d.available_at is not None  # every stored dispatch has one
        return (d.available_at, self.dispatch_order[d.dispatch_id], d.dispatch_id)

    def _admit(self, thread_id: str, at: datetime | None) -> None:
        """Give a freed run slot to the thread's first queued dispatch. A ``coalesce`` one
        takes the consecutive ``coalesce`` dispatches of its kind queued behind it into its
        run: they settle ``done`` naming it."""
        waiting = self.queued.get(thread_id)
        if not waiting or self.slots.get(thread_id):
            return
        head = self.dispatches[waiting[0]]
        merged: list[Dispatch] = []
        if head.if_busy == "coalesce":
            for did in waiting[1:]:
                d = self.dispatches[did]
                if d.if_busy != "coalesce" or d.kind != head.kind:
                    break
                merged.append(d)
        for d in merged:
            self._put_dispatch(
                msgspec.structs.replace(
                    d, status="done", answered_by=head.dispatch_id, updated_at=at
                )
            )
        self._put_dispatch(
            msgspec.structs.replace(
                head,
                status="pending",
                available_at=at if at is not None else head.available_at,
                coalesced=tuple(d.dispatch_id for d in merged),
                updated_at=at,
            )
        )

    def _retire_awaiting(self, thread_id: str, at: datetime | None) -> None:
        """A resume takes over from the dispatches parked while the run waited for input."""
        for did in list(self.open_by_thread.get(thread_id, ())):
            d = self.dispatches[did]
            if d.status == "awaiting":
                self._put_dispatch(msgspec.structs.replace(d, status="done", updated_at=at))

    def _index_slot(self, before: Dispatch | None, d: Dispatch | None) -> None:
        """Keep ``slots``, ``queued``, ``keys`` and ``fair`` as ``before`` becomes ``d``
        (``None``: absent)."""
        either = d if d is not None else before
        assert either is not None
        self.keys.index(before, d, self.dispatch_order[either.dispatch_id])
        self.fair.index(before, d)
        held_before = before is not None and holds_slot(before)
        held_after = d is not None and holds_slot(d)
        queued_before = before is not None and before.status == "queued"
        queued_after = d is not None and d.status == "queued"
        if held_before and not held_after:
            assert before is not None
            held = self.slots[before.thread_id]
            held.discard(before.dispatch_id)
            if not held:
                del self.slots[before.thread_id]
        if queued_before and not queued_after:
            assert before is not None
            waiting = self.queued[before.thread_id]
            waiting.remove(before.dispatch_id)
            if not waiting:
                del self.queued[before.thread_id]
        if held_after and not held_before:
            assert d is not None
            self.slots.setdefault(d.thread_id, set()).add(d.dispatch_id)
        if queued_after and not queued_before:
            assert d is not None
            # in enqueue order (a delayed run is queued when due, behind older ones only)
            bisect.insort(
                self.queued.setdefault(d.thread_id, []),
                d.dispatch_id,
                key=self.dispatch_order.__getitem__,
            )

    def _put_dispatch(self, d: Dispatch) -> None:
        before = self.dispatches.get(d.dispatch_id)
        d = self.fair.tagged(before, self.keys.gate(before, d))
        self._index_slot(before, d)
        was = before is not None and before.status in CLAIMABLE
        if d.status in CLAIMABLE and not was:
            bisect.insort(self.claimable, self._claim_key(d))
        elif was and d.status not in CLAIMABLE:
            self._unclaimable(d)
        if before is not None and before.status == "scheduled":
            _remove(self.scheduled, self._due_key(before))
        if d.status == "scheduled":
            bisect.insort(self.scheduled, self._due_key(d))
        self.dispatches[d.dispatch_id] = d
        open_ids = self.open_by_thread.setdefault(d.thread_id, set())
        if d.status in OPEN:
            open_ids.add(d.dispatch_id)
        else:
            open_ids.discard(d.dispatch_id)
            if not open_ids:
                del self.open_by_thread[d.thread_id]
        key = self.keys.to_fill(before, d)
        while key is not None and (admit := self.keys.next_admitted(key)) is not None:
            admitted = {"status": "pending", "updated_at": d.updated_at}
            self._put_dispatch(msgspec.structs.replace(self.dispatches[admit], **admitted))

    def _unclaimable(self, d: Dispatch) -> None:
        _remove(self.claimable, self._claim_key(d))

    def _drop_dispatch(self, dispatch_id: str) -> None:
        d = self.dispatches.pop(dispatch_id)
        self._index_slot(d, None)
        if d.status in CLAIMABLE:
            self._unclaimable(d)
        if d.status == "scheduled":
            _remove(self.scheduled, self._due_key(d))
        self.dispatch_order.pop(dispatch_id, None)
        if d.dedupe_key is not None and self.dedupe.get(d.dedupe_key) == dispatch_id:
            del self.dedupe[d.dedupe_key]
        open_ids = self.open_by_thread.get(d.thread_id)
        if open_ids is not None:
            open_ids.discard(dispatch_id)
            if not open_ids:
                del self.open_by_thread[d.thread_id]


def _remove(index: list[_K], key: _K) -> None:
    at = bisect.bisect_left(index, key)
    if at < len(index) and index[at] == key:
        del index[at]
