"""LangGraph interrupts as wakeful tickets (issue 44, decision 0052).

A saver record that stores the writes of a root task's ``interrupt()`` (LangGraph's
``__interrupt__`` channel) names them in its metadata as the tickets of a suspended run
(``{"tickets": [{"id", "task_id", "node", "question"}]}``, the shape ``wakeful.runtime``
gives its own), so the HTTP API's thread view lists them and ``POST /v1/threads/{id}/resume``
answers them: a worker resumes the graph with ``Command(resume={interrupt id: answer})``.
The ticket id is LangGraph's interrupt id."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from wakeful.langgraph.codec import valid_id

INTERRUPT_CHANNEL = "__interrupt__"


def _plain(value: Any) -> Any:
    """JSON of an interrupt's value (anything not JSON as its ``repr``)."""

    def default(item: Any) -> Any:
        dump = getattr(item, "model_dump", None)
        if callable(dump):
            return dump()
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            return dataclasses.asdict(item)
        return repr(item)

    return json.loads(json.dumps(value, default=default))


def interrupt_tickets(
    decode: Callable[[Any, str], Any], items: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The record metadata naming the interrupts among ``items`` (record items), or ``{}``.
    ``decode``: the saver's ``ValueCodec.decode``."""
    tickets = []
    for item in items:
        if item.get("k") != "w" or item.get("channel") != INTERRUPT_CHANNEL or item.get("ns"):
            continue  # (a subgraph's interrupt reaches the root task's writes too)
        value = decode(item["value"], "an interrupt write")
        for interrupt in value if isinstance(value, (list, tuple)) else [value]:
            ident = getattr(interrupt, "id", None)
            if isinstance(ident, str) and valid_id(ident):
                tickets.append(
                    {
                        "id": ident,
                        "task_id": str(item.get("task")),
                        "node": str(item.get("path") or ""),
                        "question": _plain(getattr(interrupt, "value", None)),
                    }
                )
    return {"tickets": tickets} if tickets else {}


__all__ = ["INTERRUPT_CHANNEL", "interrupt_tickets"]
