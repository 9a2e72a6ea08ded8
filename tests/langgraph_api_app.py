"""An app for ``wakeful serve --app tests.langgraph_api_app:registry``: a LangGraph graph
``steps`` (appends "one" then "two" to ``log``) next to a wakeful graph ``echo``."""

from __future__ import annotations

import operator
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict  # pydantic draws its schema on Python 3.11

from tests.server_support import echo_graph
from wakeful.fleet.registry import Registry


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def steps_graph() -> Any:
    builder = StateGraph(State)
    builder.add_node("one", lambda state: {"log": ["one"]})
    builder.add_node("two", lambda state: {"log": ["two"]})
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", END)
    return builder.compile()


def registry() -> Registry:
    return Registry().add("echo", echo_graph()).add("steps", steps_graph())
