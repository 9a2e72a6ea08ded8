"""The parent's side of a trial: child processes, fresh stores per trial, and a dump of
everything a store holds (what the invariant checks read)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import services
from wakeful import open_store
from wakeful.errors import StoreUnavailable
from wakeful.records import (
    Checkpoint,
    Dispatch,
    Event,
    InboxMessage,
    Message,
    ThreadSnapshot,
)
from wakeful.store.contract import Store

ROOT = Path(__file__).resolve().parents[2]


def wait_until(check: Callable[[], bool], deadline: float, step: float = 0.02) -> bool:
    """Poll ``check`` until it holds (True) or ``deadline`` seconds pass (False)."""
    end = time.monotonic() + deadline
    while True:
        if check():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(step)


class Child:
    """One chaos child process (``tests.chaos.child``); its output goes to a file."""

    def __init__(self, mode: str, url: str, directory: Path, cfg: dict[str, Any]) -> None:
        self.name = str(cfg["name"])
        self.directory = directory
        self.err = directory / f"child-{self.name}.log"
        with self.err.open("ab") as sink:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.chaos.child",
                    mode,
                    url,
                    str(directory),
                    json.dumps(cfg),
                ],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def up(self) -> bool:
        return (self.directory / f"up-{self.name}").exists()

    def stopped(self) -> bool:
        """Whether the process is stopped (state ``T`` in /proc)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def send(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL (works on a stopped process too) and reap."""
        self.send(signal.SIGKILL)
        self.proc.wait(30)

    def wait(self, deadline: float) -> bool:
        try:
            self.proc.wait(deadline)
        except subprocess.TimeoutExpired:
            return False
        return True

    def finish(self, deadline: float) -> bool:
        """Wait for a normal exit; on timeout SIGTERM, then SIGKILL. True if it exited by
        itself with status 0."""
        if self.wait(deadline):
            return self.proc.returncode == 0
        self.send(signal.SIGCONT)
        self.send(signal.SIGTERM)
        if not self.wait(10):
            self.kill()
        return False

    def tail(self, size: int = 1500) -> str:
        try:
            return self.err.read_text(errors="replace")[-size:]
        except OSError:
            return ""


# ---------------------------------------------------------------- stores


def postgres_answers() -> bool:
    try:
        with socket.create_connection((services.POSTGRES_HOST, services.POSTGRES_PORT), 2):
            return True
    except OSError:
        return False


def postgres_url(dbname: str) -> str:
    host, port, user = services.POSTGRES_HOST, services.POSTGRES_PORT, services.POSTGRES_USER
    return f"postgresql://{user}@{host}:{port}/{dbname}"


class Stores:
    """Fresh stores for trials: a file root or SQLite file in the trial's directory, or a
    PostgreSQL database cloned from a template migrated once (``wakeful_chaos_tpl_<pid>``)
    and dropped after the trial."""

    def __init__(self) -> None:
        self._template: str | None = None
        self._databases: list[str] = []
        self._lock = threading.Lock()

    def create(self, kind: str, directory: Path) -> str:
        if kind == "file":
            return (directory / "root").as_uri()
        if kind == "sqlite":
            url = f"sqlite:///{directory / 'store.db'}"
            asyncio.run(_touch(url))  # migrate once, before children race to open it
            return url
        if kind == "postgres":
            return self._clone()
        raise ValueError(kind)

    def dispose(self, url: str) -> None:
        if url.startswith("postgresql"):
            name = url.rsplit("/", 1)[1]
            from tests.postgres_support import drop_database

            drop_database(name)
            with self._lock:
                if name in self._databases:
                    self._databases.remove(name)

    def close(self) -> None:
        from tests.postgres_support import drop_database

        names = [*self._databases, *([self._template] if self._template else [])]
        self._databases, self._template = [], None
        if names:
            drop_database(*names)

    def _clone(self) -> str:
        import psycopg
        from psycopg import sql

        with self._lock:  # trials run in threads: one template for all
            if self._template is None:
                self._template = self._make_template()
        name = f"wakeful_chaos_{uuid.uuid4().hex[:16]}"
        deadline = time.monotonic() + 90
        while True:
            try:
                with psycopg.connect(postgres_url("postgres"), autocommit=True) as admin:
                    admin.execute(
                        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                            sql.Identifier(name), sql.Identifier(self._template)
                        )
                    )
                break
            except psycopg.errors.DuplicateDatabase:
                break  # an earlier attempt did create it before its connection was lost
            except (psycopg.errors.ObjectInUse, psycopg.OperationalError):
                # another clone is being made from the template, or the server is restarting
                # (a pg_restart trial, or another user of the server)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with self._lock:
            self._databases.append(name)
        return postgres_url(name)

    def _make_template(self) -> str:
        import psycopg
        from psycopg import sql

        from tests.postgres_support import drop_database
        from wakeful.store.postgres import migrate

        name = f"wakeful_chaos_tpl_{os.getpid()}"
        drop_database(name)
        with psycopg.connect(postgres_url("postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        asyncio.run(migrate(postgres_url(name), schema="wakeful"))
        return name


async def _touch(url: str) -> None:
    async with open_store(url):
        pass


def store_options(url: str) -> dict[str, Any]:
    if url.startswith("postgresql"):
        return {"pool_size": 2, "pool_min_size": 1, "pool_timeout": 10.0}
    return {}


# ---------------------------------------------------------------- dump


@dataclass
class ThreadDump:
    thread_id: str
    snap: ThreadSnapshot | None
    events: list[Event]
    messages: list[Message]
    checkpoints: list[Checkpoint]
    """Oldest first."""
    inbox: list[InboxMessage]


@dataclass
class Dump:
    threads: dict[str, ThreadDump] = field(default_factory=dict)
    dispatches: dict[str, Dispatch] = field(default_factory=dict)

    def thread(self, thread_id: str) -> ThreadDump:
        return self.threads.get(thread_id) or ThreadDump(thread_id, None, [], [], [], [])

    def signature(self, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """Everything recorded, as comparable values (claims and the workers registry
        excluded: a woken worker may heartbeat and join a relay election legitimately)."""
        result: dict[str, Any] = {}
        for tid, t in sorted(self.threads.items()):
            if tid in skip:
                continue
            result[f"thread {tid}"] = (
                t.snap.version if t.snap else 0,
                [(e.seq, e.type, e.run_id, e.task_id) for e in t.events],
                [m.id for m in t.messages],
                [c.id for c in t.checkpoints],
                sorted(w.task_id for w in (t.snap.writes if t.snap else ())),
                [m.message_id for m in t.inbox],
            )
        for did, d in sorted(self.dispatches.items()):
            result[f"dispatch {did}"] = (d.status, d.attempts, d.token, d.last_error)
        return result


async def dump_store(store: Store, extra: tuple[str, ...] = ()) -> Dump:
    result = Dump()
    after: str | None = None
    while page := await store.list_dispatches(after=after, limit=100):
        for d in page:
            result.dispatches[d.dispatch_id] = d
        after = page[-1].dispatch_id
    ids: set[str] = set(extra) | {d.thread_id for d in result.dispatches.values()}
    cursor: str | None = None
    while summaries := await store.list_threads(after=cursor, limit=100):
        ids.update(s.thread_id for s in summaries)
        cursor = summaries[-1].thread_id
    for tid in sorted(ids):
        events: list[Event] = []
        while page_e := await store.events_after(tid, events[-1].seq if events else 0, 1000):
            events += page_e
        messages: list[Message] = []
        while page_m := await store.messages(tid, len(messages), 1000):
            messages += page_m
        history: list[Checkpoint] = []
        before: str | None = None
        while page_c := await store.checkpoints(tid, before=before, limit=100):
            history += [c for c, _ in page_c]
            before = page_c[-1][0].id
        result.threads[tid] = ThreadDump(
            tid,
            await store.read(tid),
            events,
            messages,
            list(reversed(history)),
            await store.inbox(tid),
        )
    return result


async def read_dump(url: str, extra: tuple[str, ...] = ()) -> Dump:
    """Everything the store holds. Retried while the store is unavailable (a PostgreSQL
    restart by someone else, a SQLite lock held by a process about to be woken)."""
    deadline = time.monotonic() + 90
    while True:
        try:
            async with open_store(url, **store_options(url)) as store:
                return await dump_store(store, extra)
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
