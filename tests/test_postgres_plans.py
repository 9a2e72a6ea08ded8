"""PostgreSQL query plans of the hot read and claim paths (issue 27), read with auto_explain
from inside the store's functions: each answers from the index range its page needs, with no
sequential or bitmap scan and no sort of the range, without statistics and after
``ANALYZE`` alike."""

from __future__ import annotations

import psycopg
import pytest
from benchmarks.scale_data import QUIET, Shape, postgres_statements

from tests.postgres_support import SCHEMA, Databases

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

S = f'"{SCHEMA}"'
CALLS: dict[str, tuple[str, list[str]]] = {
    "claim_next": (
        f"SELECT dispatch_id FROM {S}.claim_next('probe', 30, 3)",
        ["Index Scan using dispatches_pending", "Index Scan using dispatches_lapsing"],
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
            for statement in postgres_statements(S, Shape(3000, 600, 200, 500, 50, 20)):
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
            if name != "claim_next":  # the few lapsed leases are sorted by claim order
                assert "Sort" not in plans, (name, plans)
            assert "Filter: (status" not in plans, (name, plans)  # the status is in the range
