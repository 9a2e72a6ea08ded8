"""LangGraph graphs for ``wakeful worker --app tests.langgraph_fleet_app:registry`` and the
server of tests/test_langgraph_fleet.py: ``gated`` (``one``, then ``two`` waits for the file
``gate`` names, then ``three``; each node appends its name to ``calls.txt`` next to the
gate), ``approval`` (an ``interrupt()``), ``broken`` (its node raises) and ``chat`` (a
scripted chat model's streamed reply; no paid API)."""

from __future__ import annotations

import asyncio
import operator
from itertools import cycle
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt

from wakeful.fleet.registry import Registry


class Gated(TypedDict):
    log: Annotated[list[str], operator.add]
    gate: str


def _called(state: Gated, name: str) -> None:
    with (Path(state["gate"]).parent / "calls.txt").open("a") as calls:
        calls.write(f"{name}\n")


def gated_graph() -> Any:
    def one(state: Gated) -> dict[str, Any]:
        _called(state, "one")
        return {"log": ["one"]}

    async def two(state: Gated) -> dict[str, Any]:
        _called(state, "two")
        while not Path(state["gate"]).exists():  # noqa: ASYNC110, ASYNC240 - another process
            await asyncio.sleep(0.02)
        return {"log": ["two"]}

    def three(state: Gated) -> dict[str, Any]:
        _called(state, "three")
        return {"log": ["three"]}

    builder = StateGraph(Gated)
    builder.add_node("one", one)
    builder.add_node("two", two)
    builder.add_node("three", three)
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", "three")
    builder.add_edge("three", END)
    return builder.compile()


class Notes(TypedDict):
    log: Annotated[list[str], operator.add]


def approval_graph() -> Any:
    def ask(state: Notes) -> dict[str, Any]:
        return {"log": [f"answer:{interrupt('ship it?')}"]}

    builder = StateGraph(Notes)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


def broken_graph() -> Any:
    def fail(state: Notes) -> dict[str, Any]:
        raise ValueError("the node failed")

    builder = StateGraph(Notes)
    builder.add_node("fail", fail)
    builder.add_edge(START, "fail")
    builder.add_edge("fail", END)
    return builder.compile()


def chat_graph() -> Any:
    model = GenericFakeChatModel(messages=cycle([AIMessage(content="hello from a worker")]))

    async def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("call", call)
    builder.add_edge(START, "call")
    builder.add_edge("call", END)
    return builder.compile()


def registry() -> Registry:
    return (
        Registry()
        .add("gated", gated_graph())
        .add("approval", approval_graph())
        .add("chat", chat_graph())
        .add("broken", broken_graph())
    )
