"""Set-based builders of a big deployment's data, for the read-path scale benchmark
(``benchmarks.scale_paths``) and the query-plan tests.

The public API writes about a thousand commits a second: building a million threads through
it would take the better part of an hour per store. These builders write the same rows with
a handful of ``INSERT ... SELECT`` statements over a generated series instead, in the
stores' own formats (bodies are msgspec JSON of real records, so every read decodes them),
straight into a freshly migrated store.

The shape (``Shape``): ``threads`` committed threads (one checkpoint, one event, one done
dispatch each) spread over ten tenants; ``pending`` dispatches, each on a thread of its own
that has no commit yet (the version-0 rows ``enqueue`` creates, listed before the committed
ones by id); ``leased`` dispatches held by live claims on committed threads; one ``big``
thread with ``events`` events, ``messages`` messages and ``checkpoints`` checkpoints of one
run; and a ``quiet`` tenant with one thread and two dispatches, which every other tenant's
work must not slow down. ``scheduled`` delayed dispatches (each on a thread of its own,
enqueued first, due in a day) and ``schedules`` schedules due in a day (issue 38) are what
``claim_next`` and ``due_schedules`` must not walk.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from wakeful.records import Checkpoint, EventDraft, Message, Schedule

TENANTS = 10
SEGMENT = "run_id, status, graph, seg_first, ordinal"
"""SQLite's run segment columns of a checkpoint row (migration 0005); PostgreSQL's trigger
fills its own."""
QUIET = "tenant-quiet"
BIG = "big"


@dataclass(frozen=True)
class Shape:
    threads: int
    pending: int
    leased: int
    events: int = 1000
    messages: int = 100
    checkpoints: int = 100
    scheduled: int = 0
    """Delayed dispatches (due in a day, ``scheduled``), each on a thread of its own,
    enqueued before the pending ones (issue 38: a claim must not walk them)."""
    schedules: int = 0
    """Schedules rows, next due in a day (``due_schedules`` must not walk them)."""


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _checkpoint_body() -> str:
    """A checkpoint with the placeholders CPID, PARENT (a quoted id or null), TENANT."""
    cp = Checkpoint(
        id="CPID",
        parent=None,
        run_id="run-1",
        status="completed",
        state={"messages": [{"role": "user", "content": "hello " * 20}], "step": 1},
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        tenant="TENANT",
    )
    return _json(cp).replace('"parent":null', '"parent":PARENT')


CHECKPOINT = _checkpoint_body()
EVENT = _json(EventDraft(type="step", data={"n": 1}, run_id="run-1"))
MESSAGE = _json(Message(id="MSGID", role="user", content="x" * 200))
START_PAYLOAD = '{"target":"echo","input":null,"tenant":"TENANT"}'


SCHEDULE = msgspec.json.encode(
    Schedule(name="SNAME", target="echo", every=86_400.0, thread="SNAME", revision=1)
).decode()
"""A schedule's body with the placeholder SNAME (its name and thread)."""


def _pg_time_rows(s: str, shape: Shape) -> list[str]:
    """The delayed dispatches and the schedules of ``shape`` (PostgreSQL)."""
    d, k = shape.scheduled, shape.schedules
    sid = "'s' || lpad(i::text, 8, '0')"
    rows = []
    if d:
        rows += [
            f"""INSERT INTO {s}.threads (thread_id, present)
                SELECT {sid}, true FROM generate_series(1, {d}) i""",
            f"""INSERT INTO {s}.dispatches (dispatch_id, thread_id, kind, payload, priority,
                    available_at, max_attempts, status, attempts, created_at, updated_at)
                SELECT 'ds-' || i, {sid}, 'start', replace('{START_PAYLOAD}', 'TENANT', 'x'),
                       0, now() + interval '1 day', 5, 'scheduled', 0, now(), now()
                  FROM generate_series(1, {d}) i""",
        ]
    if k:
        rows.append(
            f"""INSERT INTO {s}.schedules (name, tenant, paused, next_fire_at, revision,
                    created_at, updated_at, body)
                SELECT 'sch-' || i, NULL, false, now() + interval '1 day', 1, now(), now(),
                       replace('{SCHEDULE}', 'SNAME', 'sch-' || i)
                  FROM generate_series(1, {k}) i"""
        )
    return rows


