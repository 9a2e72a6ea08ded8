"""The Remote Hand over real HTTP (uvicorn on 127.0.0.1): a call runs once, a retry with
the same operation id returns the record, a reused id fails closed, a call left ``started``
(the process died mid-call) is indeterminate and never runs again, including after a
SIGKILL of a child process running the service, and a lost response costs a retry, not a
second effect."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hand_support import Effects, HandChild, running_hand, until
from wakeful.agent.agent import INDETERMINATE
from wakeful.agent.tools import ToolContext, tool
from wakeful.errors import InvalidInput, InvalidState, StoreLocked
from wakeful.fleet.hand import (
    HandConflict,
    HandError,
    HandIndeterminate,
    HandOutcomeUnknown,
    HandRejected,
    HandService,
    HandUnavailable,
    RemoteHand,
)
from wakeful.runtime.context import idempotency_key


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path)


# --------------------------------------------------------------------------- in-process


@pytest.mark.asyncio
async def test_a_call_runs_once_and_a_retry_returns_the_record(
    tmp_path: Path, effects: Effects
) -> None:
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        RemoteHand(url) as hand,
    ):
        first = await hand.call("count", {"tag": "a", "amount": 3}, operation_id="op-1")
        assert first == {"tag": "a", "amount": 3, "executions": 1}
        again = await hand.call("count", {"amount": 3, "tag": "a"}, operation_id="op-1")
        assert again == first
        assert effects.lines() == ["a"]
        record = await hand.lookup("op-1")
        assert record is not None
        assert record["status"] == "done"
        assert record["result"] == first
        assert record["arguments"] == {"tag": "a", "amount": 3}
        assert await hand.lookup("op-never") is None
        async with httpx.AsyncClient(base_url=url) as raw:
            body = {"operation_id": "op-1", "tool": "count", "arguments": {"tag": "a", "amount": 3}}
            answer = (await raw.post("/v1/calls", json=body)).json()
            assert answer["status"] == "done"
            assert answer["replayed"] is True
            assert (await raw.get("/healthz")).json() == {"status": "ok"}


@pytest.mark.asyncio
async def test_a_reused_operation_id_fails_closed_with_409(
    tmp_path: Path, effects: Effects
) -> None:
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        RemoteHand(url) as hand,
    ):
        await hand.call("count", {"tag": "a"}, operation_id="op-1")
        with pytest.raises(HandConflict):
            await hand.call("count", {"tag": "b"}, operation_id="op-1")
        with pytest.raises(HandConflict):
            await hand.call("fail", {"tag": "a"}, operation_id="op-1")
        async with httpx.AsyncClient(base_url=url) as raw:
            body = {"operation_id": "op-1", "tool": "count", "arguments": {"tag": "c"}}
            response = await raw.post("/v1/calls", json=body)
        assert response.status_code == 409
        assert response.headers["content-type"].startswith("application/problem+json")
        problem = response.json()
        assert problem["status"] == 409
        assert problem["operation_id"] == "op-1"
        assert problem["type"].endswith("operation-conflict")
        assert effects.lines() == ["a"]


@pytest.mark.asyncio
async def test_a_tool_error_is_recorded_and_replayed_not_rerun(
    tmp_path: Path, effects: Effects
) -> None:
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        RemoteHand(url) as hand,
    ):
        for _ in range(2):
            with pytest.raises(HandError) as caught:
                await hand.call("fail", {"tag": "x"}, operation_id="op-fail")
            assert caught.value.error == "RuntimeError: card declined for x"
        assert effects.lines() == ["x"]
        record = await hand.lookup("op-fail")
        assert record is not None
        assert record["status"] == "error"


@pytest.mark.asyncio
async def test_a_call_left_started_is_indeterminate_and_never_runs(
    tmp_path: Path, effects: Effects
) -> None:
    ledger = tmp_path / "ledger.db"
    async with running_hand(ledger, effects) as (url, _), RemoteHand(url) as hand:
        # As if the process died mid-call: the start is recorded, no result.
        with sqlite3.connect(ledger) as db:
            db.execute(
                "INSERT INTO operations (operation_id, tool, arguments, status, started_at) "
                "VALUES ('op-dead', 'count', '{\"tag\":\"d\"}', 'started', '2025-01-01T00:00:00')"
            )
        db.close()
        with pytest.raises(HandIndeterminate):
            await hand.call("count", {"tag": "d"}, operation_id="op-dead")
        record = await hand.lookup("op-dead")
        assert record is not None
        assert record["status"] == "indeterminate"
        with pytest.raises(HandConflict):
            await hand.call("count", {"tag": "other"}, operation_id="op-dead")

        @tool(replay="keyed")
        async def charge(tag: str, ctx: ToolContext) -> Any:
            try:
                return await hand.call("count", {"tag": tag}, operation_id=ctx.idempotency_key)
            except HandIndeterminate:
                return INDETERMINATE

        ctx = ToolContext("t", "r", "c", "op-dead", 1)
        assert await charge.call({"tag": "d"}, ctx) == INDETERMINATE
        assert effects.lines() == []


@pytest.mark.asyncio
async def test_a_lost_response_is_retried_with_the_same_key_and_runs_once(
    tmp_path: Path, effects: Effects
) -> None:
    class LoseFirstResponse(httpx.AsyncHTTPTransport):
        """Delivers the request, reads the committed answer, then loses it."""

        lost = 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = await super().handle_async_request(request)
            if request.method == "POST" and self.lost == 0:
                self.lost += 1
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("connection reset before the answer arrived")
            return response

    transport = LoseFirstResponse()
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        httpx.AsyncClient(transport=transport) as client,
    ):
        hand = RemoteHand(url, client=client, backoff=0.01)

        @tool(replay="keyed")
        async def charge(tag: str, amount: int, ctx: ToolContext) -> Any:
            try:
                return await hand.call(
                    "count", {"tag": tag, "amount": amount}, operation_id=ctx.idempotency_key
                )
            except HandIndeterminate:
                return INDETERMINATE

        key = idempotency_key("thread-1", "run-1", 3, "tool:0")
        ctx = ToolContext("thread-1", "run-1", "call-1", key, 7)
        first = await charge.call({"tag": "pay", "amount": 5}, ctx)
        assert transport.lost == 1
        assert first == {"tag": "pay", "amount": 5, "executions": 1}
        # A recovery replays the keyed tool with the same key: the record, not a new effect.
        assert await charge.call({"tag": "pay", "amount": 5}, ctx) == first
        assert effects.lines() == ["pay"]
        await hand.aclose()  # a shared client stays open
        assert not client.is_closed


@pytest.mark.asyncio
async def test_a_retry_while_the_call_runs_waits_for_it(tmp_path: Path, effects: Effects) -> None:
    class Counting(httpx.AsyncHTTPTransport):
        posts = 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "POST":
                self.posts += 1
            return await super().handle_async_request(request)

    transport = Counting()
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, service),
        httpx.AsyncClient(transport=transport) as client,
    ):
        hand = RemoteHand(url, client=client, timeout=0.2, attempts=50, backoff=0.01)
        call = asyncio.create_task(hand.call("gated", {"tag": "g"}, operation_id="op-g"))
        await until(lambda: transport.posts >= 3, "two retries while the tool runs")
        record = await service.lookup("op-g")
        assert record is not None
        assert record["status"] == "running"
        effects.gate.set()
        assert await call == "finished g"
        assert effects.lines() == ["g"]


@pytest.mark.asyncio
async def test_bad_requests_are_problem_documents(tmp_path: Path, effects: Effects) -> None:
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        RemoteHand(url) as hand,
        httpx.AsyncClient(base_url=url) as raw,
    ):
        cases: list[tuple[Any, int, str]] = [
            ({"operation_id": "../x", "tool": "count", "arguments": {}}, 422, "invalid-input"),
            ({"operation_id": "op", "tool": "nope", "arguments": {}}, 422, "unknown-tool"),
            ({"operation_id": "op", "tool": "count", "extra": 1}, 422, "invalid-input"),
            ({"operation_id": "op", "tool": "count", "arguments": []}, 422, "invalid-input"),
            (
                {"operation_id": "op", "tool": "count", "arguments": {"x": "y" * 3_000_000}},
                413,
                "too-large",
            ),
        ]
        for body, status, slug in cases:
            response = await raw.post("/v1/calls", json=body)
            assert response.status_code == status, response.text
            assert response.headers["content-type"].startswith("application/problem+json")
            assert response.json()["type"].endswith(slug)
        missing = await raw.get("/v1/calls/op-none")
        assert missing.status_code == 404
        assert missing.json()["status"] == 404
        assert (await raw.get("/nowhere")).status_code == 404
        with pytest.raises(HandRejected) as caught:
            await hand.call("nope", {}, operation_id="op-x")
        assert caught.value.status == 422
        with pytest.raises(InvalidInput):
            await hand.call("count", {}, operation_id="bad id")
        assert effects.lines() == []


@pytest.mark.asyncio
async def test_an_unreachable_hand_is_retried_then_unavailable(tmp_path: Path) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with RemoteHand("http://127.0.0.1:1", attempts=3, backoff=0.1) as hand:
        hand.sleep = sleep
        with pytest.raises(HandUnavailable) as caught:
            await hand.call("count", {"tag": "a"}, operation_id="op-1")
    assert caught.value.retryable
    assert caught.value.attempts == 3
    assert slept == [0.1, 0.2]


@pytest.mark.asyncio
async def test_one_service_owns_a_ledger(tmp_path: Path, effects: Effects) -> None:
    async with HandService(tmp_path / "ledger.db", effects.tools()) as service:
        with pytest.raises(StoreLocked):
            HandService(tmp_path / "ledger.db", {})
        outcome = await service.execute("op-1", "count", {"tag": "a"})
        assert (outcome.status, outcome.replayed) == ("done", False)
    async with HandService(tmp_path / "ledger.db", {}) as reopened:
        # The record outlives the tool registry: replayed without the tool.
        outcome = await reopened.execute("op-1", "count", {"tag": "a"})
        assert (outcome.status, outcome.replayed) == ("done", True)
        assert outcome.result == {"tag": "a", "amount": 1, "executions": 1}
    with pytest.raises(InvalidState):
        await reopened.execute("op-2", "count", {"tag": "a"})


# --------------------------------------------------------------------------- processes


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hand_killed_mid_call_answers_indeterminate_after_restart(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    executions = tmp_path / "executions"
    marker = tmp_path / "started-k"
    first = HandChild(ledger, tmp_path, "first")
    try:
        url = await first.url()
        async with RemoteHand(url, attempts=2, backoff=0.05, recovery_window=0.5) as hand:
            call = asyncio.create_task(hand.call("block", {"tag": "k"}, operation_id="op-kill"))
            await until(marker.exists, "the tool to start")
            os.kill(first.process.pid, signal.SIGKILL)
            # Sent, then the connection dropped, and no hand came back within the window:
            # unknown, never "unavailable" (which would say it did not run).
            with pytest.raises(HandOutcomeUnknown):
                await call
    finally:
        first.stop(signal.SIGKILL)
    assert first.process.returncode == -signal.SIGKILL
    marker.unlink()

    second = HandChild(ledger, tmp_path, "second")
    try:
        url = await second.url()
        async with RemoteHand(url) as hand:
            for _ in range(2):
                with pytest.raises(HandIndeterminate):
                    await hand.call("block", {"tag": "k"}, operation_id="op-kill")
            record = await hand.lookup("op-kill")
            assert record is not None
            assert record["status"] == "indeterminate"
            fresh = await hand.call("count", {"tag": "n"}, operation_id="op-new")
            assert fresh == {"tag": "n", "executions": 2}
        with pytest.raises(StoreLocked):
            HandService(ledger, {})
    finally:
        code = second.stop(signal.SIGTERM)
    assert code == 0, second.output()
    assert executions.read_text(encoding="utf-8").splitlines() == ["k", "n"]
    assert not marker.exists(), "the killed call never ran again"
