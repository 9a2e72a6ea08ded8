"""Fixtures of the PostgreSQL tests, loaded with ``pytest_plugins = ["tests.postgres_fixtures"]``
(helpers live in ``tests.postgres_support``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import SCHEMA, Databases, drop_database, dsn_for
from wakeful.store.postgres import migrate


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database for the session, dropped at its end."""
    name = f"wakeful_tpl_{os.getpid()}"
    drop_database(name)
    with psycopg.connect(dsn_for("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        asyncio.run(migrate(dsn_for(name), schema=SCHEMA))
        yield name
    finally:
        drop_database(name)


@pytest.fixture
def pg_databases(pg_template: str) -> Iterator[Databases]:
    """Fresh databases for one test, all dropped after it."""
    dbs = Databases(pg_template)
    try:
        yield dbs
    finally:
        dbs.drop_created()
