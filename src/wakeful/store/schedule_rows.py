"""Schedules as every store keeps them: checked input, the JSON body, and the
compare-and-set rule (``ScheduleStore.put_schedule``) shared by the four stores.

A stored schedule is a few columns the stores index or compare (name, tenant, paused,
next fire time, revision, times) and a JSON body with everything else; the columns win
over the body when it is read back."""

from __future__ import annotations

from datetime import datetime

import msgspec

from wakeful.errors import InvalidInput
from wakeful.ids import check_aware, check_count, check_id, check_optional_id
from wakeful.records import Schedule
from wakeful.store.validate import MAX_DISPATCH_BYTES, check_json, json_roundtrip

OVERLAPS = ("skip", "enqueue", "allow")
CATCH_UPS = ("skip", "latest", "all")


def check_schedule(schedule: object) -> Schedule:
    """A detached, checked copy of ``schedule`` (``InvalidInput`` otherwise). What it means
    (a parsable cron, a known time zone) is ``wakeful.schedule``'s to check."""
    if not isinstance(schedule, Schedule):
        raise InvalidInput("schedule", f"must be a Schedule, got {type(schedule).__name__}")
    check_json("input", schedule.input)
    copy = json_roundtrip("schedule", schedule, Schedule, MAX_DISPATCH_BYTES)
    check_id("name", copy.name)
    check_id("target", copy.target)
    check_optional_id("thread", copy.thread)
    check_optional_id("tenant", copy.tenant)
    check_optional_id("last_dispatch_id", copy.last_dispatch_id)
    check_count("max_catch_up", copy.max_catch_up, minimum=1, maximum=10_000)
    times = (
        ("next_fire_at", copy.next_fire_at),
        ("last_tick", copy.last_tick),
        ("waiting_since", copy.waiting_since),
    )
    for field, value in times:
        if value is not None:
            check_aware(field, value)
    if (copy.cron is None) == (copy.every is None):
        raise InvalidInput("schedule", "give exactly one of cron and every")
    if (copy.thread is None) == (copy.thread_template is None):
        raise InvalidInput("schedule", "give exactly one of thread and thread_template")
    return copy


def check_expected(expected_revision: object) -> int | None:
    if expected_revision is None:
        return None
    return check_count("expected_revision", expected_revision, maximum=2**62)


def encode(schedule: Schedule) -> bytes:
    return msgspec.json.encode(schedule)


def decode(
    body: bytes | str,
    *,
    paused: bool,
    next_fire_at: datetime | None,
    revision: int,
    created_at: datetime,
    updated_at: datetime,
) -> Schedule:
    stored = msgspec.json.decode(body, type=Schedule)
    return msgspec.structs.replace(
        stored,
        paused=bool(paused),
        next_fire_at=next_fire_at,
        revision=int(revision),
        created_at=created_at,
        updated_at=updated_at,
    )


def replaced(
    current: Schedule | None, new: Schedule, expected_revision: int | None, now: datetime
) -> Schedule | None:
    """``new`` as stored over ``current`` at ``now``, or ``None`` when the compare-and-set
    fails (the rule every store applies; the SQL stores apply it in their statement)."""
    if expected_revision is not None:
        have = current.revision if current is not None else 0
        if have != expected_revision:
            return None
    return msgspec.structs.replace(
        new,
        revision=(current.revision if current is not None else 0) + 1,
        created_at=current.created_at if current is not None else now,
        updated_at=now,
    )


def check_name(name: object) -> str:
    return check_id("name", name)


__all__ = [
    "CATCH_UPS",
    "OVERLAPS",
    "check_expected",
    "check_name",
    "check_schedule",
    "decode",
    "encode",
    "replaced",
]
