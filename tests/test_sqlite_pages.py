"""Pages the SQLite store writes per commit (issue 22) and migration 6, which moved the
listing indexes of ``threads`` off ``version``: counted in WAL frames, never timed."""

from __future__ import annotations

import sqlite3
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.sqlite_support import sqlite_url
from wakeful.records import Checkpoint, Commit, EventDraft
from wakeful.store.sqlite import reads, threads
from wakeful.store.sqlite.migrations import migrate, shipped
from wakeful.store.validate import encode_commit

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _checkpoint(cp_id: str, parent: str | None, tenant: str | None = None) -> Checkpoint:
    return Checkpoint(
        id=cp_id, parent=parent, run_id="r", status="running", state={"n": 1}, created_at=NOW,
        tenant=tenant,
    )  # fmt: skip


def _connect(path: Path, version: int | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # the WAL only grows: frames are countable
    migrations = shipped() if version is None else shipped()[:version]
    migrate(conn, sqlite_url(path), migrations, 0)
    return conn


def _b_trees_written(conn: sqlite3.Connection, path: Path, job: object) -> set[str]:
    """The b-trees (tables and indexes) whose pages one transaction running ``job`` wrote."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("BEGIN IMMEDIATE")
    job(conn)  # type: ignore[operator]
    conn.execute("COMMIT")
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    wal = Path(f"{path}-wal").read_bytes()
    pages = {struct.unpack(">I", wal[at : at + 4])[0] for at in range(32, len(wal), page_size + 24)}
    names = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
    return {names[p] for p in pages if p in names}


def test_a_later_commit_leaves_the_listing_indexes_alone(tmp_path: Path) -> None:
    """The first commit enters the thread in both listing indexes; a later one (which
    changes ``version``) writes no page of either, and the thread is still listed."""
    path = tmp_path / "pages.db"
    conn = _connect(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        token = threads.claim(conn, NOW, "t", "h", 60).token
        conn.execute("COMMIT")

        def commit(cp_id: str, parent: str | None) -> object:
            return lambda c: threads.commit(
                c,
                NOW,
                "t",
                encode_commit(
                    "t",
                    Commit(
                        token=token,
                        checkpoint=_checkpoint(cp_id, parent, "acme"),
                        events=(EventDraft(type="e"),),
                        operation_id=f"op-{cp_id}",
                    ),
                ),
            )

        first = _b_trees_written(conn, path, commit("c1", None))
        assert {"threads_listed", "threads_by_tenant"} <= first, first
        later = _b_trees_written(conn, path, commit("c2", "c1"))
        assert "threads" in later and "checkpoints" in later, later
        assert not later & {"threads_listed", "threads_by_tenant"}, later
        assert [s.thread_id for s in reads.list_threads(conn, None, None, 10)] == ["t"]
        assert [s.version for s in reads.list_threads(conn, "acme", None, 10)] == [2]
    finally:
        conn.close()


# The thread update of the first commit as a process of schema version 5 runs it (no
# ``listed``): such a process may still be open on a file another process migrated.
_VERSION_5_FIRST = (
    "UPDATE threads SET version = ?, tenant = ?, latest_pos = ?, latest_id = ?, "
    "latest_status = coalesce(?, latest_status), next_seq = ?, message_count = ?, "
    "write_count = ?, updated_at = ? WHERE thread_id = ?"
)


def test_migration_6_lists_the_same_threads_and_keeps_older_writers_listed(
    tmp_path: Path,
) -> None:
    """A database at schema 5 migrates with its committed threads listed and its claimed or
    bound ones not; afterwards a thread given its first version by a version-5 writer's
    update, or by a bulk insert, is listed too (the triggers), by tenant as well."""
    path = tmp_path / "v5.db"
    conn = _connect(path, version=5)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for tid in ("a", "b", "c"):
            threads.claim(conn, NOW, tid, "h", 60)
            if tid != "b":  # "b" is claimed, never committed
                conn.execute(_VERSION_5_FIRST, (1, None, 1, f"{tid}1", "running", 1, 0, 0, 1, tid))
        conn.execute("INSERT INTO threads (thread_id, tenant) VALUES ('d', 'acme')")  # bound
        conn.execute("COMMIT")
        old = conn.execute(
            "SELECT thread_id FROM threads WHERE version > 0 ORDER BY thread_id"
        ).fetchall()
        assert old == [("a",), ("c",)]
        assert migrate(conn, sqlite_url(path), shipped(), 1) == list(range(6, len(shipped()) + 1))
        listed = [s.thread_id for s in reads.list_threads(conn, None, None, 10)]
        assert listed == ["a", "c"]
        # a version-5 writer's first commit of "d" (bound to acme), and a bulk insert
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_VERSION_5_FIRST, (1, "acme", 1, "d1", "running", 1, 0, 0, 1, "d"))
        conn.execute(
            "INSERT INTO threads (thread_id, version, tenant, latest_pos, latest_id, updated_at) "
            "VALUES ('e', 3, 'acme', 3, 'e3', 1)"
        )
        conn.execute("COMMIT")
        assert [s.thread_id for s in reads.list_threads(conn, None, None, 10)] == [
            "a",
            "c",
            "d",
            "e",
        ]
        assert [s.thread_id for s in reads.list_threads(conn, "acme", None, 10)] == ["d", "e"]
        # the version-5 listing query (no index filters on version now) still answers right
        assert conn.execute(
            "SELECT thread_id FROM threads WHERE version > 0 ORDER BY thread_id"
        ).fetchall() == [("a",), ("c",), ("d",), ("e",)]
        listed_flags = conn.execute("SELECT thread_id, listed FROM threads ORDER BY 1").fetchall()
        assert listed_flags == [("a", 1), ("b", 0), ("c", 1), ("d", 1), ("e", 1)]
    finally:
        conn.close()


@pytest.mark.parametrize("ending", [False, True], ids=["keeps-claim", "releases"])
def test_the_first_commit_sets_listed_itself(tmp_path: Path, ending: bool) -> None:
    """This version's first commit names ``listed`` in its update (with or without ending
    the claim), so the triggers for older writers have nothing to do."""
    path = tmp_path / "first.db"
    conn = _connect(path)
    statements: list[str] = []
    try:
        conn.execute("BEGIN IMMEDIATE")
        token = threads.claim(conn, NOW, "t", "h", 60).token
        conn.set_trace_callback(statements.append)
        changes = conn.total_changes  # trigger bodies' changes count too
        threads.commit(
            conn,
            NOW,
            "t",
            encode_commit(
                "t", Commit(token=token, checkpoint=_checkpoint("c1", None), release=ending)
            ),
        )
        conn.set_trace_callback(None)
        assert conn.total_changes - changes == 2, "the checkpoint and the thread, no trigger"
        conn.execute("COMMIT")
        update = next(s for s in statements if s.startswith("UPDATE threads"))
        assert "listed = 1" in update
        assert conn.execute("SELECT listed FROM threads").fetchone() == (1,)
        # the same update as a version-5 writer runs it sets listed through the trigger
        conn.execute("BEGIN IMMEDIATE")
        threads.claim(conn, NOW, "u", "h", 60)
        changes = conn.total_changes
        conn.execute(_VERSION_5_FIRST, (1, None, 1, "u1", "running", 1, 0, 0, 1, "u"))
        assert conn.total_changes - changes == 2
        conn.execute("COMMIT")
        assert conn.execute("SELECT listed FROM threads WHERE thread_id = 'u'").fetchone() == (1,)
    finally:
        conn.close()
