"""Graph definition: nodes over state channels with reducers, static and conditional edges,
fan-out with ``Send``, validation and a structural fingerprint."""

from __future__ import annotations

import hashlib
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful.backoff import backoff_delay
from wakeful.errors import GraphInvalid, InvalidInput
from wakeful.ids import check_id

if TYPE_CHECKING:
    pass

START = "__start__"
END = "__end__"

Reducer = Callable[[Any, Any], Any]
NodeFn = Callable[..., Any] | Callable[..., Awaitable[Any]]
Router = Callable[[dict[str, Any]], Any]


def replace(old: Any, new: Any) -> Any:
    """The default reducer: the newest write wins."""
    return new


def append(old: Any, new: Any) -> Any:
    """List reducer: extend with a list, or add one item."""
    base = list(old) if old else []
    return base + list(new) if isinstance(new, list | tuple) else [*base, new]


class Send(msgspec.Struct, frozen=True):
    """Fan-out: run ``node`` once more in the next superstep with ``arg`` as its input
    (instead of the whole state)."""

    node: str
    arg: Any = None


@dataclass(frozen=True)
class RetryPolicy:
    """How a node's failures are retried inside its task before the run fails. Delays are
    ``initial_delay * backoff**n`` capped at ``max_delay``."""

    max_attempts: int = 3
    initial_delay: float = 0.2
    backoff: float = 2.0
    max_delay: float = 10.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def delay(self, attempt: int) -> float:
        return backoff_delay(attempt, self.initial_delay, self.max_delay, factor=self.backoff)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    fn: NodeFn
    retry: RetryPolicy | None
    takes_ctx: bool
    is_async: bool


@dataclass(frozen=True)
class TaskSpec:
    """One task of a frontier: a node, and its input when it was sent."""

    node: str
    arg: Any = None
    sent: bool = False


def channels_of(schema: Any) -> dict[str, Reducer]:
    """Channel name -> reducer, from a TypedDict / dataclass / msgspec Struct whose fields may
    be ``Annotated[T, reducer]``; or a plain mapping of name -> reducer."""
    if isinstance(schema, Mapping):
        return {str(k): (v or replace) for k, v in schema.items()}
    hints = typing.get_type_hints(schema, include_extras=True)
    result: dict[str, Reducer] = {}
    for name, hint in hints.items():
        reducer: Reducer = replace
        if typing.get_origin(hint) is typing.Annotated:
            for meta in typing.get_args(hint)[1:]:
                if callable(meta):
                    reducer = meta
        result[name] = reducer
    if not result:
        raise GraphInvalid(["the state schema declares no fields"])
    return result


def input_types(schema: Any, channels: Mapping[str, Reducer]) -> dict[str, Any]:
    """Channel name -> the type an input value must have, for the channels whose value an
    input replaces (the ``replace`` reducer) and whose type msgspec can check. A channel
    with another reducer (``append`` takes one item or a list), of a type msgspec cannot
    describe, or of a plain mapping schema takes any JSON value."""
    if isinstance(schema, Mapping):
        return {}
    types: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(schema).items():  # Annotated metadata dropped
        if channels.get(name) is not replace:
            continue
        try:
            msgspec.json.schema(hint)
        except (TypeError, ValueError):
            continue
        types[name] = hint
    return types


