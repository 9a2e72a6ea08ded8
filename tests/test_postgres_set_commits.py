"""The set-based commit_many of schema version 9 (issue 22, second round) answers and writes
exactly what commit() does, commit by commit: every check, refusal (SQLSTATE and DETAIL),
replay and write, compared against commit() on the same database state."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import Databases, open_test_store
from wakeful.records import (
    Checkpoint,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    PendingWrite,
    Retry,
    Settle,
)
from wakeful.store.postgres import migrations
from wakeful.store.postgres.connection import render
from wakeful.store.postgres.group import COMMIT_MANY, batch_params
from wakeful.store.postgres.store import PostgresStore
from wakeful.store.postgres.threads import COMMIT, _commit_params
from wakeful.store.validate import encode_commit

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

Params = tuple[object, ...]

# Everything a commit writes, without the columns that hold the writing transaction's time.
_STATE = """
SELECT 'threads ' || (to_jsonb(x) - 'updated_at')::text FROM wakeful.threads x
UNION ALL SELECT 'checkpoints ' || (to_jsonb(x) - 'at')::text FROM wakeful.checkpoints x
UNION ALL SELECT 'events ' || (to_jsonb(x) - 'at')::text FROM wakeful.events x
UNION ALL SELECT 'receipts ' || (to_jsonb(x) - 'at')::text FROM wakeful.receipts x
UNION ALL SELECT 'writes ' || to_jsonb(x)::text FROM wakeful.writes x
UNION ALL SELECT 'dispatches ' || (to_jsonb(x) - 'updated_at' - 'available_at')::text
  FROM wakeful.dispatches x
"""
_CALLED = """
SELECT funcname, calls FROM pg_stat_xact_user_functions
 WHERE schemaname = 'wakeful' AND funcname IN ('commit', 'commit_each', 'checkpoint_segment')
