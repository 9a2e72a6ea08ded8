"""``schema.sql`` (issue 41): the generated whole schema is what the migrations leave. A
fresh database migrated step by step and one built from ``schema.sql`` have the same catalog
(tables, columns and their types, defaults, constraints, indexes, sequences, functions with
their bodies and settings, triggers). When a migration is added and ``schema.sql`` is not
regenerated (``python -m wakeful.store.postgres.schemafile``), this test fails."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.postgres_catalog import catalog, differences
from tests.postgres_support import SCHEMA, Databases, dsn_for, open_test_store
from wakeful.store.postgres import migrations, schemafile

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres]


async def empty_database(dbs: Databases) -> str:
    """A new database without any wakeful schema, dropped after the test."""
    name = f"wakeful_t_empty_{len(dbs.created)}_{dbs.template[-8:]}"
    async with await psycopg.AsyncConnection.connect(dsn_for("postgres"), autocommit=True) as a:
        await a.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        await a.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dbs.created.append(name)
    return dsn_for(name)


def test_the_header_names_the_latest_migration() -> None:
    assert schemafile.shipped_version() == migrations.latest_version(), (
        "schema.sql is stale: run `python -m wakeful.store.postgres.schemafile`"
    )


@pytest.mark.asyncio
async def test_schema_file_builds_the_catalog_the_migrations_build(
    pg_databases: Databases,
) -> None:
    migrated = await pg_databases.clone()  # the session's template: migrated step by step
    built = await empty_database(pg_databases)
    async with await psycopg.AsyncConnection.connect(built, autocommit=True) as conn:
        version = await schemafile.load(conn, SCHEMA)

    found = differences(catalog(migrated, SCHEMA), catalog(built, SCHEMA))
    assert found == "", (
        "schema.sql differs from the migrations; regenerate it with "
        "`python -m wakeful.store.postgres.schemafile`:\n" + found
    )

    assert version == migrations.latest_version()
    # the ledger says it is at the latest version: a store opens on it without migrating
    store = await open_test_store(built, migrate=False)
    try:
        claim = await store.claim("t-1", "w", ttl=30)
        assert claim.token == 1
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_the_comparison_sees_a_changed_body_index_and_column(
    pg_databases: Databases,
) -> None:
    """The comparison is what makes the test above fail on a stale file: a changed
    function body, a dropped index and a column of another type are each reported."""
    first, second = await pg_databases.clone(), await pg_databases.clone()
    assert differences(catalog(first, SCHEMA), catalog(second, SCHEMA)) == ""
    s = sql.Identifier(SCHEMA)
    with psycopg.connect(second, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {}.store_now() RETURNS timestamptz"
                " LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT now() + interval '0' $$"
            ).format(s)
        )
        conn.execute(sql.SQL("DROP INDEX {}.dispatches_dedupe").format(s))
        conn.execute(sql.SQL("ALTER TABLE {}.workers ALTER COLUMN generation TYPE int").format(s))
    found = differences(catalog(first, SCHEMA), catalog(second, SCHEMA))
    assert "functions: only in the second: ('store_now'" in found
    assert "indexes: only in the first: ('dispatches', 'dispatches_dedupe'" in found
    assert "columns: only in the second: ('workers', 'generation', 'integer'" in found
