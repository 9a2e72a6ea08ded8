"""Schedule ticks fired in batches (issue 38 item 4, decision 0044), against every store:
mixed into each store's conformance class. A batch fires each schedule it still holds the
revision of, once; a tick stored before or refused for its tenant does not undo the batch;
two firers on the same due page fire every tick once; the overlap check of a page is one
read on the stores that batch (PostgreSQL, SQLite) and decides as the one-by-one check; the
firing loop waits until the next due tick by the store's clock."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec
import pytest

from wakeful.fleet.client import submit
from wakeful.fleet.firing import RECHECK, next_pause
from wakeful.fleet.firing_batch import (
    fire_batch,
    plan,
    previous_unfinished,
    schedule_dispatch_id,
    unfinished,
)
from wakeful.fleet.schedules import fire_due, fire_page, schedule
from wakeful.fleet.ticks import next_tick
from wakeful.records import Commit, Done, Settle
from wakeful.store.firings import TickStore
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


async def _due_in(kit: Kit, names: list[str], every: float = 10) -> None:
    """Schedules ``names`` (one thread per tick), then the clock moved to their first tick."""
    first = None
    for name in names:
        s = await schedule(
            kit.store, name, target="g", every=every, thread_template="{name}-{tick}"
        )
        first = s.next_fire_at
    assert first is not None
    await kit.move_clock((first - await kit.now()).total_seconds())


class BatchFiringCases(Harness):
    @case
    async def test_a_batch_fires_what_it_holds_and_passes_over_what_changed(self, kit: Kit) -> None:
        await _due_in(kit, ["a", "b", "c"])
        now, due = await kit.store.due_schedules()
        firings = [plan(s, now, False, next_tick(s, now)) for s in due]
        # an operator changes "b" after the firer read it: its revision moves on
        b = await kit.store.get_schedule("b")
        assert b is not None
        assert await kit.store.put_schedule(msgspec.structs.replace(b, input={"v": 2}), 1)
        fired = await fire_batch(kit.store, firings)
        ticks = {s.name: s.next_fire_at for s in due}
        assert sorted(d.dispatch_id for d in fired.created) == sorted(
            schedule_dispatch_id(n, t) for n, t in ticks.items() if n != "b" and t is not None
        )
        assert fired.lost == ["b"] and fired.refused == []
        assert await kit.store.get_dispatch(schedule_dispatch_id("b", now)) is None
        for name in ("a", "c"):
            s = await kit.store.get_schedule(name)
            assert s is not None and s.revision == 2 and s.fired == 1
            assert s.next_fire_at == now + timedelta(seconds=10)
            assert s.last_dispatch_id == schedule_dispatch_id(name, now)
        # the same batch again (a firer that read before the first one committed): nothing
        again = await fire_batch(kit.store, firings)
        assert again.created == [] and sorted(again.lost) == ["a", "b", "c"]
        # "b" is still due, under its new definition, and fires once
        [tick] = await fire_due(kit.store)
        assert tick.dispatch_id == schedule_dispatch_id("b", now) and tick.payload["input"] == {
            "v": 2
        }

    @case
    async def test_a_refused_or_stored_tick_does_not_undo_the_batch(self, kit: Kit) -> None:
        await submit(kit.store, "theirs", "g", tenant="other")  # the thread is other's
        s1 = await schedule(kit.store, "mine", target="g", every=10, thread="theirs", tenant="me")
        await schedule(kit.store, "ok", target="g", every=10, thread_template="ok-{tick}")
        await schedule(kit.store, "again", target="g", every=10, thread_template="ag-{tick}")
        assert s1.next_fire_at is not None
        tick = s1.next_fire_at
        await kit.move_clock((tick - await kit.now()).total_seconds())
        # "again"'s tick was stored by a firer that died before advancing the schedule
        earlier = await submit(
            kit.store, "ag-x", "g", dispatch_id=schedule_dispatch_id("again", tick)
        )
        fired = await fire_due(kit.store)
        assert [d.dispatch_id for d in fired] == [schedule_dispatch_id("ok", tick)]
        for name in ("mine", "ok", "again"):
            s = await kit.store.get_schedule(name)
            assert s is not None and s.next_fire_at == tick + timedelta(seconds=10), name
        assert await kit.store.get_dispatch(schedule_dispatch_id("mine", tick)) is None
        assert await kit.store.get_dispatch(earlier.dispatch_id) == earlier

    @case
    async def test_two_firers_on_one_due_page_fire_every_tick_once(self, kit: Kit) -> None:
        names = [f"s{i:03d}" for i in range(150)]
        await _due_in(kit, names)
        other = await kit.sibling()
        pages = await asyncio.gather(fire_page(kit.store, limit=200), fire_page(other, limit=200))
        created = [d.dispatch_id for p in pages for d in p.created]
        assert len(created) == len(set(created)) == 150, (
            len(created),
            len(set(created)),
            [p[1:] for p in pages],
        )
        assert sum(p.taken for p in pages) >= 150
        starts = [d for d in await kit.store.list_dispatches(limit=1000) if d.kind == "start"]
        assert len(starts) == 150
        assert await fire_due(kit.store, limit=200) == []
        for s in await kit.store.list_schedules(limit=200):
            assert s.fired == 1 and s.revision == 2, s.name

    @case
    async def test_one_read_decides_which_previous_runs_are_unfinished(self, kit: Kit) -> None:
        # pending; done with its run suspended; done with its run completed; done with a
        # later run on the thread; unknown
        for thread in ("t-pending", "t-asleep", "t-ended", "t-later"):
            await submit(kit.store, thread, "g", dispatch_id=f"d-{thread}")
        for thread, status, run in (
            ("t-asleep", "suspended", "run-d-t-asleep"),
            ("t-ended", "completed", "run-d-t-ended"),
            ("t-later", "running", "run-other"),
        ):
            [lease] = await kit.store.claim_next("w", 30, thread_id=thread)
            checkpoint = kit.checkpoint(None, status=status, run_id=run)
            await kit.store.commit(
                thread,
                Commit(
                    token=lease.claim.token,
                    checkpoint=checkpoint,
                    settle=Settle(dispatch_id=lease.dispatch.dispatch_id, outcome=Done()),
                ),
            )
        ids = ["d-t-pending", "d-t-asleep", "d-t-ended", "d-t-later", "d-unknown"]
        one_by_one = {d for d in ids if await previous_unfinished(kit.store, d)}
        assert one_by_one == {"d-t-pending", "d-t-asleep"}
        assert await unfinished(kit.store, ids) == one_by_one
        if isinstance(kit.store, TickStore):
            assert await kit.store.unfinished_runs(ids) == one_by_one

    @case
    async def test_the_firing_loop_waits_until_the_next_due_tick(self, kit: Kit) -> None:
        if not isinstance(kit.store, TickStore):
            assert await next_pause(kit.store, 5.0) == 5.0  # no way to ask: every interval
            return
        assert await next_pause(kit.store, 5.0) == 5.0  # no schedule
        s = await schedule(kit.store, "s", target="g", every=600, thread="t")
        assert s.next_fire_at is not None
        now = await kit.now()
        await kit.move_clock((s.next_fire_at - now).total_seconds() - 2)
        assert await next_pause(kit.store, 5.0) == pytest.approx(2.0)
        assert await next_pause(kit.store, 1.0) == 1.0
        await kit.move_clock(2)
        assert await next_pause(kit.store, 5.0) == RECHECK  # due: look again soon
        at, due = await kit.store.next_schedule_due()
        assert at == await kit.now() and due == s.next_fire_at


__all__ = ["BatchFiringCases"]