class Graph:
    """A graph under construction. Methods return ``self`` so definitions chain."""

    def __init__(
        self, state_schema: Any, name: str = "graph", *, patches: Sequence[str] = ()
    ) -> None:
        self.name = name
        self.patches = tuple(check_id("patch id", p) for p in patches)
        """The patches this code has (``NodeContext.patched``): a run records them when it
        starts. Not part of the fingerprint: a patch changes what a node does, not the shape."""
        if len(set(self.patches)) != len(self.patches):
            raise GraphInvalid(["a patch id is declared twice"])
        self.channels = channels_of(state_schema)
        self.input_types = input_types(state_schema, self.channels)
        self.nodes: dict[str, NodeSpec] = {}
        self.edges: list[tuple[str, str]] = []
        self.routers: dict[str, tuple[Router, tuple[str, ...] | None]] = {}
        self.subgraphs: dict[str, CompiledGraph] = {}

    def node(
        self,
        name: str,
        fn: NodeFn | CompiledGraph,
        *,
        retry: RetryPolicy | None = None,
        input: Any = None,
        output: Any = None,
    ) -> Graph:
        """Add a node: a function of ``(state[, ctx])`` returning updates, or a compiled graph
        (a subgraph, run inside this graph's run: see docs/runtime.md "Subgraphs").
        ``input``/``output`` (subgraphs only): a mapping of this graph's field -> the
        subgraph's field, or a callable, for states that do not share field names."""
        check_id("node name", name)
        if name in self.nodes:
            raise GraphInvalid([f"node {name!r} is defined twice"])
        if isinstance(fn, CompiledGraph):
            from wakeful.runtime.subgraph import make_subgraph  # it builds on this module

            sub = make_subgraph(name, fn, self.channels, input, output)
            self.nodes[name] = NodeSpec(name, sub, retry, True, True)
            self.subgraphs[name] = fn
            return self
        if input is not None or output is not None:
            raise GraphInvalid([f"node {name!r}: input= and output= are for subgraph nodes"])
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        self.nodes[name] = NodeSpec(name, fn, retry, len(params) >= 2, is_async)
        return self

    def edge(self, source: str, target: str) -> Graph:
        self.edges.append((source, target))
        return self

    def conditional_edge(
        self, source: str, router: Router, targets: list[str] | None = None
    ) -> Graph:
        """After ``source`` runs, ``router(state)`` names what runs next: a node name,
        ``END``, a ``Send``, or a list of those. ``targets`` (optional) lists the possible
        destinations, for validation."""
        if source in self.routers:
            raise GraphInvalid([f"node {source!r} already has a conditional edge"])
        self.routers[source] = (router, tuple(targets) if targets is not None else None)
        return self

    def compile(self, *, max_steps: int = 100, max_concurrency: int = 16) -> CompiledGraph:
        problems: list[str] = []
        known = set(self.nodes)
        for source, target in self.edges:
            if source != START and source not in known:
                problems.append(f"edge from unknown node {source!r}")
            if target != END and target not in known:
                problems.append(f"edge to unknown node {target!r}")
            if target == START or source == END:
                problems.append(f"edge {source!r} -> {target!r} runs the wrong way")
        for source, (_, targets) in self.routers.items():
            if source != START and source not in known:
                problems.append(f"conditional edge from unknown node {source!r}")
            for target in targets or ():
                if target != END and target not in known:
                    problems.append(f"conditional edge to unknown node {target!r}")
        has_entry = any(s == START for s, _ in self.edges) or START in self.routers
        if not has_entry:
            problems.append("no entry: add edge(START, node) or conditional_edge(START, ...)")
        reachable = self._reachable()
        for name in sorted(known - reachable):
            problems.append(f"node {name!r} is unreachable from START")
        if max_steps < 1 or max_concurrency < 1:
            problems.append("max_steps and max_concurrency must be at least 1")
        if problems:
            raise GraphInvalid(problems)
        return CompiledGraph(self, max_steps=max_steps, max_concurrency=max_concurrency)

    def _reachable(self) -> set[str]:
        seen: set[str] = set()
        todo = [START]
        while todo:
            at = todo.pop()
            nexts = [t for s, t in self.edges if s == at]
            if at in self.routers:
                targets = self.routers[at][1]
                nexts += list(targets) if targets is not None else list(self.nodes)
            for target in nexts:
                if target in self.nodes and target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    def fingerprint(self) -> str:
        shape = {
            "channels": sorted(
                (k, getattr(v, "__name__", "custom")) for k, v in self.channels.items()
            ),
            "nodes": sorted(self.nodes),
            "edges": sorted(self.edges),
            "routers": sorted(
                (s, sorted(t) if t is not None else None) for s, (_, t) in self.routers.items()
            ),
        }
        if self.subgraphs:  # a subgraph's change changes its parent's fingerprint
            shape["subgraphs"] = sorted((k, g.fingerprint) for k, g in self.subgraphs.items())
        return hashlib.sha256(msgspec.json.encode(shape)).hexdigest()[:16]


