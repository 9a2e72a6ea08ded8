"""The in-flight message of a stream server (``wakeful.server.inflight``): live deltas placed
by offset, rewinds of a replacement producer, gaps filled from the stream checkpoint, stale
producers ignored, and what a client is sent (the difference, never a queue)."""

from __future__ import annotations

from typing import Any

from wakeful.client import Frame, MessageAssembler
from wakeful.records import StreamCheckpoint
from wakeful.runtime.events import LiveEvent
from wakeful.server.inflight import Cursor, Tracker
from wakeful.server.streamframes import tag

MID = "m-1-a"


def live(type: str, token: int = 1, **data: Any) -> LiveEvent:
    return LiveEvent(
        thread_id="t", run_id="r", type=type, data={"message_id": MID, "token": token, **data}
    )


def started(offset: int = 0, calls: int = 0, token: int = 1) -> LiveEvent:
    return live("message.started", token, task_id="s0-t0", offset=offset, tool_calls=calls)


def text(offset: int, value: str, token: int = 1) -> LiveEvent:
    return live("text.delta", token, offset=offset, text=value)


def checkpoint(partial: str, token: int = 1) -> StreamCheckpoint:
    return StreamCheckpoint(
        run_id="r", thread_id="t", model="m", partial_text=partial, token=token,
        task_id="s0-t0", message_id=MID,
    )  # fmt: skip


def sent(cursor: Cursor, tracker: Tracker, assembler: MessageAssembler) -> list[str]:
    kinds = []
    for kind, data in cursor.sync(tracker, tag):
        assembler.apply(Frame(f"messages/{kind}", data, None))
        kinds.append(kind)
    return kinds


def test_a_replacement_producer_rewinds_every_client_to_where_it_resumed() -> None:
    tracker, cursor, client = Tracker(), Cursor(), MessageAssembler()
    for event in (started(), text(0, "Once "), text(5, "upon "), text(10, "a tim")):
        tracker.on_live(event)
    assert sent(cursor, tracker, client) == ["delta"]
    assert client.messages[MID].text == "Once upon a tim"
    # the worker died; its checkpoint held "Once upon "; the replacement resumes there
    tracker.on_live(started(offset=10, token=2))
    tracker.on_live(text(10, "a time.", token=2))
    assert sent(cursor, tracker, client) == ["reset", "delta"]
    assert client.messages[MID].text == "Once upon a time."
    # the old producer, still streaming somewhere, is ignored
    assert not tracker.on_live(text(17, " THE END", token=1))
    assert sent(cursor, tracker, client) == []


def test_a_gap_waits_for_the_checkpoint_and_is_then_filled_in_order() -> None:
    tracker, cursor, client = Tracker(), Cursor(), MessageAssembler()
    # this server subscribed mid-reply: its first delta starts at 10
    tracker.on_live(text(10, "a time"))
    waiting = tracker.needs_checkpoint
    assert waiting and sent(cursor, tracker, client) == []
    tracker.on_checkpoint(checkpoint("Once upon "), authoritative=False)
    filled = not tracker.needs_checkpoint
    assert filled
    sent(cursor, tracker, client)
    assert client.messages[MID].text == "Once upon a time" and client.messages[MID].gaps == 0


def test_a_slow_client_gets_one_frame_for_many_deltas() -> None:
    tracker, slow = Tracker(), Cursor()
    tracker.on_live(started())
    for i in range(1000):
        tracker.on_live(text(i, "x"))
    frames = slow.sync(tracker, tag)
    assert [(k, len(d["text"])) for k, d in frames] == [("delta", 1000)]


def test_without_a_live_channel_the_checkpoint_is_the_truth() -> None:
    tracker, cursor, client = Tracker(), Cursor(), MessageAssembler()
    tracker.on_checkpoint(checkpoint("Once upon a"), authoritative=True)
    sent(cursor, tracker, client)
    # a restarted request (R4) saved a different beginning under a newer token
    tracker.on_checkpoint(checkpoint("Twice", token=2), authoritative=True)
    assert sent(cursor, tracker, client) == ["reset", "delta"]
    assert client.messages[MID].text == "Twice"


def test_a_completed_message_is_forgotten_and_late_deltas_are_ignored() -> None:
    tracker = Tracker()
    tracker.on_live(started())
    tracker.on_live(text(0, "Hi"))
    assert tracker.complete(MID) and tracker.message is None
    assert not tracker.on_live(text(2, "!"))
    assert not tracker.on_checkpoint(checkpoint("Hi!"), authoritative=True)


def test_a_client_resuming_mid_message_gets_only_what_follows_its_offset() -> None:
    tracker = Tracker()
    tracker.on_live(started())
    tracker.on_live(text(0, "Once upon a time"))
    resumed = Cursor(resume=(tag(MID), 10))
    frames = resumed.sync(tracker, tag)
    assert frames == [("delta", {"run_id": "r", "message_id": MID, "offset": 10, "text": "a time"})]
    # a server that did not see the message start cannot vouch for the client's text
    late = Tracker()
    late.on_checkpoint(checkpoint("Once upon a time"), authoritative=False)
    assert Cursor(resume=(tag(MID), 10)).sync(late, tag)[0][1]["offset"] == 0
