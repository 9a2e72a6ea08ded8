"""``Client``: the HTTP API from Python (async). See ``docs/client.md``.

Every route has a method, grouped as the API groups them: ``threads``, ``runs``,
``messages``, ``events``, ``dispatches``, ``workers``, ``schedules`` and the operator's
``quarantine``.
Answers are the API's JSON documents as dicts. Errors are the library's exceptions
(``wakeful.client.problems``). Every POST carries an ``Idempotency-Key`` (the caller's, else
a fresh one per call), and a POST whose answer was lost (a connection error, a 503) is sent
again with the same key, so a retry never starts a second run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import httpx

from wakeful.client.problems import error_for
from wakeful.client.streams import EVENT_STREAM, Backoff, Stream
from wakeful.errors import StoreUnavailable

DEFAULT_MODES = ("events", "messages")
REQUEST_RETRIES = 3
"""Sends of one request at most when the connection fails or the store is unavailable."""


class Client:
    """``Client(base_url, token=None)``; use ``async with`` or ``await client.aclose()``.

    ``transport``: an httpx transport (tests); ``backoff``: how streams and retried
    requests wait between attempts."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        backoff: Backoff | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        merged = dict(headers or {})
        if token is not None:
            merged["Authorization"] = f"Bearer {token}"
        self.backoff = backoff or Backoff()
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=merged,
            timeout=httpx.Timeout(timeout, read=None),
            transport=transport,
        )
        self.threads = Threads(self)
        self.runs = Runs(self)
        self.messages = Messages(self)
        self.events = Events(self)
        self.dispatches = Dispatches(self)
        self.workers = Workers(self)
        self.quarantine = Quarantine(self)
        self.schedules = Schedules(self)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        retry: bool = True,
    ) -> Any:
        """Send one request and return the decoded answer (``None`` for 204); a problem
        raises its exception. POSTs get an ``Idempotency-Key`` and are retried with it;
        ``retry=False`` sends once (a write the key does not deduplicate)."""
        headers: dict[str, str] = {}
        if method == "POST":
            headers["Idempotency-Key"] = idempotency_key or f"k-{uuid.uuid4().hex}"
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        failures = 0
        while True:
            try:
                response = await self.http.request(
                    method, path, json=json, params=clean, headers=headers
                )
                if response.status_code == 503:
                    raise error_for(503, _decode(response))
                break
            except (httpx.TransportError, StoreUnavailable):
                failures += 1
                if failures >= REQUEST_RETRIES or not retry or method not in ("GET", "POST"):
                    raise
                await asyncio.sleep(self.backoff.delay(failures))
        if response.status_code >= 400:
            raise error_for(response.status_code, _decode(response))
        if response.status_code == 204:
            return None
        return response.json()

    def stream(
        self,
        thread_id: str,
        *,
        modes: Sequence[str] = DEFAULT_MODES,
        after: int | str = 0,
        run_id: str | None = None,
    ) -> Stream:
        """``GET /v1/threads/{id}/stream``: the thread in ``modes``, starting after the
        durable event ``after`` (or a frame id). With ``run_id`` it ends after that run's
        terminal event."""
        params = {"modes": ",".join(modes), "run_id": run_id}
        path = f"/v1/threads/{thread_id}/stream"

        async def open_(last_id: str | None) -> httpx.Response:
            resume = last_id if last_id is not None else str(after)
            return await self._open("GET", path, params, {"Last-Event-ID": resume})

        return Stream(open_, open_, self.backoff)

    async def _open(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any],
        headers: Mapping[str, str],
        json: Any = None,
    ) -> httpx.Response:
        request = self.http.build_request(
            method,
            path,
            params={k: v for k, v in params.items() if v is not None},
            headers={"Accept": EVENT_STREAM, **headers},
            json=json,
        )
        return await self.http.send(request, stream=True)


