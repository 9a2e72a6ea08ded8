"""Child process for the runtime crash test: runs a graph whose node ``b`` never finishes,
after node ``a`` has finished and its result is durable. Every node call is appended (and
fsynced) to a counter file, so the parent can count side effects after a SIGKILL."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from tests.runtime_support import mark_ready
from wakeful import open_store
from wakeful.records import Commit, Receipt
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append


class State(TypedDict):
    log: Annotated[list[str], append]


def record(counter: Path, name: str) -> None:
    with counter.open("a", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())


def build(counter: Path, hang_b: bool) -> Any:
    async def a(state: dict[str, Any]) -> dict[str, Any]:
        record(counter, "a")
        return {"log": ["a"]}

    async def b(state: dict[str, Any]) -> dict[str, Any]:
        record(counter, "b")
        if hang_b:
            await asyncio.Event().wait()
        return {"log": ["b"]}

    async def c(state: dict[str, Any]) -> dict[str, Any]:
        record(counter, "c")
        return {"log": ["c"]}

    g = Graph(State, name="crash").node("a", a).node("b", b).node("c", c)
    return g.edge(START, "a").edge(START, "b").edge("a", "c").edge("b", "c").compile()


async def main(url: str, counter: Path, ready: Path) -> None:
    store = await open_store(url)
    # ready once the commit of a's result is acknowledged (durable), not merely visible: the
    # file store shows a commit to its readers before its append is written
    acknowledged = asyncio.Event()
    original = store.commit

    async def commit_and_note(thread_id: str, commit: Commit) -> Receipt:
        receipt = await original(thread_id, commit)
        if any(w.node == "a" for w in commit.writes):
            acknowledged.set()
        return receipt

    store.commit = commit_and_note  # type: ignore[method-assign]
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    await runtime.start("t", build(counter, hang_b=True), {})
    await acknowledged.wait()
    snap = await store.read("t")
    assert snap is not None and [w.node for w in snap.writes] == ["a"]
    await asyncio.to_thread(mark_ready, ready, "ready")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
