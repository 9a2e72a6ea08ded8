"""A thread's durable events: a JSON page, or a Server-Sent Events stream.

The stream (``Accept: text/event-stream``) sends each event as ``id: <seq>``,
``event: <type>``, ``data: <event as JSON>``, starting after ``Last-Event-ID`` (the header
an EventSource sends when it reconnects) or else ``after``. Events are numbered 1, 2, 3 ...
per thread and never reused, so resuming after the last seen id gives exactly the rest: no
gap, no duplicate, also across a server restart. While nothing happens, a comment line
(``: keep-alive``) is sent every ``sse_keepalive`` seconds. A start below the compaction
floor is 410 with ``earliest_seq``; if the floor passes a slow reader mid-stream, the stream
sends ``event: error`` with the same problem document and ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse

from wakeful.errors import WakefulError
from wakeful.records import Event
from wakeful.server.access import CallerDep, ServerState, StateDep, visible_thread
from wakeful.server.auth import Caller
from wakeful.server.problems import problem_for
from wakeful.server.routes.params import MAX_SEQ, Limit, SeqCursor, ThreadId
from wakeful.server.schemas import SSE_EVENT, EventPage, EventView
from wakeful.server.views import errors

router = APIRouter(prefix="/v1", tags=["events"])

EVENT_STREAM = "text/event-stream"
BATCH = 100

_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A page of events (JSON), or with `Accept: text/event-stream` an SSE "
        "stream: `id: <seq>`, `event: <type>`, `data: <event JSON>`.",
        "content": {EVENT_STREAM: {"schema": SSE_EVENT}},
    }
}


def _frame(event: Event) -> bytes:
    kind = event.type.replace("\r", " ").replace("\n", " ")
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        event.seq,
        kind.encode("utf-8"),
        msgspec.json.encode(event),
    )


def _error_frame(exc: BaseException, path: str) -> bytes:
    return b"event: error\ndata: %s\n\n" % bytes(problem_for(exc, path).body)


async def _next_batch(state: ServerState, thread_id: str, after: int, timeout: float) -> Any:
    """The next events (``[]`` on timeout), or ``None`` once the server is closing."""
    waiting = asyncio.ensure_future(state.store.wait_events(thread_id, after, BATCH, timeout))
    closing = asyncio.ensure_future(state.closing.wait())
    try:
        await asyncio.wait({waiting, closing}, return_when=asyncio.FIRST_COMPLETED)
        if waiting.done():
            return waiting.result()
        return None
    finally:
        for task in (waiting, closing):
            if not task.done():
                task.cancel()


async def _still_visible(state: ServerState, caller: Caller, thread_id: str) -> bool:
    """Guards a long stream against the thread being deleted and recreated by another
    tenant (whose new events restart at 1)."""
    if caller.operator:
        return True
    snap = await state.store.read(thread_id)
    return snap is not None and snap.version > 0 and snap.tenant == caller.tenant


async def _stream(
    state: ServerState, caller: Caller, thread_id: str, after: int, path: str
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    ends = loop.time() + state.stream_max_seconds if state.stream_max_seconds else None
    while not state.closing.is_set():
        timeout = state.sse_keepalive
        if ends is not None:
            remaining = ends - loop.time()
            if remaining <= 0:
                return
            timeout = min(timeout, remaining)
        try:
            batch = await _next_batch(state, thread_id, after, timeout)
            if batch and not await _still_visible(state, caller, thread_id):
                return
        except WakefulError as exc:
            yield _error_frame(exc, path)
            return
        if batch is None:
            return
        if not batch:
            yield b": keep-alive\n\n"
            continue
        for event in batch:
            yield _frame(event)
            after = event.seq


@router.get(
    "/threads/{thread_id}/events",
    response_model=EventPage,
    responses={**_STREAM_DOC, **errors(404, 410)},
)
async def thread_events(
    thread_id: ThreadId,
    request: Request,
    state: StateDep,
    caller: CallerDep,
    after: SeqCursor = 0,
    limit: Limit = 100,
    last_event_id: Annotated[
        int | None,
        Header(
            alias="Last-Event-ID",
            ge=0,
            le=MAX_SEQ,
            description="Streams only: resume after this seq (takes precedence over `after`).",
        ),
    ] = None,
) -> Any:
    """Events with ``seq > after`` in order. JSON pages by default; an SSE stream that
    follows new events when the request accepts ``text/event-stream``."""
    await visible_thread(state.store, caller, thread_id)
    accept = request.headers.get("accept", "").lower()
    if EVENT_STREAM in accept:
        start = last_event_id if last_event_id is not None else after
        await state.store.events_after(thread_id, start, limit=1)  # 410 before streaming
        return StreamingResponse(
            _stream(state, caller, thread_id, start, request.url.path),
            media_type=EVENT_STREAM,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    rows = await state.store.events_after(thread_id, after, limit)
    return EventPage(
        events=[EventView.model_validate(e, from_attributes=True) for e in rows],
        next_after=rows[-1].seq if rows else after,
    )
