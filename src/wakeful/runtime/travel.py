"""Time travel's writes: a run replayed from an earlier checkpoint (``Runtime.replay``) and
a state edit (``Runtime.update_state``), each a fenced commit under the thread's claim.

Going back never destroys anything: a replay or an edit from a checkpoint that is not the
thread's head is a *branch* (``Commit.branch_from``): the new checkpoint continues from the
earlier one, the thread's message view becomes the messages as of it, the later checkpoints
and messages stay readable as an abandoned branch, and the commit carries a
``thread.branched`` event with the old head and the fork point. Both are refused with
``ThreadBusy`` while a run holds the thread, and with ``RunInProgress`` while the thread's
last run is unfinished and not suspended (its recovery is due: going back would orphan it).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful import telemetry
from wakeful.errors import InvalidInput, NotFound, RunInProgress, TenantMismatch
from wakeful.ids import check_id, check_optional_id
from wakeful.records import (
    Checkpoint,
    CheckpointEntry,
    Claim,
    Commit,
    EventDraft,
    Message,
    PendingWrite,
    ThreadSnapshot,
)
from wakeful.runtime.durability import DURABILITIES
from wakeful.runtime.graph import START, CompiledGraph
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.history import message_count_at
from wakeful.runtime.results import frontier_entries
from wakeful.runtime.spans import begin_run, traced_metadata
from wakeful.telemetry import NO_SPAN

if TYPE_CHECKING:
    from wakeful.runtime.runtime import Runtime

_Replay = tuple[Checkpoint, tuple[PendingWrite, ...]]


def _refuse_unfinished(thread_id: str, snap: ThreadSnapshot | None) -> Checkpoint:
    """The thread's head; ``NotFound`` for a thread without one, ``RunInProgress`` while
    its last run is running (live or awaiting recovery)."""
    head = snap.checkpoint if snap is not None else None
    if head is None:
        raise NotFound("thread", thread_id)
    if head.status == "running":
        raise RunInProgress(thread_id, head.run_id, head.status)
    return head


def _branched(head: Checkpoint, fork: Checkpoint, new: Checkpoint) -> EventDraft:
    return EventDraft(
        type="thread.branched",
        data={"old_head": head.id, "fork_point": fork.id, "checkpoint_id": new.id},
        run_id=new.run_id,
        checkpoint_id=new.id,
    )


async def _fork_point(
    rt: Runtime, thread_id: str, checkpoint_id: str | None, tenant: str | None
) -> tuple[CheckpointEntry, int]:
    """The checkpoint to go back to (default: the head) and its message count, read
    after checking the tenant. Checkpoints are immutable, so this read stays true; the
    head may move, which the admission's expected version catches."""
    snap = await rt.store.read(thread_id)
    if snap is not None and snap.tenant_bound and snap.tenant != tenant:
        raise TenantMismatch(thread_id)
    head = snap.checkpoint if snap is not None else None
    if snap is None or head is None:
        raise NotFound("thread", thread_id)
    wanted = checkpoint_id if checkpoint_id is not None else head.id
    found = await rt.store.get_checkpoint(thread_id, wanted)
    if found is None:
        raise NotFound("checkpoint", wanted)
    return found, await message_count_at(rt.store, thread_id, found, snap)


