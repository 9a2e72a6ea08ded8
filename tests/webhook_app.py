"""The app of the webhook process tests: ``echo`` (one node that appends to ``log``)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from wakeful.fleet import Registry
from wakeful.runtime import START, Graph, append


class State(TypedDict):
    log: Annotated[list[str], append]


def echo(state: dict[str, Any]) -> dict[str, Any]:
    return {"log": ["echoed"]}


registry = Registry().add(
    "echo", Graph(State, name="echo").node("e", echo).edge(START, "e").compile()
)
