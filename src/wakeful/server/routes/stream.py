"""Thread streams: ``GET /v1/threads/{id}/stream`` and ``POST /v1/threads/{id}/runs/stream``.

One Server-Sent Events stream carries the modes a client asks for: ``events`` (the durable
events, as the events route sends them), ``updates`` (each finished task's writes),
``values`` (the state after each superstep), all three from the commits, and ``messages``
(the in-flight assistant message: ``messages/delta``, ``messages/tool``, ``messages/reset``
from the live channel and the stream checkpoint; ``messages/complete`` from the commit).
Frame ids and resuming are described in ``wakeful.server.streamframes``; the follower shared
by a thread's clients in ``wakeful.server.feeds``.

Buffering is bounded per client: durable frames are read ``BATCH`` events at a time and
written before the next read, and message frames are the difference between what the client
has and the current message (a client that falls behind gets one larger frame, never a
queue). What the socket does not take waits in the server's transport buffer (flow control
suspends the stream until the client reads).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from wakeful.errors import WakefulError
from wakeful.records import Event
from wakeful.server.access import CallerDep, ServerState, StateDep, visible_thread
from wakeful.server.auth import Caller
from wakeful.server.feeds import Feed
from wakeful.server.inflight import Cursor
from wakeful.server.problems import problem_for
from wakeful.server.routes import runs
from wakeful.server.routes.params import IdempotencyKey, SeqCursor, ThreadId
from wakeful.server.schemas import ID_PATTERN, MAX_ID, SSE_EVENT, SubmitRun
from wakeful.server.streamframes import (
    CURSOR_PATTERN,
    MODES,
    TERMINAL,
    StreamCursor,
    ValuesOf,
    durable_parts,
    frame,
    parse_cursor,
    parse_modes,
    tag,
)
from wakeful.server.views import errors

router = APIRouter(prefix="/v1", tags=["streams"])

EVENT_STREAM = "text/event-stream"
BATCH = 100
CATCH_UP = 5.0
"""Seconds a new ``messages`` client waits for the thread's follower to reach its start."""
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A Server-Sent Events stream of the modes asked for (see the HTTP API "
        "reference, Streams).",
        "content": {EVENT_STREAM: {"schema": SSE_EVENT}},
    }
}

_MODE = "(" + "|".join(MODES) + ")"
MODES_PATTERN = f"^({_MODE}(,{_MODE})*)?$"  # empty: the default modes

Modes = Annotated[
    str | None,
    Query(
        max_length=200,
        # documented, not enforced by pydantic: the route's own check names the unknown mode
        json_schema_extra={"pattern": MODES_PATTERN},
        description=f"Comma-separated stream modes: {', '.join(MODES)} (default "
        "events,messages). An unknown mode is 422.",
    ),
]
LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        max_length=64,
        # documented, not enforced by pydantic: parse_cursor's refusal says what an id is
        json_schema_extra={"pattern": CURSOR_PATTERN},
        description="Resume after this frame id (takes precedence over `after`).",
    ),
]


def _encode(data: Any) -> bytes:
    return data if isinstance(data, bytes) else msgspec.json.encode(data)


