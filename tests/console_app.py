"""The app of the console's end-to-end tests (``--app tests.console_app:registry``): agents
whose model is the local OpenAI-compatible server at ``$CONSOLE_MODEL_URL``.

- ``chat``: answers (the test scripts its replies, e.g. a slow or stalling stream);
- ``shipper``: calls its ``ship`` tool, which needs an operator's approval (a ticket);
- ``sorter``: a graph whose node sorts ``numbers``, for checkpoint states;
- ``lead``: a graph that hands its ``numbers`` to ``sorter`` as a child run and joins it.
- ``limited``: answers, each model call taking from the rate limit ``console:limited``.
- ``nested``: the ``sorter`` graph as a subgraph node (``inner``), then a node of its own.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

from wakeful.agent import Agent, tool
from wakeful.fleet import Registry
from wakeful.limits import RateLimit
from wakeful.providers.openai import OpenAIChat
from wakeful.runtime import END, START, Graph, NodeContext


@tool(approval=True)
def ship(order: int) -> str:
    """Ship an order (needs approval)."""
    return f"order {order} shipped"


class Numbers(TypedDict, total=False):
    numbers: list[int]
    total: int


def _sort(state: Numbers) -> dict[str, Any]:
    return {"numbers": sorted(state.get("numbers", []))}


def _sum(state: Numbers) -> dict[str, Any]:
    return {"total": sum(state.get("numbers", []))}


async def _lead(state: Numbers, ctx: NodeContext) -> dict[str, Any]:
    child = await ctx.spawn("sorter", {"numbers": state.get("numbers", [])})
    return {"total": (await ctx.join(child)).state["total"]}


LIMITED = RateLimit(key="console:limited", requests_per_minute=60)


def registry() -> Registry:
    model = OpenAIChat("local-model", base_url=os.environ["CONSOLE_MODEL_URL"], api_key="sk-x")
    sorter = (
        Graph(Numbers, name="sorter")
        .node("sort", _sort)
        .node("sum", _sum)
        .edge(START, "sort")
        .edge("sort", "sum")
        .edge("sum", END)
    )
    return (
        Registry()
        .add("chat", Agent("chat", model, "Answer."))
        .add("shipper", Agent("shipper", model, "Ship orders.", tools=[ship]))
        .add("sorter", sorter.compile())
        .add("lead", Graph(Numbers, name="lead").node("lead", _lead).edge(START, "lead").compile())
        .add("limited", Agent("limited", model, "Answer.", limits=LIMITED))
        .add(
            "nested",
            Graph(Numbers, name="nested")
            .node("inner", sorter.compile())
            .node("after", _sum)
            .edge(START, "inner")
            .edge("inner", "after")
            .compile(),
        )
    )
