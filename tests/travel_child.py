"""Child process for the time-travel crash test: replays thread ``t`` from an earlier
checkpoint (a branch) with a graph whose node ``b`` never finishes, after its sibling ``d``
of the same superstep has finished and its result is durable. Every node call is appended
(and fsynced) to a counter file, so the parent can count side effects after a SIGKILL."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from tests.runtime_child import record
from tests.runtime_support import mark_ready
from wakeful import open_store
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append


class State(TypedDict):
    log: Annotated[list[str], append]


def build(counter: Path, hang_b: bool) -> Any:
    """``a``, then ``b`` and ``d`` in one superstep, then ``c``."""

    def node(name: str, hang: bool = False) -> Any:
        async def run(state: dict[str, Any]) -> dict[str, Any]:
            record(counter, name)
            if hang:
                await asyncio.Event().wait()
            return {"log": [name]}

        return run

    g = Graph(State, name="travel-crash")
    g.node("a", node("a")).node("b", node("b", hang_b)).node("d", node("d")).node("c", node("c"))
    return g.edge(START, "a").edge("a", "b").edge("a", "d").edge("b", "c").edge("d", "c").compile()


async def main(url: str, counter: Path, ready: Path, fork_point: str) -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    handle = await runtime.replay("t", build(counter, hang_b=True), fork_point, run_id="run-replay")
    assert handle.run_id == "run-replay"
    while True:
        snap = await store.read("t")
        if snap is not None and [w.node for w in snap.writes] == ["d"]:
            await asyncio.to_thread(mark_ready, ready, "ready")
            break
        await asyncio.sleep(0.01)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]))