"""


def _cp(cid: str, parent: str | None, tenant: str | None = None, run: str = "r") -> Checkpoint:
    return Checkpoint(
        id=cid,
        parent=parent,
        run_id=run,
        status="running",
        state={"at": cid},
        created_at=datetime.now(UTC),
        tenant=tenant,
        metadata={"graph": "g"},
    )


def _events(*types: str) -> tuple[EventDraft, ...]:
    return tuple(EventDraft(type=t) for t in types)


async def _scenarios(store: PostgresStore) -> dict[str, Params]:
    """One commit per case, each on a thread of its own, prepared through the store."""
    for name in ("ok", "retry", "release"):
        await store.enqueue(Dispatch(dispatch_id=f"d-{name}", thread_id=f"t-{name}", kind="start"))
    leases = {lease.dispatch.thread_id: lease for lease in await store.claim_next("w", 60, 10)}
    assert len(leases) == 3
    claims = {t: await store.claim(t, "w", 60) for t in (
        "t-events", "t-stale", "t-replay", "t-released", "t-conflict", "t-version", "t-parent",
        "t-used", "t-tenant", "t-bind", "t-nodispatch", "t-other", "t-notleased", "t-writes",
        "t-segment",
    )}  # fmt: skip
    token = {t: c.token for t, c in claims.items()}
    token.update({t: lease.claim.token for t, lease in leases.items()})
    # states the cases need
    again = Commit(token=token["t-replay"], events=_events("a"), operation_id="op-replay")
    await store.commit("t-replay", again)
    released = Commit(
        token=token["t-released"], checkpoint=_cp("rel-1", None), operation_id="op-rel",
        release=True,
    )  # fmt: skip
    await store.commit("t-released", released)
    await store.commit(
        "t-conflict", Commit(token=token["t-conflict"], events=_events("a"), operation_id="op-c")
    )
    for cid, parent in (("u1", None), ("u2", "u1")):
        await store.commit("t-used", Commit(token=token["t-used"], checkpoint=_cp(cid, parent)))
    await store.commit(
        "t-tenant", Commit(token=token["t-tenant"], checkpoint=_cp("tn1", None, "acme"))
    )
    await store.enqueue(Dispatch(dispatch_id="d-bind", thread_id="t-bind", kind="resume"))
    await store.enqueue(Dispatch(dispatch_id="d-x", thread_id="t-x", kind="start"))
    await store.enqueue(Dispatch(dispatch_id="d-notleased", thread_id="t-notleased", kind="start"))
    await store.commit("t-writes", Commit(token=token["t-writes"], checkpoint=_cp("w1", None)))
    write = PendingWrite(checkpoint_id="w1", task_id="task", node="n", value={"v": 1})
    await store.commit("t-writes", Commit(token=token["t-writes"], writes=(write,)))
    await store.commit(
        "t-segment", Commit(token=token["t-segment"], checkpoint=_cp("s1", None, run="r1"))
    )

    def done(d: str) -> Settle:
        return Settle(dispatch_id=d, outcome=Done())

    cases = {
        "t-ok": Commit(
            token=token["t-ok"], checkpoint=_cp("ok-1", None), events=_events("a", "b"),
            operation_id="op-ok", settle=done("d-ok"),
        ),
        "t-retry": Commit(
            token=token["t-retry"], events=_events("failed"),
            settle=Settle(dispatch_id="d-retry", outcome=Retry(delay=5, error="boom")),
        ),
        "t-release": Commit(token=token["t-release"], checkpoint=_cp("rl", None), release=True),
        "t-events": Commit(token=token["t-events"], events=_events("x", "y", "z")),
        "t-stale": Commit(token=token["t-stale"] + 1, events=_events("x")),
        "t-missing": Commit(token=3, events=_events("x")),
        "t-replay": again,
        "t-released": released,
        "t-conflict": Commit(token=token["t-conflict"], events=_events("b"), operation_id="op-c"),
        "t-version": Commit(token=token["t-version"], expected_version=5, events=_events("x")),
        "t-parent": Commit(token=token["t-parent"], checkpoint=_cp("p1", "nope")),
        "t-used": Commit(token=token["t-used"], checkpoint=_cp("u1", "u2")),
        "t-tenant": Commit(token=token["t-tenant"], checkpoint=_cp("tn2", "tn1", "other")),
        "t-bind": Commit(
            token=token["t-bind"], checkpoint=_cp("b1", None, "acme"), operation_id="op-b"
        ),
        "t-nodispatch": Commit(token=token["t-nodispatch"], settle=done("nope")),
        "t-other": Commit(token=token["t-other"], settle=done("d-x")),
        "t-notleased": Commit(token=token["t-notleased"], settle=done("d-notleased")),
        "t-writes": Commit(token=token["t-writes"], checkpoint=_cp("w2", "w1")),
        "t-segment": Commit(token=token["t-segment"], checkpoint=_cp("s2", "s1", run="r1")),
    }  # fmt: skip
    return {t: (t, c.token, *_commit_params(encode_commit(t, c))) for t, c in sorted(cases.items())}


def _answer(row: Any) -> tuple[Any, ...]:
    """commit_many's row as (outputs, code, detail as JSON)."""
    *outputs, code, detail = row
    return tuple(outputs), code, None if detail is None else json.loads(detail)


