"""Compiled LangGraph graphs as fleet targets (issue 44, decision 0052).

``Registry.add("agent", compiled_graph)`` makes ``fleet_target("agent", compiled_graph)``
(through ``wakeful.fleet.selfrun``): a worker that leases a dispatch of it runs the graph's
``astream`` with the worker's ``WakefulSaver`` (one per worker process, ``fencing="hold"``)
writing under the lease's own claim (``WakefulSaver.adopt``), so every checkpoint is a
fenced commit and a run whose claim was taken over (a newer lease, a cancel) stops at its
next write. A dispatch's payload (``langgraph_payload``) names the LangGraph thread, the
run id (a UUID: the dispatch id), the input or ``{"resume": ...}`` command, the stream
modes and the run's config.

Recovery: a redelivered dispatch whose run already wrote checkpoints (their metadata names
the run) continues from the last one (input ``None``); one that finished or stopped at an
``interrupt()`` before its owner could settle is settled as the thread says, without
running anything. A run that stops at an ``interrupt()`` settles ``Awaiting``: the thread's
run slot stays taken by it (the wakeful ticket of a suspended run) until a ``resume``
dispatch answers it with ``Command(resume=...)``.

Streaming: every chunk of ``astream`` goes out on the worker's live channel as a
``langgraph.chunk`` event (``{"mode", "chunk", "attempt", "seq"}``), batched per event-loop
turn, and the run's end as ``langgraph.end`` (``{"status", "error", "attempt"}``). The
channel is lossy; the stream server fills the final ``values`` in from the store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

from wakeful.errors import WakefulError
from wakeful.fleet.selfrun import TARGETS_KEY, Job
from wakeful.langgraph.saver import WakefulSaver
from wakeful.records import Awaiting, Done, Outcome
from wakeful.runtime.events import LiveEvent

log = logging.getLogger("wakeful.langgraph")

CHUNK = "langgraph.chunk"
END = "langgraph.end"
RUN_KEY = "run_id"
"""Checkpoint metadata: the run that wrote it (its dispatch id, a UUID)."""
TENANT_KEY = "wakeful_tenant"
GRAPH_KEY = "wakeful_graph"
"""Checkpoint metadata of a run: the thread's tenant and graph, so a server that has no
record of a thread knows whose it is and what it runs."""
STREAM_MODES = ("values", "updates", "messages", "custom", "debug")
"""LangGraph stream modes a worker streams (``messages`` is the API's ``messages-tuple``)."""
SAVER_KEY = "wakeful.langgraph.saver"


def fleet_target(name: str, graph: Any) -> LangGraphTarget:
    """The plug-in entry point ``wakeful.fleet.selfrun.plugin`` calls."""
    return LangGraphTarget(name, graph)


def langgraph_payload(
    *,
    target: str,
    thread_id: str,
    run_id: str,
    input: Any = None,
    command: dict[str, Any] | None = None,
    stream_mode: Sequence[str] = ("values",),
    config: dict[str, Any] | None = None,
    context: Any = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """The payload of a dispatch that runs LangGraph graph ``target`` (JSON values)."""
    modes = [m for m in stream_mode if m in STREAM_MODES] or ["values"]
    payload: dict[str, Any] = {
        "target": target,
        "langgraph": True,
        "thread_id": thread_id,
        "run_id": run_id,
        "input": input,
        "stream_mode": modes,
        "tenant": tenant,
    }
    if command is not None:
        payload["command"] = command
    if config:
        payload["config"] = config
    if context is not None:
        payload["context"] = context
    return payload


def _default(value: Any) -> Any:
    """JSON for what LangGraph streams: pydantic models (messages), dataclasses
    (``Interrupt``), tuples and sets; anything else as its ``repr``."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return repr(value)


def dumps(value: Any) -> str:
    return json.dumps(value, default=_default, separators=(",", ":"))


def jsonable(value: Any) -> Any:
    return json.loads(dumps(value))


def interrupted(state: Any) -> bool:
    """Whether a ``StateSnapshot`` stops at an ``interrupt()`` waiting for a resume."""
    return bool(getattr(state, "interrupts", ())) or any(t.interrupts for t in state.tasks)


def run_config(payload: dict[str, Any], tenant: str | None, graph: str) -> dict[str, Any]:
    """LangGraph's config of the run ``payload`` describes."""
    config: dict[str, Any] = dict(payload.get("config") or {})
    configurable = dict(config.get("configurable") or {})
    configurable["thread_id"] = payload["thread_id"]
    config["configurable"] = configurable
    metadata = dict(config.get("metadata") or {})
    metadata.update({RUN_KEY: payload["run_id"], TENANT_KEY: tenant, GRAPH_KEY: graph})
    config["metadata"] = metadata
    return config


class Publisher:
    """A run's live events, handed to the channel together per event-loop turn."""

    def __init__(self, job: Job, run_id: str) -> None:
        self.channel = job.live
        self.thread_id = job.lease.dispatch.thread_id
        self.run_id = run_id
        self.attempt = job.lease.dispatch.attempts
        self.seq = 0
        self._pending: list[LiveEvent] = []

    def chunk(self, mode: str, chunk: Any) -> None:
        if self.channel is None:
            return
        self.seq += 1
        data = {"mode": mode, "chunk": jsonable(chunk), "attempt": self.attempt, "seq": self.seq}
        self._add(LiveEvent(thread_id=self.thread_id, run_id=self.run_id, type=CHUNK, data=data))

    def end(self, status: str, error: str | None = None) -> None:
        if self.channel is None:
            return
        data = {"status": status, "error": error, "attempt": self.attempt, "seq": self.seq}
        self._add(LiveEvent(thread_id=self.thread_id, run_id=self.run_id, type=END, data=data))
        self.flush()

    def _add(self, event: LiveEvent) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(event)

    def flush(self) -> None:
        events, self._pending = self._pending, []
        if events and self.channel is not None:
            try:
                self.channel.publish(events)
            except Exception:  # a hint: the stream server reads the final values from the store
                log.exception("publishing LangGraph chunks failed")


def _tenant(job: Job) -> str | None:
    """The tenant of the lease's thread (its records must name it)."""
    snap = job.lease.snapshot
    if snap is not None and snap.tenant is not None:
        return snap.tenant
    return job.lease.dispatch.tenant


class LangGraphTarget:
    """A compiled LangGraph graph that a worker runs (``wakeful.fleet.selfrun.SelfRunning``)."""

    def __init__(self, name: str, graph: Any) -> None:
        self.name = name
        self.graph = graph

    def saver(self, job: Job) -> WakefulSaver:
        """The worker's saver (one per worker, shared by its LangGraph targets)."""
        saver = job.shared.get(SAVER_KEY)
        if not isinstance(saver, WakefulSaver):
            claims = job.claims
            saver = WakefulSaver(
                job.store,
                fencing="hold",
                holder=job.holder,
                ttl=claims.ttl,
                renew_every=claims.renew_every,
            )
            job.shared[SAVER_KEY] = saver
        return saver

    async def run_dispatch(self, job: Job) -> Outcome:
        d = job.lease.dispatch
        payload = d.payload if isinstance(d.payload, dict) else {}
        saver = self.saver(job)
        if d.kind == "cancel":
            return await self._cancel(job, saver, payload)
        if d.kind == "resume" and "thread_id" not in payload and "answers" in payload:
            answered = await self._answers(job, saver, payload)  # the /v1 API's ticket answers
            if answered is None:
                return Done()
            target, payload = answered
            return await target.run(job, payload)
        return await self.run(job, payload)

    async def _answers(
        self, job: Job, saver: WakefulSaver, payload: dict[str, Any]
    ) -> tuple[LangGraphTarget, dict[str, Any]] | None:
        """The run a resume with ticket answers asks for: ``Command(resume={interrupt id:
        answer})`` on the thread's graph."""
        d = job.lease.dispatch
        snap = job.lease.snapshot or await job.store.read(d.thread_id)
        state = snap.checkpoint.state if snap is not None and snap.checkpoint else None
        lg_thread = state.get("thread") if isinstance(state, dict) else None
        if not isinstance(lg_thread, str):
            log.warning("dispatch %s answers no LangGraph interrupt; nothing runs", d.dispatch_id)
            return None
        latest = await saver.aget_tuple({"configurable": {"thread_id": lg_thread}})
        graph = latest.metadata.get(GRAPH_KEY) if latest is not None else None
        targets = job.shared.get(TARGETS_KEY) or {}
        target = targets.get(graph, self) if isinstance(graph, str) else self
        answers: Any = payload.get("answers")
        return target, langgraph_payload(
            target=target.name,
            thread_id=lg_thread,
            run_id=d.dispatch_id,
            command={"resume": dict(answers) if isinstance(answers, dict) else {}},
            tenant=d.tenant,
        )

    async def run(self, job: Job, payload: dict[str, Any]) -> Outcome:
        """Run the graph as ``payload`` (``langgraph_payload``) says, under the lease."""
        d, claim = job.lease.dispatch, job.lease.claim
        saver = self.saver(job)
        if d.kind == "start" and not isinstance(payload.get("thread_id"), str):
            # a start enqueued elsewhere (a schedule's tick, a cron, POST /v1/.../runs):
            # its input, on the dispatch's own thread
            payload = langgraph_payload(
                target=self.name,
                thread_id=d.thread_id,
                run_id=d.dispatch_id,
                input=payload.get("input"),
                tenant=d.tenant,
            )
        if d.kind not in ("start", "resume") or not isinstance(payload.get("thread_id"), str):
            log.warning("dispatch %s is not a LangGraph run; nothing runs", d.dispatch_id)
            return Done()
        if job.lease.exhausted:
            log.warning("dispatch %s: every attempt was spent; the run stops", d.dispatch_id)
            return Done()
        run_id = str(payload.get("run_id") or d.dispatch_id)
        graph = self.graph.copy(update={"checkpointer": saver})
        config = run_config(payload, d.tenant, self.name)
        publisher = Publisher(job, run_id)
        async with saver.adopt(payload["thread_id"], claim, _tenant(job)):
            latest = await saver.aget_tuple({"configurable": dict(config["configurable"])})
            if latest is not None and latest.metadata.get(RUN_KEY) == run_id:
                # an earlier attempt of this run wrote checkpoints: continue from the last
                state = await graph.aget_state(config)
                if interrupted(state) or not state.next:
                    publisher.end("interrupted" if interrupted(state) else "success")
                    return Awaiting() if interrupted(state) else Done()
                input: Any = None
            elif isinstance(payload.get("command"), dict):
                from langgraph.types import Command

                input = Command(resume=payload["command"].get("resume"))
            else:
                input = payload.get("input")
            modes = list(payload.get("stream_mode") or ["values"])
            try:
                # durability "sync": a step's checkpoint is stored before the next step
                # starts, so a run fenced meanwhile stops there, not a step later
                async for mode, chunk in graph.astream(
                    input,
                    config,
                    stream_mode=modes,
                    context=payload.get("context"),
                    durability="sync",
                ):
                    publisher.chunk(mode, chunk)
            except WakefulError:
                raise  # fenced (a newer owner or a cancel), or the store: the worker decides
            except Exception as exc:  # the graph's own failure: recorded in its checkpoint
                log.warning("LangGraph run %s failed: %s: %s", run_id, type(exc).__name__, exc)
                publisher.end("error", f"{type(exc).__name__}: {exc}")
                return Done()
            state = await graph.aget_state(config)
        stopped = interrupted(state)
        publisher.end("interrupted" if stopped else "success")
        return Awaiting() if stopped else Done()

    async def _cancel(self, job: Job, saver: WakefulSaver, payload: dict[str, Any]) -> Outcome:
        """A cancel of the thread's run (``multitask_strategy`` interrupt or rollback, or a
        ``runs.cancel``): the run was fenced when the cancel was stored; a rollback also
        removes the checkpoints it wrote."""
        if payload.get("rollback") is not True:
            return Done()
        d = job.lease.dispatch
        interrupter = payload.get("interrupted_by")
        new = await job.store.get_dispatch(interrupter) if isinstance(interrupter, str) else None
        busy = new.queued_behind if new is not None else None  # the run it interrupted
        snap = await job.store.read(d.thread_id)
        record = snap.checkpoint if snap is not None else None
        state = record.state if record is not None else None
        lg_thread = state.get("thread") if isinstance(state, dict) else None
        if busy is None or not isinstance(lg_thread, str):
            return Done()  # nothing of a LangGraph run was written: nothing to undo
        async with saver.adopt(lg_thread, job.lease.claim, _tenant(job)):
            await saver.adelete_run(lg_thread, busy)
        return Done()


__all__ = [
    "CHUNK",
    "END",
    "GRAPH_KEY",
    "RUN_KEY",
    "STREAM_MODES",
    "TENANT_KEY",
    "LangGraphTarget",
    "fleet_target",
    "jsonable",
    "langgraph_payload",
]
