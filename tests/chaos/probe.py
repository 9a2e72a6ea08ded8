"""What runs inside a chaos child: the fault plan (SIGKILL or SIGSTOP of this very process at
an instrumented point) and ``Recording``, a store wrapper that logs every acknowledged write
and every claim granted, with monotonic times the parent can compare across processes
(``CLOCK_MONOTONIC`` is system-wide on Linux)."""

from __future__ import annotations

import inspect
import os
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from tests.chaos import ledger
from wakeful.errors import StoreUnavailable
from wakeful.records import (
    Claim,
    Commit,
    Dispatch,
    Done,
    Lease,
    Outcome,
    Receipt,
    Retry,
    StreamCheckpoint,
)
from wakeful.store.contract import Store
from wakeful.store.memory import InjectedCrash

T = TypeVar("T")
PID = os.getpid()


class Faults:
    """A child's fault plan: ``{"point": P, "match": M, "nth": N, "action": "kill"|"stop"}``.
    The ``N``-th time ``reach(P, detail)`` is called with ``detail == M`` (any detail when
    ``M`` is empty), the fault is recorded in ``faults.jsonl`` and this process sends itself
    SIGKILL (it dies there) or SIGSTOP (it resumes there after SIGCONT)."""

    def __init__(self, directory: Path, plan: dict[str, Any] | None) -> None:
        self.directory = directory
        self.plan = plan or {}
        self.count = 0
        self.fired = False

    def reach(self, point: str, detail: str = "") -> None:
        if self.fired or point != self.plan.get("point"):
            return
        match = self.plan.get("match") or ""
        if match and match != detail:
            return
        self.count += 1
        if self.count < int(self.plan.get("nth", 1)):
            return
        self.fired = True
        fire(self.directory, str(self.plan.get("action", "kill")), point, detail)


def fire(directory: Path, action: str, point: str, detail: str) -> None:
    ledger.append(
        directory / "faults.jsonl",
        {"point": point, "detail": detail, "pid": PID, "action": action, "t": time.monotonic()},
    )
    os.kill(PID, signal.SIGSTOP if action == "stop" else signal.SIGKILL)


def died_of_injected_crash(exc: BaseException) -> bool:
    """The file store stopped at a ``crash_at`` point: behave like the process died there."""
    return isinstance(exc, InjectedCrash) or (
        isinstance(exc, StoreUnavailable) and "injected crash" in str(exc)
    )


