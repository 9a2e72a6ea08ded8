"""The SQLite store across real processes: claim races, dispatch draining, a writer killed
with SIGKILL, and ``wait_events`` woken by another process's commit."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.sqlite_support import Child, sqlite_url
from wakeful.clock import ManualClock
from wakeful.errors import StaleClaim, ThreadBusy
from wakeful.records import Checkpoint, Commit, Dispatch, EventDraft
from wakeful.store import open_store

pytestmark = pytest.mark.slow


async def _create(url: str) -> None:
    """Create the database (and run the migration) before the children race to open it."""
    async with open_store(url):
        pass


def _start_all(children: list[Child], go: Path) -> None:
    for child in children:
        child.expect("ready")
    go.touch()


@pytest.mark.asyncio
async def test_eight_processes_race_for_twenty_threads_one_winner_each(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "race.db")
    await _create(url)
    go = tmp_path / "go"
    children = [Child("race", url, f"proc-{p}", str(go), "20") for p in range(8)]
    try:
        await asyncio.to_thread(_start_all, children, go)
        results = [(await asyncio.to_thread(c.finish))[0] for c in children]
    finally:
        for child in children:
            child.kill()
    winners: dict[str, str] = {}
    for p, result in enumerate(results):
        assert result["kind"] == "result"
        for thread in result["won"]:
            assert thread not in winners, f"{thread} won by {winners[thread]} and proc-{p}"
            winners[thread] = f"proc-{p}"
    assert sorted(winners) == sorted(f"race-{i}" for i in range(20))
    for result in results:
        for thread, holder in result["busy"].items():
            assert holder == winners[thread], "a refusal names the winner"
    async with open_store(url) as store:
        for thread, holder in winners.items():
            snap = await store.read(thread)
            assert snap is not None and snap.claim is not None
            assert snap.claim.holder == holder and snap.claim.token == 1


@pytest.mark.asyncio
async def test_four_processes_drain_two_hundred_dispatches_each_leased_once(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path / "drain.db")
    async with open_store(url) as store:
        for i in range(200):
            await store.enqueue(
                Dispatch(dispatch_id=f"d-{i:03}", thread_id=f"t-{i}", kind="start", payload=i)
            )
    go = tmp_path / "go"
    children = [Child("drain", url, f"worker-{w}", str(go)) for w in range(4)]
    try:
        await asyncio.to_thread(_start_all, children, go)
        results = [(await asyncio.to_thread(c.finish))[0] for c in children]
    finally:
        for child in children:
            child.kill()
    leased = [tuple(item) for result in results for item in result["leased"]]
    counts = Counter(dispatch_id for dispatch_id, _ in leased)
    assert sorted(counts) == [f"d-{i:03}" for i in range(200)]
    assert set(counts.values()) == {1}, [d for d, n in counts.items() if n > 1]
    async with open_store(url) as store:
        stored = await store.list_dispatches(limit=1000)
        assert len(stored) == 200
        assert all(d.status == "leased" and d.attempts == 1 for d in stored)
        by_id = dict(leased)
        for d in stored:
            assert d.token == by_id[d.dispatch_id]
        assert await store.claim_next("late", 60, limit=10) == []


@pytest.mark.asyncio
async def test_a_writer_killed_with_sigkill_loses_nothing_acknowledged(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    url = sqlite_url(db)
    child = Child("commit", url, "4")
    acks: list[dict[str, Any]] = []
    try:
        claimed = await asyncio.to_thread(child.expect, "claimed")

        def read_acks() -> None:
            for report in child.lines():
                acks.append(report)
                if len(acks) >= 60:
                    return

        await asyncio.to_thread(read_acks)
    finally:
        child.kill()  # SIGKILL, wherever it is: most likely inside its next commit
    assert child.proc.returncode == -9
    tokens: dict[str, int] = claimed["tokens"]

    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()

    # The parent's clock reads an hour after the child's: the child's 60 s claims expired.
    clock = ManualClock(datetime.now(UTC) + timedelta(hours=1))
    async with open_store(url, clock=clock) as store:
        for ack in acks:
            thread, i = ack["thread"], ack["i"]
            snap = await store.read(thread)
            assert snap is not None and snap.version >= ack["version"]
            [event] = await store.events_after(thread, ack["seq"] - 1, 1)
            assert event.data == {"i": i}
            [message] = await store.messages(thread, ack["version"] - 1, 1)
            assert message.id == f"m-{i}"
        for thread, old in tokens.items():
            snap = await store.read(thread)
            assert snap is not None and snap.claim is not None and snap.claim.token == old
            # Every commit added one checkpoint, event and message: none is half applied.
            assert snap.last_seq == snap.version == snap.message_count
            assert len(await store.checkpoints(thread, limit=1000)) == snap.version
            claim = await store.claim(thread, "parent", 30)
            assert claim.token > old
            with pytest.raises(StaleClaim):
                await store.commit(thread, Commit(token=old, events=(EventDraft(type="late"),)))
            parent = snap.checkpoint.id if snap.checkpoint else None
            receipt = await store.commit(
                thread,
                Commit(
                    token=claim.token,
                    checkpoint=Checkpoint(
                        id=f"{thread}-recovered",
                        parent=parent,
                        run_id="run-parent",
                        status="completed",
                        state={},
                        created_at=clock.now(),
                    ),
                ),
            )
            assert receipt.version == snap.version + 1


@pytest.mark.asyncio
async def test_wait_events_wakes_for_a_commit_in_another_process(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "wait.db")
    async with open_store(url) as store:
        claim = await store.claim("t-wait", "parent", 60)
        await store.commit("t-wait", Commit(token=claim.token, events=(EventDraft(type="a"),)))
        child = Child("wait", url, "t-wait", "1")
        try:
            await asyncio.to_thread(child.expect, "ready")
            # Give the child time to enter its wait; correctness does not depend on it (an
            # event committed earlier is returned at once), it only makes the test exercise
            # the cross-process wake-up.
            await asyncio.sleep(0.5)
            committed_at = time.time()
            await store.commit("t-wait", Commit(token=claim.token, events=(EventDraft(type="b"),)))
            woke = await asyncio.to_thread(child.expect, "woke")
            child.finish(timeout=30)
        finally:
            child.kill()
    assert woke["seqs"] == [2]
    latency = woke["at"] - committed_at
    print(f"cross-process wake latency: {latency * 1000:.1f} ms")
    assert latency < 5.0, f"woke {latency:.3f} s after the commit (its timeout was 60 s)"


@pytest.mark.asyncio
async def test_a_process_paused_between_commits_blocks_no_writer_and_is_taken_over(
    tmp_path: Path,
) -> None:
    """SIGSTOP a claim holder that is not inside a write transaction (issue 35 item 4): the
    other writers go on at once, on every thread, and its thread is taken over once its lease
    has run out; resumed, the paused process is fenced off."""
    url = sqlite_url(tmp_path / "pause.db")
    go = tmp_path / "go"
    ttl = 2.0  # the live-claim refusal below must come before it runs out, on a loaded machine
    async with open_store(url, busy_timeout=5.0) as store:
        other = await store.claim("t-other", "parent", 60)
        child = Child("hold", url, "t-held", str(ttl), str(go))
        try:
            holding = await asyncio.to_thread(child.expect, "holding")
            child.proc.send_signal(signal.SIGSTOP)
            for n in range(20):  # writes on other threads: none waits for the paused process
                started = time.monotonic()
                await store.commit(
                    "t-other", Commit(token=other.token, events=(EventDraft(type=f"e{n}"),))
                )
                assert time.monotonic() - started < 1.0, "a write waited on the paused process"
            await store.enqueue(Dispatch(dispatch_id="d-1", thread_id="t-q", kind="start"))
            assert [lease.dispatch.dispatch_id for lease in await store.claim_next("w", 30)] == [
                "d-1"
            ]
            with pytest.raises(ThreadBusy) as busy:  # its claim is live: refused, not blocked
                await store.claim("t-held", "successor", 30)
            assert busy.value.holder == "paused"
            deadline = time.monotonic() + 10
            while True:  # the takeover, as soon as the lease has run out
                try:
                    taken = await store.claim("t-held", "successor", 30)
                    break
                except ThreadBusy:
                    assert time.monotonic() < deadline, "never taken over"
                    await asyncio.sleep(0.02)
            # not before the lease ran out, by the clock the store judges it with
            assert datetime.now(UTC) >= datetime.fromisoformat(holding["expires"])
            assert taken.token > holding["token"]
            child.proc.send_signal(signal.SIGCONT)
            go.touch()
            assert (await asyncio.to_thread(child.expect, "stale"))["current"] == taken.token
            await asyncio.to_thread(child.finish)
        finally:
            child.proc.send_signal(signal.SIGCONT)
            child.kill()
        snap = await store.read("t-held")
        assert snap is not None and [e.type for e in await store.events_after("t-held")] == ["a"]
