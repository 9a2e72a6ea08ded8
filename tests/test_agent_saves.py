"""A turn's background stream-checkpoint writes (``wakeful.agent.saves``): one in flight at
a time, only the newest snapshot waiting; answered by future (``put_soon``) or, for a store
with only ``put``, by a task per write; a drain waits for the chain and gives up, saying
so, on a write that hangs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from wakeful.agent.saves import Saves
from wakeful.errors import StreamCheckpointError
from wakeful.records import StreamCheckpoint

pytestmark = pytest.mark.asyncio

log = logging.getLogger("tests.saves")


def _snapshot(text: str) -> StreamCheckpoint:
    return StreamCheckpoint(run_id="run-1", thread_id="t1", model="m", partial_text=text)


class Gated:
    """A store whose writes end when the test says so; ``soon``: it has ``put_soon``."""

    def __init__(self, soon: bool) -> None:
        self.writes: list[str] = []
        self.gates: list[asyncio.Future[None]] = []
        if soon:
            self.put_soon = self._put_soon

    def _put_soon(self, checkpoint: StreamCheckpoint) -> asyncio.Future[None]:
        self.writes.append(checkpoint.partial_text)
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        return gate

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        await self._put_soon(checkpoint)

    async def get(self, run_id: str) -> Any:
        return None

    async def delete(self, run_id: str) -> None:
        return None

    async def discard(self, run_id: str, task_id: str, token: int) -> None:
        return None


class Outcomes:
    def __init__(self) -> None:
        self.saved = 0
        self.failed: list[BaseException] = []

    def ok(self) -> None:
        self.saved += 1

    def fail(self, exc: BaseException) -> None:
        self.failed.append(exc)


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.parametrize("soon", [True, False])
async def test_one_write_in_flight_and_only_the_newest_waits(soon: bool) -> None:
    store, seen = Gated(soon), Outcomes()
    saves = Saves(store, "stream-checkpoint:run-1", seen.ok, seen.fail, log)
    saves.save(_snapshot("a"))
    await _turns()
    saves.save(_snapshot("ab"))
    saves.save(_snapshot("abc"))  # replaces "ab", which was never sent
    await _turns()
    assert store.writes == ["a"]
    store.gates[0].set_result(None)
    await _turns()
    assert store.writes == ["a", "abc"] and seen.saved == 1
    draining = asyncio.ensure_future(saves.drain())
    await _turns()
    assert not draining.done(), "the drain waits for the write in flight"
    store.gates[1].set_exception(
        StreamCheckpointError("run-1", "stale", "token 0 is not the current claim")
    )
    assert await draining is True
    assert seen.saved == 1 and [type(e) for e in seen.failed] == [StreamCheckpointError]
    saves.save(_snapshot("abcd"))  # a drained chain takes writes again (the next attempt)
    await _turns()
    assert store.writes[-1] == "abcd"


async def test_a_write_refused_at_once_fails_and_leaves_nothing_in_flight() -> None:
    class Refusing(Gated):
        def _put_soon(self, checkpoint: StreamCheckpoint) -> asyncio.Future[None]:
            raise StreamCheckpointError(checkpoint.run_id, "invalid", "no")

    store, seen = Refusing(True), Outcomes()
    saves = Saves(store, "stream-checkpoint:run-1", seen.ok, seen.fail, log)
    saves.save(_snapshot("a"))
    assert len(seen.failed) == 1 and saves._flight is None
    assert await saves.drain() is True


async def test_a_drain_gives_up_on_a_write_that_hangs_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, seen = Gated(True), Outcomes()
    saves = Saves(store, "stream-checkpoint:run-1", seen.ok, seen.fail, log)
    saves.save(_snapshot("a"))
    saves.save(_snapshot("ab"))
    with caplog.at_level(logging.WARNING, logger="tests.saves"):
        assert await saves.drain(timeout=0.01) is False
    assert "stream-checkpoint:run-1" in caplog.text and "abandoning" in caplog.text
    assert store.gates[0].cancelled() and store.writes == ["a"], "the queued one is dropped"
    assert seen.saved == 0 and seen.failed == [], "an abandoned write no longer reports"