def _pg_checkpoint(cp_id: str, parent: str, tenant: str) -> str:
    """SQL text computing the body from SQL expressions."""
    return (
        f"replace(replace(replace('{CHECKPOINT}', 'CPID', {cp_id}), 'PARENT', {parent}), "
        f"'TENANT', {tenant})"
    )


def postgres_statements(schema: str, shape: Shape) -> list[str]:
    """The statements that fill a freshly migrated PostgreSQL schema (quoted identifier)."""
    s, n, p, lease = schema, shape.threads, shape.pending, shape.leased
    tenant = f"'tenant-' || (i % {TENANTS})"
    tid = "'t' || lpad(i::text, 8, '0')"
    qid = "'q' || lpad(i::text, 8, '0')"
    big_parent = "CASE WHEN i = 1 THEN 'null' ELSE '\"big-c' || (i - 1) || '\"' END"
    thread_cp = _pg_checkpoint("'c-' || i", "'null'", tenant)
    big_cp = _pg_checkpoint("'big-c' || i", big_parent, "'tenant-0'")
    quiet_cp = _pg_checkpoint("'quiet-c1'", "'null'", f"'{QUIET}'")
    return [
        # the first ``leased`` threads are held by live claims, written here rather than by
        # an UPDATE afterwards: that would leave a dead version of each row (no vacuum runs
        # in the "without statistics" state) for every later read to step over
        f"""INSERT INTO {s}.threads (thread_id, present, version, tenant, status,
                latest_checkpoint, next_seq, updated_at, claim_holder, claim_token, epoch,
                claim_expires)
            SELECT {tid}, true, 1, {tenant}, 'completed', 'c-' || i, 2, now(),
                   CASE WHEN i <= {lease} THEN 'bench' END,
                   CASE WHEN i <= {lease} THEN 1 END,
                   CASE WHEN i <= {lease} THEN 1 ELSE 0 END,
                   CASE WHEN i <= {lease} THEN now() + interval '1 day' END
              FROM generate_series(1, {n}) i""",
        f"""INSERT INTO {s}.checkpoints (thread_id, version, checkpoint_id, at, body)
            SELECT {tid}, 1, 'c-' || i, now(), {thread_cp}
              FROM generate_series(1, {n}) i""",
        f"""INSERT INTO {s}.events (thread_id, seq, at, body)
            SELECT {tid}, 1, now(), '{EVENT}' FROM generate_series(1, {n}) i""",
        *_pg_time_rows(s, shape),
        f"""INSERT INTO {s}.threads (thread_id, present, tenant)
            SELECT {qid}, true, {tenant} FROM generate_series(1, {p}) i""",
        f"""INSERT INTO {s}.dispatches (dispatch_id, thread_id, kind, payload, priority,
                available_at, max_attempts, status, attempts, created_at, updated_at, tenant)
            SELECT 'dp-' || i, {qid}, 'start', replace('{START_PAYLOAD}', 'TENANT', {tenant}),
                   0, now(), 5, 'pending', 0, now(), now(), {tenant}
              FROM generate_series(1, {p}) i""",
        f"""INSERT INTO {s}.dispatches (dispatch_id, thread_id, kind, payload, priority,
                available_at, max_attempts, status, attempts, token, holder, lease_until,
                lease_expires, created_at, updated_at, tenant)
            SELECT 'dl-' || i, {tid}, 'start', replace('{START_PAYLOAD}', 'TENANT', {tenant}),
                   0, now(), 5, 'leased', 1, 1, 'bench', now() + interval '1 day',
                   now() + interval '1 day', now(), now(), {tenant}
              FROM generate_series(1, {lease}) i""",
        f"""INSERT INTO {s}.dispatches (dispatch_id, thread_id, kind, payload, priority,
                available_at, max_attempts, status, attempts, created_at, updated_at, tenant)
            SELECT 'dd-' || i, {tid}, 'start', replace('{START_PAYLOAD}', 'TENANT', {tenant}),
                   0, now(), 5, 'done', 1, now(), now(), {tenant}
              FROM generate_series(1, {n}) i""",
        # the big thread: one run of many checkpoints, a long event log, many messages
        f"""INSERT INTO {s}.threads (thread_id, present, version, tenant, status,
                latest_checkpoint, next_seq, message_count, updated_at)
            VALUES ('{BIG}', true, {shape.checkpoints}, 'tenant-0', 'completed',
                    'big-c{shape.checkpoints}', {shape.events + 1}, {shape.messages}, now())""",
        f"""INSERT INTO {s}.checkpoints (thread_id, version, checkpoint_id, at, body)
            SELECT '{BIG}', i, 'big-c' || i, now(),
                   {big_cp}
              FROM generate_series(1, {shape.checkpoints}) i""",
        f"""INSERT INTO {s}.events (thread_id, seq, at, body)
            SELECT '{BIG}', i, now(), '{EVENT}' FROM generate_series(1, {shape.events}) i""",
        f"""INSERT INTO {s}.messages (thread_id, pos, message_id, body)
            SELECT '{BIG}', i - 1, 'm-' || i, replace('{MESSAGE}', 'MSGID', 'm-' || i)
              FROM generate_series(1, {shape.messages}) i""",
        f"""INSERT INTO {s}.threads (thread_id, present, version, tenant, status,
                latest_checkpoint, next_seq, updated_at)
            VALUES ('quiet-1', true, 1, '{QUIET}', 'completed', 'quiet-c1', 1, now())""",
        f"""INSERT INTO {s}.checkpoints (thread_id, version, checkpoint_id, at, body)
            VALUES ('quiet-1', 1, 'quiet-c1', now(),
                    {quiet_cp})""",
        f"""INSERT INTO {s}.dispatches (dispatch_id, thread_id, kind, payload, priority,
                available_at, max_attempts, status, attempts, created_at, updated_at, tenant)
            SELECT 'dq-' || i, 'quiet-1', 'start',
                   replace('{START_PAYLOAD}', 'TENANT', '{QUIET}'), 0, now(), 5, 'done', 1,
                   now(), now(), '{QUIET}'
              FROM generate_series(1, 2) i""",
    ]