async def replay(
    rt: Runtime,
    thread_id: str,
    graph: CompiledGraph,
    checkpoint_id: str,
    input: Mapping[str, Any] | None = None,
    *,
    messages: Sequence[Message] = (),
    keep_messages: int | None = None,
    durability: str | None = None,
    tenant: str | None = None,
    run_id: str | None = None,
    allow_graph_change: bool = False,
    claim: Claim | None = None,
    snapshot: ThreadSnapshot | None = None,
    dispatch_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> RunHandle:
    """Start a new run from checkpoint ``checkpoint_id``: from its state, the messages
    as of it and its frontier (the step after it runs next; tasks whose results the
    thread's head holds as pending writes are reused, as recovery reuses them). With
    ``input``, the input is applied to its state through the reducers and the run starts
    at ``START`` instead (a new turn on the old state, as LangGraph's invoke with a
    checkpoint id does). ``messages`` are appended in the run's first commit;
    ``keep_messages`` keeps only that many of the messages as of the checkpoint (at most
    all of them): what editing a message needs.

    From a checkpoint other than the head (or keeping fewer messages) the run's first
    commit branches the thread (see the module). ``claim``, ``snapshot`` and
    ``dispatch_id`` as for ``start`` (a worker's replay of ``submit(...,
    from_checkpoint=...)``). Refused with ``ThreadBusy``, ``RunInProgress`` (see the
    module), ``NotFound`` and ``GraphChanged`` (the checkpoint was committed by another
    version of the graph, unless ``allow_graph_change``)."""
    check_id("checkpoint_id", checkpoint_id)
    check_optional_id("tenant", tenant)
    if durability is not None and durability not in DURABILITIES:
        raise InvalidInput("durability", f"must be one of {DURABILITIES}")
    if keep_messages is not None and keep_messages < 0:
        raise InvalidInput("keep_messages", "must be >= 0")
    run_id = check_id("run_id", run_id) if run_id else f"run-{uuid.uuid4().hex}"
    found, count = await _fork_point(rt, thread_id, checkpoint_id, tenant)
    fork = found.checkpoint
    rt._check_graph(thread_id, fork, graph, allow_graph_change)
    mode = durability or str(fork.metadata.get("durability", "sync"))
    attempt = begin_run("replay", thread_id, graph.name, run_id)
    trace = telemetry.inject(attempt) if attempt is not NO_SPAN else {}
    extra = dict(metadata or {})
    if "target" in fork.metadata and "target" not in extra:
        extra["target"] = fork.metadata["target"]

    def build(snap: ThreadSnapshot | None) -> tuple[_Replay, Commit]:
        head = _refuse_unfinished(thread_id, snap)
        assert snap is not None
        at_fork = snap.message_count if fork.id == head.id else count
        kept = at_fork if keep_messages is None else keep_messages
        if kept > at_fork:
            raise InvalidInput(
                "keep_messages", f"is {kept}, but the checkpoint has {at_fork} messages"
            )
        state = dict(fork.state or {})
        step = int(fork.metadata.get("step", 0))
        answers = dict(fork.metadata.get("answers", {}))
        if input is not None:
            state = graph.apply(state, dict(input))
            frontier, step, answers = frontier_entries(0, graph.next_tasks(START, state)), 0, {}
        else:
            frontier = list(fork.frontier)
        first = Checkpoint(
            id=f"{run_id}-c0",
            parent=fork.id,
            run_id=run_id,
            status="running",
            state=state,
            created_at=rt.clock.now(),
            tenant=snap.tenant if snap.tenant_bound else tenant,
            frontier=frontier,
            metadata=traced_metadata(
                {
                    **extra,
                    "step": step,
                    "ordinal": 0,
                    "graph": graph.name,
                    "fingerprint": graph.fingerprint,
                    "durability": mode,
                    "source": "replay",
                    "nodes": [],
                    "answers": answers,
                    "tickets": [],
                    "replayed_from": fork.id,
                    "messages": kept + len(messages),
                },
                trace,
            ),
        )
        branching = fork.id != head.id or kept < at_fork
        ids = {e["id"] for e in frontier}
        carried = (
            ()
            if branching or input is not None
            else tuple(
                msgspec.structs.replace(w, checkpoint_id=first.id)
                for w in snap.writes
                if w.task_id in ids
            )
        )
        events = [
            EventDraft(
                type="run.started",
                data={"graph": graph.name, "replayed_from": fork.id},
                run_id=run_id,
                checkpoint_id=first.id,
            )
        ]
        if branching:
            events.append(_branched(head, fork, first))
        commit = Commit(
            token=0,
            checkpoint=first,
            writes=carried,
            events=tuple(events),
            messages=tuple(messages),
            branch_from=fork.id if branching else None,
            branch_messages=kept if branching else 0,
            operation_id=first.id,
        )
        return (first, carried), commit

    try:
        with telemetry.use(attempt):
            if claim is None:
                claim, (first, carried) = await rt._claim_with_commit(thread_id, tenant, build)
                owned = True
            else:
                claim, snap = await rt._admit(thread_id, tenant, claim, snapshot)
                try:
                    (first, carried), commit = build(snap)
                except BaseException:
                    await rt._give_back(thread_id, claim, False)
                    raise
                await rt._commit(thread_id, msgspec.structs.replace(commit, token=claim.token))
                owned = False
    except BaseException as exc:
        telemetry.finish(attempt, exc)
        raise
    return rt._execute(
        graph,
        thread_id,
        claim,
        first,
        carried,
        mode,
        owned,
        dispatch_id,
        attempt,
        trace=trace,
        admitted=True,
    )


async def update_state(
    rt: Runtime,
    thread_id: str,
    graph: CompiledGraph,
    values: Mapping[str, Any],
    *,
    as_node: str | None = None,
    checkpoint_id: str | None = None,
    tenant: str | None = None,
    allow_graph_change: bool = False,
) -> Checkpoint:
    """Commit a new checkpoint whose state is ``values`` applied to the state of
    ``checkpoint_id`` (default: the head) through the graph's reducers, and return it.

    ``as_node``: as if that node had returned ``values``: the new checkpoint's frontier
    is what the graph routes to from it (so the next step routes from that node).
    Without it the base checkpoint's frontier is kept (the update lands before its
    pending step). A checkpoint with a frontier is ``suspended``: continue it with
    ``replay`` from it (or ``resume`` with no answers); without one it is ``completed``.
    From a checkpoint that is not the head, the commit branches the thread. One fenced
    write: the claim is taken and ended with it. Refused as ``replay`` is, and with
    ``InvalidInput`` for a node the graph does not have."""
    if as_node is not None and as_node not in graph.nodes:
        raise InvalidInput("as_node", f"{as_node!r} is not a node of graph {graph.name!r}")
    if not isinstance(values, Mapping):
        raise InvalidInput("values", "must be an object of state fields")
    found, count = await _fork_point(rt, thread_id, checkpoint_id, tenant)
    base = found.checkpoint
    rt._check_graph(thread_id, base, graph, allow_graph_change)
    run_id = f"update-{uuid.uuid4().hex}"

    def build(snap: ThreadSnapshot | None) -> tuple[Checkpoint, Commit]:
        head = _refuse_unfinished(thread_id, snap)
        assert snap is not None
        at_base = snap.message_count if base.id == head.id else count
        state = graph.apply(dict(base.state or {}), dict(values))
        step = int(base.metadata.get("step", 0))
        if as_node is not None:
            step += 1
            frontier = frontier_entries(step, graph.next_tasks(as_node, state))
        else:
            frontier = list(base.frontier)
        cp = Checkpoint(
            id=f"{run_id}-c0",
            parent=base.id,
            run_id=run_id,
            status="suspended" if frontier else "completed",
            state=state,
            created_at=rt.clock.now(),
            tenant=snap.tenant if snap.tenant_bound else tenant,
            frontier=frontier,
            metadata={
                "step": step,
                "ordinal": 0,
                "graph": graph.name,
                "fingerprint": graph.fingerprint,
                "durability": str(base.metadata.get("durability", "sync")),
                "source": "update",
                "nodes": [as_node] if as_node is not None else [],
                "answers": {},
                "tickets": [],
                "updated_from": base.id,
                "messages": at_base,
                **({"target": base.metadata["target"]} if "target" in base.metadata else {}),
            },
        )
        branching = base.id != head.id
        events = [
            EventDraft(
                type="state.updated",
                data={"as_node": as_node, "base": base.id, "fields": sorted(values)},
                run_id=run_id,
                checkpoint_id=cp.id,
            )
        ]
        if branching:
            events.append(_branched(head, base, cp))
        commit = Commit(
            token=0,
            checkpoint=cp,
            events=tuple(events),
            branch_from=base.id if branching else None,
            branch_messages=at_base if branching else 0,
            release=True,
            operation_id=cp.id,
        )
        return cp, commit

    _, cp = await rt._claim_with_commit(thread_id, tenant, build)
    return cp


__all__ = ["replay", "update_state"]
