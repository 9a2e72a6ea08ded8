"""The SQLite store beyond the conformance suite: URLs and options, migrations, driver
errors, clocks, retention in bounded batches, and the query plan of ``claim_next``."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.sqlite_support import sqlite_url
from wakeful.clock import ManualClock
from wakeful.errors import (
    CorruptStore,
    InvalidCommit,
    InvalidInput,
    StaleClaim,
    StoreClosed,
    StoreUnavailable,
    ThreadBusy,
    UnsupportedStore,
    VersionConflict,
)
from wakeful.records import (
    Checkpoint,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    Message,
    PendingWrite,
    Receipt,
    RetentionPolicy,
    Retry,
    Settle,
)
from wakeful.store import open_store
from wakeful.store.contract import Store
from wakeful.store.memory import MemoryStore
from wakeful.store.sqlite import connection, parse_url, reads, retention
from wakeful.store.sqlite.migrations import Migration, current_version, migrate, shipped
from wakeful.store.sqlite.queue import _DUE, _LAPSED
from wakeful.store.validate import encode_commit

case = pytest.mark.asyncio


def _schema_rows(path: Path) -> list[tuple[int, str, int]]:
    raw = sqlite3.connect(path)
    try:
        return raw.execute("SELECT version, name, applied_at FROM wakeful_schema").fetchall()
    finally:
        raw.close()


# ------------------------------------------------------------------ URLs and options


def test_url_forms() -> None:
    assert parse_url("sqlite:///relative.db") == "relative.db"
    assert parse_url("sqlite:///sub/dir/x.db") == "sub/dir/x.db"
    assert parse_url("sqlite:////abs/file.db") == "/abs/file.db"
    assert parse_url("SQLITE:////abs/file.db") == "/abs/file.db"
    assert parse_url("sqlite:////a%20b/what%3F%23.db") == "/a b/what?#.db"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///",
        "sqlite://host/x.db",
        "sqlite:////tmp/x.db?mode=ro",
        "sqlite:////tmp/x.db#frag",
        "sqlite:///:memory:",
        "sqlite:///file:x.db",
        "sqlite:////tmp/dir/",
        "sqlite:////tmp/x%00.db",
        "postgresql:///x",
    ],
)
def test_bad_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(UnsupportedStore) as refused:
        parse_url(url)
    assert "sqlite" in str(refused.value).lower()


@case
async def test_relative_and_encoded_paths_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with open_store("sqlite:///rel.db") as store:
        await store.claim("t1", "h", 30)
    assert (tmp_path / "rel.db").exists()
    odd = tmp_path / "with space?"
    odd.mkdir()
    async with open_store(f"sqlite:///{tmp_path}/with%20space%3F/x%20y.db") as store:
        await store.claim("t1", "h", 30)
    assert (odd / "x y.db").exists()


@case
async def test_options_are_checked(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "o.db")
    with pytest.raises(UnsupportedStore, match="unknown options"):
        await open_store(url, cache_size=10)
    with pytest.raises(InvalidInput):
        await open_store(url, busy_timeout=-1)
    with pytest.raises(InvalidInput):
        await open_store(url, readers=0)
    with pytest.raises(UnsupportedStore, match="does not exist"):
        await open_store(sqlite_url(tmp_path / "missing" / "x.db"))
    async with open_store(url, busy_timeout=1, readers=1, poll_interval=0.01) as store:
        await store.claim("t1", "h", 30)


@case
async def test_closed_store_refuses_calls_and_close_is_idempotent(tmp_path: Path) -> None:
    store = await open_store(sqlite_url(tmp_path / "c.db"))
    await store.close()
    await store.close()
    with pytest.raises(StoreClosed):
        await store.claim("t1", "h", 30)
    with pytest.raises(StoreClosed):
        await store.read("t1")


# ------------------------------------------------------------------ migrations


@case
async def test_initial_migration_is_applied_once(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    async with open_store(sqlite_url(db), clock=ManualClock()) as store:
        claim = await store.claim("t1", "h", 30)
    rows = _schema_rows(db)
    assert [(version, name) for version, name, _ in rows] == [
        (1, "0001_initial"),
        (2, "0002_dispatch_tenant"),
        (3, "0003_flat_reads"),
        (4, "0004_worker_stops"),
        (5, "0005_run_segments"),
        (6, "0006_listed_threads"),
        (7, "0007_branches"),
        (8, "0008_busy_threads"),
        (9, "0009_rate_limits"),
        (10, "0010_schedules"),
        (11, "0011_deploys"),
        (12, "0012_limit_waits"),
        (13, "0013_scheduled"),
        (14, "0014_concurrency_keys"),
    ]
    later = ManualClock()
    later.advance(3600)
    async with open_store(sqlite_url(db), clock=later) as store:
        snap = await store.read("t1")
        assert snap is not None and snap.claim == claim
    assert _schema_rows(db) == rows, "reopening re-ran nothing"


@case
async def test_a_database_from_a_newer_wakeful_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "newer.db"
    async with open_store(sqlite_url(db)):
        pass
    raw = sqlite3.connect(db)
    with raw:
        raw.execute("INSERT INTO wakeful_schema VALUES (99, '0099_future', 0)")
    raw.close()
    with pytest.raises(UnsupportedStore) as refused:
        await open_store(sqlite_url(db))
    message = str(refused.value)
    assert "99" in message and "newer" in message and "Upgrade wakeful" in message
    versions = [m.version for m in shipped()]
    assert [row[0] for row in _schema_rows(db)] == [*versions, 99]


@case
async def test_a_foreign_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    raw = sqlite3.connect(db)
    with raw:
        raw.execute("CREATE TABLE customers (id INTEGER)")
    raw.close()
    with pytest.raises(UnsupportedStore, match="not a wakeful store"):
        await open_store(sqlite_url(db))


@case
async def test_schema_7_queues_the_runs_waiting_behind_another_of_their_thread(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v6.db"
    url = sqlite_url(db)
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        migrate(raw, url, shipped()[:6], 1)
        columns = "dispatch_id, thread_id, kind, payload, priority, available_at, "
        columns += "max_attempts, status, attempts, created_at, updated_at"
        for i, (thread, kind, status) in enumerate(
            [
                ("t1", "start", "pending"),
                ("t1", "start", "pending"),
                ("t1", "message", "pending"),
                ("t2", "start", "awaiting"),
                ("t2", "resume", "pending"),
                ("t2", "start", "pending"),
                ("t3", "start", "pending"),
            ]
        ):
            raw.execute(
                f"INSERT INTO dispatches ({columns}) VALUES (?, ?, ?, 'null', 0, 1, 5, ?, 0, 1, 1)",
                (f"d-{i}", thread, kind, status),
            )
    finally:
        raw.close()
    async with open_store(url, clock=ManualClock()) as store:
        listed = {d.dispatch_id: d for d in await store.list_dispatches()}
        got = {k: (d.status, d.queued_behind) for k, d in listed.items()}
        assert got == {
            "d-0": ("pending", None),
            "d-1": ("queued", "d-0"),
            "d-2": ("queued", "d-1"),
            "d-3": ("awaiting", None),
            "d-4": ("pending", None),
            "d-5": ("queued", "d-4"),
            "d-6": ("pending", None),
        }
        [lease] = await store.claim_next("w", 30, thread_id="t1")
        await store.settle("d-0", lease.claim.token, Done())
        assert [d.dispatch_id for d in await store.list_dispatches(status="pending")] == [
            "d-1",
            "d-4",
            "d-6",
        ]


def test_an_older_database_is_migrated_in_one_transaction(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    url = sqlite_url(db)
    raw = sqlite3.connect(db, isolation_level=None)
    current = shipped()
    latest = current[-1].version
    try:
        assert migrate(raw, url, current[:1], 1) == [1]
        assert migrate(raw, url, current, 2) == list(range(2, latest + 1)), "upgraded"
        assert migrate(raw, url, current, 2) == [], "a current database is left alone"
        extra = Migration(
            latest + 1,
            f"{latest + 1:04d}_extra",
            "CREATE TABLE extra (x INTEGER);\n-- a; comment\nINSERT INTO extra VALUES (7);\n",
        )
        assert migrate(raw, url, [*current, extra], 3) == [latest + 1]
        assert raw.execute("SELECT x FROM extra").fetchall() == [(7,)]
        broken = [
            Migration(latest + 2, "half", "CREATE TABLE half (x INTEGER);"),
            Migration(latest + 3, "broken", "INSERT INTO nowhere VALUES (1);"),
        ]
        with pytest.raises(sqlite3.OperationalError):
            migrate(raw, url, [*current, extra, *broken], 4)
        assert current_version(raw) == latest + 1, "nothing of the failed upgrade was applied"
        assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchall() == []
        assert not raw.in_transaction
    finally:
        raw.close()


# ------------------------------------------------------------------ driver errors


@case
async def test_a_held_write_lock_becomes_store_unavailable_and_reads_go_on(
    tmp_path: Path,
) -> None:
    db = tmp_path / "locked.db"
    async with open_store(sqlite_url(db), busy_timeout=0.2) as store:
        claim = await store.claim("t1", "h", 30)
        raw = sqlite3.connect(db, isolation_level=None)
        try:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("UPDATE threads SET holder = 'nobody-sees-this'")
            with pytest.raises(StoreUnavailable) as refused:
                await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="e"),)))
            assert refused.value.retryable and "locked" in str(refused.value)
            snap = await store.read("t1")
            assert snap is not None and snap.claim == claim, "readers are not blocked"
            raw.execute("ROLLBACK")
        finally:
            raw.close()
        receipt = await store.commit(
            "t1", Commit(token=claim.token, events=(EventDraft(type="e"),))
        )
        assert receipt.events == (1,)


@case
async def test_a_file_that_is_not_a_database_is_corrupt(tmp_path: Path) -> None:
    db = tmp_path / "garbage.db"
    db.write_bytes(b"this is not a database " * 200)
    with pytest.raises(CorruptStore):
        await open_store(sqlite_url(db))
    assert db.read_bytes().startswith(b"this is not a database")


# ------------------------------------------------------------------ clocks


@case
async def test_clock_skew_costs_liveness_never_safety(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "skew.db")
    slow = ManualClock()
    fast = ManualClock(slow.now() + timedelta(seconds=100))
    async with open_store(url, clock=slow) as a, open_store(url, clock=fast) as b:
        claim = await a.claim("t1", "holder-a", 30)
        with pytest.raises(ThreadBusy):
            await a.claim("t1", "holder-x", 30)
        # b's clock is 100 s ahead: it judges a's live claim expired and takes over early.
        taken = await b.claim("t1", "holder-b", 30)
        assert taken.token > claim.token
        with pytest.raises(StaleClaim):
            await a.commit("t1", Commit(token=claim.token, events=(EventDraft(type="late"),)))
        with pytest.raises(StaleClaim):
            await a.renew("t1", claim.token, 30)
        assert await a.events_after("t1") == []


# ------------------------------------------------------------------ retention


async def _history(store: Store, clock: ManualClock) -> None:
    """Four threads with checkpoints and events spread over time."""
    for t in range(4):
        tid = f"t{t}"
        claim = await store.claim(tid, "h", 3600)
        parent = None
        for i in range(7 + 3 * t):
            clock.advance(10)
            cp = Checkpoint(
                id=f"{tid}-cp{i}",
                parent=parent,
                run_id="r",
                status="running",
                state={"i": i},
                created_at=clock.now(),
            )
            await store.commit(
                tid,
                Commit(
                    token=claim.token,
                    checkpoint=cp,
                    events=(EventDraft(type="a"), EventDraft(type="b")),
                    operation_id=f"op-{i}",
                ),
            )
            parent = cp.id


async def _facts(store: Store) -> list[object]:
    facts: list[object] = []
    for t in range(4):
        snap = await store.read(f"t{t}")
        assert snap is not None
        history = [cp.id for cp, _ in await store.checkpoints(f"t{t}", limit=1000)]
        facts.append((snap.event_floor, snap.last_seq, history))
    return facts


@case
@pytest.mark.parametrize(
    "policy",
    [
        RetentionPolicy(keep_checkpoints=2, keep_events=3),
        RetentionPolicy(checkpoint_max_age=55, event_max_age=35, receipt_max_age=45),
        RetentionPolicy(keep_checkpoints=0, keep_events=0, checkpoint_max_age=1000),
    ],
)
async def test_prune_in_small_batches_matches_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: RetentionPolicy
) -> None:
    monkeypatch.setattr(retention, "BATCH_ROWS", 3)
    monkeypatch.setattr(retention, "BATCH_THREADS", 2)
    reference_clock, clock = ManualClock(), ManualClock()
    reference = MemoryStore(reference_clock)
    async with open_store(sqlite_url(tmp_path / "p.db"), clock=clock) as store:
        await _history(reference, reference_clock)
        await _history(store, clock)
        expected = await reference.prune(policy)
        assert await store.prune(policy) == expected
        assert await _facts(store) == await _facts(reference)
        assert await store.prune(policy) == await reference.prune(policy)


@case
async def test_prune_of_settled_dispatches_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wakeful.records import Dispatch, Done

    monkeypatch.setattr(retention, "BATCH_ROWS", 4)
    clock = ManualClock()
    async with open_store(sqlite_url(tmp_path / "d.db"), clock=clock) as store:
        for i in range(10):
            await store.enqueue(Dispatch(dispatch_id=f"d{i}", thread_id=f"t{i}", kind="start"))
        for lease in await store.claim_next("w", 30, limit=9):
            await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
        clock.advance(100)
        report = await store.prune(RetentionPolicy(settled_dispatch_max_age=50))
        assert report.dispatches == 9
        assert [d.dispatch_id for d in await store.list_dispatches()] == ["d9"]


# ------------------------------------------------------------------ plans and threads


PLAN_PARAMS = {"now": 0, "version": None, "starts": True}


def test_claim_next_walks_the_due_index_without_sorting(tmp_path: Path) -> None:
    db = tmp_path / "plan.db"
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        migrate(raw, sqlite_url(db), shipped(), 0)
        due, lapsed = (
            " | ".join(row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + q, PLAN_PARAMS))
            for q in (_DUE, _LAPSED)
        )
    finally:
        raw.close()
    assert "dispatches_due" in due and "TEMP B-TREE" not in due, due
    # only the lapsed leases are read (a range of lease_expires), then put in claim order
    assert "USING INDEX dispatches_lapsing (lease_expires<?)" in lapsed, lapsed


@case
async def test_sqlite_calls_stay_off_the_event_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: set[str] = set()

    class Spy(sqlite3.Connection):
        def execute(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
            seen.add(threading.current_thread().name)
            return super().execute(*args, **kwargs)

    def spy_connect(path: str, busy_timeout: float) -> sqlite3.Connection:
        conn = sqlite3.connect(
            path,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=Spy,
        )
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    monkeypatch.setattr(connection, "connect", spy_connect)
    async with open_store(sqlite_url(tmp_path / "loop.db")) as store:
        claim = await store.claim("t1", "h", 30)
        await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="e"),)))
        await asyncio.gather(*(store.read("t1") for _ in range(8)))
        await store.wait_events("t1", 1, timeout=0.05)
    assert seen, "the spy saw no statement"
    assert threading.current_thread().name not in seen, seen
    assert any(name.startswith("wakeful-sqlite-writer") for name in seen)
    assert any(name.startswith("wakeful-sqlite-read") for name in seen)


def _record_batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the writer's transactions from now on (jobs per group commit)."""
    sizes: list[int] = []
    original = connection._Writer._run_batch

    def recording(self: connection._Writer, batch: list[connection._Job]) -> None:
        sizes.append(len(batch))
        original(self, batch)

    monkeypatch.setattr(connection._Writer, "_run_batch", recording)
    return sizes