class _Stream:
    """One client's stream over a thread's feed."""

    def __init__(
        self,
        state: ServerState,
        caller: Caller,
        thread_id: str,
        modes: tuple[str, ...],
        cursor: StreamCursor,
        path: str,
        until_run: str | None,
    ) -> None:
        self.state = state
        self.caller = caller
        self.thread_id = thread_id
        self.modes = modes
        self.messages = "messages" in modes
        self.position = cursor.after
        self.skip = (cursor.after + 1, cursor.skip_parts) if cursor.skip_parts else None
        self.path = path
        self.until_run = until_run
        self.cursor = Cursor(resume=(cursor.tag, cursor.offset) if cursor.tag else None)
        self.joined_at = cursor.after
        self.ended = False

    async def frames(self, first: bytes | None = None) -> AsyncIterator[bytes]:
        feeds = self.state.feeds
        feed = await feeds.acquire(self.thread_id, messages=self.messages)
        try:
            if first is not None:
                yield first
            async for chunk in self._follow(feed):
                yield chunk
        finally:
            feeds.release(feed, messages=self.messages)

    async def _follow(self, feed: Feed) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        limit = self.state.stream_max_seconds
        ends = loop.time() + limit if limit else None
        catch_up_until = loop.time() + CATCH_UP
        while not self.state.closing.is_set() and not self.ended:
            changed = feed.changed
            if feed.gone:
                return  # the thread was deleted (or is another tenant's now): reconnect
            sent = False
            if self.position < feed.seen_seq:
                before = self.position
                try:
                    async for chunk in self._durable(feed):
                        yield chunk
                except WakefulError as exc:
                    yield b"event: error\ndata: %s\n\n" % bytes(problem_for(exc, self.path).body)
                    return
                if self.position > before:
                    continue
            if self.messages and (feed.seen_seq >= self.joined_at or loop.time() > catch_up_until):
                for kind, data in self.cursor.sync(feed.tracker, tag):
                    sent = True
                    fid = f"{self.position}/{tag(data['message_id'])}/{self.cursor.text}"
                    yield frame(fid, f"messages/{kind}", _encode(data))
            if sent:
                continue
            timeout = self.state.sse_keepalive
            if ends is not None:
                remaining = ends - loop.time()
                if remaining <= 0:
                    return
                timeout = min(timeout, remaining)
            closing = asyncio.ensure_future(self.state.closing.wait())
            waiting = asyncio.ensure_future(changed.wait())
            try:
                done, _ = await asyncio.wait(
                    {closing, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                closing.cancel()
                waiting.cancel()
            if not done:
                yield b": keep-alive\n\n"

    async def _durable(self, feed: Feed) -> AsyncIterator[bytes]:
        events = feed.events_after(self.position, BATCH)
        if events is None:
            events = await self.state.store.events_after(self.thread_id, self.position, BATCH)
        for event in events:
            async for chunk in self._event(feed, event):
                yield chunk
            self.position = event.seq
            if self.ended:
                return

    async def _event(self, feed: Feed, event: Event) -> AsyncIterator[bytes]:
        parts = durable_parts(event, self.modes)
        ending = (
            self.until_run is not None and event.run_id == self.until_run and event.type in TERMINAL
        )
        if ending:
            parts.append(("end", {"run_id": event.run_id, "type": event.type, "seq": event.seq}))
        skip = self.skip[1] if self.skip is not None and self.skip[0] == event.seq else 0
        self.skip = None
        for index, (name, data) in enumerate(parts):
            if index < skip:
                continue
            if isinstance(data, ValuesOf):
                found, values = await feed.state_at(str(event.checkpoint_id))
                data = data.body(found, values)
            fid = str(event.seq) if index == len(parts) - 1 else f"{event.seq}.{index}"
            yield frame(fid, name, _encode(data))
        if event.type == "message.completed" and isinstance(event.data, dict):
            self.cursor.done.add(str(event.data.get("message_id")))
        if ending:
            self.ended = True


def _start(last_event_id: str | None, after: int) -> StreamCursor:
    if last_event_id is not None:
        return parse_cursor(last_event_id)
    return StreamCursor(after=after)


@router.get("/threads/{thread_id}/stream", responses={**_DOC, **errors(404, 410, 422)})
async def stream_thread(
    thread_id: ThreadId,
    request: Request,
    state: StateDep,
    caller: CallerDep,
    modes: Modes = None,
    after: SeqCursor = 0,
    run_id: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=MAX_ID,
            description="End the stream (with an `end` frame) after this run's terminal event.",
        ),
    ] = None,
    last_event_id: LastEventId = None,
) -> Any:
    """Stream the thread in the given modes, starting after ``Last-Event-ID`` (any frame id
    this stream sent) or else after the durable event ``after``."""
    chosen = parse_modes(modes)
    cursor = _start(last_event_id, after)
    await visible_thread(state.store, caller, thread_id)
    await state.store.events_after(thread_id, cursor.after, limit=1)  # 410 before streaming
    stream = _Stream(state, caller, thread_id, chosen, cursor, request.url.path, run_id)
    return StreamingResponse(stream.frames(), media_type=EVENT_STREAM, headers=HEADERS)


@router.post(
    "/threads/{thread_id}/runs/stream",
    responses={**_DOC, **errors(404, 409, 413, 422)},
)
async def submit_and_stream(
    thread_id: ThreadId,
    body: SubmitRun,
    request: Request,
    state: StateDep,
    caller: CallerDep,
    modes: Modes = None,
    idempotency_key: IdempotencyKey = None,
    last_event_id: LastEventId = None,
) -> Any:
    """Start a run as ``POST .../runs`` does and answer with its stream, which ends after
    the run's terminal event (an ``end`` frame). It starts after the thread's last event at
    the time of the request, or after ``Last-Event-ID`` when given (a client retrying with
    the same ``Idempotency-Key`` after a lost response). The first frame, ``metadata``,
    carries what ``POST .../runs`` answers."""
    chosen = parse_modes(modes)
    snap = await state.store.read(thread_id)
    cursor = _start(last_event_id, snap.last_seq if snap is not None else 0)
    response = Response()
    accepted = await runs.submit_run(
        thread_id, body, state, caller, response, idempotency_key=idempotency_key
    )
    metadata = {**accepted.model_dump(mode="json"), "modes": list(chosen)}
    first = frame(str(cursor.after), "metadata", msgspec.json.encode(metadata))
    stream = _Stream(state, caller, thread_id, chosen, cursor, request.url.path, accepted.run_id)
    headers = {**HEADERS, "Location": response.headers.get("Location", "")}
    return StreamingResponse(stream.frames(first), media_type=EVENT_STREAM, headers=headers)
