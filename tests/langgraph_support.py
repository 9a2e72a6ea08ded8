"""Helpers for the LangGraph saver tests: store URLs by kind and a small fan-out graph."""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from tests.postgres_support import Databases

KINDS = ["memory", "file", "sqlite", "postgres"]


async def url_for(kind: str, tmp_path: Path, pg: Databases | None) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "file":
        return f"file://{tmp_path / 'root'}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    assert pg is not None
    return await pg.clone()


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def record(counter: Path, name: str) -> None:
    """Append one node call to ``counter`` (fsynced: the parent counts after a SIGKILL)."""
    with counter.open("a", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())


def fan_out(counter: Path, b_body: Any = None) -> StateGraph[Any]:
    """START -> a, b (one superstep) -> c -> END. ``b_body`` (async, optional) runs inside
    ``b`` before it returns."""

    async def a(state: State) -> dict[str, Any]:
        record(counter, "a")
        return {"log": ["a"]}

    async def b(state: State) -> dict[str, Any]:
        record(counter, "b")
        if b_body is not None:
            await b_body()
        return {"log": ["b"]}

    async def c(state: State) -> dict[str, Any]:
        record(counter, "c")
        return {"log": ["c"]}

    builder = StateGraph(State)
    builder.add_node("a", a)
    builder.add_node("b", b)
    builder.add_node("c", c)
    builder.add_edge(START, "a")
    builder.add_edge(START, "b")
    builder.add_edge("a", "c")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder
