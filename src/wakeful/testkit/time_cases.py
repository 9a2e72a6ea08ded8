"""Conformance cases: time (issue 38) as the store keeps it. A dispatch enqueued with a future
``available_at`` is claimable exactly when the store's clock reaches it, and a cancel before
then retires it; a sleeping run's dispatch (settled ``Retry(delay)`` with its suspending
commit) wakes once, at its time; schedules are stored with a compare-and-set on their
revision and found due by the store's clock. (How ticks are fired on top of this,
``wakeful.fire_due``, is the fleet's, tested against every store in wakeful's own suite.)"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from wakeful.records import Commit, Dispatch, Done, Retry, Schedule, Settle
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


class TimeCases(Harness):
    @case
    async def test_a_dispatch_delayed_10_s_is_claimable_at_10_s_not_before(self, kit: Kit) -> None:
        now = await kit.store.store_now()
        assert now == await kit.now()
        later = now + timedelta(seconds=10)
        delayed = kit.dispatch("t1", dispatch_id="later", available_at=later)
        stored = await kit.store.enqueue(delayed)
        assert stored.available_at == later and stored.status == "scheduled"
        listed = await kit.store.list_dispatches(status="scheduled")
        assert [d.dispatch_id for d in listed] == ["later"]
        assert await kit.store.claim_next("w", 30) == []
        await kit.advance(9.9)
        assert await kit.store.claim_next("w", 30) == []
        await kit.advance(0.1)
        leases = await kit.store.claim_next("w", 30)
        assert [x.dispatch.dispatch_id for x in leases] == ["later"]
        assert await kit.store.list_dispatches(status="scheduled") == []

    @case
    async def test_a_cancelled_delayed_dispatch_never_runs(self, kit: Kit) -> None:
        later = await kit.store.store_now() + timedelta(seconds=10)
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="later", available_at=later))
        await kit.advance(5)
        assert await kit.store.claim_next("w", 30) == []  # a due step that moves nothing
        await kit.store.cancel("t1", "changed my mind")
        await kit.advance(11)
        leases = await kit.store.claim_next("w", 30, limit=10)
        assert [x.dispatch.kind for x in leases] == ["cancel"]
        retired = await kit.store.get_dispatch("later")
        assert retired is not None and retired.status == "done"
        await kit.store.settle(leases[0].dispatch.dispatch_id, leases[0].claim.token, Done())
        await kit.advance(60)
        assert await kit.store.claim_next("w", 30, limit=10) == []

    @case
    async def test_a_sleep_wakes_once_at_its_time(self, kit: Kit) -> None:
        # What ``ctx.sleep`` commits: the run's suspended checkpoint and, in the same atomic
        # step, its dispatch settled ``Retry(delay)``: due again at the wake time, not before,
        # and taken by one claimant however many ask.
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d1"))
        [lease] = await kit.store.claim_next("w1", 30)
        asleep = kit.checkpoint(None, status="suspended", run_id="run-d1")
        asleep = msgspec.structs.replace(asleep, metadata={"wake_at": "in an hour"})
        slept_at = await kit.now()
        await kit.store.commit(
            "t1",
            Commit(
                token=lease.claim.token,
                checkpoint=asleep,
                settle=Settle(dispatch_id="d1", outcome=Retry(3600, None)),
            ),
        )
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is None  # nobody holds a sleeping run
        d = await kit.store.get_dispatch("d1")
        assert d is not None and d.status == "scheduled"
        assert d.available_at == slept_at + timedelta(seconds=3600)
        await kit.advance(3599.9)
        assert await kit.store.claim_next("w1", 30) == []
        await kit.advance(0.1)
        other = await kit.sibling()
        taken = [await kit.store.claim_next("w1", 30), await other.claim_next("w2", 30)]
        assert [len(x) for x in taken] == [1, 0]
        woken = taken[0][0]
        assert woken.dispatch.dispatch_id == "d1" and woken.dispatch.attempts == 2
        await kit.store.settle("d1", woken.claim.token, Done())
        await kit.advance(86400)
        assert await kit.store.claim_next("w1", 30) == []

    @case
    async def test_a_retry_with_a_delay_keeps_the_thread_busy(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="first"))
        lease = (await kit.store.claim_next("w", 30))[0]
        backoff = await kit.store.settle("first", lease.claim.token, Retry(5, "overloaded"))
        assert backoff.status == "scheduled"
        second = await kit.store.enqueue(kit.dispatch("t1", dispatch_id="second"))
        assert (second.status, second.queued_behind) == ("queued", "first")
        assert await kit.store.claim_next("w", 30, limit=5) == []
        await kit.advance(5)
        again = await kit.store.claim_next("w", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in again] == ["first"]
        assert again[0].dispatch.attempts == 2
        waiting = await kit.store.get_dispatch("second")
        assert waiting is not None and waiting.status == "queued"
        await kit.store.settle("first", again[0].claim.token, Done())
        third = await kit.store.claim_next("w", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in third] == ["second"]

    @case
    async def test_a_resume_of_a_sleeping_run_is_pinned_to_its_version(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="nap"))
        lease = (await kit.store.claim_next("w", 30, version="v1"))[0]
        asleep = await kit.store.settle("nap", lease.claim.token, Retry(3600))  # a sleep
        assert asleep.status == "scheduled" and asleep.pinned_version == "v1"
        early = kit.dispatch("t1", dispatch_id="wake", kind="resume", payload={"answers": {}})
        resumed = await kit.store.enqueue(early)
        assert resumed.status == "pending" and resumed.pinned_version == "v1"

    @case
    async def test_a_delayed_run_due_on_a_busy_thread_waits_or_is_refused(self, kit: Kit) -> None:
        now = await kit.store.store_now()
        await kit.store.enqueue(
            kit.dispatch("t1", dispatch_id="late", available_at=now + timedelta(seconds=10))
        )
        refused = msgspec.structs.replace(
            kit.dispatch("t1", dispatch_id="late-r", available_at=now + timedelta(seconds=10)),
            if_busy="reject",
        )
        assert (await kit.store.enqueue(refused)).status == "scheduled"
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="busy"))
        lease = (await kit.store.claim_next("w", 30))[0]
        assert lease.dispatch.dispatch_id == "busy"
        await kit.advance(10)
        assert await kit.store.claim_next("w", 30, limit=5) == []  # the thread is busy
        late = await kit.store.get_dispatch("late")
        assert late is not None and late.status == "queued" and late.queued_behind == "busy"
        rejected = await kit.store.get_dispatch("late-r")
        assert rejected is not None and rejected.status == "done"
        assert rejected.last_error is not None and "busy" in rejected.last_error
        await kit.store.settle("busy", lease.claim.token, Done())
        leases = await kit.store.claim_next("w", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in leases] == ["late"]

    @case
    async def test_a_debounced_burst_starts_one_run_with_the_last_input(self, kit: Kit) -> None:
        async def submit(dispatch_id: str, n: int, key: str = "digest") -> Dispatch:
            at = await kit.store.store_now() + timedelta(seconds=2)
            d = kit.dispatch("t1", dispatch_id=dispatch_id, payload={"n": n}, available_at=at)
            return await kit.store.enqueue(msgspec.structs.replace(d, debounce_key=key))

        first = await submit("b1", 1)
        assert first.status == "scheduled" and first.debounce_key == "digest"
        await kit.advance(1.5)
        second = await submit("b2", 2)
        assert second.dispatch_id == "b1" and second.payload == {"n": 2}
        assert second.available_at == await kit.now() + timedelta(seconds=2)
        await kit.advance(1.5)  # 3 s after the first, 1.5 s after the last: not yet
        assert await kit.store.claim_next("w", 30, limit=5) == []
        third = await submit("b3", 3)
        assert third.dispatch_id == "b1"
        await kit.advance(2)
        leases = await kit.store.claim_next("w", 30, limit=5)
        assert [(x.dispatch.dispatch_id, x.dispatch.payload) for x in leases] == [("b1", {"n": 3})]
        for gone in ("b2", "b3"):
            assert await kit.store.get_dispatch(gone) is None
        fourth = await submit("b4", 4)  # b1 is no longer scheduled: a new window
        assert fourth.dispatch_id == "b4" and fourth.status == "scheduled"
        other = await submit("o1", 9, key="other")  # another key of the thread: its own
        assert other.dispatch_id == "o1" and other.status == "scheduled"
        await kit.store.settle("b1", leases[0].claim.token, Done())
        await kit.advance(2)
        after = await kit.store.claim_next("w", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in after] == ["b4"]  # o1 waits for the thread
        waiting = await kit.store.get_dispatch("o1")
        assert waiting is not None and waiting.status == "queued"

    @case
    async def test_put_schedule_is_a_compare_and_set_on_the_revision(self, kit: Kit) -> None:
        s = Schedule(name="daily", target="g", every=60.0, thread="t1", tenant="acme")
        first = await kit.store.put_schedule(s, 0)
        assert first is not None and first.revision == 1 and first.created_at is not None
        assert await kit.store.put_schedule(s, 0) is None  # exists already
        assert await kit.store.put_schedule(s, 5) is None  # not its revision
        await kit.move_clock(1)
        second = await kit.store.put_schedule(msgspec.structs.replace(s, input={"v": 2}), 1)
        assert second is not None and second.revision == 2 and second.input == {"v": 2}
        assert second.created_at == first.created_at
        assert second.updated_at is not None and second.updated_at > first.created_at
        forced = await kit.store.put_schedule(s)
        assert forced is not None and forced.revision == 3
        assert await kit.store.get_schedule("daily") == forced
        await kit.reopen()
        assert await kit.store.get_schedule("daily") == forced
        other = Schedule(name="other", target="g", every=5.0, thread="t2")
        await kit.store.put_schedule(other)
        assert [x.name for x in await kit.store.list_schedules()] == ["daily", "other"]
        assert [x.name for x in await kit.store.list_schedules(tenant="acme")] == ["daily"]
        assert [x.name for x in await kit.store.list_schedules(after="daily")] == ["other"]
        assert await kit.store.delete_schedule("daily") is True
        assert await kit.store.delete_schedule("daily") is False
        assert await kit.store.get_schedule("daily") is None

    @case
    async def test_due_schedules_are_judged_by_the_store_clock(self, kit: Kit) -> None:
        now = await kit.now()
        due = Schedule(name="a", target="g", every=5.0, thread="t", next_fire_at=now)
        later = msgspec.structs.replace(due, name="b", next_fire_at=now + timedelta(seconds=5))
        paused = msgspec.structs.replace(due, name="c", paused=True)
        for s in (due, later, paused):
            await kit.store.put_schedule(s)
        at, found = await kit.store.due_schedules()
        assert at == now and [s.name for s in found] == ["a"]
        await kit.move_clock(5)
        at, found = await kit.store.due_schedules()
        assert at == now + timedelta(seconds=5) and [s.name for s in found] == ["a", "b"]


__all__ = ["TimeCases"]
