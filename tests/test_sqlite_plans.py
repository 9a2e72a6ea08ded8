"""SQLite query plans of the hot read and claim paths (issue 27): each answers from the index
range its page needs, without statistics and after ``ANALYZE``; and ``claim_next`` does not
step over live leases (counted in VM instructions, not timed)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from benchmarks.scale_data import BIG, QUIET, Shape, fill_sqlite

from wakeful.records import Dispatch
from wakeful.store.sqlite import open_sqlite_store, queue, reads


class Recording:
    """A connection that records the statements run through it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.queries: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.queries.append((sql, params))
        return self.conn.execute(sql, params)


def _plans(conn: sqlite3.Connection, job: Any) -> list[str]:
    """The query plan lines of every SELECT ``job`` ran (a write job is rolled back)."""
    rec = Recording(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        job(cast(sqlite3.Connection, rec))
    finally:
        conn.rollback()
    lines = []
    for sql, params in rec.queries:
        if sql.lstrip().upper().startswith("SELECT"):
            plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
            lines.append(" | ".join(row[3] for row in plan))
    return lines


async def _built(path: Path) -> sqlite3.Connection:
    async with await open_sqlite_store(f"sqlite:///{path}"):
        pass  # migrated
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    fill_sqlite(conn, Shape(threads=3000, pending=600, leased=200, events=500, messages=50))
    conn.execute("COMMIT")
    return conn


NOW = datetime.now(UTC)
PATHS: dict[str, tuple[Any, list[str]]] = {
    "pending page": (
        lambda c: queue.list_dispatches(c, "pending", None, None, 100),
        ["SEARCH dispatches USING INDEX dispatches_by_status (status=? AND seq>?)"],
    ),
    "one thread's done": (
        lambda c: queue.list_dispatches(c, "done", "t00000005", None, 100),
        ["USING INDEX dispatches_by_thread_status (thread_id=? AND status=? AND seq>?)"],
    ),
    "tenant page": (
        lambda c: queue.list_dispatches(c, None, None, None, 100, QUIET),
        ["USING INDEX dispatches_by_owner (owner=? AND seq>?)"],
    ),
    "tenant page of a status": (
        lambda c: queue.list_dispatches(c, "pending", None, None, 100, "tenant-3"),
        ["USING INDEX dispatches_by_owner_status (owner=? AND status=? AND seq>?)"],
    ),
    "thread page": (
        lambda c: reads.list_threads(c, None, None, 100),
        ["SCAN threads USING INDEX threads_listed"],
    ),
    "tenant thread page": (
        lambda c: reads.list_threads(c, "tenant-3", None, 100),
        ["USING INDEX threads_by_tenant (tenant=?)"],
    ),
    "queue depths": (
        lambda c: queue.queue_depths(c, 10_000),
        ["USING COVERING INDEX dispatches_by_status (status=?)"] * 4,
    ),
    "runs": (
        lambda c: reads.runs(c, BIG, None, 20),
        [
            "SEARCH checkpoints USING INDEX sqlite_autoindex_checkpoints_1 (thread_id=? AND pos<?)",
            "SEARCH checkpoints USING INDEX sqlite_autoindex_checkpoints_1 (thread_id=? AND pos>?)",
            "SEARCH checkpoints USING INDEX sqlite_autoindex_checkpoints_1 (thread_id=? AND pos<?)",
        ],
    ),
    "claim_next": (
        lambda c: queue.claim_next(c, NOW, "w", 30, 3),
        [
            "SCAN d USING INDEX dispatches_due",
            "SEARCH d USING INDEX dispatches_lapsing (lease_expires<?)",
        ],
    ),
    "claim_next of a version": (
        lambda c: queue.claim_next(c, NOW, "w", 30, 3, version="v1"),
        [
            "SCAN d USING INDEX dispatches_due",
            "SEARCH d USING INDEX dispatches_lapsing (lease_expires<?)",
            "SEARCH d USING INDEX dispatches_pinned (pinned_version=?)",
        ],
    ),
}


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
@pytest.mark.asyncio
async def test_every_hot_path_reads_its_index_range(tmp_path: Path, analyzed: bool) -> None:
    conn = await _built(tmp_path / "plans.db")
    try:
        if analyzed:
            conn.execute("ANALYZE")
        for name, (job, expected) in PATHS.items():
            plans = _plans(conn, job)
            if name.startswith("claim_next"):
                # the due step reads the scheduled rows' own range (its plan may come first);
                # then the pending walk, the lapsed range (and the pinned range), the grants
                due = [plan for plan in plans if "dispatches_scheduled" in plan]
                assert all("(available_at<?)" in plan for plan in due), (name, due)
                plans = [plan for plan in plans if plan not in due][: len(expected)]
            assert len(plans) >= len(expected), (name, plans)
            for plan, want in zip(plans, expected, strict=False):
                assert want in plan, (name, plan)
                if "lapsing" not in want:  # a few lapsed get sorted
                    assert "TEMP B-TREE" not in plan, (name, plan)
    finally:
        conn.close()


def _steps(path: Path) -> int:
    """VM instructions one ``claim_next`` runs on the store at ``path`` (rolled back)."""
    conn = sqlite3.connect(path, isolation_level=None)
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.set_progress_handler(tick, 1)
        [lease] = queue.claim_next(conn, datetime.now(UTC), "probe", 30, 1)
        conn.set_progress_handler(None, 1)
        assert lease.dispatch.dispatch_id.startswith("new-")
        conn.rollback()
    finally:
        conn.close()
    return count


@pytest.mark.asyncio
async def test_claim_next_does_not_step_over_live_leases(tmp_path: Path) -> None:
    steps: dict[int, int] = {}
    for held in (0, 800):
        path = tmp_path / f"leases-{held}.db"
        async with await open_sqlite_store(f"sqlite:///{path}") as store:
            for i in range(held):  # older than the pending work: first in claim order
                await store.enqueue(
                    Dispatch(dispatch_id=f"old-{i}", thread_id=f"o{i}", kind="start")
                )
            if held:
                leases = await store.claim_next("holder", 3600, limit=held)
                assert len(leases) == held
            for i in range(5):
                await store.enqueue(
                    Dispatch(dispatch_id=f"new-{i}", thread_id=f"n{i}", kind="start")
                )
        steps[held] = _steps(path)
    assert steps[800] < 1.5 * steps[0], steps


@pytest.mark.asyncio
async def test_a_commit_without_an_operation_id_does_not_probe_receipts(tmp_path: Path) -> None:
    """The thread read of a commit without an operation id leaves ``receipts`` out of its
    plan and reads the very row the full statement reads for no operation id."""
    from wakeful.records import Checkpoint, Commit
    from wakeful.store.sqlite import threads

    path = tmp_path / "plain.db"
    async with await open_sqlite_store(f"sqlite:///{path}") as store:
        claim = await store.claim("t", "h", 60)
        for i, op in enumerate(("op-1", None)):
            cp = Checkpoint(
                id=f"c{i}", parent=f"c{i - 1}" if i else None, run_id="r", status="running",
                state={"i": i}, created_at=NOW,
            )  # fmt: skip
            await store.commit("t", Commit(token=claim.token, checkpoint=cp, operation_id=op))
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        seen = Recording(conn)
        plain = threads._thread_for_commit(cast(sqlite3.Connection, seen), "t", "c2", None)
        [(sql, params)] = seen.queries
        plan = " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        assert "receipts" not in plan and "checkpoints" in plan, plan
        full = conn.execute(threads._THREAD_FOR_COMMIT, ("t", "c2", None)).fetchone()
        assert plain == full and plain[0] == claim.token and plain[-2:] == (None, None)
        with_op = threads._thread_for_commit(conn, "t", "c2", "op-1")
        assert with_op[:-2] == plain[:-2] and with_op[-2] is not None
    finally:
        conn.close()