def _decode(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


class _Group:
    def __init__(self, client: Client) -> None:
        self.client = client


class Threads(_Group):
    async def list(
        self,
        *,
        after: str | None = None,
        limit: int = 100,
        tenant: str | None = None,
        internal: bool = False,
    ) -> Any:
        """``GET /v1/threads``: a page (``threads``, ``next_after``); ``internal``: with the
        fleet's own threads (webhook deliveries), left out by default."""
        params: dict[str, Any] = {"after": after, "limit": limit, "tenant": tenant}
        if internal:
            params["internal"] = "true"
        return await self.client.request("GET", "/v1/threads", params=params)

    async def get(self, thread_id: str) -> Any:
        return await self.client.request("GET", f"/v1/threads/{thread_id}")

    async def messages(self, thread_id: str, *, after: int = 0, limit: int = 100) -> Any:
        params = {"after": after, "limit": limit}
        return await self.client.request("GET", f"/v1/threads/{thread_id}/messages", params=params)

    async def runs(self, thread_id: str, *, before: str | None = None, limit: int = 20) -> Any:
        params = {"before": before, "limit": limit}
        return await self.client.request("GET", f"/v1/threads/{thread_id}/runs", params=params)

    async def children(self, thread_id: str, *, run_id: str | None = None) -> Any:
        """The child runs the thread's runs spawned, each with its status."""
        path = f"/v1/threads/{thread_id}/children"
        return await self.client.request("GET", path, params={"run_id": run_id})

    def stream(
        self,
        thread_id: str,
        *,
        modes: Sequence[str] = DEFAULT_MODES,
        after: int | str = 0,
        run_id: str | None = None,
    ) -> Stream:
        return self.client.stream(thread_id, modes=modes, after=after, run_id=run_id)

    async def history(self, thread_id: str, *, before: str | None = None, limit: int = 50) -> Any:
        """``GET /v1/threads/{id}/history``: checkpoints newest first (``entries``: run,
        step, nodes, status, parent, branch, ``current``, ``head``), the thread's
        ``branches`` and ``next_before`` (pass it as ``before`` for older ones)."""
        params = {"before": before, "limit": limit}
        return await self.client.request("GET", f"/v1/threads/{thread_id}/history", params=params)

    async def checkpoint(
        self, thread_id: str, checkpoint_id: str, *, after: int = 0, limit: int = 100
    ) -> Any:
        """``GET /v1/threads/{id}/checkpoints/{cp}``: one checkpoint in full (``entry``,
        ``state``, ``frontier``, ``metadata``) and the ``messages`` as of it (paged:
        ``next_after``)."""
        params = {"after": after, "limit": limit}
        path = f"/v1/threads/{thread_id}/checkpoints/{checkpoint_id}"
        return await self.client.request("GET", path, params=params)

    async def update_state(
        self,
        thread_id: str,
        values: Mapping[str, Any],
        *,
        as_node: str | None = None,
        checkpoint_id: str | None = None,
    ) -> Any:
        """``POST /v1/threads/{id}/state``: commit a checkpoint whose state is ``values``
        applied through the graph's reducers (as if ``as_node`` returned them), on the head
        or on ``checkpoint_id`` (which branches); answers the new checkpoint. Sent once:
        the write is not deduplicated, so a lost answer is not retried."""
        body = {"values": dict(values), "as_node": as_node, "checkpoint_id": checkpoint_id}
        return await self.client.request(
            "POST", f"/v1/threads/{thread_id}/state", json=body, retry=False
        )

    async def fork(
        self, thread_id: str, new_thread_id: str, *, checkpoint_id: str | None = None
    ) -> Any:
        """``POST /v1/threads/{id}/fork``: a new thread equal to this one as of
        ``checkpoint_id`` (default: the head); answers the new thread. ``InvalidState`` when
        ``new_thread_id`` already has history. Sent once (a retry after a lost answer would
        find the fork made and be refused)."""
        body = {"new_thread_id": new_thread_id, "checkpoint_id": checkpoint_id}
        return await self.client.request(
            "POST", f"/v1/threads/{thread_id}/fork", json=body, retry=False
        )


class Runs(_Group):
    async def create(
        self,
        thread_id: str,
        target: str,
        input: Any = None,
        *,
        priority: int = 0,
        max_attempts: int = 5,
        idempotency_key: str | None = None,
        after: float | timedelta | None = None,
        at: datetime | None = None,
        from_checkpoint: str | None = None,
        if_busy: str | None = None,
        webhook: str | None = None,
        debounce: float | timedelta | None = None,
    ) -> Any:
        """``POST /v1/threads/{id}/runs``: the ``Accepted`` document (``run_id``, and
        ``queued_behind`` while the thread is busy). ``after`` (seconds or a ``timedelta``,
        by the store's clock) or ``at`` (an aware datetime) delays the run; the answer's
        ``not_before`` says until when. ``from_checkpoint``: replay from that checkpoint of
        the thread (time travel; from an earlier one the thread branches).
        ``if_busy``: ``"enqueue"`` (the server's default), ``"reject"`` (``ThreadBusy`` naming
        the busy ``run_id``), ``"interrupt"``, ``"rollback"`` or ``"coalesce"``
        (docs/busy-threads.md). ``webhook``: a URL the fleet POSTs a signed JSON body to when
        the run ends or suspends on a question (docs/composition.md). ``debounce`` (seconds or
        a ``timedelta``): a burst of submissions of ``target`` to the thread within the window
        starts one run with the last input; the answer names that run's dispatch
        (docs/flow-control.md#debounce)."""
        body = _run_body(target, input, priority, max_attempts, from_checkpoint, webhook)
        if after is not None:
            body["after"] = after.total_seconds() if isinstance(after, timedelta) else after
        if debounce is not None:
            seconds = debounce.total_seconds() if isinstance(debounce, timedelta) else debounce
            body["debounce"] = seconds
        if at is not None:
            body["at"] = at.isoformat()
        if if_busy is not None:
            body["if_busy"] = if_busy
        return await self.client.request(
            "POST", f"/v1/threads/{thread_id}/runs", json=body, idempotency_key=idempotency_key
        )

    def stream(
        self,
        thread_id: str,
        target: str,
        input: Any = None,
        *,
        modes: Sequence[str] = DEFAULT_MODES,
        priority: int = 0,
        max_attempts: int = 5,
        idempotency_key: str | None = None,
        from_checkpoint: str | None = None,
        webhook: str | None = None,
    ) -> Stream:
        """``POST /v1/threads/{id}/runs/stream``: start a run and stream it until its end.
        The first frame (``metadata``) is the ``Accepted`` document. After a lost connection
        the stream resumes with ``GET .../stream?run_id=...``; a connection lost before any
        frame sends the POST again with the same ``Idempotency-Key`` (one run, whatever
        happens)."""
        key = idempotency_key or f"k-{uuid.uuid4().hex}"
        body = _run_body(target, input, priority, max_attempts, from_checkpoint, webhook)
        post_path = f"/v1/threads/{thread_id}/runs/stream"
        get_path = f"/v1/threads/{thread_id}/stream"
        params: dict[str, Any] = {"modes": ",".join(modes)}

        async def first(last_id: str | None) -> httpx.Response:
            headers = {"Idempotency-Key": key}
            return await self.client._open("POST", post_path, params, headers, json=body)

        async def again(last_id: str | None) -> httpx.Response:
            run_id = stream.metadata.get("run_id") if stream.metadata else None
            if last_id is None or run_id is None:
                return await first(last_id)
            query = {**params, "run_id": run_id}
            return await self.client._open("GET", get_path, query, {"Last-Event-ID": last_id})

        stream = Stream(first, again, self.client.backoff)
        return stream

    async def wait(self, thread_id: str, run_id: str, *, after: int = 0) -> Any:
        """Wait until the run ends (completed, suspended, failed, cancelled or
        indeterminate) and return the thread (``GET /v1/threads/{id}``) as it is then."""
        stream = self.client.stream(thread_id, modes=("events",), after=after, run_id=run_id)
        async with stream:
            async for _frame in stream:
                pass
        return await self.client.threads.get(thread_id)

    async def resume(
        self, thread_id: str, answers: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Any:
        """``POST /v1/threads/{id}/resume``: answer tickets of the suspended run."""
        return await self.client.request(
            "POST",
            f"/v1/threads/{thread_id}/resume",
            json={"answers": dict(answers)},
            idempotency_key=idempotency_key,
        )

    async def cancel(self, thread_id: str, reason: str = "cancelled") -> Any:
        """``POST /v1/threads/{id}/cancel``."""
        return await self.client.request(
            "POST", f"/v1/threads/{thread_id}/cancel", json={"reason": reason}
        )

    async def regenerate(
        self, thread_id: str, *, target: str | None = None, idempotency_key: str | None = None
    ) -> Any:
        """``POST /v1/threads/{id}/regenerate``: the thread's agent (or ``target``) answers
        its last user message again, on a new branch."""
        body = {"target": target} if target is not None else {}
        return await self.client.request(
            "POST",
            f"/v1/threads/{thread_id}/regenerate",
            json=body,
            idempotency_key=idempotency_key,
        )


def _run_body(
    target: str,
    input: Any,
    priority: int,
    max_attempts: int,
    from_checkpoint: str | None,
    webhook: str | None = None,
) -> dict[str, Any]:
    body = {"target": target, "input": input, "priority": priority, "max_attempts": max_attempts}
    if from_checkpoint is not None:
        body["from_checkpoint"] = from_checkpoint
    if webhook is not None:
        body["webhook"] = webhook
    return body


class Messages(_Group):
    async def send(
        self,
        thread_id: str,
        payload: Any,
        *,
        message_id: str | None = None,
        target: str | None = None,
        correlation_id: str | None = None,
        idempotency_key: str | None = None,
        if_busy: str | None = None,
    ) -> Any:
        """``POST /v1/threads/{id}/messages``: deliver a message (once per ``message_id``);
        ``if_busy`` as ``runs.create`` takes it."""
        body = {
            "payload": payload,
            "message_id": message_id,
            "target": target,
            "correlation_id": correlation_id,
            "if_busy": if_busy,
        }
        return await self.client.request(
            "POST",
            f"/v1/threads/{thread_id}/messages",
            json={k: v for k, v in body.items() if v is not None or k == "payload"},
            idempotency_key=idempotency_key,
        )

    async def edit(
        self,
        thread_id: str,
        message_id: str,
        content: str,
        *,
        target: str | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """``POST /v1/threads/{id}/messages/{message_id}/edit``: run the thread's agent (or
        ``target``) on from this user message with ``content`` instead, on a new branch."""
        body: dict[str, Any] = {"content": content}
        if target is not None:
            body["target"] = target
        return await self.client.request(
            "POST",
            f"/v1/threads/{thread_id}/messages/{message_id}/edit",
            json=body,
            idempotency_key=idempotency_key,
        )


class Events(_Group):
    async def list(self, thread_id: str, *, after: int = 0, limit: int = 100) -> Any:
        """``GET /v1/threads/{id}/events``: a page (``events``, ``next_after``)."""
        params = {"after": after, "limit": limit}
        return await self.client.request("GET", f"/v1/threads/{thread_id}/events", params=params)

    def follow(self, thread_id: str, *, after: int = 0) -> Stream:
        """The thread's durable events after ``after``, for ever (``events`` route, SSE),
        reconnecting with ``Last-Event-ID``. Each frame's ``data`` is the event."""
        path = f"/v1/threads/{thread_id}/events"

        async def open_(last_id: str | None) -> httpx.Response:
            resume = last_id if last_id is not None else str(after)
            return await self.client._open("GET", path, {}, {"Last-Event-ID": resume})

        return Stream(open_, open_, self.client.backoff, ends_on=frozenset())


class Dispatches(_Group):
    async def list(
        self,
        *,
        status: str | None = None,
        thread_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> Any:
        params = {"status": status, "thread_id": thread_id, "after": after, "limit": limit}
        return await self.client.request("GET", "/v1/dispatches", params=params)

    async def get(self, dispatch_id: str) -> Any:
        return await self.client.request("GET", f"/v1/dispatches/{dispatch_id}")


class Schedules(_Group):
    """``/v1/schedules``: the caller's schedules (docs/schedules.md)."""

    async def put(self, name: str, target: str, **definition: Any) -> Any:
        """``PUT /v1/schedules/{name}``: create or replace; ``definition`` holds ``cron`` or
        ``every``, ``thread`` or ``thread_template``, and optionally ``input``,
        ``timezone``, ``overlap``, ``catch_up``, ``max_catch_up``, ``paused``."""
        body = {"target": target, **definition}
        return await self.client.request("PUT", f"/v1/schedules/{name}", json=body)

    async def list(self, *, after: str | None = None, limit: int = 100) -> Any:
        params = {"after": after, "limit": limit}
        return await self.client.request("GET", "/v1/schedules", params=params)

    async def get(self, name: str) -> Any:
        return await self.client.request("GET", f"/v1/schedules/{name}")

    async def pause(self, name: str) -> Any:
        return await self.client.request("POST", f"/v1/schedules/{name}/pause")

    async def resume(self, name: str) -> Any:
        return await self.client.request("POST", f"/v1/schedules/{name}/resume")

    async def trigger(self, name: str) -> Any:
        """``POST /v1/schedules/{name}/trigger``: fire once now (``Accepted``)."""
        return await self.client.request("POST", f"/v1/schedules/{name}/trigger")

    async def delete(self, name: str) -> None:
        await self.client.request("DELETE", f"/v1/schedules/{name}")


class Workers(_Group):
    async def list(self) -> Any:
        return await self.client.request("GET", "/v1/workers")


class Quarantine(_Group):
    """Operator routes (a tenant token gets ``RequestRefused`` with status 403)."""

    async def park(self, dispatch_id: str) -> Any:
        """``POST /v1/dispatches/{id}/quarantine``: park exhausted work."""
        return await self.client.request("POST", f"/v1/dispatches/{dispatch_id}/quarantine")

    async def list(self, *, after: str | None = None, limit: int = 100) -> Any:
        params = {"after": after, "limit": limit}
        return await self.client.request("GET", "/v1/quarantine", params=params)

    async def get(self, dispatch_id: str) -> Any:
        """``GET /v1/quarantine/{id}``: the dispatch and its thread."""
        return await self.client.request("GET", f"/v1/quarantine/{dispatch_id}")

    async def requeue(self, dispatch_id: str) -> Any:
        return await self.client.request("POST", f"/v1/quarantine/{dispatch_id}/requeue")

    async def purge(self, dispatch_id: str) -> None:
        await self.client.request("DELETE", f"/v1/quarantine/{dispatch_id}")


__all__ = [
    "Client",
    "Dispatches",
    "Events",
    "Messages",
    "Quarantine",
    "Runs",
    "Schedules",
    "Threads",
    "Workers",
]