def _us(dt: datetime) -> int:
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def fill_sqlite(conn: sqlite3.Connection, shape: Shape, now: datetime | None = None) -> None:
    """Fill a freshly migrated SQLite store (one transaction; the caller commits)."""
    at = _us(now or datetime.now(UTC))
    later = at + 86_400_000_000
    n, p, lease = shape.threads, shape.pending, shape.leased
    series = "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)"
    tenant = f"'tenant-' || (i % {TENANTS})"
    tid, qid = "printf('t%08d', i)", "printf('q%08d', i)"

    def checkpoint(cp_id: str, parent: str, owner: str) -> str:
        return (
            f"replace(replace(replace(?, 'CPID', {cp_id}), 'PARENT', {parent}), 'TENANT', {owner})"
        )

    columns = (
        "dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts, "
        "status, attempts, token, holder, lease_until, lease_expires, created_at, "
        "updated_at, tenant, owner"
    )
    run = conn.execute
    thread_cp = checkpoint("'c-' || i", "'null'", tenant)
    run(
        f"{series} INSERT INTO threads (thread_id, version, tenant, latest_pos, latest_id, "
        f"latest_status, next_seq, updated_at) "
        f"SELECT {tid}, 1, {tenant}, 0, 'c-' || i, 'completed', 2, ? FROM s",
        (n, at),
    )
    run(
        f"{series} INSERT INTO checkpoints (thread_id, pos, checkpoint_id, at, body, {SEGMENT}) "
        f"SELECT {tid}, 0, 'c-' || i, ?, {thread_cp}, 'run-1', 'completed', NULL, 0, 1 FROM s",
        (n, at, CHECKPOINT),
    )
    run(
        f"{series} INSERT INTO events (thread_id, seq, at, type, data, run_id) "
        f"SELECT {tid}, 1, ?, 'step', '{{\"n\":1}}', 'run-1' FROM s",
        (n, at),
    )
    if shape.scheduled:
        sid = "printf('s%08d', i)"
        run(f"{series} INSERT INTO threads (thread_id) SELECT {sid} FROM s", (shape.scheduled,))
        run(
            f"{series} INSERT INTO dispatches ({columns}) "
            f"SELECT 'ds-' || i, {sid}, 'start', replace(?, 'TENANT', 'x'), 0, ?, 5, "
            f"'scheduled', 0, NULL, NULL, NULL, NULL, ?, ?, NULL, NULL FROM s",
            (shape.scheduled, START_PAYLOAD, later, at, at),
        )
    if shape.schedules:
        run(
            f"{series} INSERT INTO schedules (name, tenant, paused, next_fire_at, revision, "
            f"created_at, updated_at, body) SELECT 'sch-' || i, NULL, 0, ?, 1, ?, ?, "
            f"replace(?, 'SNAME', 'sch-' || i) FROM s",
            (shape.schedules, later, at, at, SCHEDULE),
        )
    run(
        f"{series} INSERT INTO threads (thread_id, tenant) SELECT {qid}, {tenant} FROM s",
        (p,),
    )
    run(
        f"{series} INSERT INTO dispatches ({columns}) "
        f"SELECT 'dp-' || i, {qid}, 'start', replace(?, 'TENANT', {tenant}), 0, ?, 5, "
        f"'pending', 0, NULL, NULL, NULL, NULL, ?, ?, {tenant}, {tenant} FROM s",
        (p, START_PAYLOAD, at, at, at),
    )
    run(
        f"{series} INSERT INTO epochs (thread_id, epoch) SELECT {tid}, 1 FROM s",
        (lease,),
    )
    run(
        "UPDATE threads SET holder = 'bench', token = 1, expires_at = ? "
        "WHERE thread_id BETWEEN 't00000001' AND printf('t%08d', ?)",
        (later, lease),
    )
    run(
        f"{series} INSERT INTO dispatches ({columns}) "
        f"SELECT 'dl-' || i, {tid}, 'start', replace(?, 'TENANT', {tenant}), 0, ?, 5, "
        f"'leased', 1, 1, 'bench', ?, ?, ?, ?, {tenant}, {tenant} FROM s",
        (lease, START_PAYLOAD, at, later, later, at, at),
    )
    run(
        f"{series} INSERT INTO dispatches ({columns}) "
        f"SELECT 'dd-' || i, {tid}, 'start', replace(?, 'TENANT', {tenant}), 0, ?, 5, "
        f"'done', 1, NULL, NULL, NULL, NULL, ?, ?, {tenant}, {tenant} FROM s",
        (n, START_PAYLOAD, at, at, at),
    )
    run(
        "INSERT INTO threads (thread_id, version, tenant, latest_pos, latest_id, "
        "latest_status, next_seq, message_count, updated_at) "
        "VALUES (?, ?, 'tenant-0', ?, ?, 'completed', ?, ?, ?)",
        (
            BIG,
            shape.checkpoints,
            shape.checkpoints - 1,
            f"big-c{shape.checkpoints}",
            shape.events + 1,
            shape.messages,
            at,
        ),
    )
    big_parent = "CASE WHEN i = 1 THEN 'null' ELSE '\"big-c' || (i - 1) || '\"' END"
    big_cp = checkpoint("'big-c' || i", big_parent, "'tenant-0'")
    run(
        f"{series} INSERT INTO checkpoints (thread_id, pos, checkpoint_id, at, body, {SEGMENT}) "
        f"SELECT '{BIG}', i - 1, 'big-c' || i, ?, "
        f"{big_cp}, 'run-1', 'completed', NULL, 0, i FROM s",
        (shape.checkpoints, at, CHECKPOINT),
    )
    run(
        f"{series} INSERT INTO events (thread_id, seq, at, type, data, run_id) "
        f"SELECT '{BIG}', i, ?, 'step', '{{\"n\":1}}', 'run-1' FROM s",
        (shape.events, at),
    )
    run(
        f"{series} INSERT INTO messages (thread_id, pos, message_id, body) "
        f"SELECT '{BIG}', i - 1, 'm-' || i, replace(?, 'MSGID', 'm-' || i) FROM s",
        (shape.messages, MESSAGE),
    )
    run(
        "INSERT INTO threads (thread_id, version, tenant, latest_pos, latest_id, "
        "latest_status, next_seq, updated_at) VALUES ('quiet-1', 1, ?, 0, 'quiet-c1', "
        "'completed', 1, ?)",
        (QUIET, at),
    )
    run(
        f"INSERT INTO checkpoints (thread_id, pos, checkpoint_id, at, body, {SEGMENT}) "
        "VALUES ('quiet-1', 0, 'quiet-c1', ?, replace(replace(replace(?, 'CPID', 'quiet-c1'), "
        "'PARENT', 'null'), 'TENANT', ?), 'run-1', 'completed', NULL, 0, 1)",
        (at, CHECKPOINT, QUIET),
    )
    run(
        f"{series} INSERT INTO dispatches ({columns}) "
        f"SELECT 'dq-' || i, 'quiet-1', 'start', replace(?, 'TENANT', ?), 0, ?, 5, 'done', 1, "
        f"NULL, NULL, NULL, NULL, ?, ?, ?, ? FROM s",
        (2, START_PAYLOAD, QUIET, at, at, at, QUIET, QUIET),
    )
