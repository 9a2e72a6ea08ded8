"""Both framework wrappers as fleet targets of two worker processes over PostgreSQL
(``tests.framework_fleet_child``): the worker running the agent is SIGKILLed mid-answer and
the other one finishes it. The answer equals the uninterrupted one, the provider saw one
continued request (not a second generation), and the ``never`` tool ran once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

from tests.pgfleet_support import ROOT, charges, check_fleet, endings, kill, stop, wait_for
from tests.postgres_support import Databases, open_test_store
from tests.provider_server import (
    ProviderServer,
    Reply,
    openai_chunk,
    openai_text,
    openai_tool,
    openai_usage,
)
from tests.runtime_support import eventually
from wakeful.fleet import submit

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def spawn(url: str, worker_id: str, directory: Path, server_url: str) -> subprocess.Popen[str]:
    argv = ["tests.framework_fleet_child", url, url, worker_id, str(directory), server_url]
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


CALL = [
    openai_chunk({"role": "assistant", "content": None}),
    openai_tool(0, "c-charge", "charge", '{"amount": 5}'),
    openai_chunk({}, "tool_calls"),
    openai_usage(5, 5),
    b"data: [DONE]\n\n",
]


@pytest.mark.asyncio
@pytest.mark.parametrize("target", ["pydai", "oai"])
async def test_a_worker_sigkilled_mid_answer_is_finished_by_the_other(
    target: str, pg_databases: Databases, tmp_path: Path
) -> None:
    url = await pg_databases.clone()
    thread = f"t-{target}"
    with ProviderServer() as server:
        server.push(
            Reply(events=CALL), Reply(events=openai_text("Once ", "upon ", "a "), stall_after=4)
        )
        workers = {f"w{i}": spawn(url, f"w{i}", tmp_path, server.url) for i in range(2)}
        store = await open_test_store(url)
        try:
            up = [tmp_path / f"{w}.up" for w in workers]
            await asyncio.to_thread(wait_for, lambda: all(p.exists() for p in up), "workers")
            await submit(store, thread, target, "Charge 5, then a story", dispatch_id="d-1")

            async def checkpointed() -> bool:
                messages = await store.messages(thread, 0, 10)
                if not messages:
                    return False
                saved = await store.stream_checkpoints.get(str(messages[0].run_id))
                return saved is not None and saved.partial_text == "Once upon a "

            await eventually(checkpointed, deadline=60)
            snap = await store.read(thread)
            assert snap is not None and snap.claim is not None
            running = next(w for w in workers if w in snap.claim.holder)
            await asyncio.to_thread(kill, workers.pop(running))
            server.push(Reply(events=openai_text("time.")))

            async def ended() -> bool:
                return bool((await endings(store, [thread]))[thread])

            await eventually(ended, deadline=60)
            assert await check_fleet(store, [thread], tmp_path) == {"run.completed": 1}
            messages = await store.messages(thread, 0, 100)
            assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
            assert messages[-1].content == "Once upon a time.", "the uninterrupted answer"
            assert messages[-1].metadata["recoveries"][:2] == ["resumed", "R1"]
            assert len(server.bodies) == 3, "one continued request, no second generation"
            continuation = server.bodies[2]["messages"]
            assert continuation[-2] == {"role": "assistant", "content": "Once upon a "}
            assert continuation[-1]["role"] == "user"
            assert charges(tmp_path) == {thread: 1}, "the never tool ran once"
        finally:
            await store.close()
            for child in workers.values():
                await asyncio.to_thread(stop, child)
