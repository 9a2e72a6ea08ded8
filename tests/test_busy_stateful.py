"""Busy threads against a model (issue 36): random interleavings of submissions with the
policies, worker leases that complete, suspend, or crash (the lease lapses and is taken
over), and cancels, on one thread of the memory and SQLite stores. After every step each
submission's stored status, ``answered_by`` and ``coalesced`` equal the model's, at most one
run of the thread holds its slot, and each admitted submission was leased by one run only."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from wakeful import ManualClock, open_store
from wakeful.errors import StaleClaim, ThreadBusy
from wakeful.records import Awaiting, Dispatch, Done
from wakeful.store.contract import Store
from wakeful.store.validate_queue import FENCING

T = TypeVar("T")
TTL = 30.0
HOLDING = ("pending", "leased", "awaiting")


@dataclass
class Sub:
    policy: str
    status: str
    answered_by: str | None = None
    coalesced: tuple[str, ...] = ()
    leased_by_run: int = 0


@dataclass
class Model:
    subs: dict[str, Sub] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    cancel_pending: bool = False

    def holders(self) -> list[str]:
        return [i for i in self.order if self.subs[i].status in HOLDING]

    def queue(self) -> list[str]:
        return [i for i in self.order if self.subs[i].status == "queued"]

    def busy(self) -> bool:
        return self.cancel_pending or bool(self.holders()) or bool(self.queue())

    def admit(self) -> None:
        waiting = self.queue()
        if self.cancel_pending or self.holders() or not waiting:
            return
        head, merged = waiting[0], []
        if self.subs[head].policy == "coalesce":
            for other in waiting[1:]:
                if self.subs[other].policy != "coalesce":
                    break
                merged.append(other)
        for other in merged:
            self.subs[other].status, self.subs[other].answered_by = "done", head
        self.subs[head].status, self.subs[head].coalesced = "pending", tuple(merged)


def _machine(kind: str) -> type[RuleBasedStateMachine]:
    class BusyVersusModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.clock = ManualClock()
            self.folder = tempfile.TemporaryDirectory()
            url = "memory://" if kind == "memory" else f"sqlite:///{self.folder.name}/b.db"
            self.store: Store = self.run(open_store(url, clock=self.clock))
            self.model = Model()
            self.count = 0

        def run(self, coro: Awaitable[T]) -> T:
            return self.loop.run_until_complete(coro)

        def teardown(self) -> None:
            try:
                self.run(self.store.close())
            finally:
                self.loop.close()
                self.folder.cleanup()

        @rule(policy=st.sampled_from(["enqueue", "reject", "interrupt", "rollback", "coalesce"]))
        def submit(self, policy: Any) -> None:
            self.count += 1
            name = f"s-{self.count:03d}"
            d = Dispatch(dispatch_id=name, thread_id="t", kind="start", payload={"n": name})
            model = self.model
            if model.busy() and policy == "reject":
                with pytest.raises(ThreadBusy):
                    self.run(self.store.enqueue(msgspec.structs.replace(d, if_busy=policy)))
                assert self.run(self.store.get_dispatch(name)) is None
                return
            stored = self.run(self.store.enqueue(msgspec.structs.replace(d, if_busy=policy)))
            busy = model.busy()
            model.subs[name] = Sub(policy, "queued" if busy else "pending")
            model.order.append(name)
            assert stored.status == model.subs[name].status
            if busy and policy in FENCING and not model.cancel_pending and model.holders():
                for other in model.holders():
                    model.subs[other].status = "done"
                model.cancel_pending = True

        @rule(outcome=st.sampled_from(["done", "done", "awaiting", "crash"]))
        def work(self, outcome: str) -> None:
            leases = self.run(self.store.claim_next("w", TTL, limit=10))
            model = self.model
            if model.cancel_pending:
                assert [lease.dispatch.kind for lease in leases] == ["cancel"]
            else:
                ready = [i for i in model.holders() if model.subs[i].status != "awaiting"]
                assert [lease.dispatch.dispatch_id for lease in leases] == ready[:1]
            if not leases:
                return
            [lease] = leases
            d = lease.dispatch
            if d.kind != "cancel":
                sub = model.subs[d.dispatch_id]
                sub.status = "leased"
                sub.leased_by_run += 1 if lease.dispatch.attempts == 1 else 0
                assert lease.dispatch.coalesced == sub.coalesced
            if outcome == "crash":  # the worker dies: its lease lapses and is taken over
                self.clock.advance(TTL + 1)
                return
            settled = Done() if outcome == "done" or d.kind == "cancel" else Awaiting()
            self.run(self.store.settle(d.dispatch_id, lease.claim.token, settled))
            if d.kind == "cancel":
                model.cancel_pending = False
            else:
                model.subs[d.dispatch_id].status = "awaiting" if outcome == "awaiting" else "done"
            model.admit()

        @rule()
        def cancel(self) -> None:
            self.run(self.store.cancel("t", "stop"))
            model = self.model
            if not model.cancel_pending:
                for other in model.holders():
                    model.subs[other].status = "done"
                model.cancel_pending = True

        @rule()
        def stale_settle_is_refused(self) -> None:
            for name in self.model.order:
                if self.model.subs[name].status == "done":
                    with pytest.raises(StaleClaim):
                        self.run(self.store.settle(name, 10**9, Done()))
                    return

        @invariant()
        def store_agrees(self) -> None:
            stored = {d.dispatch_id: d for d in self.run(self.store.list_dispatches(limit=1000))}
            for name, sub in self.model.subs.items():
                d = stored[name]
                status = "leased" if sub.status == "leased" else sub.status
                assert (d.status, d.answered_by, d.coalesced) == (
                    status,
                    sub.answered_by,
                    sub.coalesced,
                ), (name, d)
                assert sub.leased_by_run <= 1
            runs = [d for d in stored.values() if d.kind == "start" and d.status in HOLDING]
            assert len(runs) <= 1, runs

    return BusyVersusModel


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_busy_policies_agree_with_the_model(kind: str) -> None:
    machine = _machine(kind)
    machine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
    machine.TestCase().runTest()
