"""``wakeful langgraph import``: threads written by LangGraph's own ``AsyncSqliteSaver`` and
``AsyncPostgresSaver`` are copied into a wakeful store, where ``WakefulSaver`` lists exactly
what the source saver lists and resumes the graphs to the same results; the import is
resumable and incremental, leaves threads that ran on wakeful since alone, refuses pickles
unless allowed, skips busy threads, and reports bad input as one ``error:`` line with its
exit code."""

from __future__ import annotations

import json
import operator
import os
import pty
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from tests.postgres_support import Databases
from wakeful import open_store
from wakeful.errors import InvalidState
from wakeful.langgraph import WakefulSaver
from wakeful.langgraph.importing import import_threads
from wakeful.langgraph.sources import SourceThread, open_source

pytest_plugins = ["tests.postgres_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
WAKEFUL = str(Path(sys.executable).parent / "wakeful")
ODD = "odd id ä/1"
"""A LangGraph thread id outside wakeful's id alphabet."""


class Chat(TypedDict):
    log: Annotated[list[str], operator.add]
    messages: Annotated[list[AnyMessage], add_messages]


def chat_graph() -> StateGraph[Any]:
    """START -> child (a subgraph: its own namespace) -> ask (interrupts) -> END; messages
    are LangChain objects (stored through the serializer, not as plain JSON)."""

    def inner(state: Chat) -> dict[str, Any]:
        return {"log": ["inner"], "messages": [AIMessage("from the subgraph", id="m-inner")]}

    sub = StateGraph(Chat)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)

    def ask(state: Chat) -> dict[str, Any]:
        answer = interrupt({"question": "ship it?"})
        return {"log": [f"answer:{answer}"], "messages": [HumanMessage(answer, id="m-answer")]}

    builder = StateGraph(Chat)
    builder.add_node("child", sub.compile())
    builder.add_node("ask", ask)
    builder.add_edge(START, "child")
    builder.add_edge("child", "ask")
    builder.add_edge("ask", END)
    return builder


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def flaky_graph(broken: dict[str, bool], calls: list[str]) -> StateGraph[Any]:
    """START -> steady, fragile (one superstep) -> END; fragile fails while broken."""

    def steady(state: Log) -> dict[str, Any]:
        calls.append("steady")
        return {"log": ["steady"]}

    def fragile(state: Log) -> dict[str, Any]:
        calls.append("fragile")
        if broken["now"]:
            raise RuntimeError("fragile is broken")
        return {"log": ["fragile"]}

    builder = StateGraph(Log)
    builder.add_node("steady", steady)
    builder.add_node("fragile", fragile)
    builder.add_edge(START, "steady")
    builder.add_edge(START, "fragile")
    builder.add_edge("steady", END)
    builder.add_edge("fragile", END)
    return builder


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def cli(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "WAKEFUL_STORE": store}
    return subprocess.run(
        [WAKEFUL, *args], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )


def imported(url: str, *args: str, store: str, code: int = 0) -> dict[str, Any]:
    done = cli("langgraph", "import", "--from", url, "--json", *args, store=store)
    assert done.returncode == code, done.stderr
    assert done.stderr == "", "--json prints the summary only"
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


