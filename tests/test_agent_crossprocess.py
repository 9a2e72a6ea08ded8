"""A process streaming a model turn from a real HTTP server (loopback) is killed with
SIGKILL after partial output; a new process recovers the run from the stream checkpoint and
the thread ends with exactly one complete assistant turn."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.provider_server import ProviderServer, Reply, openai_text
from tests.runtime_support import kill_when_ready, store_url
from tests.stream_child import writer
from wakeful import ManualClock, open_store
from wakeful.runtime import ClaimPolicy, Runtime

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_a_replacement_process_finishes_the_interrupted_turn(
    kind: str, tmp_path: Path
) -> None:
    url = store_url(kind, tmp_path)
    ready = tmp_path / "ready"
    with ProviderServer() as server:
        server.push(Reply(events=openai_text("Once ", "upon ", "a "), stall_after=4))
        argv = ["tests.stream_child", url, server.url, str(ready)]
        await asyncio.to_thread(kill_when_ready, argv, [ready])
        run_id = ready.read_text()
        server.push(Reply(events=openai_text("time.")))

        clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
        store = await open_store(url, clock=clock)
        try:
            runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="new")
            agent = writer(server.url)
            reply = await agent.recover(runtime, "t")
            assert reply.status == "completed" and reply.text == "Once upon a time."
            messages = await store.messages("t", 0, 100)
            assert [m.role for m in messages] == ["user", "assistant"]
            assert messages[1].content == "Once upon a time."
            assert messages[1].metadata["recoveries"][:2] == ["resumed", "R1"]
            continuation = server.bodies[1]["messages"]
            assert continuation[-2] == {"role": "assistant", "content": "Once upon a "}
            assert continuation[-1]["role"] == "user"
            assert await store.stream_checkpoints.get(run_id) is None, "deleted after commit"
            await agent.model.aclose()  # type: ignore[attr-defined]
        finally:
            await store.close()