@case
async def test_group_commit_isolates_each_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _record_batch_sizes(monkeypatch)
    async with open_store(sqlite_url(tmp_path / "group.db")) as store:
        claim = await store.claim("t1", "h", 30)
        writes = []
        for i in range(12):
            if i % 3 == 1:  # a message id another write of the group already uses
                commit = Commit(token=claim.token, messages=(Message(id="m-0", role="user"),))
            elif i % 3 == 2:  # a stale token
                commit = Commit(token=claim.token + 1, events=(EventDraft(type="stale"),))
            else:
                commit = Commit(
                    token=claim.token,
                    events=(EventDraft(type=f"e{i}"),),
                    messages=(Message(id=f"m-{i}", role="user"),),
                )
            writes.append(store.commit("t1", commit))
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert max(sizes) == 12, f"the writes were not grouped: {sizes}"
        for i, result in enumerate(results):
            expected = {0: Receipt, 1: InvalidCommit, 2: StaleClaim}[i % 3]
            assert isinstance(result, expected), (i, result)
        receipts = [r for r in results if isinstance(r, Receipt)]
        assert [r.events for r in receipts] == [(1,), (2,), (3,), (4,)]
        assert [r.version for r in receipts] == [1, 2, 3, 4]
        snap = await store.read("t1")
        assert snap is not None and snap.version == 4 and snap.message_count == 4
        assert [e.type for e in await store.events_after("t1")] == ["e0", "e3", "e6", "e9"]


