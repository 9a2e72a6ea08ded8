"""``wakeful schedules list|show|create|pause|resume|trigger|delete|fire`` (issue 38; see
docs/schedules.md). Workers fire due ticks by themselves; ``fire`` does it once by hand."""

from __future__ import annotations

from typing import Any

import click

from wakeful.cli.common import (
    builtins,
    emit,
    json_option,
    limit_option,
    parse_json,
    run_async,
    show_dispatch,
    store_option,
    store_url,
    table,
    with_store,
)

COLUMNS = ("name", "tenant", "when", "target", "thread", "next fire", "paused", "fired")


def _when(s: Any) -> str:
    return f"cron {s.cron} ({s.timezone})" if s.cron is not None else f"every {s.every:g}s"


def _rows(rows: list[Any]) -> list[list[Any]]:
    return [
        [
            s.name,
            s.tenant,
            _when(s),
            s.target,
            s.thread or s.thread_template,
            s.next_fire_at.isoformat() if s.next_fire_at else None,
            "yes" if s.paused else "",
            s.fired,
        ]
        for s in rows
    ]


def _show(s: Any, as_json: bool) -> None:
    data = builtins(s)
    emit(
        data, as_json, lambda _: table(f"schedule {s.name}", ["field", "value"], list(data.items()))
    )


@click.group()
def schedules() -> None:
    """Recurring runs: cron or interval ticks, each fired once per fleet (docs/schedules.md)."""


@schedules.command("list")
@click.option("--tenant", default=None, help="Only this tenant's schedules.")
@store_option
@json_option
@limit_option()
@run_async
async def schedules_list(tenant: str | None, store: str | None, as_json: bool, limit: int) -> None:
    """Schedules by name, with their next tick."""
    rows = await with_store(
        store_url(store), lambda s: s.list_schedules(tenant=tenant, limit=limit), existing=True
    )
    emit(builtins(rows), as_json, lambda _: table("schedules", COLUMNS, _rows(rows)))


@schedules.command("show")
@click.argument("name")
@store_option
@json_option
@run_async
async def schedules_show(name: str, store: str | None, as_json: bool) -> None:
    """One schedule, every field."""
    from wakeful.errors import NotFound

    found = await with_store(store_url(store), lambda s: s.get_schedule(name), existing=True)
    if found is None:
        raise NotFound("schedule", name)
    _show(found, as_json)


@schedules.command("create")
@click.argument("name")
@click.argument("target")
@click.option("--cron", default=None, help='A cron expression, e.g. "0 9 * * MON-FRI".')
@click.option("--every", default=None, help="Or an interval: 30s, 10m, 1h, 2d.")
@click.option("--thread", default=None, help="The thread every tick runs on.")
@click.option("--thread-template", default=None, help="Or a thread per tick, e.g. digest-{date}.")
@click.option("--timezone", default="UTC", show_default=True, help="The cron's time zone.")
@click.option(
    "--overlap",
    type=click.Choice(["skip", "enqueue", "allow"]),
    default="skip",
    show_default=True,
    help="A tick while the previous tick's run is unfinished.",
)
@click.option(
    "--catch-up",
    type=click.Choice(["skip", "latest", "all"]),
    default="latest",
    show_default=True,
    help="Ticks missed while nothing fired.",
)
@click.option(
    "--max-catch-up",
    default=10,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="With --catch-up all: fire at most this many of the missed ticks (the latest).",
)
@click.option("--input", "input_json", default=None, help="Each run's input, as JSON.")
@click.option("--tenant", default=None, help="The tenant the runs are submitted for.")
@click.option("--paused", is_flag=True, help="Create it paused.")
@store_option
@json_option
@run_async
async def schedules_create(
    name: str,
    target: str,
    cron: str | None,
    every: str | None,
    thread: str | None,
    thread_template: str | None,
    timezone: str,
    overlap: Any,
    catch_up: Any,
    max_catch_up: int,
    input_json: str | None,
    tenant: str | None,
    paused: bool,
    store: str | None,
    as_json: bool,
) -> None:
    """Create or replace the schedule NAME running TARGET (--cron or --every; --thread or
    --thread-template). Its first tick is the first after now."""
    from wakeful.fleet.delays import parse_duration
    from wakeful.fleet.schedules import schedule

    value = parse_json("--input", input_json) if input_json is not None else None
    seconds = parse_duration(every) if every is not None else None
    made = await with_store(
        store_url(store),
        lambda s: schedule(
            s,
            name,
            cron,
            target=target,
            every=seconds,
            input=value,
            thread=thread,
            thread_template=thread_template,
            timezone=timezone,
            overlap=overlap,
            catch_up=catch_up,
            max_catch_up=max_catch_up,
            tenant=tenant,
            paused=paused,
        ),
    )
    _show(made, as_json)


def _action(verb: str, doc: str) -> None:
    @schedules.command(verb, help=doc)
    @click.argument("name")
    @store_option
    @json_option
    @run_async
    async def command(name: str, store: str | None, as_json: bool) -> None:
        from wakeful.fleet import schedules as api

        call: Any = api.pause_schedule if verb == "pause" else api.resume_schedule
        done = await with_store(store_url(store), lambda s: call(s, name), existing=True)
        _show(done, as_json)


_action("pause", "Stop firing NAME until resumed (ticks meanwhile are not caught up).")
_action("resume", "Fire NAME again from its first tick after now.")


@schedules.command("trigger")
@click.argument("name")
@store_option
@json_option
@run_async
async def schedules_trigger(name: str, store: str | None, as_json: bool) -> None:
    """Fire NAME once now, outside its ticks; prints the dispatch."""
    from wakeful.fleet.schedules import trigger_schedule

    d = await with_store(store_url(store), lambda s: trigger_schedule(s, name), existing=True)
    show_dispatch(d, as_json, f"fired {d.dispatch_id} on thread {d.thread_id}", verbose=False)


@schedules.command("delete")
@click.argument("name")
@store_option
@run_async
async def schedules_delete(name: str, store: str | None) -> None:
    """Remove NAME (the runs it fired stay)."""
    from wakeful.errors import NotFound

    if not await with_store(store_url(store), lambda s: s.delete_schedule(name), existing=True):
        raise NotFound("schedule", name)
    click.echo(f"deleted schedule {name}")


@schedules.command("fire")
@store_option
@json_option
@run_async
async def schedules_fire(store: str | None, as_json: bool) -> None:
    """Fire the due ticks once now (workers do this by themselves); prints what was fired."""
    from wakeful.fleet.schedules import fire_due

    fired = await with_store(store_url(store), lambda s: fire_due(s), existing=True)
    emit(
        builtins(fired),
        as_json,
        lambda _: click.echo("\n".join(f"fired {d.dispatch_id}" for d in fired) or "nothing due"),
    )


__all__ = ["schedules"]
