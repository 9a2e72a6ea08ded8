"""PostgreSQL query plans of the hot read and claim paths (issue 27), read with auto_explain
from inside the store's functions: each answers from the index range its page needs, with no
sequential or bitmap scan and no sort of the range, without statistics and after
``ANALYZE`` alike."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import psycopg
import pytest
from benchmarks.scale_data import QUIET, Shape, postgres_statements

from tests.postgres_support import SCHEMA, Databases
from wakeful.records import Checkpoint, Commit, Done, EventDraft, Settle
from wakeful.store.postgres.group import COMMIT_MANY, batch_params
from wakeful.store.postgres.threads import _STRETCHES, _commit_params
from wakeful.store.validate import encode_commit

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

S = f'"{SCHEMA}"'
CALLS: dict[str, tuple[str, list[str]]] = {
    "claim_next": (
        f"SELECT dispatch_id FROM {S}.claim_next('probe', 30, 3)",
        ["Index Scan using dispatches_pending", "Index Scan using dispatches_lapsing"],
    ),
    # migration 0011: the set-based lease call, its candidates, thread locks and snapshots
    "claim_next_read": (
        f"SELECT (o_dispatch).dispatch_id FROM {S}.claim_next_read('probe', 30, 3)",
        [
            "Scan using dispatches_scheduled",  # migration 0019: the due step's range
            "Index Scan using dispatches_pending",
            "Index Scan using dispatches_lapsing",
            "Index Scan using threads_pkey",
        ],
    ),
    # migration 0018: the source pinned to the claimer's version is one more index range
    "claim_next_read of a version": (
        f"SELECT (o_dispatch).dispatch_id FROM {S}.claim_next_read('probe', 30, 3, 'v1', true)",
        [
            "Index Scan using dispatches_pending",
            "Index Scan using dispatches_pinned",
            "Index Scan using dispatches_lapsing",
        ],
    ),
    "pending page": (
        f"SELECT dispatch_id FROM {S}.list_dispatches(0, 'pending', NULL, NULL, 100)",
        ["Index Scan using dispatches_by_status"],
    ),
    "one thread's done": (
        f"SELECT dispatch_id FROM {S}.list_dispatches(0, 'done', 't00000005', NULL, 100)",
        ["Index Scan using dispatches_by_thread_status"],
    ),
    "tenant page": (
        f"SELECT dispatch_id FROM {S}.list_dispatches(0, NULL, NULL, '{QUIET}', 100)",
        ["Index Scan using dispatches_by_owner "],
    ),
    "tenant page of a status": (
        f"SELECT dispatch_id FROM {S}.list_dispatches(0, 'pending', NULL, 'tenant-3', 100)",
        ["Index Scan using dispatches_by_owner_status"],
    ),
    "thread page": (
        f"SELECT thread_id FROM {S}.list_threads(NULL, NULL, 100)",
        ["Index Scan using threads_listed "],
    ),
    "tenant thread page": (
        f"SELECT thread_id FROM {S}.list_threads('tenant-3', NULL, 100)",
        ["Index Scan using threads_listed_by_tenant"],
    ),
    "queue depths": (
        f"SELECT o_status FROM {S}.queue_depths(10000)",
        ["Index Only Scan using dispatches_by_status"],
    ),
}


def _nested_plans(conn: psycopg.Connection, query: str) -> str:
    """Every plan auto_explain reports while ``query`` runs (rolled back)."""
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    with conn.transaction(force_rollback=True):
        conn.execute(query)
    conn._notice_handlers.clear()
    return "\n".join(notes)


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
async def test_every_hot_path_reads_its_index_range(
    pg_databases: Databases, analyzed: bool
) -> None:
    dsn = await pg_databases.clone()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("threads", "dispatches", "checkpoints", "events", "messages"):
            conn.execute(f"ALTER TABLE {S}.{table} SET (autovacuum_enabled = false)")
        with conn.transaction():
            # with delayed dispatches and schedules not due (issue 38): the due step's range
            shape = Shape(3000, 600, 200, 500, 50, 20, scheduled=3000, schedules=300)
            for statement in postgres_statements(S, shape):
                conn.execute(statement)
        if analyzed:
            conn.execute("ANALYZE")
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
        ):
            conn.execute(f"SET {setting}")
        for name, (query, wanted) in CALLS.items():
            plans = _nested_plans(conn, query)
            for want in wanted:
                assert want in plans, (name, plans)
            for banned in ("Seq Scan", "Bitmap"):
                assert banned not in plans, (name, plans)
            # the few lapsed leases are sorted by claim order, and a lease call's candidates
            if not name.startswith("claim_next"):
                assert "Sort" not in plans, (name, plans)
            assert "Filter: (status" not in plans, (name, plans)  # the status is in the range


async def test_no_hot_function_compiles_its_queries(pg_databases: Databases) -> None:
    """With JIT compilation made as eager as it gets (a threshold of 0), no statement inside
    claim_next, the listings or the count compiles (migration 0010): claim_next's cursors
    have no LIMIT, so their estimated cost grows with the queue, and above
    jit_above_cost every claim compiled before reading a row (142 ms of 150 ms at 100,000
    pending dispatches). A statement of the same session outside them does compile."""
    dsn = await pg_databases.clone()
    with psycopg.connect(dsn, autocommit=True) as conn:
        available = conn.execute("SELECT pg_jit_available()").fetchone()
        if available is None or not available[0]:
            pytest.skip("this PostgreSQL server has no JIT provider")
        with conn.transaction():
            for statement in postgres_statements(S, Shape(300, 100, 20, 50, 10, 5)):
                conn.execute(statement)
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
            "jit = on",
            "jit_above_cost = 0",
        ):
            conn.execute(f"SET {setting}")
        for name, (query, _) in CALLS.items():
            # each plan is one notice; the last is the caller's own statement (a function
            # scan, whose cost of 10 never reaches the default threshold), not the function's
            plans = _nested_plans(conn, query).split("duration: ")
            inside = [plan for plan in plans if plan and f"Query Text: {query}" not in plan]
            assert any("Index" in plan for plan in inside), (name, plans)
            for plan in inside:
                assert "JIT:" not in plan, (name, plan)
        outside = _nested_plans(conn, f"SELECT count(*) FROM {S}.dispatches WHERE priority >= 0")
        assert "JIT:" in outside, outside


async def test_runs_walks_the_primary_key_a_few_rows_per_run(pg_databases: Databases) -> None:
    """``runs`` on a history of 4,000 checkpoints in 400 runs: the page of 20 runs (and the
    one below it) is read from the primary key, about two rows per run, never the history."""
    dsn = await pg_databases.clone()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"""INSERT INTO {S}.checkpoints (thread_id, version, checkpoint_id, at, body)
                SELECT 'long', i, 'c-' || i, now(),
                       '{{"run_id":"run-' || ((i - 1) / 10) || '","status":"completed",'
                       || '"metadata":{{}}}}'
                  FROM generate_series(1, 4000) i"""
        )
        query = _STRETCHES.replace("@schema@", S)
        params = {"thread": "long", "below": 2**62, "count": 21}
        plan = "\n".join(
            row[0]
            for row in conn.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {query}", params)
        )
        rows = [row for row in conn.execute(query, params)]
    assert len(rows) == 21
    newest = min(rows)
    assert newest[1] == "c-4000" and newest[8] == "c-3991" and newest[6] - newest[10] == 9
    assert "Index Scan Backward using checkpoints_pkey" in plan, plan
    for banned in ("Seq Scan", "Bitmap", "Sort"):
        assert banned not in plan, plan
    fetched = sum(int(m) * int(n) for m, n in re.findall(r"rows=(\d+) loops=(\d+)", plan))
    assert fetched < 200, plan  # a few per run and node, not the 4,000 checkpoints


def _plans_with(conn: psycopg.Connection, query: str, params: list[object]) -> str:
    """Every plan auto_explain reports while ``query`` runs with ``params`` (rolled back)."""
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    with conn.transaction(force_rollback=True):
        conn.execute(query, params).fetchall()
    conn._notice_handlers.clear()
    return "\n".join(notes)


async def test_commit_many_probes_by_key_in_both_of_its_statements(
    pg_databases: Databases,
) -> None:
    """commit_many's set-based statement (migration 0009) and its variant without the
    release and superseded-writes parts (0012) read every row by key, with or without
    statistics: no sequential scan, and a bitmap scan only of a keyed range."""
    dsn = await pg_databases.clone()
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            for statement in postgres_statements(S, Shape(3000, 600, 200, 500, 50, 20)):
                conn.execute(statement)
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
        ):
            conn.execute(f"SET {setting}")
        many = COMMIT_MANY.replace("@schema@", S).replace("%b", "%s")
        checkpoint = Checkpoint(
            id="plan-1", parent=None, run_id="r", status="running", state={},
            created_at=datetime.now(UTC),
        )  # fmt: skip
        for analyzed in (False, True):
            if analyzed:
                conn.execute("ANALYZE")
            # a thread that does not exist (nothing to release, no pending writes): the
            # statement without rl and wd; then one that releases: the whole statement
            for thread, release in (("no-such-thread", False), ("t00000005", True)):
                commit = Commit(
                    token=1, checkpoint=checkpoint, events=(EventDraft(type="e"),),
                    operation_id="op", release=release,
                    settle=None if release else Settle(dispatch_id="d1", outcome=Done()),
                )  # fmt: skip
                params = batch_params([(thread, 1, *_commit_params(encode_commit(thread, commit)))])
                plans = _plans_with(conn, many, params)
                assert "Index Scan using threads_pkey" in plans, plans
                assert "Index Scan using receipts_pkey" in plans, plans
                assert "Seq Scan" not in plans, (thread, analyzed, plans)
                # a bitmap only of keyed probes: the batch's thread rows and settled dispatches
                # (= ANY of their ids), one thread's pending writes or leases (wd and rl)
                bitmaps = set(re.findall(r"Bitmap Index Scan on (\w+)", plans))
                # (dispatches_id: the settled dispatch's lock and check, by id alone)
                keyed = {"threads_pkey", "dispatches_pkey", "dispatches_id", "writes_pkey"}
                keyed.add("dispatches_by_thread_status")
                assert bitmaps <= keyed, plans
                assert ("Delete on" in plans) is release, plans  # wd: the whole statement only


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
async def test_a_claim_for_one_thread_reads_that_threads_index_range(
    pg_databases: Databases, analyzed: bool
) -> None:
    """``claim_next(thread_id=...)`` (``wakeful run``): its one statement finds the thread's
    first available dispatch in the thread's own ranges of ``dispatches_by_thread_status``
    (pending, leased) and its thread row by key, however long the rest of the queue is."""
    from wakeful.store.postgres.queue import _CLAIM_ON_THREAD

    dsn = await pg_databases.clone()
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            for statement in postgres_statements(S, Shape(3000, 600, 200, 500, 50, 20)):
                conn.execute(statement)
        if analyzed:
            conn.execute("ANALYZE")
        query = _CLAIM_ON_THREAD.replace("@schema@", S)
        params = {"thread": "t00000005", "holder": "probe", "ttl": 30.0}
        params |= {"version": "v1", "starts": True}
        plan = "\n".join(row[0] for row in conn.execute(f"EXPLAIN (COSTS OFF) {query}", params))
    # the thread's range only (its pending and leased ranges as a bitmap, or the whole range)
    assert "using dispatches_by_thread_status" in plan or (
        "Bitmap Index Scan on dispatches_by_thread_status" in plan
    ), plan
    assert re.search(r"Index Cond: \(+thread_id = 't00000005'::text\)", plan), plan
    assert "Index Scan using threads_pkey" in plan, plan
    assert "Seq Scan" not in plan, plan
