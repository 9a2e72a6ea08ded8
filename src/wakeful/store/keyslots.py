"""Concurrency keys in the projection of the memory and file stores (issue 39, decision
0035 "Slots"): at most ``limit`` dispatches of a key are admitted (``pending`` or
``leased``) at once; the others wait ``waiting_key`` and are admitted, by priority then
fair tag then enqueue order, when an admitted one stops holding its slot (settled ``done``
or ``awaiting``, cancelled, quarantined).

Everything here is derived from the dispatches (nothing is persisted beside them), and
every decision is taken inside ``State.apply``, so replaying the same records gives the
same admissions. The SQL stores keep the same rules in triggers (PostgreSQL migration 19,
SQLite migration 12)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import msgspec

from wakeful.concurrency import KeyUse
from wakeful.records import Dispatch
from wakeful.store.validate_queue import KEY_HOLDING

ADMITTED_FROM = frozenset(("pending", "leased", "waiting_key"))
"""A keyed dispatch that becomes ``pending`` from any other status (new, queued behind its
thread, requeued from quarantine) asks its key for a slot; from these it already has one,
or is being given one."""


@dataclass
class KeySlots:
    """Derived per-key indexes of a ``State``: the limit (of the key's latest enqueued
    dispatch), the admitted dispatches, the waiting ones in admission order."""

    limits: dict[str, int] = field(default_factory=dict)
    held: dict[str, set[str]] = field(default_factory=dict)
    waiting: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    """Per key, ``(-priority, enqueue order, dispatch_id)`` sorted."""

    def gate(self, before: Dispatch | None, d: Dispatch) -> Dispatch:
        """``d`` as its key takes it: ``waiting_key`` instead of ``pending`` when the key's
        slots are all held or others wait already (they go first, by priority then enqueue
        order). A new dispatch sets its key's limit."""
        key = d.concurrency_key
        if key is None:
            return d
        if before is None and d.concurrency_limit is not None:
            self.limits[key] = d.concurrency_limit
        if d.status != "pending" or (before is not None and before.status in ADMITTED_FROM):
            return d
        if len(self.held.get(key, ())) < self.limits.get(key, 1) and not self.waiting.get(key):
            return d
        return msgspec.structs.replace(d, status="waiting_key")

    def index(self, before: Dispatch | None, d: Dispatch | None, order: int) -> None:
        """Keep ``held`` and ``waiting`` as ``before`` becomes ``d`` (``None``: absent);
        ``order`` is the dispatch's enqueue order."""
        same = before is not None and d is not None and before.status == d.status
        if before is not None and before.concurrency_key is not None and not same:
            key = before.concurrency_key
            if before.status in KEY_HOLDING:
                _discard(self.held, key, before.dispatch_id)
            elif before.status == "waiting_key":
                line = self.waiting[key]
                at = bisect.bisect_left(line, _entry(before, order))
                del line[at]
                if not line:
                    del self.waiting[key]
        if d is not None and d.concurrency_key is not None and not same:
            key = d.concurrency_key
            if d.status in KEY_HOLDING:
                self.held.setdefault(key, set()).add(d.dispatch_id)
            elif d.status == "waiting_key":
                bisect.insort(self.waiting.setdefault(key, []), _entry(d, order))

    def to_fill(self, before: Dispatch | None, d: Dispatch) -> str | None:
        """The key that may have a free slot for a waiting dispatch since ``before`` became
        ``d``: ``before`` gave up its slot, or ``d`` is new (its limit may have risen)."""
        if before is None:
            return d.concurrency_key
        if before.concurrency_key is None or before.status not in KEY_HOLDING:
            return None
        return None if d.status in KEY_HOLDING else before.concurrency_key

    def next_admitted(self, key: str) -> str | None:
        """The waiting dispatch the key admits next, while it has a free slot."""
        line = self.waiting.get(key)
        if not line or len(self.held.get(key, ())) >= self.limits.get(key, 1):
            return None
        return line[0][-1]

    def use(self) -> list[KeyUse]:
        """Every key with admitted or waiting dispatches, by key."""
        keys = sorted(set(self.held) | set(self.waiting))
        return [
            KeyUse(
                key=key,
                limit=self.limits.get(key, 1),
                admitted=len(self.held.get(key, ())),
                waiting=len(self.waiting.get(key, ())),
            )
            for key in keys
        ]


def _entry(d: Dispatch, order: int) -> tuple[int, int, str]:
    return (-d.priority, order, d.dispatch_id)


def _discard(index: dict[str, set[str]], key: str, dispatch_id: str) -> None:
    held = index.get(key)
    if held is not None:
        held.discard(dispatch_id)
        if not held:
            del index[key]


def key_of_resume(d: Dispatch, holder: Dispatch | None) -> Dispatch:
    """A ``resume`` takes the key (and limit) of the run it continues, the dispatch holding
    its thread's slot (the suspended run's), when that run has one; otherwise its own. A
    cancel holding the slot gives none."""
    if holder is None or holder.kind == "cancel" or holder.concurrency_key is None:
        return d
    return msgspec.structs.replace(
        d, concurrency_key=holder.concurrency_key, concurrency_limit=holder.concurrency_limit
    )
