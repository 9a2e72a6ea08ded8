"""Which graph run of this process occupies each LangGraph thread: fencing tasks.

A saver's claim on a thread (``holds``) fences other processes, but every run of this
process shares it. So the saver also records, per thread, the run that occupies it. A run is
the ``Runtime`` object LangGraph puts in the config of every read and write of one
``invoke``/``ainvoke`` (a subgraph's runtime joins the run that was current when the
subgraph read its namespace), started by an asyncio task (``ainvoke``) or an OS thread
(``invoke``): its *owner*.

A run's start (its first read, before any node runs) on a thread that another live run
occupies raises ``ThreadBusy``, exactly as a second process's run does; a write of a run
that is no longer its thread's current run is refused with ``StaleClaim`` and writes
nothing. A run occupies its thread until LangGraph's loop for it exits (the saver adds a
callback to that loop's exit stack: after the loop has waited for its last writes), its
owner ends, the same owner starts another run (one task runs one graph at a time),
``WakefulSaver.release(thread_id)``, or ``idle_release`` seconds pass without a saver call
of the run (the rule a process's automatic claim follows), whichever comes first. The loop
is found as the caller of the run's first read; if a LangGraph version hides it, the other
rules still end the run.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import time
from collections import OrderedDict
from types import FrameType
from typing import Any

from wakeful.errors import StaleClaim, ThreadBusy

RUN_MARKER = "__pregel_runtime"
"""A configurable key LangGraph sets when a graph run (not an inspection) reads its thread."""
Owner = asyncio.Task[Any] | threading.Thread | None
"""What started a run: the task of ``ainvoke``, the OS thread of ``invoke``."""


class RunDisplaced(StaleClaim):
    """A write of a graph run that no longer occupies its thread (another run of this
    process started on it after this one's owner ended or idled past ``idle_release``)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(thread_id, None, None)
        self.args = (
            f"this graph run no longer occupies thread {thread_id!r}: another run of this "
            "process started on it since; this run must stop (nothing of this write was "
            "stored)",
        )


def pregel_loop(depth: int) -> Any:
    """The LangGraph loop (``PregelLoop``) whose entry called the saver ``depth`` frames up,
    or ``None``. Only a run's first read looks (once per run)."""
    try:
        from langgraph.pregel._loop import PregelLoop
    except ImportError:  # pragma: no cover - another LangGraph layout: the other rules hold
        return None
    frame: FrameType | None = sys._getframe(depth + 1)
    for _ in range(4):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, PregelLoop):
            return candidate
        frame = frame.f_back
    return None


def on_exit(loop: Any, callback: Any) -> bool:
    """Call ``callback()`` when LangGraph's ``loop`` exits (its exit stack unwinds)."""
    stack = getattr(loop, "stack", None)
    push = getattr(stack, "callback", None)
    if push is None:
        return False
    push(callback)
    return True


def owner_done(owner: Owner) -> bool:
    if owner is None:
        return True
    if isinstance(owner, threading.Thread):
        return not owner.is_alive()
    return owner.done()


class Run:
    """One graph run on one thread. Holds its runtimes (they cannot be weakly referenced),
    so an ``id`` seen here is never reused by another object while the run is recorded."""

    __slots__ = ("ended", "last_used", "owner", "runtimes")

    def __init__(self, owner: Owner, runtime: Any) -> None:
        self.owner = owner
        self.runtimes = [runtime]
        self.last_used = time.monotonic()
        self.ended = False
        """LangGraph's loop of this run exited. The run stays its thread's current one
        until another starts: it still refuses the writes of a run it displaced."""

    def has(self, runtime: Any) -> bool:
        return any(r is runtime for r in self.runtimes)


class Runs:
    """The current run of each thread. Finished runs are kept (they still fence a run their
    successor displaced while it idled) up to ``keep`` threads, least recently used first
    out; a live run is never dropped."""

    def __init__(self, holder: str, idle_release: float, keep: int) -> None:
        self.holder = holder
        self.idle_release = idle_release
        self.keep = max(1, keep)
        self._runs: OrderedDict[str, Run] = OrderedDict()

    def refuse_busy(self, thread: str, lg_thread: str, runtime: Any, owner: Owner) -> None:
        """Raise ``ThreadBusy`` if another live run of another owner occupies ``thread``."""
        current = self._runs.get(thread)
        if current is not None and not current.has(runtime) and self._occupies(current, owner):
            raise ThreadBusy(lg_thread, self.holder, None)

    def start(self, thread: str, runtime: Any, owner: Owner, loop: Any) -> None:
        """Record the run of ``runtime`` as ``thread``'s current one (after
        ``refuse_busy`` let it start and the thread was claimed); ``loop``: LangGraph's
        loop of the run (``pregel_loop``), whose exit ends it."""
        current = self._runs.get(thread)
        if current is not None and current.has(runtime):
            return
        run = self._runs[thread] = Run(owner, runtime)
        self._runs.move_to_end(thread)
        if loop is not None:
            on_exit(loop, functools.partial(setattr, run, "ended", True))
        self._trim()

    def join(self, thread: str, runtime: Any) -> None:
        """A subgraph of the current run read its namespace: its writes are the run's."""
        current = self._runs.get(thread)
        if current is not None and not current.has(runtime):
            current.runtimes.append(runtime)

    def check(self, thread: str, lg_thread: str, runtime: Any, caller: Owner) -> None:
        """Refuse (``StaleClaim``) a write of a run that is not ``thread``'s current run,
        and (``ThreadBusy``) a write outside any run (no runtime: ``update_state``, direct
        saver calls) while a live run of another owner than ``caller`` (the writing task
        or thread) occupies the thread: it would branch the thread, or add to its
        history, under that run (another process is refused by the claim)."""
        current = self._runs.get(thread)
        if current is None:
            return
        if runtime is None:
            if self._occupies(current, caller):
                raise ThreadBusy(lg_thread, self.holder, None)
            return
        if not current.has(runtime):
            raise RunDisplaced(lg_thread)
        current.last_used = time.monotonic()

    def end(self, thread: str) -> None:
        self._runs.pop(thread, None)

    def fence(self, thread: str) -> None:
        """Displace every run of ``thread`` so far: until the next run starts, their writes
        are refused (``RunDisplaced``) and none of them keeps it busy. The thread's claim
        changed hands within this process (``WakefulSaver.adopt``: a worker's new lease)."""
        run = Run(None, object())
        run.ended = True
        self._runs[thread] = run
        self._runs.move_to_end(thread)
        self._trim()

    def _occupies(self, run: Run, starter: Owner) -> bool:
        if run.ended or run.owner is starter or owner_done(run.owner):
            return False
        return time.monotonic() - run.last_used < self.idle_release

    def _trim(self) -> None:
        if len(self._runs) <= self.keep:
            return
        for thread in [t for t, r in self._runs.items() if r.ended or owner_done(r.owner)]:
            del self._runs[thread]
            if len(self._runs) <= self.keep:
                return
