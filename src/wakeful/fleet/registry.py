"""What a worker can run: agents and graphs by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import msgspec

from wakeful.agent.agent import Agent
from wakeful.concurrency import Concurrency, concurrency_of
from wakeful.errors import InvalidInput, NotFound
from wakeful.fleet.delays import debounce_seconds
from wakeful.fleet.selfrun import LANGGRAPH_PLUGIN, SAVER_ID_PREFIX, SelfRunning, plugin
from wakeful.fleet.webhook_signing import check_webhook_url
from wakeful.ids import check_id
from wakeful.records import Checkpoint, Dispatch, Message
from wakeful.runtime.graph import CompiledGraph

VersionPolicy: TypeAlias = Literal["continue", "fail", "hold"]
VERSION_POLICIES = ("continue", "fail", "hold")


@runtime_checkable
class Adapted(Protocol):
    """A target that brings its own graph and turns a dispatch's input (text, the user
    message) into the run's input and messages: ``wakeful.pydantic_ai.WakefulAgent``."""

    @property
    def graph(self) -> CompiledGraph: ...

    def prepare_input(self, input: Any, run_id: str) -> tuple[dict[str, Any], Sequence[Message]]:
        """The state input and the messages to append when a run of it is admitted."""
        ...


@dataclass(frozen=True)
class Target:
    """A registered agent or graph, and how a dispatch's input becomes a run's input."""

    name: str
    graph: CompiledGraph
    agent: Agent | None = None
    on_version_change: VersionPolicy | None = None
    """What this code does with a run of the target started on another version once no
    worker of that version is left (``docs/deploys.md``): ``continue`` it here, ``fail`` it,
    or ``hold`` it (quarantined) for an operator. ``None``: ``continue`` when the graph's
    structure is the one the run recorded, else ``fail``."""
    webhook: str | None = None
    """The URL POSTed when a run of this target ends, unless its submission names one
    (``wakeful.fleet.webhooks``)."""
    adapted: Adapted | None = None
    """A target with its own input mapping (``Adapted``); it takes text like an agent."""
    debounce: float | None = None
    """Seconds: the debounce window of submissions through a server that knows this
    registry, when the submission names none (``wakeful.submit``'s ``debounce``)."""
    concurrency: Concurrency | None = None
    """How many runs of this target may be admitted at once per key (issue 39,
    ``wakeful.concurrency``): applied by ``submit(..., concurrency=)`` and by the HTTP
    server's run submissions (docs/flow-control.md)."""

    def version_policy(self, run: Checkpoint) -> VersionPolicy:
        """The policy for ``run`` (a checkpoint of an unfinished run of this target)."""
        if self.on_version_change is not None:
            return self.on_version_change
        same = run.metadata.get("fingerprint") == self.graph.fingerprint
        return "continue" if same else "fail"

    def prepare(self, input: Any, run_id: str) -> tuple[dict[str, Any], Sequence[Message]]:
        """The state input and the messages to append at admission. ``InvalidInput``
        when the input does not fit the graph's state (see ``check_input``)."""
        if self.adapted is not None:
            return self.adapted.prepare_input(input, run_id)
        if self.agent is None:
            return self.check_input(input), ()
        content = input if isinstance(input, str) else msgspec.json.encode(input).decode()
        user = Message(id=f"m-{run_id}-u", role="user", content=content, run_id=run_id)
        return {"calls": [], "turns": 0, "final": None, "stopped": None}, (user,)

    def prepare_coalesced(
        self, inputs: Sequence[Any], run_id: str
    ) -> tuple[dict[str, Any], Sequence[Message]]:
        """``prepare`` for the inputs of several coalesced submissions answered by one run
        (``if_busy="coalesce"``), in submit order: an agent gets one user message per input
        (one model turn answers them all); a graph gets the inputs folded through its
        state's reducers (``replace``: the last wins; ``append``: all, in order)."""
        if len(inputs) == 1 or self.adapted is not None:
            # an adapted target answers the last input (its run takes one prompt)
            return self.prepare(inputs[-1], run_id)
        if self.agent is None:
            merged: dict[str, Any] = {}
            for input in inputs:
                merged = self.graph.apply(merged, self.check_input(input))
            return merged, ()
        messages = []
        for i, input in enumerate(inputs):
            state, (user,) = self.prepare(input, run_id)
            messages.append(msgspec.structs.replace(user, id=f"m-{run_id}-u{i}" if i else user.id))
        return state, messages

    def check_input(self, input: Any) -> dict[str, Any]:
        """Refuse (``InvalidInput``) an input this target cannot take: for a graph, anything
        but ``None`` or an object of its state fields of their declared types; an agent
        takes any JSON value (it becomes the user message)."""
        if self.agent is not None or self.adapted is not None:
            return {}
        return self.graph.check_input(input)

    def input_schema(self) -> dict[str, Any]:
        """A JSON Schema of the input ``check_input`` takes. An agent: text, the user message
        (another JSON value is sent as its JSON text). A graph: an object of its state
        fields, typed where an input replaces the field, any JSON value elsewhere."""
        if self.agent is not None or self.adapted is not None:
            return {"type": "string", "description": "the user message"}
        graph = self.graph.graph
        typed = [name for name in sorted(graph.channels) if name in graph.input_types]
        schemas, defs = msgspec.json.schema_components(
            [graph.input_types[name] for name in typed], ref_template="#/$defs/{name}"
        )
        properties: dict[str, Any] = {name: {} for name in sorted(graph.channels)}
        properties.update(zip(typed, schemas, strict=True))
        schema: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }
        if defs:
            schema["$defs"] = dict(defs)
        return schema