class Recording:
    """Wraps a store: acknowledged commits, renewals, settles and stream-checkpoint puts and
    granted claims go to ``acks`` (one fsynced line each, written after the call returned).
    An injected file-store crash surfacing from any call kills the process at once."""

    def __init__(self, store: Store, acks: Path, faults: Faults) -> None:
        self._store = store
        self._acks = acks
        self._faults = faults
        self._threads: dict[str, str] = {}
        self._stream = _RecordingStream(self)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if inspect.iscoroutinefunction(value):

            async def guarded(*args: Any, **kwargs: Any) -> Any:
                return await self._call(value(*args, **kwargs))

            return guarded
        return value

    async def _call(self, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except Exception as exc:
            if died_of_injected_crash(exc):
                fire(self._faults.directory, "kill", "injected-crash", str(exc)[:200])
            raise

    def log(self, record: dict[str, Any]) -> None:
        ledger.append(self._acks, {"pid": PID, **record})

    # ------------------------------------------------------------ recorded writes

    async def claim(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None = None
    ) -> Claim:
        claim = await self._call(self._store.claim(thread_id, holder, ttl, tenant))
        self.log({"op": "grant", "thread": thread_id, "token": claim.token, "t1": time.monotonic()})
        return claim

    async def claim_next(
        self,
        holder: str,
        ttl: float,
        limit: int = 1,
        thread_id: str | None = None,
        *,
        version: str | None = None,
        take_starts: bool = True,
    ) -> list[Lease]:
        call = self._store.claim_next(
            holder, ttl, limit, thread_id, version=version, take_starts=take_starts
        )
        leases = await self._call(call)
        t1 = time.monotonic()
        for lease in leases:
            d = lease.dispatch
            self._threads[d.dispatch_id] = d.thread_id
            self.log(
                {
                    "op": "grant",
                    "thread": d.thread_id,
                    "token": lease.claim.token,
                    "t1": t1,
                    "dispatch": d.dispatch_id,
                    "attempts": d.attempts,
                    "exhausted": lease.exhausted,
                }
            )
        if leases:
            self._faults.reach("claim_next.after")
        return leases

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        t0 = time.monotonic()
        claim = await self._call(self._store.renew(thread_id, token, ttl))
        self.log(
            {"op": "renew", "thread": thread_id, "token": token, "t0": t0, "t1": time.monotonic()}
        )
        return claim

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        self._reach_before(commit)
        t0 = time.monotonic()
        receipt = await self._call(self._store.commit(thread_id, commit))
        self._log_commit(thread_id, commit, commit.token, receipt, t0)
        self._reach_after(commit)
        return receipt

    async def claim_and_commit(
        self, thread_id: str, holder: str, ttl: float, commit: Commit
    ) -> tuple[Claim, Receipt]:
        self._reach_before(commit)
        t0 = time.monotonic()
        claim, receipt = await self._call(
            self._store.claim_and_commit(thread_id, holder, ttl, commit)
        )
        self.log({"op": "grant", "thread": thread_id, "token": claim.token, "t1": time.monotonic()})
        self._log_commit(thread_id, commit, claim.token, receipt, t0)
        self._reach_after(commit)
        return claim, receipt

    def _reach_before(self, commit: Commit) -> None:
        self._faults.reach("commit.before")
        if commit.settle is not None:
            self._faults.reach("settle.before")

    def _reach_after(self, commit: Commit) -> None:
        self._faults.reach("commit.after")
        if commit.settle is not None:
            self._faults.reach("settle.after")

    def _log_commit(
        self, thread_id: str, commit: Commit, token: int, receipt: Receipt, t0: float
    ) -> None:
        t1 = time.monotonic()
        self.log(
            {
                "op": "commit",
                "thread": thread_id,
                "token": token,
                "t0": t0,
                "t1": t1,
                "version": receipt.version,
                "checkpoint": receipt.checkpoint_id,
                "seqs": list(receipt.events),
                "types": [e.type for e in commit.events],
                "messages": [m.id for m in commit.messages],
                "results": [m.tool_call_id for m in commit.messages if m.role == "tool"],
                "tasks": [
                    [e.run_id, e.task_id] for e in commit.events if e.type == "task.completed"
                ],
                "outbox": [[o.target_thread, o.message_id] for o in commit.outbox],
                "consume": list(commit.consume),
                "operation": commit.operation_id,
            }
        )
        if commit.settle is not None:
            self._log_settle(thread_id, commit.settle.dispatch_id, token, commit.settle.outcome, t0)

    def _log_settle(
        self, thread_id: str, dispatch_id: str, token: int, outcome: Outcome, t0: float
    ) -> None:
        kind = (
            "done"
            if isinstance(outcome, Done)
            else "retry"
            if isinstance(outcome, Retry)
            else "awaiting"
        )
        self.log(
            {
                "op": "settle",
                "thread": thread_id,
                "dispatch": dispatch_id,
                "token": token,
                "outcome": kind,
                "t0": t0,
                "t1": time.monotonic(),
            }
        )

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        self._faults.reach("settle.before")
        t0 = time.monotonic()
        settled = await self._call(self._store.settle(dispatch_id, token, outcome))
        self._log_settle(settled.thread_id, dispatch_id, token, outcome, t0)
        self._faults.reach("settle.after")
        return settled

    async def relay_outbox(self, limit: int = 100) -> int:
        handled = await self._call(self._store.relay_outbox(limit))
        if handled:
            self.log({"op": "relay", "handled": handled, "t1": time.monotonic()})
            self._faults.reach("relay.after")
        return handled

    @property
    def stream_checkpoints(self) -> _RecordingStream:
        return self._stream


class _RecordingStream:
    """The stream-checkpoint store, with acknowledged puts recorded."""

    def __init__(self, owner: Recording) -> None:
        self._owner = owner

    def _inner(self) -> Any:
        return self._owner._store.stream_checkpoints

    async def get(self, run_id: str) -> StreamCheckpoint | None:
        result: StreamCheckpoint | None = await self._owner._call(self._inner().get(run_id))
        return result

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        t0 = time.monotonic()
        await self._owner._call(self._inner().put(checkpoint))
        self._owner.log(
            {
                "op": "put",
                "thread": checkpoint.thread_id,
                "token": checkpoint.token,
                "t0": t0,
                "t1": time.monotonic(),
            }
        )

    async def delete(self, run_id: str) -> None:
        await self._owner._call(self._inner().delete(run_id))
