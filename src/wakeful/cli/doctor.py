"""``wakeful doctor``: what the store's server looks like from this host.

For PostgreSQL, without opening a store (nothing is migrated or written): the server's
role (primary or standby) and version, its replication (standbys, whether commits wait
for one, the lags this role may see), the pooler in front of it (``pooler.detect``: none, a
session proxy, or a transaction pooler), the clock skew between this host and the server,
and the schema version against this wakeful's. Warnings say what to look at; they do not
change the exit code. Other stores are opened and read once.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import click

from wakeful.cli.common import (
    console,
    describe_url,
    emit,
    json_option,
    run_async,
    store_option,
    store_url,
    table,
)


async def postgres_report(url: str, schema: str) -> dict[str, Any]:
    """The server report of the PostgreSQL server at ``url`` and ``schema``'s version."""
    import psycopg
    from psycopg import sql

    from wakeful.store.postgres import latest_version, pooler, serverinfo
    from wakeful.store.postgres.connection import check_schema, probe
    from wakeful.store.postgres.translate import unavailable

    schema = check_schema(schema)
    await probe(url, 10.0)  # unreachable or refused: one line, the CLI's exit code
    try:
        found = await pooler.detect(url)
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, prepare_threshold=None
        ) as conn:
            report = (await serverinfo.inspect(conn, found.mode)).to_json()
            ledger = sql.Identifier(schema, "schema_migrations").as_string(conn)
            cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (ledger,))
            row = await cur.fetchone()
            version = 0
            if row is not None and row[0]:
                cur = await conn.execute(
                    sql.SQL("SELECT coalesce(max(version), 0) FROM {}").format(
                        sql.Identifier(schema, "schema_migrations")
                    )
                )
                got = await cur.fetchone()
                version = int(got[0]) if got is not None else 0
    except psycopg.OperationalError as exc:
        raise unavailable(exc) from exc
    latest = latest_version()
    if version < latest:
        report["warnings"].append(
            f"schema {schema!r} is at version {version}, this wakeful needs {latest}: "
            "run `wakeful migrate`"
        )
    elif version > latest:
        report["warnings"].append(
            f"schema {schema!r} is at version {version}, newer than this wakeful ({latest})"
        )
    return {"store": describe_url(url), "schema": schema, "schema_version": version, **report}


def _render(report: dict[str, Any]) -> None:
    shown = ("role", "server_version", "replication", "synchronous_standby_names", "pooler")
    rows = [(key, report[key]) for key in ("store", *shown) if key in report]
    if "clock_skew" in report:
        rows.append(
            (
                "clock skew",
                f"{report['clock_skew']:+.4f} s (± {report['round_trip'] / 2:.4f} s)",
            )
        )
    if "schema_version" in report:
        rows.append(("schema version", report["schema_version"]))
    for standby in report.get("standbys") or ():
        lag = standby.get("flush_lag")
        rows.append(
            (
                f"standby {standby.get('name') or '?'}",
                f"{standby.get('state')}, {standby.get('sync_state')}, flush lag "
                f"{'unknown' if lag is None else f'{lag:.3f} s'}",
            )
        )
    if report.get("receiving_from"):
        source = report["receiving_from"]
        rows.append(("receiving from", f"{source.get('host')}:{source.get('port')}"))
    table("wakeful doctor", ["check", "found"], rows)
    for warning in report.get("warnings", ()):
        console.print(f"warning: {warning}", highlight=False)


@click.command()
@store_option
@click.option("--schema", default="wakeful", show_default=True, help="PostgreSQL schema.")
@json_option
@run_async
async def doctor(store: str | None, schema: str, as_json: bool) -> None:
    """Report the store's server: role (primary or standby), replication, the pooler in
    front of it, clock skew with this host, schema version (PostgreSQL); others: answers."""
    url = store_url(store)
    if urlsplit(url).scheme.lower() in ("postgresql", "postgres"):
        report = await postgres_report(url, schema)
    else:
        from wakeful import open_store

        async with open_store(url) as opened:
            await opened.read("wakeful-doctor")
        report = {"store": describe_url(url), "answers": True, "warnings": []}
    emit(report, as_json, _render)
