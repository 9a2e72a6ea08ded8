"""A PostgreSQL server of a test's own, for faults that restart the server.

Restarting the machine's shared server (``pg_ctlcluster ... restart``) cuts every other user
of it at once: the other worker of a parallel test run, a second checkout's tests, a
developer's psql. A test whose fault is a restart runs against a private server instead
(``tests.pgcluster.Node``: ``initdb`` on a free loopback port, its own temporary directory),
built with the store's migrations, and restarts that one.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from tests.pgbouncer import as_server_user
from tests.pgcluster import Node, pg_bin, require_binaries
from tests.postgres_support import SCHEMA
from wakeful.store.postgres import migrate

DATABASE = "wakeful"
# The cluster helper's primaries wait for a synchronous standby; this server has none.
ALONE = "synchronous_standby_names = ''\nmax_connections = 100\n"


@dataclass
class PrivateServer:
    """A running private server with one migrated database at ``url``."""

    node: Node
    url: str

    def restart(self) -> None:
        """A clean restart: a fast shutdown (sessions cut, nothing acknowledged lost), then
        a start; returns once the server answers again."""
        subprocess.run(
            [*as_server_user(), pg_bin("pg_ctl"), "-D", str(self.node.data), "stop", "-m", "fast"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        if self.node.process is not None:
            self.node.process.wait(timeout=30)
        self.node.start()


def start_private_server() -> PrivateServer:
    """A new private server, started, with the database ``wakeful`` migrated. The caller
    removes it (``server.node.remove()``)."""
    require_binaries()
    node = Node.init(extra_conf=ALONE)
    try:
        node.start()
        with psycopg.connect(node.url(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DATABASE}")
        url = node.url(DATABASE)
        asyncio.run(migrate(url, schema=SCHEMA))
    except BaseException:
        node.remove()
        raise
    return PrivateServer(node, url)


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    server = start_private_server()
    try:
        yield server
    finally:
        server.node.remove()


__all__ = ["PrivateServer", "private_server", "start_private_server"]
