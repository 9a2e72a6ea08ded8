"""The PostgreSQL store: the whole contract for a fleet of hosts (``pip install
'wakeful[postgres]'``).

Open it by URL with ``open_store("postgresql://user@host/db")`` (options: ``pool``,
``pool_size``, ``pool_min_size``, ``pool_timeout``, ``schema``, ``migrate``,
``poll_interval``, ``idle_in_transaction_timeout``), or call ``open_postgres_store``
directly. ``migrate(dsn, schema=...)`` applies the shipped schema migrations without opening
a store. See docs/postgres-store.md.
"""

from __future__ import annotations

from wakeful.store.postgres.migrations import SchemaVersionError, latest_version, migrate
from wakeful.store.postgres.store import PostgresStore, open_postgres_store

__all__ = [
    "PostgresStore",
    "SchemaVersionError",
    "latest_version",
    "migrate",
    "open_postgres_store",
]
