"""The cold-read part of ``benchmarks.langgraph_saver``: a long LangGraph thread's cost.

A chat-style graph (one node appending a 100-byte reply to a list channel, every turn a
run with ``durability="sync"``) is written for 10, 100 and 1,000 turns on ``WakefulSaver``
over the SQLite store, each thread by a process of its own (its peak RSS is the writer's).
Then, per round, a new process opens the store and times its first ``aget_tuple`` (the
latest checkpoint) and reports its peak RSS. Target (issue 35): both at 1,000 turns <= 1.5x
their value at 10 turns. Messages are 100 bytes, not the issue's 1 KB: the channel holds
the whole conversation at every checkpoint (as on LangGraph's own savers), so 1,000 turns
of 1 KB would write about 1 GB; the history's length, not the message size, is what is
measured.
"""

from __future__ import annotations

import asyncio
import json
import operator
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from benchmarks.common import Collector, Result
from wakeful.langgraph import WakefulSaver

TURNS = (10, 100, 1000)
MESSAGE = "m" * 100
CONFIG: Any = {"configurable": {"thread_id": "chat"}}


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def chat_graph(saver: Any) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("reply", lambda state: {"messages": [MESSAGE]})
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def write(url: str, turns: int) -> dict[str, float]:
    async with WakefulSaver.from_url(url) as saver:
        graph = chat_graph(saver)
        start = time.perf_counter()
        for _ in range(turns):
            await graph.ainvoke({"messages": [MESSAGE]}, CONFIG, durability="sync")
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "rss_mb": peak_rss_mb()}


async def cold_read(url: str, turns: int) -> dict[str, float]:
    async with WakefulSaver.from_url(url) as saver:
        start = time.perf_counter()
        latest = await saver.aget_tuple(CONFIG)
        seconds = time.perf_counter() - start
    assert latest is not None
    assert len(latest.checkpoint["channel_values"]["messages"]) == 2 * turns
    return {"seconds": seconds, "rss_mb": peak_rss_mb()}


def child(what: str, url: str, turns: int) -> None:
    run = write if what == "write" else cold_read
    print(json.dumps(asyncio.run(run(url, turns))))


def in_process(what: str, url: str, turns: int) -> dict[str, float]:
    """``what`` (write or read) in a new process: its own peak RSS."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.langgraph_history", what, url, str(turns)],
        check=True,
        capture_output=True,
        text=True,
    )
    answer: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return answer


def measure(directory: Path, rounds: int) -> list[Result]:
    reads: dict[int, list[dict[str, float]]] = {}
    writes: dict[int, dict[str, float]] = {}
    for turns in TURNS:
        url = f"sqlite:///{directory / f'chat-{turns}.db'}"
        writes[turns] = in_process("write", url, turns)
        reads[turns] = [in_process("read", url, turns) for _ in range(rounds)]
    out = Collector("langgraph_saver")
    first = TURNS[0]
    for turns in TURNS:
        for key, unit, label in (("seconds", "ms", "cold read time"), ("rss_mb", "MB", "RSS")):
            scale = 1000 if key == "seconds" else 1
            samples = [r[key] * scale for r in reads[turns]]
            anchor = [r[key] * scale for r in reads[first]] if turns != first else None
            out.add(
                f"WakefulSaver, first aget_tuple in a new process, {label}, {turns} turns",
                samples,
                unit,
                higher_is_better=False,
                anchor=f"the same at {first} turns" if anchor else None,
                anchor_samples=anchor,
                target=1.5 if turns == TURNS[-1] else None,
            )
        out.add(
            f"WakefulSaver, writer's peak RSS, {turns} turns",
            writes[turns]["rss_mb"],
            "MB",
            higher_is_better=False,
            note=f"{turns} turns written in {writes[turns]['seconds']:.1f} s",
        )
    return out.results


def report(results: list[Result]) -> None:
    for r in results:
        ratio = f"  {r.ratio:.2f}x {r.anchor}" if r.ratio is not None else ""
        print(f"{r.name}: {r.value:,.1f} {r.unit}{ratio}")


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
