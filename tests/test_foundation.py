"""Records, clock, identifiers, open_store and the demo."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wakeful
from wakeful import (
    Checkpoint,
    Claim,
    Commit,
    Dispatch,
    EventDraft,
    InvalidInput,
    ManualClock,
    Message,
    PendingWrite,
    Retry,
    StreamCheckpoint,
    UnsupportedStore,
    open_store,
)
from wakeful.ids import check_id, check_seconds
from wakeful.records import Outcome

aware = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(9998, 1, 1), timezones=st.just(UTC)
)


@given(at=aware)
def test_times_round_trip_exactly_through_json(at: datetime) -> None:
    cp = Checkpoint(
        id="c", parent=None, run_id="r", status="running", state={}, created_at=at, tenant="t"
    )
    back = msgspec.json.decode(msgspec.json.encode(cp), type=Checkpoint)
    assert back == cp
    assert back.created_at == at and back.created_at.tzinfo is not None


def test_non_utc_times_compare_equal_after_round_trip() -> None:
    at = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    cp = Checkpoint(id="c", parent=None, run_id="r", status="failed", state=1, created_at=at)
    assert msgspec.json.decode(msgspec.json.encode(cp), type=Checkpoint).created_at == at


def test_records_are_frozen() -> None:
    claim = Claim(thread_id="t", holder="h", token=1, expires_at=datetime.now(UTC))
    with pytest.raises(AttributeError):
        claim.token = 2  # type: ignore[misc]


def test_commit_round_trips_with_every_part() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    commit = Commit(
        token=3,
        checkpoint=Checkpoint(
            id="c", parent="b", run_id="r", status="suspended", state={"k": [1]}, created_at=now
        ),
        writes=(PendingWrite(checkpoint_id="c", task_id="t", node="n", value=None),),
        events=(EventDraft(type="e", data={"x": "ü"}),),
        messages=(Message(id="m", role="tool", content="ok", tool_call_id="call-1"),),
        operation_id="r:1",
        expected_version=4,
        consume=("m-0",),
    )
    assert msgspec.json.decode(msgspec.json.encode(commit), type=Commit) == commit


def test_outcomes_are_tagged() -> None:
    body = msgspec.json.encode(Retry(2.5, "x"))
    assert msgspec.json.decode(body, type=Outcome) == Retry(2.5, "x")


def test_dispatch_and_stream_checkpoint_defaults() -> None:
    d = Dispatch(dispatch_id="d", thread_id="t", kind="start")
    assert (d.status, d.attempts, d.priority, d.max_attempts) == ("pending", 0, 0, 5)
    assert not d.exhausted
    sc = StreamCheckpoint(run_id="r", thread_id="t", model="m")
    assert sc.partial_text == "" and sc.tool_calls == [] and sc.retry_count == 0


def test_manual_clock_moves_only_when_told_and_is_thread_safe() -> None:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    clock = ManualClock(start)
    assert clock.now() == start

    def tick() -> None:
        for _ in range(1000):
            clock.advance(0.001)

    workers = [threading.Thread(target=tick) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert clock.now() == start + timedelta(seconds=4)
    clock.set(start)
    assert clock.now() == start
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="aware"):
        ManualClock(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    "good", ["a", "thread-1", "user@example.com", "run:1", "A.b_c+d=e", "x" * 200]
)
def test_valid_ids(good: str) -> None:
    assert check_id("thread_id", good) == good


@pytest.mark.parametrize("bad", ["", "-a", ".hidden", "a b", "a/b", "x" * 201, "é", "a\x00", 7])
def test_invalid_ids(bad: object) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_id("thread_id", bad)
    assert refused.value.field == "thread_id"


def test_remembered_ids_stay_bounded_and_never_admit_a_bad_one() -> None:
    from wakeful import ids

    for i in range(ids._KNOWN_MAX + 10):
        check_id("thread_id", f"t{i}")
    assert 0 < len(ids._KNOWN) <= ids._KNOWN_MAX, "the set is cleared when full"
    assert check_id("run_id", "t1") == "t1"  # remembered or not, the same answer

    class Sneaky(str):
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("t1")

    with pytest.raises(InvalidInput):
        check_id("thread_id", Sneaky("a b"))  # a subclass is always checked in full


def test_seconds_validation() -> None:
    assert check_seconds("ttl", 1) == 1.0
    for bad in (0, -1, float("inf"), float("nan"), True, "3", 10**9):
        with pytest.raises(InvalidInput):
            check_seconds("ttl", bad)
    assert check_seconds("delay", 0, allow_zero=True) == 0.0


@pytest.mark.asyncio
async def test_open_store_awaited_and_as_context_manager() -> None:
    store = await open_store("memory://")
    await store.close()
    async with open_store("memory://", clock=ManualClock()) as inside:
        claim = await inside.claim("t", "h", 5)
        assert claim.token == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("url", ["redis://x", "nonsense", "ftp://host/x"])
async def test_unknown_schemes_are_refused_clearly(url: str) -> None:
    with pytest.raises(UnsupportedStore, match="unknown scheme"):
        await open_store(url)


@pytest.mark.asyncio
async def test_a_closed_store_refuses_calls() -> None:
    store = await open_store("memory://")
    await store.close()
    with pytest.raises(wakeful.StoreClosed):
        await store.claim("t", "h", 5)


def test_open_store_has_a_contract_docstring() -> None:
    doc = wakeful.open_store.__doc__ or ""
    for word in ("memory://", "file://", "sqlite://", "postgresql://", "claim", "commit"):
        assert word in doc


def test_public_names_are_exported() -> None:
    for name in wakeful.__all__:
        assert hasattr(wakeful, name), name


def test_demo_tells_the_story() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wakeful.demo.claims"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "wins with token 1" in out
    assert "is refused: thread 'order-42' is held by holder" in out
    assert "takes over with token 2" in out
    assert "tries to commit: refused" in out and "is stale" in out
    assert "BUG" not in out