async def listing(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[Any]:
    return [t async for t in saver.alist(config(thread_id))]


@asynccontextmanager
async def source_saver(url: str, **options: Any) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """LangGraph's own async saver on ``url`` (sqlite:///path or a PostgreSQL DSN)."""
    if url.startswith("sqlite:///"):
        async with AsyncSqliteSaver.from_conn_string(url.removeprefix("sqlite:///")) as s:
            if options:
                s.serde = options["serde"]
            yield s
    else:
        async with AsyncPostgresSaver.from_conn_string(url) as pg:
            await pg.setup()
            yield pg


@pytest.mark.asyncio
async def test_sqlite_saver_threads_list_and_resume_as_on_the_source(tmp_path: Path) -> None:
    await _import_list_resume(
        f"sqlite:///{tmp_path / 'langgraph.db'}", f"sqlite:///{tmp_path / 'wakeful.db'}"
    )


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_postgres_saver_threads_list_and_resume_as_on_the_source(
    pg_databases: Databases,
) -> None:
    # PostgresSaver's tables (schema public) and the wakeful store share one database.
    dsn = await pg_databases.clone()
    await _import_list_resume(dsn, dsn)


async def _import_list_resume(source: str, target: str) -> None:
    broken = {"now": True}
    async with source_saver(source) as src:
        chat = chat_graph().compile(checkpointer=src)
        for thread in ("t-1", ODD):
            await chat.ainvoke({"log": [], "messages": []}, config(thread))
        with pytest.raises(RuntimeError, match="fragile is broken"):
            await (
                flaky_graph(broken, [])
                .compile(checkpointer=src)
                .ainvoke({"log": []}, config("flaky"))
            )
        before = {t: await listing(src, t) for t in ("t-1", ODD, "flaky")}
    first = {t: len(before[t]) for t in before}
    assert all(n >= 2 for n in first.values()), first
    assert any(x.config["configurable"]["checkpoint_ns"] for x in before["t-1"]), "a subgraph"

    # one thread first (an interrupted import), then the rest
    part = imported(source, "--thread", "t-1", store=target)
    assert (part["threads"], part["imported"], part["checkpoints"]) == (1, 1, first["t-1"])
    rest = imported(source, store=target)
    assert (rest["threads"], rest["imported"], rest["unchanged"]) == (3, 2, 1)
    assert rest["checkpoints"] == first[ODD] + first["flaky"]
    assert rest["writes"] == sum(len(t.pending_writes or []) for t in before[ODD] + before["flaky"])
    async with WakefulSaver.from_url(target) as wk:
        for thread, listed in before.items():
            assert await listing(wk, thread) == listed, thread

        # resume on wakeful ...
        calls_wk: list[str] = []
        broken["now"] = False
        answer_wk = (
            await chat_graph()
            .compile(checkpointer=wk)
            .ainvoke(Command(resume="yes"), config("t-1"))
        )
        fixed_wk = (
            await flaky_graph(broken, calls_wk)
            .compile(checkpointer=wk)
            .ainvoke(None, config("flaky"))
        )
    # ... and on the source: the same results, and the saved write was not redone
    calls_src: list[str] = []
    async with source_saver(source) as src:
        answer_src = (
            await chat_graph()
            .compile(checkpointer=src)
            .ainvoke(Command(resume="yes"), config("t-1"))
        )
        fixed_src = (
            await flaky_graph(broken, calls_src)
            .compile(checkpointer=src)
            .ainvoke(None, config("flaky"))
        )
        moved_on = (
            await chat_graph()
            .compile(checkpointer=src)
            .ainvoke(Command(resume="later"), config(ODD))
        )
        after = await listing(src, ODD)
    assert answer_wk == answer_src and answer_wk["log"] == ["inner", "answer:yes"]
    assert [m.id for m in answer_wk["messages"]] == ["m-inner", "m-answer"]
    assert fixed_wk == fixed_src and sorted(fixed_wk["log"]) == ["fragile", "steady"]
    assert calls_wk == calls_src == ["fragile"], "steady's saved write was reused"
    assert moved_on["log"] == ["inner", "answer:later"]

    # again: the source's new checkpoints of ODD arrive; threads that ran on wakeful since
    # are left alone (exit 4, named in the summary)
    again = imported(source, store=target, code=4)
    assert sorted(again["skipped"]) == ["flaky", "t-1"]
    assert all("diverged" in why for why in again["skipped"].values())
    assert (again["imported"], again["checkpoints"]) == (1, len(after) - first[ODD])
    async with WakefulSaver.from_url(target) as wk:
        assert await listing(wk, ODD) == after
        resumed = await wk.aget_tuple(config("t-1"))
        assert resumed is not None and resumed.checkpoint["channel_values"]["log"] == [
            "inner",
            "answer:yes",
        ]


class Truncated:
    """A source whose threads end after their first ``keep`` checkpoints (an import cut
    short, or a source that has moved on since)."""

    def __init__(self, inner: Any, keep: int) -> None:
        self.inner, self.keep, self.description = inner, keep, inner.description

    async def thread_ids(self) -> list[str]:
        ids: list[str] = await self.inner.thread_ids()
        return ids

    async def read(self, thread_id: str) -> SourceThread:
        thread: SourceThread = await self.inner.read(thread_id)
        kept = thread.checkpoints[: self.keep]
        ids = {c.id for c in kept}
        return SourceThread(thread_id, kept, [w for w in thread.writes if w.checkpoint_id in ids])


@pytest.mark.asyncio
async def test_a_cut_short_thread_is_completed_one_commit_per_checkpoint(tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path / 'langgraph.db'}"
    async with source_saver(source) as src:
        await (
            chat_graph()
            .compile(checkpointer=src)
            .ainvoke({"log": [], "messages": []}, config("t-1"))
        )
        expected = await listing(src, "t-1")
    async with open_source(source) as reader, WakefulSaver.from_url("memory://") as wk:
        cut = await import_threads(Truncated(reader, 2), wk, batch_bytes=1)
        assert (cut.checkpoints, cut.commits) == (2, 2)
        rest = await import_threads(reader, wk, batch_bytes=1)
        assert (rest.checkpoints, rest.commits) == (len(expected) - 2, len(expected) - 2)
        assert await listing(wk, "t-1") == expected
        records = await wk.store.checkpoints("t-1", limit=1000)
        assert len(records) == len(expected), "one record per checkpoint with its writes"
        whole = await import_threads(reader, wk)
        assert (whole.unchanged, whole.commits) == (1, 0)


class Odd(TypedDict):
    z: complex


@pytest.mark.asyncio
async def test_pickles_are_refused_unless_allowed_and_busy_threads_skipped(tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path / 'langgraph.db'}"
    target = f"sqlite:///{tmp_path / 'wakeful.db'}"
    pickling = JsonPlusSerializer(pickle_fallback=True)
    builder = StateGraph(Odd)
    builder.add_node("square", lambda state: {"z": state["z"] * state["z"]})
    builder.add_edge(START, "square")
    builder.add_edge("square", END)
    async with source_saver(source, serde=pickling) as src:
        for thread in ("a-held", "b-pickled"):
            await builder.compile(checkpointer=src).ainvoke({"z": complex(1, 1)}, config(thread))

    refused = cli("langgraph", "import", "--from", source, store=target)
    assert refused.returncode == 6
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error:") and "--allow-pickle" in line and "pickled" in line

    async with open_store(target) as store:
        await store.claim("a-held", "someone-else", 60)
    summary = imported(source, "--allow-pickle", store=target, code=4)
    assert list(summary["skipped"]) == ["a-held"] and "someone-else" in summary["skipped"]["a-held"]
    assert summary["imported"] == 1
    async with WakefulSaver.from_url(target, allow_pickle=True) as trusting:
        tup = await trusting.aget_tuple(config("b-pickled"))
        assert tup is not None and tup.checkpoint["channel_values"]["z"] == complex(0, 2)
    async with WakefulSaver.from_url(target) as careful:
        with pytest.raises(InvalidState, match="pickled"):
            await careful.aget_tuple(config("b-pickled"))


def test_bad_input_is_one_error_line_with_its_exit_code(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'wakeful.db'}"
    not_langgraph = tmp_path / "other.db"
    not_langgraph.write_bytes(b"")
    empty = tmp_path / "empty-langgraph.db"
    with closing(sqlite3.connect(empty)) as conn:
        SqliteSaver(conn).setup()
    cases = [
        ("mysql://localhost/db", 6, "not a LangGraph database URL"),
        (f"sqlite:///{tmp_path / 'missing.db'}", 3, "does not exist"),
        (f"sqlite:///{not_langgraph}", 6, "no LangGraph SqliteSaver tables"),
        ("postgresql://postgres@127.0.0.1:1/none", 5, "did not answer"),
        (f"sqlite:///{empty}", 3, "'nope' does not exist"),
    ]
    for url, code, message in cases:
        done = cli("langgraph", "import", "--from", url, "--thread", "nope", store=store)
        assert done.returncode == code, (url, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("error:") and message in line, line
        assert done.stdout == ""


def test_a_terminal_gets_a_progress_bar_and_a_summary(tmp_path: Path) -> None:
    import asyncio

    source = f"sqlite:///{tmp_path / 'langgraph.db'}"

    async def prepare() -> None:
        async with source_saver(source) as src:
            graph = chat_graph().compile(checkpointer=src)
            for thread in ("t-1", "t-2"):
                await graph.ainvoke({"log": [], "messages": []}, config(thread))

    asyncio.run(prepare())
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    args = [WAKEFUL, "langgraph", "import", "--from", source]
    args += ["--store", f"sqlite:///{tmp_path / 'wakeful.db'}"]
    with subprocess.Popen(args, stdout=follower, stderr=follower, env=env, cwd=ROOT) as proc:
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the pty closes when the process exits
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(timeout=60) == 0
    os.close(leader)
    text = shown.decode("utf-8", "replace")
    assert "importing" in text and "2/2" in text, text
    assert "threads imported" in text and "checkpoints added" in text


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_pending_sends_of_old_postgres_checkpoints_migrate_as_postgres_saver_reads_them(
    pg_databases: Databases,
) -> None:
    """A checkpoint of format < 4 kept its pending sends as its parent's ``TASKS`` writes;
    ``PostgresSaver`` moves them into the checkpoint when it reads it, and so does the
    import."""
    import psycopg
    from langgraph.types import Send

    dsn = await pg_databases.clone()
    async with source_saver(dsn) as src:
        await (
            chat_graph()
            .compile(checkpointer=src)
            .ainvoke({"log": [], "messages": []}, config("old"))
        )
        root = [
            t for t in await listing(src, "old") if not t.config["configurable"]["checkpoint_ns"]
        ]
        newest, parent = root[0], root[1]
        kind, blob = src.serde.dumps_typed(Send("ask", {"log": ["sent"]}))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{v}', '3') "
            "WHERE thread_id = 'old' AND checkpoint_id = %s",
            (newest.config["configurable"]["checkpoint_id"],),
        )
        await conn.execute(
            "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
            "task_path, idx, channel, type, blob) VALUES ('old', '', %s, 'sender', '', 0, "
            "'__pregel_tasks', %s, %s)",
            (parent.config["configurable"]["checkpoint_id"], kind, blob),
        )
    async with source_saver(dsn) as src:
        expected = await listing(src, "old")
    migrated = next(t for t in expected if t.config == newest.config)
    assert migrated.checkpoint["channel_values"]["__pregel_tasks"] == [
        Send("ask", {"log": ["sent"]})
    ]
    summary = imported(dsn, store=dsn)
    assert summary["imported"] == 1
    async with WakefulSaver.from_url(dsn) as wk:
        assert await listing(wk, "old") == expected
