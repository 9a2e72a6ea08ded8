"""Tools: schemas and validation, errors as results, replay policies after a SIGKILL between
a tool's start and its recorded result, approvals across a process restart."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.agent_child import approval_agent, tools_agent
from tests.runtime_support import kill_when_ready, store_url
from wakeful import ManualClock, open_store
from wakeful.agent import INDETERMINATE, Agent, ToolContext, tool
from wakeful.errors import OutcomeUnknown
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.runtime import ClaimPolicy, Runtime
from wakeful.store.memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent


def test_schema_comes_from_the_signature() -> None:
    @tool(replay="keyed")
    def book(city: str, nights: int = 1, tags: list[str] | None = None) -> str:
        """Book a hotel.

        More details the model does not need."""
        return city

    spec = book.spec
    assert spec.name == "book" and spec.description == "Book a hotel."
    assert spec.parameters["type"] == "object"
    assert spec.parameters["required"] == ["city"]
    assert spec.parameters["properties"]["nights"]["type"] == "integer"
    assert book.replay == "keyed" and not book.approval
    assert book.parse('{"city": "Oslo"}') == {"city": "Oslo", "nights": 1, "tags": None}


@pytest.mark.parametrize(
    "raw", ['{"city": "Os', '{"nights": 2}', '{"city": 5}', "[1]", '{"city": "x", "zzz": 1}']
)
def test_incomplete_or_invalid_arguments_are_refused(raw: str) -> None:
    from wakeful.agent import ArgumentsInvalid

    @tool
    def book(city: str, nights: int = 1) -> str:
        """Book."""
        return city

    with pytest.raises(ArgumentsInvalid):
        book.parse(raw)


@pytest.mark.asyncio
async def test_invalid_arguments_never_execute_and_errors_become_results() -> None:
    ran: list[str] = []

    @tool
    def book(city: str) -> str:
        """Book."""
        ran.append(city)
        if city == "Nowhere":
            raise LookupError("no such city")
        return "booked"

    provider = Scripted.of(
        calls(
            ("c1", "book", '{"city": 7}'),
            ("c2", "book", {"city": "Nowhere"}),
            ("c3", "missing_tool", {}),
        ),
        reply("Sorry."),
    )
    store = MemoryStore(ManualClock())
    result = await Agent("a", provider, tools=[book]).run(Runtime(store), "t", "book")
    assert result.text == "Sorry." and ran == ["Nowhere"]
    results = {m.tool_call_id: m for m in await store.messages("t") if m.role == "tool"}
    assert results["c1"].metadata["outcome"] == "invalid" and "not run" in str(
        results["c1"].content
    )
    assert results["c2"].metadata["outcome"] == "error" and "no such city" in str(
        results["c2"].content
    )
    assert results["c3"].metadata["outcome"] == "invalid"
    assert [m.role for m in provider.requests[1].messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
    ]


@pytest.mark.asyncio
async def test_an_unknown_outcome_is_recorded_indeterminate_whatever_the_policy() -> None:
    """Regression (issue 26): a keyed tool that returned ``INDETERMINATE`` was stored with
    outcome ``ok`` and no ``tool.indeterminate`` event; one that raised an ``OutcomeUnknown``
    was stored as an ``error``, inviting the model to call again under a new key."""
    seen: list[tuple[str, str]] = []

    @tool(replay="keyed")
    def charge(n: int, ctx: ToolContext) -> str:
        """Charge."""
        seen.append(("charge", ctx.replay))
        return INDETERMINATE

    @tool(replay="never")
    def email(n: int, ctx: ToolContext) -> str:
        """Email."""
        seen.append(("email", ctx.replay))
        raise OutcomeUnknown("the mail server hung up after DATA")

    @tool
    def lookup(n: int) -> str:
        """Look up."""
        return "found"

    provider = Scripted.of(
        calls(("c1", "charge", {"n": 1}), ("c2", "email", {"n": 2}), ("c3", "lookup", {"n": 3})),
        reply("Told them."),
    )
    store = MemoryStore(ManualClock())
    agent = Agent("a", provider, tools=[charge, email, lookup])
    assert (await agent.run(Runtime(store), "t", "go")).text == "Told them."
    results = {m.tool_call_id: m for m in await store.messages("t") if m.role == "tool"}
    outcomes = {c: (m.metadata["outcome"], m.content) for c, m in results.items()}
    assert outcomes == {
        "c1": ("indeterminate", INDETERMINATE),
        "c2": ("indeterminate", INDETERMINATE),
        "c3": ("ok", "found"),
    }
    flagged = [e.data for e in await store.events_after("t", 0) if e.type == "tool.indeterminate"]
    assert sorted(flagged, key=lambda d: str(d["call_id"])) == [
        {"call_id": "c1", "tool": "charge"},
        {"call_id": "c2", "tool": "email"},
    ]
    assert sorted(seen) == [("charge", "keyed"), ("email", "never")]


@pytest.mark.asyncio
async def test_the_step_limit_stops_the_agent() -> None:
    @tool
    def again() -> str:
        """Loop."""
        return "more"

    provider = Scripted.of(*[calls((f"c{i}", "again", {})) for i in range(5)])
    store = MemoryStore(ManualClock())
    result = await Agent("a", provider, tools=[again], max_steps=3).run(Runtime(store), "t", "go")
    assert result.status == "completed" and result.stopped == "max_steps"
    assert len(provider.requests) == 3
    types = [e.type for e in await store.events_after("t", 0, 1000)]
    assert "agent.step_limit" in types


def start_child(mode: str, url: str, directory: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.agent_child", mode, url, str(directory)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_replay_policies_after_a_sigkill_between_start_and_result(
    kind: str, tmp_path: Path
) -> None:
    url = store_url(kind, tmp_path)
    ready = [tmp_path / f"{name}.started" for name in ("safe", "keyed", "never")]
    argv = ["tests.agent_child", "tools", url, str(tmp_path)]
    await asyncio.to_thread(kill_when_ready, argv, ready)

    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="parent")
        agent = tools_agent(tmp_path, hang=False)
        agent.model = Scripted.of(reply("All three handled."))
        result = await agent.recover(runtime, "t")
        assert result.status == "completed" and result.text == "All three handled."
        effects = [line.split() for line in (tmp_path / "effects.txt").read_text().splitlines()]
        by_name: dict[str, list[str]] = {}
        for name, key in effects:
            by_name.setdefault(name, []).append(key)
        assert len(by_name["safe"]) == 2, "safe: ran again"
        assert len(by_name["keyed"]) == 2 and len(set(by_name["keyed"])) == 1, "keyed: same key"
        assert len(by_name["never"]) == 1, "never: not run again"
        tools = {m.tool_call_id: m for m in await store.messages("t", 0, 100) if m.role == "tool"}
        assert tools["c-never"].content == INDETERMINATE
        assert tools["c-never"].metadata["outcome"] == "indeterminate"
        assert tools["c-safe"].content == "safe done" and tools["c-keyed"].content == "keyed done"
        roles = [m.role for m in await store.messages("t", 0, 100)]
        assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    finally:
        await store.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_approval_suspends_and_resumes_across_a_process_restart(
    kind: str, tmp_path: Path
) -> None:
    url = store_url(kind, tmp_path)
    child = start_child("approval", url, tmp_path)
    rc = await asyncio.to_thread(child.wait, 60)
    stderr = child.stderr.read() if child.stderr else b""
    if child.stderr:
        child.stderr.close()
    assert rc == 0, stderr
    ticket = (tmp_path / "suspended").read_text()
    assert not (tmp_path / "effects.txt").exists(), "nothing ran before approval"

    store = await open_store(url)
    try:
        runtime = Runtime(store, holder="parent")
        agent = approval_agent(tmp_path)
        agent.model = Scripted.of(reply("Transferred."))
        snap = await store.read("t")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.status == "suspended"
        result = await agent.resume(runtime, "t", {ticket: "approve"})
        assert result.status == "completed" and result.text == "Transferred."
        assert (tmp_path / "effects.txt").read_text().split() == ["transfer", "100"]
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_denial_becomes_the_tool_result() -> None:
    ran: list[int] = []

    @tool(approval=True)
    def transfer(amount: int) -> str:
        """Move money."""
        ran.append(amount)
        return "moved"

    provider = Scripted.of(calls(("c1", "transfer", {"amount": 5})), reply("Not moved."))
    store = MemoryStore(ManualClock())
    agent = Agent("bank", provider, tools=[transfer])
    runtime = Runtime(store)
    first = await agent.run(runtime, "t", "pay")
    assert first.status == "suspended" and first.approvals[0].arguments == {"amount": 5}
    done = await agent.resume(
        runtime, "t", {first.approvals[0].ticket_id: {"approve": False, "reason": "too much"}}
    )
    assert done.text == "Not moved." and ran == []
    [result] = [m for m in await store.messages("t") if m.role == "tool"]
    assert result.content == "denied: too much" and result.metadata["outcome"] == "denied"


@pytest.mark.asyncio
async def test_stream_yields_live_text_and_durable_events() -> None:
    provider = Scripted.of(reply("Streaming works."))
    store = MemoryStore(ManualClock())
    agent = Agent("a", provider)
    items: list[Any] = []
    async for item in agent.stream(Runtime(store), "t", "hi"):
        items.append(item)
    deltas = "".join(i.data["text"] for i in items if getattr(i, "type", "") == "text.delta")
    assert deltas == "Streaming works."
    assert items[-1].type == "run.completed" and hasattr(items[-1], "seq")
