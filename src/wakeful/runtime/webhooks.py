"""The webhook a run's ending stages (issue 43): an outbox entry in the ending commit itself.

A run whose checkpoints carry ``metadata["webhook"]`` (a URL: ``submit(..., webhook=...)``
or the registry target's) stages one outbox entry in each commit that ends it
(``completed``, ``failed``, ``cancelled``, ``interrupted``, ``indeterminate``) or suspends it
on a question (a ``suspended`` run asleep on ``ctx.sleep`` is not waiting for anyone and
stages none). The entry is part of that commit: it is stored exactly when the ending is,
never lost and never doubled, whichever process commits the ending (the run, a cancel's
claimant, the claimant of exhausted work).

The entry's ``message_id`` is the webhook id, derived from the run id and the ending
checkpoint's id (a run that suspends twice sends two webhooks, each with its own id; every
delivery attempt of one sends the same id). Its target is the webhook's own thread
``wakeful.webhook.<id>``: the relay puts it in that thread's inbox and queues a ``message``
dispatch there, which a worker delivers (``wakeful.fleet.webhooks``). The body is built
here, once, so every attempt sends the same bytes."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from wakeful.records import Checkpoint, Commit, OutboxEntry
from wakeful.runtime.sleeps import wake_at

WEBHOOK_THREAD_PREFIX = "wakeful.webhook."
"""Thread ids of webhook deliveries: this prefix, then the webhook id."""
ENDINGS = frozenset(("completed", "failed", "cancelled", "interrupted", "indeterminate"))
OUTPUT_LIMIT = 8192
"""Bytes of JSON of a run's output that a webhook body carries; a larger output is left
out (``output_truncated``: read it from the thread)."""


def webhook_id(run_id: str, checkpoint_id: str) -> str:
    """The webhook id of the ending ``checkpoint_id`` of ``run_id`` (stable, in the id
    alphabet; the Standard Webhooks ``webhook-id``)."""
    digest = hashlib.sha256(f"{run_id}\x00{checkpoint_id}".encode()).hexdigest()[:32]
    return f"msg_{digest}"


def is_webhook_thread(thread_id: str) -> bool:
    return thread_id.startswith(WEBHOOK_THREAD_PREFIX)


def _sends(cp: Checkpoint) -> bool:
    if cp.status in ENDINGS:
        return True
    # asleep on ``ctx.sleep`` only: the run wakes by itself, nobody is waited for
    return cp.status == "suspended" and wake_at(cp) is None


def _output(state: Any) -> tuple[Any, bool]:
    """The run's output for the body: an agent's final answer, else the graph's state;
    ``(None, True)`` when its JSON is longer than ``OUTPUT_LIMIT``."""
    if isinstance(state, dict) and {"calls", "turns", "final"} <= state.keys():
        state = state.get("final")
    if len(msgspec.json.encode(state)) > OUTPUT_LIMIT:
        return None, True
    return state, False


def webhook_body(thread_id: str, cp: Checkpoint) -> dict[str, Any]:
    """The JSON body of the webhook for ``cp`` (an ending or suspending checkpoint of a run
    on ``thread_id``), in the Standard Webhooks shape ``{type, timestamp, data}``. Links are
    paths of the HTTP API, relative to where it is served."""
    output, truncated = _output(cp.state)
    data: dict[str, Any] = {
        "thread_id": thread_id,
        "run_id": cp.run_id,
        "status": cp.status,
        "checkpoint_id": cp.id,
        "output": output,
        "output_truncated": truncated,
        "links": {
            "thread": f"/v1/threads/{thread_id}",
            "runs": f"/v1/threads/{thread_id}/runs",
            "events": f"/v1/threads/{thread_id}/events",
        },
    }
    for key in ("error", "reason", "ended_by"):
        if isinstance(cp.metadata.get(key), str):
            data[key] = cp.metadata[key]
    if cp.status == "suspended":
        data["tickets"] = cp.metadata.get("tickets") or []
    return {"type": f"run.{cp.status}", "timestamp": cp.created_at.isoformat(), "data": data}


def with_webhook(thread_id: str, commit: Commit) -> Commit:
    """``commit`` with its run's webhook staged when its checkpoint ends (or suspends) a run
    whose metadata names a webhook URL; otherwise ``commit`` itself."""
    cp = commit.checkpoint
    if cp is None or not isinstance(url := cp.metadata.get("webhook"), str) or not _sends(cp):
        return commit
    ident = webhook_id(cp.run_id, cp.id)
    if any(e.message_id == ident for e in commit.outbox):
        return commit
    entry = OutboxEntry(
        message_id=ident,
        target_thread=WEBHOOK_THREAD_PREFIX + ident,
        payload={
            "webhook_id": ident,
            "url": url,
            "tenant": cp.tenant,
            "body": webhook_body(thread_id, cp),
        },
    )
    return msgspec.structs.replace(commit, outbox=(*commit.outbox, entry))


__all__ = [
    "WEBHOOK_THREAD_PREFIX",
    "is_webhook_thread",
    "webhook_body",
    "webhook_id",
    "with_webhook",
]
