"""Subgraphs: a compiled graph as a node of another graph (``g.node("research", graph)``).

The node's task runs the child graph's supersteps itself, inside the parent's run, under its
claim and through its durability mode. After each child barrier it commits a *snapshot* (the
child's state and frontier) as a pending write against the parent's current checkpoint,
under a namespaced task id ``<parent task>:<node>:c<step>``; a child superstep of several
tasks also commits each finished task as ``<parent task>:<node>:<child task>``. The task run
again (recovered, resumed, retried) continues from its latest snapshot and reuses the child
tasks that finished, so a crash in the child's second superstep does not rerun its first.
The child's last superstep goes with the node's own result, like any task's.

An interrupt inside the child suspends the whole run: its ticket is named by the node path
(``research/plan-i1``; a task started by ``Send`` is ``node@<task id>`` in the path) and the
suspended checkpoint carries the snapshot, so ``resume`` continues inside the child. Answers
are offered to the child superstep that asked; once a child superstep has completed under a
checkpoint its answers are not offered again (a later question with the same path is a new
one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wakeful.errors import GraphInvalid
from wakeful.records import EventDraft, PendingWrite
from wakeful.runtime.children import spawns_of
from wakeful.runtime.context import Interrupt, NodeContext, call_node
from wakeful.runtime.results import TaskResult, frontier_entries, reused, task_value

if TYPE_CHECKING:  # the graph module builds subgraph nodes with this one
    from wakeful.runtime.graph import CompiledGraph, Reducer

SNAPSHOT = "subgraph"
"""The key of a snapshot write's value."""

Mapping_ = Mapping[str, str] | Callable[[dict[str, Any]], dict[str, Any]] | None


def segment(node: str, task_id: str, sent: bool) -> str:
    """A task's part of a node path: its node, and for a ``Send`` task (its node may run
    several times in one superstep) the task id too."""
    return f"{node}@{task_id}" if sent else node


@dataclass(frozen=True)
class Subgraph:
    """The node function of a subgraph node. ``input``/``output`` map parent field -> child
    field (or are callables from the node's input / the child's final state); by default
    the fields both states declare go in, and the child's final values of them come out as
    the node's update (applied through the parent's reducers)."""

    graph: CompiledGraph
    shared: tuple[str, ...]
    input: Mapping_ = None
    output: Mapping_ = None

    async def __call__(self, value: Any, ctx: NodeContext) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError(f"a subgraph node takes a JSON object, got {type(value).__name__}")
        final = await ChildRun(self.graph, ctx).run(_mapped(self.input, value, self.shared, True))
        updates: dict[str, Any] = _mapped(self.output, final, self.shared, False)
        return updates


def _mapped(how: Mapping_, value: dict[str, Any], shared: tuple[str, ...], into: bool) -> Any:
    if callable(how):
        return how(dict(value))
    if how is None:
        return {k: value[k] for k in shared if k in value}
    if into:  # parent field -> child field
        return {child: value[parent] for parent, child in how.items() if parent in value}
    return {parent: value[child] for parent, child in how.items() if child in value}


def make_subgraph(
    name: str,
    graph: CompiledGraph,
    parent: Mapping[str, Reducer],
    input: Any = None,
    output: Any = None,
) -> Subgraph:
    """A subgraph node's function, its mappings checked against both states' fields."""
    child = graph.graph.channels
    problems: list[str] = []
    for label, how in (("input", input), ("output", output)):
        if isinstance(how, Mapping):
            for parent_key, child_key in how.items():
                if parent_key not in parent:
                    problems.append(f"{label} of {name!r} names unknown field {parent_key!r}")
                if child_key not in child:
                    problems.append(
                        f"{label} of {name!r} names {child_key!r}, not a field of "
                        f"subgraph {graph.name!r}"
                    )
        elif how is not None and not callable(how):
            problems.append(f"{label} of {name!r} must be a mapping or a callable")
    shared = tuple(k for k in parent if k in child)
    if not shared and (input is None or output is None):
        problems.append(
            f"node {name!r}: the graph and subgraph {graph.name!r} share no state fields; "
            "pass input= and output= mappings"
        )
    if problems:
        raise GraphInvalid(problems)
    return Subgraph(graph, shared, input, output)


