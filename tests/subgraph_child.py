"""Child process for the subgraph crash test: a graph whose node ``research`` is a 3-step
subgraph; the subgraph's third step never finishes, after its second step's snapshot is
durable. Every node call is appended (and fsynced) to a counter file, so the parent can
count side effects after a SIGKILL."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from tests.runtime_child import record
from tests.runtime_support import mark_ready
from wakeful import open_store
from wakeful.records import Commit, Receipt
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append


class Outer(TypedDict):
    topic: str
    log: Annotated[list[str], append]
    report: str


class Inner(TypedDict):
    topic: str
    notes: Annotated[list[str], append]
    report: str


def build(counter: Path, hang: bool) -> Any:
    def step(name: str) -> Any:
        async def node(state: dict[str, Any]) -> dict[str, Any]:
            record(counter, name)
            if name == "write" and hang:
                await asyncio.Event().wait()
            notes = [*state.get("notes", []), f"{name}:{state['topic']}"]
            return {"notes": [f"{name}:{state['topic']}"], "report": "+".join(notes)}

        return node

    inner = Graph(Inner, name="research").node("plan", step("plan")).node("search", step("search"))
    inner.node("write", step("write")).edge(START, "plan").edge("plan", "search")
    research = inner.edge("search", "write").compile()

    def before(state: dict[str, Any]) -> dict[str, Any]:
        record(counter, "before")
        return {"log": ["before"]}

    def after(state: dict[str, Any]) -> dict[str, Any]:
        record(counter, "after")
        return {"log": [f"after:{state['report']}"]}

    g = Graph(Outer, name="outer").node("before", before).node("research", research)
    g.node("after", after).edge(START, "before").edge("before", "research")
    return g.edge("research", "after").compile()


async def main(url: str, counter: Path, ready: Path) -> None:
    store = await open_store(url)
    # ready once the commit of the subgraph's second snapshot is acknowledged (durable), not
    # merely visible: the file store shows a commit to its readers before it is written
    acknowledged = asyncio.Event()
    original = store.commit

    async def commit_and_note(thread_id: str, commit: Commit) -> Receipt:
        receipt = await original(thread_id, commit)
        if any(w.task_id.endswith(":research:c2") for w in commit.writes):
            acknowledged.set()
        return receipt

    store.commit = commit_and_note  # type: ignore[method-assign]
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    await runtime.start("t", build(counter, hang=True), {"topic": "tides"})
    await acknowledged.wait()
    await asyncio.to_thread(mark_ready, ready, "ready")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