@case
async def test_folded_writes_in_one_group_roll_back_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused folded write rolls back its own savepoint whole (the claim it granted
    included), and the writes after it in the same transaction see the state without it."""
    sizes = _record_batch_sizes(monkeypatch)
    async with open_store(sqlite_url(tmp_path / "folded.db")) as store:
        await store.enqueue(Dispatch(dispatch_id="d-2", thread_id="t2", kind="start", payload={}))
        [lease] = await store.claim_next("w", 30)
        token = lease.claim.token
        cp = Checkpoint(
            id="c1",
            parent=None,
            run_id="r",
            status="running",
            state={},
            created_at=datetime.now(UTC),
        )
        results = await asyncio.gather(
            store.claim_and_commit("t1", "h", 30, Commit(token=0, expected_version=3)),
            store.claim_and_commit("t1", "h", 30, Commit(token=0, checkpoint=cp)),
            store.claim_and_commit("t1", "h", 30, Commit(token=0)),
            store.commit(
                "t2",
                Commit(
                    token=token, consume=("none",), settle=Settle(dispatch_id="d-2", outcome=Done())
                ),
            ),
            store.commit(
                "t2",
                Commit(
                    token=token,
                    events=(EventDraft(type="retry"),),
                    settle=Settle(dispatch_id="d-2", outcome=Retry(0, "again")),
                ),
            ),
            store.commit("t2", Commit(token=token, events=(EventDraft(type="x"),), release=True)),
            return_exceptions=True,
        )
        assert max(sizes) == 6, f"the writes were not grouped: {sizes}"
        expected = [VersionConflict, tuple, ThreadBusy, InvalidCommit, Receipt, StaleClaim]
        for result, kind in zip(results, expected, strict=True):
            assert isinstance(result, kind), (kind, result)
        admitted = results[1]
        assert isinstance(admitted, tuple)
        granted, receipt = admitted
        assert granted.token == 1, "the refused claim_and_commit spent a token"
        assert receipt.version == 1
        one = await store.read("t1")
        assert one is not None and one.version == 1 and one.claim is not None
        assert one.claim.token == 1
        two = await store.read("t2")
        assert two is not None and two.version == 1 and two.claim is None and two.last_seq == 1
        d = await store.get_dispatch("d-2")
        assert d is not None and d.status == "pending" and d.last_error == "again"


def _record_writer_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the writer connection runs from now on (its first words)."""
    seen: list[str] = []
    original = connection.connect

    def traced(path: str, busy_timeout: float) -> sqlite3.Connection:
        conn = original(path, busy_timeout)
        if threading.current_thread().name.startswith("wakeful-sqlite-writer"):
            conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split()[:2])))
        return conn

    monkeypatch.setattr(connection, "connect", traced)
    return seen


