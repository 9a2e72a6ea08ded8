"""A worker's side of child runs (``wakeful.runtime.children``, decision 0046).

- **Start.** A spawn arrives as a relayed inbox message whose payload is the spawn's
  envelope; its ``message`` dispatch starts the named target with the envelope's input and
  records the parent link (``metadata["parent"]``, also in ``run.started``).
- **End.** A child run's ending commit does not settle its dispatch: the worker first
  enqueues the parent's wake-up, a ``resume`` dispatch whose id is derived from the child's
  thread and run (so it is recorded once), then settles. A worker killed in between leaves
  the dispatch leased; its redelivery finds the run ended and enqueues the wake-up again
  (the same id: a no-op if it was already stored).
- **Wake-up.** A ``resume`` inherits the parent's run slot. Its claimant answers every join
  ticket of the suspended parent whose child has ended (read from the children's threads)
  and resumes the run; if none has (an earlier wake-up answered it already), nothing runs.
- **Cancel.** Cancelling a parent's run cancels each child it spawned (not ``detached``)
  that has not ended; a non-detached child whose parent's run was cancelled before it
  started never starts."""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import Any

from wakeful.errors import WakefulError
from wakeful.fleet.wake import Wake
from wakeful.records import (
    TERMINAL_STATUSES,
    Checkpoint,
    Claim,
    Commit,
    Dispatch,
    Event,
    EventDraft,
    ThreadSnapshot,
)
from wakeful.runtime.children import (
    JOIN_SCHEMA,
    child_run_id,
    parent_of,
    read_outcome,
    spawn_of,
)
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.fleet")

EVENT_PAGE = 500
PARENT_GONE = ("cancelled", "interrupted")
"""How a parent's run ended when its non-detached children are cancelled with it."""


def wake_id(child_thread: str, child_run: str) -> str:
    """The id of the ``resume`` dispatch that a child's end enqueues for its parent."""
    digest = hashlib.sha256(f"{child_thread}\x00{child_run}".encode()).hexdigest()[:40]
    return f"join-{digest}"


async def wake_parent(store: Store, wake: Wake, thread_id: str, ended: Checkpoint | None) -> bool:
    """If ``ended`` is the last checkpoint of a child run that has ended, enqueue its
    parent's wake-up (idempotent) and notify the workers; whether it did. A failure raises
    (the attempt is retried, and its redelivery enqueues the wake-up)."""
    if ended is None or ended.status not in TERMINAL_STATUSES:
        return False
    parent = parent_of(ended)
    # (parent link, the child's run as its parent's join names it)
    waiting = [(parent, ended.run_id)] if parent is not None else []
    for other in ended.metadata.get("coalesced_parents", ()):  # spawns it answered too
        if isinstance(other, dict) and isinstance(other.get("thread"), str):
            waiting.append((other, str(other.get("child_run"))))
    if not waiting:
        return False
    for link, child_run in waiting:
        await store.enqueue(
            Dispatch(
                dispatch_id=wake_id(thread_id, child_run),
                thread_id=str(link["thread"]),
                kind="resume",
                payload={"join": {"thread": thread_id, "run_id": child_run}},
                tenant=link.get("tenant"),  # the parent's run resumes for its tenant
            )
        )
    await wake.notify()
    return True


async def coalesced_parents(store: Store, coalesced: tuple[str, ...]) -> dict[str, Any]:
    """The run metadata naming the parents of the spawned children (``if_busy=
    "coalesce"``) that a coalesced run answers besides its own dispatch:
    ``{"coalesced_parents": [{thread, run_id, tenant?, child_run}]}``, or ``{}``. The
    run's end wakes each of them (``wake_parent``); their joins read its outcome."""
    links = []
    for dispatch_id in coalesced:
        d = await store.get_dispatch(dispatch_id)
        spawn = spawn_of(d.payload) if d is not None else None
        if d is None or spawn is None or not isinstance(spawn.get("parent"), dict):
            continue
        run_id = d.payload.get("run_id") or f"run-{dispatch_id}"
        links.append({**spawn["parent"], "child_run": str(run_id)})
    return {"coalesced_parents": links} if links else {}