def is_langgraph(target: object) -> bool:
    """Whether ``target`` is a compiled LangGraph graph (a ``Pregel``), checked without
    importing LangGraph (an optional extra)."""
    return any(
        cls.__name__ == "Pregel" and cls.__module__.startswith("langgraph.")
        for cls in type(target).__mro__
    )


class Registry:
    """Agents and compiled graphs by name. ``default`` handles messages sent to a thread
    that has no run yet."""

    def __init__(self, default: str | None = None) -> None:
        self._targets: dict[str, Target] = {}
        self._by_graph: dict[str, Target] = {}
        self.langgraphs: dict[str, Any] = {}
        """Compiled LangGraph graphs by name (``add`` with one): served by the LangGraph
        API at ``/langgraph`` (``wakeful.server.langgraph_api``), one assistant each, and
        run by workers (``self_running``)."""
        self.self_running: dict[str, SelfRunning] = {}
        """The fleet targets of ``langgraphs`` (``wakeful.fleet.selfrun``), by name."""
        self.default = default

    def add(
        self,
        name: str,
        target: Agent | CompiledGraph | Adapted | Any,
        *,
        on_version_change: VersionPolicy | None = None,
        webhook: str | None = None,
        debounce: float | timedelta | None = None,
        concurrency: Concurrency | Mapping[str, Any] | None = None,
    ) -> Registry:
        """Register ``target`` as ``name`` (again: replace it). A thread records the graph
        that ran it (and, from a worker, the target's name), and its later work goes to that
        target: two targets whose graphs share a name would be indistinguishable in older
        threads, so that is ``InvalidInput`` unless they are the same compiled graph.
        ``on_version_change``: see ``Target.on_version_change``; ``webhook``: see
        ``Target.webhook``. ``debounce``: see ``Target.debounce`` (docs/flow-control.md).
        ``concurrency``: a ``Concurrency`` or ``{"key": "tenant", "limit": 5}``
        (``Target.concurrency``). A compiled LangGraph graph goes to ``langgraphs``."""
        check_id("target name", name)
        if webhook is not None:
            check_webhook_url(webhook)
        if on_version_change is not None and on_version_change not in VERSION_POLICIES:
            raise InvalidInput("on_version_change", f"must be one of {list(VERSION_POLICIES)}")
        if is_langgraph(target):
            if name in self._targets:
                raise InvalidInput("target", f"{name!r} is already a wakeful target")
            self.self_running[name] = plugin(LANGGRAPH_PLUGIN, name, target)
            self.langgraphs[name] = target
            return self
        if name in self.langgraphs:
            raise InvalidInput("target", f"{name!r} is already a LangGraph graph")
        window = None if debounce is None else debounce_seconds(debounce)
        rule = concurrency_of(concurrency)
        if isinstance(target, Agent):
            entry = Target(name, target.graph, target, on_version_change, webhook)
        elif not isinstance(target, CompiledGraph):
            entry = Target(name, target.graph, None, on_version_change, webhook, adapted=target)
        else:
            entry = Target(name, target, None, on_version_change, webhook)
        entry = dataclasses.replace(entry, debounce=window, concurrency=rule)
        for other in self._targets.values():
            if (
                other.name != name
                and other.graph.name == entry.graph.name
                and other.graph is not entry.graph
            ):
                raise InvalidInput(
                    "target",
                    f"{name!r} runs a graph named {entry.graph.name!r}, like target "
                    f"{other.name!r}: threads could not tell them apart; give each graph its "
                    f"own name (Graph(schema, name=...))",
                )
        replaced = self._targets.get(name)
        if replaced is not None and self._by_graph.get(replaced.graph.name) is replaced:
            del self._by_graph[replaced.graph.name]
        self._targets[name] = entry
        self._by_graph.setdefault(entry.graph.name, entry)
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

    def for_checkpoint(self, checkpoint: Checkpoint | None) -> Target:
        """The target a thread's work goes to: the one its checkpoint records by name (a
        run a worker started), else the one whose graph it records, else the default."""
        if checkpoint is not None:
            named = checkpoint.metadata.get("target")
            if isinstance(named, str) and named in self._targets:
                return self._targets[named]
            graph = checkpoint.metadata.get("graph")
            return self.for_graph(graph if isinstance(graph, str) else None)
        return self.for_graph(None)

    def self_runner(self, d: Dispatch, latest: Checkpoint | None) -> SelfRunning | None:
        """The self-running target that takes ``d`` (``None``: the worker runs it): a
        start or resume naming one, and any other work on a thread whose latest checkpoint
        a LangGraph saver wrote (a cancel must not end it with a wakeful checkpoint)."""
        if not self.self_running:
            return None
        payload = d.payload if isinstance(d.payload, dict) else {}
        named = payload.get("target")
        if d.kind in ("start", "resume") and isinstance(named, str) and named in self.self_running:
            return self.self_running[named]
        if latest is not None and latest.id.startswith(SAVER_ID_PREFIX):
            # a cancel names no target; every LangGraph target handles one the same way
            return next(iter(self.self_running.values()))
        return None

    def names(self) -> list[str]:
        return sorted(self._targets)

    def targets(self) -> list[Target]:
        return [self._targets[name] for name in self.names()]
