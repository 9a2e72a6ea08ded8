"""``make demo`` / ``wakeful demo``: crash a worker mid-stream and watch a replacement
recover, on the embedded SQLite store.

A worker process runs a support agent with one tool. Once the tool has run and the agent's
answer is streaming, the worker is killed with SIGKILL. A replacement worker recovers the
run: the tool is not run again, the stream continues from its checkpoint, and one complete
assistant turn is committed. The story ends with the transcript and a summary; the exit
status is non-zero if any guarantee failed.

With ``WAKEFUL_MODEL_URL`` set, the agent talks to that OpenAI-compatible endpoint
(``WAKEFUL_MODEL``, ``WAKEFUL_API_KEY``) instead of the built-in demo model."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wakeful import open_store
from wakeful.agent import Agent, StreamPolicy, ToolContext, tool
from wakeful.demo.model import ANSWER, DemoModel
from wakeful.fleet import Registry, Worker, submit
from wakeful.runtime import ClaimPolicy

THREAD = "order-42"
TTL = 2.0


def agent(directory: Path) -> Agent:
    @tool(replay="keyed")
    def lookup_order(order_id: int, ctx: ToolContext) -> dict[str, Any]:
        """Look an order up in the shop's database."""
        with (directory / "tool-calls.txt").open("a", encoding="utf-8") as f:
            f.write(f"lookup_order {order_id} key={ctx.idempotency_key}\n")
            f.flush()
            os.fsync(f.fileno())
        return {"order_id": order_id, "status": "shipped", "carrier": "PostNL", "eta": "Thu"}

    url = os.environ.get("WAKEFUL_MODEL_URL")
    model: Any
    if url:
        from wakeful.providers.openai import OpenAIChat

        model = OpenAIChat(
            os.environ.get("WAKEFUL_MODEL", "gpt-4o-mini"),
            base_url=url,
            api_key=os.environ.get("WAKEFUL_API_KEY"),
        )
    else:
        model = DemoModel()
    policy = StreamPolicy(
        checkpoint_every_deltas=1, checkpoint_every_seconds=0.05, checkpoint_min_interval=0
    )
    return Agent(
        "support",
        model,
        "You are a support agent. Use lookup_order for order questions.",
        [lookup_order],
        stream_policy=policy,
    )


async def run_worker(url: str, directory: Path, worker_id: str) -> None:
    """The worker process: runs until killed or SIGTERM."""
    store = await open_store(url)
    registry = Registry().add("support", agent(directory))
    worker = Worker(
        store,
        registry,
        concurrency=1,
        claims=ClaimPolicy(ttl=TTL, renew_every=TTL / 4),
        worker_id=worker_id,
        poll_interval=0.05,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(worker.stop(grace=2)))
    await worker.run()
    await store.close()


class Narrator:
    def __init__(self, out: Callable[[str], None]) -> None:
        self.out = out
        self.step = 0

    def __call__(self, text: str) -> None:
        self.step += 1
        self.out(f"[{self.step}] {text}")

    def detail(self, text: str) -> None:
        self.out(f"    {text}")


def spawn(url: str, directory: Path, worker_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "wakeful.demo", "worker", url, str(directory), worker_id],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def watch(check: Callable[[], Any], deadline: float, what: str) -> Any:
    end = time.monotonic() + deadline
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > end:
            raise TimeoutError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


async def story(say: Callable[[str], None] = print, directory: Path | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="wakeful-demo-") as tmp:
        root = directory or Path(tmp)
        url = f"sqlite:///{root / 'demo.db'}"
        tell = Narrator(say)
        async with open_store(url) as store:
            tell(f"store: {url}")
            await submit(store, THREAD, "support", "Where is my order 42?", dispatch_id="demo-1")
            tell("submitted 'Where is my order 42?' to thread order-42 (dispatch demo-1)")

            first = spawn(url, root, "worker-a")
            tell(f"started worker-a (pid {first.pid})")

            async def streaming() -> Any:
                calls = root / "tool-calls.txt"
                saved = await store.stream_checkpoints.get("run-demo-1")
                if calls.exists() and saved is not None and len(saved.partial_text) >= 60:
                    return saved
                if first.poll() is not None:
                    raise RuntimeError("worker-a exited early")
                return None

            saved = await watch(streaming, 60, "the answer to start streaming")
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            tell("killed worker-a with SIGKILL: the tool had run and the answer was streaming")
            tell.detail(f"stream checkpoint: {len(saved.partial_text)} characters saved:")
            tell.detail(f"  {saved.partial_text!r}")

            second = spawn(url, root, "worker-b")
            tell(f"started worker-b (pid {second.pid}); it waits for worker-a's lease ({TTL:g} s)")

            async def settled() -> Any:
                d = await store.get_dispatch("demo-1")
                return d is not None and d.status == "done"

            try:
                await watch(settled, 60, "the replacement to finish")
            finally:
                second.send_signal(signal.SIGTERM)
                second.wait(timeout=30)
            tell("worker-b recovered the run and settled the dispatch")

            return await summary(store, root, tell, saved.partial_text)


async def summary(store: Any, root: Path, tell: Narrator, partial: str) -> int:
    messages = await store.messages(THREAD, 0, 100)
    events = [e.type for e in await store.events_after(THREAD, 0, 1000)]
    snap = await store.read(THREAD)
    tell("transcript:")
    for m in messages:
        text = m.content if m.content else ", ".join(c["name"] for c in m.tool_calls)
        tell.detail(f"{m.role:>9}: {text}")
    calls = (root / "tool-calls.txt").read_text().splitlines()
    assistant = [m for m in messages if m.role == "assistant" and m.content]
    final = assistant[-1] if assistant else None
    recoveries = final.metadata.get("recoveries", []) if final is not None else []
    scripted = not os.environ.get("WAKEFUL_MODEL_URL")
    checks = [
        ("the tool ran exactly once", len(calls) == 1),
        ("the stream continued from its checkpoint", "resumed" in recoveries),
        ("one complete assistant answer was committed", len(assistant) == 1),
        (
            "the answer is whole (the saved prefix plus the continuation)",
            final is not None
            and str(final.content).startswith(partial)
            and (not scripted or final.content == ANSWER),
        ),
        ("the run completed", snap is not None and snap.checkpoint.status == "completed"),
        ("the run was recovered once", events.count("run.recovered") == 1),
        (
            "the stream checkpoint was deleted",
            await store.stream_checkpoints.get("run-demo-1") is None,
        ),
    ]
    tell(f"how the answer was obtained: {', '.join(recoveries) or 'in one go'}")
    tell("summary:")
    for name, ok in checks:
        tell.detail(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(ok for _, ok in checks) else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "worker":
        asyncio.run(run_worker(args[1], Path(args[2]), args[3]))
        return 0
    return asyncio.run(story())
