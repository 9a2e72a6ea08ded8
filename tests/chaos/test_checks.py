"""The invariant checks themselves: each one flags a crafted violation and passes the
matching clean case (the chaos trials are only as good as these)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from tests.chaos import checks
from tests.chaos.harness import Dump, ThreadDump
from wakeful.records import (
    Checkpoint,
    Dispatch,
    Event,
    InboxMessage,
    Message,
    ThreadSnapshot,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def event(thread: str, seq: int, type: str, **fields: Any) -> Event:
    return Event(thread_id=thread, seq=seq, at=AT, type=type, **fields)


def thread(
    tid: str,
    events: Sequence[Event] = (),
    messages: Sequence[Message] = (),
    checkpoints: Sequence[str] = (),
    inbox: Sequence[InboxMessage] = (),
) -> ThreadDump:
    cps = [
        Checkpoint(id=c, parent=None, run_id="r", status="running", state={}, created_at=AT)
        for c in checkpoints
    ]
    snap = ThreadSnapshot(
        thread_id=tid,
        version=len(cps),
        checkpoint=cps[-1] if cps else None,
        writes=(),
        claim=None,
        tenant=None,
        message_count=len(messages),
        last_seq=len(events),
    )
    return ThreadDump(tid, snap, list(events), list(messages), cps, list(inbox))


def dump(*threads: ThreadDump, dispatches: Sequence[Dispatch] = ()) -> Dump:
    return Dump({t.thread_id: t for t in threads}, {d.dispatch_id: d for d in dispatches})


def kinds(found: list[checks.Violation]) -> list[str]:
    return [v.invariant for v in found]


def commit_ack(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "op": "commit",
        "pid": 1,
        "thread": "t",
        "token": 1,
        "t0": 1.0,
        "t1": 1.1,
        "version": 1,
        "checkpoint": "cp-1",
        "seqs": [1],
        "types": ["step"],
        "messages": ["m-1"],
        "results": [],
        "tasks": [],
        "outbox": [],
    }
    return {**base, **fields}


def test_acknowledged_commits_must_be_whole() -> None:
    ack = commit_ack()
    whole = thread("t", [event("t", 1, "step")], [Message(id="m-1", role="user")], ["cp-1"])
    assert checks.acknowledged(dump(whole), [ack]) == []
    wrong_event = thread("t", [event("t", 1, "other")], [Message(id="m-1", role="user")], ["cp-1"])
    assert kinds(checks.acknowledged(dump(wrong_event), [ack])) == ["acknowledged"]
    no_message = thread("t", [event("t", 1, "step")], [], ["cp-1"])
    assert kinds(checks.acknowledged(dump(no_message), [ack])) == ["acknowledged"]
    assert kinds(checks.acknowledged(dump(), [ack])) == ["acknowledged"]


def test_a_write_sent_after_a_newer_grant_is_stale() -> None:
    grant = {"op": "grant", "pid": 2, "thread": "t", "token": 2, "t1": 5.0}
    before = commit_ack(t0=4.9)
    after = commit_ack(t0=5.1)
    successor = commit_ack(t0=5.2, token=2)
    other_thread = commit_ack(t0=5.3, thread="u")
    assert checks.stale([grant, before, successor, other_thread]) == []
    assert kinds(checks.stale([grant, after])) == ["stale"]
    renew = {"op": "renew", "pid": 1, "thread": "t", "token": 1, "t0": 6.0, "t1": 6.1}
    assert kinds(checks.stale([grant, renew])) == ["stale"]


def test_tokens_in_events_never_decrease() -> None:
    ok = thread("t", [event("t", i, "fact", data={"token": k}) for i, k in ((1, 1), (2, 3))])
    bad = thread("t", [event("t", i, "fact", data={"token": k}) for i, k in ((1, 3), (2, 1))])
    assert checks.token_order(dump(ok)) == []
    assert kinds(checks.token_order(dump(bad))) == ["stale"]


def test_a_fact_recorded_twice_is_a_duplicate() -> None:
    started, completed = event("t", 1, "run.started", run_id="r"), event("t", 2, "run.completed")
    once = thread("t", [started, msgspec.structs.replace(completed, run_id="r")])
    ended_twice = [
        event("t", 1, "run.completed", run_id="r"),
        event("t", 2, "run.failed", run_id="r"),
    ]
    twice = thread("t", ended_twice)
    gap = thread("t", [event("t", 1, "x"), event("t", 3, "y")])
    assert gap.snap is not None
    gap.snap = msgspec.structs.replace(gap.snap, last_seq=3)
    assert checks.events_unique(dump(once)) == []
    assert kinds(checks.events_unique(dump(twice))) == ["duplicate"]
    assert kinds(checks.events_unique(dump(gap))) == ["duplicate"]


def test_a_result_acknowledged_before_a_task_started_again_is_a_rerun() -> None:
    ack = commit_ack(t1=2.0, token=3, tasks=[["run-1", "s1-t0"]], results=["c0-0"])
    node = {"what": "node", "run": "run-1", "task": "s1-t0", "token": 3, "t0": 2.5, "pid": 9}
    tool = {"what": "tool", "thread": "t", "call": "c0-0", "token": 4, "t0": 2.5, "pid": 9}
    assert kinds(checks.no_rerun([ack], [node, tool])) == ["duplicate", "duplicate"]
    early = {**node, "t0": 1.5}
    stale_owner = {**tool, "token": 2}
    assert checks.no_rerun([ack], [early, stale_owner]) == []


CALLS = [
    {"tool": "never", "n": 1, "bad": None},
    {"tool": "keyed", "n": 2, "bad": None},
    {"tool": "safe", "n": 3, "bad": "type"},
]
PLAN = {"thread": "a", "turns": [{"calls": CALLS}]}


def agent_thread(results: list[tuple[str, str]]) -> ThreadDump:
    calls = [
        {"id": "c0-0", "name": "never_op", "arguments": '{"n": 1}'},
        {"id": "c0-1", "name": "keyed_op", "arguments": '{"n": 2}'},
        {"id": "c0-2", "name": "safe_op", "arguments": '{"n": "3"}'},
    ]
    messages = [
        Message(id="u", role="user", run_id="r"),
        Message(id="a", role="assistant", tool_calls=calls, run_id="r"),
        *(
            Message(id=f"r{i}", role="tool", tool_call_id=c, metadata={"outcome": o})
            for i, (c, o) in enumerate(results)
        ),
    ]
    return thread("a", messages=messages)


def effect(call: str, kind: str, n: int, key: str = "k") -> dict[str, Any]:
    return {
        "what": "tool",
        "thread": "a",
        "call": call,
        "kind": kind,
        "args": {"n": n},
        "int": True,
        "key": key,
        "applied": True,
        "token": 1,
        "t0": 0.0,
    }


def test_tool_calls_run_once_on_complete_arguments_only() -> None:
    t = agent_thread([("c0-0", "ok"), ("c0-1", "ok"), ("c0-2", "invalid")])
    clean = [effect("c0-0", "never", 1, "k0"), effect("c0-1", "keyed", 2, "k1")]
    assert checks.tool_calls(t, PLAN, clean) == []
    assert checks.conversation(t, 8) == []
    twice = [*clean, effect("c0-0", "never", 1, "k0")]
    assert kinds(checks.tool_calls(t, PLAN, twice)) == ["replay"]
    rekeyed = [*clean, effect("c0-1", "keyed", 2, "other")]
    assert kinds(checks.tool_calls(t, PLAN, rekeyed)) == ["replay"]
    invalid_ran = [*clean, effect("c0-2", "safe", 3)]
    assert "incomplete-call" in kinds(checks.tool_calls(t, PLAN, invalid_ran))
    wrong_args = [effect("c0-0", "never", 7, "k0"), effect("c0-1", "keyed", 2, "k1")]
    assert kinds(checks.tool_calls(t, PLAN, wrong_args)) == ["incomplete-call"]
    shared = [
        effect("c0-0", "keyed", 1, "k"),
        {**effect("c0-1", "keyed", 2, "k"), "applied": False},
    ]
    assert kinds(checks.keys_distinct(shared)) == ["replay"]
    applied_twice = [effect("c0-1", "keyed", 2, "k"), effect("c0-1", "keyed", 2, "k")]
    assert kinds(checks.keys_distinct(applied_twice)) == ["replay"]


def test_a_conversation_with_a_repeated_result_is_a_duplicate() -> None:
    t = agent_thread([("c0-0", "ok"), ("c0-0", "ok"), ("c0-1", "ok"), ("c0-2", "invalid")])
    assert kinds(checks.conversation(t, 8)) == ["duplicate"]
    t = agent_thread([("c9-9", "ok")])
    assert kinds(checks.conversation(t, 8)) == ["duplicate"]


def test_every_staged_message_is_delivered_once() -> None:
    def message(mid: str, did: str) -> Dispatch:
        return Dispatch(dispatch_id=did, thread_id="x", kind="message", payload={"message_id": mid})

    staged = {("x", "m1"), ("x", "m2")}
    inbox = [
        InboxMessage(message_id=m, correlation_id=None, payload=None, revision=i, at=AT)
        for i, m in ((1, "m1"), (2, "m2"))
    ]
    good = dump(thread("x", inbox=inbox), dispatches=[message("m1", "d1"), message("m2", "d2")])
    assert checks.delivered(good, staged, consumed=False) == []
    lost = dump(thread("x", inbox=inbox[:1]), dispatches=[message("m1", "d1")])
    assert set(kinds(checks.delivered(lost, staged, consumed=False))) == {"acknowledged"}
    twice = [message("m1", "d1"), message("m1", "d3"), message("m2", "d2")]
    doubled = dump(thread("x", inbox=inbox), dispatches=twice)
    assert kinds(checks.delivered(doubled, staged, consumed=False)) == ["duplicate"]


def test_a_woken_worker_must_change_nothing() -> None:
    before = dump(thread("t", [event("t", 1, "x")]))
    after = dump(thread("t", [event("t", 1, "x"), event("t", 2, "y")]))
    assert checks.unchanged(before, before, ()) == []
    assert kinds(checks.unchanged(before, after, ())) == ["stale"]


def test_hand_calls_are_recorded_as_the_hand_ledger_says() -> None:
    def result(key: str, outcome: str, content: str, call: str) -> Message:
        return Message(
            id=f"m-{key}-r",
            role="tool",
            content=content,
            tool_call_id=call,
            metadata={"tool": "keyed_op", "outcome": outcome},
        )

    flagged = event("t", 1, "tool.indeterminate", data={"call_id": "c2", "tool": "never_op"})
    calls = [
        result("k1", "ok", '{"kind":"keyed","n":1}', "c1"),
        result("k2", "indeterminate", "Indeterminate: ...", "c2"),
        result("k3", "error", "error: HandUnavailable: hand unavailable ...", "c3"),
    ]
    records: dict[str, tuple[str, str | None, str | None]] = {
        "k1": ("done", '{"n":1,"kind":"keyed"}', None),
        "k2": ("started", None, None),
    }
    effects = [{"key": "k1"}, {"key": "k2"}]
    clean = dump(thread("t", [flagged], calls))
    assert checks.hand_calls(clean, ["t"], records, effects) == []
    assert kinds(checks.hand_calls(clean, ["t"], records, [*effects, {"key": "k1"}])) == ["replay"]
    wrong = {**records, "k1": ("done", '{"kind":"keyed","n":2}', None)}
    assert kinds(checks.hand_calls(clean, ["t"], wrong, effects)) == ["hand"]
    knew = {**records, "k2": ("done", '{"kind":"never","n":2}', None)}
    assert kinds(checks.hand_calls(clean, ["t"], knew, effects)) == ["hand"]
    saw = {**records, "k3": ("started", None, None)}
    assert kinds(checks.hand_calls(clean, ["t"], saw, effects)) == ["hand"]
    unflagged = dump(thread("t", [], calls))
    assert kinds(checks.hand_calls(unflagged, ["t"], records, effects)) == ["hand"]
    failed = [*calls[:2], result("k3", "error", "error: HandError: declined", "c3")]
    assert kinds(
        checks.hand_calls(dump(thread("t", [flagged], failed)), ["t"], records, effects)
    ) == ["hand"]
