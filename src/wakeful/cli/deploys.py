"""``wakeful runs list``: the threads' latest runs with the code they started on (issue 40),
filtered by version or by a patch they need, for a deploy's operator: which runs still need
the old workers, and whether a patch id can be removed from the code. ``wakeful runs
migrate``: move a version's runs to another version (``DispatchQueue.migrate_runs``)."""

from __future__ import annotations

from typing import Any

import click

from wakeful.cli.common import (
    EXIT_NOT_FOUND,
    builtins,
    emit,
    fail,
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


@runs.command("migrate")
@store_option
@json_option
@click.option("--from", "source", required=True, help="The version whose runs move.")
@click.option("--to", "target", required=True, help="The version that continues them.")
@limit_option(default=10_000)
@run_async
async def runs_migrate(
    store: str | None, as_json: bool, source: str, target: str, limit: int
) -> None:
    """Pin the runs of version FROM to version TO: their next continuation (a resume, a
    retry, a recovery) runs on TO's code, structure changes allowed. Moves pending,
    suspended, quarantined and crashed runs in batches of 100, each with a ``run.migrated``
    event on its thread; a run a worker holds right now stays (run the command again once
    it settles). TO needs a running worker (exit 3 otherwise); nothing to move is exit 3."""

    async def move(s: Any) -> list[dict[str, Any]]:
        moved: list[dict[str, Any]] = []
        while len(moved) < limit:
            batch = await s.migrate_runs(source, target, min(BATCH, limit - len(moved)))
            moved += [
                {"dispatch_id": d.dispatch_id, "thread_id": d.thread_id, "status": d.status}
                for d in batch
            ]
            if len(batch) < BATCH:
                break
        return moved

    rows = await with_store(store_url(store), move, existing=True)
    if not rows:
        fail(f"no run of version {source} can move (none pinned to it, or all held by a "
             "worker right now: see wakeful runs list --version)", EXIT_NOT_FOUND)  # fmt: skip
    emit(
        {"from": source, "to": target, "moved": rows},
        as_json,
        lambda _: table(
            f"moved {len(rows)} from {source} to {target}",
            ["dispatch", "thread", "status"],
            [(r["dispatch_id"], r["thread_id"], r["status"]) for r in rows],
        ),
    )


BATCH = 100


__all__ = ["runs"]