async def resume_answers(
    store: Store, latest: Checkpoint | None, payload: dict[str, Any]
) -> dict[str, Any] | None:
    """The answers a ``resume`` dispatch (``payload``) gives: its own, or for a child's
    wake-up those of every join ticket whose child has ended (``joined_answers``), ``None``
    when there is none left (an earlier wake-up, or the join itself, read it)."""
    if not isinstance(payload.get("join"), dict):
        return dict(payload.get("answers") or {})
    return await joined_answers(store, latest) or None


async def joined_answers(store: Store, latest: Checkpoint | None) -> dict[str, Any]:
    """The answers of the suspended run's join tickets whose children have ended (empty
    when it is not suspended, or none has)."""
    if latest is None or latest.status != "suspended":
        return {}
    answers: dict[str, Any] = {}
    for ticket in latest.metadata.get("tickets", ()):
        if not isinstance(ticket, dict) or ticket.get("schema") != JOIN_SCHEMA:
            continue
        question = ticket.get("question") or {}
        child = question.get("join") if isinstance(question, dict) else None
        if not isinstance(child, dict):
            continue
        outcome = await read_outcome(store, str(child["thread"]), str(child["run_id"]))
        if outcome is not None:
            answers[str(ticket["id"])] = outcome
    return answers


async def spawned_children(
    store: Store,
    thread_id: str,
    run_id: str | None = None,
    limit: int | None = None,
    after: int = 0,
) -> list[Event]:
    """The ``child.spawned`` events of ``thread_id`` after event ``after`` (of run
    ``run_id`` only, when given), in order; the first ``limit`` when given."""
    found: list[Event] = []
    while limit is None or len(found) < limit:
        page = await store.events_after(thread_id, after, EVENT_PAGE)
        for event in page:
            wanted = event.type == "child.spawned" and run_id in (None, event.run_id)
            if wanted and isinstance(event.data, dict):
                found.append(event)
        if len(page) < EVENT_PAGE:
            break
        after = page[-1].seq
    return found if limit is None else found[:limit]


async def run_children(store: Store, thread_id: str, run_id: str) -> list[Event]:
    """The ``child.spawned`` events of run ``run_id``, the thread's latest, in order: read
    backwards from the thread's last event, a page at a time, down to the run's
    ``run.started`` (so a cancel costs what the run recorded, not the thread's history)."""
    snap = await store.read(thread_id)
    if snap is None:
        return []
    found: list[Event] = []
    high, floor = snap.last_seq, snap.event_floor - 1
    while high > floor:
        low = max(floor, high - EVENT_PAGE)
        page = await store.events_after(thread_id, low, high - low)
        for event in reversed(page):
            if event.run_id != run_id:
                continue
            if event.type == "child.spawned" and isinstance(event.data, dict):
                found.append(event)
            elif event.type == "run.started":
                return found[::-1]
        high = low
    return found[::-1]


async def cancel_children(store: Store, wake: Wake, run: Checkpoint, thread_id: str) -> int:
    """Cancel every child of ``run`` (spawned on ``thread_id``, not detached) that has not
    ended; how many. A child whose thread has moved on to another run is left alone (it
    never starts: ``parent_gone``)."""
    cancelled = 0
    for event in await run_children(store, thread_id, run.run_id):
        child = event.data
        if child.get("detached"):
            continue
        child_thread, child_run = str(child["thread_id"]), str(child["run_id"])
        snap = await store.read(child_thread)
        latest = snap.checkpoint if snap is not None else None
        if latest is not None and (
            latest.run_id != child_run or latest.status in TERMINAL_STATUSES
        ):
            continue
        reason = f"its parent run {run.run_id} on {thread_id} was cancelled"
        await store.cancel(child_thread, reason)
        cancelled += 1
    if cancelled:
        await wake.notify()
    return cancelled


