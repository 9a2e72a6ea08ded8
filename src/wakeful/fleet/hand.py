"""The Remote Hand: tools executed by a separate service that remembers every operation.

The service keeps an idempotency ledger (``wakeful.fleet.ledger``) keyed by the caller's
operation id, and answers ``POST /v1/calls`` with one of three outcomes:

- ``done`` / ``error``: the tool ran (now or before) and its result or error is recorded;
  a retry with the same operation id returns that record and does not run the tool again.
- ``indeterminate``: the ledger shows the call started but never finished: the process
  running it died mid-call. The tool is NOT run again; whether its effect happened is
  unknown.

Reusing an operation id for another tool or other arguments fails closed (HTTP 409).

The client, ``RemoteHand``, retries a request that never reached the hand (connection
refused) and resolves one that may have (the connection dropped after sending, a timeout, a
5xx) by the SAME operation id, so a lost answer costs a lookup, never a second effect, and
is never reported as a failure. An agent tool passes its ``ctx``: the operation id is
``ctx.idempotency_key`` (deterministic per call, the same after a recovery) and the tool's
replay policy says whether the call may be sent again. A call whose outcome stays unknown
raises ``HandIndeterminate`` (an ``OutcomeUnknown``), which the agent records
``indeterminate``::

    hand = RemoteHand("http://127.0.0.1:8700")

    @tool(replay="keyed")
    async def charge(amount: int, ctx: ToolContext) -> Any:
        return await hand.call("charge", {"amount": amount}, ctx=ctx)

The errors live in ``wakeful.fleet.handerrors`` and are importable from here. The service's
HTTP face, ``create_app`` and ``serve_hand``, is ``wakeful.fleet.handserver``: it imports
this module, never the other way round, so a client does not load FastAPI and uvicorn.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

import httpx
import msgspec

from wakeful.backoff import backoff_delay
from wakeful.errors import InvalidInput, InvalidState
from wakeful.fleet.handerrors import (
    HandConflict,
    HandError,
    HandIndeterminate,
    HandOutcomeUnknown,
    HandRejected,
    HandUnavailable,
    UnknownTool,
)
from wakeful.fleet.ledger import Ledger, LedgerEntry
from wakeful.ids import check_id

if TYPE_CHECKING:
    from wakeful.agent.tools import Replay, ToolContext

log = logging.getLogger("wakeful.fleet.hand")

__all__ = [
    "MAX_ARGUMENTS_BYTES",
    "MAX_RESULT_BYTES",
    "RECOVERY_WINDOW",
    "CallOutcome",
    "HandConflict",
    "HandError",
    "HandIndeterminate",
    "HandOutcomeUnknown",
    "HandRejected",
    "HandService",
    "HandUnavailable",
    "RemoteHand",
    "UnknownTool",
    "canonical_arguments",
]

MAX_ARGUMENTS_BYTES = 1024 * 1024
MAX_RESULT_BYTES = 8 * 1024 * 1024

Status = Literal["done", "error", "indeterminate"]


# --------------------------------------------------------------------------- service


@dataclass(frozen=True)
class CallOutcome:
    operation_id: str
    tool: str
    status: Status
    result: Any = None
    error: str | None = None
    replayed: bool = False
    """True when the answer came from an earlier execution (or a concurrent one)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "operation_id": self.operation_id,
            "tool": self.tool,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "replayed": self.replayed,
        }


def canonical_arguments(arguments: object) -> str:
    """Arguments as canonical JSON (sorted keys, no spaces), the form the ledger compares."""
    if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
        raise InvalidInput("arguments", "must be a JSON object")
    try:
        raw = msgspec.json.encode(arguments, order="sorted")
    except (TypeError, ValueError) as exc:
        raise InvalidInput("arguments", f"are not JSON: {exc}") from None
    if len(raw) > MAX_ARGUMENTS_BYTES:
        raise InvalidInput("arguments", f"are {len(raw)} bytes; the limit is {MAX_ARGUMENTS_BYTES}")
    return raw.decode()


def _outcome(entry: LedgerEntry, *, replayed: bool) -> CallOutcome:
    if entry.status == "started":
        status: Status = "indeterminate"
    else:
        status = "error" if entry.error is not None else "done"
    result = None if entry.result is None else msgspec.json.decode(entry.result)
    return CallOutcome(entry.operation_id, entry.tool, status, result, entry.error, replayed)


