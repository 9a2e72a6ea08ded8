"""Conformance cases: the outbox relay, inbox consumption and stream checkpoints."""

from __future__ import annotations

from datetime import timedelta

import pytest

from wakeful.errors import InvalidCommit, StaleClaim, StreamCheckpointError, VersionConflict
from wakeful.records import Commit, OutboxEntry, StreamCheckpoint
from wakeful.store.contract import Store
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


def _entry(message_id: str, target: str = "t-target", payload: object = None) -> OutboxEntry:
    return OutboxEntry(
        message_id=message_id,
        target_thread=target,
        payload={"text": message_id} if payload is None else payload,
        correlation_id=f"corr-{message_id}",
    )


async def _send(kit: Kit, *entries: OutboxEntry, source: str = "t-source") -> None:
    claim = await kit.claimed(source)
    await kit.store.commit(source, Commit(token=claim.token, outbox=entries))
    await kit.store.release(source, claim.token)


async def _message_dispatches(store: Store, target: str) -> list[str]:
    return [
        d.dispatch_id for d in await store.list_dispatches(thread_id=target) if d.kind == "message"
    ]


class MessagingCases(Harness):
    @case
    async def test_outbox_is_staged_only_if_the_source_commit_applies(self, kit: Kit) -> None:
        claim, _first = await kit.started("t-source")
        refused = Commit(
            token=claim.token,
            checkpoint=kit.checkpoint("not-the-latest"),
            outbox=(_entry("m-lost"),),
        )
        with pytest.raises(VersionConflict):
            await kit.store.commit("t-source", refused)
        with pytest.raises(StaleClaim):
            await kit.store.commit(
                "t-source", Commit(token=claim.token + 7, outbox=(_entry("m-stale"),))
            )
        assert await kit.store.relay_outbox() == 0
        assert await kit.store.inbox("t-target") == []
        await kit.store.commit("t-source", Commit(token=claim.token, outbox=(_entry("m-1"),)))
        assert await kit.store.relay_outbox() == 1
        assert [m.message_id for m in await kit.store.inbox("t-target")] == ["m-1"]

    @case
    async def test_relay_delivers_once(self, kit: Kit) -> None:
        await _send(kit, _entry("m-1"), _entry("m-2"), _entry("m-3", target="t-other"))
        assert await kit.store.relay_outbox() == 3
        assert await kit.store.relay_outbox() == 0
        inbox = await kit.store.inbox("t-target")
        assert [(m.message_id, m.revision) for m in inbox] == [("m-1", 1), ("m-2", 2)]
        assert inbox[0].correlation_id == "corr-m-1" and inbox[0].payload == {"text": "m-1"}
        assert inbox[0].source_thread == "t-source"
        assert len(await _message_dispatches(kit.store, "t-target")) == 2
        assert len(await _message_dispatches(kit.store, "t-other")) == 1
        await _send(kit, _entry("m-1"))
        assert await kit.store.relay_outbox() == 1
        assert [m.message_id for m in await kit.store.inbox("t-target")] == ["m-1", "m-2"]
        assert len(await _message_dispatches(kit.store, "t-target")) == 2

    @case
    async def test_a_relay_crash_after_append_causes_no_duplicate(self, kit: Kit) -> None:
        kit.require("relay_crash_injection")
        await _send(kit, _entry("m-1"))
        await kit.harness.inject_crash(kit.store, "relay.after_append")
        with pytest.raises(Exception, match=r"relay\.after_append"):
            await kit.store.relay_outbox()
        assert [m.message_id for m in await kit.store.inbox("t-target")] == ["m-1"]
        store = await kit.reopen()
        assert await store.relay_outbox() == 1, "the staged entry is still there"
        assert await store.relay_outbox() == 0
        assert [m.message_id for m in await store.inbox("t-target")] == ["m-1"]
        assert len(await _message_dispatches(store, "t-target")) == 1

    @case
    async def test_a_late_relay_after_consumption_does_not_redeliver(self, kit: Kit) -> None:
        kit.require("relay_crash_injection")
        await _send(kit, _entry("m-1"))
        await kit.harness.inject_crash(kit.store, "relay.after_append")
        with pytest.raises(Exception, match=r"relay\.after_append"):
            await kit.store.relay_outbox()
        claim = await kit.claimed("t-target")
        await kit.store.commit("t-target", Commit(token=claim.token, consume=("m-1",)))
        assert await kit.store.relay_outbox() == 1
        assert await kit.store.inbox("t-target") == []

    @case
    async def test_consumption_removes_only_the_named_entries(self, kit: Kit) -> None:
        await _send(kit, _entry("m-1"), _entry("m-2"), _entry("m-3"))
        await kit.store.relay_outbox()
        claim = await kit.claimed("t-target")
        await kit.store.commit("t-target", Commit(token=claim.token, consume=("m-2",)))
        assert [m.message_id for m in await kit.store.inbox("t-target")] == ["m-1", "m-3"]
        for bad in (("m-2",), ("m-9",), ("m-1", "m-1")):
            with pytest.raises(InvalidCommit):
                await kit.store.commit("t-target", Commit(token=claim.token, consume=bad))
        assert [m.message_id for m in await kit.store.inbox("t-target")] == ["m-1", "m-3"]

    @case
    async def test_consumption_under_a_stale_token_is_refused(self, kit: Kit) -> None:
        await _send(kit, _entry("m-1"))
        await kit.store.relay_outbox()
        old = await kit.claimed("t-target", "holder-a")
        await kit.advance(31)
        await kit.store.claim("t-target", "holder-b", 30)
        with pytest.raises(StaleClaim):
            await kit.store.commit("t-target", Commit(token=old.token, consume=("m-1",)))
        assert [m.message_id for m in await kit.store.inbox("t-target")] == ["m-1"]

    @case
    async def test_stream_checkpoints_round_trip_exactly(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        checkpoint = StreamCheckpoint(
            run_id="run-1",
            thread_id="t1",
            model="gpt-x",
            partial_text="Hello, wörld 🙂",
            tool_calls=[{"id": "c1", "name": "search", "arguments": {"q": "x"}}],
            in_flight_tool={"id": "c2", "name": "calc", "arguments": '{"a": 1'},
            retry_count=2,
            token=claim.token,
            updated_at=kit.clock.now() + timedelta(microseconds=7),
            task_id="s3-t0",
        )
        await kit.store.stream_checkpoints.put(checkpoint)
        assert await kit.store.stream_checkpoints.get("run-1") == checkpoint
        store = await kit.reopen()
        assert await store.stream_checkpoints.get("run-1") == checkpoint
        assert await store.stream_checkpoints.get("run-unknown") is None
        newer = StreamCheckpoint(
            run_id="run-1",
            thread_id="t1",
            model="gpt-x",
            partial_text="Hello, wörld 🙂 more",
            token=claim.token,
            updated_at=kit.clock.now(),
        )
        await store.stream_checkpoints.put(newer)
        assert await store.stream_checkpoints.get("run-1") == newer

    @case
    async def test_stream_checkpoint_delete_is_idempotent(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        await kit.store.stream_checkpoints.put(
            StreamCheckpoint(run_id="run-1", thread_id="t1", model="m", token=claim.token)
        )
        stored = await kit.store.stream_checkpoints.get("run-1")
        assert stored is not None and stored.updated_at is not None
        await kit.store.stream_checkpoints.delete("run-1")
        await kit.store.stream_checkpoints.delete("run-1")
        await kit.store.stream_checkpoints.delete("run-never")
        assert await kit.store.stream_checkpoints.get("run-1") is None

    @case
    async def test_stream_checkpoint_put_with_a_stale_token_is_refused(self, kit: Kit) -> None:
        old = await kit.claimed("t1", "holder-a")
        await kit.store.stream_checkpoints.put(
            StreamCheckpoint(
                run_id="run-1", thread_id="t1", model="m", partial_text="a", token=old.token
            )
        )
        await kit.advance(31)
        new = await kit.store.claim("t1", "holder-b", 30)
        with pytest.raises(StreamCheckpointError) as refused:
            await kit.store.stream_checkpoints.put(
                StreamCheckpoint(
                    run_id="run-1", thread_id="t1", model="m", partial_text="ab", token=old.token
                )
            )
        assert refused.value.reason == "stale"
        kept = await kit.store.stream_checkpoints.get("run-1")
        assert kept is not None and kept.partial_text == "a"
        with pytest.raises(StreamCheckpointError):
            await kit.store.stream_checkpoints.put(
                StreamCheckpoint(run_id="run-2", thread_id="t-unclaimed", model="m", token=1)
            )
        with pytest.raises(StreamCheckpointError):
            await kit.store.stream_checkpoints.get("../../etc/passwd")
        await kit.store.stream_checkpoints.put(
            StreamCheckpoint(
                run_id="run-1", thread_id="t1", model="m", partial_text="b", token=new.token
            )
        )

    @case
    async def test_stream_checkpoint_discard_removes_only_that_turn_of_this_or_an_older_attempt(
        self, kit: Kit
    ) -> None:
        cps = kit.store.stream_checkpoints
        old = await kit.claimed("t1", "holder-a")

        def turn(task: str | None, token: int, run: str = "run-1") -> StreamCheckpoint:
            return StreamCheckpoint(
                run_id=run, thread_id="t1", model="m", partial_text="a", token=token, task_id=task
            )

        await cps.put(turn("s1-model", old.token))
        await cps.discard("run-1", "s2-model", old.token)  # another turn's: stays
        assert await cps.get("run-1") is not None
        await cps.discard("run-1", "s1-model", old.token - 1)  # written by a newer attempt
        assert await cps.get("run-1") is not None
        await cps.discard("run-1", "s1-model", old.token)
        assert await cps.get("run-1") is None
        await cps.discard("run-1", "s1-model", old.token)  # nothing there is fine
        await cps.discard("run-never", "s1-model", old.token)

        # An attempt that took the run over removes what an earlier attempt left of the turn
        # it committed; the earlier attempt's late discard leaves the newer checkpoint alone.
        await cps.put(turn("s1-model", old.token))
        await kit.advance(31)
        new = await kit.store.claim("t1", "holder-b", 30)
        await cps.discard("run-1", "s1-model", new.token)
        assert await cps.get("run-1") is None
        await cps.put(turn("s1-model", new.token))
        await cps.discard("run-1", "s1-model", old.token)
        kept = await cps.get("run-1")
        assert kept is not None and kept.token == new.token
        await cps.put(turn(None, new.token, "run-2"))  # a turn of a writer without task ids
        await cps.discard("run-2", "s1-model", new.token)
        assert await cps.get("run-2") is not None
        store = await kit.reopen()
        assert (await store.stream_checkpoints.get("run-1")) == kept

    @case
    async def test_stream_checkpoint_discard_refuses_invalid_arguments(self, kit: Kit) -> None:
        for args in (("../x", "s1-model", 1), ("run-1", "", 1), ("run-1", "s1-model", -1)):
            with pytest.raises(StreamCheckpointError) as refused:
                await kit.store.stream_checkpoints.discard(*args)
            assert refused.value.reason == "invalid"
