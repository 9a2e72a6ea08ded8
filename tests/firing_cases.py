"""Time across the fleet layer against every store (issue 38), mixed into each store's
conformance class: ``submit(after=, at=)`` by the store's clock; every schedule tick fires
one dispatch however often ``fire_due`` runs; catch-up after a three-hour gap; overlap;
a tick its tenant cannot store; pause, resume and trigger. The store-level cases are
``wakeful.testkit.time_cases`` (the testkit may not import the fleet layer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from wakeful.errors import InvalidInput
from wakeful.fleet.client import cancel, submit
from wakeful.fleet.schedules import (
    fire_due,
    pause_schedule,
    resume_schedule,
    schedule,
    schedule_dispatch_id,
    trigger_schedule,
)
from wakeful.fleet.ticks import tick_label
from wakeful.records import Done
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


async def _started_ids(kit: Kit) -> list[str]:
    """Every start dispatch in the store, by id."""
    found = await kit.store.list_dispatches(limit=1000)
    return sorted(d.dispatch_id for d in found if d.kind == "start")


class FiringCases(Harness):
    @case
    async def test_submit_after_10_s_is_claimable_at_10_s_not_before(self, kit: Kit) -> None:
        stored = await submit(kit.store, "t1", "g", {"n": 1}, dispatch_id="later", after=10)
        assert stored.available_at == await kit.now() + timedelta(seconds=10)
        assert await kit.store.claim_next("w", 30) == []
        await kit.advance(9.9)
        assert await kit.store.claim_next("w", 30) == []
        await kit.advance(0.1)
        leases = await kit.store.claim_next("w", 30)
        assert [x.dispatch.dispatch_id for x in leases] == ["later"]

    @case
    async def test_at_is_an_instant_and_both_or_a_naive_at_are_refused(self, kit: Kit) -> None:
        at = await kit.now() + timedelta(minutes=5)
        stored = await submit(kit.store, "t1", "g", dispatch_id="at", at=at)
        assert stored.available_at == at
        with pytest.raises(InvalidInput):
            await submit(kit.store, "t2", "g", after=1, at=at)
        with pytest.raises(InvalidInput):
            await submit(kit.store, "t2", "g", at=at.replace(tzinfo=None))
        with pytest.raises(InvalidInput):
            await submit(kit.store, "t2", "g", after=-1)
        assert await _started_ids(kit) == ["at"]

    @case
    async def test_a_cancelled_delayed_submission_never_runs(self, kit: Kit) -> None:
        await submit(kit.store, "t1", "g", dispatch_id="later", after=10)
        await cancel(kit.store, "t1", "changed my mind")
        await kit.advance(11)
        leases = await kit.store.claim_next("w", 30, limit=10)
        assert [x.dispatch.kind for x in leases] == ["cancel"]
        later = await kit.store.get_dispatch("later")
        assert later is not None and later.status == "done"
        await kit.store.settle(leases[0].dispatch.dispatch_id, leases[0].claim.token, Done())
        await kit.advance(60)
        assert await kit.store.claim_next("w", 30, limit=10) == []

    @case
    async def test_each_tick_fires_one_dispatch_however_often_it_is_fired(self, kit: Kit) -> None:
        s = await schedule(kit.store, "every10", target="g", every=10, thread="t1")
        assert s.next_fire_at is not None
        assert await fire_due(kit.store) == []  # nothing is due before the first tick
        await kit.move_clock((s.next_fire_at - await kit.now()).total_seconds())
        fired = await fire_due(kit.store)
        assert [d.dispatch_id for d in fired] == [schedule_dispatch_id("every10", s.next_fire_at)]
        assert fired[0].thread_id == "t1" and fired[0].payload["target"] == "g"
        assert await fire_due(kit.store) == []
        # a firer that read the schedule before the first advanced it fires the same tick
        other = await kit.sibling()
        assert await fire_due(other) == []
        stale = await kit.store.put_schedule(s)  # the definition as it was before the tick
        assert stale is not None
        assert await fire_due(kit.store) == []
        assert await _started_ids(kit) == [fired[0].dispatch_id]
        current = await kit.store.get_schedule("every10")
        assert current is not None and current.next_fire_at == s.next_fire_at + timedelta(
            seconds=10
        )

    @case
    async def test_catch_up_after_a_three_hour_gap(self, kit: Kit) -> None:
        for policy in ("skip", "latest", "all"):
            await schedule(
                kit.store,
                f"hourly-{policy}",
                "0 * * * *",
                target="g",
                thread_template=f"{policy}-{{date}}-{{time}}",
                catch_up=policy,
                max_catch_up=2,
                overlap="allow",
            )
        now = await kit.now()
        first = (now + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
        # three hours and a half after the first tick: ticks first, +1h, +2h, +3h were missed
        await kit.move_clock((first - now).total_seconds() + 3.5 * 3600)
        fired = await fire_due(kit.store)
        by_policy = {
            p: sorted(d.dispatch_id for d in fired if f":hourly-{p}:" in d.dispatch_id)
            for p in ("skip", "latest", "all")
        }
        latest = first + timedelta(hours=3)
        assert by_policy["skip"] == []
        assert by_policy["latest"] == [schedule_dispatch_id("hourly-latest", latest)]
        assert by_policy["all"] == [
            schedule_dispatch_id("hourly-all", first + timedelta(hours=2)),
            schedule_dispatch_id("hourly-all", latest),
        ]
        # every policy is back on time for the next tick
        await kit.move_clock(0.5 * 3600)
        fired = await fire_due(kit.store)
        nxt = latest + timedelta(hours=1)
        assert sorted(d.dispatch_id for d in fired) == sorted(
            schedule_dispatch_id(f"hourly-{p}", nxt) for p in ("skip", "latest", "all")
        )

    @case
    async def test_overlap_skip_enqueue_and_allow(self, kit: Kit) -> None:
        for policy in ("skip", "enqueue", "allow"):
            await schedule(
                kit.store,
                f"o-{policy}",
                target="g",
                every=60,
                thread=f"t-{policy}",
                overlap=policy,
            )
        now = await kit.now()
        first = datetime.fromtimestamp((now.timestamp() // 60 + 1) * 60, UTC)
        await kit.move_clock((first - now).total_seconds())
        assert len(await fire_due(kit.store)) == 3
        # the first runs are still pending (nobody ran them) when the second tick comes
        await kit.move_clock(60)
        fired = {d.dispatch_id.split(":")[1] for d in await fire_due(kit.store)}
        assert fired == {"o-allow"}
        enqueue = await kit.store.get_schedule("o-enqueue")
        skip = await kit.store.get_schedule("o-skip")
        assert enqueue is not None and enqueue.waiting_since == first + timedelta(seconds=60)
        # looked at again in a moment, behind what is due before then
        assert enqueue.next_fire_at == await kit.now() + timedelta(seconds=1)
        assert skip is not None and skip.next_fire_at == first + timedelta(seconds=120)
        await kit.move_clock(1)
        assert await fire_due(kit.store) == []  # still waiting
        # the enqueued tick fires once the previous run ends
        leases = await kit.store.claim_next("w", 30, limit=10, thread_id="t-enqueue")
        assert len(leases) == 1
        await kit.store.settle(leases[0].dispatch.dispatch_id, leases[0].claim.token, Done())
        await kit.move_clock(1)
        fired_ids = [d.dispatch_id for d in await fire_due(kit.store)]
        assert fired_ids == [schedule_dispatch_id("o-enqueue", first + timedelta(seconds=60))]
        after = await kit.store.get_schedule("o-enqueue")
        assert after is not None and after.waiting_since is None
        assert after.next_fire_at == first + timedelta(seconds=120)

    @case
    async def test_a_tick_refused_for_its_tenant_is_passed_over_once(self, kit: Kit) -> None:
        await submit(kit.store, "theirs", "g", tenant="other")  # the thread is other's
        s = await schedule(kit.store, "mine", target="g", every=10, thread="theirs", tenant="me")
        assert s.next_fire_at is not None
        await kit.move_clock((s.next_fire_at - await kit.now()).total_seconds())
        assert await fire_due(kit.store) == []
        after = await kit.store.get_schedule("mine")
        assert after is not None and after.next_fire_at == s.next_fire_at + timedelta(seconds=10)
        assert await kit.store.get_dispatch(schedule_dispatch_id("mine", s.next_fire_at)) is None

    @case
    async def test_pause_resume_and_trigger(self, kit: Kit) -> None:
        s = await schedule(kit.store, "p", target="g", every=10, thread="t1")
        assert s.next_fire_at is not None
        paused = await pause_schedule(kit.store, "p")
        assert paused.paused
        await kit.move_clock(35)
        assert await fire_due(kit.store) == []
        resumed = await resume_schedule(kit.store, "p")
        assert not resumed.paused and resumed.next_fire_at is not None
        assert resumed.next_fire_at > await kit.now()  # the paused ticks are not caught up
        now = await kit.now()
        triggered = await trigger_schedule(kit.store, "p")
        assert triggered.dispatch_id == f"sched:p:trigger:{tick_label(now)}"
        assert await _started_ids(kit) == [triggered.dispatch_id]
        after = await kit.store.get_schedule("p")
        assert after is not None and after.last_dispatch_id == triggered.dispatch_id


__all__ = ["FiringCases"]