class HandService:
    """Executes tools at most once per operation id, recorded in a SQLite ledger.

    One service (one process) owns a ledger file: the ledger's lock refuses a second. A
    ``started`` record is either running in this service (a retry then waits for it and
    gets its result) or was left by a process that died (the retry gets ``indeterminate``).
    Sync tools run in a worker thread, async tools on the loop; a tool gets the request's
    arguments as keyword arguments."""

    def __init__(self, ledger_path: str | Path, tools: Mapping[str, Callable[..., Any]]) -> None:
        for name in tools:
            check_id("tool name", name)
        self.tools = dict(tools)
        self.ledger = Ledger(ledger_path)
        self._running: dict[str, tuple[str, str, asyncio.Task[CallOutcome]]] = {}
        self._closed = False

    async def execute(
        self, operation_id: str, tool: str, arguments: Mapping[str, Any]
    ) -> CallOutcome:
        check_id("operation_id", operation_id)
        check_id("tool", tool)
        canonical = canonical_arguments(dict(arguments))
        running = self._running.get(operation_id)
        if running is not None:
            if running[:2] != (tool, canonical):
                raise HandConflict(operation_id, f"it is running as {running[0]!r}")
            return replace(await asyncio.shield(running[2]), replayed=True)
        if self._closed:
            raise InvalidState("hand service", str(self.ledger.path), "closed", "call another")
        task = asyncio.create_task(self._execute(operation_id, tool, canonical, dict(arguments)))
        entry = (tool, canonical, task)
        self._running[operation_id] = entry

        def forget(_: object) -> None:
            if self._running.get(operation_id) is entry:
                del self._running[operation_id]

        task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _execute(
        self, operation_id: str, tool: str, canonical: str, arguments: dict[str, Any]
    ) -> CallOutcome:
        entry = await asyncio.to_thread(self.ledger.get, operation_id)
        if entry is not None:
            if (entry.tool, entry.arguments) != (tool, canonical):
                raise HandConflict(operation_id, f"it was recorded as {entry.tool!r}")
            return _outcome(entry, replayed=True)
        fn = self.tools.get(tool)
        if fn is None:
            raise UnknownTool(tool)
        # Committed before the tool runs: if this process dies from here on, a retry finds
        # ``started`` without a result and answers ``indeterminate`` instead of running again.
        await asyncio.to_thread(self.ledger.start, operation_id, tool, canonical)
        result: str | None = None
        error: str | None = None
        try:
            value = await _invoke(fn, arguments)
            encoded = msgspec.json.encode(value)
            if len(encoded) > MAX_RESULT_BYTES:
                raise ValueError(f"the result is {len(encoded)} bytes; limit {MAX_RESULT_BYTES}")
            result = encoded.decode()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.info("hand: operation %r (%s) failed: %s", operation_id, tool, error)
        done = await asyncio.to_thread(self.ledger.finish, operation_id, result, error)
        return _outcome(done, replayed=False)

    async def lookup(self, operation_id: str) -> dict[str, Any] | None:
        """The ledger's record with its state (``running`` in this service, ``done``,
        ``error`` or ``indeterminate``), or None."""
        check_id("operation_id", operation_id)
        entry = await asyncio.to_thread(self.ledger.get, operation_id)
        if entry is None:
            return None
        state = (
            "running" if operation_id in self._running else _outcome(entry, replayed=True).status
        )
        return {
            "operation_id": entry.operation_id,
            "tool": entry.tool,
            "arguments": msgspec.json.decode(entry.arguments),
            "status": state,
            "result": None if entry.result is None else msgspec.json.decode(entry.result),
            "error": entry.error,
            "started_at": entry.started_at,
            "finished_at": entry.finished_at,
        }

    async def aclose(self) -> None:
        """Refuse new calls, wait for the running ones, close the ledger; idempotent."""
        self._closed = True
        while self._running:
            await asyncio.gather(*(t for _, _, t in self._running.values()), return_exceptions=True)
        await asyncio.to_thread(self.ledger.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _invoke(fn: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(**arguments)
    value = await asyncio.to_thread(fn, **arguments)
    if inspect.isawaitable(value):
        return await value
    return value


# --------------------------------------------------------------------------- client

RECOVERY_WINDOW = 30.0
"""Default seconds ``RemoteHand`` keeps asking about a call that may have reached the hand:
a hand restart takes a few seconds; this leaves room for a slow one."""

NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
"""Transport failures raised before any byte of the request left: the hand never saw it."""

NOT_SENT_STATUSES = frozenset({429})
"""Answers that refuse a request without processing it, retried like a refused connection.
Every 5xx may come after the request reached the hand (or a proxy passed it on)."""

MIN_ATTEMPT_TIMEOUT = 1.0
"""The shortest timeout a resolving attempt gets, even at the end of the window."""

RESOLVE_INTERVAL = 1.0
"""The most a resolving client waits between attempts (or ``max_backoff`` if smaller): a
restarted hand is asked within a second of listening again."""


@dataclass(frozen=True)
class _Lost:
    """An attempt without a usable answer; ``sent`` when the request may have reached the
    hand (so it may have run)."""

    sent: bool
    detail: str


class RemoteHand:
    """A client of a hand service. ``call`` returns the tool's result or raises
    ``HandError``, ``HandIndeterminate``, ``HandConflict``, ``HandRejected``,
    ``HandUnavailable`` (the call provably never reached the hand, ``attempts`` times) or
    ``HandOutcomeUnknown`` (it may have reached the hand, which did not say what became of
    it within ``recovery_window`` seconds).

    A call that may have reached the hand (sent, then the connection dropped or reset, the
    answer timed out, or a 5xx came back) is resolved by its operation id, with backoff
    from ``backoff`` to at most ``RESOLVE_INTERVAL`` (1 s), until the hand answers or
    ``recovery_window`` ends (each attempt then bounded by the time left, at least 1 s):
    a ``keyed`` (or ``safe``) call is sent again (the ledger never runs an operation id
    twice: it answers the recorded outcome or waits for the running call); a ``never``
    call is not sent again, only looked up (``GET /v1/calls/<op>``): the ledger's ``done``,
    ``error`` or ``indeterminate`` is the answer, ``running`` and "no record yet" (the
    request may still be on its way) mean ask again.

    ``timeout`` bounds each attempt (a tool that runs longer is not run twice: the retry
    waits for the running call). Pass ``client`` to share an ``httpx.AsyncClient`` (it is
    not closed here); otherwise one is made and ``aclose`` closes it. ``token`` is sent
    as ``Authorization: Bearer <token>`` (a hand with tokens refuses calls without one:
    ``HandRejected`` 401, the tool did not run)."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        token: str | None = None,
        timeout: float = 60.0,
        attempts: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        recovery_window: float = RECOVERY_WINDOW,
    ) -> None:
        if attempts < 1:
            raise InvalidInput("attempts", "must be at least 1")
        if recovery_window < 0:
            raise InvalidInput("recovery_window", "must be at least 0 seconds")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.recovery_window = recovery_window
        self._owns_client = client is None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client if client is not None else httpx.AsyncClient(timeout=timeout)
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self.monotonic: Callable[[], float] = time.monotonic

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        operation_id: str | None = None,
        ctx: ToolContext | None = None,
        replay: Replay | None = None,
    ) -> Any:
        """Run ``tool`` on the hand once per operation id. Inside an agent tool pass
        ``ctx``: its ``idempotency_key`` is the operation id and its ``replay`` policy says
        how a call that may have reached the hand is resolved. Without ``ctx`` pass
        ``operation_id`` (and ``replay``, ``keyed`` by default)."""
        operation_id, policy = _identity(operation_id, ctx, replay)
        check_id("tool", tool)
        canonical = canonical_arguments(dict(arguments))
        body = {"operation_id": operation_id, "tool": tool, "arguments": dict(arguments)}
        sent = await self._send("POST", "/v1/calls", operation_id, body)
        if isinstance(sent, _Lost):
            log.warning(
                "remote hand: operation %r (%s) may have reached the hand (%s); resolving it "
                "by its operation id for up to %g s",
                operation_id,
                tool,
                sent.detail,
                self.recovery_window,
            )
            answer = await self._resolve(policy, operation_id, tool, canonical, body, sent.detail)
        else:
            answer = _answer(sent, operation_id)
        if answer is None or not isinstance(answer, dict):
            raise HandRejected(200, "the answer is not a JSON object")
        status = answer.get("status")
        if status == "done":
            return answer.get("result")
        if status == "error":
            raise HandError(operation_id, tool, str(answer.get("error")))
        if status == "indeterminate":
            raise HandIndeterminate(operation_id, tool)
        raise HandRejected(200, f"unknown status {status!r}")

    async def lookup(self, operation_id: str) -> dict[str, Any] | None:
        """The hand's record of an operation (see ``HandService.lookup``), or None."""
        check_id("operation_id", operation_id)
        sent = await self._send("GET", f"/v1/calls/{operation_id}", operation_id, None)
        if isinstance(sent, _Lost):  # a lookup is read-only: _send retries every failure
            raise HandUnavailable(operation_id, self.attempts, sent.detail)
        answer = _answer(sent, operation_id)
        return answer if isinstance(answer, dict) else None

    async def _exchange(
        self, method: str, path: str, body: Any, timeout: float
    ) -> httpx.Response | _Lost:
        try:
            response = await self._client.request(
                method, self.base_url + path, json=body, timeout=timeout, headers=self._headers
            )
        except NOT_SENT as exc:
            return _Lost(False, _describe(exc))
        except httpx.TransportError as exc:
            return _Lost(True, _describe(exc))
        if response.status_code in NOT_SENT_STATUSES:
            return _Lost(False, f"HTTP {response.status_code}: {_problem_detail(response)}")
        if response.status_code >= 500:
            return _Lost(True, f"HTTP {response.status_code}: {_problem_detail(response)}")
        return response

    async def _send(
        self, method: str, path: str, operation_id: str, body: Any
    ) -> httpx.Response | _Lost:
        """The answer, retried up to ``attempts`` times while the request provably did not
        reach the hand; a POST that may have reached it is returned as ``_Lost`` at once
        (resolving it is ``_resolve``'s). Raises ``HandUnavailable``."""
        lost = _Lost(False, "")
        for attempt in range(1, self.attempts + 1):
            outcome = await self._exchange(method, path, body, self.timeout)
            if isinstance(outcome, httpx.Response):
                return outcome
            lost = outcome
            if lost.sent and method == "POST":
                return lost
            log.info(
                "remote hand: attempt %d for %r failed: %s", attempt, operation_id, lost.detail
            )
            if attempt < self.attempts:
                await self.sleep(self._backoff(attempt))
        raise HandUnavailable(operation_id, self.attempts, lost.detail)

    async def _resolve(
        self,
        policy: Literal["keyed", "never"],
        operation_id: str,
        tool: str,
        canonical: str,
        body: Any,
        detail: str,
    ) -> Any:
        """Ask the hand about a call that may have reached it until it answers or the
        recovery window ends (then ``HandOutcomeUnknown``)."""
        deadline = self.monotonic() + self.recovery_window
        attempt = 0
        while True:
            attempt += 1
            pause = min(self._backoff(attempt), RESOLVE_INTERVAL)
            await self.sleep(min(pause, max(0.0, deadline - self.monotonic())))
            timeout = min(self.timeout, max(MIN_ATTEMPT_TIMEOUT, deadline - self.monotonic()))
            if policy == "keyed":
                outcome = await self._exchange("POST", "/v1/calls", body, timeout)
                if isinstance(outcome, httpx.Response):
                    return _answer(outcome, operation_id)
                state = outcome.detail
            else:
                path = f"/v1/calls/{operation_id}"
                outcome = await self._exchange("GET", path, None, timeout)
                if isinstance(outcome, httpx.Response):
                    record = _answer(outcome, operation_id)
                    if isinstance(record, dict):
                        _check_same_call(record, operation_id, tool, canonical)
                        if record.get("status") != "running":
                            return record
                        state = "it is still running on the hand"
                    else:
                        state = "the hand has no record of it (yet)"
                else:
                    state = outcome.detail
            log.info("remote hand: resolving %r, attempt %d: %s", operation_id, attempt, state)
            if self.monotonic() >= deadline:
                raise HandOutcomeUnknown(operation_id, tool, self.recovery_window, detail)

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, self.backoff, self.max_backoff)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _identity(
    operation_id: str | None, ctx: ToolContext | None, replay: str | None
) -> tuple[str, Literal["keyed", "never"]]:
    """The operation id and how to resolve a lost answer: ``never`` only for a ``never``
    policy (``safe`` calls may be sent again like ``keyed`` ones)."""
    if ctx is not None:
        if operation_id is not None and operation_id != ctx.idempotency_key:
            raise InvalidInput(
                "operation_id", "differs from ctx.idempotency_key; pass one or the other"
            )
        operation_id = ctx.idempotency_key
        replay = replay if replay is not None else ctx.replay
    if operation_id is None:
        raise InvalidInput("operation_id", "is required (or pass the tool's ctx)")
    check_id("operation_id", operation_id)
    if replay is not None and replay not in ("safe", "keyed", "never"):
        raise InvalidInput("replay", "must be 'safe', 'keyed' or 'never'")
    return operation_id, "never" if replay == "never" else "keyed"


def _check_same_call(record: dict[str, Any], operation_id: str, tool: str, canonical: str) -> None:
    try:
        same = (
            record.get("tool") == tool and canonical_arguments(record.get("arguments")) == canonical
        )
    except InvalidInput:
        same = False
    if not same:
        raise HandConflict(operation_id, f"it was recorded as {record.get('tool')!r}")


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _problem_detail(response: httpx.Response) -> str:
    try:
        problem = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(problem, dict):
        return str(problem.get("detail") or problem.get("title") or problem)[:500]
    return str(problem)[:200]


def _answer(response: httpx.Response, operation_id: str) -> Any:
    if response.status_code == 404 and response.request.method == "GET":
        return None
    if response.status_code == 409:
        raise HandConflict(operation_id, _problem_detail(response))
    if response.status_code != 200:
        raise HandRejected(response.status_code, _problem_detail(response))
    try:
        return response.json()
    except ValueError:
        raise HandRejected(200, "the answer is not JSON") from None
