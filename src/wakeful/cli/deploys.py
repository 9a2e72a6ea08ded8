"""``wakeful runs list``: the threads' latest runs with the code they started on (issue 40),
filtered by version or by a patch they need, for a deploy's operator: which runs still need
the old workers, and whether a patch id can be removed from the code."""

from __future__ import annotations

from typing import Any

import click

from wakeful.cli.common import (
    builtins,
    emit,
    json_option,
    limit_option,
    run_async,
    store_option,
    store_url,
    table,
    with_store,
)

PAGE = 200


@click.group()
def runs() -> None:
    """Runs across threads, by the code version they started on."""


@runs.command("list")
@store_option
@json_option
@click.option("--version", "version", default=None, help="Only runs started on this version.")
@click.option("--patch", "patch", default=None, help="Only runs whose code declared this patch id.")
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also finished runs (default: running and suspended ones, which a deploy affects).",
)
@click.option("--tenant", default=None, help="Only this tenant's threads.")
@limit_option()
@run_async
async def runs_list(
    store: str | None,
    as_json: bool,
    version: str | None,
    patch: str | None,
    show_all: bool,
    tenant: str | None,
    limit: int,
) -> None:
    """Each thread's latest run with the version it started on and its patches (the
    checkpoint's ``version`` and ``patches``), by thread id. Reads every thread's latest
    checkpoint: one page of threads at a time, until ``--limit`` runs matched."""

    async def read(s: Any) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after: str | None = None
        while len(found) < limit:
            page = await s.list_threads(tenant=tenant, after=after, limit=PAGE)
            for summary in page:
                if not show_all and summary.status not in ("running", "suspended"):
                    continue
                snap = await s.read(summary.thread_id)
                cp = snap.checkpoint if snap is not None else None
                if cp is None:
                    continue
                started_on = cp.metadata.get("version")
                patches = list(cp.metadata.get("patches") or [])
                if version is not None and started_on != version:
                    continue
                if patch is not None and patch not in patches:
                    continue
                found.append(
                    {
                        "thread_id": summary.thread_id,
                        "run_id": cp.run_id,
                        "status": cp.status,
                        "target": cp.metadata.get("target") or cp.metadata.get("graph"),
                        "version": started_on,
                        "patches": patches,
                        "updated_at": summary.updated_at,
                    }
                )
                if len(found) == limit:
                    break
            if len(page) < PAGE:
                break
            after = page[-1].thread_id
        return found

    rows = await with_store(store_url(store), read, existing=True)
    emit(
        builtins(rows),
        as_json,
        lambda _: table(
            "runs",
            ["thread", "run", "status", "target", "version", "patches"],
            [
                (
                    r["thread_id"],
                    r["run_id"],
                    r["status"],
                    r["target"] or "",
                    r["version"] or "",
                    ", ".join(r["patches"]),
                )
                for r in rows
            ],
        ),
    )


__all__ = ["runs"]
