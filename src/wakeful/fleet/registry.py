"""What a worker can run: agents and graphs by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from wakeful.agent.agent import Agent
from wakeful.errors import NotFound
from wakeful.ids import check_id
from wakeful.records import Message
from wakeful.runtime.graph import CompiledGraph


@dataclass(frozen=True)
class Target:
    """A registered agent or graph, and how a dispatch's input becomes a run's input."""

    name: str
    graph: CompiledGraph
    agent: Agent | None = None

    def prepare(self, input: Any, run_id: str) -> tuple[dict[str, Any], Sequence[Message]]:
        """The state input and the messages to append at admission."""
        if self.agent is None:
            if input is not None and not isinstance(input, dict):
                raise TypeError(f"graph {self.name!r} takes a JSON object as input")
            return dict(input or {}), ()
        content = input if isinstance(input, str) else msgspec.json.encode(input).decode()
        user = Message(id=f"m-{run_id}-u", role="user", content=content, run_id=run_id)
        return {"calls": [], "turns": 0, "final": None, "stopped": None}, (user,)


class Registry:
    """Agents and compiled graphs by name. ``default`` handles messages sent to a thread
    that has no run yet."""

    def __init__(self, default: str | None = None) -> None:
        self._targets: dict[str, Target] = {}
        self._by_graph: dict[str, Target] = {}
        self.default = default

    def add(self, name: str, target: Agent | CompiledGraph) -> Registry:
        check_id("target name", name)
        if isinstance(target, Agent):
            entry = Target(name, target.graph, target)
        else:
            entry = Target(name, target)
        self._targets[name] = entry
        self._by_graph[entry.graph.name] = entry
        return self

    def get(self, name: str) -> Target:
        try:
            return self._targets[name]
        except KeyError:
            raise NotFound("target", name) from None

    def for_graph(self, graph_name: str | None) -> Target:
        """The target whose graph recorded ``graph_name`` in a thread's checkpoint."""
        if graph_name is not None and graph_name in self._by_graph:
            return self._by_graph[graph_name]
        if self.default is not None:
            return self.get(self.default)
        raise NotFound("target for graph", str(graph_name))

    def names(self) -> list[str]:
        return sorted(self._targets)

    def targets(self) -> list[Target]:
        return [self._targets[name] for name in self.names()]
