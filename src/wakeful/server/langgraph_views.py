"""What the LangGraph API (``wakeful.server.langgraph_api``) sends and keeps: JSON of
LangGraph's values and snapshots, SSE frames, stream modes, thread and run records."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

STREAM_MODES = {
    "values": "values",
    "updates": "updates",
    "custom": "custom",
    "messages-tuple": "messages",
    "debug": "debug",
}
"""The API's stream modes of this slice and LangGraph's mode behind each (its chunks go out
as events named after LangGraph's mode, as LangGraph's server does); others answer 501."""
MAX_HISTORY = 1000
TENANT_KEY = "wakeful_tenant"
GRAPH_KEY = "wakeful_graph"
"""Checkpoint metadata of a run: the thread's tenant and graph, so a restarted server knows
whose thread it is (thread records are kept in memory; decision 0050)."""
NAMESPACE = uuid.UUID("6ba7b812-9dad-11d1-80b4-00c04fd430c8")


def now() -> str:
    return datetime.now(UTC).isoformat()


def _default(value: Any) -> Any:
    """JSON for what LangGraph streams: pydantic models (messages), dataclasses
    (``Interrupt``), tuples and sets."""
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


@dataclass
class ThreadRecord:
    thread_id: str
    tenant: str | None
    metadata: dict[str, Any]
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    assistant_id: str | None = None
    running: str | None = None
    """The run occupying the thread, if any (multitask strategy ``reject``)."""


@dataclass
class RunRecord:
    run_id: str
    thread_id: str
    assistant_id: str
    metadata: dict[str, Any]
    status: str = "pending"
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    task: asyncio.Task[Any] | None = None

    def view(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status,
            "metadata": self.metadata,
            "multitask_strategy": "reject",
            "kwargs": {},
        }


class Unsupported(Exception):
    """A request this slice does not implement (answered 501)."""


def snapshot(snap: Any) -> dict[str, Any]:
    """A LangGraph ``StateSnapshot`` as the API's ``ThreadState``."""

    def checkpoint(config: Any) -> dict[str, Any] | None:
        conf = (config or {}).get("configurable", {})
        if not conf.get("checkpoint_id"):
            return None
        return {
            "thread_id": conf.get("thread_id"),
            "checkpoint_ns": conf.get("checkpoint_ns", ""),
            "checkpoint_id": conf["checkpoint_id"],
        }

    tasks = [
        {
            "id": task.id,
            "name": task.name,
            "error": None if task.error is None else repr(task.error),
            "interrupts": list(task.interrupts),
            "checkpoint": None,
            "state": None,
            "result": getattr(task, "result", None),
        }
        for task in snap.tasks
    ]
    view: dict[str, Any] = json.loads(
        dumps(
            {
                "values": snap.values,
                "next": list(snap.next),
                "tasks": tasks,
                "checkpoint": checkpoint(snap.config),
                "metadata": snap.metadata,
                "created_at": snap.created_at,
                "parent_checkpoint": checkpoint(snap.parent_config),
                "interrupts": list(getattr(snap, "interrupts", ())),
            }
        )
    )
    return view


def run_input(body: dict[str, Any]) -> Any:
    command = body.get("command")
    if command is None:
        return body.get("input")
    if not isinstance(command, dict) or set(command) - {"resume"}:
        raise Unsupported("commands other than {'resume': ...} (goto, update)")
    from langgraph.types import Command

    return Command(resume=command.get("resume"))


def stream_modes(body: dict[str, Any]) -> list[str]:
    raw = body.get("stream_mode", "values")
    modes = [raw] if isinstance(raw, str) else list(raw or ["values"])
    for mode in modes:
        if mode not in STREAM_MODES:
            raise Unsupported(f"stream_mode {mode!r} (this server streams {sorted(STREAM_MODES)})")
    return [STREAM_MODES[mode] for mode in modes]


UNSUPPORTED_RUN_FIELDS = (
    "webhook",
    "interrupt_before",
    "interrupt_after",
    "checkpoint",
    "checkpoint_id",
    "after_seconds",
    "feedback_keys",
)


def config_for(thread_id: str, extra: Any = None) -> dict[str, Any]:
    """LangGraph's config of a run on ``thread_id``, from a request's ``config``. Keys that
    pick a checkpoint (time travel) or LangGraph's internal ``__`` keys are refused (501):
    a client must not steer the saver past what this slice supports."""
    config: dict[str, Any] = dict(extra) if isinstance(extra, dict) else {}
    configurable = dict(config.get("configurable") or {})
    for key in configurable:
        if not isinstance(key, str) or key.startswith(("__", "checkpoint")):
            raise Unsupported(f"the configurable key {key!r}")
    configurable["thread_id"] = thread_id
    config["configurable"] = configurable
    return config


def frame(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {dumps(data)}\n\n".encode()
