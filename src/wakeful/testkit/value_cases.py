"""Conformance cases: values are refused, never changed. JSON has no NaN or infinity and a
store must not turn them into ``null``; a value nested deeper than ``MAX_JSON_DEPTH`` is
refused before it is stored, so everything stored reads back."""

from __future__ import annotations

from typing import Any

import pytest

from wakeful.errors import InvalidInput
from wakeful.records import Commit, EventDraft, Message, OutboxEntry, PendingWrite
from wakeful.store.validate import MAX_JSON_DEPTH
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio

NOT_JSON = (float("nan"), float("inf"), float("-inf"))


def nested(depth: int, leaf: Any = 0) -> Any:
    """``leaf`` inside ``depth`` arrays/objects (alternating)."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


class ValueCases(Harness):
    @case
    async def test_nan_and_infinity_are_refused_in_every_commit_value(self, kit: Kit) -> None:
        claim = await kit.claimed("t1")
        for bad in NOT_JSON:
            cp = kit.checkpoint(None, state={"x": 1})
            commits = [
                Commit(token=claim.token, checkpoint=kit.checkpoint(None, state={"x": [bad]})),
                Commit(token=claim.token, events=(EventDraft(type="e", data={"v": bad}),)),
                Commit(token=claim.token, messages=(Message(id="m1", role="user", content=bad),)),
                Commit(
                    token=claim.token,
                    checkpoint=cp,
                    writes=(
                        PendingWrite(checkpoint_id=cp.id, task_id="a", node="n", value=(1, bad)),
                    ),
                ),
                Commit(
                    token=claim.token,
                    outbox=(OutboxEntry(message_id="o1", target_thread="t2", payload=bad),),
                ),
            ]
            for commit in commits:
                with pytest.raises(InvalidInput):
                    await kit.store.commit("t1", commit)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 0 and snap.last_seq == 0
        assert await kit.store.messages("t1") == []
        assert await kit.store.inbox("t2") == []

    @case
    async def test_values_deeper_than_the_limit_are_refused_and_the_limit_reads_back(
        self, kit: Kit
    ) -> None:
        claim = await kit.claimed("t1")
        for depth in (MAX_JSON_DEPTH, 2000, 100_000):
            state = {"deep": nested(depth)}  # the state object itself is one more level
            with pytest.raises(InvalidInput):
                await kit.store.commit(
                    "t1", Commit(token=claim.token, checkpoint=kit.checkpoint(None, state=state))
                )
            with pytest.raises(InvalidInput):
                await kit.store.commit(
                    "t1", Commit(token=claim.token, events=(EventDraft(type="e", data=state),))
                )
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 0 and snap.last_seq == 0
        deepest = {"deep": nested(MAX_JSON_DEPTH - 1)}
        cp = kit.checkpoint(None, state=deepest)
        await kit.store.commit(
            "t1",
            Commit(token=claim.token, checkpoint=cp, events=(EventDraft(type="e", data=deepest),)),
        )
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.state == deepest
        [event] = await kit.store.events_after("t1")
        assert event.data == deepest

    @case
    async def test_dispatch_payloads_are_refused_not_changed(self, kit: Kit) -> None:
        for n, bad in enumerate((*NOT_JSON, nested(MAX_JSON_DEPTH + 1), nested(5000))):
            with pytest.raises(InvalidInput):
                await kit.store.enqueue(
                    kit.dispatch("t1", dispatch_id=f"d-{n}", payload={"input": bad})
                )
            assert await kit.store.get_dispatch(f"d-{n}") is None
        assert await kit.store.list_dispatches(thread_id="t1") == []
        deepest = nested(MAX_JSON_DEPTH)
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-ok", payload=deepest))
        stored = await kit.store.get_dispatch("d-ok")
        assert stored is not None and stored.payload == deepest