@case
async def test_a_group_of_writes_refused_before_writing_needs_no_savepoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refusals raised by a job's checks (stale token, version) change no row: the group
    runs without savepoints, in one transaction, with the same outcomes. A refusal after a
    change (a granted claim whose commit is refused) reruns the group with a savepoint per
    job, and nothing of the refused job stays."""
    sizes = _record_batch_sizes(monkeypatch)
    statements = _record_writer_statements(monkeypatch)
    async with open_store(sqlite_url(tmp_path / "nosave.db")) as store:
        claims = [await store.claim(f"t{i}", "h", 30) for i in range(4)]
        statements.clear()
        before = store._db.transactions  # type: ignore[attr-defined]
        results = await asyncio.gather(
            *(
                store.commit(
                    f"t{i}",
                    Commit(
                        token=claims[i].token + (1 if i == 1 else 0),
                        expected_version=5 if i == 2 else None,
                        events=(EventDraft(type=f"e{i}"),),
                    ),
                )
                for i in range(4)
            ),
            return_exceptions=True,
        )
        assert [type(r) for r in results] == [Receipt, StaleClaim, VersionConflict, Receipt]
        assert max(sizes) == 4, f"the writes were not grouped: {sizes}"
        assert store._db.transactions == before + 1  # type: ignore[attr-defined]
        assert not [s for s in statements if s.startswith(("SAVEPOINT", "ROLLBACK"))]
        for i, kept in ((0, 1), (1, 0), (2, 0), (3, 1)):
            assert [e.type for e in await store.events_after(f"t{i}")] == [f"e{i}"] * kept

        statements.clear()
        mixed = await asyncio.gather(
            store.commit("t0", Commit(token=claims[0].token, events=(EventDraft(type="a"),))),
            store.claim_and_commit("n1", "h", 30, Commit(token=0, expected_version=3)),
            store.commit("t3", Commit(token=claims[3].token, events=(EventDraft(type="b"),))),
            return_exceptions=True,
        )
        assert [type(r) for r in mixed] == [Receipt, VersionConflict, Receipt]
        assert statements.count("ROLLBACK") == 1, statements  # the first attempt, whole
        assert statements.count("SAVEPOINT job") == 3, statements
        assert statements.count("COMMIT") == 1, statements
        assert await store.read("n1") is None, "the refused claim_and_commit left its claim"
        assert [e.type for e in await store.events_after("t0")] == ["e0", "a"]
        assert [e.type for e in await store.events_after("t3")] == ["e3", "b"]


async def _held_group(db: Any, first: Any, second: Any) -> tuple[list[Any], int]:
    """Run ``first`` on the writer, queue ``second`` while ``first`` is still running (it
    waits for the go-ahead inside its transaction), then let both finish; their outcomes and
    the write transactions committed meanwhile."""
    entered, go = threading.Event(), threading.Event()

    def held(conn: sqlite3.Connection) -> Any:
        entered.set()
        assert go.wait(10), "the test never let the first job finish"
        return first(conn)

    before = db.transactions
    one = asyncio.ensure_future(db.write(held))
    assert await asyncio.to_thread(entered.wait, 10)
    two = asyncio.ensure_future(db.write(second))
    deadline = asyncio.get_running_loop().time() + 10
    while db._writer._queue.qsize() == 0:  # the second job reached the writer's queue
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.001)
    go.set()
    outcomes = await asyncio.gather(one, two, return_exceptions=True)
    return list(outcomes), db.transactions - before


def _epoch(name: str, refuse: bool = False) -> Any:
    def job(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO epochs (thread_id, epoch) VALUES (?, 1)", (name,))
        if refuse:
            raise InvalidInput("job", f"{name} refused after writing")
        return name

    return job


async def _epochs(store: Any) -> list[str]:
    rows = await store._db.read(lambda c: c.execute("SELECT thread_id FROM epochs").fetchall())
    return sorted(r[0] for r in rows)


@case
async def test_a_write_queued_while_a_group_runs_joins_its_transaction(tmp_path: Path) -> None:
    """One fsync for both: the second write, queued while the first one's transaction ran,
    commits in it. A refusal of the joined write after it changed rows rolls back only that
    write (the group reruns with savepoints), and a lone write that is refused takes no
    queued write into the transaction its refusal rolls back."""
    async with open_store(sqlite_url(tmp_path / "join.db")) as store:
        db = store._db  # type: ignore[attr-defined]
        outcomes, committed = await _held_group(db, _epoch("a"), _epoch("b"))
        assert outcomes == ["a", "b"]
        assert committed == 1, "the queued write did not join the running transaction"

        outcomes, committed = await _held_group(db, _epoch("c"), _epoch("d", refuse=True))
        assert outcomes[0] == "c" and isinstance(outcomes[1], InvalidInput)
        assert committed == 1

        outcomes, committed = await _held_group(db, _epoch("e", refuse=True), _epoch("f"))
        assert isinstance(outcomes[0], InvalidInput) and outcomes[1] == "f"
        assert committed == 1, "the refused lone write's transaction committed"
        assert await _epochs(store) == ["a", "b", "c", "f"]


def test_migration_5_fills_the_run_segments_of_an_existing_history(tmp_path: Path) -> None:
    db = tmp_path / "v4.db"
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        migrate(raw, sqlite_url(db), shipped()[:4], 0)
        at = datetime(2026, 1, 1, tzinfo=UTC)
        runs = ["r-a", "r-a", "r-b", "r-a", "r-a"]
        for pos, run_id in enumerate(runs):
            cp = Checkpoint(
                id=f"c{pos}",
                parent=f"c{pos - 1}" if pos else None,
                run_id=run_id,
                status="running",
                state=None,
                created_at=at,
                metadata={"graph": "g"} if pos == 4 else {"graph": 7},
            )
            raw.execute(
                "INSERT INTO checkpoints (thread_id, pos, checkpoint_id, at, body) "
                "VALUES ('t1', ?, ?, ?, ?)",
                (pos, cp.id, pos, msgspec.json.encode(cp).decode()),
            )
        migrate(raw, sqlite_url(db), shipped(), 1)
        found = [
            (s.run_id, s.first_id, s.last_id, s.checkpoints, s.graph)
            for s in reads.runs(raw, "t1", None, 20)
        ]
    finally:
        raw.close()
    assert found == [
        ("r-a", "c3", "c4", 2, "g"),
        ("r-b", "c2", "c2", 1, None),
        ("r-a", "c0", "c1", 2, None),
    ]


@pytest.mark.asyncio
async def test_stream_checkpoint_puts_are_grouped_and_fenced_one_by_one(tmp_path: Path) -> None:
    from wakeful.errors import StreamCheckpointError
    from wakeful.records import StreamCheckpoint

    async with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        claims = [await store.claim(f"t{i}", "w", 30) for i in range(40)]

        def put(i: int, token: int) -> Any:
            cp = StreamCheckpoint(
                run_id=f"r{i}", thread_id=f"t{i}", model="m", partial_text=str(i), token=token
            )
            return store.stream_checkpoints.put(cp)

        outcomes = await asyncio.gather(
            *(put(i, c.token + (1 if i == 7 else 0)) for i, c in enumerate(claims)),
            return_exceptions=True,
        )
        stale = outcomes[7]
        assert isinstance(stale, StreamCheckpointError) and stale.reason == "stale"
        assert [o for i, o in enumerate(outcomes) if i != 7] == [None] * 39
        batches = store.stream_checkpoints.batches  # type: ignore[attr-defined]
        assert batches < 40, "puts queued behind one are grouped"
        for i in range(40):
            got = await store.stream_checkpoints.get(f"r{i}")
            assert (got is None) if i == 7 else (got is not None and got.partial_text == str(i))
            assert got is None or got.updated_at is not None


@pytest.mark.asyncio
async def test_a_stream_checkpoint_batch_fences_each_row_in_order(tmp_path: Path) -> None:
    """One batch (the claims read once, the rows written by one ``executemany``): two puts of
    a run keep the later, a stale token and an unknown thread are refused, and more threads
    than one ``IN`` list holds are all checked."""
    import functools

    from wakeful.records import StreamCheckpoint
    from wakeful.store.sqlite import messaging
    from wakeful.store.validate import encode_stream_checkpoint

    async with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        n = messaging._IN_CHUNK + 20
        claims = [await store.claim(f"t{i}", "w", 30) for i in range(n)]

        def cp(run: str, thread: str, token: int, text: str) -> Any:
            return encode_stream_checkpoint(
                StreamCheckpoint(
                    run_id=run, thread_id=thread, model="m", partial_text=text, token=token
                )
            )

        batch = [cp(f"r{i}", f"t{i}", c.token, "x") for i, c in enumerate(claims)]
        batch += [
            cp("r0", "t0", claims[0].token, "later"),
            cp("r1", "t1", claims[1].token + 1, "stale"),
            cp("r-none", "t-none", 1, "no such thread"),
        ]
        stored = await store._write(  # type: ignore[attr-defined]
            functools.partial(messaging.put_stream_checkpoints, checkpoints=batch)
        )
        assert stored == [True] * n + [True, False, False]
        got = [await store.stream_checkpoints.get(r) for r in ("r0", "r1", "r-none")]
        assert got[0] is not None and got[0].partial_text == "later"
        assert got[1] is not None and got[1].partial_text == "x" and got[2] is None
        last = await store.stream_checkpoints.get(f"r{n - 1}")
        assert last is not None and last.updated_at is not None


# ------------------------------------------------------------------ commit cost (issue 22)


@case
async def test_a_later_commit_reads_the_thread_once_and_leaves_its_tenant_alone(
    tmp_path: Path,
) -> None:
    """A commit after the thread's first is one read of the thread (its latest checkpoint's
    run segment and the receipt of its operation id included), the inserts and a thread
    update that does not name the tenant column; the new checkpoint still continues its run's
    segment, and a retried operation is answered from that one read."""
    from wakeful.store.sqlite import threads

    path = tmp_path / "cost.db"
    now = datetime.now(UTC)

    def checkpoint(cp_id: str, parent: str | None) -> Checkpoint:
        return Checkpoint(
            id=cp_id, parent=parent, run_id="r1", status="running", state={}, created_at=now,
            tenant="acme",
        )  # fmt: skip

    async with await open_store(sqlite_url(path)) as store:
        claim = await store.claim("t", "h", 60)
        await store.commit("t", Commit(token=claim.token, checkpoint=checkpoint("c1", None)))
        await store.commit("t", Commit(token=claim.token, checkpoint=checkpoint("c2", "c1")))
    conn = sqlite3.connect(path, isolation_level=None)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        conn.execute("BEGIN IMMEDIATE")
        statements.clear()
        commit = Commit(token=claim.token, checkpoint=checkpoint("c3", "c2"))
        threads.commit(conn, now, "t", encode_commit("t", commit))
        kinds = [s.split()[0] for s in statements]
        assert kinds == ["SELECT", "INSERT", "UPDATE"], statements
        assert "tenant" not in statements[2], statements[2]
        # with an operation id, its recorded receipt comes with the same read
        statements.clear()
        keyed = Commit(token=claim.token, checkpoint=checkpoint("c4", "c3"), operation_id="op")
        receipt = threads.commit(conn, now, "t", encode_commit("t", keyed))
        assert [s.split()[0] for s in statements] == ["SELECT", "INSERT", "INSERT", "UPDATE"]
        statements.clear()
        assert (
            threads.commit(conn, now, "t", encode_commit("t", keyed)) == receipt
        )  # the retry is answered
        assert [s.split()[0] for s in statements] == ["SELECT"], statements
        rows = conn.execute(
            "SELECT checkpoint_id, seg_first, ordinal FROM checkpoints WHERE thread_id = 't' "
            "ORDER BY pos"
        ).fetchall()
        assert rows == [("c1", 1, 1), ("c2", 1, 2), ("c3", 1, 3), ("c4", 1, 4)]
        assert conn.execute("SELECT tenant FROM threads").fetchone() == ("acme",)
    finally:
        conn.execute("ROLLBACK")
        conn.close()


@case
async def test_closed_stores_leave_no_descriptors_open(tmp_path: Path) -> None:
    """A closed store, and a failed open, leave none of their connections' descriptors open."""
    import os

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def cycle(i: int) -> None:
        async with await open_store(sqlite_url(tmp_path / f"s{i}.db")) as store:
            claim = await store.claim("t", "h", 60)
            await store.commit("t", Commit(token=claim.token, events=(EventDraft(type="e"),)))
        not_a_db = tmp_path / f"junk{i}.db"
        not_a_db.write_bytes(b"not a database" * 100)
        with pytest.raises((CorruptStore, UnsupportedStore, StoreUnavailable)):
            await open_store(sqlite_url(not_a_db))

    await cycle(0)
    baseline = open_fds()
    for i in range(1, 11):
        await cycle(i)
    assert open_fds() <= baseline


