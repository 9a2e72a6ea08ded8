"""A commit and a stream checkpoint are encoded once at the store boundary: the parts the
stores write are cut from that encoding and must be exactly what encoding the checked copy
gives (so what is stored is what a reader decodes), and the faster checks must refuse what
the scan refused."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest

from wakeful.errors import InvalidInput
from wakeful.records import (
    Awaiting,
    Checkpoint,
    Claim,
    Commit,
    Done,
    EventDraft,
    Message,
    OutboxEntry,
    PendingWrite,
    Receipt,
    Retry,
    Settle,
    StreamCheckpoint,
)
from wakeful.store.file.chain import encode_committed, encode_mutation
from wakeful.store.projection import Committed, Settled
from wakeful.store.validate import (
    MAX_JSON_DEPTH,
    check_commit,
    encode_commit,
    encode_stream_checkpoint,
    payload_hash,
)
from wakeful.testkit.value_cases import nested

AT = datetime(2026, 12, 1, 12, 30, tzinfo=UTC)
TRICKY = 'quote " backslash \\ "updated_at":null,"task_id":"x" \n {"token":1,'


class Point(msgspec.Struct):
    x: int
    y: list[int]


def _checkpoint(state: Any, tz: timezone = UTC) -> Checkpoint:
    return Checkpoint(
        id="c2",
        parent="c1",
        run_id="r",
        status="running",
        state=state,
        created_at=AT.astimezone(tz),
        frontier=["a", {"n": 1}],
        metadata={"z": 1, "a": [TRICKY]},
    )


def _commits() -> list[Commit]:
    state = {"zeta": 1, "alpha": {"b": [1.5, None, True], "a": TRICKY}, "n": -(2**40)}
    return [
        Commit(token=7),
        Commit(token=7, checkpoint=_checkpoint(state), operation_id="op-1"),
        Commit(
            token=2**40,
            checkpoint=_checkpoint((1, Point(1, [2])), timezone(timedelta(hours=2))),
            writes=(
                PendingWrite(checkpoint_id="c2", task_id="t1", node="n", value={"b": 1, "a": 2}),
                PendingWrite(checkpoint_id="c2", task_id="t2", node="n", value=None),
            ),
            events=(EventDraft(type="e", data={"y": TRICKY}, run_id="r"), EventDraft(type="f")),
            messages=(
                Message(id="m1", role="user", content=TRICKY, metadata={"k": [1]}),
                Message(id="m2", role="assistant", tool_calls=[{"id": "x", "args": {"q": 1}}]),
            ),
            operation_id="op-2",
            expected_version=3,
            outbox=(
                OutboxEntry(message_id="o1", target_thread="t2", payload={"p": TRICKY}),
                OutboxEntry(message_id="o2", target_thread="t3", correlation_id="c"),
            ),
            consume=("i1", "i2"),
            release=True,
            settle=Settle(dispatch_id="d1", outcome=Retry(delay=1.5, error="boom")),
        ),
        Commit(token=1, settle=Settle(dispatch_id="d", outcome=Done()), operation_id="op-3"),
        Commit(
            token=1,
            settle=Settle(dispatch_id="d", outcome=Awaiting()),
            drop_checkpoints=("c0", "c1"),
            operation_id="op-4",
        ),
    ]


def _old_payload_hash(commit: Commit) -> str:
    """``payload_hash`` as version 0.x computed it (receipts recorded with it must still
    answer their retries)."""
    fields = msgspec.to_builtins(msgspec.structs.replace(commit, token=0))
    # fields that commit did not have yet (time travel's, decision 0036)
    del fields["branch_from"], fields["branch_messages"]
    if not commit.drop_checkpoints:
        del fields["drop_checkpoints"]
    body = msgspec.json.encode(fields, order="sorted")
    return hashlib.sha256(body).hexdigest()


def _text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


@pytest.mark.parametrize("commit", _commits())
def test_the_parts_are_the_encoding_of_the_checked_copy(commit: Commit) -> None:
    encoded = encode_commit("t", commit)
    copy = encoded.commit
    assert copy == check_commit("t", commit)
    assert encoded.body == msgspec.json.encode(copy)
    assert msgspec.json.decode(encoded.body, type=Commit) == copy
    cp = copy.checkpoint
    assert encoded.checkpoint_text() == (None if cp is None else _text(cp))
    assert encoded.write_texts() == [_text(w) for w in copy.writes]
    assert encoded.event_texts() == [_text(e) for e in copy.events]
    assert encoded.event_data_texts() == [_text(e.data) for e in copy.events]
    assert encoded.message_texts() == [_text(m) for m in copy.messages]
    assert encoded.outbox_texts() == [_text(o) for o in copy.outbox]
    assert encoded.outbox_payload_texts() == [_text(o.payload) for o in copy.outbox]
    granted = encoded.with_token(123456789)
    assert granted.commit == msgspec.structs.replace(copy, token=123456789)
    assert granted.body == msgspec.json.encode(granted.commit)


@pytest.mark.parametrize("commit", _commits())
def test_payload_hash_is_unchanged(commit: Commit) -> None:
    copy = check_commit("t", commit)
    assert payload_hash(copy) == _old_payload_hash(copy)
    assert payload_hash(msgspec.structs.replace(copy, token=99)) == payload_hash(copy)


def test_a_committed_record_encodes_the_same_with_its_commit_given_as_bytes() -> None:
    encoded = encode_commit("t", _commits()[2])
    settled = Settled("d1", 7, "pending", AT, "boom", AT)
    claim = Claim(thread_id="t", holder="h", token=7, expires_at=AT)
    receipt = Receipt(thread_id="t", version=4, checkpoint_id="c2", events=(5, 6))
    for extra in ({}, {"claim": claim, "settled": settled}):
        record = Committed("t", encoded.commit, receipt, "h" * 64, AT, **extra)  # type: ignore[arg-type]
        assert encode_committed(record, encoded.body) == encode_mutation(record)


@pytest.mark.parametrize("updated_at", [None, AT])
def test_a_stream_checkpoint_is_stamped_in_its_encoding(updated_at: datetime | None) -> None:
    checkpoint = StreamCheckpoint(
        run_id="run-1",
        thread_id="t",
        model="m",
        partial_text=TRICKY,
        tool_calls=[{"updated_at": None, "task_id": TRICKY}],
        in_flight_tool={"args": TRICKY},
        updated_at=updated_at,
        task_id="task-1",
        message_id=TRICKY,
    )
    encoded = encode_stream_checkpoint(checkpoint)
    assert encoded.checkpoint == checkpoint
    assert encoded.body == msgspec.json.encode(checkpoint)
    now = AT + timedelta(seconds=5)
    stamped = encoded.stamped(now)
    expected = (
        checkpoint
        if updated_at is not None
        else msgspec.structs.replace(checkpoint, updated_at=now)
    )
    assert stamped.checkpoint == expected
    assert stamped.body == msgspec.json.encode(expected)
    assert msgspec.json.decode(stamped.body, type=StreamCheckpoint) == expected


def _refused(commit: Commit) -> str:
    with pytest.raises(InvalidInput) as caught:
        check_commit("t", commit)
    return str(caught.value)


def test_values_the_copy_differs_from_are_scanned_and_refused() -> None:
    nan = float("nan")
    # a NaN the copy holds as null (the comparison finds it) and one among values the copy
    # holds differently anyway (a tuple, a struct: the scan finds it)
    for state in ({"x": [1, nan]}, {"x": (1, float("inf"))}, [Point(1, [2]), nan]):
        assert "checkpoint.state" in _refused(Commit(token=1, checkpoint=_checkpoint(state)))
    # a struct inside a value is accepted, and the copy holds its JSON form
    copy = check_commit("t", Commit(token=1, checkpoint=_checkpoint([Point(1, [2])])))
    assert copy.checkpoint is not None and copy.checkpoint.state == [{"x": 1, "y": [2]}]


@pytest.mark.parametrize("pad", [0, 20_000])  # below and above the bracket-count shortcut
def test_depth_is_checked_value_by_value_whatever_the_brackets(pad: int) -> None:
    wide = {"items": [{"k": [i]} for i in range(100)], "pad": "x" * pad}  # 200 brackets, shallow
    at_limit = nested(MAX_JSON_DEPTH)
    ok = Commit(
        token=1,
        checkpoint=_checkpoint(wide),
        events=(EventDraft(type="e", data=at_limit),),
        outbox=(OutboxEntry(message_id="o", target_thread="t2", payload=at_limit),),
    )
    assert check_commit("t", ok) == ok
    too_deep = nested(MAX_JSON_DEPTH + 1)
    problem = _refused(msgspec.structs.replace(ok, events=(EventDraft(type="e", data=too_deep),)))
    assert "event.data" in problem and "nests deeper" in problem
    problem = _refused(
        msgspec.structs.replace(
            ok, outbox=(OutboxEntry(message_id="o", target_thread="t2", payload=too_deep),)
        )
    )
    assert "outbox.payload" in problem


def test_the_bracket_shortcut_counts_every_opening_bracket() -> None:
    """``_NOT_OPENING`` keeps exactly ``{`` and ``[``: the one-pass count equals the two
    ``count`` calls it replaced, brackets inside strings included (they only make the count
    err on the safe side)."""
    from wakeful.store.validate import _NOT_OPENING

    assert set(range(256)) - set(_NOT_OPENING) == set(b"{[")
    values: list[Any] = [{"a": [1, {"b": "[{"}]}, [], "x" * 100, nested(MAX_JSON_DEPTH)]
    for value in values:
        body = msgspec.json.encode(Commit(token=1, checkpoint=_checkpoint(value)))
        assert len(body.translate(None, _NOT_OPENING)) == body.count(b"{") + body.count(b"[")


def test_the_copy_is_detached_from_the_caller() -> None:
    state: dict[str, Any] = {"list": [1, 2], "d": {"a": 1}}
    copy = check_commit("t", Commit(token=1, checkpoint=_checkpoint(state)))
    state["list"].append(3)
    state["d"]["b"] = 2
    assert copy.checkpoint is not None
    assert copy.checkpoint.state == {"list": [1, 2], "d": {"a": 1}}