async def _state(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    rows = await (await conn.execute(_STATE)).fetchall()
    return sorted(str(r[0]) for r in rows)


async def _singly(
    conn: psycopg.AsyncConnection[Any], cases: dict[str, Params]
) -> tuple[dict[str, tuple[Any, ...]], list[str]]:
    """commit() once per case, each in a savepoint, in one transaction rolled back: each
    answer (as commit_many reports it) and the state after all of them."""
    single = render(COMMIT, conn, "wakeful")
    answers: dict[str, tuple[Any, ...]] = {}
    async with conn.transaction(force_rollback=True):
        for thread, params in cases.items():
            try:
                async with conn.transaction():
                    row = await (await conn.execute(single, params)).fetchone()
                    assert row is not None
                    answers[thread] = (tuple(row), None, None)
            except psycopg.Error as exc:
                detail = exc.diag.message_detail
                answers[thread] = ((None,) * 5, exc.sqlstate, detail and json.loads(detail))
        state = await _state(conn)
    return answers, state


async def _grouped(
    conn: psycopg.AsyncConnection[Any], batch: list[Params]
) -> tuple[list[tuple[Any, ...]], list[str], dict[str, int]]:
    """One commit_many call in a transaction rolled back: its answers, the state after it and
    the calls it made of commit(), commit_each() and the segment trigger."""
    many = render(COMMIT_MANY, conn, "wakeful")
    async with conn.transaction(force_rollback=True):
        before = await _calls(conn)
        rows = await (await conn.execute(many, batch_params(batch))).fetchall()
        state = await _state(conn)
        after = await _calls(conn)
    called = {f: n - before.get(f, 0) for f, n in after.items() if n > before.get(f, 0)}
    return [_answer(row) for row in rows], state, called


async def _calls(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """Calls of the functions in ``_CALLED`` this session counted and has not reported."""
    return {str(f): int(n) for f, n in await (await conn.execute(_CALLED)).fetchall()}


async def test_a_batch_answers_and_writes_what_commit_does_commit_by_commit(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        cases = await _scenarios(store)
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SET track_functions = 'pl'")
        expected, state = await _singly(conn, cases)
        # every kind of answer is among the cases
        codes = {code for _, code, _ in expected.values()}
        assert codes == {None, "WK001", "WK002", "WK003", "WK004", "WK005", "WK006"}
        assert expected["t-replay"][0][0] is True and expected["t-released"][0][0] is True
        assert expected["t-ok"][0][0] is False
        # the whole batch at once: the set-based path (no commit() call, no trigger call)
        answers, batch_state, called = await _grouped(conn, list(cases.values()))
        assert answers == list(expected.values())
        assert batch_state == state
        assert called == {}
        # each alone: the same path, the same answer, the state of that commit alone
        for thread in ("t-ok", "t-used", "t-bind", "t-writes", "t-release"):
            _, alone = await _singly(conn, {thread: cases[thread]})
            one, one_state, called = await _grouped(conn, [cases[thread]])
            assert one == [expected[thread]] and one_state == alone and called == {}
        # without a release or a thread with pending writes: the statement without those
        # parts (migration 0012), the same answers and state as commit() by commit()
        lean = {t: p for t, p in cases.items() if t not in ("t-release", "t-released", "t-writes")}
        expected, state = await _singly(conn, lean)
        answers, batch_state, called = await _grouped(conn, list(lean.values()))
        assert answers == list(expected.values()) and batch_state == state and called == {}
        assert {code for _, code, _ in expected.values()} == codes


async def test_a_batch_that_needs_commit_each_gives_the_same_answers(
    pg_databases: Databases,
) -> None:
    """A thread twice in one batch, or a commit with pending writes: each commit runs
    through commit() in a subtransaction (version 6's way), with the same answers."""
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        cases = await _scenarios(store)
        claim = await store.claim("t-w2", "w", 60)
        await store.commit("t-w2", Commit(token=claim.token, checkpoint=_cp("x1", None)))
    finally:
        await store.close()
    write = PendingWrite(checkpoint_id="x1", task_id="task", node="n", value={"v": 2})
    with_write = Commit(token=claim.token, writes=(write,), events=_events("w"))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SET track_functions = 'pl'")
        everything = {
            **cases,
            "t-w2": ("t-w2", claim.token, *_commit_params(encode_commit("t-w2", with_write))),
        }
        expected, state = await _singly(conn, everything)
        answers, batch_state, called = await _grouped(conn, list(everything.values()))
        assert answers == list(expected.values()) and batch_state == state
        # (a call that raised is not counted: its subtransaction rolled back)
        accepted = sum(1 for _, code, _ in expected.values() if code is None)
        assert called["commit_each"] == 1 and called["commit"] == accepted
        # the same thread twice: the second sees the first's result
        first = Commit(token=claim.token, events=_events("one"), operation_id="op-1")
        second = Commit(token=claim.token, events=_events("two"), operation_id="op-2")
        twice = [
            ("t-w2", claim.token, *_commit_params(encode_commit("t-w2", c)))
            for c in (first, second)
        ]
        answers, _, called = await _grouped(conn, twice)
        assert [a[0][3] for a in answers] == [1, 2]  # first_seq of each
        assert called["commit_each"] == 1


async def test_a_batch_updates_thread_rows_hot(pg_databases: Databases) -> None:
    """The set-based path names tenant in its UPDATE (for the commit that binds one) but
    changes no indexed column of a thread that committed before: every update is HOT."""
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        batch = []
        for i in range(6):
            tenant = "acme" if i % 2 else None
            claim = await store.claim(f"t{i}", "w", 60)
            await store.commit(
                f"t{i}", Commit(token=claim.token, checkpoint=_cp(f"a{i}", None, tenant))
            )
            second = Commit(
                token=claim.token, checkpoint=_cp(f"b{i}", f"a{i}", tenant), events=_events("e")
            )
            batch.append((f"t{i}", claim.token, *_commit_params(encode_commit(f"t{i}", second))))
    finally:
        await store.close()
    updates = """
    SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
     WHERE schemaname = 'wakeful' AND relname = 'threads'
    """
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        query = render(COMMIT_MANY, conn, "wakeful")
        async with conn.transaction():  # the counts of this transaction
            before = await (await conn.execute(updates)).fetchone()
            rows = await (await conn.execute(query, batch_params(batch))).fetchall()
            after = await (await conn.execute(updates)).fetchone()
    assert [row[5] for row in rows] == [None] * 6
    assert before is not None and after is not None
    assert after[0] - before[0] == 6 and after[1] - before[1] == 6


async def test_a_version_11_process_keeps_its_commit_many_call_across_migration_0012(
    pg_databases: Databases,
) -> None:
    """A fleet mid-upgrade: 0012 replaces commit_many's body with its signature and result
    columns, so a process of version 11, whose group commit is the same statement, keeps
    committing (fenced: a stale token is refused in its row) while and after it is applied."""
    dsn = await pg_databases.clone()
    shipped = migrations.migrations()
    assert shipped[11][0] == 12
    signature = """
    SELECT pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
           p.proconfig
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'old' AND p.proname = 'commit_many'
    """
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier("old")))
        async with conn.transaction():
            for _, _, text in shipped[:11]:
                await conn.execute(render(text, conn, "old"))
            await conn.execute(
                "CREATE TABLE old.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, _ in shipped[:11]:
                await conn.execute(
                    "INSERT INTO old.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
        version_11 = await (await conn.execute(signature)).fetchone()
        for i in range(4):
            await conn.execute(
                f"SELECT old.enqueue('d{i}', 't{i}', 'start', '{{}}', 0, NULL, 5, NULL, NULL)"
            )
        leases = await (
            await conn.execute(
                "SELECT (o_dispatch).thread_id, (o_dispatch).token, (o_dispatch).dispatch_id"
                " FROM old.claim_next_read('old-w', 60, 4)"
            )
        ).fetchall()
        assert len(leases) == 4
        many = render(COMMIT_MANY, conn, "old")

        def batch(rows: list[Any], stale: bool = False) -> list[object]:
            commits = [
                (t, tok + int(stale), *_commit_params(encode_commit(t, Commit(
                    token=tok + int(stale), checkpoint=_cp(f"{t}-1", None),
                    events=_events("done"), operation_id=f"op-{t}",
                    settle=Settle(dispatch_id=d, outcome=Done()),
                ))))
                for t, tok, d in sorted(rows)
            ]  # fmt: skip
            return batch_params(commits)

        before = await (await conn.execute(many, batch(leases[:2]))).fetchall()
        store = await open_test_store(dsn, schema="old")  # migrates to 12
        try:
            version_12 = await (await conn.execute(signature)).fetchone()
            refused = await (await conn.execute(many, batch(leases[2:], stale=True))).fetchall()
            after = await (await conn.execute(many, batch(leases[2:]))).fetchall()
            done = await store.list_dispatches(status="done")
        finally:
            await store.close()
    assert version_11 is not None and version_11 == version_12
    assert [row[5] for row in before] == [None, None] and [row[1] for row in before] == [1, 1]
    assert [row[5] for row in refused] == ["WK001", "WK001"]
    assert [row[5] for row in after] == [None, None] and [row[1] for row in after] == [1, 1]
    assert sorted(d.dispatch_id for d in done) == ["d0", "d1", "d2", "d3"]
