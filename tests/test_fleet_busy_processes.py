"""Busy threads in a fleet (issue 36): two worker processes on PostgreSQL, an agent whose
model (a loopback OpenAI-compatible server) stalls mid-stream; a second submission with
``if_busy="interrupt"`` ends the first run ``interrupted`` with its partial reply committed
once, and the second run completes. Second variant: the worker holding the first run is
SIGKILLed right after the interrupt (during the hand-over): same outcome. And
``if_busy="rollback"`` with that SIGKILL: the first run is undone once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.postgres_support import Databases
from tests.provider_server import ProviderServer, Reply, openai_text
from wakeful import open_store
from wakeful.fleet import submit

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


def _spawn(dsn: str, server: str, worker_id: str, directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.busy_child", dsn, server, worker_id, str(directory)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _until(check: object, what: str, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while True:
        result = check()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("kill_holder", [False, True], ids=["graceful", "sigkill"])
async def test_interrupt_mid_stream_across_worker_processes(
    pg_databases: Databases, tmp_path: Path, kill_holder: bool
) -> None:
    dsn = await pg_databases.clone()
    with ProviderServer() as model:
        model.push(
            Reply(events=openai_text("Once ", "upon ", "a "), stall_after=4),
            Reply(events=openai_text("Hello again.")),
        )
        children = {name: _spawn(dsn, model.url, name, tmp_path) for name in ("w-1", "w-2")}
        store = await open_store(dsn)
        try:
            await _until(lambda: all((tmp_path / f"{n}.up").exists() for n in children), "up")
            await submit(store, "chat", "writer", "Tell me a story", dispatch_id="d-1")

            async def streaming() -> bool:
                turn = await store.stream_checkpoints.get("run-d-1")
                return turn is not None and turn.partial_text == "Once upon a "

            await _until(streaming, "the first run to stream its partial reply")
            snap = await store.read("chat")
            assert snap is not None and snap.claim is not None
            holder = snap.claim.holder.split(".")[0]
            await submit(
                store, "chat", "writer", "Stop, say hello", dispatch_id="d-2",
                if_busy="interrupt",
            )  # fmt: skip
            if kill_holder:
                os.kill(children[holder].pid, signal.SIGKILL)

            async def second_done() -> bool:
                d = await store.get_dispatch("d-2")
                return d is not None and d.status == "done"

            await _until(second_done, "the interrupting run to complete")
            events = await store.events_after("chat", 0, 1000)
            interrupted = [e for e in events if e.type == "run.interrupted"]
            assert [(e.run_id, e.data["interrupted_by"]) for e in interrupted] == [
                ("run-d-1", "d-2")
            ]
            completed = [e.run_id for e in events if e.type == "run.completed"]
            assert completed == ["run-d-2"], "the new run ran once, the old one never ended"
            messages = await store.messages("chat", 0, 100)
            replies = [(m.run_id, m.content, bool(m.metadata.get("interrupted")))
                       for m in messages if m.role == "assistant"]  # fmt: skip
            assert replies == [
                ("run-d-1", "Once upon a ", True),
                ("run-d-2", "Hello again.", False),
            ], "the partial reply committed once, then the new run's"
            history = [cp for cp, _ in await store.checkpoints("chat", limit=100)]
            assert next(cp.status for cp in history if cp.run_id == "run-d-1") == "interrupted"
            assert history[0].run_id == "run-d-2" and history[0].status == "completed"
        finally:
            await store.close()
            for child in children.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            model.close()
            for child in children.values():
                try:
                    child.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.communicate()


async def test_rollback_mid_stream_with_the_holder_sigkilled(
    pg_databases: Databases, tmp_path: Path
) -> None:
    """``rollback`` across worker processes, the first run's worker SIGKILLed during the
    hand-over: the first run is undone once (one ``run.rolled_back``, its partial reply not
    kept), the thread is back to empty, and the second run completes once on it."""
    dsn = await pg_databases.clone()
    with ProviderServer() as model:
        model.push(
            Reply(events=openai_text("Once ", "upon ", "a "), stall_after=4),
            Reply(events=openai_text("Hello again.")),
        )
        children = {name: _spawn(dsn, model.url, name, tmp_path) for name in ("w-1", "w-2")}
        store = await open_store(dsn)
        try:
            await _until(lambda: all((tmp_path / f"{n}.up").exists() for n in children), "up")
            await submit(store, "chat", "writer", "Tell me a story", dispatch_id="d-1")

            async def streaming() -> bool:
                turn = await store.stream_checkpoints.get("run-d-1")
                return turn is not None and turn.partial_text == "Once upon a "

            await _until(streaming, "the first run to stream its partial reply")
            snap = await store.read("chat")
            assert snap is not None and snap.claim is not None
            holder = snap.claim.holder.split(".")[0]
            await submit(
                store, "chat", "writer", "Forget it, say hello", dispatch_id="d-2",
                if_busy="rollback",
            )  # fmt: skip
            os.kill(children[holder].pid, signal.SIGKILL)

            async def second_done() -> bool:
                d = await store.get_dispatch("d-2")
                return d is not None and d.status == "done"

            await _until(second_done, "the rolling-back run to complete")
            events = await store.events_after("chat", 0, 1000)
            assert [(e.type, e.run_id) for e in events if e.type.startswith("run.")] == [
                ("run.started", "run-d-1"),
                ("run.rolled_back", "run-d-1"),
                ("run.started", "run-d-2"),
                ("run.completed", "run-d-2"),
            ]
            messages = await store.messages("chat", 0, 100)
            assert [(m.role, m.content) for m in messages] == [
                ("user", "Forget it, say hello"),
                ("assistant", "Hello again."),
            ]
            [branch] = await store.branches("chat")
            assert branch.fork_point == "run-d-1-c0" and branch.messages == 0
        finally:
            await store.close()
            for child in children.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            model.close()
            for child in children.values():
                try:
                    child.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.communicate()
