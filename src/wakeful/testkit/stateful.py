"""A hypothesis state machine that drives random operation sequences against a store and
the reference model and compares every result."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from wakeful.clock import ManualClock
from wakeful.errors import WakefulError
from wakeful.records import Checkpoint, Claim, Commit, EventDraft, Message, PendingWrite, Receipt
from wakeful.store.contract import Store
from wakeful.testkit.harness import Harness
from wakeful.testkit.model import Outcome, ReferenceModel

T = TypeVar("T")

THREADS = st.sampled_from(["ta", "tb", "tc"])
HOLDERS = st.sampled_from(["h1", "h2"])
TTLS = st.sampled_from([5.0, 10.0, 30.0])
TOKEN_CHOICE = st.sampled_from(["current", "current", "current", "previous", "bogus"])


def _outcome_of(value: Any) -> Outcome:
    if isinstance(value, Claim):
        return ("ok", value.token, value.holder)
    if isinstance(value, Receipt):
        return ("ok", value.version, value.checkpoint_id, value.events)
    return ("ok",) if value is None else ("ok", value)


def run_stateful(harness: Harness, max_examples: int = 40, steps: int = 40) -> None:
    """Run the machine against ``harness``'s store; raises on the first divergence.
    Releasing commits and ``claim_and_commit`` join in when the store declares
    ``folded_writes``."""
    folded = "folded_writes" in harness.capabilities

    class StoreVersusModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.clock = ManualClock()
            self.model = ReferenceModel(now=self.clock.now())
            self.store: Store = self.run(harness.new_store(self.clock))
            self.tokens: dict[str, list[int]] = {}
            self.sent: dict[str, Commit] = {}
            self.counter = 0

        def run(self, coro: Coroutine[Any, Any, T]) -> T:
            return self.loop.run_until_complete(coro)

        def call(self, coro: Coroutine[Any, Any, Any]) -> Outcome:
            try:
                return _outcome_of(self.run(coro))
            except WakefulError as exc:
                return self.error(exc)

        @staticmethod
        def error(exc: WakefulError) -> Outcome:
            if type(exc).__name__ == "ThreadBusy":
                return ("ThreadBusy", getattr(exc, "holder", None))
            if type(exc).__name__ == "ReplayUnavailable":
                return ("ReplayUnavailable", getattr(exc, "earliest_seq", None))
            applied = getattr(exc, "applied_receipt", None)
            if type(exc).__name__ == "StaleClaim" and applied is not None:
                return ("StaleClaim", _outcome_of(applied))
            return (type(exc).__name__,)

        def token_for(self, tid: str, choice: str) -> int:
            issued = self.tokens.get(tid, [])
            if choice == "bogus" or not issued:
                return 10_000 + len(issued)
            if choice == "previous" and len(issued) > 1:
                return issued[-2]
            return issued[-1]

        def teardown(self) -> None:
            try:
                self.run(self.store.close())
            finally:
                self.loop.close()

        @rule(tid=THREADS, holder=HOLDERS, ttl=TTLS)
        def claim(self, tid: str, holder: str, ttl: float) -> None:
            got = self.call(self.store.claim(tid, holder, ttl))
            expected = self.model.claim(tid, holder, ttl)
            assert got == expected, (got, expected)
            if got[0] == "ok":
                self.tokens.setdefault(tid, []).append(got[1])

        @rule(tid=THREADS, choice=TOKEN_CHOICE, ttl=TTLS)
        def renew(self, tid: str, choice: str, ttl: float) -> None:
            token = self.token_for(tid, choice)
            got = self.call(self.store.renew(tid, token, ttl))
            assert got == self.model.renew(tid, token, ttl)

        @rule(tid=THREADS, choice=TOKEN_CHOICE)
        def release(self, tid: str, choice: str) -> None:
            token = self.token_for(tid, choice)
            assert self.call(self.store.release(tid, token)) == self.model.release(tid, token)

        @rule(
            tid=THREADS,
            choice=TOKEN_CHOICE,
            new_checkpoint=st.booleans(),
            stale_parent=st.booleans(),
            events=st.integers(0, 2),
            write_task=st.sampled_from([None, "task-1", "task-2"]),
            message_id=st.sampled_from([None, "m1", "m2", "m3"]),
            operation=st.sampled_from([None, None, "op-1", "op-2"]),
            expected_version=st.sampled_from([None, None, 0, 1, 2, 3]),
            release=st.sampled_from([False, False, False, True]),
        )
        def commit(
            self,
            tid: str,
            choice: str,
            new_checkpoint: bool,
            stale_parent: bool,
            events: int,
            write_task: str | None,
            message_id: str | None,
            operation: str | None,
            expected_version: int | None,
            release: bool,
        ) -> None:
            release = release and folded
            commit = self.build_commit(
                tid,
                self.token_for(tid, choice),
                new_checkpoint,
                stale_parent,
                events,
                write_task,
                message_id,
                operation,
                expected_version,
                release,
            )
            got = self.call(self.store.commit(tid, commit))
            expected = self.model.commit(tid, commit)
            assert got == expected, (got, expected)
            self.sent[tid] = commit

        @rule(tid=THREADS)
        def retry(self, tid: str) -> None:
            """Send the thread's last commit again, as after a lost acknowledgement."""
            commit = self.sent.get(tid)
            if commit is None:
                return
            got = self.call(self.store.commit(tid, commit))
            expected = self.model.commit(tid, commit)
            assert got == expected, (got, expected)

        @rule(
            tid=THREADS,
            holder=HOLDERS,
            ttl=TTLS,
            new_checkpoint=st.booleans(),
            stale_parent=st.booleans(),
            events=st.integers(0, 2),
            operation=st.sampled_from([None, "op-1", "op-3"]),
            expected_version=st.sampled_from([None, None, 0, 1, 2]),
            release=st.sampled_from([False, False, True]),
        )
        def claim_and_commit(
            self,
            tid: str,
            holder: str,
            ttl: float,
            new_checkpoint: bool,
            stale_parent: bool,
            events: int,
            operation: str | None,
            expected_version: int | None,
            release: bool,
        ) -> None:
            if not folded:
                return
            commit = self.build_commit(
                tid,
                0,
                new_checkpoint,
                stale_parent,
                events,
                None,
                None,
                operation,
                expected_version,
                release,
            )
            got: Outcome
            try:
                claim, receipt = self.run(self.store.claim_and_commit(tid, holder, ttl, commit))
                got = ("ok", claim.token, claim.holder, receipt.version, receipt.checkpoint_id,
                       receipt.events)  # fmt: skip
            except WakefulError as exc:
                got = self.error(exc)
            expected = self.model.claim_and_commit(tid, holder, ttl, commit)
            assert got == expected, (got, expected)
            if got[0] == "ok":
                self.tokens.setdefault(tid, []).append(got[1])
                self.sent[tid] = msgspec.structs.replace(commit, token=got[1])

        def build_commit(
            self,
            tid: str,
            token: int,
            new_checkpoint: bool,
            stale_parent: bool,
            events: int,
            write_task: str | None,
            message_id: str | None,
            operation: str | None,
            expected_version: int | None,
            release: bool,
        ) -> Commit:
            self.counter += 1
            mt = self.model.threads.get(tid)
            latest = mt.latest if mt is not None else None
            checkpoint = None
            if new_checkpoint:
                parent = "stale-parent" if stale_parent else latest
                checkpoint = Checkpoint(
                    id=f"cp-{self.counter}",
                    parent=parent,
                    run_id="run-1",
                    status="running",
                    state={"n": self.counter},
                    created_at=self.clock.now(),
                )
            resulting = checkpoint.id if checkpoint is not None else latest
            writes: tuple[PendingWrite, ...] = ()
            if write_task is not None:
                target = resulting or "none"
                writes = (
                    PendingWrite(checkpoint_id=target, task_id=write_task, node="n", value=1),
                )
            return Commit(
                token=token,
                checkpoint=checkpoint,
                writes=writes,
                events=tuple(EventDraft(type=f"e{i}") for i in range(events)),
                messages=(Message(id=message_id, role="user"),) if message_id else (),
                operation_id=operation,
                expected_version=expected_version,
                release=release,
            )

        @rule(tid=THREADS, operation=st.sampled_from(["op-1", "op-2", "op-3"]))
        def operation(self, tid: str, operation: str) -> None:
            receipt = self.run(self.store.operation(tid, operation))
            got = ("ok", None if receipt is None else _outcome_of(receipt))
            assert got == self.model.operation(tid, operation), (got, tid, operation)

        @rule(tid=THREADS, before=st.integers(0, 12))
        def compact(self, tid: str, before: int) -> None:
            got = self.call(self.store.compact_events(tid, before))
            assert got == self.model.compact(tid, before)

        @rule(tid=THREADS)
        def delete(self, tid: str) -> None:
            assert self.call(self.store.delete_thread(tid)) == self.model.delete(tid)

        @rule(seconds=st.sampled_from([1.0, 4.0, 6.0, 11.0, 31.0]))
        def advance(self, seconds: float) -> None:
            self.run(harness.advance_store_clock(self.store, self.clock, seconds))
            self.model.now = self.clock.now()

        @rule(tid=THREADS, after=st.integers(0, 10))
        def events_after(self, tid: str, after: int) -> None:
            got = self.call(self.store.events_after(tid, after, 1000))
            if got[0] == "ok":
                got = ("ok", tuple(e.seq for e in got[1]))
            assert got == self.model.events_after(tid, after)

        @invariant()
        def snapshots_agree(self) -> None:
            for tid in ("ta", "tb", "tc"):
                snap = self.run(self.store.read(tid))
                mt = self.model.threads.get(tid)
                if mt is None:
                    assert snap is None, (tid, snap)
                    continue
                assert snap is not None, tid
                assert snap.version == mt.version
                assert (snap.checkpoint.id if snap.checkpoint else None) == mt.latest
                assert {w.task_id for w in snap.writes} == mt.writes
                assert snap.last_seq == mt.next_seq - 1
                assert snap.event_floor == mt.floor
                assert snap.message_count == len(mt.message_ids)
                assert (snap.claim.token if snap.claim else None) == mt.token

    run_state_machine_as_test(
        StoreVersusModel,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
        ),
    )