async def before_ending(
    store: Store, wake: Wake, thread_id: str, unfinished: Checkpoint | None
) -> bool:
    """Before a cancel dispatch ends ``unfinished`` (the thread's unfinished run, if any):
    cancel its running children; whether it is itself a child run (then its parent is
    woken before the dispatch settles, as at any child's end)."""
    if unfinished is None:
        return False
    await cancel_children(store, wake, unfinished, thread_id)
    return parent_of(unfinished) is not None


async def parent_gone(store: Store, spawn: dict[str, Any]) -> str | None:
    """Why a spawned child must not start (its parent's run was cancelled before it could),
    or ``None``. A detached child always starts."""
    parent = spawn.get("parent")
    if spawn.get("detached") or not isinstance(parent, dict):
        return None
    try:
        snap = await store.read(str(parent["thread"]))
    except WakefulError as exc:  # the child starts; a cancel that follows still reaches it
        log.warning("reading the parent of a spawned run failed: %s", exc)
        return None
    latest = snap.checkpoint if snap is not None else None
    ours = latest is not None and latest.run_id == parent.get("run_id")
    if ours and latest is not None and latest.status in PARENT_GONE:
        return f"its parent run {latest.run_id} was {latest.status} before it started"
    return None


async def refused_spawn(
    store: Store,
    wake: Wake,
    claim: Claim,
    snap: ThreadSnapshot | None,
    payload: Any,
    reason: str,
    now: datetime,
) -> bool:
    """If the refused ``message`` dispatch (``payload``) is a spawn, record its child run
    ``failed`` with ``reason`` (an unknown target, an input it cannot take, a parent gone)
    and wake the parent, whose join then raises ``ChildFailed``; whether it was one."""
    if not isinstance(payload, dict):
        return False
    message_id = payload.get("message_id")
    body: Any = payload  # a spawn with a busy-thread policy: a start with the envelope
    consume: tuple[str, ...] = ()
    if message_id is not None:  # a relayed message: the envelope is in the inbox
        found = [m for m in await store.inbox(claim.thread_id) if m.message_id == message_id]
        body = found[0].payload if found else None
        consume = (str(message_id),)
    spawn = spawn_of(body)
    if spawn is None:
        return False
    if message_id is not None:
        run_id = child_run_id(claim.thread_id, str(message_id))
    else:
        run_id = str(payload.get("run_id") or f"run-{claim.thread_id}")
    latest = snap.checkpoint if snap is not None else None
    failed = Checkpoint(
        id=f"{run_id}-c0",
        parent=latest.id if latest is not None else None,
        run_id=run_id,
        status="failed",
        state=None,
        created_at=now,
        tenant=relayed_tenant(snap, spawn_metadata(body), None),
        metadata={**spawn_metadata(body), "target": spawn["target"], "error": reason},
    )
    event = EventDraft(type="run.failed", data={"error": reason}, run_id=run_id)
    commit = Commit(
        token=claim.token,
        checkpoint=failed,
        events=(event,),
        consume=consume,
        operation_id=failed.id,
    )
    await store.commit(claim.thread_id, commit)
    await wake_parent(store, wake, claim.thread_id, failed)
    return True


def relayed_tenant(
    snap: ThreadSnapshot | None, spawned: dict[str, Any], tenant: str | None
) -> str | None:
    """The tenant a relayed message's run acts for: the target thread's once fixed, else
    for a child run its parent's (``spawned``: the child's metadata), else ``tenant``."""
    if snap is not None and snap.tenant_bound:
        return snap.tenant
    parent = spawned.get("parent")
    if isinstance(parent, dict) and isinstance(parent.get("tenant"), str):
        return str(parent["tenant"])
    return tenant


def spawn_metadata(inbox_payload: Any) -> dict[str, Any]:
    """The checkpoint metadata a spawned child's run records (its parent link)."""
    spawn = spawn_of(inbox_payload)
    if spawn is None:
        return {}
    return {"parent": dict(spawn["parent"]), "detached": bool(spawn.get("detached"))}


__all__ = [
    "before_ending",
    "cancel_children",
    "coalesced_parents",
    "joined_answers",
    "parent_gone",
    "refused_spawn",
    "relayed_tenant",
    "run_children",
    "spawn_metadata",
    "spawned_children",
    "wake_id",
    "wake_parent",
]
