"""Child process of the LangGraph saver process tests.

``python -m tests.langgraph_child URL COUNTER READY HOLDER [GO]`` runs the fan-out graph on
thread ``t`` through ``WakefulSaver`` (claim ttl 1.5 s, renewed every 0.3 s). Node ``b``
waits until ``a``'s write is durable, writes READY, then hangs (without GO) or waits for
the GO file and returns. The outcome (``completed`` or the error's class name) goes to
``READY.outcome``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from tests.langgraph_support import fan_out
from tests.runtime_support import mark_ready
from wakeful.langgraph import WakefulSaver

CONFIG: Any = {"configurable": {"thread_id": "t"}}


async def main(url: str, counter: Path, ready: Path, holder: str, go: Path | None) -> None:
    async with WakefulSaver.from_url(url, holder=holder, ttl=1.5, renew_every=0.3) as saver:

        async def b_body() -> None:
            while True:  # until a's pending write is durable
                tup = await saver.aget_tuple(CONFIG)
                if tup is not None and any(w[2] == ["a"] for w in tup.pending_writes or []):
                    break
                await asyncio.sleep(0.01)
            mark_ready(ready, "b waits")
            # GO is written by the parent process: no in-process event can announce it.
            while go is None or not go.exists():  # noqa: ASYNC110, ASYNC240
                await asyncio.sleep(0.02)

        graph = fan_out(counter, b_body).compile(checkpointer=saver)
        try:
            await graph.ainvoke({"log": []}, CONFIG, durability="sync")
            outcome = "completed"
        except Exception as exc:
            outcome = type(exc).__name__
        mark_ready(ready.with_name(ready.name + ".outcome"), outcome)


if __name__ == "__main__":
    url, counter, ready, holder = sys.argv[1:5]
    go = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    asyncio.run(main(url, Path(counter), Path(ready), holder, go))
