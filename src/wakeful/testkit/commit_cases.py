"""Conformance cases: commits, numbering, compaction, deletion, round trips, retention."""

from __future__ import annotations

import asyncio
import tracemalloc
from datetime import timedelta

import pytest

from wakeful.errors import (
    InvalidCommit,
    InvalidInput,
    OperationConflict,
    ReplayUnavailable,
    StaleClaim,
    TenantMismatch,
    VersionConflict,
)
from wakeful.ids import MAX_AGE_SECONDS
from wakeful.records import (
    Checkpoint,
    Commit,
    EventDraft,
    Message,
    PendingWrite,
    PruneReport,
    RetentionPolicy,
)
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


class CommitCases(Harness):
    @case
    async def test_commit_applies_checkpoint_writes_and_events_together(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        cp = kit.checkpoint(None, state={"step": 1})
        receipt = await kit.store.commit(
            "t1",
            Commit(
                token=claim.token,
                checkpoint=cp,
                writes=(PendingWrite(checkpoint_id=cp.id, task_id="a", node="n", value=1),),
                events=(EventDraft(type="x"), EventDraft(type="y")),
            ),
        )
        assert receipt.version == 1
        assert receipt.checkpoint_id == cp.id
        assert receipt.events == (1, 2)
        snap = await kit.store.read("t1")
        assert snap is not None
        assert snap.checkpoint == cp
        assert [w.task_id for w in snap.writes] == ["a"]
        assert snap.last_seq == 2
        more = await kit.store.commit(
            "t1", Commit(token=claim.token, events=(EventDraft(type="z"),))
        )
        assert more.events == (3,)
        assert more.version == 2
        assert [e.seq for e in await kit.store.events_after("t1")] == [1, 2, 3]
        assert [e.type for e in await kit.store.events_after("t1")] == ["x", "y", "z"]

    @case
    async def test_non_latest_parent_is_version_conflict_and_spends_nothing(self, kit: Kit) -> None:
        claim, first = await kit.started("t1")
        second = kit.checkpoint(first.checkpoint_id)
        await kit.store.commit("t1", Commit(token=claim.token, checkpoint=second))
        stale = kit.checkpoint(first.checkpoint_id)
        with pytest.raises(VersionConflict) as refused:
            await kit.store.commit(
                "t1",
                Commit(token=claim.token, checkpoint=stale, events=(EventDraft(type="lost"),)),
            )
        assert refused.value.actual == second.id
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint == second and snap.version == 2
        after = await kit.store.commit(
            "t1", Commit(token=claim.token, events=(EventDraft(type="next"),))
        )
        assert after.events == (2,), "a refused commit must not spend a sequence number"

    @case
    async def test_wrong_expected_version_is_version_conflict(self, kit: Kit) -> None:
        claim, _first = await kit.started("t1")
        with pytest.raises(VersionConflict) as refused:
            await kit.store.commit(
                "t1",
                Commit(token=claim.token, expected_version=0, events=(EventDraft(type="e"),)),
            )
        assert (refused.value.expected, refused.value.actual) == (0, 1)
        ok = await kit.store.commit(
            "t1", Commit(token=claim.token, expected_version=1, events=(EventDraft(type="e"),))
        )
        assert ok.version == 2 and ok.events == (2,)

    @case
    async def test_writes_must_name_the_resulting_latest_checkpoint(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        orphan = PendingWrite(checkpoint_id="nowhere", task_id="a", node="n", value=1)
        with pytest.raises(InvalidCommit):
            await kit.store.commit("t1", Commit(token=claim.token, writes=(orphan,)))
        cp = kit.checkpoint(None)
        await kit.store.commit("t1", Commit(token=claim.token, checkpoint=cp))
        nxt = kit.checkpoint(cp.id)
        old = PendingWrite(checkpoint_id=cp.id, task_id="a", node="n", value=1)
        with pytest.raises(InvalidCommit):
            await kit.store.commit("t1", Commit(token=claim.token, checkpoint=nxt, writes=(old,)))
        snap = await kit.store.read("t1")
        assert (
            snap is not None and snap.checkpoint == cp and snap.writes == () and snap.version == 1
        )
        good = PendingWrite(checkpoint_id=cp.id, task_id="a", node="n", value=1)
        await kit.store.commit("t1", Commit(token=claim.token, writes=(good,)))
        with pytest.raises(InvalidCommit):
            await kit.store.commit("t1", Commit(token=claim.token, writes=(good,)))

    @case
    async def test_new_checkpoint_drops_previous_writes(self, kit: Kit) -> None:
        claim, first = await kit.started("t1")
        cp1 = first.checkpoint_id
        assert cp1 is not None
        writes = tuple(
            PendingWrite(checkpoint_id=cp1, task_id=f"task-{i}", node="n", value=i)
            for i in range(3)
        )
        await kit.store.commit("t1", Commit(token=claim.token, writes=writes))
        snap = await kit.store.read("t1")
        assert snap is not None and len(snap.writes) == 3
        cp2 = kit.checkpoint(cp1)
        kept = PendingWrite(checkpoint_id=cp2.id, task_id="task-0", node="n", value="new")
        await kit.store.commit("t1", Commit(token=claim.token, checkpoint=cp2, writes=(kept,)))
        snap = await kit.store.read("t1")
        assert snap is not None and snap.writes == (kept,)

    @case
    async def test_round_trip_is_exact(self, kit: Kit) -> None:
        claim = await kit.claimed("t-round")
        at = kit.clock.now() + timedelta(microseconds=123457)
        state = {
            "nested": {"list": [1, 2.5, None, True, "ü"], "deep": {"k": [{"a": []}]}},
            "emoji": "🙂 ключ 鍵",
            "big": 2**53 + 1,
        }
        cp = Checkpoint(
            id="cp-round",
            parent=None,
            run_id="run-9",
            status="suspended",
            state=state,
            created_at=at,
            tenant="tenant-1",
            frontier=[{"node": "b", "args": {"x": 1}}],
            metadata={"graph": "g", "fingerprint": "abc"},
        )
        write = PendingWrite(checkpoint_id="cp-round", task_id="t-1", node="b", value={"é": [1]})
        draft = EventDraft(
            type="node.finished",
            data={"text": "naïve ☃", "n": [1, {"x": None}]},
            run_id="run-9",
            checkpoint_id="cp-round",
            task_id="t-1",
        )
        message = Message(
            id="m-1",
            role="assistant",
            content="héllo",
            tool_calls=[{"id": "c1", "name": "f", "arguments": '{"a": 1}'}],
            run_id="run-9",
            metadata={"usage": {"in": 3}},
        )
        await kit.store.commit(
            "t-round",
            Commit(
                token=claim.token,
                checkpoint=cp,
                writes=(write,),
                events=(draft,),
                messages=(message,),
            ),
        )
        for reopened in (False, True):
            store = await kit.reopen() if reopened else kit.store
            snap = await store.read("t-round")
            assert snap is not None
            assert snap.checkpoint == cp
            assert snap.checkpoint.created_at == at
            assert snap.writes == (write,)
            assert snap.tenant == "tenant-1"
            [event] = await store.events_after("t-round")
            assert (event.type, event.data, event.run_id, event.task_id) == (
                draft.type,
                draft.data,
                draft.run_id,
                draft.task_id,
            )
            assert event.checkpoint_id == "cp-round" and event.seq == 1
            assert event.at.tzinfo is not None
            assert await store.messages("t-round") == [message]

    @case
    async def test_events_after_pages_ascending(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        for i in range(7):
            await kit.store.commit(
                "t1", Commit(token=claim.token, events=(EventDraft(type=f"e{i}"),))
            )
        seen: list[int] = []
        cursor = 0
        while True:
            page = await kit.store.events_after("t1", cursor, 3)
            if not page:
                break
            assert len(page) <= 3
            seen += [e.seq for e in page]
            cursor = page[-1].seq
        assert seen == [1, 2, 3, 4, 5, 6, 7]
        assert await kit.store.events_after("t1", 7) == []

    @case
    async def test_events_after_unknown_thread_is_empty(self, kit: Kit) -> None:
        assert await kit.store.events_after("never-seen") == []
        assert await kit.store.read("never-seen") is None
        assert await kit.store.messages("never-seen") == []

    @case
    async def test_compaction_floor_refuses_reads_below_it(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        for _ in range(5):
            await kit.store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="e"),)))
        assert await kit.store.compact_events("t1", 4) == 4
        with pytest.raises(ReplayUnavailable) as refused:
            await kit.store.events_after("t1", 0)
        assert refused.value.earliest_seq == 4
        assert [e.seq for e in await kit.store.events_after("t1", 3)] == [4, 5]
        assert await kit.store.compact_events("t1", 2) == 4, "the floor never moves back"
        assert [e.seq for e in await kit.store.events_after("t1", 3)] == [4, 5]
        assert await kit.store.compact_events("t1", 99) == 6, "compaction past the end clamps"
        assert await kit.store.events_after("t1", 5) == []
        receipt = await kit.store.commit(
            "t1", Commit(token=claim.token, events=(EventDraft(type="after"),))
        )
        assert receipt.events == (6,), "numbering continues after compaction"
        reopened = await kit.reopen()
        with pytest.raises(ReplayUnavailable):
            await reopened.events_after("t1", 4)
        assert [e.seq for e in await reopened.events_after("t1", 5)] == [6]

    @case
    async def test_concurrent_commits_number_events_contiguously(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")

        async def writer(w: int) -> list[tuple[int, ...]]:
            seqs = []
            for i in range(25):
                receipt = await kit.store.commit(
                    "t1",
                    Commit(
                        token=claim.token,
                        events=(EventDraft(type=f"{w}.{i}.a"), EventDraft(type=f"{w}.{i}.b")),
                    ),
                )
                seqs.append(receipt.events)
            return seqs

        results = await asyncio.gather(*(writer(w) for w in range(8)))
        pairs = [pair for seqs in results for pair in seqs]
        assert all(len(p) == 2 and p[1] == p[0] + 1 for p in pairs)
        assert sorted(s for p in pairs for s in p) == list(range(1, 401))
        events = []
        cursor = 0
        while page := await kit.store.events_after("t1", cursor, 100):
            events += page
            cursor = page[-1].seq
        assert [e.seq for e in events] == list(range(1, 401))
        by_seq = {e.seq: e.type for e in events}
        for p in pairs:
            assert by_seq[p[0]].endswith(".a") and by_seq[p[1]] == by_seq[p[0]][:-1] + "b"

    @case
    async def test_delete_thread_removes_only_that_thread(self, kit: Kit) -> None:
        a, _ = await kit.started("t-a")
        b, _ = await kit.started("t-b")
        msg = Message(id="m1", role="user", content="hi")
        await kit.store.commit("t-a", Commit(token=a.token, messages=(msg,)))
        await kit.store.commit("t-b", Commit(token=b.token, messages=(msg,)))
        await kit.store.delete_thread("t-a")
        assert await kit.store.read("t-a") is None
        assert await kit.store.events_after("t-a") == []
        assert await kit.store.messages("t-a") == []
        snap = await kit.store.read("t-b")
        assert snap is not None and snap.version == 2 and snap.message_count == 1
        assert [e.seq for e in await kit.store.events_after("t-b")] == [1]
        assert [t.thread_id for t in await kit.store.list_threads()] == ["t-b"]
        await kit.store.delete_thread("t-never")

    @case
    async def test_delete_thread_fences_old_token_and_restarts_numbering(self, kit: Kit) -> None:
        old, _ = await kit.started("t1")
        await kit.store.delete_thread("t1")
        with pytest.raises(StaleClaim):
            await kit.store.commit("t1", Commit(token=old.token, events=(EventDraft(type="e"),)))
        with pytest.raises(StaleClaim):
            await kit.store.renew("t1", old.token, 30)
        assert await kit.store.read("t1") is None
        new, receipt = await kit.started("t1")
        assert new.token > old.token
        assert receipt.events == (1,) and receipt.version == 1
        reopened = await kit.reopen()
        again = await reopened.read("t1")
        assert again is not None and again.version == 1

    @case
    async def test_operation_retry_returns_original_receipt(self, kit: Kit) -> None:
        claim, first = await kit.started("t1")
        commit = Commit(
            token=claim.token,
            operation_id="run-1:1",
            checkpoint=kit.checkpoint(first.checkpoint_id, state={"a": {"x": 1, "y": 2}}),
            events=(EventDraft(type="e"),),
            messages=(Message(id="m1", role="assistant", content="x"),),
        )
        receipt = await kit.store.commit("t1", commit)
        assert receipt.operation_id == "run-1:1"
        assert await kit.store.commit("t1", commit) == receipt
        reordered = Commit(
            token=claim.token,
            operation_id="run-1:1",
            checkpoint=Checkpoint(
                **{
                    f: getattr(commit.checkpoint, f)
                    for f in Checkpoint.__struct_fields__
                    if f != "state"
                },
                state={"a": {"y": 2, "x": 1}},
            ),
            events=commit.events,
            messages=commit.messages,
        )
        assert await kit.store.commit("t1", reordered) == receipt, "key order is not payload"
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 2 and snap.message_count == 1
        assert [e.seq for e in await kit.store.events_after("t1")] == [1, 2]
        different = Commit(
            token=claim.token, operation_id="run-1:1", events=(EventDraft(type="o"),)
        )
        with pytest.raises(OperationConflict):
            await kit.store.commit("t1", different)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 2
        assert await (await kit.reopen()).commit("t1", commit) == receipt

    @case
    async def test_operation_retry_after_takeover_still_returns_receipt(self, kit: Kit) -> None:
        claim, _first = await kit.started("t1")
        commit = Commit(token=claim.token, operation_id="run-1:2", events=(EventDraft(type="e"),))
        receipt = await kit.store.commit("t1", commit)
        await kit.advance(31)
        successor = await kit.store.claim("t1", "holder-b", 30)
        with pytest.raises(StaleClaim):
            await kit.store.commit("t1", commit)
        replay = Commit(token=successor.token, operation_id="run-1:2", events=commit.events)
        assert await kit.store.commit("t1", replay) == receipt

    @case
    async def test_messages_append_in_order_and_ids_are_unique(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        first = tuple(Message(id=f"m{i}", role="user", content=f"c{i}") for i in range(3))
        await kit.store.commit("t1", Commit(token=claim.token, messages=first))
        second = (Message(id="m3", role="assistant", content="c3"),)
        await kit.store.commit("t1", Commit(token=claim.token, messages=second))
        listed = await kit.store.messages("t1")
        assert [m.id for m in listed] == ["m0", "m1", "m2", "m3"]
        assert [m.id for m in await kit.store.messages("t1", after=1, limit=2)] == ["m1", "m2"]
        snap = await kit.store.read("t1")
        assert snap is not None and snap.message_count == 4
        dup = (Message(id="m9", role="user"), Message(id="m1", role="user"))
        with pytest.raises(InvalidCommit):
            await kit.store.commit("t1", Commit(token=claim.token, messages=dup))
        twice = (Message(id="m9", role="user"), Message(id="m9", role="user"))
        with pytest.raises(InvalidCommit):
            await kit.store.commit("t1", Commit(token=claim.token, messages=twice))
        assert len(await kit.store.messages("t1")) == 4

    @case
    async def test_commit_cost_does_not_grow_with_history(self, kit: Kit) -> None:
        """Measured in Python allocations (deterministic), not time: a commit that re-read or
        re-wrote the thread's history would allocate in proportion to it."""
        claim, _first = await kit.started("t1")
        blob = "x" * 2000

        async def commit_one(i: int) -> int:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            await kit.store.commit(
                "t1",
                Commit(
                    token=claim.token,
                    messages=(Message(id=f"m{i}", role="user", content=blob),),
                    events=(EventDraft(type="e", data=blob),),
                ),
            )
            return tracemalloc.get_traced_memory()[1] - before

        tracemalloc.start()
        try:
            early = [await commit_one(i) for i in range(20)]
            for i in range(20, 1500):
                await kit.store.commit(
                    "t1",
                    Commit(
                        token=claim.token,
                        messages=(Message(id=f"m{i}", role="user", content=blob),),
                        events=(EventDraft(type="e", data=blob),),
                    ),
                )
            late = [await commit_one(i) for i in range(1500, 1520)]
        finally:
            tracemalloc.stop()
        history_bytes = 1500 * 2 * len(blob)
        assert sorted(late)[10] < sorted(early)[10] * 3 + 64 * 1024, (early, late)
        assert sorted(late)[10] < history_bytes / 10

    @case
    async def test_thread_keeps_the_tenant_of_its_first_commit(self, kit: Kit) -> None:
        claim, first = await kit.started("t1", tenant="acme")
        with pytest.raises(TenantMismatch):
            await kit.store.commit(
                "t1",
                Commit(
                    token=claim.token, checkpoint=kit.checkpoint(first.checkpoint_id, tenant="evil")
                ),
            )
        await kit.store.commit(
            "t1",
            Commit(
                token=claim.token, checkpoint=kit.checkpoint(first.checkpoint_id, tenant="acme")
            ),
        )
        snap = await kit.store.read("t1")
        assert snap is not None and snap.tenant == "acme" and snap.version == 2

    @case
    async def test_list_threads_by_tenant_and_cursor(self, kit: Kit) -> None:
        for i in range(5):
            await kit.started(f"a-{i}", tenant="acme")
        await kit.started("b-0", tenant="beta")
        await kit.started("n-0")
        await kit.claimed("claimed-only")
        acme = await kit.store.list_threads(tenant="acme")
        assert [t.thread_id for t in acme] == [f"a-{i}" for i in range(5)]
        assert all(t.tenant == "acme" and t.version == 1 and t.status == "running" for t in acme)
        assert [t.thread_id for t in await kit.store.list_threads(tenant="beta")] == ["b-0"]
        everyone = [t.thread_id for t in await kit.store.list_threads()]
        assert everyone == [*[f"a-{i}" for i in range(5)], "b-0", "n-0"]
        page1 = await kit.store.list_threads(tenant="acme", limit=2)
        page2 = await kit.store.list_threads(tenant="acme", after=page1[-1].thread_id, limit=2)
        assert [t.thread_id for t in page1 + page2] == ["a-0", "a-1", "a-2", "a-3"]

    @case
    async def test_prune_by_count_never_removes_the_latest_checkpoint(self, kit: Kit) -> None:
        claim, first = await kit.started("t1")
        parent = first.checkpoint_id
        for _ in range(5):
            cp = kit.checkpoint(parent)
            await kit.store.commit("t1", Commit(token=claim.token, checkpoint=cp))
            parent = cp.id
        assert len(await kit.store.checkpoints("t1")) == 6
        report = await kit.store.prune(RetentionPolicy(keep_checkpoints=2))
        assert report.checkpoints == 4
        history = await kit.store.checkpoints("t1")
        assert next(cp.id for cp, _ in history) == parent and len(history) == 2
        await kit.store.prune(RetentionPolicy(keep_checkpoints=0))
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint is not None and snap.checkpoint.id == parent
        assert len(await kit.store.checkpoints("t1")) == 1

    @case
    async def test_prune_by_age(self, kit: Kit) -> None:
        claim, first = await kit.started("t1", "holder-a")
        await kit.advance(100)
        second = kit.checkpoint(first.checkpoint_id)
        await kit.store.commit(
            "t1", Commit(token=claim.token, checkpoint=second, events=(EventDraft(type="new"),))
        )
        report = await kit.store.prune(
            RetentionPolicy(checkpoint_max_age=50, event_max_age=50, receipt_max_age=50)
        )
        assert report.checkpoints == 1 and report.events == 1
        assert [cp.id for cp, _ in await kit.store.checkpoints("t1")] == [second.id]
        with pytest.raises(ReplayUnavailable):
            await kit.store.events_after("t1", 0)
        assert [e.type for e in await kit.store.events_after("t1", 1)] == ["new"]
        await kit.advance(1000)
        await kit.store.prune(RetentionPolicy(checkpoint_max_age=1))
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint == second
        # Ages of weeks to a century are accepted (the operations guide's policy among them)
        # and remove nothing younger than they say.
        month = RetentionPolicy(
            keep_checkpoints=20,
            checkpoint_max_age=7 * 86400,
            event_max_age=30 * 86400,
            receipt_max_age=7 * 86400,
            settled_dispatch_max_age=7 * 86400,
        )
        assert await kit.store.prune(month) == PruneReport()
        assert await kit.store.prune(RetentionPolicy(event_max_age=MAX_AGE_SECONDS)) == (
            PruneReport()
        )
        with pytest.raises(InvalidInput):
            await kit.store.prune(RetentionPolicy(event_max_age=2 * MAX_AGE_SECONDS))
        assert [e.type for e in await kit.store.events_after("t1", 1)] == ["new"]

    @case
    async def test_prune_never_lowers_the_event_floor(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        for _ in range(10):
            await kit.store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="e"),)))
        await kit.store.compact_events("t1", 8)
        report = await kit.store.prune(RetentionPolicy(keep_events=5))
        assert report.events == 0
        snap = await kit.store.read("t1")
        assert snap is not None and snap.event_floor == 8
        await kit.store.prune(RetentionPolicy(keep_events=1))
        snap = await kit.store.read("t1")
        assert snap is not None and snap.event_floor == 10
        receipt = await kit.store.commit(
            "t1", Commit(token=claim.token, events=(EventDraft(type="e"),))
        )
        assert receipt.events == (11,)

    @case
    async def test_invalid_input_is_refused_before_storage(self, kit: Kit) -> None:
        bad_ids = ["", " x", "a/b", "../etc", "x" * 201, "naïve", "a\nb"]
        for bad in bad_ids:
            with pytest.raises(InvalidInput):
                await kit.store.claim(bad, "holder", 30)
            with pytest.raises(InvalidInput):
                await kit.store.claim("ok", bad, 30)
        for ttl in (0, -1, float("nan"), float("inf")):
            with pytest.raises(InvalidInput):
                await kit.store.claim("ok", "holder", ttl)
        claim = await kit.claimed("ok")
        with pytest.raises(InvalidInput):
            await kit.store.commit("ok", Commit(token=claim.token, operation_id="bad id"))
        with pytest.raises(InvalidInput):
            await kit.store.commit(
                "ok", Commit(token=claim.token, events=(EventDraft(type="e", data=object()),))
            )
        with pytest.raises(InvalidInput):
            await kit.store.events_after("ok", -1)
        snap = await kit.store.read("ok")
        assert snap is not None and snap.version == 0