@dataclass
class CompiledGraph:
    """A validated graph the runtime can execute."""

    graph: Graph
    max_steps: int = 100
    max_concurrency: int = 16
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = self.graph.fingerprint()

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def patches(self) -> tuple[str, ...]:
        return self.graph.patches

    @property
    def nodes(self) -> dict[str, NodeSpec]:
        return self.graph.nodes

    def check_input(self, input: Any) -> dict[str, Any]:
        """``input`` as the state update a run starts with: ``None`` or a JSON object that
        names only the state's fields, each of its declared type where the input replaces
        the field. ``InvalidInput`` says what does not fit (retrying cannot help)."""
        if input is None:
            return {}
        if not isinstance(input, dict):
            raise InvalidInput(
                "input",
                f"graph {self.name!r} takes a JSON object of its state fields "
                f"{sorted(self.graph.channels)}, got {_json_kind(input)}",
            )
        if not input:  # a run started without input (no field to look up)
            return {}
        if not input.keys() <= self.graph.channels.keys():
            unknown = sorted(str(k) for k in input if k not in self.graph.channels)
            raise InvalidInput(
                "input",
                f"graph {self.name!r} has no state fields {unknown}; its fields are "
                f"{sorted(self.graph.channels)}",
            )
        for key, hint in self.graph.input_types.items():
            if key in input:
                try:
                    msgspec.convert(input[key], hint, strict=False)
                except msgspec.ValidationError as exc:
                    raise InvalidInput(f"input.{key}", str(exc)) from None
        return dict(input)

    def apply(self, state: dict[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
        """Apply one task's updates through the reducers; unknown channels are an error."""
        unknown = [k for k in updates if k not in self.graph.channels]
        if unknown:
            raise ValueError(f"updates name unknown state fields {unknown!r}")
        new = dict(state)
        for key, value in updates.items():
            new[key] = self.graph.channels[key](new.get(key), value)
        return new

    def start_tasks(self, state: dict[str, Any]) -> list[TaskSpec]:
        """What a run of this graph starts with, given its first state."""
        return self.next_tasks(START, state)

    def barrier(
        self, state: Any, results: list[tuple[str, Mapping[str, Any] | None]]
    ) -> tuple[dict[str, Any], list[TaskSpec]]:
        """A superstep's barrier: each finished task's ``(node, updates)`` applied in frontier
        order through the reducers, then what runs next (a node triggered by several
        predecessors once, each ``Send`` once)."""
        new = dict(state or {})
        for _, updates in results:
            new = self.apply(new, updates or {})
        tasks: list[TaskSpec] = []
        triggered: set[str] = set()
        for node, _ in results:
            for task in self.next_tasks(node, new):
                if task.sent:
                    tasks.append(task)
                elif task.node not in triggered:
                    triggered.add(task.node)
                    tasks.append(task)
        return new, tasks

    def next_tasks(self, source: str, state: dict[str, Any]) -> list[TaskSpec]:
        """What runs after ``source`` (or after ``START``) given the state at the barrier."""
        tasks = [TaskSpec(t) for s, t in self.graph.edges if s == source and t != END]
        if source in self.graph.routers:
            router, _ = self.graph.routers[source]
            routed = router(state)
            for item in routed if isinstance(routed, list | tuple) else [routed]:
                if item is None or item == END:
                    continue
                if isinstance(item, Send):
                    tasks.append(TaskSpec(self._known(item.node), item.arg, sent=True))
                elif isinstance(item, str):
                    tasks.append(TaskSpec(self._known(item)))
                else:
                    raise ValueError(f"router of {source!r} returned {item!r}")
        return tasks

    def _known(self, node: str) -> str:
        if node not in self.graph.nodes:
            raise ValueError(f"routed to unknown node {node!r}")
        return node


def _json_kind(value: Any) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__
