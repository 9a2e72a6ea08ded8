"""Thread streams over a real loopback server (uvicorn in the test's loop) with a worker in
the same process: the four modes, resuming from any frame id, refusals, and the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.server_support import ALPHA, BETA, DEADLINE, Api, keyed, running_api
from wakeful import DispatchConflict, InvalidInput, NotFound, RequestRefused
from wakeful.agent import Agent
from wakeful.client import Client, Frame, MessageAssembler
from wakeful.fleet import LocalWake, Registry, Worker
from wakeful.fleet.live import LocalLive
from wakeful.providers.scripted import Scripted, reply
from wakeful.store.memory import MemoryStore

REPLY = "Hello there, this reply is streamed to the client."


@asynccontextmanager
async def fleet(*, live: bool = True, delay: float = 0.005) -> AsyncIterator[Api]:
    store = MemoryStore()
    channel = LocalLive() if live else None
    wake = LocalWake()
    model = Scripted.of(*[reply(REPLY, chunk=3) for _ in range(4)], delay=delay)
    registry = Registry().add("greeter", Agent("greeter", model, "Greet."))
    worker = Worker(store, registry, wake=wake, poll_interval=0.05, live=channel)
    running = asyncio.create_task(worker.run())
    try:
        async with running_api(store, registry=registry, wake=wake, live=channel) as api:
            yield api
    finally:
        await worker.stop(2)
        await running


async def collect(stream: Any) -> list[Frame]:
    frames: list[Frame] = []
    async with stream, asyncio.timeout(DEADLINE):
        async for frame in stream:
            frames.append(frame)
    return frames


@pytest.mark.asyncio
async def test_a_run_streams_in_every_mode() -> None:
    async with fleet() as api, Client(api.url, ALPHA) as client:
        modes = ("events", "messages", "updates", "values")
        stream = client.runs.stream("t1", "greeter", "hi", modes=modes)
        frames = await collect(stream)
        names = [f.event for f in frames]
        assert names[0] == "metadata" and names[-1] == "end"
        run_id = frames[0].data["run_id"]
        # events: exactly what the events route pages
        page = await client.events.list("t1")
        assert [f.data for f in frames if "." in f.event] == page["events"]
        # updates: the model node's writes, from its task.completed event
        updates = [f.data for f in frames if f.event == "updates"]
        assert [u["node"] for u in updates] == ["model"]
        assert updates[0]["updates"]["final"] == REPLY and updates[0]["run_id"] == run_id
        # values: the state after the run's start and after its (only) superstep
        values = [f.data for f in frames if f.event == "values"]
        assert [v["after"] for v in values] == ["run.started", "run.completed"]
        assert values[-1]["values"]["final"] == REPLY and not values[-1]["pruned"]
        # messages: deltas before the commit, adding up to the committed message
        deltas = [i for i, n in enumerate(names) if n == "messages/delta"]
        assert deltas and deltas[-1] < names.index("message.completed")
        [message] = stream.messages.messages.values()
        assert message.streamed_text == REPLY == message.text and message.gaps == 0
        committed = (await client.threads.messages("t1"))["messages"][-1]
        assert committed["id"] == message.message_id and committed["content"] == REPLY


@pytest.mark.asyncio
async def test_resuming_from_any_frame_id_gives_exactly_the_rest() -> None:
    async with fleet() as api, Client(api.url, ALPHA) as client:
        accepted = await client.runs.create("t1", "greeter", "hi")
        await client.runs.wait("t1", accepted["run_id"])
        modes = ("events", "messages", "updates", "values")
        whole = await collect(client.stream("t1", modes=modes, run_id=accepted["run_id"]))
        assert len({f.id for f in whole}) == len(whole), "every frame id is distinct"
        assert any("." in str(f.id) for f in whole), "an event gives several frames"
        for i, frame in enumerate(whole[:-1]):
            assert frame.id is not None
            rest = await collect(
                client.stream("t1", modes=modes, after=frame.id, run_id=accepted["run_id"])
            )
            assert [(f.id, f.event, f.data) for f in rest] == [
                (f.id, f.event, f.data) for f in whole[i + 1 :]
            ], f"resuming after {frame.id}"


@pytest.mark.asyncio
async def test_a_client_that_reconnects_mid_reply_ends_with_the_whole_reply_once() -> None:
    async with fleet(delay=0.03) as api, Client(api.url, ALPHA) as client:
        assembler = MessageAssembler()
        first = client.runs.stream("t1", "greeter", "hi", modes=("messages",))
        last_id: str | None = None
        async with first, asyncio.timeout(DEADLINE):
            async for frame in first:
                assembler.apply(frame)
                last_id = frame.id
                if frame.event == "messages/delta" and frame.data["offset"] >= 9:
                    break  # the client goes away mid-reply
        assert first.metadata is not None and last_id is not None and "/" in last_id
        run_id = first.metadata["run_id"]
        second = client.stream("t1", modes=("messages",), after=last_id, run_id=run_id)
        async with second, asyncio.timeout(DEADLINE):
            async for frame in second:
                assembler.apply(frame)
                if frame.event == "messages/delta":
                    # resumed where it stopped: nothing it already had is sent again
                    assert frame.data["offset"] >= 9
        [message] = assembler.messages.values()
        assert message.complete and message.streamed_text == REPLY == message.text


@pytest.mark.asyncio
async def test_without_a_live_channel_messages_follow_the_stream_checkpoints() -> None:
    async with fleet(live=False, delay=0.06) as api, Client(api.url, ALPHA) as client:
        stream = client.runs.stream("t1", "greeter", "hi", modes=("events", "messages"))
        frames = await collect(stream)
        names = [f.event for f in frames]
        assert "messages/delta" in names[: names.index("message.completed")]
        [message] = stream.messages.messages.values()
        assert message.streamed_text is not None and REPLY.startswith(message.streamed_text)
        assert message.text == REPLY and message.gaps == 0


@pytest.mark.asyncio
async def test_unknown_modes_foreign_threads_and_bad_ids_are_refused() -> None:
    async with fleet() as api, Client(api.url, ALPHA) as alpha, Client(api.url, BETA) as beta:
        accepted = await alpha.runs.create("t1", "greeter", "hi")
        await alpha.runs.wait("t1", accepted["run_id"])
        with pytest.raises(InvalidInput) as unknown:
            await collect(alpha.stream("t1", modes=("events", "tokens")))
        assert unknown.value.field == "modes" and "'tokens'" in str(unknown.value)
        with pytest.raises(InvalidInput) as bad_id:
            await collect(alpha.stream("t1", after="12;drop"))
        assert bad_id.value.field == "Last-Event-ID"
        with pytest.raises(NotFound):
            await collect(beta.stream("t1"))
        with pytest.raises(NotFound):
            await collect(beta.runs.stream("t1", "greeter", "hijack"))
        assert len((await alpha.threads.messages("t1"))["messages"]) == 2, "nothing was added"


@pytest.mark.asyncio
async def test_the_client_maps_problems_and_retries_posts_under_one_key() -> None:
    async with fleet() as api, Client(api.url, ALPHA) as client:
        one = await client.runs.create("t1", "greeter", "hi", idempotency_key="key-1")
        again = await client.runs.create("t1", "greeter", "hi", idempotency_key="key-1")
        assert again["dispatch_id"] == one["dispatch_id"] == keyed("alpha", "key-1")
        with pytest.raises(DispatchConflict) as conflict:
            await client.runs.create("t1", "greeter", "other", idempotency_key="key-1")
        assert conflict.value.dispatch_id == keyed("alpha", "key-1")
        with pytest.raises(NotFound):
            await client.threads.get("missing")
        with pytest.raises(RequestRefused) as forbidden:
            await client.quarantine.list()
        assert forbidden.value.status == 403
        async with Client(api.url, "not-a-token") as stranger:
            with pytest.raises(RequestRefused) as unauthenticated:
                await stranger.threads.list()
        assert unauthenticated.value.status == 401
        dispatches = await client.dispatches.list(thread_id="t1")
        assert [d["dispatch_id"] for d in dispatches["dispatches"]] == [keyed("alpha", "key-1")]
