"""The graph ``benchmarks.agent_server`` serves on both servers: one node calling a scripted
chat model (``GenericFakeChatModel``, no paid API) that streams a 12-token reply.

It imports only ``langgraph`` and ``langchain_core``, so ``langgraph dev`` (in its own
virtual environment) loads the same file (``graph``) as ``wakeful serve`` does
(``registry``)."""

from __future__ import annotations

from itertools import cycle
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph

REPLY = "durable agents stream their replies token by token to the waiting client"


def build() -> Any:
    model = GenericFakeChatModel(messages=cycle([AIMessage(content=REPLY)]))

    async def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("call", call)
    builder.add_edge(START, "call")
    builder.add_edge("call", END)
    return builder.compile()


graph = build()


def registry() -> Any:
    """``wakeful serve --app benchmarks.agent_server_graph:registry``."""
    from wakeful.fleet.registry import Registry

    return Registry().add("agent", build())
