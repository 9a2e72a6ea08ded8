"""How ``RemoteHand`` resolves a call that may have reached the hand, against the real
service over loopback HTTP with faults injected in the client's transport: a ``keyed`` call
is sent again with the same operation id, a ``never`` call is only looked up, a 5xx after
sending counts as "may have reached", and a call whose outcome stays unknown ends in
``HandOutcomeUnknown`` once ``recovery_window`` is spent (measured on a fake clock), never
in ``HandUnavailable``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hand_support import Effects, running_hand
from wakeful.agent.tools import ToolContext
from wakeful.errors import InvalidInput
from wakeful.fleet.hand import (
    RESOLVE_INTERVAL,
    HandConflict,
    HandIndeterminate,
    HandOutcomeUnknown,
    HandUnavailable,
    RemoteHand,
)


class Faulty(httpx.AsyncHTTPTransport):
    """A real transport that spoils the answers to the first ``spoil`` POSTs: ``lose``
    delivers the request and raises ``ReadError`` (the connection dropped after sending),
    ``drop`` raises ``ReadError`` without delivering (the hand died before reading it),
    ``502`` delivers it and answers 502 (a proxy whose upstream hung up)."""

    def __init__(self, mode: str, spoil: int = 1) -> None:
        super().__init__()
        self.mode = mode
        self.spoil = spoil
        self.methods: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.methods.append(request.method)
        spoiled = request.method == "POST" and self.methods.count("POST") <= self.spoil
        if spoiled and self.mode == "drop":
            raise httpx.ReadError("the connection dropped after the request was written")
        response = await super().handle_async_request(request)
        if not spoiled:
            return response
        await response.aread()
        await response.aclose()
        if self.mode == "lose":
            raise httpx.ReadError("the connection dropped before the answer arrived")
        return httpx.Response(502, text="bad gateway", request=request)


class FakeTime:
    """``RemoteHand.sleep`` and ``RemoteHand.monotonic`` on a clock that moves only by the
    sleeps, so a 30 s window takes no time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def faked(hand: RemoteHand) -> FakeTime:
    fake = FakeTime()
    hand.sleep = fake.sleep
    hand.monotonic = fake.monotonic
    return fake


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path)


def ctx(replay: Any, key: str = "op-1") -> ToolContext:
    return ToolContext("thread", "run", "call", key, 1, replay)


@pytest.mark.asyncio
@pytest.mark.parametrize("replay", ["keyed", "never"])
@pytest.mark.parametrize("mode", ["lose", "502"])
async def test_an_answer_lost_after_sending_is_resolved_by_the_operation_id(
    tmp_path: Path, effects: Effects, replay: str, mode: str
) -> None:
    transport = Faulty(mode)
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        httpx.AsyncClient(transport=transport) as client,
    ):
        hand = RemoteHand(url, client=client)
        faked(hand)
        result = await hand.call("count", {"tag": "a"}, ctx=ctx(replay))
    assert result == {"tag": "a", "amount": 1, "executions": 1}
    assert effects.lines() == ["a"]
    if replay == "never":
        assert transport.methods == ["POST", "GET"]  # looked up, not sent again
    else:
        assert transport.methods == ["POST", "POST"]  # sent again: the record came back


@pytest.mark.asyncio
async def test_a_keyed_call_whose_answers_keep_getting_lost_ends_unknown_after_the_window(
    tmp_path: Path, effects: Effects
) -> None:
    transport = Faulty("lose", spoil=1000)
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        httpx.AsyncClient(transport=transport) as client,
    ):
        hand = RemoteHand(url, client=client, recovery_window=30)
        fake = faked(hand)
        with pytest.raises(HandOutcomeUnknown) as caught:
            await hand.call("count", {"tag": "a"}, operation_id="op-1")
        # The hand ran it once; the client could not tell. A later lookup can.
        record = await hand.lookup("op-1")
    assert isinstance(caught.value, HandIndeterminate) and caught.value.retryable
    assert caught.value.window == 30 and "ReadError" in caught.value.detail
    assert sum(fake.slept) == pytest.approx(30)
    assert max(fake.slept) <= RESOLVE_INTERVAL
    assert transport.methods.count("POST") == 1 + len(fake.slept)
    assert effects.lines() == ["a"]
    assert record is not None and record["status"] == "done"


@pytest.mark.asyncio
async def test_a_never_call_the_hand_has_no_record_of_ends_unknown_not_unavailable(
    tmp_path: Path, effects: Effects
) -> None:
    """The request may still be on its way to a live hand: no record is not proof that it
    will never run, so the call is not reported failed (the model would call again)."""
    transport = Faulty("drop")
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        httpx.AsyncClient(transport=transport) as client,
    ):
        hand = RemoteHand(url, client=client, recovery_window=5)
        fake = faked(hand)
        with pytest.raises(HandOutcomeUnknown):
            await hand.call("count", {"tag": "a"}, ctx=ctx("never"))
    assert transport.methods.count("POST") == 1
    assert transport.methods.count("GET") == len(fake.slept) >= 5
    assert effects.lines() == []


@pytest.mark.asyncio
async def test_a_looked_up_record_of_another_call_is_a_conflict(
    tmp_path: Path, effects: Effects
) -> None:
    transport = Faulty("drop", spoil=2)
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        httpx.AsyncClient(transport=transport) as client,
    ):
        async with RemoteHand(url) as direct:
            await direct.call("count", {"tag": "other"}, operation_id="op-1")
        hand = RemoteHand(url, client=client)
        faked(hand)
        with pytest.raises(HandConflict):
            await hand.call("count", {"tag": "a"}, ctx=ctx("never"))
    assert effects.lines() == ["other"]


@pytest.mark.asyncio
async def test_a_call_that_never_left_is_unavailable_after_its_attempts() -> None:
    """Connection refused: provably not sent, so retried ``attempts`` times (whatever the
    policy: nothing reached the hand) and then an error that says so."""
    for replay in ("keyed", "never"):
        async with RemoteHand("http://127.0.0.1:1", attempts=3) as hand:
            fake = faked(hand)
            with pytest.raises(HandUnavailable) as caught:
                await hand.call("count", {"tag": "a"}, ctx=ctx(replay))
        assert caught.value.attempts == 3
        assert fake.slept == [0.2, 0.4]


@pytest.mark.asyncio
async def test_the_operation_id_and_policy_are_checked() -> None:
    async with RemoteHand("http://127.0.0.1:1") as hand:
        with pytest.raises(InvalidInput, match="operation_id"):
            await hand.call("count", {})
        with pytest.raises(InvalidInput, match="differs"):
            await hand.call("count", {}, operation_id="op-2", ctx=ctx("keyed"))
        with pytest.raises(InvalidInput, match="replay"):
            await hand.call("count", {}, operation_id="op-2", replay="sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="recovery_window"):
        RemoteHand("http://127.0.0.1:1", recovery_window=-1)