# ------------------------------------------------------------------ rows of a commit


@case
@pytest.mark.parametrize("count", [1, 3])
async def test_a_commits_rows_read_back_as_committed_one_or_many(
    tmp_path: Path, count: int
) -> None:
    """A commit's events, writes and messages are inserted with ``execute`` when there is
    one of a kind and ``executemany`` otherwise: both store what was committed, in order."""
    async with await open_store(sqlite_url(tmp_path / "rows.db")) as store:
        claim = await store.claim("t", "me", 60)
        events = tuple(
            EventDraft(type="step", data={"i": i}, task_id=f"k{i}") for i in range(count)
        )
        writes = tuple(
            PendingWrite(checkpoint_id="c1", task_id=f"k{i}", node="n", value=[i, {"v": i}])
            for i in range(count)
        )
        messages = tuple(Message(id=f"m{i}", role="user", content=f"hi {i}") for i in range(count))
        cp = Checkpoint(
            id="c1",
            parent=None,
            run_id="r",
            status="running",
            state={"n": count},
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        receipt = await store.commit(
            "t",
            Commit(
                token=claim.token, checkpoint=cp, events=events, writes=writes, messages=messages
            ),
        )
        assert receipt.events == tuple(range(1, count + 1))
        got = await store.events_after("t")
        assert [(e.seq, e.type, e.data, e.task_id) for e in got] == [
            (i + 1, "step", {"i": i}, f"k{i}") for i in range(count)
        ]
        snapshot = await store.read("t")
        assert snapshot is not None and snapshot.writes == writes
        assert tuple(await store.messages("t")) == messages
        # A second commit of one or many continues the numbering.
        more = await store.commit("t", Commit(token=claim.token, events=events))
        assert more.events == tuple(range(count + 1, 2 * count + 1))
