"""The schema rule (issue 41): every table's primary key includes ``thread_id`` (and so does
every unique index of such a table, as Citus requires of a distributed table), and every
function takes the thread(s) it works on, or the table, unique index or function is listed
in ``wakeful.store.postgres.sharding`` with its reason, which ``docs/sharding.md`` states
word for word. Read from the catalog of a freshly migrated database."""

from __future__ import annotations

import re

import psycopg
import pytest

from tests.postgres_support import ROOT, SCHEMA, Databases
from wakeful.store.postgres import sharding

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres]

DOC = ROOT / "docs" / "sharding.md"

KEYS = """
SELECT t.relname, i.indisprimary, i.indexrelid::regclass::text,
       array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n)
               JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
              ORDER BY k.n)
  FROM pg_class t
  JOIN pg_namespace n ON n.oid = t.relnamespace
  LEFT JOIN pg_index i ON i.indrelid = t.oid AND (i.indisprimary OR i.indisunique)
 WHERE n.nspname = %s AND t.relkind IN ('r', 'p')
"""
FUNCTIONS = """
SELECT p.proname, coalesce(p.proargnames, '{}')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = %s
"""


Keys = dict[str, list[tuple[bool, str, list[str]]]]
"""Per table, its primary key and unique indexes: (primary?, index name, columns)."""


def catalog_keys(dsn: str) -> tuple[Keys, dict[str, set[str]]]:
    tables: Keys = {}
    functions: dict[str, set[str]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, primary, index, columns in conn.execute(KEYS, (SCHEMA,)).fetchall():
            keys = tables.setdefault(table, [])
            if primary is not None:
                keys.append((primary, index.rpartition(".")[2].strip('"'), list(columns)))
        for name, args in conn.execute(FUNCTIONS, (SCHEMA,)).fetchall():
            functions.setdefault(name, set()).update(args)
    return tables, functions


def breaches(tables: Keys, functions: dict[str, set[str]]) -> list[str]:
    """What breaks the rule, one line each."""
    found = []
    listed = sharding.REFERENCE_TABLES
    indexes: set[str] = set()
    for table, keys in sorted(tables.items()):
        indexes.update(index for _, index, _ in keys)
        if table in listed:
            continue
        primary = [cols for is_pk, _, cols in keys if is_pk]
        if not primary or sharding.THREAD_KEY not in primary[0]:
            found.append(f"table {table}: primary key {primary} lacks thread_id, not listed")
        for is_pk, index, cols in keys:
            if is_pk or sharding.THREAD_KEY in cols or index in sharding.FLEET_UNIQUE_KEYS:
                continue
            found.append(f"table {table}: unique key {index} {cols} lacks thread_id, not listed")
    for name, args in sorted(functions.items()):
        if name in sharding.CROSS_THREAD_FUNCTIONS:
            continue
        if not args.intersection(sharding.THREAD_ARGUMENTS):
            found.append(f"function {name}: no thread argument and not listed")
    found += [f"listed table {t} does not exist" for t in sorted(set(listed) - set(tables))]
    found += [
        f"listed unique key {i} does not exist"
        for i in sorted(set(sharding.FLEET_UNIQUE_KEYS) - indexes)
    ]
    found += [
        f"listed function {f} does not exist"
        for f in sorted(set(sharding.CROSS_THREAD_FUNCTIONS) - set(functions))
    ]
    return found


@pytest.mark.asyncio
async def test_every_table_and_function_is_thread_keyed_or_listed(
    pg_databases: Databases,
) -> None:
    tables, functions = catalog_keys(await pg_databases.clone())
    assert breaches(tables, functions) == []
    assert {"threads", "checkpoints", "events", "messages", "receipts"} <= set(tables)


@pytest.mark.asyncio
async def test_the_queue_the_outbox_and_stream_checkpoints_are_keyed_by_thread(
    pg_databases: Databases,
) -> None:
    """Migration 0024: the three tables once addressed by another key have thread_id in
    their primary keys (so a Citus shard holds a thread's rows of each; the queue's leads
    with the dispatch id, see the migration), and only the two fleet-wide unique keys of the
    queue lack it."""
    tables, _ = catalog_keys(await pg_databases.clone())
    primary = {t: next(cols for is_pk, _, cols in keys if is_pk) for t, keys in tables.items()}
    assert primary["dispatches"] == ["dispatch_id", "thread_id"]
    assert primary["outbox"] == ["thread_id", "stage_seq"]
    assert primary["stream_checkpoints"] == ["thread_id", "run_id"]
    unkeyed = {
        index
        for keys in tables.values()
        for _, index, cols in keys
        if sharding.THREAD_KEY not in cols
    }
    assert unkeyed - {k for t in sharding.REFERENCE_TABLES for _, k, _ in tables[t]} == set(
        sharding.FLEET_UNIQUE_KEYS
    )


@pytest.mark.asyncio
async def test_the_rule_sees_an_unkeyed_table_and_function(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{SCHEMA}".notes (note_id text PRIMARY KEY, thread_id text)')
        conn.execute(f'CREATE UNIQUE INDEX notes_by_event ON "{SCHEMA}".events (at, seq)')
        conn.execute(
            f'CREATE FUNCTION "{SCHEMA}".touch(p_note text) RETURNS void'
            " LANGUAGE sql AS $$ SELECT 1 $$"
        )
    assert breaches(*catalog_keys(dsn)) == [
        "table events: unique key notes_by_event ['at', 'seq'] lacks thread_id, not listed",
        "table notes: primary key [['note_id']] lacks thread_id, not listed",
        "function touch: no thread argument and not listed",
    ]


@pytest.mark.asyncio
async def test_the_rule_sees_a_fleet_wide_key_unlisted_or_gone(pg_databases: Databases) -> None:
    """A unique key without thread_id on a thread-keyed table is a breach unless listed by
    its index name; a listed one that is gone is a breach too (the list must stay true)."""
    dsn = await pg_databases.clone()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE UNIQUE INDEX outbox_by_message ON "{SCHEMA}".outbox (message_id)')
        conn.execute(f'DROP INDEX "{SCHEMA}".dispatches_dedupe')
    assert breaches(*catalog_keys(dsn)) == [
        "table outbox: unique key outbox_by_message ['message_id'] lacks thread_id, not listed",
        "listed unique key dispatches_dedupe does not exist",
    ]


def test_every_exception_is_documented_with_its_reason() -> None:
    text = re.sub(r"\s+", " ", DOC.read_text(encoding="utf-8"))
    entries = (
        sharding.REFERENCE_TABLES | sharding.FLEET_UNIQUE_KEYS | sharding.CROSS_THREAD_FUNCTIONS
    )
    missing = [name for name, reason in entries.items() if f"| `{name}` | {reason} |" not in text]
    assert missing == [], f"docs/sharding.md lacks the row `| name | reason |` of {missing}"