class ChildRun:
    """The child graph's supersteps, run by the subgraph node's task ``ctx``."""

    def __init__(self, graph: CompiledGraph, ctx: NodeContext) -> None:
        self.graph, self.ctx, self.services = graph, ctx, ctx.services
        self.ns = f"{ctx.task_id}:{ctx.node}"
        self.path = ctx.path or segment(ctx.node, ctx.task_id, ctx.sent)
        self.snapshot: PendingWrite | None = None

    def _latest(self) -> PendingWrite | None:
        prefix, best = f"{self.ns}:c", None
        for task_id, write in self.services.writes.items():
            if not task_id.startswith(prefix) or not task_id[len(prefix) :].isdigit():
                continue
            if best is None or write.value[SNAPSHOT]["step"] > best.value[SNAPSHOT]["step"]:
                best = write
        return best

    async def run(self, input: Any) -> dict[str, Any]:
        """The child run to its end (its final state); raises ``Interrupt`` to suspend."""
        cp = self.services.checkpoint
        self.snapshot = self._latest()
        steps: list[list[str]] = []  # the nodes of each child superstep, for the metadata
        nested: dict[str, Any] = {}  # what ran in subgraphs inside this one
        if self.snapshot is None:
            state = self.graph.apply({}, self.graph.check_input(input))
            step, frontier, used = 0, frontier_entries(0, self.graph.start_tasks(state)), None
        else:
            snap = self.snapshot.value[SNAPSHOT]
            state, step, frontier, used = (
                snap["state"],
                snap["step"],
                snap["frontier"],
                snap["used"],
            )
            steps, nested = snap["steps"], snap["nested"]
        answers = {} if used == cp.id else dict(cp.metadata.get("answers", {}))
        first = True
        while frontier:
            if step >= self.graph.max_steps:
                raise RuntimeError(
                    f"subgraph {self.path!r} reached its step limit of {self.graph.max_steps}"
                )
            results = await self._superstep(step, state, frontier, answers, first)
            tickets = [t for r in results for t in r.tickets]
            if tickets:  # the interrupted tasks' spawns go with the parent's suspension
                self.ctx.events.extend(e for r in results if r.tickets for e in r.events)
                self.ctx.outbox.extend(o for r in results if r.tickets for o in r.outbox)
                raise Interrupt(*tickets, carry=self._carry(frontier, results))
            state, tasks = self.graph.barrier(
                state, [(r.entry["node"], r.updates) for r in results]
            )
            step, answers, first = step + 1, {}, False
            frontier = frontier_entries(step, tasks)
            nodes = list(dict.fromkeys(str(r.entry["node"]) for r in results))
            steps = [*steps, nodes]
            nested = {**nested, **{k: v for r in results for k, v in r.subgraphs.items()}}
            done = EventDraft(
                type="subgraph.step.completed",
                data={
                    "path": self.path,
                    "graph": self.graph.name,
                    "step": step - 1,
                    "nodes": nodes,
                },
                run_id=self.ctx.run_id,
                task_id=self.ctx.task_id,
            )
            events = (*(e for r in results for e in r.events), done)
            messages = tuple(m for r in results for m in r.messages)
            outbox = tuple(o for r in results for o in r.outbox)
            self.ctx.committed_callbacks.extend(c for r in results for c in r.callbacks)
            if not frontier:  # the last superstep goes with the node's result
                self.ctx.subgraphs.update({self.path: {"graph": self.graph.name, "steps": steps}})
                self.ctx.subgraphs.update(nested)
                self.ctx.events.extend(events)
                self.ctx.messages.extend(messages)
                self.ctx.outbox.extend(outbox)
                break
            self.snapshot = PendingWrite(
                checkpoint_id=cp.id,
                task_id=f"{self.ns}:c{step}",
                node=self.ctx.node,
                value={
                    SNAPSHOT: {
                        "path": self.path,
                        "graph": self.graph.name,
                        "step": step,
                        "steps": steps,
                        "nested": nested,
                        "state": state,
                        "frontier": frontier,
                        "used": cp.id,
                    }
                },
            )
            await self.services.commit_writes((self.snapshot,), events, messages, outbox)
            self.ctx.report_progress()
        return state

    def _carry(
        self, frontier: list[dict[str, Any]], results: list[TaskResult]
    ) -> tuple[PendingWrite, ...]:
        """What a suspension keeps: the snapshot, this superstep's finished child tasks and
        what nested subgraphs keep."""
        finished = (self.services.writes.get(f"{self.ns}:{e['id']}") for e in frontier)
        return (
            *((self.snapshot,) if self.snapshot is not None else ()),
            *(w for w in finished if w is not None),
            *(w for r in results for w in r.carry),
        )

    async def _superstep(
        self,
        step: int,
        state: dict[str, Any],
        frontier: list[dict[str, Any]],
        answers: dict[str, Any],
        first: bool,
    ) -> list[TaskResult]:
        limit = asyncio.Semaphore(self.graph.max_concurrency)

        async def one(entry: dict[str, Any]) -> TaskResult:
            recorded = self.services.writes.get(f"{self.ns}:{entry['id']}")
            if recorded is not None:
                return reused(entry, recorded)
            async with limit:
                return await self._task(step, entry, state, answers, first, len(frontier) == 1)

        outcomes = await asyncio.gather(*(one(e) for e in frontier), return_exceptions=True)
        for outcome in outcomes:  # the first failure in frontier order fails the node
            if isinstance(outcome, BaseException):
                raise outcome
        return [o for o in outcomes if isinstance(o, TaskResult)]

    async def _task(
        self,
        step: int,
        entry: dict[str, Any],
        state: dict[str, Any],
        answers: dict[str, Any],
        first: bool,
        single: bool,
    ) -> TaskResult:
        spec = self.graph.nodes[entry["node"]]
        task_id, sent = f"{self.ns}:{entry['id']}", bool(entry.get("sent"))
        path = f"{self.path}/{segment(spec.name, entry['id'], sent)}"
        attempt = 0
        while True:
            attempt += 1
            self.ctx.report_progress()
            ctx = self.ctx.child(
                task_id=task_id,
                node=spec.name,
                path=path,
                answers=answers,
                arg=entry.get("arg"),
                sent=sent,
                first=first,
            )
            try:
                updates = await call_node(spec, entry, state, ctx)
                break
            except Interrupt as interrupt:
                spawned, spawns = spawns_of(ctx.events, ctx.outbox)
                return TaskResult(
                    entry, tickets=interrupt.tickets, carry=interrupt.carry,
                    events=spawned, outbox=spawns,
                )  # fmt: skip
            except Exception as exc:
                retry = spec.retry
                if retry is None or attempt >= retry.max_attempts:
                    raise
                if not isinstance(exc, retry.retry_on):
                    raise
                with ctx.waiting():
                    await self.services.sleep(retry.delay(attempt))
        done = EventDraft(
            type="task.completed",
            data={"node": path, "step": step, "updates": updates},
            run_id=ctx.run_id,
            task_id=task_id,
        )
        events = (*ctx.events, done)
        result = TaskResult(
            entry,
            updates=updates,
            events=events,
            messages=tuple(ctx.messages),
            outbox=tuple(ctx.outbox),
            callbacks=tuple(ctx.committed_callbacks),
            subgraphs=ctx.subgraphs,
        )
        if single:  # the snapshot commit follows at once and carries it
            return result
        write = PendingWrite(
            checkpoint_id=self.services.checkpoint.id,
            task_id=task_id,
            node=spec.name,
            value=task_value(result),
        )
        await self.services.commit_writes((write,), events, result.messages, result.outbox)
        return TaskResult(
            entry, updates=updates, callbacks=result.callbacks, subgraphs=ctx.subgraphs
        )
